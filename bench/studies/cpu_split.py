"""Where the CPU goes under a closed-loop text load: core-seconds per process, per request.

    python -m bench.studies.cpu_split [--load "16 x 1"] [--requests 300] [--set KEY=VALUE ...]

Serves the text model as ``models.toml`` does (``--set`` overrides a knob), runs the load
against it over gRPC, and reads every process's CPU time from ``/proc`` before and after
the timed window: Triton's own process (HTTP/gRPC, ensembles, batchers), each Python
stub (one per model instance, named by its model), this process (the load generator)
and everything else on the machine. Prints core-seconds of each and milliseconds of CPU
per request, so the serving cost of a request can be set beside the in-process
ceiling's cost of a row (``bench.studies.ab --ceiling``).
"""

from __future__ import annotations

import argparse
import os
import re
import time
from collections import Counter
from contextlib import ExitStack

from bench.common import logger
from bench.manifest import TEXT_MODEL, bench_manifest, parse_overrides
from bench.studies.ab import serve_process
from client.load.loadgen import LoadSpec, run_triton_load
from client.load.workload import text_pool, text_requests

log = logger("cpu-split")
TICK = os.sysconf("SC_CLK_TCK")
MODEL_DIR = re.compile(r"/([^/]+)/\d+/model\.py")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (0 when it has gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def _role(pid: int, server: int, me: int) -> str:
    """What ``pid`` is: ``tritonserver``, ``stub <model>``, ``load generator`` or ``other``."""
    if pid == server:
        return "tritonserver"
    if pid == me:
        return "load generator"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "other"
    if "triton_python_backend_stub" in args:
        found = MODEL_DIR.search(args)
        return f"stub {found[1] if found else '?'}"
    return "other"


def snapshot(server: int) -> dict[int, tuple[str, float]]:
    """Every process's role and CPU seconds now."""
    me = os.getpid()
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            pid = int(name)
            out[pid] = (_role(pid, server, me), _cpu_s(pid))
    return out


def split(before: dict, after: dict) -> Counter:
    """Core-seconds per role between two snapshots."""
    used: Counter = Counter()
    for pid, (role, cpu) in after.items():
        used[role] += cpu - before.get(pid, (role, 0.0))[1]
    return used


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load", default="16 x 1", help="CLIENTS x ROWS (default 16 x 1)")
    parser.add_argument("--requests", type=int, default=300, help="timed requests per client")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--pool", type=int, default=512)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    """Serve, load, print the split."""
    args = parse_args(argv)
    clients, rows = (int(x) for x in args.load.split("x"))
    spec = LoadSpec(clients, rows, args.requests, 2, 120.0)
    pool = text_pool(args.pool)
    count = clients * (spec.warmup_requests + spec.requests_per_client)
    requests = text_requests(pool, rows, count)
    with ExitStack() as stack:
        manifest = bench_manifest("cpu", False, parse_overrides(args.set))
        ports, pid = serve_process(manifest, "cpu-split", stack)
        url = f"127.0.0.1:{ports.grpc}"
        run_triton_load(url, "grpc", TEXT_MODEL, "TEXT", requests[: clients * 20], spec)
        before, start = snapshot(pid), time.monotonic()
        result = run_triton_load(url, "grpc", TEXT_MODEL, "TEXT", requests, spec, args.load)
        seconds, used = time.monotonic() - start, split(before, snapshot(pid))
    served = result.requests
    cores = os.cpu_count() or 1
    print(
        f"{args.load}: {served} requests, {result.items_per_s:.1f} rows/s, errors "
        f"{result.errors}; {seconds:.1f} s x {cores} cores = {seconds * cores:.1f} core-s"
    )
    print(f"{'process':44s} {'core-s':>7s} {'share':>6s} {'ms CPU/request':>15s}")
    for role, cpu in sorted(used.items(), key=lambda kv: -kv[1]):
        if cpu >= 0.05:
            print(
                f"{role:44s} {cpu:7.2f} {cpu / (seconds * cores):6.0%} "
                f"{1000 * cpu / max(served, 1):15.2f}"
            )
    total = sum(used.values())
    print(f"{'all':44s} {total:7.2f} {total / (seconds * cores):6.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
