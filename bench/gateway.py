"""What the OpenAI gateway (LiteLLM's proxy) adds in front of Triton, side by side.

    .venv/bin/python -m bench.gateway [--requests 300] [--repeats 3] [--no-write]

The bench repository's all-MiniLM-L6-v2 (the shipped CPU profile, ``bench.manifest``), one
Triton and one gateway (``make gateway``'s venv, ``deploy/gateway/run_gateway.sh``, one
worker) on this machine. The same single-sentence requests sent two ways, in rotation:

- ``triton``: ``POST /v2/models/all-MiniLM-L6-v2/infer`` (JSON, ``TEXT`` [1, 1], output
  ``EMBEDDING`` named), what the gateway's provider itself sends;
- ``gateway``: ``POST /v1/embeddings`` (``input`` [text], ``encoding_format`` float, the key).

Loads: 1 client x 1 text (``1x1``) and 16 clients x 1 text (``16x1``), closed loop, each
client a thread with one keep-alive HTTP connection; every request checked (200, 384
floats). Reports requests/s and latency p50 / p99 per way and the ratios, and writes them
into docs/benchmarks.md between ``<!-- gateway:begin -->`` and ``<!-- gateway:end -->``
(inside the analysis block, which ``make bench`` keeps).
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import secrets
import threading
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

from bench.common import logger, median, save_results
from bench.machine import CpuMonitor, machine_info
from bench.manifest import BUILD, ROOT, TEXT_MODEL, bench_manifest
from client.load.corpus import varied_sentences
from generator.admin import KEY_ENV
from generator.build import build_repository
from generator.gateway import GatewayProcess, write_gateway_config
from generator.triton_local import TritonLaunch, TritonPorts, TritonProcess, free_ports

log = logger("bench.gateway")
DOC = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- gateway:begin -->", "<!-- gateway:end -->"
ANALYSIS_END = "<!-- analysis:end -->"
LOADS = (("1x1", 1), ("16x1", 16))
WARMUP = 10
KEYS = ("req_per_s", "p50_ms", "p99_ms", "triton_cpu_ms_per_req", "gateway_cpu_ms_per_req")


class Way:
    """One way to ask for an embedding: a host, a path, a body per text, headers."""

    def __init__(self, name: str, port: int, path: str, headers: dict[str, str], body):
        self.name, self.port, self.path, self.headers, self.body = name, port, path, headers, body

    def rows(self, answer: dict) -> list[list[float]]:
        """The embedding rows of an answer of this way."""
        if self.name == "triton":
            return [answer["outputs"][0]["data"]]
        return [d["embedding"] for d in answer["data"]]


def _client(way: Way, texts: list[str], latencies: list[float], errors: list[str]) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", way.port, timeout=120)
    try:
        for text in texts:
            start = time.perf_counter()
            connection.request("POST", way.path, json.dumps(way.body(text)), way.headers)
            response = connection.getresponse()
            data = response.read()
            latencies.append(time.perf_counter() - start)
            if response.status != 200:
                errors.append(f"{response.status}: {data[:200]!r}")
            elif len(way.rows(json.loads(data))[0]) != 384:
                errors.append("not 384 floats")
    finally:
        connection.close()


def run_load(
    way: Way, clients: int, per_client: int, pool: list[str], pids: dict[str, int]
) -> dict:
    """``clients`` threads, ``per_client`` timed requests each after :data:`WARMUP`.

    ``pids``: the servers' processes, whose CPU time (process tree) per request is reported.
    """
    warm: list[float] = []
    _client(way, pool[:WARMUP], warm, [])
    latencies: list[float] = []
    errors: list[str] = []
    threads = [
        threading.Thread(
            target=_client,
            args=(way, [pool[(c * per_client + i) % len(pool)] for i in range(per_client)],
                  latencies, errors),
        )
        for c in range(clients)
    ]
    monitors = {name: CpuMonitor(pid) for name, pid in pids.items()}
    for monitor in monitors.values():
        monitor.start()
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    cpu = {name: monitor.stop().own_busy_s for name, monitor in monitors.items()}
    ordered = sorted(latencies)
    return {
        "requests": len(latencies),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "req_per_s": len(latencies) / wall,
        "p50_ms": 1000 * ordered[len(ordered) // 2],
        "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        **{f"{name}_cpu_ms_per_req": 1000 * s / len(latencies) for name, s in cpu.items()},
    }


def start_servers(stack: ExitStack) -> tuple[int, int, GatewayProcess]:
    """Triton with the bench text model, and the gateway in front of it."""
    manifest = bench_manifest("cpu", with_clip=False)
    repo = BUILD / "bench-repo-gateway"
    build_repository(manifest, repo, log=log)
    ports = TritonPorts(*free_ports(3))
    key = secrets.token_urlsafe(32)
    launch = TritonLaunch(repo, ports, load_models=manifest.models[0].ensembles, admin_key=key)
    triton = TritonProcess(launch, BUILD / "bench-work-gateway", extra_env={KEY_ENV: key})
    triton.start()
    stack.callback(triton.stop)
    triton.wait_ready(timeout_s=300)
    work = BUILD / "bench-gateway"
    work.mkdir(parents=True, exist_ok=True)
    config = work / "config.yaml"
    write_gateway_config(manifest, config)
    (port,) = free_ports(1)
    gateway = GatewayProcess(
        config, f"http://127.0.0.1:{ports.http}", "sk-" + secrets.token_hex(16), port,
        work / "gateway.log",
    )
    gateway.start()
    stack.callback(gateway.stop)
    gateway.wait_ready(180)
    return ports.http, triton.process.pid, gateway


def ways(triton_port: int, gateway: GatewayProcess) -> list[Way]:
    """The two ways, as the gateway's provider and an OpenAI client send them."""
    json_headers = {"Content-Type": "application/json"}

    def triton_body(text: str) -> dict:
        tensor = {"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": [text]}
        return {"inputs": [tensor], "outputs": [{"name": "EMBEDDING"}]}

    def openai_body(text: str) -> dict:
        return {"model": TEXT_MODEL, "input": [text], "encoding_format": "float"}

    auth = {**json_headers, "Authorization": f"Bearer {gateway.key}"}
    return [
        Way("triton", triton_port, f"/v2/models/{TEXT_MODEL}/infer", json_headers, triton_body),
        Way("gateway", gateway.port, "/v1/embeddings", auth, openai_body),
    ]


def summarise(runs: dict[str, dict[str, list[dict]]]) -> dict[str, dict]:
    """Median over repeats of each load and way, and the gateway's ratios."""
    out = {}
    for load, by_way in runs.items():
        row = {
            way: {k: median(r[k] for r in results) for k in KEYS}
            for way, results in by_way.items()
        }
        row["errors"] = sum(r["errors"] for results in by_way.values() for r in results)
        t, g = row["triton"], row["gateway"]
        row["throughput_ratio"] = g["req_per_s"] / t["req_per_s"]
        row["p50_added_ms"] = g["p50_ms"] - t["p50_ms"]
        row["p50_ratio"] = g["p50_ms"] / t["p50_ms"]
        out[load] = row
    return out


def section(results: dict) -> str:
    """The docs/benchmarks.md section of ``results``."""
    m = results["machine"]
    lines = [
        BEGIN,
        "",
        "## The OpenAI gateway's cost (LiteLLM proxy in front of Triton)",
        "",
        f"Generated by `{results['command']}` from `{results['source']}`: run of "
        f"{results['started']} on a {m['cores']}-core {m['cpu']} (shared; other processes "
        f"took {results['foreign_cpu_share']:.0%} of the CPU meanwhile), "
        f"{results['repeats']} repeats in rotation, {results['requests']} timed requests per "
        "way and load. One Triton (all-MiniLM-L6-v2, the CPU profile) and one gateway "
        f"(litellm[proxy] {results['litellm']}, one worker, "
        "`deploy/gateway/triton_embeddings.py`) on the same machine as the clients; each "
        "request is one sentence. `triton`: `POST /v2/models/<m>/infer` (JSON); `gateway`: "
        "`POST /v1/embeddings`, which makes that same Triton request. Closed loop, one "
        "keep-alive connection per client thread; every answer checked (200, 384 floats)."
        + (f" {results['note']}" if results.get("note") else ""),
        "",
        "CPU ms / request: CPU time of that server's process tree (Triton with its stubs; "
        "the gateway) during the run, per request.",
        "",
        "| Load | Way | req/s | p50 ms | p99 ms | gateway ÷ triton req/s | p50 added ms "
        "| Triton CPU ms / req | gateway CPU ms / req |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for load, row in results["summary"].items():
        for way in ("triton", "gateway"):
            r = row[way]
            extra = (
                f"{row['throughput_ratio']:.2f} x | +{row['p50_added_ms']:.1f} "
                f"({row['p50_ratio']:.1f} x)"
                if way == "gateway" else " | "
            )
            lines.append(
                f"| {load} | {way} | {r['req_per_s']:.1f} | {r['p50_ms']:.1f} | "
                f"{r['p99_ms']:.1f} | {extra} | {r['triton_cpu_ms_per_req']:.1f} | "
                f"{r['gateway_cpu_ms_per_req']:.1f} |"
            )
    errors = sum(row["errors"] for row in results["summary"].values())
    lines += ["", f"Errors: {errors}.", "", END]
    return "\n".join(lines)


def write_section(text: str, doc: Path = DOC) -> None:
    """Replace the section in ``doc``, or put it at the end of the analysis block."""
    page = doc.read_text()
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if pattern.search(page):
        page = pattern.sub(lambda _: text, page)
    else:
        page = page.replace(ANALYSIS_END, f"\n{text}\n{ANALYSIS_END}", 1)
    doc.write_text(page)


def main(argv: list[str] | None = None) -> None:
    """Run the loads, print and (unless ``--no-write``) record them."""
    parser = argparse.ArgumentParser(prog="python -m bench.gateway", description=__doc__)
    parser.add_argument("--requests", type=int, default=300, help="timed requests per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="leave docs/ as it is")
    parser.add_argument("--note", default="", help="a sentence for the section (the tree run)")
    args = parser.parse_args(argv)
    pool = varied_sentences(512)
    started = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    runs: dict[str, dict[str, list[dict]]] = {
        load: {"triton": [], "gateway": []} for load, _ in LOADS
    }
    with ExitStack() as stack:
        triton_port, triton_pid, gateway = start_servers(stack)
        pids = {"triton": triton_pid, "gateway": gateway.process.pid}
        monitor = CpuMonitor()
        monitor.start()
        for repeat in range(args.repeats):
            for load, clients in LOADS:
                for way in ways(triton_port, gateway):
                    per_client = max(1, args.requests // clients)
                    result = run_load(way, clients, per_client, pool, pids)
                    runs[load][way.name].append(result)
                    log(
                        f"repeat {repeat + 1} {load:5s} {way.name:8s} "
                        f"{result['req_per_s']:7.1f} req/s  p50 {result['p50_ms']:6.1f} ms  "
                        f"p99 {result['p99_ms']:6.1f} ms  errors {result['errors']}  CPU ms/req "
                        f"triton {result['triton_cpu_ms_per_req']:.1f} "
                        f"gateway {result['gateway_cpu_ms_per_req']:.1f}"
                    )
        window = monitor.stop()
    results = {
        "started": started,
        "command": "python -m bench.gateway " + " ".join(argv or []),
        "repeats": args.repeats,
        "requests": args.requests,
        "machine": machine_info(),
        "foreign_cpu_share": window.foreign_share,
        "litellm": _gateway_litellm_version(),
        "note": args.note,
        "runs": runs,
        "summary": summarise(runs),
    }
    results["command"] = results["command"].strip()
    stamp = started.replace(":", "").replace("-", "")
    results["source"] = f"bench/results/gateway-{stamp}.json"
    save_results(results, "gateway")
    text = section(results)
    print(text)
    if not args.no_write:
        write_section(text)


def _gateway_litellm_version() -> str:
    """The version of litellm in the gateway venv (its lock pins it)."""
    lock = (ROOT / "requirements" / "gateway.txt").read_text()
    match = re.search(r"^litellm==(\S+)$", lock, re.M)
    return match.group(1) if match else "?"


if __name__ == "__main__":
    main()
