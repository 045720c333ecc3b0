"""The seed design's benchmark: 500 plain clients, 20 one-sentence requests each, no retries.

    .venv/bin/python -m bench.faults.seed [--clients 500] [--requests 20] [--configs ...]

Each :data:`CONFIGS` entry on a fresh server; gate: every request answered as shipped, at
>= :data:`GATE` x the answered rate with ``off``.
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
import tritonclient.grpc.aio as grpc_aio
import tritonclient.http.aio as http_aio

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


def sentence_input(tritonclient_module):
    """The one-sentence ``TEXT`` input of ``tritonclient.{http,grpc}[.aio]``."""
    item = tritonclient_module.InferInput("TEXT", [1, 1], "BYTES")
    item.set_data_from_numpy(np.array([[SENTENCE.encode()]], dtype=object))
    return item


async def _run(protocol: str, url: str, clients: int, requests: int) -> dict[str, Any]:
    latencies: list[float] = []
    errors: Counter = Counter()
    start = time.perf_counter()
    aio = http_aio if protocol == "http" else grpc_aio
    if protocol == "http":
        pool = [aio.InferenceServerClient(url, conn_limit=1, conn_timeout=300)
                for _ in range(clients)]
    else:  # one channel a client, as separate client processes would have
        pool = [aio.InferenceServerClient(url) for _ in range(clients)]
    item = sentence_input(aio)
    try:
        await asyncio.gather(*(
            _one_after_another(partial(c.infer, TEXT_MODEL, [item]), requests, latencies, errors)
            for c in pool
        ))
    finally:
        await asyncio.gather(*(c.close() for c in pool))
    seconds = time.perf_counter() - start
    ms = np.array(sorted(latencies)) * 1000
    p50, p99 = (round(float(np.percentile(ms, q)), 1) if len(ms) else None for q in (50, 99))
    return {
        "sent": clients * requests, "answered": len(latencies), "refused": dict(errors),
        "seconds": round(seconds, 2), "answered_per_s": round(len(latencies) / seconds, 1),
        "p50_ms": p50, "p99_ms": p99,
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
        mine, base = shipped[protocol], off.get(protocol)
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
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results = {"started": started, "clients": args.clients, "requests_each": args.requests}
    for name in args.configs:
        results[name] = run_config(name, args)
    results["verdicts"] = verdicts(results)
    print("\n".join(results["verdicts"]))
    print(f"results: {save_results(results, 'seed')}")
    return 0 if all(line.startswith("ok") for line in results["verdicts"]) else 1


if __name__ == "__main__":
    sys.exit(main())
