"""Serving settings side by side: one Triton per variant, the text loads in rotation.

    python -m bench.studies.ab --variant "" --variant "encoder_instances=2;ort_threads_shared=-1"

Each ``--variant`` is a ``;``-separated list of ``KEY=VALUE`` overrides of the text
model (the ``--text-set`` of ``bench.run``; empty: ``models.toml`` as shipped). Every
variant gets its own repository and server, all started before the first load, and every
repeat runs each load on each variant in a rotated order, so the ratios between variants
come from one run on one machine state. Idle servers hold no spinning threads, so one
variant's server does not slow another's load. Prints a table of medians; ``--json``
also saves every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import time
from contextlib import ExitStack
from pathlib import Path

from bench.ceiling import chunk_settings, make_session, served_tokenizer
from bench.common import logger
from bench.load_ceiling import load_ceiling, timed_rows
from bench.loads import BenchLoad, text_loads
from bench.machine import CpuMonitor
from bench.manifest import BUILD, TEXT_MODEL, bench_manifest, parse_overrides
from client.load.loadgen import run_triton_load
from client.load.workload import text_pool, text_requests
from generator.admin import KEY_ENV
from generator.build import build_repository
from generator.manifest import Manifest
from generator.triton_local import TritonLaunch, TritonPorts, TritonProcess, free_ports

log = logger("bench")


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", action="append", required=True, help="KEY=VALUE;...")
    parser.add_argument("--load", action="append", help="e.g. '16 x 1' (default: all)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pool", type=int, default=512)
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    parser.add_argument("--json", type=Path, help="save every figure here")
    parser.add_argument(
        "--ceiling",
        action="store_true",
        help="also run each load's in-process ceiling (bench.load_ceiling) in the rotation "
        "and print every variant's ratio to it",
    )
    return parser.parse_args(argv)


def start(variant: str, index: int, stack: ExitStack) -> TritonPorts:
    """Build and start the server of one variant; returns its ports."""
    overrides = parse_overrides([p for p in variant.split(";") if p.strip()])
    ports = serve(bench_manifest("cpu", False, overrides), f"ab-{index}", stack)
    log(f"variant {index} {variant or '(shipped)'}: grpc {ports.grpc}, http {ports.http}")
    return ports


def serve(manifest: Manifest, label: str, stack: ExitStack) -> TritonPorts:
    """Build ``manifest`` into ``.build/<label>-repo`` and serve its text model.

    Triton is stopped by ``stack``; returns its ports once ready.
    """
    return serve_process(manifest, label, stack)[0]


def serve_process(manifest: Manifest, label: str, stack: ExitStack) -> tuple[TritonPorts, int]:
    """:func:`serve`, returning the server's PID too."""
    repo = BUILD / f"{label}-repo"
    build_repository(manifest, repo, log=log)
    ports = TritonPorts(*free_ports(3))
    key = os.environ.setdefault(KEY_ENV, secrets.token_urlsafe(32))
    launch = TritonLaunch(repo, ports, load_models=(TEXT_MODEL,), admin_key=key)
    process = TritonProcess(launch, BUILD / f"{label}-work")
    process.start()
    stack.callback(process.stop)
    process.wait_ready(timeout_s=300)
    return ports, process.process.pid


SETTLE_S = 1.0


def run_order(servers: int, repeat: int) -> list[int]:
    """The order of the servers in ``repeat``: rotated by one, reversed on odd repeats.

    So no server always runs right after the same other one: a plain rotation of three
    always puts server 0 right after server 2, across loads too.
    """
    order = list(range(servers))
    shift = repeat % servers
    order = order[shift:] + order[:shift]
    return order[::-1] if repeat % 2 else order


def ceiling_run(repo: Path, spec, requests: list) -> float:
    """The load's in-process ceiling (best of bench.load_ceiling's ways), rows/s.

    Sessions of its own, dropped before the servers run again, as ``bench.run`` does.
    """
    onnx_path = repo / f"{TEXT_MODEL}_encode" / "1" / "model.onnx"
    tokenizer = served_tokenizer(repo, TEXT_MODEL)
    max_rows, max_padding = chunk_settings(repo, TEXT_MODEL)
    rows = [r.decode() for r in timed_rows(requests, spec.clients, spec.warmup_requests)]
    session = make_session(onnx_path, "cpu")
    cores = os.cpu_count() or 1
    singles = [make_session(onnx_path, threads=1) for _ in range(cores)] if cores > 1 else []
    best = load_ceiling(
        session, tokenizer.encode, rows, spec.clients * spec.items_per_request,
        max_rows, max_padding, singles,
    )  # fmt: skip
    return best.best_items_per_s


def rotate(
    servers: list[TritonPorts],
    loads: list[BenchLoad],
    repeats: int,
    pool: list[str],
    protocol: str,
    ceiling_repo: Path | None = None,
) -> list[dict]:
    """Every load on every server, ``repeats`` times, the server order rotated per repeat.

    One row of figures per run (``variant`` is the server's index; ``-1`` the in-process
    ceiling, run in the rotation when ``ceiling_repo`` is given).
    """
    monitor = CpuMonitor()
    rows: list[dict] = []
    entries = len(servers) + (1 if ceiling_repo is not None else 0)
    for repeat in range(repeats):
        for load in loads:
            spec = load.spec
            count = spec.clients * (spec.warmup_requests + spec.requests_per_client)
            requests = text_requests(pool, spec.items_per_request, count)
            for i in run_order(entries, repeat):
                time.sleep(SETTLE_S)  # the last server's threads and stubs go quiet first
                if i == len(servers):
                    monitor.start()
                    rate = ceiling_run(ceiling_repo, spec, requests)
                    window = monitor.stop()
                    foreign, busy = window.foreign_share, window.busy_share
                    rows.append(
                        {"repeat": repeat, "load": load.key, "variant": -1,
                         "items_per_s": rate, "foreign_cpu": foreign, "busy_cpu": busy}
                    )  # fmt: skip
                    log(
                        f"{load.key:7s} ceiling {rate:7.1f}/s machine busy {busy:.0%} "
                        f"foreign {foreign:.0%}"
                    )
                    continue
                ports = servers[i]
                url = f"127.0.0.1:{ports.grpc if protocol == 'grpc' else ports.http}"
                monitor.start()
                result = run_triton_load(
                    url, protocol, TEXT_MODEL, "TEXT", requests, spec, load.key
                )
                window = monitor.stop()
                foreign, busy = window.foreign_share, window.busy_share
                rows.append(
                    {
                        "repeat": repeat,
                        "load": load.key,
                        "variant": i,
                        "items_per_s": result.items_per_s,
                        "p50_ms": result.median_ms,
                        "errors": result.errors,
                        "error_samples": result.error_samples,
                        "foreign_cpu": foreign,
                        "busy_cpu": busy,
                    }
                )
                log(
                    f"{load.key:7s} v{i} {result.items_per_s:7.1f}/s "
                    f"p50 {result.median_ms:7.2f} ms errors {result.errors} "
                    f"machine busy {busy:.0%} foreign {foreign:.0%}"
                    + "".join(f"\n    error: {e}" for e in result.error_samples[:3])
                )
    return rows


def ceiling_ratios(rows: list[dict], load: str, variant: int) -> list[float]:
    """Per repeat: the variant's rate over the ceiling's rate in that same repeat."""
    ratios = []
    for repeat in sorted({r["repeat"] for r in rows}):
        mine = [
            r for r in rows if (r["repeat"], r["load"], r["variant"]) == (repeat, load, variant)
        ]
        best = [r for r in rows if (r["repeat"], r["load"], r["variant"]) == (repeat, load, -1)]
        if mine and best:
            ratios.append(mine[0]["items_per_s"] / best[0]["items_per_s"])
    return ratios


def main(argv=None) -> int:
    """Start every variant, run the loads in rotation, print medians; returns 0."""
    args = parse_args(argv)
    loads = [ld for ld in text_loads(False) if not args.load or ld.key in args.load]
    pool = text_pool(args.pool)
    with ExitStack() as stack:
        servers = [start(v, i, stack) for i, v in enumerate(args.variant)]
        repo = BUILD / "ab-0-repo" if args.ceiling else None
        rows = rotate(servers, loads, args.repeats, pool, args.protocol, repo)
    print(f"\nmedians of {args.repeats} repeats ({args.protocol})")
    for i, variant in enumerate(args.variant):
        print(f"  v{i}: {variant or '(shipped models.toml)'}")
    print(f"{'load':8s}" + "".join(f"  v{i} items/s   p50 ms" for i in range(len(servers))))
    for load in loads:
        line = f"{load.key:8s}"
        for i in range(len(servers)):
            mine = [r for r in rows if r["load"] == load.key and r["variant"] == i]
            rate = statistics.median(r["items_per_s"] for r in mine)
            p50 = statistics.median(r["p50_ms"] for r in mine)
            line += f"  {rate:12.1f} {p50:8.2f}"
        print(line)
    if args.ceiling:
        print("\nserved / in-process ceiling, per repeat (median)")
        for load in loads:
            line = f"{load.key:8s}"
            for i in range(len(servers)):
                ratios = ceiling_ratios(rows, load.key, i)
                each = ", ".join(f"{r:.2f}" for r in ratios)
                line += f"  v{i} {statistics.median(ratios):.2f}x ({each})"
            print(line)
    if args.json:
        args.json.write_text(json.dumps({"variants": args.variant, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
