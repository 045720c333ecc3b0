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


# Requests per encoder instance always admitted, whatever one costs (AdmissionGate.begin).
PER_INSTANCE = 2


class OverloadedError(UnavailableError):
    """The encoder's queue already holds more work than the model admits; none was done."""


class AdmissionGate:
    """Admits the requests of one execution while the encoder's queue has room for them.

    Built by the step in front of an encoder from its config parameters
    (:data:`ADMISSION_ENCODER`, :data:`ADMISSION_WAIT`); :meth:`begin` reads the
    encoder's backlog board once per execution, :meth:`refusal` is asked for each request
    in order, and :meth:`passed` counts what went on to the encoder.
    """

    def __init__(self, board: Admission, encoder: str, wait_us: int):
        self.board, self.encoder, self.wait_us = board, encoder, wait_us
        self._room = 0.0
        self._read = Backlog(0, 0.0)
        self._admitted = 0  # by this execution so far: they wait too

    @classmethod
    def from_parameters(cls, params: Mapping[str, str], version: str) -> AdmissionGate | None:
        """The gate a step's config asks for, or ``None`` where it admits everything."""
        encoder = params.get(ADMISSION_ENCODER, "")
        wait_us = int(params.get(ADMISSION_WAIT, "0") or 0)
        if not encoder or wait_us <= 0:
            return None
        return cls(Admission(board_path(encoder, version)), encoder, wait_us)

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
        return OverloadedError(
            f"server overloaded: {waiting.queued} request(s) (about "
            f"{waiting.wait_ns / 1e6:.0f} ms of work) already wait for {self.encoder}, over "
            f"its admission bound of {self.wait_us / 1000:g} ms ({ADMISSION_WAIT}); "
            "retry later with backoff"
        )

    def passed(self, requests: int) -> None:
        """Count ``requests`` sent on to the encoder."""
        self.board.passed(requests)

    def close(self) -> None:
        """Free this instance's slot on the board."""
        self.board.close()
