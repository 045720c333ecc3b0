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

import json
import time
import urllib.request

import numpy as np
import pytest

from client import EmbeddingClient
from generator.admin import KEY_ENV
from generator.build import build_repository
from generator.manifest import load_manifest, parse_manifest
from generator.shared_models import startup_models
from generator.triton_local import TritonLaunch, TritonPorts, TritonProcess, free_ports
from tests.integration.conftest import ADMIN_KEY, write_manifest
from tests.st_factory import STATIC_VARIANTS, build_static_model, manifest_entry

pytestmark = pytest.mark.integration

VARIANT = STATIC_VARIANTS[1]
TEXTS = ["one short text", "and another, a little longer"]
START_TIMEOUT_S = 240
RESTARTS = 3
STARTUP_INSTANCES = 4
PROBE_WAIT_S = 60


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


def _successes(server: TritonProcess, model: str) -> int:
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/{model}/stats", headers={"X-Admin-Key": ADMIN_KEY}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        stats = json.loads(response.read())["model_stats"][0]
    return int(stats["inference_stats"]["success"]["count"])


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


def test_a_healthy_start_with_the_health_probe_logs_no_traceback(tmp_path) -> None:
    """model_manager's probe starts before Triton listens; it waits without a traceback.

    Three models of four encoder stubs each: Triton loads them beside model_manager, so
    its probe usually starts well before the HTTP endpoint listens (the verbose log then
    holds its one quiet "waiting" line). Stopping closes the endpoint before model_manager
    is unloaded: no error there either.
    """
    entries = [
        manifest_entry(
            variant,
            build_static_model(variant, tmp_path / variant.name),
            max_batch_size=8,
            encoder_instances=STARTUP_INSTANCES,
        )
        for variant in STATIC_VARIANTS
    ]
    write_manifest(
        tmp_path / "models.toml",
        {"models": entries, "model_manager": {"health_probe_interval_s": 1}},
    )
    manifest = load_manifest(tmp_path / "models.toml")
    repo = tmp_path / "model_repository"
    build_repository(manifest, repo, log=lambda _msg: None)
    launch = TritonLaunch(
        repo,
        TritonPorts(*free_ports(3)),
        load_models=startup_models(manifest),
        admin_key=ADMIN_KEY,
        log_verbose=1,
    )
    server = TritonProcess(launch, tmp_path / "work", extra_env={KEY_ENV: ADMIN_KEY}).start()
    try:
        _ready(server)
        want = _embed(server)
        assert want.shape == (len(TEXTS), VARIANT.dim)
        deadline = time.monotonic() + PROBE_WAIT_S
        while _successes(server, VARIANT.name) <= 1 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _successes(server, VARIANT.name) > 1, "a probe passed beside our request"
    finally:
        server.stop()
    log = server.log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[-4000:]
    errors = [line for line in log.splitlines() if line.startswith(("E", "W"))]
    assert not [line for line in errors if "probe" in line or "refused" in line], errors
    assert "health probe of" not in log, "no ensemble was ever failing"
