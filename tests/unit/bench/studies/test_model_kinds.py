"""The model-kinds benchmark's arithmetic: answers compared, requests grouped, ratios, doc."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

from bench.studies import model_kinds as mk


def test_sparse_rows_split_a_library_tensor_by_row() -> None:
    import torch

    dense = torch.tensor([[0.0, 2.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [3.0, 0.0, 0.5, 0.0]])
    rows = mk._sparse_rows(dense.to_sparse())
    assert [r[0].tolist() for r in rows] == [[1, 3], [], [0, 2]]
    assert [r[1].tolist() for r in rows] == [[2.0, 1.0], [], [3.0, 0.5]]


def test_sparse_diff_ignores_padding_and_sees_a_moved_or_missing_weight() -> None:
    want = (np.array([5, 2], np.int32), np.array([1.5, 0.25], np.float32))
    padded = (np.array([5, 2, -1], np.int32), np.array([1.5, 0.25, 0.0], np.float32))
    assert mk._sparse_diff(padded, want) == 0.0
    moved = (np.array([5, 3], np.int32), np.array([1.5, 0.25], np.float32))
    assert mk._sparse_diff(moved, want) == pytest.approx(0.25)
    missing = (np.array([5, -1], np.int32), np.array([1.5, 0.0], np.float32))
    assert mk._sparse_diff(missing, want) == pytest.approx(0.25)
    big = (np.array([5], np.int32), np.array([4.0], np.float32))
    assert mk._sparse_diff(big, (np.array([5], np.int32), np.array([4.0001], np.float32))) == (
        pytest.approx(1e-4 / 4.0001, rel=1e-2)
    )  # relative above a value of 1, as the build's gate
    empty = (np.array([-1], np.int32), np.array([0.0], np.float32))
    assert mk._sparse_diff(empty, (np.zeros(0, np.int32), np.zeros(0, np.float32))) == 0.0


def test_array_diff_is_infinite_for_another_vector_count() -> None:
    a = np.ones((3, 4), np.float32)
    assert mk._array_diff(a, a + 1e-3) == pytest.approx(1e-3, rel=1e-3)
    assert mk._array_diff(a[:2], a) == float("inf")


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []

    def rerank(self, model: str, query: str, texts: list[str]) -> np.ndarray:
        self.calls.append((query, list(texts)))
        return np.arange(len(texts), dtype=np.float32)


def test_rerank_sends_one_request_per_run_of_one_query() -> None:
    items = mk.workload(mk.KINDS["llm-rerank"], [f"t{i}" for i in range(2 * mk.BATCH + 3)])
    assert len({q for q, _ in items[: mk.BATCH]}) == 1
    assert items[mk.BATCH][0] != items[0][0]
    recorder = _Recorder()
    scores = mk._rerank(recorder, "m", items)
    assert [len(texts) for _, texts in recorder.calls] == [mk.BATCH, mk.BATCH, 3]
    assert [t for _, texts in recorder.calls for t in texts] == [t for _, t in items]
    assert len(scores) == len(items)
    assert mk.workload(mk.KINDS["sparse"], ["a", "b"]) == ["a", "b"]
    assert mk.workload(mk.KINDS["static"], ["a", "b"]) == ["a", "b"] * mk.KINDS["static"].scale


def _results() -> dict:
    """Library 100, 200, 300 items/s; batches at 0.5, 2.0, 1.0 of it; singles at 0.25."""
    library = [100.0, 200.0, 300.0]
    loads = {
        "library": {"rates": library, "max_abs_diff": 0.0},
        "batches": {"rates": [50.0, 400.0, 300.0], "max_abs_diff": 2e-7},
        "singles": {"rates": [25.0, 50.0, 75.0], "max_abs_diff": 3e-6},
    }
    kind = {"label": "sparse (test)", "shape": "a test shape", "entry": {}, "items": 64,
            "loads": loads}
    return {
        "started": "2026-01-01T00:00:00Z", "seconds": 1.0, "repeats": 3, "batch": 32,
        "clients": 8, "loads": mk.LOADS, "kinds": {"sparse": kind},
        "machine": {"cpu": "test CPU", "cores": "2", "memory": "1 GiB"},
    }


def test_ratios_are_medians_of_in_repeat_ratios() -> None:
    data = _results()["kinds"]["sparse"]
    assert mk.ratio(data, "batches") == pytest.approx(1.0)  # not 250 / 200 = 1.25
    assert mk.ratio(data, "singles") == pytest.approx(0.25)


def test_doc_names_its_results_file_and_each_kind_row() -> None:
    doc = mk.render(_results(), "bench/results/kinds-cpu-test.json")
    assert "bench/results/kinds-cpu-test.json" in doc
    assert "2-core test CPU" in doc
    row = next(line for line in doc.splitlines() if line.startswith("| sparse"))
    assert "200.0" in row and "(1.00 x)" in row and "(0.25 x)" in row and "3.0e-06" in row
    assert "- `sparse`: sparse (test); a test shape." in doc
