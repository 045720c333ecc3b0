"""Tables of ``docs/benchmarks.md`` (:mod:`bench.page`) from a :class:`bench.summary.Summary`."""

from __future__ import annotations

from bench.common import table
from bench.summary import Summary

# `make perf` (deploy/perf/perf_table.py) owns this block; the page carries it over.
PERF_BEGIN, PERF_END = "<!-- perf:begin -->", "<!-- perf:end -->"


def _f(value: float, digits: int = 1) -> str:
    return "n/a" if value != value else f"{value:.{digits}f}"


def times(value: float) -> str:
    """A ratio as the page writes it (``1.23 x``; ``n/a`` when not measured)."""
    return "n/a" if value != value else f"{value:.2f} x"


def load_ceiling_table(s: Summary) -> str:
    """Each load's own ceiling: its timed rows run in-process each way, tokenizer included."""
    header = ["Load", "rows", "rows in flight", "batch 1", "sorted batches", "chunk planner",
              "planner, 1 thread per core", "ceiling (best)", s.headline, f"{s.headline} ÷ ceiling"]
    rows = []
    for load in s.loads:
        if s.kinds[load] != "text" or not any(k[1] == load for k in s.load_ceilings):
            continue
        best = [c["best"] for (_, name), c in s.load_ceilings.items() if name == load]
        rows.append(
            [
                load,
                _f(s.load_ceiling(load, "rows"), 0),
                _f(s.load_ceiling(load, "rows_in_flight"), 0),
                _f(s.load_ceiling(load, "batch1_items_per_s")),
                _f(s.load_ceiling(load, "sorted_items_per_s")),
                _f(s.load_ceiling(load, "planner_items_per_s")),
                _f(s.load_ceiling(load, "parallel_items_per_s")),
                f"{_f(s.load_ceiling(load))} ({'/'.join(sorted(set(best)))})",
                _f(s.stat(load, s.headline, "items_per_s")),
                times(s.ratio_to_load_ceiling(load, s.headline)),
            ]
        )
    return table(header, rows)


def machine_table(s: Summary) -> str:
    """The machine and the versions of everything measured."""
    rows = [[k, str(v)] for k, v in s.meta["machine"].items()]
    rows.append(["Triton server", s.meta.get("triton", "?")])
    entry = s.meta.get("text_entry") or {}
    knobs = ("max_batch_size", "max_queue_delay_us", "max_rows_per_run", "max_padding_share",
             "ort_threads", "ort_spinning", "precision", "encoder_instances",
             "preprocess_instances", "encoder_backend", "device")
    if entry:
        rows.append(
            [
                "all-MiniLM-L6-v2 serving knobs",
                ", ".join(f"{k}={entry[k]}" for k in knobs if k in entry),
            ]
        )
    if s.meta["args"].get("text_set"):
        rows.append(["overrides (--text-set)", ", ".join(s.meta["args"]["text_set"])])
    rows += [[f"peer: {name}", state] for name, state in s.meta["peers"].items()]
    return table(["What", "Version / value"], rows)


def plain_summary(s: Summary) -> str:
    """A short plain-text summary for the terminal."""
    lines = ["targets:"]
    lines += [
        f"  {name:40s} {load:8s} {value:>12s}  {'met' if met else 'NOT met'}"
        for name, load, value, met in s.targets()
    ]
    lines.append("throughput (median, per second):")
    for load in s.loads:
        cells = [
            f"{system} {s.stat(load, system, 'items_per_s'):.1f}"
            for system in s.systems
            if (load, system) in s.runs
        ]
        lines.append(f"  {load:12s} " + ", ".join(cells))
    lines.append(
        f"  ORT ceiling: batch 32 {s.ceiling('batch32_items_per_s'):.1f}/s, "
        f"batch 1 {s.ceiling('batch1_items_per_s'):.1f}/s, "
        f"b1 p50 {s.ceiling('batch1_p50_ms'):.2f} ms"
    )
    return "\n".join(lines)
