"""The session's repository served by ``python -m generator serve``, as ``make serve`` runs it.

Fault tests kill processes of this server, not of the session's shared one: a kill can
take the whole ``tritonserver`` down (Triton 2.51 aborts with
``boost::interprocess::lock_exception`` when a stub dies holding a shared-memory lock),
and then ``generator serve`` starts it again (generator/supervisor.py), which is what
those tests check, while every other test keeps its server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from client import EmbeddingClient
from tests.integration.conftest import ADMIN_KEY, free_ports

ROOT = Path(__file__).resolve().parents[2]


def answers_ok(port: int, path: str = "/v2/health/ready") -> bool:
    """``GET path`` on the local HTTP ``port`` answers 200 within 2 s."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@dataclass
class Supervised:
    """A running ``generator serve``: its process, ports and log."""

    process: subprocess.Popen
    http: int
    grpc: int
    log: Path

    def triton_pid(self) -> int | None:
        """The pid of the ``tritonserver`` it runs now (a new one after a restart)."""
        try:
            tasks = os.listdir(f"/proc/{self.process.pid}/task")
            children = []
            for task in tasks:
                with open(f"/proc/{self.process.pid}/task/{task}/children", encoding="ascii") as f:
                    children += [int(c) for c in f.read().split()]
        except OSError:
            return None
        for child in children:
            try:
                with open(f"/proc/{child}/cmdline", "rb") as handle:
                    if handle.read().split(b"\0")[0].endswith(b"tritonserver"):
                        return child
            except OSError:
                continue
        return None

    def ready(self) -> bool:
        """``/v2/health/ready`` answers 200."""
        return answers_ok(self.http)

    def wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.process.poll() is None:
            if self.ready() and self.triton_pid() is not None:
                return True
            time.sleep(0.2)
        return False

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def client(self, protocol: str = "http", timeout_s: float = 60.0) -> EmbeddingClient:
        port = self.http if protocol == "http" else self.grpc
        return EmbeddingClient(f"127.0.0.1:{port}", protocol=protocol, timeout_s=timeout_s,
                               admin_key=ADMIN_KEY)

    def stop(self) -> None:
        stop_process(self.process)


def stop_process(proc: subprocess.Popen, group: bool = True, timeout_s: float = 60) -> None:
    """SIGTERM ``proc`` (with ``group``, its whole process group), SIGKILL after ``timeout_s``."""
    if proc.poll() is not None:
        return
    send = (lambda sig: os.killpg(proc.pid, sig)) if group else proc.send_signal
    send(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        proc.wait()


def start_supervised(repo: Path, work: Path, env: dict[str, str] | None = None,
                     manifest: Path | None = None) -> Supervised:
    """``generator serve --no-build`` of the built repository ``repo`` on free ports.

    ``manifest``: the models.toml ``repo`` was built from (default: beside ``repo``).
    """
    http, grpc, metrics = free_ports(3)
    environ = {**os.environ, "TRITON_HTTP_PORT": str(http), "TRITON_GRPC_PORT": str(grpc),
               "TRITON_METRICS_PORT": str(metrics), "EMBED_ADMIN_KEY": ADMIN_KEY,
               **(env or {})}
    work.mkdir(parents=True, exist_ok=True)
    manifest = manifest or repo.parent / "models.toml"
    command = [sys.executable, "-m", "generator", "--manifest", str(manifest),
               "--repo", str(repo), "serve", "--no-build", "--pid-file",
               str(work / "serve.pid"), "--work-dir", str(work)]
    log = work / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=environ, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    return Supervised(process, http, grpc, log)
