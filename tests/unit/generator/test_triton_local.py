"""``generator.triton_local``: ports, launch settings, the server command and environment,
shared-memory cleanup, stopping a process group, and laying out the backend directory while
a stub of another (or a stopping) server runs."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import generator.triton_local as triton_local
from generator.admin import restriction_args
from generator.triton_local import (
    PY_TAG,
    SERVER_KEY_ENV,
    TritonLaunch,
    TritonPorts,
    free_ports,
    launch_env,
    lay_out_file,
    listen_host,
    local_http_url,
    prepare_backends,
    remove_server_shm,
    server_command,
    stop_pid,
)

STUB = "triton_python_backend_stub"
SLEEP = shutil.which("sleep")

pytestmark = pytest.mark.skipif(
    SLEEP is None or not Path(SLEEP).is_file(), reason="needs a sleep binary"
)


@pytest.fixture
def fake_pytriton(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A pytriton tree whose stub is a copy of ``sleep`` (runnable, harmless)."""
    root = tmp_path / "pytriton"
    backend = root / "tritonserver" / "backends" / "python"
    backend.mkdir(parents=True)
    (backend / "libtriton_python.so").write_bytes(b"backend library")
    (backend / "triton_python_backend_utils.py").write_text("# utils\n")
    stubs = root / "tritonserver" / "python_backend_stubs" / PY_TAG
    stubs.mkdir(parents=True)
    shutil.copy2(SLEEP, stubs / STUB)
    monkeypatch.setattr(triton_local, "_pytriton_root", lambda: root)
    monkeypatch.delenv("TRITON_BACKEND_DIR", raising=False)
    return root


@pytest.fixture
def running() -> Iterator[Callable[[Path], subprocess.Popen]]:
    """Runs a file as ``<file> 60`` (a copy of sleep); killed after the test."""
    started: list[subprocess.Popen] = []

    def run(path: Path) -> subprocess.Popen:
        started.append(subprocess.Popen([str(path), "60"]))
        return started[-1]

    yield run
    for process in started:
        process.kill()
        process.wait(timeout=10)


def _source_stub(root: Path) -> Path:
    return root / "tritonserver" / "python_backend_stubs" / PY_TAG / STUB


def test_lays_out_again_while_the_stub_runs_from_the_target(
    fake_pytriton: Path, tmp_path: Path, running
) -> None:
    target = tmp_path / "work" / "backends"
    prepare_backends(target)
    laid_out = target / "python" / STUB
    process = running(laid_out)
    # The situation of the bug: writing into the running binary in place is refused.
    with pytest.raises(OSError) as refused:
        with laid_out.open("r+b"):
            pass
    assert refused.value.errno == errno.ETXTBSY
    prepare_backends(target)  # same stub: nothing to write
    source = _source_stub(fake_pytriton)
    source.write_bytes(source.read_bytes() + b"\0new build")  # the wheel's stub changed
    prepare_backends(target)
    assert laid_out.read_bytes() == source.read_bytes()
    assert os.access(laid_out, os.X_OK)
    assert process.poll() is None, "the running stub kept its own (old) file"
    assert sorted(p.name for p in laid_out.parent.iterdir()) == sorted(
        ["libtriton_python.so", "triton_python_backend_utils.py", STUB]
    ), "no temporary file left behind"


def test_an_identical_target_is_left_untouched(fake_pytriton: Path, tmp_path: Path) -> None:
    prepare_backends(tmp_path)
    laid_out = tmp_path / "python" / STUB
    inode = laid_out.stat().st_ino
    prepare_backends(tmp_path)
    assert laid_out.stat().st_ino == inode
    source = _source_stub(fake_pytriton)
    os.utime(source, ns=(1, 1))  # same bytes, other mtime: compared by content
    prepare_backends(tmp_path)
    assert laid_out.stat().st_ino == inode


def test_a_target_of_other_content_but_same_size_is_replaced(tmp_path: Path) -> None:
    source, target = tmp_path / "a", tmp_path / "b"
    source.write_bytes(b"new!")
    target.write_bytes(b"old!")
    lay_out_file(source, target)
    assert target.read_bytes() == b"new!"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_the_real_stub_is_laid_out_again_while_a_copy_of_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, running
) -> None:
    monkeypatch.delenv("TRITON_BACKEND_DIR", raising=False)
    try:
        prepare_backends(tmp_path)
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    laid_out = tmp_path / "python" / STUB
    shutil.copy2(SLEEP, laid_out)  # another build's stub, still executing
    running(laid_out)
    prepare_backends(tmp_path)
    real = triton_local._pytriton_root() / "tritonserver" / "python_backend_stubs" / PY_TAG
    assert laid_out.read_bytes() == (real / STUB).read_bytes()


def test_ports_come_from_the_environment_else_tritons_defaults(monkeypatch) -> None:
    for name in ("TRITON_HTTP_PORT", "TRITON_GRPC_PORT", "TRITON_METRICS_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert TritonPorts.from_env() == TritonPorts(8000, 8001, 8002)
    monkeypatch.setenv("TRITON_HTTP_PORT", "9000")
    monkeypatch.setenv("TRITON_METRICS_PORT", "9002")
    assert TritonPorts.from_env() == TritonPorts(9000, 8001, 9002)


def test_a_launch_without_an_admin_key_gets_a_random_one_it_never_shows() -> None:
    first, second = TritonLaunch(Path("/repo")), TritonLaunch(Path("/repo"))
    assert len(first.admin_key) >= 32 and first.admin_key != second.admin_key
    assert first.admin_key not in repr(first)
    assert TritonLaunch(Path("/repo"), admin_key="k" * 20).admin_key == "k" * 20
    assert first.shm_prefix.startswith("embed-shm-") and first.shm_prefix != second.shm_prefix


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("127.0.0.1", "127.0.0.1:8123"),
        ("0.0.0.0", "127.0.0.1:8123"),
        ("::", "[::1]:8123"),
        ("10.1.2.3", "10.1.2.3:8123"),
    ],
)
def test_local_http_url_reaches_a_wildcard_host_through_loopback(host, url) -> None:
    launch = TritonLaunch(Path("/repo"), ports=TritonPorts(http=8123), host=host)
    assert local_http_url(launch) == url


def test_listen_host_is_triton_host_else_loopback() -> None:
    assert listen_host({}) == "127.0.0.1"
    assert listen_host({"TRITON_HOST": "  "}) == "127.0.0.1"
    assert listen_host({"TRITON_HOST": " 0.0.0.0 "}) == "0.0.0.0"


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(3)
    assert len(set(ports)) == 3
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_server_command_carries_the_launch_and_locks_the_admin_apis(tmp_path, monkeypatch):
    binary = tmp_path / "tritonserver"
    binary.write_text("")
    monkeypatch.setenv("TRITON_SERVER_BIN", str(binary))
    launch = TritonLaunch(
        tmp_path / "repo",
        ports=TritonPorts(9000, 9001, 9002),
        load_models=("a", "b"),
        extra_args=("--log-info=false",),
        host="0.0.0.0",
        admin_key="k" * 24,
    )
    cmd = server_command(launch, tmp_path / "backends")
    assert cmd[0] == str(binary) and cmd[-1] == "--log-info=false"
    for flag in (
        f"--model-repository={tmp_path / 'repo'}",
        f"--backend-directory={tmp_path / 'backends'}",
        "--http-address=0.0.0.0",
        "--http-port=9000",
        "--grpc-port=9001",
        "--metrics-port=9002",
        "--model-control-mode=explicit",
        f"--backend-config=python,shm-region-prefix-name={launch.shm_prefix}",
        *restriction_args("k" * 24),
    ):
        assert flag in cmd
    assert [a for a in cmd if a.startswith("--load-model=")] == ["--load-model=a", "--load-model=b"]
    polled = TritonLaunch(tmp_path / "repo", model_control_mode="poll", load_models=("a",))
    assert not [a for a in server_command(polled, tmp_path) if a.startswith("--load-model")]


def test_launch_env_adds_the_key_in_force_and_keeps_what_the_caller_set() -> None:
    launch = TritonLaunch(Path("/repo"), admin_key="k" * 24)
    base = {
        "TRITON_SERVER_BIN": "/opt/tritonserver/bin/tritonserver",
        "HF_HUB_OFFLINE": "0",
        "LD_LIBRARY_PATH": "/opt/lib",
        "PATH": "/usr/bin",
    }
    env = launch_env(launch, base)
    assert env[SERVER_KEY_ENV] == "k" * 24
    assert env["HF_HUB_OFFLINE"] == "0" and env["TRANSFORMERS_OFFLINE"] == "1"
    assert env["LD_LIBRARY_PATH"] == "/opt/lib"  # an external server keeps its own
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert SERVER_KEY_ENV not in base


def test_remove_server_shm_unlinks_only_that_servers_regions_and_boards(
    tmp_path, monkeypatch
) -> None:
    shm, boards = tmp_path / "shm", tmp_path / "boards"
    shm.mkdir()
    boards.mkdir()
    monkeypatch.setattr(triton_local, "board_dir", lambda: str(boards))
    mine = [shm / "embed-shm-abc-1", shm / "embed-shm-abc-2", boards / "embed-busy-42-enc-1"]
    others = [shm / "embed-shm-xyz-1", boards / "embed-busy-43-enc-1", shm / "unrelated"]
    for path in (*mine, *others):
        path.write_bytes(b"x" * 5000)
    removed, freed = remove_server_shm(42, "embed-shm-abc-", str(shm))
    assert sorted(removed) == sorted(str(p) for p in mine)
    assert freed >= 3 * 5000
    assert not any(p.exists() for p in mine) and all(p.exists() for p in others)
    assert remove_server_shm(42, "embed-shm-abc-", str(tmp_path / "gone")) == ([], 0)


def test_stop_pid_stops_a_group_leader_and_says_whether_it_ran() -> None:
    process = subprocess.Popen([SLEEP, "60"], start_new_session=True)
    assert stop_pid(process.pid, timeout_s=10) is True
    process.wait(timeout=10)
    assert stop_pid(process.pid, timeout_s=1) is False
