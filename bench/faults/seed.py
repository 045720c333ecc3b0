"""The seed design's benchmark: 500 plain clients, 20 one-sentence requests each, no retries.

The design this project grew from measured its server with 500 concurrent clients, each
sending 20 one-sentence requests one after another, no deadline, no retry, and expected
every one answered. This runs the same shape against all-MiniLM-L6-v2 over plain HTTP and
plain gRPC (tritonclient's asyncio clients, one process, nothing of the project's client),
for each configuration side by side in one run, each on a fresh server:

- ``shipped``: the profile as a bare entry gets it (plain requests queued up to the
  profile's row and wait bounds, deadlines steering the rest);
- ``off``: no admission and no Triton queue policy (Triton alone, unbounded);
- ``interactive``: the opt-in ``admission_wait_us = 250000``.

For each it prints and records answered, refused (by message), the answered rate, and
the p50 / p99 latency of answered requests; the gate is every request answered with the
shipped defaults, at >= 0.9x the answered rate of ``off`` on the same protocol.

    .venv/bin/python -m bench.faults.seed [--clients 500] [--requests 20] [--configs ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np

from bench.common import logger, save_results
from bench.manifest import TEXT_MODEL, bench_manifest, served

log = logger("seed")
CONFIGS: dict[str, dict[str, int]] = {
    "shipped": {},
    "off": {"admission_wait_us": 0, "admission_max_rows": 0, "max_queue_size": 0},
    "interactive": {"admission_wait_us": 250_000},
}
GATE = 0.9
SENTENCE = "A plain client sends one sentence and waits for its vector"


def _reason(message: str) -> str:
    return message.rsplit("] ", 1)[-1].split(":")[0][:60]


async def _one_after_another(infer, requests: int, out: list, errors: Counter) -> None:
    """``requests`` calls of ``infer()`` one after another: latencies, refusals by reason."""
    for _ in range(requests):
        start = time.perf_counter()
        try:
            await infer()
            out.append(time.perf_counter() - start)
        except Exception as exc:  # noqa: BLE001 - counted by reason, no retry
            errors[_reason(str(exc))] += 1


async def _http_client(url: str, requests: int, out: list, errors: Counter) -> None:
    import tritonclient.http.aio as httpclient

    client = httpclient.InferenceServerClient(url, conn_limit=1, conn_timeout=300)
    item = httpclient.InferInput("TEXT", [1, 1], "BYTES")
    item.set_data_from_numpy(np.array([[SENTENCE.encode()]], dtype=object))
    try:
        await _one_after_another(
            lambda: client.infer(TEXT_MODEL, [item]), requests, out, errors
        )
    finally:
        await client.close()


async def _run(protocol: str, url: str, clients: int, requests: int) -> dict[str, Any]:
    latencies: list[float] = []
    errors: Counter = Counter()
    start = time.perf_counter()
    if protocol == "http":
        jobs = [_http_client(url, requests, latencies, errors) for _ in range(clients)]
        await asyncio.gather(*jobs)
    else:
        import tritonclient.grpc.aio as grpcclient

        # One channel a client, as separate client processes would have.
        pool = [grpcclient.InferenceServerClient(url) for _ in range(clients)]
        item = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
        item.set_data_from_numpy(np.array([[SENTENCE.encode()]], dtype=object))
        try:
            await asyncio.gather(*(
                _one_after_another(
                    partial(c.infer, TEXT_MODEL, [item]), requests, latencies, errors
                )
                for c in pool
            ))
        finally:
            await asyncio.gather(*(c.close() for c in pool))
    seconds = time.perf_counter() - start
    ms = np.array(sorted(latencies)) * 1000
    return {
        "sent": clients * requests,
        "answered": len(latencies),
        "refused": dict(errors),
        "seconds": round(seconds, 2),
        "answered_per_s": round(len(latencies) / seconds, 1),
        "p50_ms": round(float(np.percentile(ms, 50)), 1) if len(ms) else None,
        "p99_ms": round(float(np.percentile(ms, 99)), 1) if len(ms) else None,
    }


def run_config(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """One fresh server with ``name``'s knobs; the seed shape over each protocol."""
    manifest = bench_manifest(with_clip=False, text_overrides=CONFIGS[name])
    out: dict[str, Any] = {"knobs": CONFIGS[name]}
    with served(manifest, f"seed-{name}", log=log) as server:
        urls = {"http": server.url("http"), "grpc": server.url()}
        for protocol in args.protocols:
            asyncio.run(_run(protocol, urls[protocol], 8, 5))  # warm-up
            result = asyncio.run(_run(protocol, urls[protocol], args.clients, args.requests))
            log(f"{name} {protocol}: {json.dumps(result)}")
            out[protocol] = result
    return out


def verdicts(results: dict[str, Any]) -> list[str]:
    """Each protocol's gate on the shipped configuration, as lines (``FAIL`` when missed)."""
    lines = []
    shipped, off = results.get("shipped", {}), results.get("off", {})
    for protocol in ("http", "grpc"):
        if protocol not in shipped:
            continue
        mine = shipped[protocol]
        base = off.get(protocol)
        ratio = None if base is None else mine["answered_per_s"] / base["answered_per_s"]
        met = mine["answered"] == mine["sent"] and (ratio is None or ratio >= GATE)
        shown = "n/a" if ratio is None else f"{ratio:.2f}x"
        lines.append(
            f"{'ok' if met else 'FAIL'} {protocol}: shipped answered {mine['answered']} of "
            f"{mine['sent']}, {shown} the answered rate with admission off (gate {GATE}x)"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Run the configurations; exit 1 when the shipped one misses its gate."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=500)
    parser.add_argument("--requests", type=int, default=20, help="one after another, each")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--protocols", nargs="+", default=["http", "grpc"],
                        choices=["http", "grpc"])
    args = parser.parse_args(argv)
    results: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "clients": args.clients,
        "requests_each": args.requests,
    }
    for name in args.configs:
        results[name] = run_config(name, args)
    results["verdicts"] = verdicts(results)
    path = save_results(results, "seed")
    print("\n".join(results["verdicts"]))
    print(f"results: {path}")
    return 0 if all(line.startswith("ok") for line in results["verdicts"]) else 1


if __name__ == "__main__":
    sys.exit(main())
