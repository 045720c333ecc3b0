"""Query/passage pairs shared by the reranker tests: short, long, and over max_length."""

from __future__ import annotations

from client.load.corpus import LONG_TEXTS, SENTENCES

QUERY = "how does a cross-encoder rerank passages?"


def rerank_pairs() -> list[tuple[str, str]]:
    """Pairs of very different lengths, several over the tiny model's 64-token limit."""
    pairs = [(QUERY, text) for text in SENTENCES[:6]]
    pairs += [(QUERY, text) for text in LONG_TEXTS[:2]]
    pairs += [("a long query " * 40, "short text"), ("x", "y")]
    pairs += [("both long " * 50, "and longer still " * 50), ("¿Qué?", "東京は日本の首都です。")]
    return pairs
