"""The corpus indexer's rate against the best load, side by side (part of ``make bench``).

    python -m bench.index_rate [--quick] [--rows 4000] [--repeats 3] [--protocol grpc]

One Triton serving all-MiniLM-L6-v2 with the project's settings (``bench.run``'s text
entry, in a repository of its own: ``.build/bench-repo-index``). Each repeat runs, in an
order rotated per repeat:

- every text load of ``bench.run`` (``bench.loads.text_loads``: 1 x 1, 4 x 1, 16 x 1,
  4 x 32) with the load generator; the best of them is "the best load";
- ``python -m client index``'s Python API (:func:`client.index.run_index`) over a JSONL
  corpus of ``--rows`` sentences from the same pool into a fresh folder: rows / wall
  time of the whole run (reading, requests, Parquet writes, manifest).

Prints and records index / best per repeat, pooled (the mean index rate over the mean
best-load rate) and the median of the per-repeat ratios, with the CPU share other
processes took during each step (a large share makes a ratio meaningless). Writes
``bench/results/index-rate-<time>.json`` (``.build/bench-results`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

from bench.common import logger
from bench.loads import text_loads
from bench.machine import CpuMonitor, machine_info
from bench.manifest import BUILD, ROOT, TEXT_MODEL, bench_manifest
from client.index import IndexJob, run_index
from client.load.loadgen import run_triton_load
from client.load.workload import text_pool, text_requests
from generator.admin import KEY_ENV
from generator.build import build_repository
from generator.triton_local import TritonLaunch, TritonPorts, TritonProcess, free_ports

log = logger("bench.index_rate")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(prog="python -m bench.index_rate")
    parser.add_argument("--quick", action="store_true", help="few rows, 1 repeat")
    parser.add_argument("--rows", type=int, help="corpus rows (default 4000, quick 600)")
    parser.add_argument("--repeats", type=int, help="repeats (default 3, quick 1)")
    parser.add_argument("--protocol", choices=["grpc", "http"], default="grpc")
    parser.add_argument("--pool", type=int, default=512, help="distinct sentences")
    parser.add_argument("--concurrency", type=int, help="the indexer's (default: its own)")
    args = parser.parse_args(argv)
    args.rows = args.rows or (600 if args.quick else 4000)
    args.repeats = args.repeats or (1 if args.quick else 3)
    return args


def start_triton(stack: ExitStack) -> TritonPorts:
    """The bench repository's text model on free ports (stopped by ``stack``)."""
    manifest = bench_manifest("cpu", with_clip=False)
    repo = BUILD / "bench-repo-index"  # its own: a build drops the models it does not list
    build_repository(manifest, repo, log=log)
    ports = TritonPorts(*free_ports(3))
    key = os.environ.setdefault(KEY_ENV, secrets.token_urlsafe(32))
    launch = TritonLaunch(repo, ports, load_models=manifest.models[0].ensembles, admin_key=key)
    process = TritonProcess(launch, BUILD / "bench-work-index")
    process.start()
    stack.callback(process.stop)
    process.wait_ready(timeout_s=300)
    return ports


def write_corpus(path: Path, pool: list[str], rows: int) -> None:
    """``rows`` JSONL rows cycling through ``pool``."""
    with path.open("w", encoding="utf-8") as handle:
        for i in range(rows):
            handle.write(json.dumps({"id": f"r{i}", "text": pool[i % len(pool)]}) + "\n")


def best_load(url: str, protocol: str, pool: list[str], quick: bool) -> dict:
    """Every text load of ``bench.run``; the best one's rate and all of them."""
    rates = {}
    for load in text_loads(quick):
        spec = load.spec
        count = spec.clients * (spec.warmup_requests + spec.requests_per_client)
        requests = text_requests(pool, spec.items_per_request, count)
        result = run_triton_load(url, protocol, TEXT_MODEL, "TEXT", requests, spec, load.key)
        rates[load.key] = result.items_per_s
        log(f"  load {load.key:8s} {result.items_per_s:8.1f} sentences/s")
    best = max(rates, key=rates.get)
    return {"best": best, "best_rows_per_s": rates[best], "loads": rates}


def index_once(url: str, protocol: str, corpus: Path, out: Path, concurrency: int | None) -> dict:
    """One indexer run into a fresh ``out``; its rate over the whole run."""
    shutil.rmtree(out, ignore_errors=True)
    job = IndexJob(
        model=TEXT_MODEL,
        inputs=[str(corpus)],
        out=str(out),
        url=url,
        protocol=protocol,
        admin_key=os.environ[KEY_ENV],
        shard_rows=1000,
        concurrency=concurrency,
        progress="quiet",
    )
    summary = run_index(job)
    if summary.total_errors:
        raise RuntimeError(f"{summary.total_errors} rows failed")
    log(f"  index    {summary.rows_per_s:8.1f} rows/s ({summary.rows} rows, "
        f"{summary.concurrency} in flight x {summary.batch_rows} rows, "
        f"{summary.retries} requests retried, {summary.resent} batches resent)")  # fmt: skip
    return {
        "rows_per_s": summary.rows_per_s,
        "rows": summary.rows,
        "seconds": summary.seconds,
        "concurrency": summary.concurrency,
        "batch_rows": summary.batch_rows,
        "retries": summary.retries,
        "resent": summary.resent,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison; write the results file."""
    args = parse_args(argv)
    pool = text_pool(args.pool)
    work = BUILD / "bench-index"
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / "corpus.jsonl"
    write_corpus(corpus, pool, args.rows)
    repeats = []
    monitor = CpuMonitor()
    with ExitStack() as stack:
        ports = start_triton(stack)
        url = f"127.0.0.1:{ports.http if args.protocol == 'http' else ports.grpc}"
        index_once(url, args.protocol, corpus, work / "warmup", args.concurrency)
        for repeat in range(args.repeats):
            log(f"repeat {repeat + 1}/{args.repeats}")
            steps = ["load", "index"] if repeat % 2 == 0 else ["index", "load"]
            record: dict = {}
            for step in steps:
                monitor.start()
                if step == "load":
                    record["load"] = best_load(url, args.protocol, pool, args.quick)
                else:
                    out = work / "out"
                    record["index"] = index_once(url, args.protocol, corpus, out, args.concurrency)
                record[step]["foreign_cpu"] = monitor.stop().foreign_share
                log(f"  {step:8s} foreign cpu {record[step]['foreign_cpu']:.0%}")
            record["ratio"] = record["index"]["rows_per_s"] / record["load"]["best_rows_per_s"]
            log(f"  ratio    {record['ratio']:.2f}x")
            repeats.append(record)
    pooled = statistics.mean(r["index"]["rows_per_s"] for r in repeats) / statistics.mean(
        r["load"]["best_rows_per_s"] for r in repeats
    )
    median = statistics.median(r["ratio"] for r in repeats)
    per_repeat = ", ".join(f"{r['ratio']:.2f}" for r in repeats)
    log(f"index / best load: pooled {pooled:.2f}x, median {median:.2f}x; per repeat {per_repeat}")
    results = {
        "command": "python -m bench.index_rate " + " ".join(argv or sys.argv[1:]),
        "machine": machine_info(),
        "model": TEXT_MODEL,
        "protocol": args.protocol,
        "rows": args.rows,
        "repeats": repeats,
        "pooled_ratio": pooled,
        "median_ratio": median,
    }
    folder = BUILD / "bench-results" if args.quick else ROOT / "bench" / "results"
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H%M%SZ", time.gmtime())
    path = folder / f"index-rate-{stamp}.json"
    path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
