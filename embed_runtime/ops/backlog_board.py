"""How much work waits for one encoder, shared by the steps that admit requests to it.

Triton can bound a step's queue itself (``max_queue_size``, a queue timeout), but any such
policy turns its batcher's prefetching off: the batcher then learns that an instance is
free only from a request entering the queue or from its own 500 ms poll, and while the
full queue refuses every newcomer, queued requests wait beside an idle instance
(docs/architecture.md, "Under load"). So the profiles leave Triton's queues unbounded and
bound the work themselves, here: the step before an encoder (tokenize, image preprocess)
admits a request only while the encoder's queue holds less than ``admission_wait_us`` of
work, and refuses it at once otherwise, before any of its own work is done.

The board is one small shared-memory file per encoder model version of one server, with
counters that only ever grow, each written by one process:

- each encoder instance (:class:`EncoderSlot`) counts the requests it has taken from its
  queue, and keeps the time one request costs it (a moving average over its executions)
  and whether it is running now;
- each admitting instance (:class:`Admission`) counts the requests it has passed on.

Passed on minus taken is the backlog in Triton's queue; the backlog times the cost of a
request, over the instances, is the wait a new request would meet. A request that never
reaches the encoder (its client cancelled it while it queued, a stub died) would leave
the count too high for good, so when every encoder has been idle for a while the backlog
is known to be zero and an offset makes it so; a count too low (requests sent to the
encoder model directly) is set to zero the same way at once.

Slots are claimed with open-file-description record locks: the operating system frees a
slot when its process dies, and the next process to claim it carries its count
on, so totals survive a stub restart.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import re
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .busy_board import board_dir, board_prefix

SLOTS = 64
_OFFSET = 0  # int64: the backlog that was found to be zero (under the resync lock)
_RESYNC_LOCK = 8  # the byte locked while the offset is rewritten
_ENCODERS = 64  # encoder slot i: taken, cost_ns, busy, last_end_ns (4 x uint64)
_ENCODER_SIZE = 32
_ADMITTERS = _ENCODERS + SLOTS * _ENCODER_SIZE  # admitting slot i: passed (uint64)
_ADMITTER_SIZE = 16
SIZE = _ADMITTERS + SLOTS * _ADMITTER_SIZE

# An encoder that ended its last execution this long ago and is not running is idle;
# with prefetching, a free instance takes the next queued batch within a millisecond.
IDLE_NS = 50_000_000
# Weight of the newest execution in the moving cost of a request.
COST_WEIGHT = 0.25


def board_path(encoder_model: str, version: str = "1", server_pid: int | None = None) -> str:
    """The backlog board of ``encoder_model`` in the server ``server_pid`` (default: parent).

    Named under the server's busy-board prefix, so the reaper of a dead server removes it.
    """
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{encoder_model}-{version}")
    pid = os.getppid() if server_pid is None else server_pid
    return os.path.join(board_dir(), f"{board_prefix(pid)}backlog-{safe}")


def _open(path: str) -> tuple[int, mmap.mmap]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    if os.fstat(fd).st_size < SIZE:
        os.ftruncate(fd, SIZE)
    return fd, mmap.mmap(fd, SIZE)


# Open-file-description locks (Linux): owned by the open file, not the process, so two
# slots opened in one process exclude each other too; freed when the file is closed or
# its process dies. struct flock: l_type, l_whence, l_start, l_len, l_pid (must be 0).
_FLOCK = "hh4xqqi4x"


def _lock(
    fd: int, offset: int, kind: int = fcntl.F_WRLCK, wait: bool = False, length: int = 1
) -> bool:
    """Set (or with ``F_UNLCK`` clear) a lock on bytes of the file; whether it was set.

    ``length`` bytes from ``offset``; 0: to the end of the file.
    """
    command = fcntl.F_OFD_SETLKW if wait else fcntl.F_OFD_SETLK
    try:
        fcntl.fcntl(fd, command, struct.pack(_FLOCK, kind, os.SEEK_SET, offset, length, 0))
    except OSError:
        return False
    return True


def _claim(fd: int, base: int, size: int) -> int:
    """Lock the first byte of the first free slot of the region at ``base``; its index."""
    for slot in range(SLOTS):
        if _lock(fd, base + slot * size):
            return slot
    os.close(fd)
    raise RuntimeError(f"all {SLOTS} backlog-board slots are taken")


def _held(fd: int, offset: int) -> bool:
    """Whether another open file (a live instance) holds the lock on byte ``offset``."""
    if not _lock(fd, offset):
        return True
    _lock(fd, offset, fcntl.F_UNLCK)
    return False


class _Slot:
    def __init__(self, path: str, base: int, size: int):
        self.path = path
        self._fd, self._map = _open(path)
        self.slot = _claim(self._fd, base, size)
        self.at = base + self.slot * size

    def _get(self, field: int) -> int:
        return struct.unpack_from("<Q", self._map, self.at + 8 * field)[0]

    def _set(self, field: int, value: int) -> None:
        struct.pack_into("<Q", self._map, self.at + 8 * field, value)

    def close(self) -> None:
        """Free the slot; its counts stay for the next process that claims it.

        The last one out (no slot of the file held any more: the model and the steps in
        front of it unloaded) removes the file.
        """
        if self._fd < 0:
            return
        self._map.close()
        _lock(self._fd, self.at, fcntl.F_UNLCK)
        if _lock(self._fd, 0, length=0):
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        os.close(self._fd)
        self._fd = -1


class EncoderSlot(_Slot):
    """An encoder instance's slot: the requests it took, their cost, whether it runs."""

    def __init__(self, path: str, clock: Callable[[], int] = time.monotonic_ns):
        super().__init__(path, _ENCODERS, _ENCODER_SIZE)
        self._clock = clock
        self._set(2, 0)  # a process that died running left its flag set
        self._time_ns = self._requests = 0.0

    @contextlib.contextmanager
    def executing(self, requests: int) -> Iterator[None]:
        """Count ``requests`` as taken from the queue; time their execution.

        The cost of a request is the moving time of an execution over its moving request
        count, so an execution of one request (its fixed cost all its own) weighs as
        little as it is worth against the batches a queue makes.
        """
        self._set(0, self._get(0) + requests)
        self._set(2, 1)
        start = self._clock()
        try:
            yield
        finally:
            end = self._clock()
            if requests:
                first = not self._requests
                weight = 1.0 if first else COST_WEIGHT
                self._time_ns += weight * ((end - start) - self._time_ns)
                self._requests += weight * (requests - self._requests)
                self._set(1, max(1, int(self._time_ns / self._requests)))
            self._set(3, end)
            self._set(2, 0)


@dataclass(frozen=True)
class Backlog:
    """What an admitting step reads: requests queued and what one more costs the encoders.

    ``per_request_ns`` is the encoders' moving cost of a request over the ``encoders``
    instances that ran (0 before any ran): the wait a newcomer meets is
    ``queued * per_request_ns``.
    """

    queued: int
    per_request_ns: float
    encoders: int = 0

    @property
    def wait_ns(self) -> float:
        """The estimated wait of a request admitted now."""
        return self.queued * self.per_request_ns


class Admission(_Slot):
    """An admitting instance's slot and its reading of the encoder's backlog."""

    def __init__(self, path: str, clock: Callable[[], int] = time.monotonic_ns):
        super().__init__(path, _ADMITTERS, _ADMITTER_SIZE)
        self._clock = clock

    def passed(self, requests: int) -> None:
        """Count ``requests`` passed on to the encoder."""
        if requests:
            self._set(0, self._get(0) + requests)

    def _encoders(self) -> list[tuple[int, int, int, int]]:
        return [
            struct.unpack_from("<4Q", self._map, _ENCODERS + i * _ENCODER_SIZE)
            for i in range(SLOTS)
        ]

    def idle(self) -> bool:
        """No live encoder is running or ended an execution within :data:`IDLE_NS`."""
        now = self._clock()
        for i, (_, _, busy, last_end) in enumerate(self._encoders()):
            if not (busy or last_end) or not _held(self._fd, _ENCODERS + i * _ENCODER_SIZE):
                continue  # never used, or its process is gone
            if busy or now - last_end < IDLE_NS:
                return False
        return True

    def resync(self, backlog: int) -> None:
        """Count the backlog read as ``backlog`` as zero from now on."""
        _lock(self._fd, _RESYNC_LOCK, wait=True)
        try:
            offset = struct.unpack_from("<q", self._map, _OFFSET)[0]
            struct.pack_into("<q", self._map, _OFFSET, offset + backlog)
        finally:
            _lock(self._fd, _RESYNC_LOCK, fcntl.F_UNLCK)

    def read(self) -> Backlog:
        """The encoder's backlog now; a count below zero is set to zero first.

        The encoders' counts are read before the admitters': a request is passed on before
        it is taken, so a request taken while this reads is counted as passed too, and a
        busy board never reads below zero (which the resync would turn into a count too
        high for good; only an idle moment would reset it, and a busy closed loop has none).
        """
        encoders = self._encoders()
        passed = sum(
            struct.unpack_from("<Q", self._map, _ADMITTERS + i * _ADMITTER_SIZE)[0]
            for i in range(SLOTS)
        )
        offset = struct.unpack_from("<q", self._map, _OFFSET)[0]
        queued = passed - sum(e[0] for e in encoders) - offset
        if queued < 0:
            self.resync(queued)
            queued = 0
        costs = [e[1] for e in encoders if e[1]]
        per_request = sum(costs) / len(costs) / len(costs) if costs else 0.0
        return Backlog(queued, per_request, len(costs))
