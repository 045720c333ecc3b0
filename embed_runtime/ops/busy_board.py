"""Which instances of one model are running right now, shared between their processes.

Each Triton instance of a Python model is its own stub process. On a CPU with few cores
the best ONNX Runtime thread count of an instance depends on what the others do: alone,
one run should use every core; with a second instance running, two single-threaded runs
side by side beat two runs fighting over the same cores. :class:`BusyBoard` is the
shared fact both need: one byte per instance in a small shared-memory file, written only
by its owner, read by the others at the start of every execution.

A slot is claimed with a POSIX record lock on its byte, so the operating system frees it
when the process dies, and a new instance clears any slot nobody holds.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import re
import tempfile
from collections.abc import Iterator

SLOTS = 64


def board_dir() -> str:
    """Where the boards live: /dev/shm, else the temp directory."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()  # noqa: S108


def board_prefix(server_pid: int) -> str:
    """The start of the file names of every board of the server ``server_pid``."""
    return f"embed-busy-{server_pid}-"


def board_path(model_name: str, version: str, server_pid: int | None = None) -> str:
    """The shared file of one model version of one server process."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{model_name}-{version}")
    pid = os.getppid() if server_pid is None else server_pid
    return os.path.join(board_dir(), board_prefix(pid) + safe)


class BusyBoard:
    """One slot of a shared board: mark this instance busy, count the others."""

    def __init__(self, path: str, slots: int = SLOTS):
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        if os.fstat(self._fd).st_size < slots:
            os.ftruncate(self._fd, slots)
        self.slot = self._claim(slots)
        self._map = mmap.mmap(self._fd, slots)
        self._clear_orphans(slots)
        self._map[self.slot] = 0

    def _claim(self, slots: int) -> int:
        for slot in range(slots):
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, slot)
            except OSError:
                continue
            return slot
        os.close(self._fd)
        raise RuntimeError(f"all {slots} slots of {self.path} are taken")

    def _clear_orphans(self, slots: int) -> None:
        """Zero the slots no live process holds (an instance that died while running)."""
        for slot in range(slots):
            if slot == self.slot or not self._map[slot]:
                continue
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, slot)
            except OSError:
                continue
            self._map[slot] = 0
            fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, slot)

    def others_running(self) -> int:
        """How many other instances are inside an execution now."""
        return sum(1 for b in self._map[:] if b) - (1 if self._map[self.slot] else 0)

    @contextlib.contextmanager
    def running(self) -> Iterator[int]:
        """Mark this instance busy; yields how many others were busy once it was marked.

        Marking first and reading second means two instances that start together both
        see each other (and both pick the shared setting), never neither.
        """
        self._map[self.slot] = 1
        try:
            yield self.others_running()
        finally:
            self._map[self.slot] = 0

    def close(self) -> None:
        """Free the slot (the lock goes with the descriptor)."""
        if self._fd < 0:
            return
        self._map[self.slot] = 0
        self._map.close()
        try:  # the last instance out removes the file
            fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 0, 0)
            os.unlink(self.path)
        except OSError:
            pass
        os.close(self._fd)
        self._fd = -1
