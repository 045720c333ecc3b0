"""Long texts embedded whole: the chunks of ``<model>_chunks``, or one vector per text.

``<model>_chunks`` takes ``TEXT`` [N, 1] and answers one row per chunk: ``EMBEDDING``
[M, D], ``CHUNK_ROW`` [M, 1] (the input row), ``CHUNK_SPAN`` [M, 2] (start and end as
Python ``str`` indices into that row) and ``TOKEN_COUNT`` [M, 1] (the chunk's own
tokens). With ``long_text="mean"`` it answers one row per text: the token-weighted mean
of its chunks' vectors. :meth:`ChunksMixin.embed_chunks` hands back :class:`TextChunk`
rows; :meth:`ChunksMixin.embed_long_texts` the per-text vectors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from .errors import EmbeddingClientError
from .payload import encode_texts, request_parameters

CHUNKS_SUFFIX = "_chunks"
OUTPUTS = ("EMBEDDING", "CHUNK_ROW", "CHUNK_SPAN", "TOKEN_COUNT")
SPAN_OUTPUTS = OUTPUTS[1:]


@dataclass(frozen=True)
class TextChunk:
    """One chunk: ``texts[row][start:end]``, its ``tokens`` and its ``vector``."""

    row: int
    start: int
    end: int
    tokens: int
    vector: np.ndarray | None  # None: the spans alone were asked (chunk_spans)


def chunks_model(model: str) -> str:
    """The model that chunks ``model``'s texts: ``<model>_chunks`` (a name given as is)."""
    return model if model.endswith(CHUNKS_SUFFIX) else model + CHUNKS_SUFFIX


class ChunksMixin:
    """``embed_chunks`` and ``embed_long_texts`` for :class:`client.api.EmbeddingClient`."""

    def embed_chunks(
        self,
        model: str,
        texts: Sequence[str],
        *,
        chunk_tokens: int | None = None,
        chunk_overlap: int | None = None,
        prompt_name: str | None = None,
        dimensions: int | None = None,
        late_chunking: bool | None = None,
    ) -> list[TextChunk]:
        """The chunks of every text of ``texts``, in order, each with its vector.

        The server cuts each text in its tokenizer's tokens (``chunk_tokens`` each, by
        default the model's window; ``chunk_overlap`` tokens shared by neighbours) and
        embeds each chunk as ``SentenceTransformer.encode(text[start:end])`` does, with
        the model's prompt ``prompt_name`` and ``dimensions`` as for any text.
        ``late_chunking=True`` pools each chunk from one transformer pass over its whole
        text instead (a model built with ``late_chunking = true``).
        """
        return self._chunked(
            model,
            texts,
            chunk_tokens=chunk_tokens,
            chunk_overlap=chunk_overlap,
            prompt_name=prompt_name,
            dimensions=dimensions,
            late_chunking=late_chunking,
        )

    def chunk_spans(
        self,
        model: str,
        texts: Sequence[str],
        *,
        chunk_tokens: int | None = None,
        chunk_overlap: int | None = None,
        prompt_name: str | None = None,
    ) -> list[TextChunk]:
        """The chunks :meth:`embed_chunks` would embed, without their vectors.

        The server cuts the texts in its tokenizer's tokens and encodes nothing: what a
        text splitter needs so that no chunk is cut again when it is embedded.
        """
        return self._chunked(
            model,
            texts,
            SPAN_OUTPUTS,
            chunk_tokens=chunk_tokens,
            chunk_overlap=chunk_overlap,
            prompt_name=prompt_name,
        )

    def embed_long_texts(
        self,
        model: str,
        texts: Sequence[str],
        *,
        chunk_tokens: int | None = None,
        chunk_overlap: int | None = None,
        prompt_name: str | None = None,
        dimensions: int | None = None,
    ) -> np.ndarray:
        """One vector per text, however long: the token-weighted mean of its chunks.

        Normalised as the model normalises (``long_text="mean"`` on ``<model>_chunks``);
        float32 ``[N, D]``.
        """
        rows = self._chunked(
            model,
            texts,
            chunk_tokens=chunk_tokens,
            chunk_overlap=chunk_overlap,
            prompt_name=prompt_name,
            dimensions=dimensions,
            long_text="mean",
        )
        if not rows:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([row.vector for row in rows])

    def _chunked(
        self, model: str, texts: Sequence[str], outputs=OUTPUTS, **options
    ) -> list[TextChunk]:
        """The chunks ``<model>_chunks`` answers for ``texts`` asked with ``options`` (not None).

        Rows are numbered across the request-sized parts.
        """
        model, parameters = chunks_model(model), request_parameters(**options)
        items = encode_texts(texts)
        if not items:
            return []
        # Parts may be answered in any order (several in flight): each is numbered from 0
        # and shifted by the rows of the parts before it here, in part order.
        parts = self._batched(
            model,
            items,
            lambda part: (len(part), self._infer_chunks(model, part, parameters, 0, outputs)),
        )
        chunks, done = [], 0
        for count, rows in parts:
            chunks += [replace(chunk, row=chunk.row + done) for chunk in rows]
            done += count
        return chunks

    def _infer_chunks(
        self, model: str, items: list[bytes], parameters: dict, first_row: int, names=OUTPUTS
    ) -> list[TextChunk]:
        arrays = dict(zip(names, self._text_outputs(model, items, names, parameters), strict=True))
        if any(a is None for a in arrays.values()) or len({len(a) for a in arrays.values()}) > 1:
            raise EmbeddingClientError(f"expected {', '.join(names)} of M rows each", model=model)
        rows, spans = arrays["CHUNK_ROW"].reshape(-1), arrays["CHUNK_SPAN"].reshape(-1, 2)
        tokens = arrays["TOKEN_COUNT"].reshape(-1)
        vectors = arrays.get("EMBEDDING")
        return [
            TextChunk(
                int(r) + first_row, int(s), int(e), int(t),
                None if vectors is None else vectors[n].astype(np.float32, copy=False),
            )
            for n, (r, (s, e), t) in enumerate(zip(rows, spans, tokens, strict=True))
        ]
