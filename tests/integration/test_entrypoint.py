"""``python -m generator serve``, the container's entrypoint, on the local Triton binary.

The first start builds the repository from a fresh manifest and runs tritonserver; a
second start goes through the image's ``deploy/entrypoint.sh`` with the binary and
backend directory named by ``TRITON_SERVER_BIN`` / ``TRITON_BACKEND_DIR`` as in the
image, finds everything current and skips the export. ``deploy/healthcheck.py`` (the
image's HEALTHCHECK) is checked against both.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from client import EmbeddingClient
from generator.triton_local import prepare_backends, triton_binary
from tests.integration import conftest
from tests.integration.conftest import TEXT_MODEL, free_ports, write_manifest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
HEALTHCHECK = ROOT / "deploy" / "healthcheck.py"
ENTRYPOINT = ROOT / "deploy" / "entrypoint.sh"
START_TIMEOUT_S = float(os.environ.get("TRITON_START_TIMEOUT", 240))


@dataclass
class Start:
    """One ``serve`` run: seconds until ready, its output, and the server's command line."""

    seconds: float
    output: str
    cmdline: list[str]
    healthy_while_up: int
    healthy_after_stop: int


def _healthcheck(http_port: int) -> int:
    env = {**os.environ, "TRITON_HTTP_PORT": str(http_port)}
    return subprocess.run([sys.executable, str(HEALTHCHECK)], env=env, timeout=30).returncode


def _embed_once(http_port: int) -> np.ndarray:
    with EmbeddingClient(f"127.0.0.1:{http_port}") as client:
        return client.embed_texts(TEXT_MODEL, ["the entrypoint serves this"])


def _serve(base: Path, name: str, extra_env: dict[str, str], wrapper: bool = False) -> Start:
    http, grpc, metrics = free_ports(3)
    pid_file = base / f"{name}.pid"
    log_path = base / f"{name}.log"
    env = {
        **os.environ,
        "TRITON_HTTP_PORT": str(http),
        "TRITON_GRPC_PORT": str(grpc),
        "TRITON_METRICS_PORT": str(metrics),
        **extra_env,
    }
    # The wrapper runs `python3` from PATH, as in the image: this interpreter's.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    launcher = [str(ENTRYPOINT)] if wrapper else [sys.executable, "-m", "generator"]
    cmd = [*launcher, "--manifest", str(base / "models.toml")]
    cmd += ["--repo", str(base / "repo"), "serve", "--pid-file", str(pid_file)]
    cmd += ["--work-dir", str(base / "work")]
    start = time.monotonic()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        while _healthcheck(http) != 0:
            if proc.poll() is not None or time.monotonic() - start > START_TIMEOUT_S:
                pytest.fail(f"serve did not become ready:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.3)
        seconds = time.monotonic() - start
        assert int(pid_file.read_text()) == proc.pid
        # serve runs tritonserver as its only child (generator/supervisor.py)
        child = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        assert len(child) == 1, child
        cmdline = Path(f"/proc/{child[0]}/cmdline").read_bytes().decode().split("\0")[:-1]
        embedding = _embed_once(http)
        assert embedding.shape == (1, 384)
        assert abs(float(np.linalg.norm(embedding[0])) - 1.0) < 1e-4
        healthy = _healthcheck(http)
        stop = subprocess.Popen(
            [sys.executable, "-m", "generator", "stop", "--pid-file", str(pid_file)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        proc.wait(timeout=60)
        assert stop.communicate(timeout=60)[0].strip() == "stopped"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return Start(seconds, log_path.read_text(), cmdline, healthy, _healthcheck(http))


@pytest.fixture(scope="module")
def starts(tmp_path_factory) -> tuple[Start, Start, Path]:
    base = tmp_path_factory.mktemp("entrypoint")
    data = conftest.test_manifest_data()
    write_manifest(base / "models.toml", data)
    first = _serve(base, "first", {})
    external = {
        "TRITON_SERVER_BIN": str(triton_binary()),
        "TRITON_BACKEND_DIR": str(prepare_backends(base / "external-backends")),
        # An installed Triton brings its own library path; here, the wheel's libraries.
        "LD_LIBRARY_PATH": os.pathsep.join(
            [
                str(Path(sys.base_prefix) / "lib"),
                str(Path(sysconfig.get_paths()["purelib"]) / "nvidia_pytriton.libs"),
            ]
        ),
    }
    second = _serve(base, "second", external, wrapper=True)
    return first, second, base


def test_first_start_builds_the_missing_repository_then_serves(starts) -> None:
    first, _, base = starts
    assert f"building {TEXT_MODEL}" in first.output
    assert (base / "repo" / TEXT_MODEL / "config.pbtxt").is_file()
    assert "--model-control-mode=explicit" in first.cmdline
    assert f"--load-model={TEXT_MODEL}" in first.cmdline
    assert "--load-model=model_manager" in first.cmdline


def test_second_start_skips_the_build_and_is_fast(starts) -> None:
    first, second, _ = starts
    assert "building" not in second.output
    assert second.seconds < first.seconds
    assert second.seconds < 30, second.seconds
    print(f"first start {first.seconds:.1f} s, second start {second.seconds:.1f} s")


def test_serve_runs_the_binary_and_backends_named_by_the_environment(starts) -> None:
    _, second, base = starts
    assert Path(second.cmdline[0]) == triton_binary()
    assert f"--backend-directory={base / 'external-backends'}" in second.cmdline
    assert "--model-control-mode=explicit" in second.cmdline


def test_healthcheck_reports_ready_server_and_stopped_server(starts) -> None:
    for start in starts[:2]:
        assert (start.healthy_while_up, start.healthy_after_stop) == (0, 1)


def test_serving_a_current_repository_imports_no_generator_only_dependency(starts) -> None:
    _, _, base = starts
    script = f"""
import sys
from pathlib import Path
from generator.build import build_repository
from generator.manifest import load_serving_manifest
from generator.shared_models import startup_models
from generator import cli, triton_local
repo = Path({str(base / "repo")!r})
manifest = load_serving_manifest(Path({str(base / "models.toml")!r}), repo)
report = build_repository(manifest, repo, log=lambda _m: None)
assert not report.built, report
heavy = {{"torch", "onnx", "transformers", "sentence_transformers", "open_clip", "onnxruntime"}}
print(sorted(heavy & {{m.split(".")[0] for m in sys.modules}}))
"""
    # `python3`, as the second start ran it: model_manager's config names the interpreter.
    python3 = str(Path(sys.executable).parent / "python3")
    done = subprocess.run(
        [python3, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
