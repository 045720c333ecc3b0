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

import time
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import UnavailableError

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
