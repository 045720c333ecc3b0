"""Long documents: recall of the four ways to embed them, and what chunks cost.

Python's own help topics (``pydoc_data.topics``) as documents, queries from
``bench/fixtures/long_documents.json`` (``fixture`` rewrites it); served at windows 256 and
512: recall@1 / @10 per way, and chunk rows/s (``<name>_chunks``, the indexer) over plain rows.

    .venv/bin/python -m bench.long_documents fixture       # rewrite the fixture
    .venv/bin/python -m bench.long_documents [--rounds 2]  # serve, measure, record
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import logger, run_threads, save_results
from bench.manifest import TEXT_MODEL, bench_manifest_data, served
from generator.manifest import parse_manifest

log = logger("long-documents")
ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "bench" / "fixtures" / "long_documents.json"
LONG_MODEL = "minilm-512"
PAST_TOKENS = 300
QUERIES_PER_DOCUMENT = 3
RATE_GATE = 0.9
WAYS = ("truncate", "chunks", "late", "mean")


def topics() -> dict[str, str]:
    """The documents: Python's help topics, by name."""
    from pydoc_data.topics import topics as text

    return dict(sorted(text.items()))


def digest(documents: dict[str, str]) -> str:
    """sha256 of the documents, names and texts."""
    return hashlib.sha256(json.dumps(documents, sort_keys=True).encode()).hexdigest()


def _sentences(text: str) -> list[tuple[int, str]]:
    """Prose sentences of ``text`` (8-30 words, mostly letters) with where they start."""
    out = []
    for match in re.finditer(r"[A-Z][^.!?\n]*(?:\n(?!\n)[^.!?\n]*)*[.!?]", text):
        sentence = " ".join(match.group().split())
        words = sentence.split()
        letters = sum(c.isalpha() for c in sentence) / max(len(sentence), 1)
        if 8 <= len(words) <= 30 and letters > 0.75:
            out.append((match.start(), sentence))
    return out


def make_fixture(tokenizer_json: Path) -> dict[str, Any]:
    """The queries of the set (see the module), from the served tokenizer's counts."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    tokenizer.no_truncation()
    documents = topics()
    rng = random.Random(57)  # noqa: S311 - a fixed sample, not a secret
    queries = []
    for name, text in documents.items():
        encoding = tokenizer.encode(text, add_special_tokens=False)
        if not 1000 <= len(encoding.ids) <= 20000:
            continue
        past = encoding.offsets[PAST_TOKENS][0]
        candidates = [s for at, s in _sentences(text) if at >= past]
        for sentence in rng.sample(candidates, min(QUERIES_PER_DOCUMENT, len(candidates))):
            words = [w for i, w in enumerate(sentence.split()) if i % 3 != 2]
            queries.append({"document": name, "query": " ".join(words)})
    return {"source": "pydoc_data.topics", "digest": digest(documents), "queries": queries}


def recall(scores: np.ndarray, names: list[str], wanted: list[str], k: int) -> float:
    """Share of queries whose document is among the ``k`` best (``scores``: [Q, docs])."""
    best = np.argsort(-scores, axis=1)[:, :k]
    return float(np.mean([wanted[q] in {names[j] for j in best[q]} for q in range(len(wanted))]))


def document_scores(queries: np.ndarray, vectors: np.ndarray, rows: np.ndarray, n: int):
    """[Q, n]: each document's best chunk score for each query."""
    chunk_scores = queries @ vectors.T
    out = np.full((len(queries), n), -np.inf, dtype=np.float32)
    for j in range(n):
        out[:, j] = chunk_scores[:, rows == j].max(axis=1)
    return out


def measure_recall(client, model: str, documents: dict[str, str], fixture: dict) -> dict:
    """Recall@1 / @10 of each way (:data:`WAYS`) for ``model``."""
    names, texts = list(documents), list(documents.values())
    wanted = [q["document"] for q in fixture["queries"]]
    queries = client.embed_texts(model, [q["query"] for q in fixture["queries"]])
    out = {}
    for way in WAYS:
        if way == "truncate":  # the plain ensemble cuts at the window; 16 KiB rows at most
            heads = [t.encode()[:16000].decode(errors="ignore") for t in texts]
            vectors, rows = client.embed_texts(model, heads), np.arange(len(texts))
        elif way == "mean":
            vectors, rows = client.embed_long_texts(model, texts), np.arange(len(texts))
        else:
            chunks = client.embed_chunks(model, texts, late_chunking=way == "late" or None)
            vectors = np.stack([c.vector for c in chunks])
            rows = np.array([c.row for c in chunks])
        scores = document_scores(queries, vectors, rows, len(texts))
        out[way] = {"recall@1": recall(scores, names, wanted, 1),
                    "recall@10": recall(scores, names, wanted, 10), "vectors": len(vectors)}
        log(f"{model} {way}: recall@10 {out[way]['recall@10']:.3f}, @1 {out[way]['recall@1']:.3f}")
    return out


def _rate(make_client, calls: list, clients: int) -> float:
    """Rows/s of ``calls`` (each ``(fn(client), rows)``) shared by ``clients`` threads."""
    queue, lock, done = list(calls), threading.Lock(), [0]

    def work() -> None:
        with make_client() as client:
            while True:
                with lock:
                    if not queue:
                        return
                    call, rows = queue.pop()
                call(client)
                with lock:
                    done[0] += rows

    wall = run_threads([threading.Thread(target=work) for _ in range(clients)])
    return done[0] / wall  # read after the threads ran


def measure_cost(make_client, model: str, texts: list[str], rounds: int, url: str) -> dict:
    """Chunk rows/s: ``<name>_chunks``, the same chunks as plain rows, and the indexer."""
    with make_client() as client:
        chunks = client.embed_chunks(model, texts)
    pieces = [texts[c.row][c.start : c.end] for c in chunks]
    plain = [(lambda c, p=pieces[i : i + 32]: c.embed_texts(model, p), len(pieces[i : i + 32]))
             for i in range(0, len(pieces), 32)]
    per_doc = [(lambda c, t=texts[i : i + 2]: c.embed_chunks(model, t),
                sum(1 for x in chunks if i <= x.row < i + 2)) for i in range(0, len(texts), 2)]
    per_doc.sort(key=lambda call: call[1])  # the largest first (popped from the end)
    best = {"plain rows": 0.0, "chunks": 0.0, "index": 0.0}
    for n in range(rounds):
        best["plain rows"] = max(best["plain rows"], _rate(make_client, plain, 4))
        best["chunks"] = max(best["chunks"], _rate(make_client, per_doc, 4))
        best["index"] = max(best["index"], _index_rate(model, texts, len(pieces), url))
        log(f"round {n + 1}: " + ", ".join(f"{k} {v:.1f} rows/s" for k, v in best.items()))
    return {
        "chunk_rows": len(pieces),
        "rows_per_s": best,
        "chunks_ratio": best["chunks"] / best["plain rows"],
        "index_ratio": best["index"] / best["plain rows"],
    }


def _index_rate(model: str, texts: list[str], rows: int, url: str) -> float:
    from client.index import IndexJob, run_index

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "docs.jsonl"
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
        job = IndexJob(model, [str(path)], str(Path(tmp) / "out"), url=url,
                       options={"chunk_tokens": 254}, progress="quiet")
        start = time.perf_counter()
        run_index(job)
        return rows / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    """Write the fixture, or serve and measure (see the module); 1 when a gate fails."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="?", choices=["fixture", "run"], default="run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="one round, the shipped model")
    args = parser.parse_args(argv)
    if args.command == "fixture":
        tokenizer = ROOT / "model_repository" / f"{TEXT_MODEL}_tokenize" / "1" / "tokenizer.json"
        FIXTURE.parent.mkdir(parents=True, exist_ok=True)
        FIXTURE.write_text(json.dumps(make_fixture(tokenizer), indent=1) + "\n")
        log(f"wrote {FIXTURE.relative_to(ROOT)}")
        return 0
    fixture = json.loads(FIXTURE.read_text())
    documents = topics()
    if digest(documents) != fixture["digest"]:
        log("this Python's help topics differ from the fixture's: run `fixture` first")
        return 2
    data = bench_manifest_data()
    text = {**data["models"][0], "late_chunking": True}
    long = {**text, "name": LONG_MODEL, "max_seq_length": 512, "litellm": False}
    data["models"] = [text] if args.quick else [text, long]
    manifest = parse_manifest(data, ROOT, "long-documents manifest")
    results: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "queries": len(fixture["queries"]), "documents": len(documents)}
    from client import EmbeddingClient

    with ExitStack() as stack:
        ports = stack.enter_context(served(manifest, "long-documents", log=log)).ports
        url = f"127.0.0.1:{ports.http}"

        def make_client():
            return EmbeddingClient(url, timeout_s=600)

        with make_client() as client:
            results["recall"] = {
                e["name"]: measure_recall(client, e["name"], documents, fixture)
                for e in data["models"]
            }
        texts = list(documents.values())
        rounds = 1 if args.quick else args.rounds
        results["cost"] = measure_cost(make_client, TEXT_MODEL, texts, rounds, url)
    cost = results["cost"]
    results["gates"] = {"chunks_ratio": cost["chunks_ratio"] >= RATE_GATE,
                        "index_ratio": cost["index_ratio"] >= RATE_GATE}
    log(f"chunks {cost['chunks_ratio']:.2f}x, index {cost['index_ratio']:.2f}x of plain rows")
    log(f"recorded {save_results(results, 'long-documents', args.quick)}")
    return 0 if all(results["gates"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
