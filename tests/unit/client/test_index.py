"""The corpus indexer's parts without a server: readers, shards, manifest, resume, isolation.

The partition worker runs for real (threads, Parquet files, the manifest); the server is
replaced by a small deterministic embedder that answers like ``EmbeddingClient``: a
vector per text, an ``EmbeddingClientError`` for a request holding a bad row, and
``ServerOverloadedError`` when told to refuse.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import tarfile
import threading

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from client.errors import EmbeddingClientError, ServerOverloadedError
from client.index import (
    ImageFolderSource,
    IndexAbortedError,
    ModelPlan,
    OutputFolder,
    OutputMismatchError,
    Row,
    SourceError,
    TableSource,
    WebDatasetSource,
    index_partition,
)
from client.index.mapper import Mapper, RowFailure
from client.index.progress import Progress
from client.index.qdrant import QdrantSink, open_qdrant, point_id
from client.index.store import atomic_write_bytes, check_resumable
from client.index.worker import InFlightGate, ShardDone, shard_tables

DIM = 8


def _vector(text: str) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")
    vector = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return vector / np.linalg.norm(vector)


class FakeEmbedder:
    """Answers ``embed_texts`` like the client; ``refuse_after`` batches, then refuses."""

    def __init__(self, refuse_after: int | None = None, calls: list | None = None):
        self.refuse_after = refuse_after
        self.calls = calls if calls is not None else []
        self.closed = False

    def embed_texts(self, model: str, texts: list[str], **options) -> np.ndarray:
        self.calls.append(list(texts))
        if self.refuse_after is not None and len(self.calls) > self.refuse_after:
            raise ServerOverloadedError("server overloaded: queue full", "503", model)
        bad = [t for t in texts if "BAD" in t]
        if bad:
            raise EmbeddingClientError(f"refused {bad[0]!r}", "400", model)
        return np.stack([_vector(t) for t in texts])

    def close(self) -> None:
        self.closed = True


PLAN = ModelPlan("m", "dense", "m", 16, 1, "config:x")


def _rows(texts: list[str]) -> list[Row]:
    return [Row(i, f"r{i}", t) for i, t in enumerate(texts)]


def _partition(out, texts, factory, shard_rows=10, concurrency=3, **kwargs):
    mapper = kwargs.pop("mapper", None) or Mapper(PLAN, server_retries=0, sleep=lambda _s: None)
    return index_partition(
        _rows(texts),
        out,
        "part",
        mapper,
        factory,
        shard_rows=shard_rows,
        batch_rows=4,
        concurrency=concurrency,
        **kwargs,
    )


def test_jsonl_csv_and_parquet_rows_in_file_order_with_ids_or_row_numbers(tmp_path):
    (tmp_path / "a.jsonl").write_text(
        '{"id": "x", "text": "one", "n": 1}\n\n{"text": "two", "n": [1, 2]}\n', encoding="utf-8"
    )
    with (tmp_path / "b.csv").open("w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows([["text", "n"], ["three", "3"]])
    pq.write_table(pa.table({"text": ["four"], "n": [4], "id": [44]}), tmp_path / "c.parquet")
    source = TableSource([str(tmp_path)], keep=["n"])
    rows = list(source.rows())
    assert [(r.index, r.id, r.item) for r in rows] == [
        (0, "x", "one"),
        (1, "1", "two"),
        (2, "2", "three"),
        (3, "44", "four"),
    ]
    assert [r.extra["n"] for r in rows] == ["1", "[1, 2]", "3", 4]
    assert source.count() == 4
    assert source.kept_types() == {"n": pa.int64()}


def test_table_source_refuses_a_missing_column_and_empty_inputs(tmp_path):
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "c.parquet")
    with pytest.raises(SourceError, match="no column text"):
        TableSource([str(tmp_path / "c.parquet")])
    with pytest.raises(SourceError, match="no such file"):
        TableSource([str(tmp_path / "missing-*.jsonl")])


def test_glob_inputs_and_fingerprint_follow_the_files(tmp_path):
    for name in ("a.jsonl", "b.jsonl"):
        (tmp_path / name).write_text('{"text": "t"}\n', encoding="utf-8")
    source = TableSource([str(tmp_path / "*.jsonl")])
    assert [p.name for p in source.files] == ["a.jsonl", "b.jsonl"]
    before = source.fingerprint
    assert TableSource([str(tmp_path / "*.jsonl")]).fingerprint == before
    (tmp_path / "b.jsonl").write_text('{"text": "t"}\n{"text": "u"}\n', encoding="utf-8")
    assert TableSource([str(tmp_path / "*.jsonl")]).fingerprint != before
    assert TableSource([str(tmp_path)], column="body").fingerprint != before


def test_image_folder_is_recursive_sorted_with_relative_ids(tmp_path):
    (tmp_path / "b").mkdir()
    for name in ("b/2.png", "a.jpg", "notes.txt"):
        (tmp_path / name).write_bytes(b"x")
    source = ImageFolderSource([str(tmp_path)])
    assert [r.id for r in source.rows()] == ["a.jpg", "b/2.png"]


def test_atomic_write_leaves_only_the_final_file(tmp_path):
    atomic_write_bytes(tmp_path / "m.json", b"{}")
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]


def test_changed_identity_is_refused_with_the_difference_named(tmp_path):
    out = OutputFolder(tmp_path)
    identity = {"format": 1, "model": "m", "kind": "dense", "options": {}, "input": "abc"}
    out.write_manifest({**identity, "shards": {}})
    check_resumable(out, identity, restart=False)
    with pytest.raises(OutputMismatchError, match=r'options: \{\} -> \{"dimensions": 64\}'):
        check_resumable(out, {**identity, "options": {"dimensions": 64}}, restart=False)
    check_resumable(out, {**identity, "model": "other"}, restart=True)
    assert out.read_manifest() is None


def test_partition_writes_sorted_shards_each_row_once(tmp_path):
    texts = [f"text {i}" for i in range(37)]
    out = OutputFolder(tmp_path)
    out.prepare()
    result = _partition(out, texts, FakeEmbedder)
    assert result.rows == 37 and sorted(result.shards) == [0, 1, 2, 3]
    frame = pd.read_parquet(tmp_path / "embeddings")
    assert list(frame["id"]) == [f"r{i}" for i in range(37)]
    np.testing.assert_array_equal(np.stack(frame["embedding"]), [_vector(t) for t in texts])
    assert len(pd.read_parquet(tmp_path / "errors")) == 0


def test_a_bad_row_fails_alone_and_the_rest_of_its_batch_is_kept(tmp_path):
    texts = [f"text {i}" for i in range(12)]
    texts[5], texts[6] = "BAD five", "   "
    out = OutputFolder(tmp_path)
    out.prepare()
    result = _partition(out, texts, FakeEmbedder)
    assert (result.rows, result.errors) == (10, 2)
    frame = pd.read_parquet(tmp_path / "embeddings")
    assert "r5" not in set(frame["id"]) and len(frame) == 10
    errors = pd.read_parquet(tmp_path / "errors").set_index("id")
    assert errors.loc["r5", "reason"] == "refused 'BAD five'"
    assert errors.loc["r6", "reason"] == "empty text"
    assert errors.loc["r5", "input"] == "BAD five"


def test_a_server_that_stays_away_stops_the_run_and_a_rerun_resumes(tmp_path):
    texts = [f"text {i}" for i in range(40)]
    out = OutputFolder(tmp_path)
    out.prepare()
    calls: list = []
    with pytest.raises(IndexAbortedError, match="server did not take a batch"):
        _partition(out, texts, lambda: FakeEmbedder(refuse_after=4, calls=calls), concurrency=1)
    done = out.done_shards("part")
    assert done and done == set(range(len(done)))  # whole shards only, in order
    stamps = {p.name: p.stat().st_mtime_ns for p in out.embeddings.iterdir()}
    calls.clear()
    result = _partition(out, texts, lambda: FakeEmbedder(calls=calls))
    assert result.skipped == 10 * len(done)
    sent = {t for call in calls for t in call}
    assert not sent & {texts[i] for s in done for i in range(10 * s, 10 * s + 10)}
    assert all(p.stat().st_mtime_ns == stamps[p.name] for p in out.embeddings.iterdir()
               if p.name in stamps)  # fmt: skip
    frame = pd.read_parquet(tmp_path / "embeddings")
    assert list(frame["id"]) == [f"r{i}" for i in range(40)]


def test_refused_batches_are_retried_with_backoff_before_giving_up():
    waits: list[float] = []
    mapper = Mapper(PLAN, server_retries=3, backoff_s=1.0, sleep=waits.append)
    client = FakeEmbedder(refuse_after=0)
    with pytest.raises(IndexAbortedError):
        mapper.embed(client, _rows(["a", "b"]))
    assert len(waits) == 3 and all(0.5 * 2**i <= w <= 2**i for i, w in enumerate(waits))
    assert len(client.calls) == 4


def test_each_worker_thread_has_its_own_client_closed_in_that_thread(tmp_path):
    made: list[tuple[int, FakeEmbedder]] = []

    def factory() -> FakeEmbedder:
        client = FakeEmbedder()
        made.append((threading.get_ident(), client))
        return client

    out = OutputFolder(tmp_path)
    out.prepare()
    _partition(out, [f"t{i}" for i in range(30)], factory, concurrency=3)
    assert len({ident for ident, _ in made}) == 3
    assert all(client.closed for _, client in made)


def test_local_row_failures_need_no_request(tmp_path):
    mapper = Mapper(ModelPlan("c", "image", "c_image", 16, 1, "x"), max_image_bytes=4)
    (tmp_path / "big.png").write_bytes(b"12345")
    rows = _rows([str(tmp_path / "big.png"), str(tmp_path / "gone.png")])
    results = mapper.embed(object(), rows)
    assert results[0] == RowFailure("image of 5 bytes exceeds 4")
    assert isinstance(results[1], RowFailure) and "cannot read" in results[1].reason


def test_progress_line_and_stable_point_ids():
    ticks = iter([0.0, 10.0, 10.0, 10.0])
    progress = Progress(100, "quiet", clock=lambda: next(ticks))
    progress.skip(20)
    progress.advance(30, 2)
    assert progress.line() == "index: 50/100 rows (50.0%), 3.0 rows/s, ETA 0:00:16, 2 errors"
    assert point_id("doc-1") == point_id("doc-1") != point_id("doc-2")
    assert json.loads(json.dumps(point_id("doc-1")))


def _done(values: list) -> ShardDone:
    rows = [Row(i, f"r{i}", f"t{i}", {"lang": "en"}) for i in range(len(values))]
    return ShardDone(0, "part-00000.parquet", rows, values, [(Row(9, "bad", "x"), "why")])


def test_sparse_and_multivector_shards_and_their_qdrant_points():
    sparse = [
        (np.array([3, 7], np.int32), np.array([0.5, 0.25], np.float32)),
        (np.array([1], np.int32), np.array([2.0], np.float32)),
    ]
    table, errors = shard_tables(_done(sparse), "sparse", {"lang": pa.string()}, np.float32)
    assert table.column_names == ["id", "indices", "values", "lang"]
    assert table.column("indices").to_pylist() == [[3, 7], [1]]
    assert errors.to_pylist() == [{"id": "bad", "input": "x", "reason": "why"}]
    tokens = [np.ones((3, 4), np.float32), np.full((1, 4), 2.0, np.float32)]
    multi, _ = shard_tables(_done(tokens), "multivector", {}, np.float32)
    assert [len(r) for r in multi.column("embedding").to_pylist()] == [3, 1]
    empty, _ = shard_tables(_done([]), "sparse", {}, np.float32)
    assert empty.num_rows == 0 and empty.schema.field("indices").type == pa.list_(pa.int32())

    for kind, values, table_ in (("sparse", sparse, table), ("multivector", tokens, multi)):
        sink = QdrantSink(open_qdrant(":memory:"), "c", kind)
        sink.upsert_table(table_)
        sink.upsert(["r0"], values[:1], [{"lang": "fr"}])  # the same point again
        points, _ = sink.client.scroll("c", with_vectors=True)
        assert sorted(p.payload["id"] for p in points) == ["r0", "r1"]
        assert {p.id for p in points} == {point_id("r0"), point_id("r1")}


def _tar(path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_webdataset_samples_are_grouped_by_key_in_tar_order(tmp_path):
    _tar(
        tmp_path / "a.tar",
        [("s/001.jpg", b"J1"), ("s/001.txt", b"one"), ("s/002.txt", b"no image"),
         ("s/003.PNG", b"P3")],
    )  # fmt: skip
    source = WebDatasetSource([str(tmp_path / "*.tar")], keep=["txt"])
    rows = list(source.rows())
    assert [(r.id, r.item, r.extra["txt"], r.error) for r in rows] == [
        ("s/001", b"J1", "one", None),
        ("s/002", None, "no image", "no image member in the sample"),
        ("s/003", b"P3", None, None),
    ]
    assert rows[1].origin == "a.tar:s/002.?" and source.count() == 3


def test_in_flight_gate_halves_on_refusals_and_regrows_one_at_a_time():
    gate = InFlightGate(8)
    for refused in (True, True):
        gate.acquire()
        gate.release(refused)
    assert (gate.limit, gate.lowest) == (2, 2)
    for _ in range(2):
        gate.acquire()
        gate.release(False)
    assert gate.limit == 3
    for _ in range(100):
        gate.acquire()
        gate.release(False)
    assert gate.limit == 8 and gate.lowest == 2


def test_refused_batches_lower_the_runs_requests_in_flight(tmp_path):
    refused = threading.Event()

    class RefusesOnce(FakeEmbedder):
        def embed_texts(self, model, texts, **options):
            if not refused.is_set():
                refused.set()
                raise ServerOverloadedError("server overloaded: queue full", "503", model)
            return super().embed_texts(model, texts, **options)

    out = OutputFolder(tmp_path)
    out.prepare()
    mapper = Mapper(PLAN, server_retries=1, sleep=lambda _s: None)
    texts = [f"t{i}" for i in range(40)]
    result = _partition(out, texts, RefusesOnce, concurrency=4, mapper=mapper)
    assert result.rows == 40 and result.lowest_in_flight == 2
    assert mapper.server_faults == 1


def test_progress_bar_shows_rows_and_errors_and_lines_come_periodically():
    stream = io.StringIO()
    bar = Progress(50, "bar", stream=stream)
    bar.skip(10)
    bar.advance(20, 3)
    bar.close()
    assert "30/50" in stream.getvalue() and "errors=3" in stream.getvalue()
    ticks = iter([0.0, 5.0, 12.0, 12.0, 12.0])
    lines = io.StringIO()
    plain = Progress(50, "lines", stream=lines, every_s=10.0, clock=lambda: next(ticks))
    plain.advance(10, 0)  # 5 s: too soon
    plain.advance(10, 1)  # 12 s: a line
    assert lines.getvalue().splitlines() == [
        "index: 20/50 rows (40.0%), 1.7 rows/s, ETA 0:00:18, 1 errors"
    ]


def test_every_source_reads_a_slice_as_the_same_rows_of_the_whole(tmp_path):
    """A Spark task's slice ``rows(start, stop)`` equals that slice of ``rows()``."""
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "a.jsonl").write_text(
        "".join(json.dumps({"text": f"a{i}"}) + "\n" for i in range(5)), encoding="utf-8"
    )
    pq.write_table(pa.table({"text": [f"b{i}" for i in range(4)]}), tmp_path / "t" / "b.parquet")
    with (tmp_path / "t" / "c.csv").open("w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows([["text"], *[[f"c{i}"] for i in range(3)]])
    (tmp_path / "i" / "x").mkdir(parents=True)
    for i in range(6):
        (tmp_path / "i" / ("x" if i % 2 else "") / f"{i}.jpg").write_bytes(b"J")
    (tmp_path / "w").mkdir()
    for name, start in (("a", 0), ("b", 3)):
        _tar(tmp_path / "w" / f"{name}.tar", [(f"s{start + i}.jpg", b"J") for i in range(3)])
    sources = [
        TableSource([str(tmp_path / "t")]),
        ImageFolderSource([str(tmp_path / "i")]),
        WebDatasetSource([str(tmp_path / "w" / "*.tar")]),
    ]
    for source in sources:
        whole = [(r.index, r.id, r.item) for r in source.rows()]
        assert len(whole) == source.count()
        for start, stop in ((0, 2), (2, 5), (4, 9), (5, None), (7, 100), (50, 60)):
            part = [(r.index, r.id, r.item) for r in source.rows(start, stop)]
            assert part == whole[start:stop], (type(source).__name__, start, stop)


def test_pending_shards_are_cut_into_even_runs_for_spark_tasks():
    from client.index.spark import shard_slices

    assert shard_slices([], 4) == []
    assert shard_slices([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], 4) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert shard_slices([1, 2, 7], 8) == [(1, 2), (2, 3), (7, 8)]
    assert shard_slices([0, 5, 9], 1) == [(0, 10)]  # a run may span finished shards


def test_job_urls_split_replicas_and_refuse_object_store_paths():
    from client.index.runner import IndexJob, job_urls

    job = IndexJob(model="m", inputs=["docs/"], out="out/", url="a:8000, b:8000,")
    assert job_urls(job) == ["a:8000", "b:8000"]
    for inputs, out in ((["s3://bucket/docs/"], "out/"), (["docs/"], "gs://bucket/out")):
        with pytest.raises(SourceError, match="mount the bucket"):
            job_urls(IndexJob(model="m", inputs=inputs, out=out))
