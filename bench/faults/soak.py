"""Memory soak: steady mixed load for ``--minutes`` (10), resident memory sampled throughout.

    .venv/bin/python -m bench.faults.soak [--quick] [--minutes 10] [--clients 2]

Five closed gRPC loops against ``models.toml`` served as ``make serve`` does; RSS, PSS and USS
of Triton and each stub sampled (PSS rises when another process sharing pages exits; USS does
not). Goal: total RSS growth, first window after warm-up vs last, under 5 %.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import threading
import time
import tomllib
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import logger, write_results
from bench.faults.overload_loop import percentiles
from bench.machine import CpuMonitor, machine_info, memory, server_processes
from bench.manifest import ROOT, served
from bench.rerank.run import TritonRerankSender, rerank_requests
from client.load.loadgen import Sender, TritonSender
from client.load.workload import ImageServer, generated_images, image_requests, text_pool
from generator.manifest import Manifest, parse_manifest

GOAL_GROWTH = 0.05
KINDS = ("rss", "pss", "uss")
TEXT, CLIP, RERANK = "all-MiniLM-L6-v2", "clip-tiny", "rerank-tiny"
log = logger("soak")


def soak_manifest() -> Manifest:
    """``models.toml`` with 127.0.0.1 allowed to ``fetch_image`` (its path kept)."""
    data = tomllib.loads((ROOT / "models.toml").read_text())
    fetch = data.setdefault("fetch_image", {})
    fetch["allow_hosts"] = sorted({*fetch.get("allow_hosts", []), "127.0.0.1"})
    manifest = parse_manifest(data, ROOT, "soak manifest")
    return dataclasses.replace(manifest, path=ROOT / "models.toml")


@dataclass
class Load:
    """One closed loop: its senders, fixed requests (cycled) and what it achieved."""

    name: str
    factory: Callable[[], Sender]
    requests: list[list[bytes]]
    requests_done: int = 0
    items: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def drive(self, client: int, stop: threading.Event, pause_s: float, count: int = 0) -> None:
        """Send ``pause_s`` apart until ``stop`` or ``count`` sent; request k is ``client + k``."""
        sender = self.factory()
        prepared = [sender.prepare(r) for r in self.requests]
        k = client
        try:
            while not stop.is_set() and (not count or k < client + count):
                start = time.perf_counter()
                try:
                    rows, error = sender.send(prepared[k % len(prepared)]), ""
                except Exception as exc:  # noqa: BLE001 - counted per message
                    rows, error = 0, f"{type(exc).__name__}: {exc}"[:160]
                ms = (time.perf_counter() - start) * 1000.0
                with self.lock:
                    self.requests_done += 1
                    self.items += rows
                    if error:
                        self.errors[error] += 1
                    else:
                        self.latencies_ms.append(ms)
                k += 1
                stop.wait(pause_s)
        finally:
            sender.close()

    def largest(self, count: int) -> list[list[bytes]]:
        """The ``count`` requests with the most bytes: the shapes the load sends at most."""
        return sorted(self.requests, key=lambda r: sum(len(item) for item in r))[-count:]

    def summary(self, seconds: float) -> dict[str, Any]:
        """Requests, items, errors and latency over the run."""
        return {
            "requests": self.requests_done, "items": self.items,
            "req_per_s": round(self.requests_done / seconds, 2),
            "errors": sum(self.errors.values()), "error_samples": dict(self.errors.most_common(5)),
            "latency_ms": percentiles(self.latencies_ms),
        }


def mixed(pool: Sequence[Any], sizes: Sequence[int], count: int) -> list[list[Any]]:
    """``count`` requests cycling through ``sizes`` items each, consecutive from ``pool``."""
    out, first = [], 0
    for k in range(count):
        size = sizes[k % len(sizes)]
        out.append([pool[(first + j) % len(pool)] for j in range(size)])
        first += size
    return out


def make_loads(url: str, urls: list[str], photos: dict[str, bytes]) -> list[Load]:
    """The five loads, each over its own fixed requests."""
    def triton(model: str, name: str) -> Callable[[], Sender]:
        return lambda: TritonSender(url, model, name, "grpc")

    sentences = [text.encode() for text in text_pool()]
    images = [photos[n] for n in sorted(photos)]
    return [
        Load("text", triton(TEXT, "TEXT"), mixed(sentences, (1, 4, 16, 2, 8), 200)),
        Load("clip-text", triton(f"{CLIP}_text", "TEXT"), mixed(sentences, (1, 3), 200)),
        Load("clip-image", triton(f"{CLIP}_image", "IMAGE"), image_requests(images, 1, 24)
             + image_requests(images, 2, 12)),
        Load("clip-image-url", triton(f"{CLIP}_image_url", "IMAGE_URL"),
             image_requests([u.encode() for u in urls], 1, 24)),
        Load("rerank", lambda: TritonRerankSender(url, model=RERANK), rerank_requests(16)),
    ]


def warm_shapes(loads: list[Load], clients: int, rounds: int) -> dict[str, Any]:
    """Each load's largest requests from ``clients`` at once, ``rounds`` times, before t0.

    Arenas grow to the largest shape a step has seen; without this, growth measured when two
    clients' largest requests first met in a batch, not a leak. Requests and errors per load.
    """
    warm = [Load(load.name, load.factory, load.largest(2)) for load in loads]
    never = threading.Event()
    threads = [threading.Thread(target=w.drive, args=(0, never, 0.0, rounds * len(w.requests)))
               for w in warm for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {w.name: {"requests": w.requests_done, "errors": sum(w.errors.values())} for w in warm}


def sample(pid: int, t0: float, loads: list[Load]) -> dict[str, Any]:
    """One sample: time, every process's memory (KiB) and each load's requests so far."""
    procs = {name: {"pid": p, **memory(p)} for name, p in server_processes(pid).items()}
    return {"t": round(time.monotonic() - t0, 1), "procs": procs,
            "requests": {load.name: load.requests_done for load in loads}}


def growth(samples: list[dict], seconds: float) -> dict[str, Any]:
    """Per process and total: first window after warm-up vs last; second-half trend, last rise."""
    window = min(60.0, seconds / 5)
    first = [s for s in samples if window <= s["t"] < 2 * window]
    last = [s for s in samples if s["t"] >= seconds - window]
    names = sorted({n for s in samples for n in s["procs"]})

    def mean(rows: list[dict], name: str | None, key: str) -> float:
        values = [sum(p.get(key, 0) for n, p in s["procs"].items() if name in (None, n))
                  for s in rows]
        return float(np.mean(values)) if values else 0.0

    out: dict[str, Any] = {"window_s": window, "first": [window, 2 * window],
                           "last": [seconds - window, seconds], "processes": {}}
    for name in [None, *names]:
        row = out.setdefault("total", {}) if name is None else out["processes"].setdefault(name, {})
        for key in KINDS:
            a, b = mean(first, name, key), mean(last, name, key)
            row[key] = {"first_mib": round(a / 1024, 1), "last_mib": round(b / 1024, 1),
                        "growth": round((b - a) / a, 4) if a else None}
    middle = [s for s in samples if seconds / 2 <= s["t"] < seconds / 2 + window]
    out["second_half"] = {"first": [seconds / 2, seconds / 2 + window], **{
        key: round((mean(last, None, key) - mean(middle, None, key)) / mean(middle, None, key), 4)
        for key in KINDS if mean(middle, None, key)}}
    for name in names:
        peak, rose = 0, 0.0
        for s in samples:
            rss = s["procs"].get(name, {}).get("rss", 0)
            rose, peak = (s["t"] if rss > peak + 1024 else rose), max(peak, rss)
        out["processes"][name]["last_rise_s"] = rose
    half = [s for s in samples if s["t"] >= seconds / 2]
    if len(half) > 1:
        totals = [sum(p.get("rss", 0) for p in s["procs"].values()) / 1024 for s in half]
        slope = np.polyfit([s["t"] / 60 for s in half], totals, 1)[0]
        out["second_half_rss_mib_per_min"] = round(float(slope), 2)
    pids = {n: {s["procs"][n]["pid"] for s in samples if n in s["procs"]} for n in names}
    out["restarted"] = sorted(n for n, p in pids.items() if len(p) > 1)
    out["goal_met"] = (out["total"]["rss"]["growth"] or 0) < GOAL_GROWTH
    return out


def plot(samples: list[dict], result: dict, path: Path) -> str:
    """Total and per-process RSS over time into ``path``; returns what was written."""
    try:
        import matplotlib
    except ImportError:
        return "no plot: matplotlib is not installed (make bench installs it)"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t"] / 60 for s in samples]
    names = sorted({n for s in samples for n in s["procs"]})
    g = result["growth"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 8), sharex=True)
    for key in KINDS:
        total = [sum(p.get(key, 0) for p in s["procs"].values()) / 1024 for s in samples]
        top.plot(t, total, label=f"total {key.upper()} ({g['total'][key]['growth']:+.1%})")
    colours = plt.get_cmap("tab20").colors
    for i, name in enumerate(names):
        rss = [s["procs"].get(name, {}).get("rss", np.nan) / 1024 for s in samples]
        growth_ = g["processes"][name]["rss"]["growth"]
        label = name if growth_ is None else f"{name} ({growth_:+.1%})"
        bottom.plot(t, rss, label=label, color=colours[i % len(colours)])
    for axis in (top, bottom):
        for lo, hi in (g["first"], g["last"]):
            axis.axvspan(lo / 60, hi / 60, color="grey", alpha=0.12)
        axis.grid(alpha=0.3)
    top.set(ylabel="MiB, all processes", title="Memory soak: tritonserver and its Python-backend "
            "stubs (growth: last window vs first after warm-up, both shaded)")
    bottom.set(ylabel="RSS MiB per process", xlabel="minutes")
    top.legend(loc="lower right")
    bottom.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return f"plot: {path.relative_to(ROOT)}"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(prog="python -m bench.faults.soak", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="1 minute, nothing in docs/")
    parser.add_argument("--minutes", type=float, help="duration (default 10, quick 1)")
    parser.add_argument("--clients", type=int, default=2, help="clients per load")
    parser.add_argument("--pause-ms", type=float, default=50.0, help="pause between requests")
    parser.add_argument("--interval", type=float, help="seconds between samples (5, quick 2)")
    parser.add_argument("--warm-rounds", type=int, default=20, help="times each client sends "
                        "its load's largest requests before the run (0: none, as the 11-25 runs)")
    parser.add_argument("--report", metavar="RESULTS_JSON",
                        help="only redo the figures and plot of a saved full run")
    args = parser.parse_args(argv)
    args.minutes = args.minutes or (1.0 if args.quick else 10.0)
    args.interval = args.interval or (2.0 if args.quick else 5.0)
    return args


def run(args: argparse.Namespace, results: dict) -> None:
    """Serve, load and sample for the whole run."""
    seconds = args.minutes * 60
    with ExitStack() as stack:
        triton = stack.enter_context(served(soak_manifest(), "soak", log=log))
        url, pid = triton.url(), triton.pid
        server = stack.enter_context(ImageServer(generated_images()))
        loads = make_loads(url, server.urls(), server.images)
        if args.warm_rounds:
            started = time.monotonic()
            results["warm_shapes"] = warm_shapes(loads, args.clients, args.warm_rounds)
            log(f"largest shapes sent first in {time.monotonic() - started:.1f} s: "
                f"{results['warm_shapes']}")
        stop = threading.Event()
        threads = [threading.Thread(target=load.drive, args=(c, stop, args.pause_ms / 1000),
                                    daemon=True)
                   for load in loads for c in range(args.clients)]
        monitor = CpuMonitor()
        t0 = time.monotonic()
        monitor.start()
        for thread in threads:
            thread.start()
        samples = results["samples"]
        while (now := time.monotonic() - t0) < seconds:
            samples.append(sample(pid, t0, loads))
            if len(samples) % 12 == 1:
                total = sum(p.get("rss", 0) for p in samples[-1]["procs"].values()) / 1024
                log(f"{now:6.0f} s: {len(samples[-1]['procs'])} processes, RSS {total:.0f} MiB, "
                    f"requests {samples[-1]['requests']}")
            time.sleep(max(0.0, args.interval - (time.monotonic() - t0 - now)))
        samples.append(sample(pid, t0, loads))
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        window = monitor.stop()
    cores = os.cpu_count() or 1
    results["cpu"] = {"busy_share": round(window.total_busy_s / (window.seconds * cores), 3),
                      "foreign_share": round(window.foreign_share, 3)}
    results["loads"] = {load.name: load.summary(seconds) for load in loads}


def report(results: dict) -> str:
    """The figures, as printed."""
    g = results["growth"]
    lines = [f"soak {results['meta']['args']['minutes']} min, {len(results['samples'])} samples; "
             f"machine busy {results['cpu']['busy_share']:.0%} "
             f"(other processes {results['cpu']['foreign_share']:.0%})"]
    for name, row in [("TOTAL", g["total"]), *g["processes"].items()]:
        cells = []
        for key, m in ((k, row[k]) for k in KINDS):
            change = "n/a" if m["growth"] is None else f"{m['growth']:+.2%}"
            cells.append(f"{key.upper()} {m['first_mib']:7.1f} -> {m['last_mib']:7.1f} MiB "
                         f"({change})")
        lines.append(f"  {name:32s} " + "  ".join(cells))
    lines.append(f"  second half: total RSS trend {g.get('second_half_rss_mib_per_min')} MiB/min,"
                 f" growth {g['second_half']}; last rise (s): "
                 + ", ".join(f"{n} {r['last_rise_s']:.0f}" for n, r in g["processes"].items()))
    lines.append(f"  restarted: {g['restarted'] or 'none'}; goal (total RSS < 5 %): "
                 f"{'met' if g['goal_met'] else 'NOT met'}")
    for name, load in results["loads"].items():
        lines.append(f"  load {name:15s} {load['requests']:7d} requests ({load['req_per_s']}/s), "
                     f"{load['items']} items, {load['errors']} errors, ms {load['latency_ms']}")
        lines += [f"      {n} x {e}" for e, n in load["error_samples"].items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the soak (or re-read one); write the results file and the plot."""
    args = parse_args(argv)
    png = ROOT / "docs" / "bench-soak.png"
    if args.report:
        path = Path(args.report)
        results = json.loads(path.read_text())
    else:
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        results = {
            "meta": {"started": started, "args": vars(args), "machine": machine_info(),
                     "command": "python -m bench.faults.soak " + " ".join(sys.argv[1:])},
            "samples": [],
        }
        run(args, results)
        path = write_results(results, f"soak-cpu-{'quick-' if args.quick else ''}"
                             f"{started.replace(':', '')}", args.quick)
        png = path.with_suffix(".png") if args.quick else png
    results["growth"] = growth(results["samples"], results["samples"][-1]["t"])
    results["meta"]["plot"] = plot(results["samples"], results, png)
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(report(results))
    log(f"results: {results['meta']['results_file']}; {results['meta']['plot']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
