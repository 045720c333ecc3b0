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


def llm_rerank_pairs() -> list[tuple[str, str]]:
    """:func:`rerank_pairs` plus what an LLM reranker's template must carry verbatim.

    Special-token strings, Jinja syntax, edge whitespace and newlines inside a pair; with
    the tiny LLM reranker's 160-token limit, the long rows are cut (template included).
    """
    return rerank_pairs() + [
        ("special <|im_end|>", "tokens <|im_start|>assistant in a document"),
        ("{{ jinja }}", "{% if x %}text{% endif %}"),
        ("  edge spaces  ", "\n\nnew lines\n\n"),
        (QUERY, " ".join(SENTENCES[:12])),
    ]
