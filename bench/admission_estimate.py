"""How far admission's estimate of a request's wait is from what happens (issue 66, part 1).

    python -m bench.admission_estimate [--quick] [--seconds 20] [--repeats 1]

One server of the bench's text model, every encoder instance recording each admitted
request's estimated wait (µs from its admission to its answer) beside the time that passed
(``EMBED_ADMISSION_TIMES``, ``embed_runtime.ops.step_times.EstimateLog``). Four loads of
plain HTTP clients, no deadline (so none is refused), each after a warm-up of the same:
one-sentence queries, 16-row requests of 128-token chunks, 16-row requests of 256-token
rows, and all three at once. Per load: actual / estimated at p10, p50 and p90 (the goal:
within 0.5-2), over requests whose estimate is at least 1 ms.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.common import logger, write_results
from bench.machine import machine_info
from bench.manifest import BUILD, TEXT_MODEL, bench_manifest, served
from embed_runtime.ops.step_times import ESTIMATES_ENV

log = logger("bench.admission_estimate")
# (clients, rows a request, words a row): a word of these texts is about 1.5 tokens
SHAPES = {"short": (6, 1, 6), "chunks-128": (2, 16, 84), "rows-256": (2, 16, 400)}
LOADS = {**{name: (name,) for name in SHAPES}, "mix": tuple(SHAPES)}
MIN_ESTIMATE_US = 1000
GATE = (0.5, 2.0)  # p10 and p90 of actual / expected, every load (make bench fails past)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(prog="python -m bench.admission_estimate")
    parser.add_argument("--quick", action="store_true", help="short loads")
    parser.add_argument("--seconds", type=float, help="seconds a load (default 20, quick 5)")
    args = parser.parse_args(argv)
    args.seconds = args.seconds or (5.0 if args.quick else 20.0)
    return args


def _text(words: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    vocab = ["index", "vector", "query", "document", "server", "token", "model", "batch"]
    return " ".join(f"{vocab[i % len(vocab)]}{n}" for i, n in enumerate(rng.integers(0, 99, words)))


def _client(url: str, shape: str, stop: float, seed: int, counts: dict) -> None:
    _, rows, words = SHAPES[shape]
    k = 0
    while time.monotonic() < stop:
        texts = [_text(words, seed * 100_000 + k * rows + i) for i in range(rows)]
        body = {
            "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [rows, 1], "data": texts}]
        }
        request = urllib.request.Request(url, json.dumps(body).encode())  # noqa: S310 - loopback
        try:
            urllib.request.urlopen(request, timeout=120).read()  # noqa: S310 - loopback
            counts[shape] = counts.get(shape, 0) + 1
        except urllib.error.HTTPError as exc:
            counts["failed"] = counts.get("failed", 0) + 1
            log(f"{shape}: HTTP {exc.code} {exc.read()[:200]!r}")
        k += 1


def run_load(url: str, shapes: Sequence[str], seconds: float) -> dict:
    """Every shape's clients for ``seconds``; the requests answered by shape."""
    counts: dict[str, int] = {}
    stop = time.monotonic() + seconds
    threads = [
        threading.Thread(target=_client, args=(url, shape, stop, 7 * j + i, counts))
        for j, shape in enumerate(shapes)
        for i in range(SHAPES[shape][0])
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return counts


def read_estimates(folder: Path) -> list[tuple[int, int, int, int]]:
    """Every (rows, tokens, estimate µs, actual µs) line the encoder instances wrote."""
    lines = []
    for path in folder.glob("*.estimates.tsv"):
        for line in path.read_text().splitlines()[1:]:
            lines.append(tuple(int(v) for v in line.split("\t")))
    return lines


def ratios(lines: list[tuple[int, int, int, int]]) -> dict:
    """p10 / p50 / p90 of actual over estimated, over estimates of at least 1 ms."""
    values = np.array([a / e for _, _, e, a in lines if e >= MIN_ESTIMATE_US])
    if not values.size:
        return {"n": 0}
    p10, p50, p90 = (float(v) for v in np.percentile(values, [10, 50, 90]))
    return {
        "n": int(values.size),
        "p10": p10,
        "p50": p50,
        "p90": p90,
        "within_0.5_2": float(np.mean((values >= 0.5) & (values <= 2.0))),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the four loads, print and record the estimate's error of each."""
    args = parse_args(argv)
    folder = BUILD / "bench-admission-estimates"
    results: dict = {"meta": {**machine_info(), "seconds": args.seconds}, "loads": {}}
    manifest = bench_manifest("cpu", with_clip=False)
    with served(
        manifest,
        "bench-admission-server",
        models=(TEXT_MODEL,),
        log=log,
        extra_env={ESTIMATES_ENV: str(folder)},
    ) as server:
        url = f"http://{server.url('http')}/v2/models/{TEXT_MODEL}/infer"
        for name, shapes in LOADS.items():
            run_load(url, shapes, args.seconds / 2)  # warm-up: the cost is learned
            for path in folder.glob("*.estimates.tsv"):
                path.unlink()
            time.sleep(0.5)
            counts = run_load(url, shapes, args.seconds)
            time.sleep(0.5)
            summary = {"answered": counts, **ratios(read_estimates(folder))}
            results["loads"][name] = summary
            log(f"{name}: {json.dumps(summary)}")
    failed = [
        name
        for name, load in results["loads"].items()
        if not load.get("n") or load["p10"] < GATE[0] or load["p90"] > GATE[1]
    ]
    results["gate"] = {"bounds": GATE, "failed": failed}
    out = write_results(
        results, f"admission-estimate-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}", args.quick
    )
    log(f"wrote {out}")
    if failed:
        log(f"gate: actual / expected p10-p90 outside {GATE} for {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
