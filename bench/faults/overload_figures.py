"""The figures of one open-loop run of ``bench.faults.overload``, and the issue's goal.

Pure functions over :class:`Shot` records (no server, no clock of their own), so the
judging is unit-tested with synthetic shots:

- every shot ends one way: *accepted* (an answer within the client deadline), *refused*
  (gRPC ``UNAVAILABLE`` / ``RESOURCE_EXHAUSTED``: a full queue, or a step that found the
  request's deadline passed), *past the deadline* (``DEADLINE_EXCEEDED``, or any answer,
  a refusal too, that came after the deadline), *other error*, or *no answer* at all;
- goodput: accepted answers with the right vector per second, from the first planned
  arrival to the last such answer; its ratio is to the sustainable rate. The span never
  ends before the last good answer, so goodput is never overstated by answers that come
  after the arrivals stop; on a short run (``--quick``) whose answers take seconds it is
  understated by about latency / (run + latency);
- the goal (issue 46): goodput >= 0.9 x sustainable, accepted p99 <= 2 x the accepted p99
  of an open loop at 0.8 x the sustainable rate, refusals' p99 <= 50 ms, nothing past
  the deadline (or unanswered), no wrong vector and no other error.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

ATOL = 1e-5
REFUSALS = ("StatusCode.UNAVAILABLE", "StatusCode.RESOURCE_EXHAUSTED")
DEADLINE = "StatusCode.DEADLINE_EXCEEDED"
GOAL_GOODPUT_RATIO = 0.9
GOAL_P99_RATIO = 2.0
GOAL_REFUSAL_MS = 50.0
NO_ANSWER = "no answer"


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50 / p99 / max of ``values`` (ms), rounded; empty -> ``{}``."""
    if not len(values):
        return {}
    a = np.asarray(values, dtype=np.float64)
    return {
        "p50": round(float(np.percentile(a, 50)), 2),
        "p99": round(float(np.percentile(a, 99)), 2),
        "max": round(float(a.max()), 2),
    }


@dataclass
class Shot:
    """One open-loop request: which request, when planned, sent and answered, and how."""

    item: int
    planned: float
    sent: float = 0.0
    done: float = 0.0
    status: str = ""
    vector: np.ndarray | None = None

    def answer(self, vector: np.ndarray | None, status: str, now: float) -> None:
        """Record the answer (``status`` empty on success) at ``now`` on the loop's clock."""
        self.vector, self.status, self.done = vector, status, now


def status_key(status: str) -> str:
    """A status with its free-standing numbers masked (``12.5 ms`` -> ``# ms``, names kept).

    Messages that differ only by a time or a count are then counted together.
    """
    return re.sub(r"(?<![\w.-])\d+(\.\d+)?", "#", status)[:120]


def classify(shot: Shot, deadline_s: float) -> str:
    """``accepted``, ``refused``, ``past_deadline``, ``other_error`` or ``no_answer``."""
    if not shot.done:
        return "no_answer"
    if shot.status.startswith(DEADLINE) or shot.done - shot.sent > deadline_s:
        return "past_deadline"
    if shot.status:
        return "refused" if shot.status.startswith(REFUSALS) else "other_error"
    return "accepted"


def vector_diff(vector: np.ndarray | None, expected: np.ndarray) -> float:
    """Max abs difference of an answer from its reference rows (inf when the shape differs)."""
    if vector is None or vector.shape != expected.shape:
        return float("inf")
    return float(np.abs(vector - expected).max())


def outcome(
    shots: Sequence[Shot],
    expected: Callable[[int], np.ndarray],
    deadline_s: float,
    target_rate: float,
    sent_s: float,
) -> dict[str, Any]:
    """Counts, latencies (ms), goodput and correctness of one open-loop run.

    ``expected(item)`` is the reference rows of request ``item``; ``sent_s`` the wall time
    from the first planned arrival to the last send.
    """
    kinds: dict[str, list[float]] = {
        k: [] for k in ("accepted", "refused", "past_deadline", "other_error")
    }
    statuses: Counter[str] = Counter()
    wrong, worst, good_until = 0, 0.0, []
    for shot in shots:
        kind = classify(shot, deadline_s)
        statuses[status_key(shot.status) if shot.status else kind] += 1
        if kind == "no_answer":
            continue
        kinds[kind].append((shot.done - shot.sent) * 1000.0)
        if kind == "accepted":
            diff = vector_diff(shot.vector, expected(shot.item))
            worst = max(worst, diff)
            if diff > ATOL:
                wrong += 1
            else:
                good_until.append(shot.done)
    start = min((s.planned for s in shots), default=0.0)
    span = max(good_until, default=start) - start
    return {
        "target_rate": round(target_rate, 2),
        "send_rate": round(len(shots) / sent_s, 2) if sent_s > 0 else 0.0,
        "send_lag_ms": percentiles([(s.sent - s.planned) * 1000.0 for s in shots if s.sent]),
        "sent": len(shots),
        "accepted": len(kinds["accepted"]),
        "good": len(good_until),
        "refused": len(kinds["refused"]),
        "past_deadline": len(kinds["past_deadline"]),
        "other_errors": len(kinds["other_error"]),
        "no_answer": statuses["no_answer"],
        "goodput": round(len(good_until) / span, 2) if span > 0 else 0.0,
        "statuses": dict(statuses.most_common()),
        "accepted_ms": percentiles(kinds["accepted"]),
        "refused_ms": percentiles(kinds["refused"]),
        "past_deadline_ms": percentiles(kinds["past_deadline"]),
        "wrong": wrong,
        "max_abs_diff": worst,
    }


def _ratio(value: float | None, base: float | None) -> float | None:
    return round(value / base, 2) if value is not None and base else None


def judge(run: dict[str, Any], sustainable: float, reference_ms: Mapping[str, float]) -> None:
    """Add the ratios and the issue's goal, part by part, to a run from :func:`outcome`.

    ``reference_ms`` is the accepted latencies (``p50`` / ``p99``) of the open loop at
    0.8 x the ``sustainable`` rate.
    """
    acc, refused = run["accepted_ms"], run["refused_ms"]
    run["goodput_ratio"] = _ratio(run["goodput"], sustainable) or 0.0
    run["accepted_p50_ratio"] = _ratio(acc.get("p50"), reference_ms.get("p50"))
    run["accepted_p99_ratio"] = _ratio(acc.get("p99"), reference_ms.get("p99"))
    p99 = run["accepted_p99_ratio"]
    goal = {
        "goodput": run["goodput_ratio"] >= GOAL_GOODPUT_RATIO,
        "accepted_p99": p99 is not None and p99 <= GOAL_P99_RATIO,
        "refusal_p99": not refused or refused["p99"] <= GOAL_REFUSAL_MS,
        "deadline": run["past_deadline"] + run["no_answer"] == 0,
        "vectors": run["wrong"] == 0 and run["other_errors"] == 0,
    }
    run["goal"] = {**goal, "met": all(goal.values())}


def cpu_share(busy_s: float, seconds: float, cores: int) -> float:
    """Busy core-seconds as a share of ``cores`` over ``seconds`` (0..1)."""
    return round(busy_s / (seconds * cores), 3) if seconds > 0 and cores > 0 else 0.0


TABLE_HEADER = (
    "config",
    "load",
    "x",
    "req/s",
    "goodput",
    "p50 ms",
    "p50 x",
    "p99 ms",
    "p99 x",
    "refusal p99",
    "refused",
    "late",
    "lg cpu",
    "goal",
)


def table_row(record: Mapping[str, Any]) -> tuple[str, ...]:
    """One row of the final table for a (configuration, load, factor) record."""
    acc, goal = record["accepted_ms"], record["goal"]
    missed = [k for k, ok in goal.items() if k != "met" and not ok]
    return (
        record["config"],
        record["load"],
        f"{record['factor']:g}",
        f"{record['target_rate']:.1f}",
        f"{record['goodput_ratio']:.2f}",
        f"{acc.get('p50', '-')}",
        f"{record['accepted_p50_ratio']}",
        f"{acc.get('p99', '-')}",
        f"{record['accepted_p99_ratio']}",
        f"{record['refused_ms'].get('p99', '-')}",
        str(record["refused"]),
        str(record["past_deadline"] + record["no_answer"]),
        f"{record['load_generator_cpu_share']:.0%}",
        "met" if goal["met"] else "missed " + ",".join(missed),
    )


def table(records: Sequence[Mapping[str, Any]]) -> str:
    """The compact table: one aligned row per (configuration, load, factor)."""
    rows = [TABLE_HEADER, *(table_row(r) for r in records)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(TABLE_HEADER))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )
