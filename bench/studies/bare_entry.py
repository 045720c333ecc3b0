"""A bare manifest entry against the tuned one, side by side (part of ``make bench``).

    python -m bench.studies.bare_entry [--quick] [--repeats 8] [--scale 1] [--protocol grpc]

Four servers of all-MiniLM-L6-v2, all started before the first load:

- ``bare``: ``name``, ``family`` and ``source`` only, so every serving knob comes from
  the CPU profile (:mod:`generator.profiles`), as after ``generator add``;
- ``tuned``: the settings measured best on a CPU written out key by key, as the shipped
  ``models.toml`` carried them before the profile existed (:data:`TUNED`);
- ``plain``: every profile key pinned to the manifest's generic default (what a bare
  entry was served with before the profile: 2 ms queue delay, 32-row chunks padded to
  their longest row, the split tokenizer, one encoder process, unbounded queues);
- ``control``: the tuned entry again, a server of its own: control / tuned is what two
  identical servers measure apart on this host, the noise every other ratio carries.

Every repeat runs each text load of ``bench.run`` (``--scale`` times its requests) on
each server in a rotated order (:func:`rotate`). Per load it prints bare / tuned
and control / tuned two ways: pooled (the mean rate over every repeat over the other's,
which uses every run) and the median of the per-repeat ratios. The gate (>= 0.95x) is
on the pooled bare / tuned ratio. Before any load it compares the built repositories file
by file (bytecode caches aside): ``bare`` and ``tuned`` serve the same bytes, so their
ratio can differ from 1 only as much as ``control``'s does. Writes
``bench/results/bare-entry-<time>.json`` (``.build/bench-results`` with ``--quick``).
Exits 1 when a load is under the gate.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.common import logger, median, save_results, table, write_results
from bench.loads import BenchLoad, text_loads
from bench.machine import CpuMonitor, machine_info
from bench.manifest import ROOT, TEXT_DEFAULTS, TEXT_MODEL, served
from client.load.loadgen import run_triton_load
from client.load.workload import text_pool, text_requests
from generator.build import STATE_FILE
from generator.manifest import ModelEntry, parse_manifest
from generator.profiles import PROFILES, profile_defaults
from generator.triton_local import TritonPorts

log = logger("bare-entry", sys.stdout)
GATE = 0.95
SETTLE_S = 1.0  # the last server's threads and stubs go quiet before the next load
# The CPU settings as models.toml carried them by hand (docs/benchmarks.md measures each).
TUNED: dict[str, Any] = {
    "max_batch_size": 64,
    "max_queue_delay_us": 0,
    "max_rows_per_run": 64,
    "max_padding_share": 0.1,
    "encoder_instances": 2,
    "ort_threads_shared": -1,
    "ort_spin_us": 20,
    # the tokenize step admits requests to the encoder (issues 46, 56); fused, nothing would
    "fused_tokenize": False,
    "admission_wait_us": 30_000_000,
    "admission_max_rows": 8192,
}
_GENERIC = {f.name: f.default for f in dataclasses.fields(ModelEntry)}


def variants() -> dict[str, dict[str, Any]]:
    """The four manifest entries by label (``bare`` first, ``tuned`` second)."""
    profiled = {key for kind in PROFILES["cpu"].values() for key in kind}
    return {
        "bare": dict(TEXT_DEFAULTS),
        "tuned": {**TEXT_DEFAULTS, **TUNED},
        "plain": {**TEXT_DEFAULTS, **{key: _GENERIC[key] for key in sorted(profiled)}},
        "control": {**TEXT_DEFAULTS, **TUNED},
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.studies.bare_entry", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="few requests, 1 repeat")
    parser.add_argument("--repeats", type=int, help="repeats of every load (default 8)")
    parser.add_argument("--scale", type=float, default=1.0, help="x requests per load")
    parser.add_argument("--pool", type=int, default=512, help="distinct sentences")
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    return parser.parse_args(argv)


def repository_differences(a: Path, b: Path) -> list[str]:
    """Files (relative paths) that differ between two built repositories, or exist in one.

    Left out: ``__pycache__`` (bytecode Python writes when a stub imports the model) and
    the generator's own state file (the build's bookkeeping, never served: its code
    fingerprint changes with any edit to the checkout between two builds).
    """
    def files(root: Path) -> dict[str, bytes]:
        return {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*"))
                if f.is_file() and "__pycache__" not in f.parts and f.name != STATE_FILE}

    left, right = files(a), files(b)
    return sorted(name for name in left.keys() | right.keys() if left.get(name) != right.get(name))


def run_order(servers: int, repeat: int) -> list[int]:
    """The order of the servers in ``repeat``: rotated by one, reversed on odd repeats.

    So no server always runs right after the same other one: a plain rotation of three
    always puts server 0 right after server 2, across loads too.
    """
    order = list(range(servers))
    shift = repeat % servers
    order = order[shift:] + order[:shift]
    return order[::-1] if repeat % 2 else order


def rotate(
    servers: list[TritonPorts], loads: list[BenchLoad], repeats: int, pool: list[str],
    protocol: str,
) -> list[dict]:
    """Every load on every server, ``repeats`` times, the server order rotated per repeat.

    One row of figures per run (``variant`` is the server's index).
    """
    monitor = CpuMonitor()
    rows: list[dict] = []
    for repeat in range(repeats):
        for load in loads:
            spec = load.spec
            count = spec.clients * (spec.warmup_requests + spec.requests_per_client)
            requests = text_requests(pool, spec.items_per_request, count)
            for i in run_order(len(servers), repeat):
                time.sleep(SETTLE_S)
                port = servers[i].grpc if protocol == "grpc" else servers[i].http
                monitor.start()
                result = run_triton_load(
                    f"127.0.0.1:{port}", protocol, TEXT_MODEL, "TEXT", requests, spec, load.key
                )
                window = monitor.stop()
                rows.append({
                    "repeat": repeat, "load": load.key, "variant": i,
                    "items_per_s": result.items_per_s, "p50_ms": result.median_ms,
                    "errors": result.errors, "error_samples": result.error_samples,
                    "foreign_cpu": window.foreign_share, "busy_cpu": window.busy_share,
                })  # fmt: skip
                log(
                    f"{load.key:7s} v{i} {result.items_per_s:7.1f}/s "
                    f"p50 {result.median_ms:7.2f} ms errors {result.errors} "
                    f"machine busy {window.busy_share:.0%} foreign {window.foreign_share:.0%}"
                    + "".join(f"\n    error: {e}" for e in result.error_samples[:3])
                )
    return rows


def ratios(rows: list[dict], loads: list[str], labels: list[str]) -> dict[str, dict]:
    """Per load: each variant's median items/s and p50, and bare / tuned per repeat."""
    out: dict[str, dict] = {}
    for load in loads:
        mine = [r for r in rows if r["load"] == load]
        figures: dict[str, Any] = {}
        for i, label in enumerate(labels):
            runs = [r for r in mine if r["variant"] == i]
            figures[label] = {
                "items_per_s": median(r["items_per_s"] for r in runs),
                "p50_ms": median(r["p50_ms"] for r in runs),
                "errors": sum(r["errors"] for r in runs),
            }
        rates = {
            i: [r["items_per_s"] for r in mine if r["variant"] == i] for i in range(len(labels))
        }
        for i, label in enumerate(labels):
            if label == "tuned":
                continue
            per_repeat = []
            for repeat in sorted({r["repeat"] for r in mine}):
                rate = {r["variant"]: r["items_per_s"] for r in mine if r["repeat"] == repeat}
                per_repeat.append(rate[i] / rate[1])
            figures[f"{label}_over_tuned"] = median(per_repeat)
            figures[f"{label}_over_tuned_runs"] = per_repeat
            figures[f"{label}_over_tuned_pooled"] = statistics.fmean(rates[i]) / statistics.fmean(
                rates[1]
            )
        out[load] = figures
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the three entries, run the loads in rotation, print and save; 1 below the gate."""
    args = parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 8)
    loads = text_loads(args.quick, args.scale)
    pool = text_pool(args.pool)
    entries = variants()
    labels = list(entries)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with ExitStack() as stack:
        servers = {
            label: stack.enter_context(served(
                parse_manifest({"models": [entry]}, ROOT, f"{label} entry"),
                f"bare-entry-{label}", models=(TEXT_MODEL,), log=log,
            ))
            for label, entry in entries.items()
        }  # fmt: skip
        differences = {
            label: repository_differences(servers["tuned"].repo, servers[label].repo)
            for label in labels if label != "tuned"
        }
        log("repository files differing from tuned's: " + ", ".join(
            f"{label} {len(found)}" for label, found in differences.items()))
        rows = rotate([s.ports for s in servers.values()], loads, repeats, pool, args.protocol)
    figures = ratios(rows, [ld.key for ld in loads], labels)
    header = [
        "load",
        *(f"{label} items/s" for label in labels),
        "bare / tuned pooled (median)",
        "control / tuned pooled (median)",
        "gate",
    ]
    lines = [
        [
            load,
            *(f"{f[label]['items_per_s']:.1f}" for label in labels),
            f"{f['bare_over_tuned_pooled']:.3f}x ({f['bare_over_tuned']:.3f}x)",
            f"{f['control_over_tuned_pooled']:.3f}x ({f['control_over_tuned']:.3f}x)",
            "ok" if f["bare_over_tuned_pooled"] >= GATE else f"BELOW {GATE}",
        ]
        for load, f in figures.items()
    ]
    print(f"\nmedians of {repeats} repeats ({args.protocol}); bare takes the CPU profile:")
    profile = profile_defaults("cpu", "sentence-transformers", "python-ort")
    print("  " + ", ".join(f"{k} = {v!r}" for k, v in profile.items()))
    print(table(header, lines))
    results = {
        "started": started,
        "machine": machine_info(),
        "protocol": args.protocol,
        "repeats": repeats,
        "scale": args.scale,
        "variants": entries,
        "repository_differences_from_tuned": differences,
        "figures": figures,
        "rows": rows,
    }
    if args.quick:
        print(f"wrote {write_results(results, 'bare-entry-quick', quick=True)}")
    else:
        print(f"wrote {save_results(results, 'bare-entry')}")
    below = [load for load, f in figures.items() if f["bare_over_tuned_pooled"] < GATE]
    return 1 if below and not args.quick else 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
