"""Flipped bytes in a model file never reach an answer, on the real server.

The fault as it was found on ``make serve``: 3 x 4 KiB overwritten in the host-wide ONNX
Runtime weight cache of all-MiniLM-L6-v2, then a restart. Before digests the server came
up ready and answered with embeddings at cosine -0.14 to the right ones. Now the copy is
found corrupt and rewritten before a session maps it, and the answers keep parity with
sentence-transformers. The same flip in the repository's own ``model.onnx`` stops the
model from loading, with the file named in the log.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from client import EmbeddingClient
from generator.admin import KEY_ENV
from generator.triton_local import TritonLaunch, TritonPorts, TritonProcess, free_ports
from tests.integration.conftest import ADMIN_KEY, TEXT_MODEL
from tests.unit.embed_runtime.ops.test_integrity import flip

STEPS = (TEXT_MODEL, f"{TEXT_MODEL}_tokenize", f"{TEXT_MODEL}_encode")
# Parity gate of the text tests (tests/integration/test_text.py): max abs <= 1e-5.
MAX_ABS = 1e-5


@pytest.fixture
def own_repo(server, tmp_path: Path) -> Path:
    """A copy of the session's built text model, for a server of this test's own."""
    repo = tmp_path / "repo"
    for name in STEPS:
        shutil.copytree(server.repo / name, repo / name)
    return repo


def _start(repo: Path, work: Path, cache: Path) -> TritonProcess:
    ports = TritonPorts(*free_ports(3))
    launch = TritonLaunch(repo, ports, load_models=(TEXT_MODEL,), admin_key=ADMIN_KEY)
    env = {KEY_ENV: ADMIN_KEY, "EMBED_ORT_CACHE_DIR": str(cache)}
    return TritonProcess(launch, work, extra_env=env).start()


def _embed(process: TritonProcess, texts: list[str]) -> np.ndarray:
    with EmbeddingClient(process.http_url, protocol="http", admin_key=ADMIN_KEY) as client:
        return client.embed_texts(TEXT_MODEL, texts)


def test_flipped_weight_cache_bytes_are_rewritten_not_served(
    own_repo: Path, tmp_path: Path, corpus, expected
) -> None:
    cache = tmp_path / "cache"
    texts, want = corpus[:24], expected[:24]
    first = _start(own_repo, tmp_path / "w1", cache)
    try:
        first.wait_ready(timeout_s=240)
        assert np.abs(_embed(first, texts) - want).max() <= MAX_ABS
    finally:
        first.stop()
    (weights,) = cache.glob("*/weights.bin")
    flip(weights)  # 3 x 4 KiB, as found on make serve
    second = _start(own_repo, tmp_path / "w2", cache)
    try:
        second.wait_ready(timeout_s=240)
        got = _embed(second, texts)
        assert np.abs(got - want).max() <= MAX_ABS
        assert "weight cache copy rewritten" in second.log_path.read_text(errors="replace")
    finally:
        second.stop()


def test_a_flipped_repository_model_file_stops_its_model_from_loading(
    own_repo: Path, tmp_path: Path
) -> None:
    flip(own_repo / f"{TEXT_MODEL}_encode" / "1" / "model.onnx", offsets=(0.5,), size=64)
    process = _start(own_repo, tmp_path / "w", tmp_path / "cache")
    try:
        with pytest.raises((RuntimeError, TimeoutError)):
            process.wait_ready(timeout_s=120)
        log = process.log_path.read_text(errors="replace")
        assert "model.onnx is corrupt" in log
    finally:
        process.stop()
