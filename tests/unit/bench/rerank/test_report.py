"""The rerank section: in-repeat ratios, the table, and its place in docs/benchmarks.md."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

from bench.rerank.report import RerankSummary


def _run(repeat: int, system: str, rate: float) -> dict:
    if system == "ceiling":
        result = {
            "best": "planner",
            "best_items_per_s": rate,
            "batch1_items_per_s": rate * 0.8,
            "sorted_items_per_s": rate * 0.3,
            "planner_items_per_s": rate,
        }
    else:
        result = {"items_per_s": rate, "qps": rate / 32, "median_ms": 9.0, "p95_ms": 12.0}
        result["errors"] = 0
    return {"repeat": repeat, "system": system, "foreign_cpu": 0.0, "result": result}


def _rerank_results() -> dict:
    """Machine speed 1, 2, 3; Triton serves 0.9, 0.5, 0.95 of the ceiling, 10 x the peer."""
    runs = []
    for repeat, speed, served in ((0, 1.0, 0.9), (1, 2.0, 0.5), (2, 3.0, 0.95)):
        runs += [
            _run(repeat, "ceiling", 100 * speed),
            _run(repeat, "triton-grpc", 100 * speed * served),
            _run(repeat, "fastapi-ce", 10 * speed * served),
        ]
    meta = {
        "started": "2026-01-01T00:00:00Z",
        "args": {"repeats": 3},
        "machine": {"cpu": "test CPU", "cores": "2"},
        "load": "4 clients x 1 query x 32 texts",
        "peer": "fastapi test",
    }
    return {"meta": meta, "runs": runs}


def test_ratios_are_medians_of_in_repeat_ratios() -> None:
    s = RerankSummary(_rerank_results())
    assert s.ratio("triton-grpc", "ceiling") == pytest.approx(0.9)
    assert s.ratio("triton-grpc", "fastapi-ce") == pytest.approx(10.0)
    assert s.rate("ceiling") == pytest.approx(200.0)
