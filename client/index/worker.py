"""The partition worker: rows in, shard files and error rows out, resumable by shard.

:func:`index_partition` is plain Python that a local run calls once and a distributed
engine (a Spark ``mapPartitions`` task) can call per partition: it reads the rows, skips
those of shards already on disk, sends batches from ``concurrency`` threads (one client
each, made by ``client_factory`` in that thread: tritonclient's HTTP client must stay in
the thread that made it), and writes each shard once all its rows are answered, while
the threads keep the server busy. Shard ``k`` holds the rows numbered ``k * shard_rows``
to ``(k + 1) * shard_rows - 1``, sorted by that number, so every run writes the same
shards whatever order the answers came in.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .mapper import Mapper, RowFailure
from .sources import Row
from .store import OutputFolder, nested_array, ragged_array, vectors_array

# Test hook: the process kills itself (SIGKILL) once it has written this many shards,
# after the shard's rename and before anything else records it.
KILL_AFTER_ENV = "EMBED_INDEX_KILL_AFTER_SHARDS"
MAX_INPUT_CHARS = 2000


@dataclass
class ShardDone:
    """What one finished shard held (for the manifest, progress and sinks)."""

    shard: int
    name: str
    rows: list[Row]
    values: list[Any]
    errors: list[tuple[Row, str]]


@dataclass
class PartitionResult:
    """Counts of one call of :func:`index_partition`."""

    rows: int = 0
    errors: int = 0
    skipped: int = 0
    shards: list[int] = field(default_factory=list)
    lowest_in_flight: int = 0


def _input_text(row: Row) -> str:
    """The error table's input: the text, path or URL (its start), or where bytes came from."""
    if row.origin is not None or not isinstance(row.item, str):
        return row.origin or ""
    return row.item[:MAX_INPUT_CHARS]


def shard_tables(done: ShardDone, kind: str, kept_types: dict[str, Any], dtype: Any) -> tuple:
    """The embeddings table and the error table of a shard."""
    import pyarrow as pa  # noqa: PLC0415 - the index extra

    columns: dict[str, Any] = {"id": pa.array([r.id for r in done.rows], pa.string())}
    rows = done.rows
    if kind == "chunks":
        columns, rows = chunk_columns(done, dtype)
    elif kind == "sparse":
        columns["indices"] = ragged_array([v[0] for v in done.values] or [np.zeros(0, np.int32)])
        columns["values"] = ragged_array([v[1] for v in done.values] or [np.zeros(0, np.float32)])
        if not done.values:
            columns["indices"], columns["values"] = columns["indices"][:0], columns["values"][:0]
    elif kind == "multivector":
        columns["embedding"] = nested_array(done.values)
    else:
        stacked = np.stack(done.values) if done.values else np.zeros((0, 0), dtype)
        columns["embedding"] = vectors_array(stacked.astype(dtype, copy=False))
    for name, kind_type in kept_types.items():
        columns[name] = pa.array([r.extra.get(name) for r in rows], kind_type)
    errors = pa.table(
        {
            "id": pa.array([r.id for r, _ in done.errors], pa.string()),
            "input": pa.array([_input_text(r) for r, _ in done.errors], pa.string()),
            "reason": pa.array([reason for _, reason in done.errors], pa.string()),
        }
    )
    return pa.table(columns), errors


def chunk_columns(done: ShardDone, dtype: Any) -> tuple[dict[str, Any], list[Row]]:
    """One row per chunk, and the source row of each (for the kept columns).

    Columns: the document's ``id``, ``chunk`` (its index), ``start`` / ``end`` (``str``
    indices into the text), ``tokens``, ``chunks`` (the document's count), ``embedding``.
    """
    import pyarrow as pa  # noqa: PLC0415 - the index extra

    pairs = [(row, n, c, len(chunks)) for row, chunks in zip(done.rows, done.values, strict=True)
             for n, c in enumerate(chunks)]
    vectors = np.stack([c.vector for _, _, c, _ in pairs]) if pairs else np.zeros((0, 0), dtype)
    columns = {
        "id": pa.array([row.id for row, *_ in pairs], pa.string()),
        "chunk": pa.array([n for _, n, _, _ in pairs], pa.int32()),
        "start": pa.array([c.start for _, _, c, _ in pairs], pa.int64()),
        "end": pa.array([c.end for _, _, c, _ in pairs], pa.int64()),
        "tokens": pa.array([c.tokens for _, _, c, _ in pairs], pa.int32()),
        "chunks": pa.array([count for *_, count in pairs], pa.int32()),
        "embedding": vectors_array(vectors.astype(dtype, copy=False)),
    }
    return columns, [row for row, *_ in pairs]


class InFlightGate:
    """How many batches may be out at once, from the server's refusals.

    Halved when the server refuses, regrown by one after as many refusal-free batches as
    the current limit (additive increase, multiplicative decrease), never above the
    configured ``limit`` or below 1.
    """

    def __init__(self, limit: int):
        self.ceiling = self.limit = self.lowest = max(1, limit)
        self.active = 0
        self._clean = 0
        self._cond = threading.Condition()

    def acquire(self) -> None:
        """Wait for a free slot."""
        with self._cond:
            while self.active >= self.limit:
                self._cond.wait(0.1)
            self.active += 1

    def release(self, refused: bool) -> None:
        """A batch came back; ``refused``: the server refused a request meanwhile."""
        with self._cond:
            self.active -= 1
            if refused:
                self.limit = max(1, self.limit // 2)
                self.lowest = min(self.lowest, self.limit)
                self._clean = 0
            else:
                self._clean += 1
                if self._clean >= self.limit and self.limit < self.ceiling:
                    self.limit += 1
                    self._clean = 0
            self._cond.notify_all()


def _refusals(client: Any, mapper: Mapper) -> int:
    """Refusals seen so far: the client's retries (its budget's count) and resent batches."""
    budget = getattr(client, "retry_budget", None)
    return (budget.retries if budget is not None else 0) + mapper.server_faults


class _Pool:
    """``count`` threads, each with its own client, embedding the batches put to it.

    At most ``gate.limit`` batches are out at once.
    """

    def __init__(self, count: int, mapper: Mapper, client_factory: Callable[[], Any]):
        self.jobs: queue.Queue = queue.Queue(maxsize=max(2, count * 2))
        self.results: queue.Queue = queue.Queue()
        self.mapper = mapper
        self.factory = client_factory
        self.gate = InFlightGate(count)
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._run, name=f"index-{i}", daemon=True) for i in range(count)
        ]
        for thread in self.threads:
            thread.start()

    def _run(self) -> None:
        try:
            client = self.factory()
        except Exception as exc:  # noqa: BLE001 - reported to the main thread
            self.results.put(("error", exc))
            return
        try:
            while True:
                job = self.jobs.get()
                if job is None or self.stop.is_set():
                    return
                shard, rows = job
                self.gate.acquire()
                before = _refusals(client, self.mapper)
                try:
                    values = self.mapper.embed(client, rows)
                except Exception as exc:  # noqa: BLE001 - reported to the main thread
                    self.results.put(("error", exc))
                    return
                finally:
                    self.gate.release(_refusals(client, self.mapper) > before)
                self.results.put(("ok", (shard, rows, values)))
        finally:
            client.close()

    def close(self) -> None:
        self.stop.set()
        for _ in self.threads:
            try:
                self.jobs.put_nowait(None)
            except queue.Full:
                break
        for thread in self.threads:
            thread.join(timeout=0.1)


class _Assembler:
    """Collects answered rows per shard; hands back each shard once all its rows are in."""

    def __init__(self) -> None:
        self.expected: dict[int, int] = {}
        self.closed: set[int] = set()
        self.answers: dict[int, list[tuple[Row, Any]]] = {}

    def add_row(self, shard: int) -> None:
        self.expected[shard] = self.expected.get(shard, 0) + 1

    def close(self, shard: int) -> None:
        self.closed.add(shard)

    def answer(self, shard: int, rows: list[Row], values: list[Any]) -> None:
        self.answers.setdefault(shard, []).extend(zip(rows, values, strict=True))

    def complete(self) -> list[tuple[int, list[tuple[Row, Any]]]]:
        ready = [
            s
            for s in sorted(self.closed)
            if len(self.answers.get(s, [])) == self.expected.get(s, 0)
        ]
        out = []
        for shard in ready:
            self.closed.discard(shard)
            self.expected.pop(shard, None)
            out.append((shard, sorted(self.answers.pop(shard, []), key=lambda a: a[0].index)))
        return out


def index_partition(
    rows: Iterable[Row],
    out: OutputFolder,
    part: str,
    mapper: Mapper,
    client_factory: Callable[[], Any],
    *,
    shard_rows: int,
    batch_rows: int,
    concurrency: int,
    kept_types: dict[str, Any] | None = None,
    dtype: Any = np.float32,
    on_shard: Callable[[ShardDone], None] | None = None,
    on_skip: Callable[[int], None] | None = None,
) -> PartitionResult:
    """Embed ``rows`` into shards ``<part>-NNNNN`` of ``out``; see the module.

    ``on_shard`` is called (in this thread) after each shard is written; ``on_skip`` with
    the number of rows of a shard found already done. Raises what a worker raised
    (:class:`~client.index.mapper.IndexAbortedError` when the server stayed away); the
    shards written so far stay, and a later call resumes after them.
    """
    kept_types = kept_types or {}
    done = out.done_shards(part)
    result = PartitionResult()
    assembler = _Assembler()
    pool = _Pool(concurrency, mapper, client_factory)
    kill_after = int(os.environ.get(KILL_AFTER_ENV, "0") or 0)
    written = 0

    def write_ready() -> None:
        """Write every shard whose rows are all read and all answered."""
        nonlocal written
        for number, answers in assembler.complete():
            finished = _finish(out, part, number, answers, mapper.plan.kind, kept_types, dtype)
            written += 1
            if kill_after and written >= kill_after:
                os.kill(os.getpid(), signal.SIGKILL)
            result.rows += len(finished.rows)
            result.errors += len(finished.errors)
            result.shards.append(number)
            if on_shard:
                on_shard(finished)

    def close(shard: int) -> None:
        """All of ``shard``'s rows are read: it may already be complete."""
        if shard >= 0 and shard not in done:
            assembler.close(shard)
            write_ready()

    def drain(block: bool) -> None:
        while True:
            try:
                status, payload = pool.results.get(block=block, timeout=0.5 if block else None)
            except queue.Empty:
                return
            if status == "error":
                raise payload
            shard, batch, values = payload
            assembler.answer(shard, batch, values)
            write_ready()
            block = False

    def submit(shard: int, batch: list[Row]) -> None:
        while True:
            try:
                pool.jobs.put((shard, batch), timeout=0.05)
                break
            except queue.Full:
                drain(block=False)
        drain(block=False)

    try:
        batch: list[Row] = []
        current = -1
        for row in rows:
            shard = row.index // shard_rows
            if shard != current:
                if batch:
                    submit(current, batch)
                    batch = []
                close(current)
                current = shard
            if shard in done:
                result.skipped += 1
                if on_skip:
                    on_skip(1)
                continue
            assembler.add_row(shard)
            batch.append(row)
            if len(batch) >= batch_rows:
                submit(shard, batch)
                batch = []
        if batch:
            submit(current, batch)
        close(current)
        while assembler.expected or assembler.closed:
            drain(block=True)
    finally:
        pool.close()
        result.lowest_in_flight = pool.gate.lowest
    return result


def _finish(
    out: OutputFolder,
    part: str,
    shard: int,
    answers: list[tuple[Row, Any]],
    kind: str,
    kept_types: dict[str, Any],
    dtype: Any,
) -> ShardDone:
    rows, values, errors = [], [], []
    for row, value in answers:
        if isinstance(value, RowFailure):
            errors.append((row, value.reason))
        else:
            rows.append(row)
            values.append(value)
    done = ShardDone(shard, out.shard_name(part, shard), rows, values, errors)
    table, error_table = shard_tables(done, kind, kept_types, dtype)
    out.write_shard(part, shard, table, error_table)
    return done
