"""Merging ragged requests, length-sorted chunking and restoring request order."""

from __future__ import annotations

import numpy as np
import pytest

from embed_runtime.engines.ragged import (
    Chunk,
    chunk_inputs,
    merge_requests,
    plan_chunks,
    run_sorted,
    split_counts,
    true_lengths,
)

SEEDS = range(20)


def _request(lengths: list[int], rng: np.random.Generator, extra_pad: int = 0, pad_id: int = 0):
    """Token tensors of one request: right padded to its longest row (+ ``extra_pad``)."""
    width = max(lengths) + extra_pad
    mask = np.zeros((len(lengths), width), dtype=np.int64)
    ids = np.full((len(lengths), width), pad_id, dtype=np.int64)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
        ids[i, :n] = rng.integers(1000, 30000, size=n)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def _random_requests(rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    requests = []
    for _ in range(int(rng.integers(1, 7))):
        lengths = rng.integers(1, 40, size=int(rng.integers(1, 6))).tolist()
        requests.append(_request(lengths, rng, extra_pad=int(rng.integers(0, 3))))
    return requests


def _row_signature(inputs: dict[str, np.ndarray]) -> np.ndarray:
    """A fake encoder: per row, depends only on its real tokens (not on padding)."""
    ids = inputs["input_ids"].astype(np.float64)
    mask = inputs["attention_mask"].astype(np.float64)
    n = mask.sum(axis=1)
    pos = np.arange(ids.shape[1], dtype=np.float64) + 1.0
    return np.stack(
        [
            n,
            (ids * mask).sum(axis=1),
            (ids * mask * pos).sum(axis=1),
            ((ids * mask) ** 2).sum(axis=1),
        ],
        axis=1,
    )


def _alone(row_ids: np.ndarray, row_mask: np.ndarray) -> np.ndarray:
    n = int(row_mask.sum())
    inputs = {"input_ids": row_ids[None, :n], "attention_mask": row_mask[None, :n]}
    return _row_signature(inputs)[0]


# --- merge_requests --------------------------------------------------------------------


def test_merge_requests_stacks_rows_padded_to_widest_request() -> None:
    rng = np.random.default_rng(0)
    a = _request([3, 1], rng)
    b = _request([5], rng, extra_pad=2)
    merged, lengths, counts = merge_requests([a, b], pad_id=9)
    assert counts == [2, 1]
    assert lengths.tolist() == [3, 1, 5]
    assert lengths.dtype == np.int64
    for name in a:
        assert merged[name].shape == (3, 7)
        assert merged[name].dtype == np.int64
    np.testing.assert_array_equal(merged["input_ids"][:2, :3], a["input_ids"])
    # New padding of input_ids uses pad_id; other tensors are padded with 0.
    assert (merged["input_ids"][:2, 3:] == 9).all()
    assert (merged["attention_mask"][:2, 3:] == 0).all()
    assert (merged["token_type_ids"][:2, 3:] == 0).all()


@pytest.mark.parametrize("seed", SEEDS)
def test_merge_requests_keeps_every_row_and_its_true_length(seed: int) -> None:
    rng = np.random.default_rng(seed)
    requests = _random_requests(rng)
    merged, lengths, counts = merge_requests(requests)
    assert counts == [len(r["input_ids"]) for r in requests]
    assert len(lengths) == sum(counts)
    rows = [(req, i) for req in requests for i in range(len(req["input_ids"]))]
    for k, (req, i) in enumerate(rows):
        n = int(req["attention_mask"][i].sum())
        assert lengths[k] == n
        np.testing.assert_array_equal(merged["input_ids"][k, :n], req["input_ids"][i, :n])
        assert merged["attention_mask"][k, n:].sum() == 0


def test_true_lengths_counts_mask_ones() -> None:
    mask = np.array([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    assert true_lengths(mask).tolist() == [2, 3, 0]


# --- plan_chunks -----------------------------------------------------------------------


def _check_plan(chunks: list[Chunk], lengths: np.ndarray, max_rows: int) -> None:
    rows = np.concatenate([c.rows for c in chunks])
    assert sorted(rows.tolist()) == list(range(len(lengths))), "every row exactly once"
    ordered = lengths[rows]
    assert (np.diff(ordered) >= 0).all(), "rows sorted by length across chunks"
    for chunk in chunks:
        assert 1 <= len(chunk.rows) <= max_rows
        assert chunk.width == max(int(lengths[chunk.rows].max()), 1)


def _random_lengths(seed: int) -> np.ndarray:
    """1 to 59 rows of 1 to 127 tokens."""
    rng = np.random.default_rng(seed)
    return rng.integers(1, 128, size=int(rng.integers(1, 60)))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("max_rows", [1, 3, 8, 1000])
def test_plan_chunks_covers_each_row_once_sorted_and_bounded(seed: int, max_rows: int) -> None:
    lengths = _random_lengths(seed)
    chunks = plan_chunks(lengths, max_rows)
    _check_plan(chunks, lengths, max_rows)
    # Without a token budget only the last chunk may be short.
    assert all(len(c.rows) == max_rows for c in chunks[:-1])
    assert len(chunks) == -(-len(lengths) // max_rows)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("max_tokens", [1, 50, 200, 1000])
def test_plan_chunks_keeps_chunks_under_max_tokens(seed: int, max_tokens: int) -> None:
    lengths = _random_lengths(seed)
    max_rows = 16
    chunks = plan_chunks(lengths, max_rows, max_tokens)
    _check_plan(chunks, lengths, max_rows)
    for chunk in chunks:
        # A single row wider than the budget still runs, alone.
        assert len(chunk.rows) * chunk.width <= max_tokens or len(chunk.rows) == 1


def test_plan_chunks_max_tokens_splits_by_area_of_the_widest_row() -> None:
    lengths = np.array([10, 10, 10, 30, 30])
    chunks = plan_chunks(lengths, max_rows=10, max_tokens=60)
    assert [c.rows.tolist() for c in chunks] == [[0, 1, 2], [3, 4]]
    assert [c.width for c in chunks] == [10, 30]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("max_padding", [0.0, 0.1, 0.2, 0.5])
def test_plan_chunks_bounds_the_padding_share(seed: int, max_padding: float) -> None:
    lengths = _random_lengths(seed)
    max_rows = 16
    chunks = plan_chunks(lengths, max_rows, max_padding=max_padding)
    _check_plan(chunks, lengths, max_rows)
    for chunk in chunks:
        area = len(chunk.rows) * chunk.width
        assert area - int(lengths[chunk.rows].sum()) <= max_padding * area + 1e-9


def test_plan_chunks_padding_limit_splits_short_from_long_rows() -> None:
    lengths = np.array([10, 2, 11, 2, 3, 10])
    chunks = plan_chunks(lengths, max_rows=10, max_padding=0.2)
    # [2, 2, 3] would pad 2 of 9 tokens (22 %): 3 starts a chunk, and so does 10.
    assert [c.rows.tolist() for c in chunks] == [[1, 3], [4], [0, 5, 2]]
    assert [c.width for c in chunks] == [2, 3, 11]


def test_plan_chunks_full_padding_share_changes_nothing() -> None:
    lengths = np.random.default_rng(3).integers(1, 128, size=50)
    plain = plan_chunks(lengths, max_rows=8)
    limited = plan_chunks(lengths, max_rows=8, max_padding=1.0)
    assert [c.rows.tolist() for c in plain] == [c.rows.tolist() for c in limited]


def test_plan_chunks_stable_for_equal_lengths() -> None:
    chunks = plan_chunks(np.array([4, 2, 4, 2]), max_rows=10)
    assert [c.rows.tolist() for c in chunks] == [[1, 3, 0, 2]]


def test_plan_chunks_width_is_at_least_one_for_empty_rows() -> None:
    chunks = plan_chunks(np.array([0, 0]), max_rows=4)
    assert chunks[0].width == 1


def test_plan_chunks_of_no_rows_is_empty() -> None:
    assert plan_chunks(np.array([], dtype=np.int64), max_rows=4) == []


# --- chunk_inputs ----------------------------------------------------------------------


def test_chunk_inputs_selects_rows_and_cuts_to_chunk_width() -> None:
    rng = np.random.default_rng(3)
    merged, lengths, _ = merge_requests([_request([2, 6, 3], rng)])
    chunk = Chunk(rows=np.array([2, 0]), width=3)
    out = chunk_inputs(merged, chunk)
    for name, arr in merged.items():
        assert out[name].shape == (2, 3)
        assert out[name].flags["C_CONTIGUOUS"]
        np.testing.assert_array_equal(out[name], arr[[2, 0], :3])


@pytest.mark.parametrize("seed", SEEDS)
def test_chunk_inputs_width_equals_longest_row_in_chunk(seed: int) -> None:
    rng = np.random.default_rng(seed)
    merged, lengths, _ = merge_requests(_random_requests(rng))
    for chunk in plan_chunks(lengths, max_rows=4):
        inputs = chunk_inputs(merged, chunk)
        assert inputs["input_ids"].shape[1] == int(inputs["attention_mask"].sum(axis=1).max())


# --- run_sorted + split_counts ---------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("max_rows", "max_tokens"), [(1, 0), (3, 0), (64, 0), (8, 60)])
def test_run_sorted_equals_running_each_row_alone(seed: int, max_rows: int, max_tokens: int):
    rng = np.random.default_rng(seed)
    requests = _random_requests(rng)
    merged, lengths, counts = merge_requests(requests)
    seen_widths = []

    def run(inputs: dict[str, np.ndarray]) -> np.ndarray:
        seen_widths.append(inputs["input_ids"].shape[1])
        assert len(inputs["input_ids"]) <= max_rows
        return _row_signature(inputs)

    out = run_sorted(merged, lengths, max_rows, run, max_tokens)
    assert seen_widths == sorted(seen_widths)
    parts = list(split_counts(out, counts))
    assert [len(p) for p in parts] == counts
    for req, part in zip(requests, parts, strict=True):
        for i in range(len(req["input_ids"])):
            expected = _alone(req["input_ids"][i], req["attention_mask"][i])
            np.testing.assert_array_equal(part[i], expected)


def test_run_sorted_restores_original_order() -> None:
    lengths = np.array([5, 1, 4, 2, 3])
    merged = {
        "input_ids": np.arange(5)[:, None] * np.ones((1, 5), dtype=np.int64),
        "attention_mask": (np.arange(5)[None, :] < lengths[:, None]).astype(np.int64),
    }
    out = run_sorted(merged, lengths, 2, lambda x: x["input_ids"][:, :1].astype(np.float32))
    assert out[:, 0].tolist() == [0, 1, 2, 3, 4]
    assert out.dtype == np.float32


def test_run_sorted_keeps_trailing_output_dims() -> None:
    lengths = np.array([1, 2, 3])
    merged = {"attention_mask": (np.arange(3)[None, :] < lengths[:, None]).astype(np.int64)}
    out = run_sorted(merged, lengths, 2, lambda x: np.zeros((len(x["attention_mask"]), 2, 3)))
    assert out.shape == (3, 2, 3)


def test_run_sorted_with_no_rows_raises() -> None:
    with pytest.raises(ValueError, match="no rows"):
        run_sorted({}, np.array([], dtype=np.int64), 4, lambda x: x)


def test_split_counts_yields_consecutive_slices() -> None:
    parts = list(split_counts(np.arange(6), [1, 0, 3, 2]))
    assert [p.tolist() for p in parts] == [[0], [], [1, 2, 3], [4, 5]]
