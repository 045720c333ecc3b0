"""The per-load ceiling: the best in-process way to run exactly what one load sent.

A server under a load of C clients x R rows never holds more than C x R rows at once,
and it has to tokenize them. So the ceiling of a load is measured on that load's own
timed rows, in the order the clients sent them (``client.load.loadgen.run_load`` hands
request ``c + k * C`` to client ``c``, so consecutive runs of C requests are what can
be in flight together), tokenization included, as the best of three ways of running
the same ONNX graph in this process:

- ``batch1``: every row tokenized and run alone (no padding at all);
- ``sorted``: each group of C x R rows tokenized together, sorted by length and run in
  batches of up to 32 rows padded to their own longest row;
- ``planner``: each group tokenized together and cut by the encoder's own chunk
  planner (:func:`embed_runtime.engines.ragged.plan_chunks` with the served
  ``max_rows_per_run`` / ``max_padding_share``);
- ``parallel`` (when one single-threaded session per core is given): each group's rows
  dealt out to those sessions, each tokenizing its share and running it through the
  planner on its own thread (ONNX Runtime and the tokenizer release the GIL), one group
  at a time. Measured because two single-threaded encoder instances beat one
  two-threaded instance on a 2-core CPU.

A server that beats this ceiling found a way of running the work that none of the three
knows; the benchmark reports served / ceiling per load.
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
    """Seconds to run every group split across the sessions, one thread each.

    Each group's rows are dealt out (row ``k`` to session ``k % n``); the sessions
    tokenize and run their share at the same time, and the next group starts when both
    are done, so no more rows are in flight than in the group.
    """
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

    ``tokenize`` is the served tokenizer (``BatchTokenizer.encode`` for texts,
    ``PairTokenizer.encode`` for query/text pairs); ``session`` the served graph;
    ``parallel_sessions`` the same graph in single-threaded sessions, one per core.
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
