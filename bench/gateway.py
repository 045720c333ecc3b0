"""What the OpenAI gateway adds in front of Triton, side by side, with its CPU by part.

    .venv/bin/python -m bench.gateway [--requests 300] [--repeats 3] [--quick] [--no-write]

The same requests to Triton's ``/v2/.../infer`` and to the gateway's ``/v1/embeddings``, in
rotation, at 1 x 1, 16 x 1 and 4 x 32. Gates (exit 1): the gateway's CPU per request at
16 x 1 <= 1 ms, its rate >= 0.85 x Triton's at 16 x 1 and >= 0.95 x at 4 x 32.

The gateway's CPU by part: the JSON steps timed in-process on a real answer; the HTTP
server as uvicorn alone, with the gateway's settings, reading the same requests and
answering as many bytes as late as Triton answers, at the same load; the call to Triton as
``Gateway.embeddings`` run alone at the same load, less its JSON steps (both
``bench/gateway_call.py``, in the gateway's venv); the rest is the measured total less all
of these.
"""

from __future__ import annotations

import argparse
import hmac
import http.client
import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

from bench import page
from bench.common import logger, median, run_threads, save_results
from bench.gateway_call import CALL_PART, SERVER_PART, gateway_module
from bench.machine import CpuMonitor, machine_info
from bench.manifest import BUILD, ROOT, TEXT_MODEL, bench_manifest, served
from client.load.corpus import varied_sentences
from generator.gateway import GATEWAY_VENV, GatewayProcess, write_gateway_config
from generator.triton_local import free_ports

log = logger("bench.gateway")
# (name, clients, texts per request)
LOADS = (("1x1", 1, 1), ("16x1", 16, 1), ("4x32", 4, 32))
WARMUP = 10
KEYS = ("req_per_s", "p50_ms", "p99_ms", "triton_cpu_ms_per_req", "gateway_cpu_ms_per_req")
GATES = {"16x1": 0.85, "4x32": 0.95}
CPU_GATE_MS = 1.0
# The HTTP server alone is cheap: this many times the requests, so the CPU clock's tick is small.
SERVER_TIMES = 4
DIM = 384


class Way:
    """One way to ask for an embedding: a host, a path, a body per text, headers."""

    def __init__(self, name: str, port: int, path: str, headers: dict[str, str], body):
        self.name, self.port, self.path, self.headers, self.body = name, port, path, headers, body

    def answered(self, answer: dict, n: int) -> bool:
        """Whether an answer of this way holds ``n`` rows of :data:`DIM` floats."""
        if self.name == "triton":
            return len(answer["outputs"][0]["data"]) == n * DIM
        if self.name == "server":
            return "data" in answer
        return [len(d["embedding"]) for d in answer["data"]] == [DIM] * n


def _client(way: Way, batches: list[list[str]], latencies: list[float], errors: list[str]) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", way.port, timeout=120)
    try:
        for texts in batches:
            start = time.perf_counter()
            connection.request("POST", way.path, json.dumps(way.body(texts)), way.headers)
            response = connection.getresponse()
            data = response.read()
            latencies.append(time.perf_counter() - start)
            if response.status != 200:
                errors.append(f"{response.status}: {data[:200]!r}")
            elif not way.answered(json.loads(data), len(texts)):
                errors.append(f"not {len(texts)} rows of {DIM} floats")
    finally:
        connection.close()


def _batches(pool: list[str], first: int, count: int, rows: int) -> list[list[str]]:
    return [[pool[(first + i * rows + r) % len(pool)] for r in range(rows)] for i in range(count)]


def run_load(
    way: Way, clients: int, rows: int, per_client: int, pool: list[str], pids: dict[str, int]
) -> dict:
    """``clients`` threads of ``per_client`` requests of ``rows`` texts, after :data:`WARMUP`.

    ``pids``: the servers' processes, whose CPU time (process tree) per request is reported.
    """
    _client(way, _batches(pool, 0, WARMUP, rows), [], [])
    latencies: list[float] = []
    errors: list[str] = []
    shares = [_batches(pool, c * per_client * rows, per_client, rows) for c in range(clients)]
    threads = [threading.Thread(target=_client, args=(way, b, latencies, errors)) for b in shares]
    monitors = {name: CpuMonitor(pid) for name, pid in pids.items()}
    for monitor in monitors.values():
        monitor.start()
    wall = run_threads(threads)
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
    triton = stack.enter_context(
        served(manifest, "bench-gateway", models=manifest.models[0].ensembles, log=log)
    )
    ports = triton.ports
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
    return ports.http, triton.pid, gateway


def ways(triton_port: int, gateway: GatewayProcess) -> list[Way]:
    """The two ways, as the gateway's provider and an OpenAI client send them."""
    json_headers = {"Content-Type": "application/json"}

    def triton_body(texts: list[str]) -> dict:
        tensor = {"name": "TEXT", "shape": [len(texts), 1], "datatype": "BYTES", "data": texts}
        return {"inputs": [tensor], "outputs": [{"name": "EMBEDDING"}]}

    def openai_body(texts: list[str]) -> dict:
        return {"model": TEXT_MODEL, "input": texts, "encoding_format": "float"}

    auth = {**json_headers, "Authorization": f"Bearer {gateway.key}"}
    return [
        Way("triton", triton_port, f"/v2/models/{TEXT_MODEL}/infer", json_headers, triton_body),
        Way("gateway", gateway.port, "/v1/embeddings", auth, openai_body),
    ]


def embeddings_cpu(config: Path, triton_port: int, texts: list[str], clients: int,
                   requests: int) -> float:
    """µs of CPU per request of ``Gateway.embeddings`` alone (``bench/gateway_call.py``)."""
    done = subprocess.run(
        [str(GATEWAY_VENV / "bin" / "python"), str(ROOT / "bench" / "gateway_call.py"),
         str(config), f"http://127.0.0.1:{triton_port}", TEXT_MODEL, str(clients),
         str(requests)],
        input=json.dumps(texts), capture_output=True, text=True, check=True, timeout=600,
    )
    return json.loads(done.stdout)["us_per_request"]


def server_cpu(pool: list[str], rows: int, clients: int, requests: int, size: int,
               wait_s: float) -> float:
    """µs of CPU per request of uvicorn alone answering ``size`` bytes (``gateway_call serve``)."""
    (port,) = free_ports(1)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    server = subprocess.Popen(
        [str(GATEWAY_VENV / "bin" / "python"), str(ROOT / "bench" / "gateway_call.py"),
         "serve", str(port), str(size), str(wait_s)], env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("the bare uvicorn did not start") from None
                time.sleep(0.1)
        way = Way("server", port, "/v1/embeddings", {"Content-Type": "application/json"},
                  lambda texts: {"model": TEXT_MODEL, "input": texts, "encoding_format": "float"})
        result = run_load(way, clients, rows, requests * SERVER_TIMES, pool,
                          {"server": server.pid})
        if result["errors"]:
            raise RuntimeError(f"the bare uvicorn: {result['first_error']}")
        return 1000 * result["server_cpu_ms_per_req"]
    finally:
        server.terminate()
        server.wait(30)


def cpu_by_part(config: Path, triton_port: int, pool: list[str], n: int, clients: int,
                requests: int, wait_s: float) -> dict[str, float]:
    """µs of CPU per request of each part the gateway runs for ``n`` texts (a real answer).

    The JSON steps are timed in-process; the call to Triton is ``Gateway.embeddings`` run
    alone at ``clients`` at once, less those steps; the HTTP server is uvicorn alone at the
    same load, answering as many bytes ``wait_s`` (Triton's p50 at that load) later.
    """
    texts = pool[:n]
    gw = gateway_module()
    route = gw.load_routes(config)[TEXT_MODEL]
    key = ("sk-" + "0" * 32).encode()
    body = json.dumps({"model": TEXT_MODEL, "input": texts, "encoding_format": "float"})
    connection = http.client.HTTPConnection("127.0.0.1", triton_port, timeout=60)
    connection.request("POST", f"/v2/models/{route.ensemble}/infer",
                       gw.triton_body(texts, None, route.token_count, 0),
                       {"Content-Type": "application/json"})
    answer = connection.getresponse().read()
    connection.close()
    rows, _ = gw.triton_rows(answer, len(texts))
    data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)]

    def request() -> None:
        parsed = gw.orjson.loads(body)
        gw.texts_of(parsed["input"])
        gw.encoding_of(parsed.get("encoding_format"))
        gw.dimensions_of(parsed.get("dimensions"), route)

    parts = {
        "auth: the key compared in constant time": lambda: hmac.compare_digest(key, key),
        "the request's JSON parsed and checked": request,
        "Triton's request written (JSON)": lambda: gw.triton_body(texts, None, True, 1),
        "Triton's answer parsed (JSON)": lambda: gw.triton_rows(answer, len(texts)),
        "the answer's JSON (the floats)": lambda: gw.orjson.dumps(
            {"object": "list", "data": data, "model": TEXT_MODEL, "usage": {}}),
        "base64 rows instead (encoding_format base64)": lambda: [gw.base64_row(r) for r in rows],
    }
    times = {}
    repeat = max(50, 4000 // n)
    for name, part in parts.items():
        start = time.process_time()
        for _ in range(repeat):
            part()
        times[name] = 1e6 * (time.process_time() - start) / repeat
    size = len(gw.orjson.dumps({"object": "list", "data": data, "model": TEXT_MODEL,
                                "usage": {"prompt_tokens": 0, "total_tokens": 0}}))
    alone = embeddings_cpu(config, triton_port, texts, clients, requests)
    inside = ("Triton's request written (JSON)", "Triton's answer parsed (JSON)",
              "the answer's JSON (the floats)")
    times[CALL_PART] = alone - sum(times[name] for name in inside)
    times[SERVER_PART] = server_cpu(pool, n, clients, requests, size, wait_s)
    return times


def summarise(runs: dict[str, dict[str, list[dict]]]) -> dict[str, dict]:
    """Median over repeats of each load and way, the gateway's ratios and their gates."""
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


def gates(summary: dict[str, dict]) -> dict[str, bool]:
    """Each target of the gateway: met or not."""
    met = {f"{load} rate >= {gate} x Triton's": summary[load]["throughput_ratio"] >= gate
           for load, gate in GATES.items()}
    cpu = summary["16x1"]["gateway"]["gateway_cpu_ms_per_req"]
    met[f"gateway CPU per one-sentence request at 16 x 1 <= {CPU_GATE_MS} ms"] = (
        cpu <= CPU_GATE_MS
    )
    return met


def main(argv: list[str] | None = None) -> int:
    """Run the loads, print and (unless ``--no-write``) record them; 1 when a gate fails."""
    parser = argparse.ArgumentParser(prog="python -m bench.gateway", description=__doc__)
    parser.add_argument("--requests", type=int, default=300, help="timed requests per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="leave docs/benchmarks.md")
    parser.add_argument("--note", default="", help="a sentence for the section (the tree run)")
    parser.add_argument("--quick", action="store_true", help="120 requests, one repeat")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.repeats = 120, 1
    pool = varied_sentences(512)
    started = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    runs: dict[str, dict[str, list[dict]]] = {
        load: {"triton": [], "gateway": []} for load, _, _ in LOADS
    }
    with ExitStack() as stack:
        triton_port, triton_pid, gateway = start_servers(stack)
        pids = {"triton": triton_pid, "gateway": gateway.process.pid}
        monitor = CpuMonitor()
        monitor.start()
        for repeat in range(args.repeats):
            for load, clients, rows in LOADS:
                for way in ways(triton_port, gateway):
                    per_client = max(1, args.requests // clients // (4 if rows > 1 else 1))
                    result = run_load(way, clients, rows, per_client, pool, pids)
                    runs[load][way.name].append(result)
                    log(
                        f"repeat {repeat + 1} {load:5s} {way.name:8s} "
                        f"{result['req_per_s']:7.1f} req/s  p50 {result['p50_ms']:6.1f} ms  "
                        f"p99 {result['p99_ms']:6.1f} ms  errors {result['errors']}  CPU ms/req "
                        f"triton {result['triton_cpu_ms_per_req']:.1f} "
                        f"gateway {result['gateway_cpu_ms_per_req']:.1f}"
                    )
        window = monitor.stop()
        config = BUILD / "bench-gateway" / "config.yaml"
        parts = {
            str(n): cpu_by_part(
                config, triton_port, pool, n, clients,
                max(1, args.requests // clients // (4 if n > 1 else 1)),
                median(r["p50_ms"] for r in runs[load]["triton"]) / 1000,
            )
            for n, clients, load in ((1, 16, "16x1"), (32, 4, "4x32"))
        }
    results = {
        "started": started,
        "command": ("python -m bench.gateway " + " ".join(argv or [])).strip(),
        "repeats": args.repeats,
        "requests": args.requests,
        "machine": machine_info(),
        "foreign_cpu_share": window.foreign_share,
        "note": args.note,
        "runs": runs,
        "summary": summarise(runs),
        "parts": parts,
    }
    results["gates"] = gates(results["summary"])
    stamp = started.replace(":", "").replace("-", "")
    results["source"] = f"bench/results/gateway-{stamp}.json"
    save_results(results, "gateway", args.quick)
    print(page.gateway_section(results))
    if not (args.no_write or args.quick):
        page.main([])
    return 0 if all(results["gates"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
