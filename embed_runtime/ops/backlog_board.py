"""How much work waits for one encoder, shared by the steps that admit requests to it.

Triton can bound a step's queue itself (``max_queue_size``, a queue timeout), but any such
policy turns its batcher's prefetching off: the batcher then learns that an instance is
free only from a request entering the queue or from its own 500 ms poll, and while the
full queue refuses every newcomer, queued requests wait beside an idle instance
(docs/architecture.md, "Under load"). So the profiles leave Triton's queues unbounded and
bound the work themselves, here: the step before an encoder (tokenize, image admit or
preprocess) reads the encoder's backlog and admits or refuses each request at once
(``embed_runtime.serving.admission``).

The backlog is counted in rows by tickets, never by "passed on" alone. The admitting step
numbers the rows it passes on (:meth:`Admission.issue`: the board's ``issued`` count,
moved under a lock) and sends each request's ticket, the number of its last row, with
its tensors (``issued_ticket`` -> the encoder's ``admitted_ticket``). Each encoder
instance (:class:`EncoderSlot`) records the highest ticket it has taken from its queue.
Triton's queue is first in, first out, so when an encoder takes ticket ``t`` every row
numbered up to ``t`` has been taken or will never come: its client cancelled it while it
queued, a later step refused it, a stub died with it, or someone called the admitting
step directly. The backlog is ``issued`` minus the highest ticket taken: a request that
never reaches the encoder leaves the count as soon as any later one is taken, within one
execution, whatever the traffic. When nothing later comes and every encoder has been idle
for :data:`IDLE_NS`, the count is known to be zero and the board's floor makes it so.

Each encoder instance also keeps what a row costs it and how long an execution takes
(moving averages), from which the admitting step estimates the wait a new request meets.

Slots are claimed with open-file-description record locks: the operating system frees a
slot when its process dies, and the next process to claim it carries its figures on.
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
_ISSUED = 0  # uint64: rows numbered so far (the last ticket issued)
_FLOOR = 8  # uint64: tickets up to this one were found not to wait (idle encoders)
_LOCK = 16  # the byte locked while ``issued`` or the floor is rewritten
# encoder slot i: HIGH, ROW_NS, BUSY, LAST_END, EXEC_NS, ROWS, BIAS (uint64 each)
_ENCODERS = 64
_ENCODER_SIZE = 56
_HIGH, _ROW_NS, _BUSY, _LAST_END, _EXEC_NS, _ROWS, _BIAS = range(7)
# The bias is kept in thousandths: actual time to the answer over the admission's estimate.
_BIAS_SCALE = 1000
# The bias never moves an estimate beyond these factors: it only ever makes the model's
# estimate longer (a short one answers late), at most four times.
BIAS_BOUNDS = (1.0, 4.0)
_ADMITTERS = _ENCODERS + SLOTS * _ENCODER_SIZE  # admitting slot i: held while it lives
_ADMITTER_SIZE = 16
SIZE = _ADMITTERS + SLOTS * _ADMITTER_SIZE

# An encoder that ended its last execution this long ago and is not running is idle;
# with prefetching, a free instance takes the next queued batch within a millisecond. A
# request still on its way from the admitting step when this is read is forgiven too: an
# undercount of a few rows, for one reading.
IDLE_NS = 10_000_000
# Weight of the newest execution in the moving cost of a row and time of an execution.
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
    """An encoder instance's slot: the highest ticket it took, what a row costs it, if it runs."""

    def __init__(self, path: str, clock: Callable[[], int] = time.monotonic_ns):
        super().__init__(path, _ENCODERS, _ENCODER_SIZE)
        self._clock = clock
        self._set(_BUSY, 0)  # a process that died running left its flag set
        self._time_ns = self._rows = 0.0

    @property
    def row_ns(self) -> int:
        """This instance's moving cost of a row (0 before it ran)."""
        return self._get(_ROW_NS)

    def observe(self, ratios: list[float]) -> None:
        """Fold the executed requests' actual wait over their admission's estimate in.

        The admitting step's estimate is a model (rows before it, their cost, the run
        under way); how Triton's batcher and the cores actually serve them is measured
        here, and the step scales its next estimates by it (:attr:`Backlog.bias`).
        """
        if not ratios:
            return
        low, high = BIAS_BOUNDS
        ratio = min(max(sum(ratios) / len(ratios), low), high)
        old = self._get(_BIAS) / _BIAS_SCALE or 1.0
        self._set(_BIAS, int((old + COST_WEIGHT * (ratio - old)) * _BIAS_SCALE))

    @contextlib.contextmanager
    def executing(self, rows: int, ticket: int = 0) -> Iterator[None]:
        """Take ``rows`` from the queue, the highest of their tickets ``ticket``; time them.

        The cost of a row is the moving time of an execution over its moving row count, so
        an execution of one row (its fixed cost all its own) weighs as little as it is
        worth against the batches a queue makes.
        """
        if ticket > self._get(_HIGH):
            self._set(_HIGH, ticket)
        self._set(_ROWS, self._get(_ROWS) + rows)
        self._set(_BUSY, 1)
        start = self._clock()
        try:
            yield
        finally:
            end = self._clock()
            if rows:
                first = not self._rows
                weight = 1.0 if first else COST_WEIGHT
                self._time_ns += weight * ((end - start) - self._time_ns)
                self._rows += weight * (rows - self._rows)
                self._set(_ROW_NS, max(1, int(self._time_ns / self._rows)))
                self._set(_EXEC_NS, max(1, int(self._time_ns)))
            self._set(_LAST_END, end)
            self._set(_BUSY, 0)


@dataclass(frozen=True)
class Backlog:
    """What an admitting step reads: rows queued and what they cost the encoders.

    ``row_ns`` is the encoders' mean cost of a row over the ``encoders`` instances that ran
    (they run side by side), 0 before any ran; ``exec_ns`` the mean time of one execution;
    ``running`` how many instances are executing now; ``bias`` how the answers' actual
    waits compared with the estimates they were admitted on (1.0: as estimated).
    """

    queued: int
    row_ns: float
    encoders: int = 0
    exec_ns: float = 0.0
    running: int = 0
    bias: float = 1.0

    def wait_ns(self, rows: int = 0) -> float:
        """The estimated time until ``rows`` more, queued now, are answered.

        The rows before them and their own, at the encoders' cost of a row, plus one
        execution when every instance is busy or rows wait (the one under way ends first).
        """
        if self.row_ns <= 0:
            return 0.0
        full = self.queued > 0 or self.running >= max(self.encoders, 1)
        return (self.queued + rows) * self.row_ns + (self.exec_ns if full else 0.0)


class Admission(_Slot):
    """An admitting instance's slot: it numbers the rows it passes on and reads the backlog."""

    def __init__(self, path: str, clock: Callable[[], int] = time.monotonic_ns):
        super().__init__(path, _ADMITTERS, _ADMITTER_SIZE)
        self._clock = clock

    def _header(self, at: int) -> int:
        return struct.unpack_from("<Q", self._map, at)[0]

    def issue(self, rows: list[int]) -> list[int]:
        """Number ``rows`` (one count per request passed on): each request's ticket."""
        tickets = []
        _lock(self._fd, _LOCK, wait=True)
        try:
            last = self._header(_ISSUED)
            for count in rows:
                last += count
                tickets.append(last)
            struct.pack_into("<Q", self._map, _ISSUED, last)
        finally:
            _lock(self._fd, _LOCK, fcntl.F_UNLCK)
        return tickets

    def _encoders(self) -> list[tuple[int, ...]]:
        return [
            struct.unpack_from("<7Q", self._map, _ENCODERS + i * _ENCODER_SIZE)
            for i in range(SLOTS)
        ]

    def idle(self) -> bool:
        """No live encoder is running or ended an execution within :data:`IDLE_NS`."""
        now = self._clock()
        for i, fields in enumerate(self._encoders()):
            busy, last_end = fields[_BUSY], fields[_LAST_END]
            if not (busy or last_end) or not _held(self._fd, _ENCODERS + i * _ENCODER_SIZE):
                continue  # never used, or its process is gone
            if busy or now - last_end < IDLE_NS:
                return False
        return True

    def resync(self) -> None:
        """Count every row numbered so far as not waiting (the encoders were found idle)."""
        _lock(self._fd, _LOCK, wait=True)
        try:
            struct.pack_into("<Q", self._map, _FLOOR, self._header(_ISSUED))
        finally:
            _lock(self._fd, _LOCK, fcntl.F_UNLCK)

    def read(self) -> Backlog:
        """The encoder's backlog now: rows numbered past the highest ticket taken."""
        encoders = self._encoders()
        issued, floor = self._header(_ISSUED), self._header(_FLOOR)
        high = max([floor, *(e[_HIGH] for e in encoders)])
        ran = [e for e in encoders if e[_ROW_NS]]
        if not ran:
            return Backlog(max(0, issued - high), 0.0)
        row_ns = sum(e[_ROW_NS] for e in ran) / len(ran) / len(ran)
        exec_ns = sum(e[_EXEC_NS] for e in ran) / len(ran)
        running = sum(1 for e in ran if e[_BUSY])
        biased = [e[_BIAS] / _BIAS_SCALE for e in ran if e[_BIAS]]
        bias = sum(biased) / len(biased) if biased else 1.0
        return Backlog(max(0, issued - high), row_ns, len(ran), exec_ns, running, bias)
