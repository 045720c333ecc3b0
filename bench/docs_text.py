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


def targets_table(s: Summary) -> str:
    """Each target, its load, the measured median of per-repeat ratios, met or not."""
    rows = [
        [name, load, value, "yes" if met else "**no**"] for name, load, value, met in s.targets()
    ]
    return table(["Target", "Load", "Measured (median)", "Met"], rows)


def _mixed(s: Summary) -> str:
    rate = s.ceiling("mixed_items_per_s")
    if rate != rate:
        return "not measured"
    return f"{rate:.1f} sentences/s; {s.ceiling('mixed_real_token_share'):.2f}"


def ceiling_table(s: Summary) -> str:
    """Raw ONNX Runtime figures, medians over every ceiling measurement."""
    rows = [
        ["length-sorted batches of 32", _f(s.ceiling("batch32_items_per_s")) + " sentences/s"],
        ["batch 1", _f(s.ceiling("batch1_items_per_s")) + " sentences/s"],
        [
            "batch 1 latency p50 / p95",
            f"{_f(s.ceiling('batch1_p50_ms'), 2)} / {_f(s.ceiling('batch1_p95_ms'), 2)} ms",
        ],
        [
            "real tokens / padded tokens in the sorted batches of 32",
            f"{s.ceiling('batch32_real_token_share'):.2f}",
        ],
        [
            "for reference: a random mix in batches of 8, each padded to its own longest row "
            "(like one dynamic batch of 8 single-sentence requests); real / padded tokens",
            _mixed(s),
        ],
        [
            "tokenization (batches of 32, not in the figures above)",
            _f(s.ceiling("tokenize_us_per_sentence")) + " µs/sentence",
        ],
        ["sentences, mean tokens", f"{s.meta['pool']}, {_f(s.ceiling('mean_tokens'))}"],
        ["provider", s.results["ceiling"][0]["provider"] if s.results["ceiling"] else "n/a"],
        ["other processes' CPU during the ceiling", f"{s.ceiling('foreign_cpu'):.0%}"],
    ]
    return table(["Figure", "Median"], rows)


def load_table(s: Summary, load: str, unit: str) -> str:
    """Client-side medians of every system under one load, with ratios."""
    header = [
        "System",
        f"{unit}/s",
        "req/s",
        "mean ms",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "std ms",
        "errors",
        "÷ ceiling",
        "÷ ORT b32",
        "÷ ORT b1",
        f"{s.headline} ÷ this",
        "other CPU",
    ]
    rows = []
    for system in s.systems:
        if (load, system) not in s.runs:
            continue
        rows.append(
            [
                f"**{system}**" if system == s.headline else system,
                _f(s.stat(load, system, "items_per_s")),
                _f(s.stat(load, system, "qps")),
                *[
                    _f(s.stat(load, system, k), 2)
                    for k in ("mean_ms", "median_ms", "p95_ms", "p99_ms", "std_ms")
                ],
                str(s.errors(load, system)),
                times(s.ratio_to_load_ceiling(load, system))
                if s.kinds[load] == "text"
                else times(s.image_ratio(load, system)),
                times(s.ratio_to_ceiling(load, system)) if s.kinds[load] == "text" else "",
                times(s.ratio_to_ceiling(load, system, "batch1_items_per_s"))
                if s.kinds[load] == "text"
                else "",
                "" if system == s.headline else times(s.ratio(load, s.headline, system)),
                f"{s.foreign(load, system):.0%}",
            ]
        )
    return table(header, rows)



def load_ceiling_table(s: Summary) -> str:
    """Each load's own ceiling: its timed rows run in-process three ways, tokenizer included."""
    header = [
        "Load",
        "rows",
        "rows in flight",
        "batch 1",
        "sorted batches",
        "chunk planner",
        "planner, 1 thread per core",
        "ceiling (best)",
        f"{s.headline}",
        f"{s.headline} ÷ ceiling",
    ]
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


def server_table(s: Summary, load: str) -> str:
    """Triton's own view of the window: batch sizes, queue and compute times per model."""
    rows = [
        [
            stat["name"],
            _f(stat["avg_batch_size"]),
            _f(stat["avg_request_ms"], 2),
            _f(stat["avg_queue_ms"], 2),
            _f(stat["avg_compute_input_ms"], 2),
            _f(stat["avg_compute_infer_ms"], 2),
            _f(stat["avg_compute_output_ms"], 2),
        ]
        for stat in s.server(load, s.headline)
    ]
    header = ["Model", "rows/exec", "request ms", "queue ms", "input ms", "infer ms", "output ms"]
    return table(header, rows)


def machine_table(s: Summary) -> str:
    """The machine and the versions of everything measured."""
    rows = [[k, str(v)] for k, v in s.meta["machine"].items()]
    rows.append(["Triton server", s.meta.get("triton", "?")])
    entry = s.meta.get("text_entry") or {}
    knobs = (
        "max_batch_size",
        "max_queue_delay_us",
        "max_rows_per_run",
        "max_padding_share",
        "ort_threads",
        "ort_spinning",
        "precision",
        "encoder_instances",
        "preprocess_instances",
        "encoder_backend",
        "device",
    )
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
