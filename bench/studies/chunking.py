"""How the encoder splits one execution's rows into ONNX Runtime runs: speed in-process.

``python -m bench.studies.chunking`` builds the bench text model into ``.build/bench-repo`` (as
``bench.studies.precision`` does) and runs its served ``model.onnx`` over the benchmark
sentences cut into random groups, each group standing for the rows of one Triton
execution (8: a dynamic batch of single-sentence requests; 128: four 32-sentence
requests). Every group is split by the encoder's own planner
(:func:`embed_runtime.engines.ragged.plan_chunks`) under each plan below. Plans alternate
inside every repeat; the figure is the median sentences/s over repeats and, in
brackets, the median of the per-repeat ratios to running every row alone.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

import numpy as np

from bench.ceiling import make_session, tokenize_sentences
from bench.manifest import ROOT, TEXT_MODEL, bench_manifest
from client.load.workload import text_pool
from embed_runtime.engines.ragged import chunk_inputs, plan_chunks
from generator.build import build_repository


def _plan_name(rows: int, share: float) -> str:
    """A plan's name in the report: rows one by one, or length-sorted chunks and their cap."""
    if rows == 1:
        return "rows alone (max_rows_per_run=1)"
    cap = "any padding" if share >= 1.0 else f"padding <= {round(share * 100)} %"
    return f"sorted, {rows} rows, {cap}"


# name -> (max_rows_per_run, max_padding_share)
PLANS: dict[str, tuple[int, float]] = {
    _plan_name(*plan): plan for plan in ((1, 1.0), (32, 1.0), (64, 0.1), (64, 0.2), (64, 0.3))
}
BASELINE = _plan_name(1, 1.0)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(prog="python -m bench.studies.chunking", description=__doc__)
    parser.add_argument("--groups", type=int, nargs="+", default=[8, 128])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pool", type=int, default=512, help="distinct sentences")
    return parser.parse_args(argv)


def measure(session, arrays: dict, lengths: np.ndarray, group: int, repeats: int) -> dict:
    """Sentences/s of every plan per repeat, on the same random groups."""
    mix = np.random.default_rng(0).permutation(len(lengths))
    groups = [mix[i : i + group] for i in range(0, len(mix), group)]
    per_group = [({k: v[g] for k, v in arrays.items()}, lengths[g]) for g in groups]
    feeds = {
        name: [
            chunk_inputs(group_arrays, chunk)
            for group_arrays, group_lengths in per_group
            for chunk in plan_chunks(group_lengths, rows, max_padding=padding)
        ]
        for name, (rows, padding) in PLANS.items()
    }
    for feed in feeds[BASELINE][:8]:
        session.run(None, feed)
    speeds: dict[str, list[float]] = {name: [] for name in PLANS}
    for _ in range(repeats):
        for name, plan_feeds in feeds.items():
            start = time.perf_counter()
            for feed in plan_feeds:
                session.run(None, feed)
            speeds[name].append(len(lengths) / (time.perf_counter() - start))
    return speeds


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    args = parse_args(argv)
    repo = ROOT / ".build" / "bench-repo"
    build_repository(bench_manifest("cpu", with_clip=False), repo, log=print)
    session = make_session(repo / f"{TEXT_MODEL}_encode" / "1" / "model.onnx", "cpu")
    names = {i.name for i in session.get_inputs()}
    arrays, lengths, _ = tokenize_sentences(repo, TEXT_MODEL, text_pool(args.pool))
    arrays = {k: v for k, v in arrays.items() if k in names}
    for group in args.groups:
        speeds = measure(session, arrays, lengths, group, args.repeats)
        print(f"\nrows per execution: {group} ({args.repeats} repeats, {len(lengths)} sentences)")
        for name, values in speeds.items():
            ratios = [v / b for v, b in zip(values, speeds[BASELINE], strict=True)]
            print(
                f"  {name:36s} {statistics.median(values):7.1f} sentences/s"
                f"  ({statistics.median(ratios):.2f} x rows alone)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
