"""bench.gateway's arithmetic: the ratios its gates read, and the table by part it writes."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench import gateway, page


def _run(req_per_s: float, p50_ms: float, gateway_cpu_ms: float) -> dict:
    return {"req_per_s": req_per_s, "p50_ms": p50_ms, "p99_ms": 2 * p50_ms,
            "triton_cpu_ms_per_req": 9.0, "gateway_cpu_ms_per_req": gateway_cpu_ms,
            "errors": 0}


def _runs(ratio_16x1: float, cpu_ms: float) -> dict:
    return {
        "1x1": {"triton": [_run(100, 8, 0)], "gateway": [_run(90, 9, 0.9)]},
        "16x1": {"triton": [_run(200, 50, 0), _run(210, 52, 0), _run(190, 54, 0)],
                 "gateway": [_run(200 * ratio_16x1, 60, cpu_ms)] * 3},
        "4x32": {"triton": [_run(10, 350, 0)], "gateway": [_run(9.8, 360, 2.8)]},
    }


def test_ratios_are_of_the_medians_and_each_gate_reads_its_own() -> None:
    summary = gateway.summarise(_runs(0.9, 0.6))
    assert summary["16x1"]["throughput_ratio"] == 0.9
    assert summary["16x1"]["p50_added_ms"] == 8
    assert all(gateway.gates(summary).values())
    slow = gateway.gates(gateway.summarise(_runs(0.8, 1.2)))
    assert [name for name, met in slow.items() if not met] == [
        "16x1 rate >= 0.85 x Triton's",
        "gateway CPU per one-sentence request at 16 x 1 <= 1.0 ms",
    ]


def test_the_rest_of_the_table_by_part_is_the_measured_total_less_every_part_but_base64() -> None:
    parts = {"auth": 1.0, "request": 4.0, "base64 rows instead": 500.0,
             gateway.CALL_PART: 300.0, gateway.SERVER_PART: 150.0,
             "answer parsed": 10.0, "answer written": 10.0}
    results = {"summary": gateway.summarise(_runs(0.9, 0.6)), "parts": {"1": parts, "32": parts},
               "gates": {}, "machine": {"cores": "2", "cpu": "x"}, "command": "c",
               "source": "s", "started": "t", "repeats": 1, "requests": 1,
               "foreign_cpu_share": 0.0}
    text = page.gateway_section(results)
    rest = next(line for line in text.splitlines() if line.startswith("| the rest"))
    cells = [cell.strip() for cell in rest.strip("|").split("|")]
    assert cells[1:] == [f"{600 - 475}", f"{2800 - 475}"]
    assert "as late as Triton did" in text
