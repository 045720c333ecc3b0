"""A fake ``/proc`` for the stub tests: processes and Python-backend stubs as files."""

from __future__ import annotations

from pathlib import Path

SERVER = 4242
STUB = "/opt/backends/python/triton_python_backend_stub"


def fake_process(proc: Path, pid: int, args: list[str], state: str = "S") -> None:
    """The process ``pid`` under ``proc``: its ``cmdline`` and a ``stat`` in ``state``."""
    folder = proc / str(pid)
    folder.mkdir(parents=True)
    (folder / "cmdline").write_bytes(b"\0".join(a.encode() for a in args) + b"\0")
    (folder / "stat").write_text(f"{pid} (triton_python_ba) {state} {SERVER} 1 1")


def fake_stub(proc: Path, pid: int, model: str = "m", instance: str = "m_0_0",
              parent: int = SERVER, state: str = "S", region: str = "shm") -> None:
    """A stub of ``instance`` of ``model``, started by the server ``parent``."""
    fake_process(proc, pid, [STUB, f"/models/{model}/1/model.py", region, "1048576", "1048576",
                             str(parent), "/opt/backends/python", "336", instance, "DEFAULT", ""],
                 state)
