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

import math
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

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


ADMISSION_ENCODER = "admission_encoder"
ADMISSION_WAIT = "admission_wait_us"
# Set ("true") on a step that an admitting step in front counts for, other than an encoder
# (which always counts): image preprocessing behind ``<name>_admit_image``.
BACKLOG_PARAMETER = "admission_backlog"
# Set ("true") on an admitting step that refuses while the queue is full but counts
# nothing it passes on: ``<name>_admit_url``, in front of the URL fetch.
ADMISSION_PEEK = "admission_peek"


# Requests per encoder instance always admitted, whatever one costs (AdmissionGate.begin).
PER_INSTANCE = 2


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
    (:data:`ADMISSION_ENCODER`, :data:`ADMISSION_WAIT`); :meth:`begin` reads the
    encoder's backlog board once per execution, :meth:`refusal` is asked for each request
    in order, and :meth:`passed` counts what went on to the encoder.
    """

    def __init__(
        self, board: Admission, encoder: str, wait_us: int, refusals: Refusals | None = None
    ):
        self.board, self.encoder, self.wait_us = board, encoder, wait_us
        self.refusals = refusals
        self._room = 0.0
        self._read = Backlog(0, 0.0)
        self._admitted = 0  # by this execution so far: they wait too

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
        if not encoder or wait_us <= 0:
            return None
        refusals = None if pb_utils is None else Refusals.for_step(pb_utils, model, encoder)
        return cls(Admission(board_path(encoder, version)), encoder, wait_us, refusals)

    def begin(self) -> None:
        """Read the backlog: how many requests this execution may pass on."""
        budget = self.wait_us * 1000
        self._admitted = 0
        self._read = backlog = self.board.read()
        if backlog.per_request_ns <= 0:  # the encoder has not run yet: nothing to go by
            self._room = math.inf
            return
        room = (budget - backlog.wait_ns) // backlog.per_request_ns
        if room < 1 and self.board.idle():  # idle encoders: nothing can be queued
            self.board.resync(backlog.queued)
            backlog = Backlog(0, backlog.per_request_ns, backlog.encoders)
            room = budget // backlog.per_request_ns
        # Never fewer than two queued per instance, whatever one request costs: each
        # instance finds its next request waiting when it ends a run, and a closed loop of
        # two clients per instance is never refused (an answer can reach its client before
        # the instance has counted the next request as taken).
        floor = max(PER_INSTANCE * backlog.encoders, 1) - backlog.queued
        self._room = max(room, floor)

    def refusal(self) -> OverloadedError | None:
        """``None`` to admit the next request, else the error that refuses it."""
        if self._room >= 1:
            self._room -= 1
            self._admitted += 1
            return None
        waiting = Backlog(
            self._read.queued + self._admitted, self._read.per_request_ns, self._read.encoders
        )
        error = OverloadedError(
            f"server overloaded: {waiting.queued} request(s) (about "
            f"{waiting.wait_ns / 1e6:.0f} ms of work) already wait for {self.encoder}, over "
            f"its admission bound of {self.wait_us / 1000:g} ms ({ADMISSION_WAIT}); "
            "retry later with backoff"
        )
        if self.refusals is not None:
            self.refusals.count(error.message)
        return error

    def passed(self, requests: int) -> None:
        """Count ``requests`` sent on to the encoder."""
        self.board.passed(requests)

    def close(self) -> None:
        """Free this instance's slot on the board; log the refusals' total."""
        self.board.close()
        if self.refusals is not None:
            self.refusals.close()
