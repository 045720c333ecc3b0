"""A /dev/shm too small for the Python backend is a clear error, never a hang.

Every Python-backend instance is a stub that exchanges tensors with the server through
its own region in /dev/shm: 1 MiB at start, grown in 1 MiB steps to the largest batch
it has held, never shrunk (measured: an image preprocessing instance grew to 361 MiB
under 32 concurrent 18.7 MB JPEGs). Here the session's repository is served by
``generator serve`` in a mount namespace whose /dev/shm is a small tmpfs (as Docker's
``--shm-size`` or a Kubernetes ``sizeLimit`` makes it): too small to start, the server
exits at once naming shared memory and ``--shm-size``; big enough to start but not for a
large image batch, that request fails with Triton's own message while text and small
images keep being answered.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from embed_runtime.ops.stub_watch import live_stubs
from tests.integration.clip_fixture import CLIP_MODEL
from tests.integration.conftest import ADMIN_KEY, TEXT_MODEL, free_ports
from tests.integration.supervised import stop_process

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20


def _serve_in_small_shm(server, size_mib: int, work: Path) -> tuple[subprocess.Popen, int, Path]:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.fail("needs root and unshare(1) to give the server a small /dev/shm")
    http, grpc, metrics = free_ports(3)
    env = {**os.environ, "TRITON_HTTP_PORT": str(http), "TRITON_GRPC_PORT": str(grpc),
           "TRITON_METRICS_PORT": str(metrics), "EMBED_ADMIN_KEY": ADMIN_KEY}
    manifest = str(server.repo.parent / "models.toml")
    serve = [sys.executable, "-m", "generator", "--manifest", manifest,
             "--repo", str(server.repo), "serve", "--no-build", "--pid-file",
             str(work / "serve.pid"), "--work-dir", str(work)]
    script = (f"mount -t tmpfs -o size={size_mib}m tmpfs /dev/shm && exec "
              + " ".join(f"'{a}'" for a in serve))
    log = work / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(["unshare", "-m", "sh", "-c", script], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, http, log


def _stub_count(server) -> int:
    return len(live_stubs(server.process.process.pid))


def _wait_ready(proc, http: int, log: Path, timeout_s: float = 240) -> bool:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.3)
    return False


def test_too_small_to_start_is_a_quick_clear_failure(server, tmp_path) -> None:
    proc, http, log = _serve_in_small_shm(server, 2, tmp_path)
    try:
        start = time.monotonic()
        ready = _wait_ready(proc, http, log, timeout_s=120)
        proc.wait(timeout=60)
        took = time.monotonic() - start
    finally:
        stop_process(proc)
    output = log.read_text(errors="replace")
    print(f"\n{_stub_count(server)} stubs need 1 MiB each; with 2 MiB: exit "
          f"{proc.returncode} after {took:.1f} s")
    assert not ready
    assert proc.returncode != 0
    assert "Unable to initialize shared memory key" in output
    assert "--shm-size" in output


def test_a_batch_too_large_for_it_fails_alone_and_the_server_keeps_serving(server,
                                                                          tmp_path) -> None:
    from client import EmbeddingClient

    size = _stub_count(server) + 8  # 1 MiB per stub, 8 MiB to grow into
    proc, http, log = _serve_in_small_shm(server, size, tmp_path)
    rng = np.random.default_rng(0)

    def jpeg(side: int) -> bytes:
        buf = io.BytesIO()
        pixels = rng.integers(0, 255, (side, side, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(buf, "JPEG", quality=95)
        return buf.getvalue()

    big, small = jpeg(2500), jpeg(64)
    try:
        assert _wait_ready(proc, http, log), log.read_text(errors="replace")[-3000:]
        with EmbeddingClient(f"127.0.0.1:{http}") as client:
            start = time.monotonic()
            with pytest.raises(Exception, match="Failed to increase the shared memory pool") as err:
                client.embed_images(CLIP_MODEL, [big, big])
            refused_s = time.monotonic() - start
            text = client.embed_texts(TEXT_MODEL, ["still served"])
            image = client.embed_images(CLIP_MODEL, [small])
        with server.client() as reference:
            assert np.abs(text - reference.embed_texts(TEXT_MODEL, ["still served"])).max() <= 1e-5
            assert np.abs(image - reference.embed_images(CLIP_MODEL, [small])).max() <= 1e-5
        print(f"\n/dev/shm {size} MiB: a 2 x {len(big) / MiB:.1f} MB image request refused in "
              f"{refused_s:.2f} s: {str(err.value)[:160]}")
        assert "--shm-size" in str(err.value)
        assert refused_s < 10
        assert proc.poll() is None
    finally:
        stop_process(proc)
