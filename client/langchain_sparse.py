"""A sparse-encoder ensemble as langchain-qdrant's ``SparseEmbeddings`` (extra ``frameworks``).

Import :class:`TritonSparseEmbeddings` from :mod:`client.langchain`.
"""

from __future__ import annotations

from collections.abc import Sequence

from langchain_qdrant import SparseEmbeddings, SparseVector

from .retry import DEFAULT_RETRY, RetryPolicy
from .thread_client import SparseSides, ThreadClient, ThreadedEmbeddings


class TritonSparseEmbeddings(ThreadedEmbeddings[SparseVector], SparseEmbeddings):
    """A sparse-encoder ensemble of the server as langchain-qdrant ``SparseEmbeddings``.

    For ``QdrantVectorStore(sparse_embedding=...)`` (sparse or hybrid retrieval). Each
    text gives a ``SparseVector`` of its active dimensions, the server's padding removed.
    ``inference_free``: the model has an inference-free query side (a ``Router`` with a
    static query route, as ``SparseEncoder.encode_query`` uses): queries are sent with
    ``task="query"``, documents with ``task="document"``; otherwise no task is sent.
    ``max_active_dims`` keeps each row's k largest weights. ``timeout_s`` and ``retry``:
    each call's deadline and retry policy, as :class:`~client.EmbeddingClient` takes them.
    """

    def __init__(
        self,
        model: str,
        url: str | None = None,
        protocol: str = "http",
        *,
        inference_free: bool = False,
        max_active_dims: int | None = None,
        timeout_s: float = 60.0,
        admin_key: str | None = None,
        retry: RetryPolicy | None = DEFAULT_RETRY,
    ):
        self._connection = ThreadClient(url, protocol, timeout_s, admin_key, retry)
        self._sides = SparseSides(self._connection, model, inference_free, max_active_dims)

    def _embed(self, texts: Sequence[str], task: str) -> list[SparseVector]:
        rows = self._sides.rows(texts, task)
        return [SparseVector(indices=i.tolist(), values=v.tolist()) for i, v in rows]

    def embed_documents(self, texts: list[str]) -> list[SparseVector]:
        """One sparse vector per text (the document side)."""
        return self._embed(texts, "document")

    def embed_query(self, text: str) -> SparseVector:
        """The sparse vector of one query (the query side)."""
        return self._embed([text], "query")[0]
