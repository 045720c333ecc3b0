"""One writer at a time per model repository: an advisory file lock.

``generator build`` / ``add`` / ``remove`` and the ``model_manager`` (its own writes and
its worker's build) all write the repository and its state file; two of them at once
could swap a half-built model in or lose a state record. The lock is re-entrant inside
one process (flock on a second descriptor of the same file would block its own holder).
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_FILE = ".repository.lock"
_local = threading.local()


@contextmanager
def repository_lock(repo: Path) -> Iterator[None]:
    """Hold the exclusive lock of ``repo`` (created if needed) for the ``with`` block.

    Re-entrant per thread; other threads and processes wait for it.
    """
    repo.mkdir(parents=True, exist_ok=True)
    key = str((repo / LOCK_FILE).resolve())
    held: dict[str, list[int]] = _local.__dict__.setdefault("held", {})
    if key in held:
        held[key][1] += 1
    else:
        fd = os.open(key, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        held[key] = [fd, 1]
    try:
        yield
    finally:
        held[key][1] -= 1
        if held[key][1] == 0:
            fd = held.pop(key)[0]
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
