"""Overload and deadlines: text 1x1, text 32x1 and images at 1 x, 2 x, 3 x the sustainable rate.

One fresh repository and server per configuration: the text model as ``models.toml``
serves it (the profile's bounded queue, ``default``) beside a CLIP model (``--clip``:
``tiny``, the ``clip-tiny`` stand-in ``make serve`` serves, or ``vit-b-32``, the bench's
full-size random-init ViT-B-32), then with ``max_queue_size`` N (0: unbounded; optionally
``queue_timeout_us`` T) on the steps of both. Against each, over gRPC, for each ``--load``
(:mod:`bench.faults.overload_loads`: ``text1``, ``text32``, ``images``):

1. reference: every sentence and every photo once, alone; the rows each loaded answer
   must match (max abs diff <= 1e-5);
2. sustainable rate (first configuration only, then kept): the best closed-loop
   throughput of ``--clients`` (a quarter of each for ``text32``) in requests/s of the
   load's own requests (:func:`client.load.loadgen.run_triton_load`);
3. latency reference: an open loop at 0.8 x the sustainable rate, its accepted p50 / p99
   (and, with ``--unloaded-s``, one at 10 %, for the record);
4. overload: an open loop (Poisson arrivals, async gRPC, ``--senders`` threads) at each
   ``--factor`` (1, the control, 2 and 3) x the sustainable rate for ``--seconds`` (30).
   Every request carries the client deadline (``--deadline-s``) as the gRPC
   ``client_timeout`` and, with ``--send-deadline`` (on), as the request parameter
   ``deadline_unix_us``.

Each (configuration, load, factor) is judged as issue 46 states it
(:mod:`bench.faults.overload_figures`): goodput >= 0.9 x sustainable, accepted p99
<= 2 x the 0.8 x run's p99, refusals' p99 <= 50 ms, no answer past the deadline, no wrong
vector; with the load generator's share of the machine's CPU.

``--pin`` (default ``auto``) keeps the load generator off the server's cores, as
``taskset`` would: the server (and every stub it starts, whose ONNX Runtime sizes its
threads from the cores it may use) gets all cores but the last quarter, the generator
the rest. ``auto`` pins only from 4 cores up: on 2 cores the server would keep one, and
measured that way (2026-11-27) it did worse than sharing both. ``none`` shares every
core; ``SERVER/CLIENT`` (``0-2/3``) names them.

Writes ``bench/results/overload-cpu-<time>.json`` (``.build/bench-results`` with
``--quick``): one record per (configuration, load, factor), and prints their table.

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
from bench.faults.overload_args import config_name, parse_args
from bench.faults.overload_figures import cpu_share, judge, outcome, table
from bench.faults.overload_loads import (
    Load,
    expected_rows,
    make_loads,
    open_loop,
    photos,
    references,
)
from bench.machine import CpuMonitor, machine_info
from bench.manifest import BUILD, CLIP_MODEL, ROOT, bench_manifest, parse_overrides, served
from client.load import server_stats
from client.load.loadgen import LoadSpec, run_triton_load
from client.load.workload import text_pool
from generator.manifest import Manifest

REFERENCE_SHARE = 0.8
UNLOADED_SHARE = 0.1
TINY_CLIP = BUILD / "tiny-clip"


log = logger("overload")


@contextmanager
def generator_priority(nice: int):
    """Every thread of this process (the load generator) at ``nice`` for the block.

    Linux keeps a nice value per thread, and a new thread takes its creator's: threads
    started inside the block (senders, gRPC's) get ``nice`` too. Set back to 0 after, so a
    server started later does not inherit it.
    """
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


def clip_entry(clip: str) -> dict[str, Any]:
    """The CLIP model's manifest keys for ``--clip`` (``tiny``: its checkpoint written once)."""
    if clip == "vit-b-32":
        return {}
    checkpoint = TINY_CLIP / "open_clip_pytorch_model.bin"
    if not checkpoint.is_file():
        from generator.fixtures.tiny_clip import create_tiny_checkpoint

        create_tiny_checkpoint(checkpoint, seed=0)
    return {
        "name": "clip-tiny",
        "arch": str(TINY_CLIP / "tiny-clip.json"),
        "checkpoint": str(checkpoint),
    }


def overload_manifest(args: argparse.Namespace, knobs: dict[str, int]) -> Manifest:
    """The bench manifest of one configuration: ``knobs`` on both models, ``--set`` on text."""
    text = {**parse_overrides(args.set), **knobs}
    if "images" not in args.load:
        return bench_manifest(with_clip=False, text_overrides=text)
    return bench_manifest(text_overrides=text, image_overrides={**clip_entry(args.clip), **knobs})


def sustainable(url: str, load: Load, clients: Sequence[int], seconds: float) -> list[dict]:
    """Closed-loop throughput of ``load``'s requests at each of its concurrencies.

    ``clients`` as given for one-row requests, a quarter of each for 32-row ones
    (:meth:`Load.closed_loop_clients`).
    """
    found = []
    for c in load.closed_loop_clients(clients):
        per_client = int(1500 * seconds / c) + 10
        spec = LoadSpec(
            c, len(load.requests[0]), per_client, warmup_requests=2, max_seconds=seconds
        )
        requests = [load.requests[k % len(load.requests)] for k in range(c * (per_client + 2))]
        result = run_triton_load(url, "grpc", load.model, load.input_name, requests, spec)
        encode = [s for s in result.server if s.name.startswith(f"{load.base}_encode")]
        found.append(
            {
                "clients": c,
                "req_per_s": round(result.qps, 2),
                "p50_ms": round(result.median_ms, 2),
                "p99_ms": round(result.p99_ms, 2),
                "errors": result.errors,
                "rows_per_execution": round(encode[0].avg_batch_size, 1) if encode else None,
            }
        )
        log(
            f"{load.name} closed loop {c:3d} clients: {result.qps:7.1f} req/s, p50 "
            f"{result.median_ms:.1f} ms, p99 {result.p99_ms:.1f} ms, rows/exec "
            f"{found[-1]['rows_per_execution']}, errors {result.errors}"
        )
    return found


def run_config(
    args: argparse.Namespace,
    knobs: dict[str, int],
    loads: Sequence[Load],
    inputs: dict[str, Any],
    results: dict,
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
        knobs_of = {
            m.name: {
                "max_queue_size": m.max_queue_size,
                "queue_timeout_us": m.queue_timeout_us,
                "admission_wait_us": m.admission_wait_us,
            }
            for m in manifest.models
        }
        url, pid = server.url(), server.pid
        refs = references(url, loads, inputs["sentences"], inputs["images"])
        for load in loads:
            expected = partial(expected_rows, refs[load.source], load.rows)
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
                judge(run, rate, ref["accepted_ms"])
                record = {**base, "factor": factor, **run}
                results["records"].append(record)
                print(describe(record), flush=True)


def latency_reference(
    args: argparse.Namespace, url: str, load: Load, expected: Callable[[int], Any], rate: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The open loop at 0.8 x ``rate`` (the judged reference) and at 10 % (``{}`` if 0 s)."""
    runs = []
    for share, seconds, senders, seed in (
        (REFERENCE_SHARE, args.reference_s, args.senders, 1),
        (UNLOADED_SHARE, args.unloaded_s, 1, 3),
    ):
        if not seconds:
            runs.append({})
            continue
        shots, sent_s = open_loop(
            url, load, share * rate, seconds, args.deadline_s, senders, seed, args.send_deadline
        )
        runs.append(outcome(shots, expected, args.deadline_s, share * rate, sent_s))
    return runs[0], runs[1]


def sustainable_rate(args: argparse.Namespace, url: str, load: Load, results: dict) -> float:
    """``load``'s sustainable rate: given, measured before, or measured now."""
    known = results["sustainable"].setdefault(load.name, {})
    if "rate" not in known:
        rate = args.rate.get(load.name)
        if rate is None:
            known["closed_loop"] = sustainable(url, load, args.clients, 2.0 if args.quick else 10.0)
            rate = max(c["req_per_s"] for c in known["closed_loop"])
        known["rate"] = rate
    return known["rate"]


def overload(
    args: argparse.Namespace,
    url: str,
    pid: int,
    load: Load,
    expected: Callable[[int], Any],
    rate: float,
) -> dict[str, Any]:
    """The open loop at ``rate``, with the server's statistics and CPU time of the window.

    After the last answer (or deadline) the server is watched until it has stopped
    serving: with an unbounded queue it goes on with requests whose clients gave up.
    """
    server, machine = CpuMonitor(pid), CpuMonitor()
    before, cpu = server_stats.snapshot(url, "grpc"), os.times()
    server.start()
    machine.start()
    shots, sent_s = open_loop(
        url, load, rate, args.seconds, args.deadline_s, args.senders, 2, args.send_deadline
    )
    window, cpu = machine.stop(), [b - a for a, b in zip(cpu, os.times(), strict=True)]
    result = outcome(shots, expected, args.deadline_s, rate, sent_s)
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
    result["load_generator_cpu_share"] = cpu_share(generator, window.seconds, os.cpu_count() or 1)
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


def describe(run: dict[str, Any]) -> str:
    """A few lines per (configuration, load, factor)."""
    lines = [
        f"== {run['config']} {run['load']} at {run['factor']:g} x "
        f"({run['target_rate']} req/s of sustainable {run['sustainable']}):",
        f"   sent {run['sent']} at {run['send_rate']}/s (lag p99 "
        f"{run['send_lag_ms'].get('p99')} ms); accepted {run['accepted']}, good {run['good']} "
        f"({run['goodput']}/s = {run['goodput_ratio']} x), refused {run['refused']}, past "
        f"deadline {run['past_deadline']}, other errors {run['other_errors']}, no answer "
        f"{run['no_answer']}",
        f"   accepted ms {run['accepted_ms']} = p50 {run['accepted_p50_ratio']} x, p99 "
        f"{run['accepted_p99_ratio']} x the 0.8 x run; refused ms {run['refused_ms']}; wrong "
        f"{run['wrong']} (max abs diff {run['max_abs_diff']:.1e})",
    ]
    lines += [f"   status {count:6d}  {status}" for status, count in run["statuses"].items()]
    lines += [
        f"   server {s['name']}: {s['success_count']} ok, {s['fail_count']} failed, "
        f"{s['inference_count'] / max(s['execution_count'], 1):.1f} rows/exec, queue "
        f"{s['avg_queue_ms']:.1f} ms, infer {s['avg_compute_infer_ms']:.1f} ms"
        for s in run["server"]
        if "encode" in s["name"]
    ]
    lines += [
        f"   server {s['name']}: {s['fail_count']} failed after {s['avg_fail_ms']:.1f} ms "
        "on average (receipt to refusal, inside the server)"
        for s in run["server"]
        if s["fail_count"] and s["name"] == run["model"]
    ]
    lines.append(
        f"   cpu s {run['cpu_s']} (load generator {run['load_generator_cpu_share']:.0%}"
        f" of the machine); served after the loop {run['served_after']} requests "
        f"over {run['served_after_s']} s"
    )
    lines.append(f"   goal: {run['goal']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure every configuration; write the results file and print the table."""
    args = parse_args(argv, __doc__)
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
    images = list(photos().values()) if "images" in args.load else []
    loads = make_loads(args.load, sentences, clip, images)
    for knobs in [{}, *args.queue]:
        run_config(args, knobs, loads, {"sentences": sentences, "images": images}, results)
    stamp = started.replace(":", "")
    name = f"overload-cpu-{'quick-' if args.quick else ''}{stamp}"
    path = write_results(results, name, args.quick)
    rates = {k: v["rate"] for k, v in results["sustainable"].items()}
    print(
        f"sustainable req/s {rates}; cores {args.pin or 'shared'}; {args.seconds} s loads, "
        f"deadline {args.deadline_s} s{' sent as a parameter' if args.send_deadline else ''}:"
    )
    print(table(results["records"]))
    log(f"results: {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
