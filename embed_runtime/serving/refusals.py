"""One step's overload refusals, counted where an operator looks (metric and log)."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

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
