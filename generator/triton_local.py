"""Run the ``tritonserver`` binary shipped in the ``nvidia-pytriton`` wheel.

The wheel carries a full Triton (CPU capable, Python backend included). This module
lays out a backend directory the binary understands, builds the environment the
Python-backend stub needs, and starts/stops the server by its own PID.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from embed_runtime.ops.busy_board import board_dir, board_prefix
from embed_runtime.ops.stub_watch import loopback_for

from .admin import restriction_args
from .tracing import TraceSettings

PY_TAG = f"{sys.version_info.major}.{sys.version_info.minor}"


@dataclass(frozen=True)
class TritonPorts:
    """The three endpoints of one server."""

    http: int = 8000
    grpc: int = 8001
    metrics: int = 8002

    @classmethod
    def from_env(cls) -> TritonPorts:
        """Ports from ``TRITON_HTTP_PORT`` / ``TRITON_GRPC_PORT`` / ``TRITON_METRICS_PORT``."""
        return cls(
            http=int(os.environ.get("TRITON_HTTP_PORT", 8000)),
            grpc=int(os.environ.get("TRITON_GRPC_PORT", 8001)),
            metrics=int(os.environ.get("TRITON_METRICS_PORT", 8002)),
        )


@dataclass(frozen=True)
class TritonLaunch:
    """Everything needed to start one server process."""

    model_repository: Path
    ports: TritonPorts = field(default_factory=TritonPorts)
    model_control_mode: str = "explicit"
    load_models: tuple[str, ...] = ("*",)
    log_verbose: int = 0
    extra_args: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    admin_key: str = field(default="", repr=False)
    trace: TraceSettings | None = None  # OpenTelemetry export; None: no tracing
    # Names the Python backend's shared-memory regions (/dev/shm/<prefix><uuid>): a server
    # that crashed leaves its regions behind, and this prefix finds them (supervisor.py).
    shm_prefix: str = field(default_factory=lambda: f"embed-shm-{secrets.token_hex(6)}-")

    def __post_init__(self) -> None:
        """An empty ``admin_key`` becomes a random one: the admin APIs are never open."""
        if not self.admin_key:
            object.__setattr__(self, "admin_key", secrets.token_urlsafe(32))


def local_http_url(launch: TritonLaunch) -> str:
    """``host:port`` that reaches ``launch``'s HTTP endpoint from the same machine."""
    host = loopback_for(launch.host)
    return f"[{host}]:{launch.ports.http}" if ":" in host else f"{host}:{launch.ports.http}"


def _pytriton_root() -> Path:
    """Where the ``pytriton`` package lies, found without importing it.

    Importing it would load its client (gevent and more), none of which the server needs.
    """
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the nvidia-pytriton package is not installed")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def listen_host(env: dict[str, str] | None = None) -> str:
    """``$TRITON_HOST``: the address HTTP, gRPC and metrics bind to (127.0.0.1 by default)."""
    env = os.environ if env is None else env
    return env.get("TRITON_HOST", "").strip() or "127.0.0.1"


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports on 127.0.0.1 that were free a moment ago."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def triton_binary() -> Path:
    """``$TRITON_SERVER_BIN``, else the ``tritonserver`` inside the installed wheel.

    The Docker image sets ``TRITON_SERVER_BIN`` and ``TRITON_BACKEND_DIR`` to the NGC
    installation under ``/opt/tritonserver``, so ``python -m generator serve`` runs there.
    """
    override = os.environ.get("TRITON_SERVER_BIN")
    if override:
        binary = Path(override)
    else:
        binary = _pytriton_root() / "tritonserver" / "bin" / "tritonserver"
    if not binary.is_file():
        raise FileNotFoundError(f"tritonserver binary not found at {binary}")
    return binary


def prepare_backends(target: Path) -> Path:
    """Lay out ``<target>/python`` with the Python backend and the stub for this Python.

    With ``TRITON_BACKEND_DIR`` set (an installed Triton's backends, e.g. NGC's
    ``/opt/tritonserver/backends``) that directory is used as it is.
    """
    override = os.environ.get("TRITON_BACKEND_DIR")
    if override:
        if not (Path(override) / "python").is_dir():
            raise FileNotFoundError(f"TRITON_BACKEND_DIR={override} has no python/ backend")
        return Path(override)
    root = _pytriton_root() / "tritonserver"
    stub = root / "python_backend_stubs" / PY_TAG / "triton_python_backend_stub"
    if not stub.is_file():
        raise FileNotFoundError(f"no Python backend stub for Python {PY_TAG} at {stub}")
    python_dir = target / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    for item in (root / "backends" / "python").iterdir():
        if item.is_file():
            lay_out_file(item, python_dir / item.name)
    lay_out_file(stub, python_dir / stub.name)
    return target


def _same_file_content(source: Path, target: Path) -> bool:
    try:
        src, dst = source.stat(), target.stat()
    except FileNotFoundError:
        return False
    if src.st_size != dst.st_size:
        return False
    if src.st_mtime_ns == dst.st_mtime_ns:  # copy2 keeps the mtime: laid out by us before
        return True
    return _sha256(source) == _sha256(target)


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def lay_out_file(source: Path, target: Path) -> None:
    """Copy ``source`` to ``target`` without ever writing into a file in use.

    Skipped when ``target`` already holds the same bytes. Otherwise the copy goes to a
    temporary name in the same folder and is renamed over ``target``: a stub binary that
    another (or a stopping) server is executing keeps its old inode, where copying over it
    in place fails with ``OSError: [Errno 26] Text file busy``.
    """
    if _same_file_content(source, target):
        return
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        shutil.copy2(source, tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


SERVER_KEY_ENV = "EMBED_SERVER_ADMIN_KEY"  # the key in force, for the server's own stubs


def launch_env(launch: TritonLaunch, base: dict[str, str] | None = None) -> dict[str, str]:
    """:func:`server_env` plus the admin key the server enforces, for its own stub watch.

    Without a configured key the server still locks its admin APIs with a random one;
    the stub watch (``model_manager``) reloads models through those APIs, so it reads the
    key in force from :data:`SERVER_KEY_ENV`, visible to the server's processes only.
    """
    return {**server_env(base), SERVER_KEY_ENV: launch.admin_key}


def server_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for the server: venv first on PATH, matching libpython first.

    An external ``tritonserver`` (``TRITON_SERVER_BIN``) keeps its own library path.
    """
    env = dict(os.environ if base is None else base)
    if not env.get("TRITON_SERVER_BIN"):
        # auditwheel's folder beside the pytriton package, wherever it was installed
        # (a venv's site-packages, or a --target folder on PYTHONPATH).
        bundled = _pytriton_root().parent / "nvidia_pytriton.libs"
        libs = [str(Path(sys.base_prefix) / "lib"), str(bundled)]
        if env.get("LD_LIBRARY_PATH"):
            libs.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = ":".join(libs)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("PYTHONUTF8", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return env


def server_command(launch: TritonLaunch, backend_dir: Path) -> list[str]:
    """The ``tritonserver`` command line for ``launch``."""
    cmd = [
        str(triton_binary()),
        f"--model-repository={launch.model_repository}",
        f"--backend-directory={backend_dir}",
        f"--http-address={launch.host}",
        f"--http-port={launch.ports.http}",
        f"--grpc-address={launch.host}",
        f"--grpc-port={launch.ports.grpc}",
        f"--metrics-address={launch.host}",
        f"--metrics-port={launch.ports.metrics}",
        f"--model-control-mode={launch.model_control_mode}",
        f"--log-verbose={launch.log_verbose}",
        "--strict-readiness=true",
        "--exit-on-error=true",
        f"--backend-config=python,shm-region-prefix-name={launch.shm_prefix}",
    ]
    cmd += restriction_args(launch.admin_key)
    if launch.model_control_mode == "explicit":
        cmd += [f"--load-model={name}" for name in launch.load_models]
    if launch.trace is not None:
        cmd += launch.trace.args()
    return cmd + list(launch.extra_args)


def kill_group(pid: int) -> None:
    """SIGKILL what is left of the process group of the stopped server ``pid`` (its stubs)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def remove_server_shm(
    server_pid: int,
    shm_prefix: str,
    shm_dir: str = "/dev/shm",  # noqa: S108 - shm_open's place
) -> tuple[list[str], int]:
    """Unlink what a stopped server left in shared memory; (paths removed, bytes freed).

    Its Python-backend regions (``<shm_dir>/<shm_prefix>*``: a server that crashed or was
    killed leaves them all) and its busy boards. Safe while a stub of it still runs: an
    unlinked region lives on until it is unmapped.
    """
    found = []
    for directory, prefix in ((shm_dir, shm_prefix), (board_dir(), board_prefix(server_pid))):
        try:
            names = os.listdir(directory) if prefix else []
        except OSError:
            continue
        found += [os.path.join(directory, n) for n in names if n.startswith(prefix)]
    removed, size = [], 0
    for path in found:
        try:
            size += os.stat(path).st_blocks * 512
            os.unlink(path)
            removed.append(path)
        except OSError:
            continue
    return removed, size


class ServerProcess:
    """A server process in its own session, stopped by its own PID.

    Followed until its ready URL answers 200, its output kept in a log file, stopped with
    SIGINT to its group and SIGKILL if it lingers.

    Subclasses name the command (:meth:`start`) and the ready URL (:attr:`ready_url`):
    :class:`TritonProcess` here, the benchmark's peer services in ``bench/peers``.
    """

    def __init__(self, name: str, log_path: Path):
        self.name = name
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def ready_url(self) -> str:
        """The URL that answers 200 once the server takes requests."""
        raise NotImplementedError

    def spawn(self, command: list[str], env: dict[str, str], cwd: Path | None = None) -> None:
        """Start ``command`` in its own session, output appended to the log; returns at once."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(  # noqa: S603 - the caller's fixed command, no shell
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Block until :attr:`ready_url` answers 200; raise with the log tail if it never does."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited early:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.ready_url, timeout=2) as resp:  # noqa: S310
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{self.name} not ready after {timeout_s}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 60) -> str:
        """The last lines of the log."""
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGINT the process group, then SIGKILL if it lingers past ``timeout_s``."""
        if self.process is None or self.process.poll() is not None:
            return
        stop_pid(self.process.pid, timeout_s)
        self.process.wait(timeout=5)


class TritonProcess(ServerProcess):
    """A started ``tritonserver`` that is stopped by its own PID."""

    def __init__(
        self,
        launch: TritonLaunch,
        work_dir: Path,
        log_path: Path | None = None,
        extra_env: dict[str, str] | None = None,
    ):
        super().__init__("tritonserver", log_path or work_dir / "tritonserver.log")
        self.launch = launch
        self.work_dir = work_dir
        self.extra_env = dict(extra_env or {})

    @property
    def http_url(self) -> str:
        """``host:port`` of the HTTP endpoint."""
        return local_http_url(self.launch)

    @property
    def ready_url(self) -> str:
        """Triton's readiness endpoint."""
        return f"http://{self.http_url}/v2/health/ready"

    def start(self) -> TritonProcess:
        """Start the server in its own process group; returns at once."""
        backend_dir = prepare_backends(self.work_dir / "backends")
        env = {**launch_env(self.launch), **self.extra_env}
        self.spawn(server_command(self.launch, backend_dir), env)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop it (:meth:`ServerProcess.stop`), then its leftover stubs and shared memory."""
        super().stop(timeout_s)
        if self.process is not None:
            kill_group(self.process.pid)
            remove_server_shm(self.process.pid, self.launch.shm_prefix)


def _signal(pid: int, sig: int) -> None:
    if os.getpgid(pid) == pid:
        os.killpg(pid, sig)
    else:
        os.kill(pid, sig)


def stop_pid(pid: int, timeout_s: float = 30.0) -> bool:
    """Stop ``pid`` (its whole group if it leads one); returns whether it was running."""
    try:
        _signal(pid, signal.SIGINT)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except ChildProcessError:
            pass
        time.sleep(0.2)
    try:
        _signal(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return True
