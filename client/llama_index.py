"""LlamaIndex integrations over :class:`~client.EmbeddingClient` (extra ``frameworks``).

    from client.llama_index import TritonEmbedding, TritonMultiModalEmbedding

    embed_model = TritonEmbedding(model_name="all-MiniLM-L6-v2", query_prompt_name="query")
    Settings.embed_model = embed_model                     # or pass it to an index

    clip = TritonMultiModalEmbedding(model_name="clip-tiny")   # a CLIP model of the server
    clip.get_text_embedding("a photo of a cat")
    clip.get_image_embedding("cat.jpg")                   # a path, an http(s) URL or a BytesIO

    doc_fn, query_fn = triton_sparse_functions("splade", inference_free=True)
    store = QdrantVectorStore(..., enable_hybrid=True, sparse_doc_fn=doc_fn,
                              sparse_query_fn=query_fn)

Batches of ``embed_batch_size`` texts go to the server in one call, which the client
splits into requests of at most the model's ``max_batch_size``. ``timeout_s`` is each
call's deadline and ``retry`` its retry policy (None: no retries), as
:class:`~client.EmbeddingClient` takes them. Errors are the client's
:class:`~client.EmbeddingClientError` (:class:`~client.ServerOverloadedError` when the
server kept refusing). The async methods run the calls in a worker thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from io import BytesIO
from typing import Any

from llama_index.core.embeddings import BaseEmbedding, MultiModalEmbedding
from pydantic import Field, PrivateAttr

from .retry import DEFAULT_RETRY, RetryPolicy
from .sparse import as_lists
from .thread_client import SparseSides, ThreadClient

ImageType = str | BytesIO
# LlamaIndex's SparseEncoderCallable: texts -> (indices of each row, values of each row).
SparseFunction = Callable[[list[str]], tuple[list[list[int]], list[list[float]]]]


class _TritonFields:
    """Connection settings shared by the two embeddings (pydantic fields)."""

    url: str | None = Field(default=None, description="host:port of the server")
    protocol: str = Field(default="http", description="http or grpc")
    timeout_s: float = Field(default=60.0, description="deadline of each call, retries included")
    admin_key: str | None = Field(default=None, exclude=True, repr=False)
    retry: RetryPolicy | None = Field(
        default=DEFAULT_RETRY, exclude=True, description="retries of refusals (None: none)"
    )

    def _conn(self) -> ThreadClient:
        """The client of this object (``_connection``, a private attribute of each class)."""
        if self._connection is None:
            self._connection = ThreadClient(
                self.url, self.protocol, self.timeout_s, self.admin_key, self.retry
            )
        return self._connection


class TritonEmbedding(_TritonFields, BaseEmbedding):
    """A text ensemble of the server as a LlamaIndex embedding model."""

    query_prompt_name: str | None = Field(default=None, description="prompt for queries")
    text_prompt_name: str | None = Field(default=None, description="prompt for documents")
    dimensions: int | None = Field(default=None, description="Matryoshka: first k values")
    embed_batch_size: int = Field(default=64, gt=0, description="texts per call")
    _connection: ThreadClient | None = PrivateAttr(default=None)

    @classmethod
    def class_name(cls) -> str:
        """The name LlamaIndex stores with the settings."""
        return "TritonEmbedding"

    def _embed(self, texts: list[str], prompt_name: str | None) -> list[list[float]]:
        if not texts:
            return []
        vectors = self._conn().call(
            "embed_texts",
            self.model_name,
            texts,
            prompt_name=prompt_name,
            dimensions=self.dimensions,
        )
        return vectors.astype(float).tolist()

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._embed([query], self.query_prompt_name)[0]

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._embed([text], self.text_prompt_name)[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._embed(texts, self.text_prompt_name)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return await asyncio.to_thread(self._get_query_embedding, query)

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return await asyncio.to_thread(self._get_text_embedding, text)

    async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return await asyncio.to_thread(self._get_text_embeddings, texts)


class TritonMultiModalEmbedding(_TritonFields, MultiModalEmbedding):
    """A CLIP model of the server (``model_name`` without a suffix): texts and images."""

    embed_batch_size: int = Field(default=32, gt=0, description="items per call")
    _connection: ThreadClient | None = PrivateAttr(default=None)

    @classmethod
    def class_name(cls) -> str:
        """The name LlamaIndex stores with the settings."""
        return "TritonMultiModalEmbedding"

    def _texts(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        vectors = self._conn().call("embed_texts", f"{self.model_name}_text", texts)
        return vectors.astype(float).tolist()

    def _images(self, images: list[ImageType]) -> list[list[float]]:
        if not images:
            return []
        items: list[Any] = [i.getvalue() if isinstance(i, BytesIO) else i for i in images]
        return self._conn().call("embed_images", self.model_name, items).astype(float).tolist()

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._texts([query])[0]

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._texts([text])[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._texts(texts)

    def _get_image_embedding(self, img_file_path: ImageType) -> list[float]:
        return self._images([img_file_path])[0]

    def _get_image_embeddings(self, img_file_paths: list[ImageType]) -> list[list[float]]:
        return self._images(img_file_paths)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return await asyncio.to_thread(self._get_query_embedding, query)

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return await asyncio.to_thread(self._get_text_embedding, text)

    async def _aget_image_embedding(self, img_file_path: ImageType) -> list[float]:
        return await asyncio.to_thread(self._get_image_embedding, img_file_path)


def triton_sparse_functions(
    model: str,
    url: str | None = None,
    protocol: str = "http",
    *,
    inference_free: bool = False,
    max_active_dims: int | None = None,
    timeout_s: float = 60.0,
    admin_key: str | None = None,
    retry: RetryPolicy | None = DEFAULT_RETRY,
) -> tuple[SparseFunction, SparseFunction]:
    """``(sparse_doc_fn, sparse_query_fn)`` of a sparse-encoder ensemble of the server.

    What LlamaIndex's ``QdrantVectorStore(enable_hybrid=True, sparse_doc_fn=...,
    sparse_query_fn=...)`` takes: texts -> each row's indices and values, the server's
    padding removed. ``inference_free``: queries go with ``task="query"`` (the model's
    inference-free query side), documents with ``task="document"``; otherwise no task.
    ``max_active_dims`` keeps each row's k largest weights. Both share one connection.
    """
    connection = ThreadClient(url, protocol, timeout_s, admin_key, retry)
    sides = SparseSides(connection, model, inference_free, max_active_dims)

    def encoder(task: str) -> SparseFunction:
        def encode(texts: list[str]) -> tuple[list[list[int]], list[list[float]]]:
            return as_lists(sides.rows(texts, task))

        return encode

    return encoder("document"), encoder("query")
