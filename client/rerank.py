"""Reranking with a served cross-encoder: one query against many texts.

The ensemble ``<model>`` of a ``cross-encoder`` entry takes ``QUERY`` [N, 1] and
``TEXT`` [N, 1] (row ``i`` is the pair ``(QUERY[i], TEXT[i])``) and returns ``SCORE``
[N, 1]; :meth:`RerankMixin.rerank` repeats the query once per text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .errors import EmbeddingClientError
from .payload import encode_texts, request_parameters
from .sending import checked_rows

QUERY_INPUT = "QUERY"
TEXT_INPUT = "TEXT"
SCORE_OUTPUT = "SCORE"


@dataclass(frozen=True)
class Ranked:
    """One text of a ranking: its index in the input, its score and the text."""

    index: int
    score: float
    text: str


def top_k(scores: np.ndarray, texts: Sequence[str], k: int | None = None) -> list[Ranked]:
    """``texts`` sorted by descending score (ties keep input order), at most ``k``."""
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    return [Ranked(int(i), float(scores[i]), texts[i]) for i in order[:k]]


class RerankMixin:
    """``rerank`` and ``rank`` for :class:`client.api.EmbeddingClient`."""

    def rerank(
        self,
        model: str,
        query: str,
        texts: Sequence[str],
        *,
        truncate: bool | None = None,
        prompt_name: str | None = None,
    ) -> np.ndarray:
        """Score every text against ``query``: float32 [N] (float32 [N, L] for L labels).

        Scores are what ``CrossEncoder.predict`` returns (its activation, Sigmoid for a
        one-label model, runs in the graph). Texts are sent in requests of at most the
        model's ``max_batch_size`` pairs and about ``max_request_bytes`` bytes; an empty
        list returns an empty array without calling the server. ``truncate=False``
        refuses a pair longer than the model's limit instead of cutting it.
        ``prompt_name`` picks one of an LLM reranker's prompts (its instruction), as
        ``CrossEncoder.predict(prompt_name=...)``; without it the model's default applies.
        """
        parameters = request_parameters(truncate=truncate, prompt_name=prompt_name) or None
        if not isinstance(query, str):
            raise EmbeddingClientError("query must be a string")
        items = encode_texts(texts)
        if not items:
            return np.zeros((0,), dtype=np.float32)
        q = query.encode("utf-8")
        chunks = self._batched(
            model, items, lambda part: self._score(model, q, part, parameters), len(q)
        )
        scores = np.concatenate(chunks, axis=0)
        return scores[:, 0] if scores.shape[1] == 1 else scores

    def rank(
        self,
        model: str,
        query: str,
        texts: Sequence[str],
        k: int | None = None,
        *,
        prompt_name: str | None = None,
    ) -> list[Ranked]:
        """The ``k`` best texts for ``query`` (all when ``k`` is None), best first."""
        scores = self.rerank(model, query, texts, prompt_name=prompt_name)
        return top_k(scores, list(texts), k)

    def _score(
        self, model: str, query: bytes, items: list[bytes], parameters: dict | None = None
    ) -> np.ndarray:
        inputs = [
            self._text_input(QUERY_INPUT, [query] * len(items)),
            self._text_input(TEXT_INPUT, items),
        ]
        outputs = [self._tc.InferRequestedOutput(SCORE_OUTPUT)]
        result = self._send(model, inputs, outputs, parameters)
        scores = checked_rows(result.as_numpy(SCORE_OUTPUT), SCORE_OUTPUT, len(items), model, "L")
        return scores.astype(np.float32, copy=False)
