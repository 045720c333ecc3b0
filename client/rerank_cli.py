"""``python -m client rerank --model M --query Q TEXT...``: texts ranked by score."""

from __future__ import annotations

import argparse
import json
import sys

from .rerank import top_k


def add_parser(sub, common: argparse.ArgumentParser) -> None:
    """Add the ``rerank`` subcommand."""
    rerank = sub.add_parser(
        "rerank", parents=[common], help="score texts against a query (cross-encoder)"
    )
    rerank.add_argument("--model", required=True, help="a cross-encoder model, e.g. rerank-tiny")
    rerank.add_argument("--query", required=True)
    rerank.add_argument("texts", nargs="+", metavar="TEXT", help="texts to score")
    rerank.add_argument("--top-k", type=int, help="print only the best K (default: all)")


def run(client, args: argparse.Namespace) -> int:
    """Print one JSON line per text, best first: index, score and text."""
    scores = client.rerank(args.model, args.query, args.texts)
    for item in top_k(scores, args.texts, args.top_k):
        line = {"index": item.index, "score": item.score, "text": item.text}
        sys.stdout.write(json.dumps(line, ensure_ascii=False) + "\n")
    return 0
