"""The text of ``docs/benchmarks.md``: tables from a :class:`bench.report.Summary`.

Everything is regenerated on every full run except the hand-written analysis between
the ``analysis:begin`` / ``analysis:end`` markers, which is carried over.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from bench import gpu_report, rerank_report
from client.perf_data import perf_analyzer_commands

if TYPE_CHECKING:
    from bench.report import Summary

BEGIN, END = "<!-- analysis:begin -->", "<!-- analysis:end -->"
# `make perf` (deploy/perf/perf_table.py) owns this block; a bench run carries it over.
PERF_BEGIN, PERF_END = "<!-- perf:begin -->", "<!-- perf:end -->"
DEFAULT_ANALYSIS = "(no analysis written yet)"
SDK_IMAGE = "nvcr.io/nvidia/tritonserver:24.10-py3-sdk"
SERVER_NOTE = (
    "Triton's statistics for the window (median over repeats). Times are averages per "
    "request; a compute time is that of the execution the request rode in. rows/exec: "
    "rows per execution (for the ensemble, rows per request)."
)


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _f(value: float, digits: int = 1) -> str:
    return "n/a" if value != value else f"{value:.{digits}f}"


def _x(value: float) -> str:
    return "n/a" if value != value else f"{value:.2f} x"


def targets_table(s: Summary) -> str:
    """Each target, its load, the measured median of per-repeat ratios, met or not."""
    rows = [
        [name, load, value, "yes" if met else "**no**"] for name, load, value, met in s.targets()
    ]
    return _table(["Target", "Load", "Measured (median)", "Met"], rows)


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
    return _table(["Figure", "Median"], rows)


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
                _x(s.ratio_to_load_ceiling(load, system))
                if s.kinds[load] == "text"
                else _x(s.image_ratio(load, system)),
                _x(s.ratio_to_ceiling(load, system)) if s.kinds[load] == "text" else "",
                _x(s.ratio_to_ceiling(load, system, "batch1_items_per_s"))
                if s.kinds[load] == "text"
                else "",
                "" if system == s.headline else _x(s.ratio(load, s.headline, system)),
                f"{s.foreign(load, system):.0%}",
            ]
        )
    return _table(header, rows)


LOAD_CEILING_NOTE = (
    "The best in-process way to run exactly the sentences a load timed, given the rows a "
    "server could hold at once (clients x sentences per request), tokenization included "
    "(`bench/load_ceiling.py`): every row alone; each group of rows in flight (in the "
    "order the clients sent them) sorted by length in padded batches of up to 32; and "
    "each group cut by the encoder's own chunk planner with the served "
    "`max_rows_per_run` / `max_padding_share`; and that planner with the groups dealt out "
    "to one single-threaded session per core, each on its own thread (runs before "
    "2026-11-23T22:30Z lack this way). The ceiling is the fastest, measured in rotation "
    "with the systems in every repeat."
)


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
                _x(s.ratio_to_load_ceiling(load, s.headline)),
            ]
        )
    return _table(header, rows)


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
    return _table(header, rows)


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
    return _table(["What", "Version / value"], rows)


def _analysis(previous: str) -> str:
    match = re.search(re.escape(BEGIN) + r"\n(.*?)\n?" + re.escape(END), previous, re.S)
    return match.group(1).strip() if match else DEFAULT_ANALYSIS


def _perf_block(previous: str) -> list[str]:
    """The ``make perf`` section of the previous document, markers included (or nothing)."""
    match = re.search(re.escape(PERF_BEGIN) + r".*?" + re.escape(PERF_END), previous, re.S)
    return [match.group(0)] if match else []


def render(s: Summary, chart_name: str, previous: str = "") -> str:
    """The whole markdown document."""
    meta = s.meta
    text_loads = [load for load in s.loads if s.kinds[load] == "text"]
    image_loads = [load for load in s.loads if s.kinds[load] != "text"]
    parts = [
        "# Benchmarks",
        f"<!-- Generated by `make bench` (python -m bench.run) from "
        f"{meta.get('results_file', 'bench/results')}. Edit only the Analysis section. -->",
        f"Run of {meta['started']} on a {meta['machine']['cores']}-core "
        f"{meta['machine']['cpu']} ({meta['machine']['memory']}), device "
        f"`{meta['args']['device']}`, {meta['args']['repeats']} repeats, "
        f"{meta.get('seconds', '?')} s in all. Every figure is the median over repeats; "
        "every ratio is the median of the ratios taken inside each repeat. The machine is "
        "shared: *other CPU* is the share of its cores used by processes outside the "
        f"benchmark while a load ran. The headline system is **{s.headline}**.",
        "## Run it",
        docs_text_run(),
        "## Targets (all-MiniLM-L6-v2)",
        targets_table(s),
        "## Analysis",
        f"{BEGIN}\n{_analysis(previous)}\n{END}",
        "## Ceiling of each load: its own rows, in-process, tokenizer included",
        LOAD_CEILING_NOTE,
        load_ceiling_table(s),
        "## Fixed ceiling: the same ONNX graph in ONNX Runtime, in-process",
        "Over the 512 pool sentences, tokenized before the clock starts (the ceiling of "
        "earlier runs, kept for continuity: the `÷ ORT b32` / `÷ ORT b1` columns).",
        ceiling_table(s),
        "## Text loads (all-MiniLM-L6-v2)",
        "Clients x sentences per request; the same fixed sentences for every system. "
        "`÷ ceiling`: served sentences/s over the load's own ceiling (same repeat). "
        "`÷ ORT b32` / `÷ ORT b1`: served sentences/s over the fixed ceiling's (sorted batches of "
        f"32 / batch 1, same repeat); `{s.headline} ÷ this`: "
        "the headline's throughput over this system's.",
    ]
    for load in text_loads:
        parts += [
            f"### {load}",
            load_table(s, load, "sentences"),
            f"Server side ({s.headline}): {SERVER_NOTE}",
            server_table(s, load),
        ]
    if image_loads:
        parts += [
            "## Image loads (clip-vit-b-32: full-size ViT-B-32, random init)",
            image_ceiling_line(s),
        ]
        for load in image_loads:
            parts += [
                f"### {load}",
                load_table(s, load, "images"),
                f"Server side: {SERVER_NOTE}",
                server_table(s, load),
            ]
    parts += [
        *rerank_report.kept_section(previous),
        "## Throughput vs concurrency",
        f"![throughput vs concurrency]({chart_name})",
        "## Machine and versions",
        machine_table(s),
        "## perf_analyzer",
        perf_analyzer_section(),
        *_perf_block(previous),
        *gpu_report.kept_block(previous),
        "## Method",
        METHOD,
    ]
    return "\n\n".join(parts) + "\n"


def image_ceiling_line(s: Summary) -> str:
    """One sentence on the image tower's raw ORT speed."""
    rows = s.results["image_ceiling"]
    if not rows:
        return ""

    def med(key: str) -> float:
        return sorted(r.get(key, 0.0) for r in rows)[len(rows) // 2]

    parallel = ""
    if any(r.get("parallel_items_per_s") for r in rows):
        parallel = (
            f", {med('parallel_items_per_s'):.1f} split over one single-threaded session per core"
        )
    return (
        f"Image tower alone in ONNX Runtime on ready pixels: {med('batch32_items_per_s'):.1f} "
        f"images/s at batch 32, {med('batch1_items_per_s'):.1f} at batch 1 (p50 "
        f"{med('batch1_p50_ms'):.0f} ms){parallel}; the best of these is the ceiling. "
        "The photos are 12 generated JPEG/PNG/WebP files from 224x224 to 1920x1080, served "
        "from 127.0.0.1 for the URL load."
    )


def docs_text_run() -> str:
    """How to run the suite and a single load."""
    return "\n".join(
        [
            "    make bench                                  # full suite, about 30 min here",
            "    .venv/bin/python -m bench.run --quick       # smoke test, under 3 min",
            "    .venv/bin/python -m bench.gpu               # a CUDA host with onnxruntime-gpu",
            "    deploy/gpu/run_bench_offline.sh --models text  # the same, host without network",
            "    .venv/bin/python -m bench.run --repeats 5 --skip-peers --skip-images",
            "    .venv/bin/python -m bench.run --no-docs --text-set max_rows_per_run=1  # a knob",
            "    .venv/bin/python -m bench.run --report bench/results/FILE.json  # redo docs/ only",
            "    .venv/bin/python -m bench.chunking          # how rows are cut into ORT runs",
            "    .venv/bin/python -m bench.rerank            # the rerank load alone",
            "    .venv/bin/python -m bench.precision         # precision / optimisation levels",
            "    .venv/bin/python -m bench.floor             # 1 x 1: served, empty model, ORT b1",
            "    .venv/bin/python -m bench.weight_memory     # an instance's memory, weight cache",
            '    .venv/bin/python -m bench.ab --variant "" --variant "KEY=VALUE"  # side by side',
            "",
            "One load against any running server (prints client and server-side figures):",
            "",
            "    python -m client bench --model all-MiniLM-L6-v2 --clients 16 "
            "--texts-per-request 1 --requests 200 --protocol grpc --json out.json",
            "    python -m client bench --model clip-vit-b-32 --images 1 --mode url --clients 8",
        ]
    )


def perf_analyzer_section() -> str:
    """Input-data generation and the exact perf_analyzer command lines (SDK container)."""
    commands = (
        perf_analyzer_commands("all-MiniLM-L6-v2", "text", url="localhost:8001")
        + perf_analyzer_commands("clip-vit-b-32", "clip", url="localhost:8001")[3:]
    )
    body = [
        "Input data for every ensemble (`TEXT`, `IMAGE` as base64 of the serialised BYTES "
        "tensor, `IMAGE_URL`), written by the client package:",
        "",
        "    python -m client perf-data --out perf-data/text --model-kind text",
        "    python -m client perf-data --out perf-data/clip --model-kind clip "
        "--image-base-url http://127.0.0.1:8080",
        "    python -m http.server 8080 --bind 127.0.0.1 --directory perf-data/clip/images &",
        "",
        "The URL ensemble fetches from 127.0.0.1, so the served manifest must list it in "
        "`[fetch_image] allow_hosts`. With Triton on this host (`make serve`, gRPC on 8001):",
        "",
        f"    docker run --rm -it --net host -v $PWD/perf-data:/data {SDK_IMAGE} bash",
    ]
    body += [f"    {c.replace('/data/', '/data/text/', 1)}" for c in commands[:3]]
    body += [f"    {c.replace('/data/', '/data/clip/', 1)}" for c in commands[3:]]
    return "\n".join(body)


# The "Method" section, as written in bench/method.md.
METHOD = (Path(__file__).with_name("method.md")).read_text().strip()


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
