"""The rerank section: in-repeat ratios, the table, and its place in docs/benchmarks.md."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

from bench import docs_text
from bench.rerank.report import BEGIN, END, RerankSummary, write_rerank_section
from bench.summary import Summary
from tests.unit.bench.test_report import _results


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


def test_section_replaces_the_old_one_and_survives_a_bench_run(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    page = docs_text.render(Summary(_results()), "chart.png", "")
    doc.write_text(page)
    write_rerank_section(_rerank_results(), doc)
    first = doc.read_text()
    assert first.count(BEGIN) == 1 and first.count(END) == 1
    assert "| **triton-grpc** | 100.0 |" in first and "| 0.90 x |" in first
    assert first.index(BEGIN) < first.index("## Throughput vs concurrency")
    write_rerank_section(_rerank_results(), doc)
    assert doc.read_text() == first
    again = docs_text.render(Summary(_results()), "chart.png", first)
    assert again.count(BEGIN) == 1 and "| **triton-grpc** | 100.0 |" in again
