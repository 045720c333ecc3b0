"""Queries with deadlines beside the corpus indexer, each measured alone too (issue 66, part 4).

    python -m bench.queries_beside_index [--quick] [--documents 60] [--rate 4]

One server of the bench's text model. Three phases, in order: ``client.index`` embeds long
documents in 128-token chunks (``<name>_chunks``) alone; one-sentence queries stating
500 ms, ``--rate`` a second, alone for as long as the indexer took; then both at once.
Records the queries answered in time (the goal: >= 99 % beside the indexer) and the
indexer's rate beside the queries over its rate alone (the goal: >= 0.8).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence

import numpy as np

from bench.common import logger, write_results
from bench.machine import machine_info
from bench.manifest import BUILD, TEXT_MODEL, bench_manifest, served
from client.index import IndexJob, run_index
from generator.admin import KEY_ENV

log = logger("bench.queries_beside_index")
DEADLINE_S = 0.5
IN_TIME_GATE, RATE_GATE = 0.99, 0.8  # make bench fails below either
QUERY = "how does the server keep queries prompt beside an index job"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(prog="python -m bench.queries_beside_index")
    parser.add_argument("--quick", action="store_true", help="few documents")
    parser.add_argument("--documents", type=int, help="documents (default 60, quick 12)")
    parser.add_argument("--rate", type=float, default=4.0, help="queries a second")
    args = parser.parse_args(argv)
    args.documents = args.documents or (12 if args.quick else 60)
    return args


def write_corpus(path, documents: int) -> None:
    """``documents`` JSONL rows of ~2,000 tokens each."""
    rng = np.random.default_rng(0)
    words = ["index", "vector", "server", "query", "document", "chunk", "token", "answer"]
    with path.open("w", encoding="utf-8") as out:
        for d in range(documents):
            picks = rng.integers(0, len(words) * 50, size=1300)
            text = " ".join(f"{words[p % len(words)]}{p // len(words)}" for p in picks)
            out.write(json.dumps({"id": f"d{d}", "text": text}) + "\n")


def index_once(url: str, corpus, out) -> float:
    """Seconds ``client.index`` takes over the corpus, in 128-token chunks."""
    shutil.rmtree(out, ignore_errors=True)
    job = IndexJob(
        model=TEXT_MODEL,
        inputs=[str(corpus)],
        out=str(out),
        url=url,
        protocol="http",
        admin_key=os.environ[KEY_ENV],
        options={"chunk_tokens": 128},
        progress="quiet",
    )
    start = time.monotonic()
    run_index(job)
    return time.monotonic() - start


def query_loop(url: str, rate: float, stop: threading.Event, results: list) -> None:
    """One-sentence queries stating 500 ms, ``rate`` a second, until ``stop``."""
    body = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": [QUERY]}]}
    target = f"http://{url}/v2/models/{TEXT_MODEL}/infer"
    next_at = time.monotonic()
    while not stop.is_set():
        next_at += 1 / rate
        body["parameters"] = {"deadline_unix_us": int((time.time() + DEADLINE_S) * 1e6)}
        start = time.monotonic()
        try:
            request = urllib.request.Request(target, json.dumps(body).encode())
            urllib.request.urlopen(request, timeout=30).read()  # noqa: S310 - loopback
            status = 200
        except urllib.error.HTTPError as exc:
            status = exc.code
        results.append((status, time.monotonic() - start))
        time.sleep(max(0.0, next_at - time.monotonic()))


def summary(results: list) -> dict:
    """Queries sent, answered in time, refused, p50 / p99 of the answered (ms)."""
    answered = [s for code, s in results if code == 200]
    in_time = sum(1 for s in answered if s <= DEADLINE_S)
    ms = np.array(answered) * 1000 if answered else np.zeros(1)
    return {
        "sent": len(results),
        "in_time": in_time,
        "in_time_share": in_time / max(len(results), 1),
        "refused": sum(1 for code, _ in results if code == 503),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """The three phases; prints and records the figures."""
    args = parse_args(argv)
    work = BUILD / "bench-queries-beside-index"
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / "corpus.jsonl"
    write_corpus(corpus, args.documents)
    results: dict = {"meta": {**machine_info(), **vars(args)}}
    with served(bench_manifest("cpu", with_clip=False), "bench-queries-server", log=log) as server:
        url = server.url("http")
        index_once(url, corpus, work / "warm")  # the cost of chunks is learned
        alone_s = index_once(url, corpus, work / "alone")
        log(f"indexer alone: {alone_s:.1f} s")
        queries: list = []
        stop = threading.Event()
        loop = threading.Thread(target=query_loop, args=(url, args.rate, stop, queries))
        loop.start()
        time.sleep(alone_s)
        stop.set()
        loop.join()
        results["queries_alone"] = summary(queries)
        log(f"queries alone: {results['queries_alone']}")
        beside: list = []
        stop = threading.Event()
        loop = threading.Thread(target=query_loop, args=(url, args.rate, stop, beside))
        loop.start()
        both_s = index_once(url, corpus, work / "both")
        stop.set()
        loop.join()
        results["queries_beside_index"] = summary(beside)
        results["index"] = {"alone_s": alone_s, "beside_s": both_s, "rate_ratio": alone_s / both_s}
        log(f"beside: {results['queries_beside_index']}; indexer {both_s:.1f} s")
    in_time = results["queries_beside_index"]["in_time_share"]
    ratio = results["index"]["rate_ratio"]
    results["gate"] = {
        "in_time_share": IN_TIME_GATE,
        "rate_ratio": RATE_GATE,
        "met": in_time >= IN_TIME_GATE and ratio >= RATE_GATE,
    }
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    log(f"wrote {write_results(results, f'queries-beside-index-{stamp}', args.quick)}")
    if not results["gate"]["met"]:
        log(
            f"gate: {in_time:.3f} of queries in time (>= {IN_TIME_GATE}), "
            f"indexer at {ratio:.2f}x (>= {RATE_GATE})"
        )
    return 0 if results["gate"]["met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
