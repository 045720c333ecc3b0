"""Starts under load, counted: how often a start hangs, with and without the start watch.

    .venv/bin/python -m bench.faults.start_loop [--starts 100] [--mode both] [--timeout-s 240]

The repository of ``models.toml`` (as ``make serve`` builds it) is built once; then, for
each start, ``python -m generator serve --no-build`` runs on fresh ports while
``--clients`` threads send the README's request to the text model from the first
instant (connection refused until Triton listens, as traffic arriving at a restarted
pod), and the time to ``/v2/health/ready`` is recorded; the server is stopped (SIGTERM:
the drain) and the next start begins.

``--mode raw`` sets ``EMBED_START_STALL_S=0`` (no watch: the hang rate as it was);
``watched`` keeps the default watch, which cuts a start without progress and starts it
again (``generator/supervisor.py``). A start counts as hung when it is not ready within
``--timeout-s``. For a hung start the threads of every process of its group are saved
with their kernel wait channel (``/proc/<pid>/task/*/wchan``) and, where ``py-spy`` or
``gdb`` is on the PATH, their stacks. Writes ``bench/results/start-loop-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import logger, save_results
from bench.machine import machine_info
from generator.build import build_repository
from generator.manifest import load_manifest
from generator.supervisor import STALL_ENV
from generator.triton_local import free_ports

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / ".build"
TEXT_MODEL = "all-MiniLM-L6-v2"
log = logger("start-loop", sys.stdout)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.faults.start_loop", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--starts", type=int, default=100, help="starts per mode")
    parser.add_argument("--mode", choices=("raw", "watched", "both"), default="both")
    parser.add_argument("--timeout-s", type=float, default=240.0, help="a hang past this")
    parser.add_argument("--clients", type=int, default=8, help="request threads per start")
    parser.add_argument("--stall-s", type=float, default=30.0, help="the watch's window")
    return parser.parse_args(argv)


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as r:
            return r.status == 200
    except (OSError, urllib.error.URLError):
        return False


def _traffic(port: int, stop: threading.Event, answered: list[int]) -> None:
    body = json.dumps(
        {"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["hi"]}]}
    ).encode()
    url = f"http://127.0.0.1:{port}/v2/models/{TEXT_MODEL}/infer"
    while not stop.is_set():
        try:
            request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 - http
                answered.append(answer.status)
        except (OSError, urllib.error.URLError):
            stop.wait(0.05)


def group_threads(pgid: int) -> list[dict[str, Any]]:
    """Every process of group ``pgid``: its command, threads and their wait channels."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
            if int(stat[2]) != pgid:
                continue
            cmd = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
            tasks = sorted(os.listdir(Path(entry.path, "task")), key=int)
            wchan = [Path(entry.path, "task", t, "wchan").read_text() for t in tasks]
        except (OSError, IndexError, ValueError):
            continue
        process: dict[str, Any] = {"pid": int(entry.name), "cmd": cmd, "wchan": wchan}
        for tool, argv in (("py-spy", ["py-spy", "dump", "--pid"]),
                           ("gdb", ["gdb", "-batch", "-ex", "thread apply all bt", "-p"])):
            if shutil.which(tool):
                done = subprocess.run(
                    [*argv, entry.name], capture_output=True, text=True, timeout=60, check=False
                )
                process[tool] = (done.stdout + done.stderr)[-20000:]
        out.append(process)
    return out


def one_start(index: int, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """Start ``generator serve`` once under traffic; what happened."""
    http, grpc, metrics = free_ports(3)
    work = BUILD / "start-loop" / f"{mode}-{index}"
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TRITON_HTTP_PORT": str(http), "TRITON_GRPC_PORT": str(grpc),
           "TRITON_METRICS_PORT": str(metrics),
           STALL_ENV: "0" if mode == "raw" else f"{args.stall_s:g}"}
    log_path = work / "serve.log"
    stop, answered = threading.Event(), []
    clients = [threading.Thread(target=_traffic, args=(http, stop, answered), daemon=True)
               for _ in range(args.clients)]
    start = time.monotonic()
    with log_path.open("wb") as output:
        serve = subprocess.Popen(
            [sys.executable, "-m", "generator", "--repo", str(BUILD / "start-loop-repo"),
             "serve", "--no-build", "--pid-file", str(work / "serve.pid"),
             "--work-dir", str(work)],
            cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
        )
    for client in clients:
        client.start()
    ready_s = None
    stacks: list[dict[str, Any]] = []
    while time.monotonic() - start < args.timeout_s and serve.poll() is None:
        if _ready(http):
            ready_s = round(time.monotonic() - start, 2)
            break
        time.sleep(0.25)
    if ready_s is None and serve.poll() is None:
        stacks = group_threads(serve.pid)
    time.sleep(0.5 if ready_s is not None else 0)
    stop.set()
    if serve.poll() is None:
        os.killpg(serve.pid, signal.SIGTERM)
    try:
        serve.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(serve.pid, signal.SIGKILL)
        serve.wait()
    text = log_path.read_text(errors="replace")
    return {
        "mode": mode,
        "ready_s": ready_s,
        "hung": ready_s is None,
        "stalls_cut": text.count("tritonserver start stalled: no progress"),
        "answered_during_start": len(answered),
        "exit": serve.returncode,
        "stacks": stacks,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Build once, start ``--starts`` times per mode, print the hang rates, save."""
    args = parse_args(argv)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    manifest = load_manifest(ROOT / "models.toml")
    build_repository(manifest, BUILD / "start-loop-repo", log=log)
    modes = ("raw", "watched") if args.mode == "both" else (args.mode,)
    runs = []
    for i in range(args.starts):
        for mode in modes:  # alternated, so load drifts hit both alike
            run = one_start(i, mode, args)
            runs.append(run)
            log(f"start {i + 1} {mode}: ready {run['ready_s']} s, stalls cut "
                f"{run['stalls_cut']}, answered {run['answered_during_start']}")
    summary = {}
    for mode in modes:
        mine = [r for r in runs if r["mode"] == mode]
        ready = sorted(r["ready_s"] for r in mine if r["ready_s"] is not None)
        summary[mode] = {
            "starts": len(mine),
            "hung": sum(r["hung"] for r in mine),
            "stalls_cut": sum(r["stalls_cut"] for r in mine),
            "ready_s_median": ready[len(ready) // 2] if ready else None,
            "ready_s_max": ready[-1] if ready else None,
        }
        log(f"{mode}: {summary[mode]}")
    results = {"started": started, "machine": machine_info(), "args": vars(args),
               "summary": summary, "runs": runs}
    print(f"wrote {save_results(results, 'start-loop')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
