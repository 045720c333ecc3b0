"""The per-load ceiling: the best in-process way to run exactly what one load sent.

One load's timed rows, in arrival order, in groups of what can be in flight together,
tokenized and run by the served graph four ways: ``batch1``, ``sorted`` (batches of 32),
``planner`` (the encoder's :func:`~embed_runtime.engines.ragged.plan_chunks`) and
``parallel`` (the planner on one single-threaded session per core, at once). The why and
how: ``bench/templates/method.md``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from embed_runtime.engines.ragged import Chunk, chunk_inputs, plan_chunks, true_lengths

SORTED_BATCH = 32
Tokenize = Callable[[Sequence[Any]], dict[str, np.ndarray]]


@dataclass
class LoadCeiling:
    """Rows/s of each in-process way over one load's rows, and the best of them."""

    rows: int
    rows_in_flight: int
    batch1_items_per_s: float
    sorted_items_per_s: float
    planner_items_per_s: float
    parallel_items_per_s: float = 0.0
    best: str = ""
    best_items_per_s: float = 0.0

    def __post_init__(self) -> None:
        ways = {
            w: getattr(self, f"{w}_items_per_s")
            for w in ("batch1", "sorted", "planner", "parallel")
        }
        self.best = max(ways, key=ways.__getitem__)
        self.best_items_per_s = ways[self.best]

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for the results file."""
        return asdict(self)


def _sorted_batches(lengths: np.ndarray, size: int) -> list[Chunk]:
    order = np.argsort(lengths, kind="stable")
    return [
        Chunk(rows=rows, width=max(int(lengths[rows].max()), 1))
        for rows in (order[i : i + size] for i in range(0, len(order), size))
    ]


def _timed_pass(
    session, tokenize: Tokenize, groups: list[list[Any]], names: set[str], plan
) -> float:
    """Seconds to tokenize every group and run the chunks ``plan(lengths)`` cuts it into."""
    start = time.perf_counter()
    for group in groups:
        arrays = {k: v for k, v in tokenize(group).items() if k in names}
        lengths = true_lengths(arrays["attention_mask"])
        for chunk in plan(lengths):
            session.run(None, chunk_inputs(arrays, chunk))
    return time.perf_counter() - start


def _parallel_pass(
    sessions: Sequence[Any], tokenize: Tokenize, groups: list[list[Any]], names: set[str], plan
) -> float:
    """Seconds to run every group dealt out across the sessions at once, a group at a time."""
    from concurrent.futures import ThreadPoolExecutor

    n = len(sessions)

    def share(pair) -> float:
        session, rows = pair
        return _timed_pass(session, tokenize, [rows], names, plan) if rows else 0.0

    start = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        for group in groups:
            list(pool.map(share, zip(sessions, [group[i::n] for i in range(n)], strict=True)))
    return time.perf_counter() - start


def load_ceiling(
    session,
    tokenize: Tokenize,
    rows: Sequence[Any],
    rows_in_flight: int,
    max_rows_per_run: int,
    max_padding_share: float,
    parallel_sessions: Sequence[Any] = (),
) -> LoadCeiling:
    """Measure the ways over ``rows`` (arrival order) in groups of ``rows_in_flight``.

    ``tokenize``: the served tokenizer's ``encode``; ``parallel_sessions``: one per core.
    """
    names = {i.name for i in session.get_inputs()}
    rows = list(rows)
    groups = [rows[i : i + rows_in_flight] for i in range(0, len(rows), rows_in_flight)]
    singles = [[row] for row in rows]

    def planner(lengths: np.ndarray) -> list[Chunk]:
        return plan_chunks(lengths, max_rows_per_run, max_padding=max_padding_share)

    def one_batch(lengths: np.ndarray) -> list[Chunk]:
        return _sorted_batches(lengths, SORTED_BATCH)

    ways = {
        "batch1": (singles, one_batch),
        "sorted": (groups, one_batch),
        "planner": (groups, planner),
    }
    for chunks, plan in ways.values():  # warm-up: allocations and ORT's first-run work
        _timed_pass(session, tokenize, chunks[:2], names, plan)
    rates = {
        name: len(rows) / _timed_pass(session, tokenize, chunks, names, plan)
        for name, (chunks, plan) in ways.items()
    }
    parallel = 0.0
    if len(parallel_sessions) > 1:
        _parallel_pass(parallel_sessions, tokenize, groups[:4], names, planner)
        parallel = len(rows) / _parallel_pass(parallel_sessions, tokenize, groups, names, planner)
    return LoadCeiling(
        rows=len(rows),
        rows_in_flight=rows_in_flight,
        batch1_items_per_s=rates["batch1"],
        sorted_items_per_s=rates["sorted"],
        planner_items_per_s=rates["planner"],
        parallel_items_per_s=parallel,
    )


def timed_rows(requests: Sequence[Sequence[Any]], clients: int, warmup: int) -> list[Any]:
    """The rows a load times, in arrival order: requests after every client's warm-up."""
    timed = requests[clients * warmup :]
    return [row for request in timed for row in request]
