"""Whether the served Triton survives gRPC clients that cancel their calls as they complete.

    .venv/bin/python -m bench.faults.grpc_cancels [--seconds 120] [--clients 48] [--timeout-ms 5 40]

Triton 2.51 (the ``nvidia-pytriton`` wheel's) crashes when a gRPC call is cancelled while its
answer completes (upstream #7368, fixed in 24.12): each client here sends one sentence after
another with a call timeout drawn from ``--timeout-ms``, around the time an answer takes.
Prints the calls answered, given up and refused, and the server's exit status if it died;
exits 1 if it died (docs/security.md).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence

import tritonclient.grpc.aio as grpcclient

from bench.common import logger
from bench.faults.seed import sentence_input
from bench.manifest import TEXT_MODEL, bench_manifest, served

log = logger("grpc-cancels")


async def _load(url: str, alive, seconds: float, clients: int, low_ms: float,
                high_ms: float) -> Counter:
    client = grpcclient.InferenceServerClient(url)
    item = sentence_input(grpcclient)
    outcomes: Counter = Counter()
    rng = random.Random(7)  # noqa: S311 - timeouts, not secrets
    stop = time.monotonic() + seconds

    async def one() -> None:
        while time.monotonic() < stop and alive():
            try:
                timeout = rng.uniform(low_ms, high_ms) / 1000
                await client.infer(TEXT_MODEL, [item], client_timeout=timeout)
                outcomes["answered"] += 1
            except Exception as exc:  # noqa: BLE001 - each outcome counted
                text = str(exc)
                outcomes["given up" if "DEADLINE" in text.upper() else
                         "refused" if "overloaded" in text else "failed"] += 1

    await asyncio.gather(*(one() for _ in range(clients)))
    await client.close()
    return outcomes


def main(argv: Sequence[str] | None = None) -> int:
    """Run the load; 1 when the server died."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--clients", type=int, default=48)
    parser.add_argument("--timeout-ms", type=float, nargs=2, default=(5.0, 40.0))
    args = parser.parse_args(argv)
    with served(bench_manifest(with_clip=False), "grpc-cancels", log=log) as server:
        process = server.process.process
        start = time.monotonic()
        outcomes = asyncio.run(_load(server.url(), lambda: process.poll() is None, args.seconds,
                                     args.clients, *args.timeout_ms))
        status = process.poll()
        lasted = time.monotonic() - start
    log(", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    if status is None:
        log(f"the server served on for {lasted:.0f} s")
        return 0
    log(f"the server died after {lasted:.0f} s, exit status {status}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
