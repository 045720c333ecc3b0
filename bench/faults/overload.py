"""Overload and deadlines: all-MiniLM-L6-v2 at 2 x and 3 x its sustainable rate, by queue size.

One fresh repository and server per configuration: the text model as ``models.toml``
serves it (the profile's bounded queue, ``default``), then with ``max_queue_size`` N
(0: unbounded; optionally ``queue_timeout_us`` T) on its steps. Against each, single
sentences over gRPC:

1. reference: every pool sentence once, one at a time; the vector each loaded answer
   must match (max abs diff <= 1e-5);
2. sustainable rate (first configuration only): the best closed-loop throughput of
   ``--clients`` (:func:`client.load.loadgen.run_triton_load`);
3. unloaded: an open loop at 10 % of the sustainable rate, its p50 / p99;
4. overload: an open loop (Poisson arrivals, async gRPC, ``--senders`` threads) at
   each ``--factor`` (2 and 3) x the sustainable rate for ``--seconds`` (30); every request
   carries a client deadline (``--deadline-s``); answers still missing after it count as
   hung.

``--pin`` (default ``auto``) keeps the load generator off the server's cores, as
``taskset`` would: the server (and every stub it starts, whose ONNX Runtime sizes its
threads from the cores it may use) gets all cores but the last quarter, the generator
the rest. ``auto`` pins only from 4 cores up: on 2 cores the server would keep one, and
measured that way (2026-11-27) it did worse than sharing both. ``none`` shares every
core; ``SERVER/CLIENT`` (``0-2/3``) names them.

The goal (the faults issue): accepted p99 <= 2 x unloaded p99, every refusal back in
< 50 ms, no wrong vector, nothing past its deadline. Writes
``bench/results/overload-cpu-<time>.json`` (``.build/bench-results`` with ``--quick``).

    .venv/bin/python -m bench.faults.overload [--quick] [--queue 4 --queue 16:20000 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import numpy as np

from bench.common import logger
from bench.machine import CpuMonitor, machine_info
from bench.manifest import BUILD, ROOT, TEXT_MODEL, bench_manifest, parse_overrides
from client.load import server_stats
from client.load.loadgen import LoadSpec, run_triton_load
from client.load.workload import text_pool, text_requests
from generator.admin import KEY_ENV
from generator.build import build_repository
from generator.manifest import Manifest
from generator.shared_models import startup_models
from generator.triton_local import TritonLaunch, TritonPorts, TritonProcess, free_ports

OUTPUT = "EMBEDDING"
ATOL = 1e-5
GOAL_P99_RATIO = 2.0
GOAL_REFUSAL_MS = 50.0
UNLOADED_SHARE = 0.1
REFUSED = "StatusCode.UNAVAILABLE"
DEADLINE = "StatusCode.DEADLINE_EXCEEDED"
# Below, at and a few times above the rows per execution at saturation (3-6 measured
# here), one far above, and one with a queue timeout.
DEFAULT_QUEUES = ("1", "4", "16", "0", "4:10000")
DEFAULT_FACTORS = "2,3"
AUTO_PIN_CORES = 4


log = logger("overload")


def start_server(
    manifest: Manifest, name: str, stack: ExitStack, log: Callable[[str], None] = log
) -> tuple[TritonPorts, int]:
    """Build ``manifest`` into ``.build/<name>/repo`` and serve it on free ports.

    Returns the ports and the server's PID; ``stack`` stops the server.
    """
    repo = BUILD / name / "repo"
    report = build_repository(manifest, repo, log=log)
    log(f"{name}: built {report.built or 'nothing'}, skipped {report.skipped}")
    ports = TritonPorts(*free_ports(3))
    key = os.environ.setdefault(KEY_ENV, secrets.token_urlsafe(32))
    launch = TritonLaunch(repo, ports, load_models=startup_models(manifest), admin_key=key)
    process = TritonProcess(launch, BUILD / name / "work").start()
    stack.callback(process.stop)
    process.wait_ready(timeout_s=300)
    log(f"{name}: triton ready, grpc {ports.grpc}, pid {process.process.pid}")
    return ports, process.process.pid


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50 / p99 / max of ``values`` (ms), rounded; empty -> ``{}``."""
    if not len(values):
        return {}
    a = np.asarray(values, dtype=np.float64)
    return {
        "p50": round(float(np.percentile(a, 50)), 2),
        "p99": round(float(np.percentile(a, 99)), 2),
        "max": round(float(a.max()), 2),
    }


@dataclass
class Shot:
    """One open-loop request: which sentence, when planned, sent and answered, and how."""

    item: int
    planned: float
    sent: float = 0.0
    done: float = 0.0
    status: str = ""
    result: Any = None

    def answer(self, result: Any, error: Any) -> None:
        """The ``async_infer`` callback (runs on a gRPC thread)."""
        if error is not None:
            self.status = f"{error.status()}: {error.message()}"
        self.result = result
        self.done = time.perf_counter()


class Texts:
    """The pool as prepared single-sentence ``InferInput`` objects, built once."""

    def __init__(self, sentences: Sequence[str]):
        """Encode every sentence as a ``TEXT`` tensor of shape ``[1, 1]``."""
        import tritonclient.grpc as grpcclient

        self.sentences = list(sentences)
        self.inputs = []
        for text in self.sentences:
            item = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
            item.set_data_from_numpy(np.array([[text.encode()]], dtype=object))
            self.inputs.append(item)
        self.output = grpcclient.InferRequestedOutput(OUTPUT)


def reference(url: str, texts: Texts) -> np.ndarray:
    """Every sentence's vector from ``url``, one request at a time (the unloaded answer)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    try:
        rows = [
            client.infer(TEXT_MODEL, [item], outputs=[texts.output], client_timeout=60.0)
            .as_numpy(OUTPUT)[0]
            for item in texts.inputs
        ]
    finally:
        client.close()
    return np.stack(rows)


def open_loop(
    url: str, texts: Texts, rate: float, seconds: float, deadline_s: float, senders: int, seed: int
) -> tuple[list[Shot], float]:
    """Poisson arrivals at ``rate``/s for ``seconds``, split over ``senders`` threads.

    Each thread has its own gRPC channel and sends its share of the arrivals with
    ``async_infer`` (never waiting for an answer); answers are timed by the callback.
    Returns every shot and the wall time from the first plan to the last send.
    """
    import tritonclient.grpc as grpcclient

    rng = np.random.default_rng(seed)
    count = max(int(rate * seconds), 1)
    gaps = rng.exponential(1.0 / rate, count)
    picks = rng.integers(0, len(texts.inputs), count)
    start = time.perf_counter() + 0.2
    shots = [Shot(int(i), start + t) for i, t in zip(picks, np.cumsum(gaps) - gaps[0], strict=True)]
    clients = [grpcclient.InferenceServerClient(url) for _ in range(senders)]

    def send(index: int) -> None:
        client = clients[index]
        for shot in shots[index::senders]:
            wait = shot.planned - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            shot.sent = time.perf_counter()
            client.async_infer(
                TEXT_MODEL,
                [texts.inputs[shot.item]],
                partial(Shot.answer, shot),
                outputs=[texts.output],
                client_timeout=deadline_s,
            )

    threads = [threading.Thread(target=send, args=(i,), daemon=True) for i in range(senders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sent_s = max(s.sent for s in shots) - start
    limit = time.perf_counter() + deadline_s + 5.0
    while any(not s.done for s in shots) and time.perf_counter() < limit:
        time.sleep(0.1)
    for client in clients:
        client.close()
    return shots, sent_s


def outcome(shots: list[Shot], ref: np.ndarray, rate: float, sent_s: float) -> dict[str, Any]:
    """Counts, latencies (ms) and correctness of one open-loop run."""
    accepted, refused, late, failed, wrong = [], [], [], [], 0
    statuses: Counter[str] = Counter()
    worst = 0.0
    for shot in shots:
        ms = (shot.done - shot.sent) * 1000.0
        if not shot.done:
            statuses["no answer"] += 1
            continue
        if shot.status:
            statuses[shot.status[:120]] += 1
            bucket = refused if shot.status.startswith(REFUSED) else failed
            (late if shot.status.startswith(DEADLINE) else bucket).append(ms)
            continue
        accepted.append(ms)
        vector = shot.result.as_numpy(OUTPUT)
        diff = np.abs(vector[0] - ref[shot.item]).max() if vector.shape == (1, ref.shape[1]) else 1
        worst = max(worst, float(diff))
        wrong += int(diff > ATOL)
    lag = [(s.sent - s.planned) * 1000.0 for s in shots]
    span = max(s.done for s in shots) - shots[0].planned
    return {
        "target_rate": round(rate, 1),
        "send_rate": round(len(shots) / sent_s, 1) if sent_s > 0 else 0.0,
        "send_lag_ms": percentiles(lag),
        "sent": len(shots),
        "accepted": len(accepted),
        "refused": len(refused),
        "past_deadline": len(late),
        "other_errors": len(failed),
        "no_answer": statuses["no answer"],
        "goodput": round(len(accepted) / span, 1) if span > 0 else 0.0,
        "statuses": dict(statuses.most_common()),
        "accepted_ms": percentiles(accepted),
        "refused_ms": percentiles(refused),
        "past_deadline_ms": percentiles(late),
        "wrong": wrong,
        "max_abs_diff": worst,
    }


def judge(run: dict[str, Any], unloaded_p99: float) -> None:
    """Add the issue's goal, part by part, to an overload ``run``."""
    acc, refused = run["accepted_ms"], run["refused_ms"]
    run["accepted_p99_vs_unloaded"] = round(acc["p99"] / unloaded_p99, 2) if acc else None
    goal = {
        "accepted_p99_within_2x": bool(acc) and acc["p99"] <= GOAL_P99_RATIO * unloaded_p99,
        "refusals_under_50ms": not refused or refused["max"] < GOAL_REFUSAL_MS,
        "no_wrong": run["wrong"] == 0 and run["other_errors"] == 0,
        "nothing_hung": run["past_deadline"] + run["no_answer"] == 0,
    }
    run["goal"] = {**goal, "met": all(goal.values())}


def sustainable(url: str, pool: list[str], clients: Sequence[int], seconds: float) -> list[dict]:
    """Closed-loop throughput of single sentences at each concurrency in ``clients``."""
    found = []
    for c in clients:
        per_client = int(1500 * seconds / c) + 10
        spec = LoadSpec(c, 1, per_client, warmup_requests=2, max_seconds=seconds)
        requests = text_requests(pool, 1, c * (per_client + 2))
        result = run_triton_load(url, "grpc", TEXT_MODEL, "TEXT", requests, spec)
        encode = [s for s in result.server if s.name.endswith("_encode")]
        found.append({
            "clients": c,
            "req_per_s": round(result.qps, 1),
            "p50_ms": round(result.median_ms, 2),
            "p99_ms": round(result.p99_ms, 2),
            "errors": result.errors,
            "rows_per_execution": round(encode[0].avg_batch_size, 1) if encode else None,
        })
        log(f"closed loop {c:3d} clients: {result.qps:7.1f} req/s, p50 {result.median_ms:.1f} ms, "
            f"p99 {result.p99_ms:.1f} ms, rows/exec {found[-1]['rows_per_execution']}")
    return found


def parse_queue(value: str) -> dict[str, int]:
    """``N`` or ``N:T``: ``max_queue_size`` N, ``queue_timeout_us`` T."""
    size, _, timeout = value.partition(":")
    return {"max_queue_size": int(size), "queue_timeout_us": int(timeout or 0)}


def config_name(knobs: dict[str, int]) -> str:
    """``default``, ``unbounded``, ``queue-8`` or ``queue-8-timeout-20000us``."""
    if not knobs:
        return "default"
    name = f"queue-{knobs['max_queue_size']}" if knobs["max_queue_size"] else "unbounded"
    return name + (f"-timeout-{knobs['queue_timeout_us']}us" if knobs["queue_timeout_us"] else "")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(prog="python -m bench.faults.overload", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="5 s loads, short warm-ups")
    parser.add_argument("--seconds", type=float, help="overload duration (default 30, quick 5)")
    parser.add_argument("--factor", default=DEFAULT_FACTORS,
                        help="overload / sustainable rate, comma-separated (default 2,3)")
    parser.add_argument("--pin", default="auto",
                        help="auto, none, or SERVER_CPUS/CLIENT_CPUS like 0-2/3")
    parser.add_argument("--rate", type=float, help="use this sustainable rate, skip measuring")
    parser.add_argument("--queue", action="append", type=parse_queue, metavar="N[:TIMEOUT_US]",
                        help="a configuration beside the default (repeatable; 0: unbounded; "
                             "default 1, 4, 16, 0, 4:10000)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a serving knob of the text model in every configuration")
    parser.add_argument("--clients", default="8,16,32", help="closed-loop concurrencies")
    parser.add_argument("--deadline-s", type=float, default=5.0, help="client deadline")
    parser.add_argument("--senders", type=int, default=2, help="open-loop sender threads")
    parser.add_argument("--pool", type=int, default=512, help="distinct sentences")
    args = parser.parse_args(argv)
    args.seconds = args.seconds or (5.0 if args.quick else 30.0)
    args.queue = args.queue or [parse_queue(q) for q in DEFAULT_QUEUES]
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
    """The server's and the load generator's cores for ``--pin`` (``None``: not pinned).

    ``auto`` gives the generator the last quarter of ``cpus`` and the server the rest,
    from 4 cores up; under that the server needs every core, so ``auto`` pins nothing.
    """
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


def run_config(args, knobs: dict[str, int], texts: Texts, results: dict) -> None:
    """Serve one configuration; measure reference, (sustainable), unloaded and overload."""
    name = config_name(knobs)
    with ExitStack() as stack:
        overrides = {**parse_overrides(args.set), **knobs}
        manifest = bench_manifest(with_clip=False, text_overrides=overrides)
        if args.pin:  # the server and its stubs inherit the launching thread's cores
            os.sched_setaffinity(0, args.pin["server"])
        try:
            ports, pid = start_server(manifest, f"overload-{name}", stack)
        finally:
            if args.pin:
                os.sched_setaffinity(0, args.pin["load_generator"])
        knobs = {"max_queue_size": next(m.max_queue_size for m in manifest.models
                                        if m.name == TEXT_MODEL), **knobs}
        url = f"127.0.0.1:{ports.grpc}"
        ref = reference(url, texts)
        if not results["rate"]:
            closed = sustainable(url, texts.sentences, args.clients, 3.0 if args.quick else 10.0)
            results["closed_loop"] = closed
            results["rate"] = max(c["req_per_s"] for c in closed)
        rate = results["rate"]
        quiet_s = 5.0 if args.quick else 20.0
        shots, sent_s = open_loop(url, texts, UNLOADED_SHARE * rate, quiet_s, args.deadline_s,
                                  1, seed=1)
        unloaded = outcome(shots, ref, UNLOADED_SHARE * rate, sent_s)
        p99 = unloaded["accepted_ms"]["p99"]
        log(f"{name}: unloaded at {UNLOADED_SHARE * rate:.0f} req/s: "
            f"p50 {unloaded['accepted_ms']['p50']} ms, p99 {p99} ms")
        loaded = {}
        for factor in args.factor:
            loaded[f"{factor:g}x"] = overload(args, url, pid, texts, ref, factor * rate, p99)
            print(describe(f"{name} at {factor:g} x", unloaded, loaded[f"{factor:g}x"]),
                  flush=True)
    results["configs"].append({"name": name, "knobs": knobs, "unloaded": unloaded,
                               "overload": loaded})


def overload(args, url: str, pid: int, texts: Texts, ref: np.ndarray, rate: float,
             unloaded_p99: float) -> dict[str, Any]:
    """The open loop at ``rate``, with the server's statistics and CPU time of the window.

    After the last answer (or deadline) the server is watched until it has stopped
    serving: with an unbounded queue it goes on with requests whose clients gave up.
    """
    server, machine = CpuMonitor(pid), CpuMonitor()
    before, cpu = server_stats.snapshot(url, "grpc"), os.times()
    server.start()
    machine.start()
    shots, sent_s = open_loop(url, texts, rate, args.seconds, args.deadline_s, args.senders, 2)
    window, cpu = machine.stop(), [b - a for a, b in zip(cpu, os.times(), strict=True)]
    result = outcome(shots, ref, rate, sent_s)
    judge(result, unloaded_p99)
    after = server_stats.snapshot(url, "grpc")
    result["server"] = [asdict(s) for s in server_stats.window_stats(before, after)]
    result["cpu_s"] = {
        "seconds": round(window.seconds, 1),
        "server": round(server.stop().own_busy_s, 1),
        "load_generator": round(cpu[0] + cpu[1], 1),
        "other": round(max(window.total_busy_s - window.own_busy_s, 0.0), 1),
    }
    result["served_after_s"], result["served_after"] = settle(url, after)
    return result


def settle(url: str, since: server_stats.Snapshot, limit_s: float = 300.0) -> tuple[float, int]:
    """Seconds until the server stops serving (no new request for 2 s), requests served."""
    def served(snap: server_stats.Snapshot) -> int:
        return sum(int((s.get("inference_stats") or {}).get(k, {}).get("count", 0))
                   for name, s in snap.items() if name.startswith(f"{TEXT_MODEL}:")
                   for k in ("success", "fail"))

    start, last, count = time.monotonic(), time.monotonic(), served(since)
    while time.monotonic() - last < 2.0 and time.monotonic() - start < limit_s:
        time.sleep(0.5)
        now = served(server_stats.snapshot(url, "grpc"))
        if now != count:
            count, last = now, time.monotonic()
    return round(last - start, 1), count - served(since)


def describe(name: str, unloaded: dict, run: dict) -> str:
    """A few lines per configuration."""
    acc, ref = run["accepted_ms"], run["refused_ms"]
    lines = [
        f"== {name}: unloaded p50 {unloaded['accepted_ms']['p50']} ms, "
        f"p99 {unloaded['accepted_ms']['p99']} ms",
        f"   sent {run['sent']} at {run['send_rate']}/s (target {run['target_rate']}/s, "
        f"lag p99 {run['send_lag_ms'].get('p99')} ms); accepted {run['accepted']} "
        f"({run['goodput']}/s), refused {run['refused']}, past deadline {run['past_deadline']}, "
        f"other errors {run['other_errors']}, no answer {run['no_answer']}",
        f"   accepted ms {acc} = {run['accepted_p99_vs_unloaded']} x unloaded p99; "
        f"refused ms {ref}; wrong {run['wrong']} (max abs diff {run['max_abs_diff']:.1e})",
    ]
    lines += [f"   status {count:6d}  {status}" for status, count in run["statuses"].items()]
    lines += [
        f"   server {s['name']}: {s['success_count']} ok, {s['fail_count']} failed, "
        f"{s['inference_count'] / max(s['execution_count'], 1):.1f} rows/exec, queue "
        f"{s['avg_queue_ms']:.1f} ms, infer {s['avg_compute_infer_ms']:.1f} ms"
        for s in run["server"] if s["name"].endswith("_encode")
    ]
    lines.append(f"   cpu s {run['cpu_s']}; served after the loop {run['served_after']} "
                 f"requests over {run['served_after_s']} s")
    lines.append(f"   goal: {run['goal']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure every configuration; write the results file."""
    args = parse_args(argv)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results: dict[str, Any] = {
        "meta": {"started": started, "args": vars(args), "machine": machine_info(),
                 "command": "python -m bench.faults.overload " + " ".join(sys.argv[1:])},
        "rate": args.rate or 0.0,
        "configs": [],
    }
    if args.pin:
        os.sched_setaffinity(0, args.pin["load_generator"])
    results["meta"]["affinity"] = args.pin
    texts = Texts(text_pool(args.pool))
    for knobs in [{}, *args.queue]:
        run_config(args, knobs, texts, results)
    out = BUILD / "bench-results" if args.quick else ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"overload-cpu-{'quick-' if args.quick else ''}{started.replace(':', '')}.json"
    results["meta"]["results_file"] = str(path.relative_to(ROOT))
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(f"sustainable {results['rate']} req/s; cores {args.pin or 'shared'}; "
          f"goal for {args.seconds} s:")
    for config in results["configs"]:
        for factor, run in config["overload"].items():
            goal, ratio = run["goal"], run["accepted_p99_vs_unloaded"]
            missed = [k for k, ok in goal.items() if k != "met" and not ok]
            print(f"  {config['name']:28s} {factor:>5s} p99 {ratio} x  "
                  f"{'met' if goal['met'] else 'missed: ' + ', '.join(missed)}")
    log(f"results: {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
