"""Start a peer server as a subprocess on 127.0.0.1, wait for it, stop it by its PID."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from generator.triton_local import ServerProcess


class PeerProcess(ServerProcess):
    """One peer server (FastAPI, TEI, infinity...), the way Triton itself is run."""

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
        super().__init__(name, log_path)
        self.command, self.port, self.health_path = list(command), port, health_path
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd

    @property
    def ready_url(self) -> str:
        """The peer's health URL."""
        return f"http://127.0.0.1:{self.port}{self.health_path}"

    def start(self) -> PeerProcess:
        """Start the process; returns at once."""
        self.spawn(self.command, self.env, self.cwd)
        return self

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop the process group; a peer slow to be reaped is left to the OS."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            super().stop(timeout_s)
