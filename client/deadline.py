"""The deadline of one client call, and the request parameter that carries it to the server.

Every infer request of :class:`client.EmbeddingClient` carries its deadline two ways: the
transport timeout (HTTP: the client closes the connection, which Triton turns into a
cancellation; gRPC: a real gRPC deadline), set to the time left, and the request
parameter :data:`DEADLINE_PARAMETER`, an absolute wall-clock time that every server step
checks before it works (``embed_runtime.serving.admission`` mirrors the name). Ensembles
forward request parameters to their steps unchanged, so the same absolute time reaches
each of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

# int: the deadline in microseconds since the Unix epoch.
DEADLINE_PARAMETER = "deadline_unix_us"


class Deadline:
    """``seconds`` from now on ``clock`` (monotonic); read on ``wall_clock`` for the server."""

    def __init__(
        self,
        seconds: float,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ):
        self.seconds = seconds
        self._clock = clock
        self._wall_clock = wall_clock
        self._start = clock()
        self._end = self._start + seconds

    def remaining(self) -> float:
        """Seconds left (negative once passed)."""
        return self._end - self._clock()

    def elapsed(self) -> float:
        """Seconds since the deadline was set."""
        return self._clock() - self._start

    def unix_us(self) -> int:
        """The deadline as the server reads it: microseconds since the Unix epoch."""
        return int((self._wall_clock() + self.remaining()) * 1e6)


def with_deadline(parameters: Mapping[str, Any] | None, deadline: Deadline) -> dict[str, Any]:
    """``parameters`` plus :data:`DEADLINE_PARAMETER`; a caller's own value of it is kept."""
    return {DEADLINE_PARAMETER: deadline.unix_us(), **(parameters or {})}
