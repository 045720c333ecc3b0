"""Whether a request is still wanted when a step is about to work on it.

Two ways a request stops being wanted, both checked by every Python step before it reads
a request (:func:`embed_runtime.serving.adapter.gather_rows`), so no fetch, decode,
tokenize or encode work is done for a client that can no longer use the answer:

- its client has gone: Triton marks the request cancelled when an HTTP client closes its
  connection or a gRPC call passes its deadline (``request.is_cancelled()``, Triton
  23.10+); an ensemble passes the cancellation on to the step that runs next.
- its deadline has passed: the request parameter :data:`DEADLINE_PARAMETER`, an absolute
  wall-clock time in microseconds since the Unix epoch. Triton's own ``timeout`` request
  parameter is not passed from an ensemble to its steps (measured on Triton 2.51), and
  it restarts at every step's queue; an absolute time reaches every step unchanged
  (ensembles forward request parameters) and means the same in each. The project's
  client sends it with every request (``client.deadline``).

Both answers are Triton ``UNAVAILABLE`` with a message that says which, so a client
retries them only while its own deadline allows.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from ..errors import UnavailableError
from ..ops.backlog_board import Admission, Backlog, board_path

DEADLINE_PARAMETER = "deadline_unix_us"


class RequestGoneError(UnavailableError):
    """The request's client has gone or its deadline has passed; no work was done for it."""


def wall_clock_us() -> int:
    """Microseconds since the Unix epoch (the clock :data:`DEADLINE_PARAMETER` is read on)."""
    return time.time_ns() // 1000


def deadline_us(parameters: Mapping[str, Any]) -> int | None:
    """The request's deadline (µs since the epoch), ``None`` when it carries none or a bad one.

    A value that is not a positive integer is treated as no deadline: the parameter only
    ever withholds work, so a malformed one must not fail a request that is otherwise good.
    """
    value = parameters.get(DEADLINE_PARAMETER)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return None
    try:
        deadline = int(value)
    except ValueError:
        return None
    return deadline if deadline > 0 else None


def gone_reason(
    request: Any,
    parameters: Callable[[Any], Mapping[str, Any]],
    now_us: Callable[[], int] = wall_clock_us,
) -> RequestGoneError | None:
    """Why ``request`` is no longer wanted, or ``None`` when it still is.

    ``parameters(request)`` gives the request's parameters; ``now_us`` is the wall clock.
    """
    is_cancelled = getattr(request, "is_cancelled", None)
    if is_cancelled is not None and is_cancelled():
        return RequestGoneError(
            "request cancelled: its client closed the connection or passed its deadline "
            "before this step ran"
        )
    deadline = deadline_us(parameters(request))
    if deadline is not None:
        late_us = now_us() - deadline
        if late_us >= 0:
            return RequestGoneError(
                f"deadline passed {late_us / 1000:.1f} ms before this step ran "
                f"(request parameter {DEADLINE_PARAMETER})"
            )
    return None


def request_deadline_us(
    request: Any, parameters: Mapping[str, Any], now_us: Callable[[], int] = wall_clock_us
) -> int | None:
    """When ``request`` must be answered by (µs since the epoch), ``None`` when it does not say.

    The earlier of :data:`DEADLINE_PARAMETER` and Triton's own ``timeout`` request
    parameter (``request.timeout()``, µs, 0 when unset), counted from now: the admitting
    step is a request's first step, so now is about when it arrived. A gRPC deadline
    reaches no step as a number; Triton cancels the request when it passes.
    """
    deadline = deadline_us(parameters)
    timeout = getattr(request, "timeout", None)
    relative = timeout() if timeout is not None else 0
    if isinstance(relative, int) and relative > 0:
        by_timeout = now_us() + relative
        deadline = by_timeout if deadline is None else min(deadline, by_timeout)
    return deadline


ADMISSION_ENCODER = "admission_encoder"
ADMISSION_WAIT = "admission_wait_us"
ADMISSION_ROWS = "admission_max_rows"
# Set ("true") on a step that an admitting step in front counts for, other than an encoder
# (which always counts): image preprocessing behind ``<name>_admit_image``.
BACKLOG_PARAMETER = "admission_backlog"
# Set ("true") on an admitting step that refuses while the queue is full but counts
# nothing it passes on: ``<name>_admit_url``, in front of the URL fetch.
ADMISSION_PEEK = "admission_peek"
# The tensor an admitting step sends each request's ticket in, and the one the step it
# admits to takes it as: [rows, 4] INT64, each row the same (ticket, deadline µs or 0,
# when it was admitted µs, the admission's estimate of its wait µs or 0).
ISSUED_TICKET = "issued_ticket"
ADMITTED_TICKET = "admitted_ticket"

# Rows always admitted per encoder instance to an otherwise empty queue, whatever one
# costs, for a request that states no deadline (AdmissionGate.admit).
PER_INSTANCE = 2
# A request with a deadline is admitted while the estimated time to its answer is within
# this share of the time it has left: the estimate is a moving mean, a request admitted
# just after a batch formed waits for two executions, and the answer still has to travel
# back. One-sentence spikes with a 1 s deadline on the 2-core host (bench.faults.overload,
# 2026-12-05): 0.8 answered 90 / 344 requests late at 2 x / 3 x, 0.6 24 / 16, 0.5 0 / 2,
# at the same goodput (docs/benchmarks.md, "Deadlines under spikes").
DEADLINE_SHARE = 0.5
# Estimates shorter than this are not compared with what happened: a lone request's wait
# is mostly fixed costs the estimate leaves out, and a deadline that short is rare.
OBSERVED_FROM_US = 50_000


class OverloadedError(UnavailableError):
    """The encoder's queue already holds more work than the model admits; none was done."""


# The Triton metric (port 8002, ``/metrics``) counting refusals, per refusing step.
REFUSED_METRIC = "embed_requests_refused_total"
# At most one log line per this many seconds while a step refuses.
REFUSAL_LOG_EVERY_S = 10.0


class Refusals:
    """One step's overload refusals, counted where an operator looks.

    - the Triton metric :data:`REFUSED_METRIC`, labelled ``model`` (the refusing step) and
      ``waits_for`` (the step whose queue is full): what an alert or an autoscaler reads;
    - the server log, as a warning: the first refusal at once, then at most one line per
      :data:`REFUSAL_LOG_EVERY_S` with the count since the last line, and the total when
      the step unloads. A line per refusal would flood the log when the server is busiest.
    """

    def __init__(
        self,
        model: str,
        waits_for: str,
        increment: Callable[[], None] | None = None,
        log: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.model, self.waits_for = model, waits_for
        self._increment, self._log, self._clock = increment, log, clock
        self._family: Any = None
        self.total = 0
        self._unlogged = 0
        self._logged_at: float | None = None

    @classmethod
    def for_step(cls, pb_utils: Any, model: str, waits_for: str) -> Refusals:
        """The counter of a Python-backend step: the metric where Triton offers one."""
        logger = getattr(pb_utils, "Logger", None)
        log = logger.log_warn if logger is not None else None
        refusals = cls(model, waits_for, None, log)
        family_type = getattr(pb_utils, "MetricFamily", None)
        if family_type is not None:
            try:
                # Kept: Triton deletes a family's metrics with the family object.
                refusals._family = family = family_type(
                    name=REFUSED_METRIC,
                    description="Requests refused as server overloaded (HTTP 503, gRPC "
                    "UNAVAILABLE) before any work, by the step that refused them",
                    kind=family_type.COUNTER,
                )
                metric = family.Metric(labels={"model": model, "waits_for": waits_for})
                refusals._increment = partial(metric.increment, 1.0)
            except Exception as exc:  # noqa: BLE001 - metrics off: the log still counts
                refusals._no_metric(exc)
        return refusals

    def _no_metric(self, exc: Exception) -> None:
        self._increment = None
        if self._log is not None:
            self._log(f"{self.model}: no {REFUSED_METRIC} metric ({exc}); refusals are logged")

    def count(self, message: str) -> None:
        """Count one refusal; ``message`` is what its client was told."""
        self.total += 1
        self._unlogged += 1
        if self._increment is not None:
            try:
                self._increment()
            except Exception as exc:  # noqa: BLE001 - a refusal is answered all the same
                self._no_metric(exc)
        now = self._clock()
        if self._logged_at is not None and now - self._logged_at < REFUSAL_LOG_EVERY_S:
            return
        if self._log is not None:
            since = (
                "" if self._logged_at is None else f" in the last {now - self._logged_at:.0f} s"
            )
            self._log(
                f"{self.model}: refused {self._unlogged} request(s){since}, "
                f"{self.total} since it loaded; latest: {message}"
            )
        self._logged_at, self._unlogged = now, 0

    def close(self) -> None:
        """Log the total on unload, when there was any refusal."""
        if self.total and self._log is not None:
            self._log(
                f"{self.model}: refused {self.total} request(s) in total while loaded, "
                f"waiting for {self.waits_for}"
            )


class AdmissionGate:
    """Admits the requests of one execution while the encoder's queue has room for them.

    Built by the step in front of an encoder from its config parameters
    (:data:`ADMISSION_ENCODER`, :data:`ADMISSION_WAIT`, :data:`ADMISSION_ROWS`).
    :meth:`begin` reads the encoder's backlog board once per execution; :meth:`admit` is
    asked for each request in order, with its rows and its deadline:

    - every request is refused past ``max_rows`` rows waiting (the memory the queue may
      hold), but for the first :data:`PER_INSTANCE` rows an instance of an empty queue;
    - a request that states a deadline is refused at once when the estimated time to its
      answer (the rows queued before it, their cost, the execution under way) exceeds
      :data:`DEADLINE_SHARE` of the time it has left, and admitted otherwise;
    - one that states none is queued, as Triton queues it, up to ``wait_us`` of estimated
      work (the longest wait a client is asked to sit through), past it refused at once.

    :meth:`tickets` numbers the rows passed on, so the encoder's board counts only what
    the encoder has still to take (:mod:`embed_runtime.ops.backlog_board`).
    """

    def __init__(
        self,
        board: Admission,
        encoder: str,
        wait_us: int,
        max_rows: int = 0,
        refusals: Refusals | None = None,
        now_us: Callable[[], int] = wall_clock_us,
    ):
        self.board, self.encoder, self.wait_us, self.max_rows = board, encoder, wait_us, max_rows
        self.refusals, self.now_us = refusals, now_us
        self._read = Backlog(0, 0.0)
        self._rows = 0  # admitted by this execution so far: they wait too
        self._idle_checked = False
        self.estimate_us = 0  # the estimate the last admitted request was admitted on

    @classmethod
    def from_parameters(
        cls, params: Mapping[str, str], version: str, pb_utils: Any = None, model: str = ""
    ) -> AdmissionGate | None:
        """The gate a step's config asks for, or ``None`` where it admits everything.

        With ``pb_utils`` (inside Triton) its refusals are counted (:class:`Refusals`)
        under the step's name ``model``.
        """
        encoder = params.get(ADMISSION_ENCODER, "")
        wait_us = int(params.get(ADMISSION_WAIT, "0") or 0)
        max_rows = int(params.get(ADMISSION_ROWS, "0") or 0)
        if not encoder or (wait_us <= 0 and max_rows <= 0):
            return None
        refusals = None if pb_utils is None else Refusals.for_step(pb_utils, model, encoder)
        board = Admission(board_path(encoder, version))
        return cls(board, encoder, max(wait_us, 0), max(max_rows, 0), refusals)

    def begin(self) -> None:
        """Read the backlog once for this execution."""
        self._read = self.board.read()
        self._rows = 0
        self._idle_checked = False

    def _backlog(self) -> Backlog:
        return dataclasses.replace(self._read, queued=self._read.queued + self._rows)

    def _over(self, rows: int, deadline: int | None) -> str | None:
        """Why ``rows`` more cannot be admitted now, ``None`` when they can.

        The estimate is the board's model scaled by how the last answers compared with
        theirs (:attr:`Backlog.bias`).
        """
        backlog = self._backlog()
        self.estimate_us = int(backlog.wait_ns(rows) / 1000)
        expected_ms = self.estimate_us * backlog.bias / 1000
        floor = backlog.queued < PER_INSTANCE * max(backlog.encoders, 1)
        if self.max_rows and backlog.queued + rows > self.max_rows and not floor:
            return (
                f"server overloaded: {backlog.queued} row(s) already wait for {self.encoder}, "
                f"its bound is {self.max_rows} ({ADMISSION_ROWS}); retry later with backoff"
            )
        if deadline is not None:
            left_ms = (deadline - self.now_us()) / 1000
            if backlog.row_ns > 0 and expected_ms > DEADLINE_SHARE * left_ms:
                return (
                    f"server overloaded: about {expected_ms:.0f} ms until {self.encoder} "
                    f"could answer ({backlog.queued} row(s) wait before it), more than "
                    f"{DEADLINE_SHARE:g} of the {max(left_ms, 0):.0f} ms left before the "
                    "request's deadline; retry "
                    "later with backoff or a later deadline"
                )
            return None
        if floor:
            return None
        if self.wait_us and backlog.row_ns > 0 and expected_ms * 1000 > self.wait_us:
            return (
                f"server overloaded: {backlog.queued} row(s) (about {expected_ms:.0f} ms of "
                f"work) already wait for {self.encoder}, over its admission bound of "
                f"{self.wait_us / 1000:g} ms ({ADMISSION_WAIT}); retry later with backoff"
            )
        return None

    def admit(self, rows: int = 1, deadline: int | None = None) -> OverloadedError | None:
        """``None`` to admit a request of ``rows`` rows, else the error that refuses it.

        ``deadline``: when it must be answered by (µs since the epoch), ``None`` if never.
        A count that would refuse is checked against idle encoders once per execution:
        rows that never reached them cannot be waiting.
        """
        reason = self._over(rows, deadline)
        if reason is not None and not self._idle_checked and self._read.queued:
            self._idle_checked = True
            if self.board.idle():
                self.board.resync()
                self._read = dataclasses.replace(self._read, queued=0)
                reason = self._over(rows, deadline)
        if reason is None:
            self._rows += rows
            return None
        error = OverloadedError(reason)
        if self.refusals is not None:
            self.refusals.count(error.message)
        return error

    def withdraw(self, rows: int) -> None:
        """Take back ``rows`` this execution admitted: their request failed before going on."""
        self._rows = max(0, self._rows - rows)

    def tickets(
        self, rows: list[int], deadlines: list[int | None], estimates: list[int]
    ) -> list[np.ndarray]:
        """The :data:`ISSUED_TICKET` tensor of each request passed on, rows numbered now.

        ``deadlines`` and ``estimates`` (µs) are each request's, as it was admitted.
        """
        numbered = self.board.issue(rows)
        now = self.now_us()
        return [
            np.full((count, 4), (ticket, deadline or 0, now, estimate), dtype=np.int64)
            for count, ticket, deadline, estimate in zip(
                rows, numbered, deadlines, estimates, strict=True
            )
        ]

    def close(self) -> None:
        """Free this instance's slot on the board; log the refusals' total."""
        self.board.close()
        if self.refusals is not None:
            self.refusals.close()


def taken_ticket(tickets: Any) -> tuple[int, int | None, int, int]:
    """(ticket, deadline µs or ``None``, admitted at µs, estimate µs) of a ticket array."""
    if tickets is None or tickets.size < 4:
        return 0, None, 0, 0
    ticket, deadline, admitted, estimate = (int(v) for v in tickets.reshape(-1, 4)[0])
    return max(ticket, 0), (deadline if deadline > 0 else None), admitted, estimate


@dataclass(frozen=True)
class Taken:
    """What an admitted-to step takes in one execution: rows, highest ticket, deadlines.

    ``estimated``: (admitted at µs, estimate µs) of each request admitted on an estimate
    of at least :data:`OBSERVED_FROM_US`.
    """

    rows: int
    ticket: int
    deadlines: tuple[int | None, ...]
    estimated: tuple[tuple[int, int], ...] = ()

    def ratios(self, now_us: int) -> list[float]:
        """Each estimated request's wait so far over its estimate."""
        return [(now_us - admitted) / estimate for admitted, estimate in self.estimated]

    @classmethod
    def read(cls, pb_utils: Any, requests: list, input_name: str) -> Taken:
        """Each request's :data:`ADMITTED_TICKET`; without one (a direct call), its rows.

        A request's deadline is the earlier of its ticket's and its
        :data:`DEADLINE_PARAMETER`.
        """
        rows, high, deadlines, estimated = 0, 0, [], []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, ADMITTED_TICKET)
            ticket, deadline = 0, None
            if tensor is not None:
                array = tensor.as_numpy()
                ticket, deadline, admitted, estimate = taken_ticket(array)
                count = len(array)
                if estimate >= OBSERVED_FROM_US and admitted > 0:
                    estimated.append((admitted, estimate))
            else:
                data = pb_utils.get_input_tensor_by_name(request, input_name)
                count = 0 if data is None else len(data.as_numpy())
            stated = deadline_us(_request_parameters(request))
            if stated is not None:
                deadline = stated if deadline is None else min(deadline, stated)
            rows += count
            high = max(high, ticket)
            deadlines.append(deadline)
        return cls(rows, high, tuple(deadlines), tuple(estimated))


def _request_parameters(request: Any) -> Mapping[str, Any]:
    try:
        parameters = json.loads(request.parameters())
    except (TypeError, ValueError):
        return {}
    return parameters if isinstance(parameters, dict) else {}


class LateError(UnavailableError):
    """The request's deadline passes before this execution can end; none of it was done."""


def late_refusals(taken: Taken, row_ns: int, now_us: Callable[[], int] = wall_clock_us):
    """Per request, the :class:`LateError` of one whose deadline passes before the run ends.

    The run is estimated at ``row_ns`` (the instance's own moving cost of a row) times the
    rows taken; 0 (it has not run yet) refuses nothing.
    """
    if row_ns <= 0:
        return [None] * len(taken.deadlines)
    end = now_us() + row_ns * taken.rows // 1000
    return [
        None
        if deadline is None or deadline >= end
        else LateError(
            f"server overloaded: the request's deadline passes {(end - deadline) / 1000:.0f} ms "
            "before this execution could end; retry later with backoff or a later deadline"
        )
        for deadline in taken.deadlines
    ]
