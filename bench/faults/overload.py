"""Overload and deadlines: text 1x1, text 32x1 and images at 1 x, 2 x, 3 x the sustainable rate.

One fresh server per configuration: the text model beside ``--clip``'s CLIP model as
``models.toml`` serves them, then with each ``--queue``. For each ``--load``, over gRPC:
the sustainable rate (the best closed loop of ``--clients``), an open loop at 0.8 x it (the
latency reference), then Poisson open loops at each ``--factor`` x it, every request with
the client deadline and every answer checked against the rows its inputs get alone. Judged
as issue 46 states it: goodput >= 0.9 x sustainable, accepted p99 <= 2 x the 0.8 x run's,
refusals' p99 <= 50 ms, nothing past the deadline, no wrong vector. Writes
``bench/results/overload-cpu-<time>.json``; what the runs found: docs/operations.md.

    .venv/bin/python -m bench.faults.overload [--quick] [--load text1,images] [--queue 4 ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict
from functools import partial
from typing import Any

from bench.common import logger, write_results
from bench.faults import overload_loop as loop
from bench.faults.overload_loop import LOADS, Load
from bench.machine import CpuMonitor, machine_info
from bench.manifest import BUILD, CLIP_MODEL, ROOT, bench_manifest, parse_overrides, served
from client.load import server_stats
from client.load.loadgen import LoadSpec, run_triton_load
from client.load.workload import text_pool
from generator.manifest import Manifest

REFERENCE_SHARE = 0.8
UNLOADED_SHARE = 0.1
TINY_CLIP = BUILD / "tiny-clip"
# Below, at and a few times above the rows per execution at saturation (3-6 measured
# here), one far above, and one with a queue timeout.
DEFAULT_QUEUES = ("1", "4", "16", "0", "4:10000")
# On 2 cores the server would keep one; pinned that way (2026-11-27) it did worse than shared.
AUTO_PIN_CORES = 4


log = logger("overload")


def parse_queue(value: str) -> dict[str, int] | None:
    """``N`` or ``N:T``: ``max_queue_size`` N, ``queue_timeout_us`` T, admission off; ``none``."""
    if value == "none":
        return None
    size, _, timeout = value.partition(":")
    return {
        "max_queue_size": int(size),
        "queue_timeout_us": int(timeout or 0),
        "admission_wait_us": 0,
        "admission_max_rows": 0,
    }


def config_name(knobs: dict[str, int]) -> str:
    """``default``, ``unbounded``, ``queue-8`` or ``queue-8-timeout-20000us``."""
    if not knobs:
        return "default"
    name = f"queue-{knobs['max_queue_size']}" if knobs["max_queue_size"] else "unbounded"
    return name + (f"-timeout-{knobs['queue_timeout_us']}us" if knobs["queue_timeout_us"] else "")


def parse_loads(value: str) -> list[str]:
    """``text1,images`` -> the loads in :data:`LOADS` order; an unknown name exits."""
    names = {n.strip() for n in value.split(",") if n.strip()}
    if not names or names - set(LOADS):
        raise SystemExit(
            f"--load {value!r}: expected a comma-separated subset of {','.join(LOADS)}"
        )
    return [n for n in LOADS if n in names]


def parse_rates(value: str | None) -> dict[str, float]:
    """``text1=200,images=12.5`` -> the sustainable rates to use instead of measuring."""
    rates = {}
    for pair in (value or "").split(","):
        name, sep, rate = pair.partition("=")
        if not pair.strip():
            continue
        if not sep or name.strip() not in LOADS:
            raise SystemExit(f"--rate {value!r}: expected LOAD=REQ_PER_S,... of {LOADS}")
        rates[name.strip()] = float(rate)
    return rates


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options; the module's docstring heads the help."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.faults.overload",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--quick", action="store_true", help="4 s loads, short closed loops, no 10 %% run")
    add("--load", default=",".join(LOADS), type=parse_loads,
        help=f"loads, comma-separated (default {','.join(LOADS)})")
    add("--seconds", type=float, help="each loaded run (default 30, quick 4)")
    add("--reference-s", type=float, help="the 0.8 x run (default 20, quick 4)")
    add("--unloaded-s", type=float, help="the 10 %% run, 0 to skip (default 10, quick 0)")
    add("--factor", default="1,2,3",
        help="load / sustainable rate, comma-separated (default 1,2,3)")
    add("--clip", choices=("tiny", "vit-b-32"), default="tiny",
        help="the CLIP model of the images load (default tiny)")
    add("--send-deadline", action=argparse.BooleanOptionalAction, default=True,
        help="send the deadline as the request parameter deadline_unix_us too")
    add("--pin", default="auto", help="auto (from 4 cores up, the last quarter for the load "
        "generator), none, or SERVER_CPUS/CLIENT_CPUS like 0-2/3")
    add("--generator-nice", type=int, default=0,
        help="the load generator's nice value during the open loops (negative: ahead of "
        "the server, as a client on its own machine is; default 0)")
    add("--rate", type=parse_rates, default={}, metavar="LOAD=REQ_PER_S,...",
        help="use these sustainable rates, skip measuring them")
    add("--queue", action="append", type=parse_queue, metavar="N[:TIMEOUT_US]",
        help="a configuration beside the default (repeatable; 0: unbounded; none: the "
        "default alone; default 1, 4, 16, 0, 4:10000)")
    add("--set", action="append", default=[], metavar="KEY=VALUE",
        help="a serving knob of the text model in every configuration")
    add("--clients", default="8,16,32", help="closed-loop concurrencies")
    add("--deadline-s", type=float, default=5.0, help="client deadline")
    add("--senders", type=int, default=2, help="open-loop sender threads")
    add("--pool", type=int, default=512, help="distinct sentences")
    args = parser.parse_args(argv)
    quick = args.quick
    args.seconds = args.seconds or (4.0 if quick else 30.0)
    args.reference_s = args.reference_s or (4.0 if quick else 20.0)
    args.unloaded_s = args.unloaded_s if args.unloaded_s is not None else (0.0 if quick else 10.0)
    args.queue = [q for q in args.queue or map(parse_queue, DEFAULT_QUEUES) if q is not None]
    args.clients = [int(c) for c in args.clients.split(",")]
    args.factor = [float(f) for f in str(args.factor).split(",")]
    args.pin = cpu_split(args.pin, sorted(os.sched_getaffinity(0)))
    return args


def _cpus(text: str) -> list[int]:
    """``0-2,5`` -> ``[0, 1, 2, 5]``."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def cpu_split(spec: str, cpus: list[int]) -> dict[str, list[int]] | None:
    """The server's and the load generator's cores for ``--pin`` (``None``: not pinned)."""
    if spec == "none" or (spec == "auto" and len(cpus) < AUTO_PIN_CORES):
        return None
    if spec == "auto":
        client = max(1, len(cpus) // 4)
        return {"server": cpus[:-client], "load_generator": cpus[-client:]}
    server, sep, client = spec.partition("/")
    split = {"server": _cpus(server), "load_generator": _cpus(client)} if sep else None
    if not split or set(split["server"]) & set(split["load_generator"]):
        raise SystemExit(f"--pin {spec!r}: expected auto, none or SERVER/CLIENT, disjoint")
    return split


@contextmanager
def generator_priority(nice: int):
    """Every thread of this process, and those it starts in the block, at ``nice``; 0 after."""
    if not nice:
        yield
        return

    def renice(value: int) -> None:
        for tid in os.listdir("/proc/self/task"):
            try:
                os.setpriority(os.PRIO_PROCESS, int(tid), value)
            except (ProcessLookupError, PermissionError):
                pass  # a thread that ended; or not allowed (the run's records say nice)

    renice(nice)
    try:
        yield
    finally:
        renice(0)


def overload_manifest(args: argparse.Namespace, knobs: dict[str, int]) -> Manifest:
    """The bench manifest of one configuration: ``knobs`` on both models, ``--set`` on text."""
    text = {**parse_overrides(args.set), **knobs}
    if "images" not in args.load:
        return bench_manifest(with_clip=False, text_overrides=text)
    clip: dict[str, Any] = {}
    if args.clip == "tiny":  # the clip-tiny stand-in, its checkpoint written once
        checkpoint = TINY_CLIP / "open_clip_pytorch_model.bin"
        if not checkpoint.is_file():
            from generator.fixtures.tiny_clip import create_tiny_checkpoint

            create_tiny_checkpoint(checkpoint, seed=0)
        clip = {"name": "clip-tiny", "arch": str(TINY_CLIP / "tiny-clip.json"),
                "checkpoint": str(checkpoint)}
    return bench_manifest(text_overrides=text, image_overrides={**clip, **knobs})


def sustainable_rate(args: argparse.Namespace, url: str, load: Load, results: dict) -> float:
    """``load``'s sustainable rate: given, measured before, or its best closed loop now."""
    known = results["sustainable"].setdefault(load.name, {})
    if "rate" in known:
        return known["rate"]
    rate = args.rate.get(load.name)
    if rate is None:
        seconds = 2.0 if args.quick else 10.0
        known["closed_loop"] = []
        for c in load.closed_loop_clients(args.clients):
            per_client = int(1500 * seconds / c) + 10
            spec = LoadSpec(
                c, len(load.requests[0]), per_client, warmup_requests=2, max_seconds=seconds
            )
            requests = [load.requests[k % len(load.requests)] for k in range(c * (per_client + 2))]
            result = run_triton_load(url, "grpc", load.model, load.input_name, requests, spec)
            encode = [s for s in result.server if s.name.startswith(f"{load.base}_encode")]
            rows = round(encode[0].avg_batch_size, 1) if encode else None
            known["closed_loop"].append(
                {
                    "clients": c,
                    "req_per_s": round(result.qps, 2),
                    "p50_ms": round(result.median_ms, 2),
                    "p99_ms": round(result.p99_ms, 2),
                    "errors": result.errors,
                    "rows_per_execution": rows,
                }
            )
            log(
                f"{load.name} closed loop {c:3d} clients: {result.qps:7.1f} req/s, p50 "
                f"{result.median_ms:.1f} ms, p99 {result.p99_ms:.1f} ms, rows/exec {rows}, "
                f"errors {result.errors}"
            )
        rate = max(c["req_per_s"] for c in known["closed_loop"])
    known["rate"] = rate
    return rate


def run_config(
    args: argparse.Namespace, knobs: dict[str, int], loads: Sequence[Load], results: dict
) -> None:
    """Serve one configuration; for each load: (sustainable), 0.8 x, (10 %), each factor."""
    name = config_name(knobs)
    with ExitStack() as stack:
        manifest = overload_manifest(args, knobs)
        if args.pin:  # the server and its stubs inherit the launching thread's cores
            os.sched_setaffinity(0, args.pin["server"])
        try:
            server = stack.enter_context(served(manifest, f"overload-{name}", log=log))
        finally:
            if args.pin:
                os.sched_setaffinity(0, args.pin["load_generator"])
        keys = ("max_queue_size", "queue_timeout_us", "admission_wait_us")
        knobs_of = {m.name: {k: getattr(m, k) for k in keys} for m in manifest.models}
        url, pid = server.url(), server.pid
        refs = loop.references(url, loads)
        for load in loads:
            expected = partial(loop.expected_rows, refs[load.source], load.rows)
            rate = sustainable_rate(args, url, load, results)
            base = {
                "config": name,
                "knobs": knobs_of.get(load.base, {}),
                "load": load.name,
                "model": load.model,
                "sustainable": rate,
            }
            with generator_priority(args.generator_nice):
                ref, unloaded = latency_reference(args, url, load, expected, rate)
            results["references"].append({**base, "at_0.8x": ref, "unloaded": unloaded})
            log(
                f"{name} {load.name}: at 0.8 x ({REFERENCE_SHARE * rate:.1f} req/s) accepted "
                f"{ref['accepted_ms']}, refused {ref['refused']}, wrong {ref['wrong']}"
            )
            for factor in args.factor:
                with generator_priority(args.generator_nice):
                    run = overload(args, url, pid, load, expected, factor * rate)
                loop.judge(run, rate, ref["accepted_ms"])
                record = {**base, "factor": factor, **run}
                results["records"].append(record)
                print(loop.describe(record), flush=True)


def latency_reference(
    args: argparse.Namespace, url: str, load: Load, expected: Callable[[int], Any], rate: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The open loop at 0.8 x ``rate`` (the judged reference) and at 10 % (``{}`` if 0 s)."""

    def run(share: float, seconds: float, senders: int, seed: int) -> dict[str, Any]:
        if not seconds:
            return {}
        shots, sent_s = loop.open_loop(
            url, load, share * rate, seconds, args.deadline_s, senders, seed, args.send_deadline
        )
        return loop.outcome(shots, expected, args.deadline_s, share * rate, sent_s)

    reference = run(REFERENCE_SHARE, args.reference_s, args.senders, 1)
    return reference, run(UNLOADED_SHARE, args.unloaded_s, 1, 3)


def overload(
    args: argparse.Namespace,
    url: str,
    pid: int,
    load: Load,
    expected: Callable[[int], Any],
    rate: float,
) -> dict[str, Any]:
    """The open loop at ``rate``, the server's statistics and CPU time, what it served after."""
    server, machine = CpuMonitor(pid), CpuMonitor()
    before, cpu = server_stats.snapshot(url, "grpc"), os.times()
    server.start()
    machine.start()
    shots, sent_s = loop.open_loop(
        url, load, rate, args.seconds, args.deadline_s, args.senders, 2, args.send_deadline
    )
    window, cpu = machine.stop(), [b - a for a, b in zip(cpu, os.times(), strict=True)]
    result = loop.outcome(shots, expected, args.deadline_s, rate, sent_s)
    after = server_stats.snapshot(url, "grpc")
    result["server"] = [
        asdict(s) for s in server_stats.window_stats(before, after) if s.name.startswith(load.base)
    ]
    generator = cpu[0] + cpu[1]
    result["cpu_s"] = {
        "seconds": round(window.seconds, 1),
        "server": round(server.stop().own_busy_s, 1),
        "load_generator": round(generator, 1),
        "other": round(max(window.total_busy_s - window.own_busy_s, 0.0), 1),
    }
    cores = os.cpu_count() or 1
    result["load_generator_cpu_share"] = loop.cpu_share(generator, window.seconds, cores)
    result["served_after_s"], result["served_after"] = settle(url, load.model, after)
    return result


def settle(
    url: str, model: str, since: server_stats.Snapshot, limit_s: float = 300.0
) -> tuple[float, int]:
    """Seconds until ``model`` stops serving (no new request for 2 s), requests served."""

    def answered(snap: server_stats.Snapshot) -> int:
        return sum(
            int((s.get("inference_stats") or {}).get(k, {}).get("count", 0))
            for name, s in snap.items()
            if name.startswith(f"{model}:")
            for k in ("success", "fail")
        )

    start, last, count = time.monotonic(), time.monotonic(), answered(since)
    while time.monotonic() - last < 2.0 and time.monotonic() - start < limit_s:
        time.sleep(0.5)
        now = answered(server_stats.snapshot(url, "grpc"))
        if now != count:
            count, last = now, time.monotonic()
    return round(last - start, 1), count - answered(since)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure every configuration; write the results file and print the table."""
    args = parse_args(argv)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    clip = "clip-tiny" if args.clip == "tiny" else CLIP_MODEL
    results: dict[str, Any] = {
        "meta": {
            "started": started,
            "args": vars(args),
            "machine": machine_info(),
            "command": "python -m bench.faults.overload " + " ".join(sys.argv[1:]),
            "clip_model": clip if "images" in args.load else None,
        },
        "sustainable": {},
        "references": [],
        "records": [],
    }
    if args.pin:
        os.sched_setaffinity(0, args.pin["load_generator"])
    results["meta"]["affinity"] = args.pin
    sentences = text_pool(args.pool)
    images = list(loop.photos().values()) if "images" in args.load else []
    loads = loop.make_loads(args.load, sentences, clip, images)
    for knobs in [{}, *args.queue]:
        run_config(args, knobs, loads, results)
    name = f"overload-cpu-{'quick-' if args.quick else ''}{started.replace(':', '')}"
    path = write_results(results, name, args.quick)
    rates = {k: v["rate"] for k, v in results["sustainable"].items()}
    print(
        f"sustainable req/s {rates}; cores {args.pin or 'shared'}; {args.seconds} s loads, "
        f"deadline {args.deadline_s} s{' sent as a parameter' if args.send_deadline else ''}:"
    )
    print(loop.table(results["records"]))
    log(f"results: {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
