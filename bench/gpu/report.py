"""The GPU section of ``docs/benchmarks.md`` from ``bench.gpu`` results files.

The prose is ``bench/templates/gpu_section.md``; ``bench.page`` renders it from the newest
``gpu-all`` run file, ``python -m bench.gpu --report FILE...`` from any.
"""

from __future__ import annotations

import re
from typing import Any

from bench.common import render_template, table

BEGIN = "<!-- gpu:begin (python -m bench.gpu --report) -->"
END = "<!-- gpu:end -->"
TARGETS = {  # issue 15: published figures the GPU run is held against (QPS, batch-1 requests)
    "e5-small-random": 10_000,
    "clip-vit-b-32_text": 5_000,
    "clip-vit-b-32_image": 1_500,
    "clip-vit-b-32_image_url": 1_500,
}
IMAGE_GPU_MIN_COSINE = 0.9999  # gate on the GPU image path's parity table (issue 28)
JPEG_ONLY = ("image_jpeg.json", "image_url_jpeg.json")


def _ceiling(model: str, ceilings: dict[str, Any]) -> tuple[float, str]:
    """The in-process rate the served ensemble is compared with, and what it is."""
    if model == "e5-small-random" and "text_ort" in ceilings:
        by_batch = ceilings["text_ort"]["by_batch"]
        best = max(by_batch, key=lambda b: by_batch[b])
        return by_batch[best], f"ORT CUDA, length-sorted batches of {best}, tokenizer excluded"
    if model == "clip-vit-b-32_text" and "clip_text_ort" in ceilings:
        return ceilings["clip_text_ort"]["items_per_s"], "ORT CUDA text tower, batch 256"
    if model.startswith("clip-vit-b-32_image") and "image_preprocess_cpu" in ceilings:
        tower = ceilings["image_tower_ort"]["items_per_s"]
        cpu = ceilings["image_preprocess_cpu"]
        return min(tower, cpu["items_per_s"]), (
            f"the slower of the image tower ({tower:,.0f}/s, ORT CUDA, batch 256) and the "
            f"served decode + preprocess on {cpu['processes']} processes "
            f"({cpu['items_per_s']:,.0f}/s)"
        )
    return float("nan"), "not measured"


def _variant(result: dict[str, Any]) -> str:
    """The ``--set`` overrides of a results file, e.g. ``clip.image_draft_decode=true``."""
    return result["meta"]["args"].get("set", "[]").strip("[]").replace("'", "")


def _load(run: dict[str, Any]) -> str:
    """``JPEG only`` for the loads of the JPEG photos alone, else empty."""
    return "JPEG only" if run.get("data") in JPEG_ONLY else ""


def render_gpu_section(results: list[dict[str, Any]]) -> str:
    """Markdown for one or more results files of the same GPU host (``gpu_section.md``)."""
    first = results[0]["meta"]
    runs = [{**run, "variant": _variant(r), "ceilings": r.get("ceilings", {})}
            for r in results for run in r.get("runs", [])]
    files = ", ".join(f"`bench/results/gpu-{r['meta']['args']['models']}-{r['meta']['started']}"
                      ".json`" for r in results)
    placement = next((r["placement"] for r in results if "placement" in r), None)
    parity = next((r["parity"] for r in results if "parity" in r), None)
    checked = {
        "held": ", ".join(f"{m} {mib:,} MiB" for m, mib in sorted(placement["encoder_gpu_mib"]
                                                                  .items())),
        "sentences": parity["sentences"], "min_cosine": f"{parity['min_cosine']:.6f}",
        "gate": parity["gate_min_cosine"], "max_abs": f"{parity['max_abs']:.1e}",
    } if placement and parity else None
    rows = []
    variants = sorted({(r["variant"], _load(r)) for r in runs})
    for model, variant in ((m, v) for m in TARGETS for v in variants):
        target = TARGETS[model]
        mine = [r for r in runs if r["model"] == model and "qps" in r
                and (r["variant"], _load(r)) == variant]
        if not mine:
            continue
        best = max(mine, key=lambda r: r["qps"])
        ceiling = _ceiling(model, best["ceilings"])[0]
        rows.append([
            _label(best), f"{best['qps']:,.0f}", str(best["concurrency"]),
            f"{best['p50_ms']:.1f}", f"{best.get('gpu_util_mean') or 0:.0f} %",
            f"{ceiling:,.0f}", f"{best['qps'] / ceiling:.2f} x", f"{target:,}",
            "met" if best["qps"] >= target else "not met",
        ])
    torch_rates = [r["ceilings"]["text_torch_fp16"]["items_per_s"] for r in runs
                   if "text_torch_fp16" in r["ceilings"]]
    return render_template(
        "gpu_section.md", begin=BEGIN, end=END, machine=first["machine"], files=files,
        gpu_memory_mib=f"{first['machine']['gpu_memory_mib']:,}", checked=checked,
        measurement_ms=first["args"]["measurement_ms"],
        targets_table=table(["ensemble", "QPS", "at concurrency", "p50 ms", "GPU",
                             "in-process rate", "served / in-process", "target", ""], rows),
        in_process="; ".join(f"`{model}`: {_ceiling(model, run['ceilings'])[1]}"
                             for model, run in {r["model"]: r for r in runs}.items()),
        measurements_table=table(
            ["ensemble", "concurrency", "QPS", "p50 ms", "p99 ms", "encoder rows / execution",
             "server compute ms", "GPU mean / max"],
            [
                [_label(r), str(r["concurrency"]), f"{r['qps']:,.0f}", f"{r['p50_ms']:.1f}",
                 f"{r['p99_ms']:.1f}", _rows_per_execution(r), f"{r['server_compute_ms']:.1f}",
                 f"{r.get('gpu_util_mean') or 0:.0f} / {r.get('gpu_util_max') or 0:.0f} %"]
                if "qps" in r else
                [_label(r), str(r["concurrency"]), "failed: " + _first_error(r), *[""] * 5]
                for r in runs
            ],
        ),
        image_gpu=image_gpu_values(results),
        torch_rates=f"{min(torch_rates):,.0f}-{max(torch_rates):,.0f}" if torch_rates else None,
    ).rstrip("\n")


def _rows_per_execution(run: dict[str, Any]) -> str:
    """Mean requests per execution of the run's encoder step, from perf_analyzer's report."""
    step = re.compile(r"_encode(?:_text|_image)?, version: \d+\s+Inference count: (\d+)\s+"
                      r"Execution count: (\d+)")
    match = step.search(run.get("perf_analyzer_tail", ""))
    return f"{int(match.group(1)) / int(match.group(2)):.1f}" if match else "?"


def _label(run: dict[str, Any]) -> str:
    notes = ", ".join(n for n in (_load(run), run.get("variant")) if n)
    return f"`{run['model']}`" + (f" ({notes})" if notes else "")


def _photo_row(row: dict[str, Any]) -> list[str]:
    gpu = row.get("gpu_default", {})
    return [
        f"`{row['photo']}`", "x".join(str(v) for v in row["size"]),
        "GPU" if row["gpu_decoded"] else "CPU (exact path)",
        f"{gpu.get('cosine', float('nan')):.7f}", f"{gpu.get('max_levels', 0):.0f}",
        f"{gpu.get('mean_levels', 0):.4f}",
        f"{row['draft_cpu']['cosine']:.7f}", f"{row['draft_cpu']['max_levels']:.0f}",
    ]


def image_gpu_values(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The ``image_decode = "gpu"`` subsection's values: parity, safety, memory, rates."""
    with_parity = [r for r in results if "image_gpu_parity" in r.get("ceilings", {})]
    if not with_parity:
        return None
    result = max(with_parity, key=lambda r: r["meta"]["started"])
    parity = result["ceilings"]["image_gpu_parity"]
    summary = parity["summary"]
    served = result.get("image_gpu", {})
    fancy = summary.get("gpu_fancy_upsampling", {})
    sp = served.get("served_parity", {})
    safety = served.get("safety", {})
    ceilings = result["ceilings"]
    rates = [
        (key, label) for key, label in (
            ("image_preprocess_gpu", "the load's 12 photos (4 PNG/WebP on the CPU path)"),
            ("image_preprocess_gpu_jpeg", "its 8 JPEGs, `:fancy_upsampling=1`"),
            ("image_preprocess_gpu_jpeg_default_upsampling", "its 8 JPEGs, nvJPEG defaults"),
        ) if "items_per_s" in ceilings.get(key, {})
    ]
    cpu = ceilings["image_preprocess_cpu"] if rates else None
    return {
        "file": f"bench/results/gpu-{result['meta']['args']['models']}-"
        f"{result['meta']['started']}.json",
        "table": table(["photo", "size", "decoded on", "GPU cosine", "GPU max levels",
                        "GPU mean levels", "draft cosine", "draft max levels"],
                       [_photo_row(row) for row in parity["photos"]]),
        "photos": len(parity["photos"]), "gate": IMAGE_GPU_MIN_COSINE,
        "gpu_min": f"{summary['gpu_default']['min_cosine']:.7f}",
        "gpu_mean": f"{summary['gpu_default']['mean_cosine']:.7f}",
        "draft_min": f"{summary['draft_cpu']['min_cosine']:.7f}",
        "fancy_min": f"{fancy['min_cosine']:.7f}" if fancy else None,
        "served": {"photos": sp["photos"], "min_cosine": f"{sp['min_cosine']:.7f}"}
        if "min_cosine" in sp else None,
        "safety": {
            "good_sent": safety["good_sent"], "good_ok": safety["good_ok"],
            "bad": "; ".join(f"{k}: {v[:110]}" for k, v in safety["bad"].items()),
            "still_ready": safety["server_still_ready"],
        } if "bad" in safety else None,
        "stub_memory": ", ".join(f"`{m}` {v['mib']:,} MiB in {v['processes']} processes"
                                 for m, v in sorted(served.get("stub_gpu_memory", {}).items())),
        "rates": "; ".join(
            f"{label}: {ceilings[key]['items_per_s']:,.0f} images/s" for key, label in rates
        ),
        "cpu_processes": cpu["processes"] if cpu else None,
        "cpu_rate": f"{cpu['items_per_s']:,.0f}" if cpu else None,
    }


def _first_error(run: dict[str, Any]) -> str:
    text = run.get("error", "")
    match = re.search(r"error: (.*)", text)
    line = match.group(1) if match else (text.strip().splitlines() or ["?"])[-1]
    return line.replace("|", "/")[:160]
