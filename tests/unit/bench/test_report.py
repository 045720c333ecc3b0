"""The benchmark report: ratios taken inside each repeat, and the targets met or not."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench.summary import Summary

SYSTEMS = ("triton-grpc", "fastapi", "infinity")


def _run(repeat: int, load: str, system: str, items: float, p50: float = 10.0) -> dict:
    return {
        "repeat": repeat,
        "load": load,
        "kind": "text",
        "system": system,
        "foreign_cpu": 0.01,
        "result": {
            "items_per_s": items,
            "qps": items,
            "mean_ms": p50,
            "median_ms": p50,
            "p95_ms": p50,
            "p99_ms": p50,
            "std_ms": 0.0,
            "errors": 0,
            "server": [],
        },
    }


def _ceiling(repeat: int, load: str, b32: float, b1: float, p50: float) -> dict:
    return {
        "repeat": repeat,
        "load": load,
        "provider": "CPUExecutionProvider",
        "batch32_items_per_s": b32,
        "batch1_items_per_s": b1,
        "batch1_p50_ms": p50,
    }


def _load_ceiling(repeat: int, load: str, best: float) -> dict:
    return {
        "repeat": repeat,
        "load": load,
        "rows": 64,
        "rows_in_flight": 16,
        "batch1_items_per_s": best * 0.8,
        "sorted_items_per_s": best * 0.5,
        "planner_items_per_s": best,
        "parallel_items_per_s": best * 0.9,
        "best": "planner",
        "best_items_per_s": best,
    }


def _results() -> dict:
    """Three repeats on a machine whose speed drifts: ceiling 100, 200, 300 sentences/s.

    Triton serves 0.95, 0.5 and 0.9 of it: the median ratio is 0.9, while the ratio of
    the medians (100 / 200) would be 0.5.
    """
    runs, ceilings, load_ceilings = [], [], []
    for rep, speed, served in ((1, 1.0, 0.95), (2, 2.0, 0.5), (3, 3.0, 0.9)):
        for load in ("1 x 1", "16 x 1", "4 x 32"):
            ceilings.append(_ceiling(rep, load, 100 * speed, 120 * speed, 5.0 / speed))
            load_ceilings.append(_load_ceiling(rep, load, 125 * speed))
            runs.append(_run(rep, load, "triton-grpc", 100 * speed * served, 7.0 / speed))
            runs.append(_run(rep, load, "fastapi", 30 * speed))
            runs.append(_run(rep, load, "infinity", 40 * speed))
    return {
        "meta": {
            "started": "2026-01-01T00:00:00Z",
            "seconds": 1.0,
            "pool": 8,
            "args": {"protocol": "grpc", "device": "cpu", "repeats": 3},
            "machine": {"cpu": "test CPU", "cores": "2", "memory": "1 GiB"},
            "peers": {},
        },
        "ceiling": ceilings,
        "load_ceiling": load_ceilings,
        "image_ceiling": [],
        "runs": runs,
    }


def test_ratios_are_taken_inside_each_repeat() -> None:
    s = Summary(_results())
    assert s.stat("16 x 1", "triton-grpc", "items_per_s") == pytest.approx(100.0)
    assert s.ceiling("batch32_items_per_s", "16 x 1") == pytest.approx(200.0)
    # The median of the per-repeat ratios, not the ratio of the medians (0.5).
    assert s.ratio_to_ceiling("16 x 1", "triton-grpc") == pytest.approx(0.9)
    assert s.ratio_to_ceiling("16 x 1", "triton-grpc", "batch1_items_per_s") == pytest.approx(
        0.9 / 1.2
    )
    # triton / fastapi per repeat: 95/30, 100/60, 270/90.
    assert s.ratio("4 x 32", "triton-grpc", "fastapi") == pytest.approx(3.0)
    # p50 gaps per repeat: 7 - 5, 3.5 - 2.5, 2.33 - 1.67 ms.
    assert s.latency_gap("triton-grpc") == pytest.approx(1.0)
    # p50 / ORT's own p50 per repeat: 7 / 5, 3.5 / 2.5, 2.33 / 1.67.
    assert s.latency_ratio("triton-grpc") == pytest.approx(1.4, rel=1e-2)
    # The load's own ceiling is 125 x speed: 0.95 / 1.25, 0.5 / 1.25, 0.9 / 1.25.
    assert s.ratio_to_load_ceiling("16 x 1", "triton-grpc") == pytest.approx(0.72)
    assert s.load_ceiling("16 x 1") == pytest.approx(250.0)


def test_targets_name_what_is_met() -> None:
    met = {(t, load): ok for t, load, _, ok in Summary(_results()).targets()}
    assert met[("served >= 0.9 x the load's ceiling", "16 x 1")] is False  # 0.72
    assert met[("served >= 2.5 x infinity", "4 x 32")] is False  # 2.375, 1.25, 2.25
    assert met[("served >= 3.0 x fastapi", "4 x 32")] is True
    assert met[("served >= 3.0 x fastapi", "1 x 1")] is True
    assert met[("p50 <= 1.2 x ORT's own per-sentence p50", "1 x 1")] is False  # 1.4
    # 2 ceiling targets, 1 latency target, 2 peers x 3 loads (no infinity-onnx runs).
    assert len(met) == 9


def test_latency_reference_includes_the_tokenizer_when_recorded() -> None:
    results = _results()
    for ceiling in results["ceiling"]:  # 5 / speed ms run + 2 / speed ms tokenizing
        ceiling["tokenize_us_per_sentence"] = ceiling["batch1_p50_ms"] * 400
    s = Summary(results)
    assert s.latency_ratio("triton-grpc") == pytest.approx(1.0, rel=1e-2)
    met = {(t, load): (v, ok) for t, load, v, ok in s.targets()}
    assert met[("p50 <= 1.2 x ORT's own per-sentence p50", "1 x 1")] == ("1.00 x (+0.00 ms)", True)


def test_served_faster_than_its_ceiling_is_over_one() -> None:
    results = _results()
    for ceiling in results["load_ceiling"]:
        ceiling["best_items_per_s"] /= 2
    met = {(t, load): (v, ok) for t, load, v, ok in Summary(results).targets()}
    assert met[("served >= 0.9 x the load's ceiling", "16 x 1")] == ("1.44 x", True)


def test_missing_peer_gives_nan_and_no_target() -> None:
    results = _results()
    results["runs"] = [r for r in results["runs"] if r["system"] != "infinity"]
    s = Summary(results)
    assert math.isnan(s.ratio("16 x 1", "triton-grpc", "infinity"))
    assert not [t for t in s.targets() if "infinity" in t[0]]
