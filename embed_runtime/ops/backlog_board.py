"""How much work waits for one encoder, shared by the steps that admit requests to it.

Triton can bound a step's queue itself (``max_queue_size``, a queue timeout), but any such
policy turns its batcher's prefetching off: the batcher then learns that an instance is
free only from a request entering the queue or from its own 500 ms poll, and while the
full queue refuses every newcomer, queued requests wait beside an idle instance
(docs/architecture.md, "Under load"). So the profiles leave Triton's queues unbounded and
bound the work themselves, here: the step before an encoder (tokenize, image admit or
preprocess) reads the encoder's backlog and admits or refuses each request at once
(``embed_runtime.serving.admission``).

The backlog is counted in rows, and in nanoseconds of estimated work, by tickets, never by
"passed on" alone. The admitting step numbers the rows and the work it passes on
(:meth:`Admission.issue`: the board's ``issued`` counts, moved under a lock) and sends
each request's tickets, the numbers of its last row and of its last ns of work, with its
tensors (``issued_ticket`` -> the encoder's ``admitted_ticket``). Each encoder instance
(:class:`EncoderSlot`) records the highest tickets it has taken from its queue. Triton's
queue is first in, first out, so when an encoder takes ticket ``t`` every row numbered up
to ``t`` has been taken or will never come: its client cancelled it while it queued, a
later step refused it, a stub died with it, or someone called the admitting step
directly. The backlog is ``issued`` minus the highest ticket taken: a request that never
reaches the encoder leaves the count as soon as any later one is taken, within one
execution, whatever the traffic. When nothing later comes and every encoder has been idle
for :data:`IDLE_NS`, the count is known to be zero and the board's floor makes it so.

Each encoder instance also fits what its work costs, by tokens
(:mod:`embed_runtime.ops.cost_model`), and shows when its execution under way started and
what it should cost, from which the admitting step estimates the wait ahead of a new
request and the request's own time.

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

import numpy as np

from .busy_board import board_dir, board_prefix
from .cost_model import FEATURES as COST_FIELDS
from .cost_model import Cost, CostFit

SLOTS = 64
_ISSUED = 0  # uint64: rows numbered so far (the last row ticket issued)
_FLOOR = 8  # uint64: row tickets up to this one were found not to wait (idle encoders)
_LOCK = 16  # the byte locked while the header is rewritten
_ISSUED_WORK = 24  # uint64: ns of estimated work numbered so far (the last work ticket)
_FLOOR_WORK = 32  # uint64: the work floor, set with the row floor
_SECRET = 40  # 16 random bytes, made by the first process that opens the board
_SECRET_SIZE = 16
_INTERACTIVE = 56  # uint64: when (monotonic ns) a request not of a bulk part was admitted
# encoder slot i: HIGH, BUSY, LAST_END, BIAS, HIGH_WORK, RUN_START, RUN_WORK, FIXED
# (uint64 each), then the instance's learned cost (float64 each, cost_model.Cost)
_ENCODERS = 64
_HIGH, _BUSY, _LAST_END, _BIAS, _HIGH_WORK, _RUN_START, _RUN_WORK, _FIXED = range(8)
_COST = 8
_ENCODER_SIZE = 8 * (_COST + COST_FIELDS)
# The bias is kept in thousandths: actual time to the answer over the admission's estimate.
_BIAS_SCALE = 1000
# The bias never moves an estimate beyond these factors: it only ever makes the model's
# estimate longer (a short one answers late), at most four times.
BIAS_BOUNDS = (1.0, 4.0)
_ADMITTERS = _ENCODERS + SLOTS * _ENCODER_SIZE  # admitting slot i: held while it lives
_ADMITTER_SIZE = 16
_BULK = _ADMITTERS + SLOTS * _ADMITTER_SIZE  # bulk slot i: the byte locked while it is held
SIZE = _BULK + SLOTS

# An encoder that ended its last execution this long ago and is not running is idle;
# with prefetching, a free instance takes the next queued batch within a millisecond. A
# request still on its way from the admitting step when this is read is forgiven too: an
# undercount of a few rows, for one reading.
IDLE_NS = 10_000_000
# The rows of one execution the queued work is taken in (the text models' max_batch_size).
BLOCK_ROWS = 64
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
        _lock(self._fd, _LOCK, wait=True)
        try:
            if not any(self._map[_SECRET : _SECRET + _SECRET_SIZE]):
                self._map[_SECRET : _SECRET + _SECRET_SIZE] = os.urandom(_SECRET_SIZE)
        finally:
            _lock(self._fd, _LOCK, fcntl.F_UNLCK)

    @property
    def secret(self) -> str:
        """The board's random key (hex): known to the server's own processes only.

        A step that admitted a request's parts as one unit sends it with the parts
        (:data:`embed_runtime.serving.admission.GRANT_PARAMETER`), so the step in front of
        the encoder does not weigh them again, each behind the others.
        """
        return bytes(self._map[_SECRET : _SECRET + _SECRET_SIZE]).hex()

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
    """An encoder instance's slot: the tickets it took, what its work costs, if it runs."""

    def __init__(self, path: str, clock: Callable[[], int] = time.monotonic_ns):
        super().__init__(path, _ENCODERS, _ENCODER_SIZE)
        self._clock = clock
        self._set(_BUSY, 0)  # a process that died running left its flag set
        self.fit = CostFit()

    def _get_cost(self) -> Cost:
        return Cost(*struct.unpack_from(f"<{COST_FIELDS}d", self._map, self.at + 8 * _COST))

    @property
    def cost(self) -> Cost:
        """This instance's learned cost (``Cost()`` before it ran)."""
        return self._get_cost()

    def observe(self, ratios: list[float]) -> None:
        """Fold the executed requests' actual wait over their admission's estimate in.

        The admitting step's estimate is a model (the work queued before it, its own, the
        runs under way); how Triton's batcher and the cores actually serve them is
        measured here, and the step scales its next estimates by it (:attr:`Backlog.bias`).
        """
        if not ratios:
            return
        low, high = BIAS_BOUNDS
        ratio = min(max(sum(ratios) / len(ratios), low), high)
        old = self._get(_BIAS) / _BIAS_SCALE or 1.0
        self._set(_BIAS, int((old + COST_WEIGHT * (ratio - old)) * _BIAS_SCALE))

    def observe_fixed(self, residuals_us: list[int]) -> None:
        """Fold the short requests' actual wait less their estimate (µs) in.

        What a short request's estimate leaves out is mostly fixed: the hops between the
        steps, the batcher, the answer's way back. Measured here, added to every estimate
        (:attr:`Backlog.fixed_ns`); long requests correct by the bias instead.
        """
        if not residuals_us:
            return
        mean = max(0.0, sum(residuals_us) / len(residuals_us))
        old = float(self._get(_FIXED))
        self._set(_FIXED, int(old + COST_WEIGHT * (mean - old)))

    @property
    def expectation(self) -> tuple[float, float]:
        """(bias, fixed µs) of this instance: how an estimate is turned into an expectation."""
        return (self._get(_BIAS) / _BIAS_SCALE or 1.0), float(self._get(_FIXED))

    @contextlib.contextmanager
    def executing(
        self, x: np.ndarray, ticket: int = 0, work_ticket: int = 0
    ) -> Iterator[None]:
        """Take requests of :func:`~.cost_model.features` ``x`` from the queue; time them.

        ``ticket`` (rows) and ``work_ticket`` (work) are the highest among them. While it
        runs the board shows when it started and what it should cost, so an admitting
        step counts only the part still to come; once done, its time refines the
        instance's cost (:class:`~.cost_model.CostFit`).
        """
        if ticket > self._get(_HIGH):
            self._set(_HIGH, ticket)
        if work_ticket > self._get(_HIGH_WORK):
            self._set(_HIGH_WORK, work_ticket)
        start = self._clock()
        self._set(_RUN_START, start)
        self._set(_RUN_WORK, max(0, int(self._get_cost().of(x))))
        self._set(_BUSY, 1)
        try:
            yield
        finally:
            end = self._clock()
            self.fit.add(x, end - start)
            struct.pack_into(
                f"<{COST_FIELDS}d", self._map, self.at + 8 * _COST, *self.fit.cost().as_tuple()
            )
            self._set(_LAST_END, end)
            self._set(_BUSY, 0)


@dataclass(frozen=True)
class Backlog:
    """What an admitting step reads: what waits for the encoders and what it costs them.

    ``queued`` rows and ``work_ns`` of estimated work (ns of one instance) numbered past
    what the encoders took; ``cost`` the encoders' mean learned cost (``Cost()`` before
    any ran); ``encoders`` the instances that ran (they run side by side); ``running``
    how many execute now and ``busy_ns`` the estimated rest of each of their executions;
    ``bias`` how the answers' actual waits compared with the estimates they were admitted
    on (1.0: as estimated), ``fixed_ns`` what short requests' estimates left out.
    """

    queued: int
    work_ns: float = 0.0
    cost: Cost = Cost()
    encoders: int = 0
    running: int = 0
    busy_ns: tuple[float, ...] = ()
    bias: float = 1.0
    fixed_ns: float = 0.0

    def ahead_ns(self) -> float:
        """The estimated wait of a request queued now before an instance starts on it.

        Nothing when nothing waits and an instance is free, whatever the request's size.
        Otherwise each instance is free when its execution under way ends; the queued work,
        in executions of at most :data:`BLOCK_ROWS` rows (one never splits across
        instances: a document's 64-row part holds one instance, not half of two), goes to
        the instance free first, one after the other; the request starts on the first
        instance free after them, plus the fixed cost of the execution it runs in.
        """
        if not self.cost.known:
            return 0.0
        free = sorted([*self.busy_ns, *([0.0] * max(self.encoders - len(self.busy_ns), 0))])
        free = free or [0.0]
        if self.queued <= 0 and self.work_ns <= 0:
            return free[0]
        blocks = max(1, -(-self.queued // BLOCK_ROWS))
        for _ in range(blocks):
            free[0] += self.work_ns / blocks
            free.sort()
        return free[0] + (self.cost.run_ns if self.queued > 0 else 0.0)

    def own_ns(self, lengths: list[int]) -> float:
        """The estimated time of a request's own execution, rows of these token counts."""
        return self.cost.alone_ns(lengths) if self.cost.known else 0.0


class Admission(_Slot):
    """An admitting instance's slot: it numbers the rows it passes on and reads the backlog."""

    def __init__(self, path: str, clock: Callable[[], int] = time.monotonic_ns):
        super().__init__(path, _ADMITTERS, _ADMITTER_SIZE)
        self._clock = clock

    def _header(self, at: int) -> int:
        return struct.unpack_from("<Q", self._map, at)[0]

    def issue(self, rows: list[int], work: list[float] | None = None) -> list[tuple[int, int]]:
        """Number ``rows`` and ``work`` (ns; one count per request passed on).

        Each request's tickets: (its last row, its last ns of work).
        """
        tickets = []
        work = work if work is not None else [0.0] * len(rows)
        _lock(self._fd, _LOCK, wait=True)
        try:
            last, last_work = self._header(_ISSUED), self._header(_ISSUED_WORK)
            for count, ns in zip(rows, work, strict=True):
                last += count
                last_work += max(int(ns), 0)
                tickets.append((last, last_work))
            struct.pack_into("<Q", self._map, _ISSUED, last)
            struct.pack_into("<Q", self._map, _ISSUED_WORK, last_work)
        finally:
            _lock(self._fd, _LOCK, fcntl.F_UNLCK)
        return tickets

    def _encoders(self) -> list[tuple[int, ...]]:
        return [
            struct.unpack_from(f"<{_COST}Q", self._map, _ENCODERS + i * _ENCODER_SIZE)
            for i in range(SLOTS)
        ]

    def _costs(self) -> list[Cost]:
        at = _ENCODERS + 8 * _COST
        return [
            Cost(*struct.unpack_from(f"<{COST_FIELDS}d", self._map, at + i * _ENCODER_SIZE))
            for i in range(SLOTS)
        ]

    def mark_interactive(self) -> None:
        """Note that a request other than a bulk part was admitted now (:class:`BulkSlots`)."""
        struct.pack_into("<Q", self._map, _INTERACTIVE, self._clock())

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
            struct.pack_into("<Q", self._map, _FLOOR_WORK, self._header(_ISSUED_WORK))
        finally:
            _lock(self._fd, _LOCK, fcntl.F_UNLCK)

    def read(self) -> Backlog:
        """The encoder's backlog now: rows and work numbered past the highest tickets taken."""
        encoders, costs = self._encoders(), self._costs()
        issued, floor = self._header(_ISSUED), self._header(_FLOOR)
        issued_work, floor_work = self._header(_ISSUED_WORK), self._header(_FLOOR_WORK)
        high = max([floor, *(e[_HIGH] for e in encoders)])
        high_work = max([floor_work, *(e[_HIGH_WORK] for e in encoders)])
        queued, work = max(0, issued - high), float(max(0, issued_work - high_work))
        ran = [i for i, cost in enumerate(costs) if cost.known]
        if not ran:
            return Backlog(queued, work)
        now = self._clock()
        running = [encoders[i] for i in ran if encoders[i][_BUSY]]
        busy = tuple(float(max(0, e[_RUN_WORK] - (now - e[_RUN_START]))) for e in running)
        biased = [encoders[i][_BIAS] / _BIAS_SCALE for i in ran if encoders[i][_BIAS]]
        bias = sum(biased) / len(biased) if biased else 1.0
        cost = Cost.mean(costs[i] for i in ran)
        fixed = 1000.0 * sum(encoders[i][_FIXED] for i in ran) / len(ran)
        return Backlog(
            queued, work, cost, len(ran), len(running), busy, bias, fixed
        )


# Bulk parts leave an encoder instance free for this long after the last interactive
# request was admitted; in a quiet spell they take every instance.
INTERACTIVE_NS = 5_000_000_000


class BulkSlots:
    """How many bulk parts (a long document's chunks) may be at the encoder at once.

    ``<name>_chunks`` sends a document's parts through one of these slots each. While
    interactive requests come (any request admitted that is not a bulk part, within
    :data:`INTERACTIVE_NS`), bulk work holds at most ``instances - 1`` encoder instances:
    a query finds an instance that runs no document, whatever the index traffic; in a
    quiet spell bulk takes them all. A slot is a byte of the encoder's board locked
    while held (open-file-description locks: a process that dies frees its slots).
    """

    def __init__(self, path: str, instances: int, clock: Callable[[], int] = time.monotonic_ns):
        self.path, self.instances = path, max(1, min(instances, SLOTS))
        self._clock = clock
        self._fd, self._map = _open(path)
        self._held: set[int] = set()  # this process's (its lock owns the byte for all)

    def limit(self) -> int:
        """The parts allowed at the encoder now."""
        last = struct.unpack_from("<Q", self._map, _INTERACTIVE)[0]
        interactive = last and self._clock() - last < INTERACTIVE_NS
        return max(1, self.instances - 1) if interactive else self.instances

    def try_take(self) -> int | None:
        """A free slot's index, now held, or ``None`` when the parts allowed are out."""
        for slot in range(self.limit()):
            if slot not in self._held and _lock(self._fd, _BULK + slot):
                self._held.add(slot)
                return slot
        return None

    def give(self, slot: int) -> None:
        """Free ``slot``."""
        self._held.discard(slot)
        _lock(self._fd, _BULK + slot, fcntl.F_UNLCK)

    def close(self) -> None:
        """Free every slot and the file (the board's slots remove it when last out)."""
        if self._fd >= 0:
            self._map.close()
            os.close(self._fd)
            self._fd = -1
