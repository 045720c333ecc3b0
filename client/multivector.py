"""Multi-vector (ColBERT) embeddings from a served ``multi-vector`` model, and MaxSim.

The ensemble ``<model>`` takes ``TEXT`` [N, 1] and the request parameter ``task``
(``query`` or ``document``) and returns ``EMBEDDINGS`` [N, T, D] (each row's vectors,
zero-padded to the request's longest) and ``TOKEN_COUNT`` [N, 1];
:meth:`MultiVectorMixin.embed_multivector` hands back one ``[T_i, D]`` array per text.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .errors import EmbeddingClientError

OUTPUTS = ("EMBEDDINGS", "TOKEN_COUNT")


def maxsim(
    queries: Sequence[np.ndarray],
    documents: Sequence[np.ndarray],
    *,
    length_normalize: bool = False,
) -> np.ndarray:
    """Late-interaction scores ``[len(queries), len(documents)]`` (float32).

    ``score[i, j] = sum over query vectors q of max over document vectors d of q . d``,
    as ``sentence_transformers.util.maxsim`` (``MultiVectorEncoder.similarity``);
    ``length_normalize`` divides by the query's vector count (MeanMaxSim). Takes the
    per-text arrays of :meth:`MultiVectorMixin.embed_multivector` (never padded rows:
    a padding vector of zeros would take part in the max).
    """
    scores = np.zeros((len(queries), len(documents)), dtype=np.float32)
    for j, document in enumerate(documents):
        d = np.asarray(document, dtype=np.float32)
        for i, query in enumerate(queries):
            q = np.asarray(query, dtype=np.float32)
            if not len(q) or not len(d):
                continue
            best = (q @ d.T).max(axis=1)
            scores[i, j] = best.sum() / (len(q) if length_normalize else 1)
    return scores


class MultiVectorMixin:
    """``embed_multivector`` for :class:`client.api.EmbeddingClient`."""

    def embed_multivector(
        self, model: str, texts: Sequence[str], *, is_query: bool = False
    ) -> list[np.ndarray]:
        """Per text, its token vectors ``[T_i, D]`` (float32) from the ensemble ``model``.

        ``is_query`` encodes queries (the model's query marker and query expansion, as
        ``MultiVectorEncoder.encode_query``), else documents (``encode_document``: the
        document marker, skiplist tokens dropped). Texts go in requests of at most the
        model's ``max_batch_size``; score the results with :func:`maxsim`.
        """
        task = {"task": "query" if is_query else "document"}
        return self._text_rows(model, texts, lambda p: self._infer_multivector(model, p, task))

    def _infer_multivector(
        self, model: str, items: list[bytes], parameters: dict
    ) -> list[np.ndarray]:
        embeddings, counts = self._text_outputs(model, items, OUTPUTS, parameters)
        if (
            embeddings is None
            or counts is None
            or embeddings.ndim != 3
            or embeddings.shape[0] != len(items)
            or counts.size != len(items)
        ):
            raise EmbeddingClientError(
                f"expected EMBEDDINGS [{len(items)}, T, D] and TOKEN_COUNT of {len(items)} rows",
                model=model,
            )
        rows = counts.reshape(-1).astype(np.int64)
        return [
            np.ascontiguousarray(e[:n], dtype=np.float32)
            for e, n in zip(embeddings, rows, strict=True)
        ]
