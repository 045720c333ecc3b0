"""Start a peer server as a subprocess on 127.0.0.1, wait for it, stop it by its PID."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from generator.triton_local import stop_pid


class PeerProcess:
    """One server process, started in its own session and stopped by its own PID."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        port: int,
        health_path: str,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ):
        """``command`` must listen on 127.0.0.1:``port``; ``health_path`` answers 200 when ready."""
        self.name, self.command, self.port = name, list(command), port
        self.health_path, self.log_path = health_path, log_path
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> PeerProcess:
        """Start the process; returns at once."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        return self

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Poll the health URL until it answers 200; raise with the log tail if it never does."""
        deadline = time.monotonic() + timeout_s
        url = f"http://127.0.0.1:{self.port}{self.health_path}"
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited early:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{self.name} not ready after {timeout_s}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the process log."""
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """Stop the process group (SIGINT, then SIGKILL if it lingers)."""
        if self.process is not None and self.process.poll() is None:
            stop_pid(self.process.pid, timeout_s=20.0)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
