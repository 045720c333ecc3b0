"""Two servers of one checkout, and restarts, never trip over each other's stub binary.

Both servers lay out the same ``<work>/backends/python`` (as two ``make serve`` of one
checkout on other ports do). While the first one's Python-backend stubs execute the laid
out ``triton_python_backend_stub``, the second starts, and is then stopped and started
again three times; every start lays the backends out anew. Copying the stub over itself
in place failed there with ``OSError: [Errno 26] Text file busy``.

The model is the smallest there is: a 16-wide StaticEmbedding with fused tokenization
(one Python-backend model, one stub).
"""

from __future__ import annotations

import numpy as np
import pytest

from client import EmbeddingClient
from generator.admin import KEY_ENV
from generator.build import build_repository
from generator.manifest import parse_manifest
from generator.shared_models import startup_models
from generator.triton_local import TritonLaunch, TritonPorts, TritonProcess, free_ports
from tests.integration.conftest import ADMIN_KEY
from tests.st_factory import STATIC_VARIANTS, build_static_model, manifest_entry

pytestmark = pytest.mark.integration

VARIANT = STATIC_VARIANTS[1]
TEXTS = ["one short text", "and another, a little longer"]
START_TIMEOUT_S = 240
RESTARTS = 3


def _server(manifest, repo, work, name: str) -> TritonProcess:
    launch = TritonLaunch(
        repo,
        TritonPorts(*free_ports(3)),
        load_models=startup_models(manifest),
        admin_key=ADMIN_KEY,
    )
    return TritonProcess(
        launch, work, log_path=work.parent / f"{name}.log", extra_env={KEY_ENV: ADMIN_KEY}
    )


def _embed(server: TritonProcess) -> np.ndarray:
    with EmbeddingClient(server.http_url, protocol="http", admin_key=ADMIN_KEY) as client:
        return client.embed_texts(VARIANT.name, TEXTS)


def _ready(server: TritonProcess) -> None:
    try:
        server.wait_ready(timeout_s=START_TIMEOUT_S)
    except Exception as exc:
        raise AssertionError(f"{exc}\n{server.log_tail()}") from exc


def test_second_server_and_restarts_share_one_backend_dir(tmp_path) -> None:
    folder = build_static_model(VARIANT, tmp_path / "model")
    entry = manifest_entry(VARIANT, folder, max_batch_size=8, fused_tokenize=True)
    manifest = parse_manifest({"models": [entry]}, tmp_path)
    repo = tmp_path / "model_repository"
    build_repository(manifest, repo, log=lambda _msg: None)
    work = tmp_path / "work"  # one checkout: both servers lay out work/backends
    first = _server(manifest, repo, work, "first").start()
    second = None
    try:
        _ready(first)
        want = _embed(first)
        assert want.shape == (len(TEXTS), VARIANT.dim)
        second = _server(manifest, repo, work, "second").start()
        _ready(second)
        np.testing.assert_array_equal(_embed(second), want)
        for attempt in range(RESTARTS):
            second.stop()
            second.start()
            _ready(second)
            np.testing.assert_array_equal(_embed(second), want, err_msg=f"restart {attempt}")
            np.testing.assert_array_equal(_embed(first), want, err_msg=f"restart {attempt}")
    finally:
        if second is not None:
            second.stop()
        first.stop()
    for name in ("first", "second"):
        assert "Text file busy" not in (tmp_path / f"{name}.log").read_text()
