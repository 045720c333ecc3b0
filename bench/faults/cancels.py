"""Cancelling clients do not wear the admission count down: refusals per minute stay flat.

    .venv/bin/python -m bench.faults.cancels [--minutes 10] [--rate R] [--factor 0.9]

Poisson requests at ``--factor`` x the sustainable rate, a fifth giving up after
``--cancel-ms``. Gate: last minute's refusals <= the first's + 1 %, every answer in time,
none failed (on the wheel's Triton 2.51 the gRPC frontend can crash when a call is cancelled
as it completes: docs/security.md).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections.abc import Sequence
from typing import Any

import tritonclient.grpc.aio as grpcclient

from bench.common import logger, save_results
from bench.faults.seed import sentence_input
from bench.manifest import TEXT_MODEL, bench_manifest, served

log = logger("cancels")
CANCEL_SHARE = 0.2
OUTCOMES = ("answered", "refused", "failed")  # counted per minute
DEADLINE_S = 1.0


async def _closed_loop_rate(url: str, clients: int, seconds: float) -> float:
    """Answered requests per second of ``clients`` plain clients back to back."""
    client = grpcclient.InferenceServerClient(url)
    item = sentence_input(grpcclient)
    stop, done = time.perf_counter() + seconds, 0

    async def one() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            await client.infer(TEXT_MODEL, [item])
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(clients)))
    rate = done / (time.perf_counter() - start)
    await client.close()
    return rate


async def _open_loop(url: str, rate: float, seconds: float, cancel_ms: float) -> list[dict]:
    """Poisson arrivals at ``rate``; one record per request (minute, kind, outcome)."""
    client = grpcclient.InferenceServerClient(url)
    item = sentence_input(grpcclient)
    records: list[dict] = []
    rng = random.Random(56)  # noqa: S311 - arrival times, not secrets
    start = time.perf_counter()

    async def send(at: float, cancels: bool) -> None:
        deadline = time.time() + DEADLINE_S
        record = {"minute": int(at // 60), "cancels": cancels, "outcome": "answered"}
        try:
            if cancels:
                await client.infer(TEXT_MODEL, [item], client_timeout=cancel_ms / 1000)
            else:
                await client.infer(TEXT_MODEL, [item], client_timeout=DEADLINE_S,
                                   parameters={"deadline_unix_us": int(deadline * 1e6)})
                over_ms = 1000 * (time.time() - deadline)
                record["late"], record["late_ms"] = over_ms > 0, max(0.0, over_ms)
        except Exception as exc:  # noqa: BLE001 - each outcome recorded
            text = str(exc)
            record["outcome"] = (
                "refused" if "server overloaded" in text
                else "gave up" if "Deadline" in text or "DEADLINE" in text
                else "failed"
            )
        records.append(record)

    # Only the requests still waiting are held: a gather over every request of the run
    # (250,000 tasks) held the loop for a moment at the end, and answers that arrived
    # then were read late (19-32 of the last minute, up to 208 ms).
    pending: set[asyncio.Future] = set()
    at = 0.0
    while at < seconds:
        at += rng.expovariate(rate)
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.ensure_future(send(at, rng.random() < CANCEL_SHARE))
        pending.add(task)
        task.add_done_callback(pending.discard)
    await asyncio.gather(*pending)
    await client.close()
    return records


def minutes(records: list[dict]) -> list[dict[str, Any]]:
    """Per minute: sent, refused and late among the requests that state a deadline."""
    out = []
    for minute in sorted({r["minute"] for r in records}):
        mine = [r for r in records if r["minute"] == minute and not r["cancels"]]
        counts = {k: sum(r["outcome"] == k for r in mine) for k in OUTCOMES}
        late = sum(bool(r.get("late")) for r in mine)
        late_ms = max((r.get("late_ms", 0.0) for r in mine), default=0.0)
        out.append({"minute": minute, "sent": len(mine), **counts, "late": late,
                    "late_max_ms": round(late_ms, 1)})
    return out


def target_met(per_minute: list[dict[str, Any]]) -> bool:
    """The last minute's refusals <= the first's + 1 % of the sent; none late, none failed."""
    first, last = per_minute[0], per_minute[-1]
    margin = 0.01 * max(first["sent"], last["sent"])
    return last["refused"] <= first["refused"] + margin and not any(
        m["late"] or m["failed"] for m in per_minute
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the soak; exit 1 when refusals grew, an answer came late or a request failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, help="the sustainable rate (default: measured)")
    parser.add_argument("--factor", type=float, default=0.9)
    parser.add_argument("--cancel-ms", type=float, default=30.0)
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with served(bench_manifest(with_clip=False), "cancels", log=log) as server:
        url = server.url()
        rate = args.rate or asyncio.run(_closed_loop_rate(url, 16, 15))
        log(f"sustainable {rate:.0f}/s; open loop at {args.factor} x for {args.minutes} min")
        seconds = args.minutes * 60
        records = asyncio.run(_open_loop(url, rate * args.factor, seconds, args.cancel_ms))
        # The server's exit status where it died during the run (None: it served on).
        results["server_exit"] = server.process.process.poll()
    # whole minutes only: the last arrivals can fall a moment past the run's end
    per_minute = [m for m in minutes(records) if m["minute"] < int(args.minutes)]
    first, last = per_minute[0], per_minute[-1]
    met = target_met(per_minute)
    results.update({
        "sustainable_per_s": round(rate, 1), "factor": args.factor, "minutes": args.minutes,
        "cancel_ms": args.cancel_ms, "cancel_share": CANCEL_SHARE, "per_minute": per_minute,
        "gave_up": sum(r["outcome"] == "gave up" for r in records if r["cancels"]), "met": met,
    })
    for m in per_minute:
        print(m)
    print(f"{'ok' if met else 'FAIL'}: refused {first['refused']} in the first minute, "
          f"{last['refused']} in the last; late {sum(m['late'] for m in per_minute)}, "
          f"failed {sum(m['failed'] for m in per_minute)}")
    print(f"results: {save_results(results, 'cancels')}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
