"""LangChain integrations over :class:`~client.EmbeddingClient` (extra ``frameworks``).

    from client.langchain import TritonEmbeddings, TritonReranker

    embeddings = TritonEmbeddings(model="all-MiniLM-L6-v2", url="localhost:8001",
                                  protocol="grpc", query_prompt_name="query")
    vectors = embeddings.embed_documents(texts)       # list[list[float]], one per text
    query = embeddings.embed_query("what is triton?")

    reranker = TritonReranker(model="rerank-tiny", top_n=3)   # a document compressor
    best = reranker.compress_documents(documents, "what is triton?")

    sparse = TritonSparseEmbeddings(model="splade", inference_free=True)
    store = QdrantVectorStore.from_documents(docs, embeddings, sparse_embedding=sparse,
                                             retrieval_mode=RetrievalMode.HYBRID, ...)

Long lists are sent in requests of at most the model's ``max_batch_size`` (the client
splits them). ``timeout_s`` is each call's deadline and ``retry`` its retry policy (None:
no retries), as :class:`~client.EmbeddingClient` takes them; each object's retries share
one budget. Errors are the client's :class:`~client.EmbeddingClientError`
(:class:`~client.ServerOverloadedError` when the server kept refusing), raised to the
caller as LangChain does with any embedding error. The async methods run the same calls
in a worker thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import Callbacks
from langchain_core.documents import Document
from langchain_core.documents.compressor import BaseDocumentCompressor
from langchain_core.embeddings import Embeddings
from pydantic import ConfigDict, PrivateAttr

from .retry import DEFAULT_RETRY, RetryPolicy
from .thread_client import ThreadClient, ThreadedEmbeddings


def __getattr__(name: str) -> Any:
    """``TritonSparseEmbeddings``, imported on first use.

    langchain-qdrant pulls in qdrant-client: seconds of import the dense classes do not need.
    """
    if name == "TritonSparseEmbeddings":
        from .langchain_sparse import TritonSparseEmbeddings  # noqa: PLC0415 - see above

        return TritonSparseEmbeddings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class TritonEmbeddings(ThreadedEmbeddings[list[float]], Embeddings):
    """A text ensemble of the server as LangChain ``Embeddings`` (CLIP: ``<name>_text``).

    ``query_prompt_name`` / ``document_prompt_name`` pick the model's prompts for
    queries and documents (None: the model's default); ``dimensions`` keeps the first k
    values (Matryoshka models).
    """

    def __init__(
        self,
        model: str,
        url: str | None = None,
        protocol: str = "http",
        *,
        query_prompt_name: str | None = None,
        document_prompt_name: str | None = None,
        dimensions: int | None = None,
        timeout_s: float = 60.0,
        admin_key: str | None = None,
        retry: RetryPolicy | None = DEFAULT_RETRY,
    ):
        self.model = model
        self.query_prompt_name = query_prompt_name
        self.document_prompt_name = document_prompt_name
        self.dimensions = dimensions
        self._connection = ThreadClient(url, protocol, timeout_s, admin_key, retry)

    def _embed(self, texts: Sequence[str], prompt_name: str | None) -> list[list[float]]:
        if not texts:
            return []
        vectors = self._connection.call(
            "embed_texts",
            self.model,
            list(texts),
            prompt_name=prompt_name,
            dimensions=self.dimensions,
        )
        return vectors.astype(float).tolist()

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """One vector per text, with the documents' prompt."""
        return self._embed(texts, self.document_prompt_name)

    def embed_query(self, text: str) -> list[float]:
        """The vector of one query, with the queries' prompt."""
        return self._embed([text], self.query_prompt_name)[0]


class TritonReranker(BaseDocumentCompressor):
    """A cross-encoder ensemble of the server as a LangChain document compressor.

    Keeps the ``top_n`` documents by score (all when None), best first, each with its
    score in ``metadata["relevance_score"]``.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    model: str
    url: str | None = None
    protocol: str = "http"
    top_n: int | None = 3
    timeout_s: float = 60.0
    admin_key: str | None = None
    retry: RetryPolicy | None = DEFAULT_RETRY
    _connection: ThreadClient | None = PrivateAttr(default=None)

    def _conn(self) -> ThreadClient:
        if self._connection is None:
            self._connection = ThreadClient(
                self.url, self.protocol, self.timeout_s, self.admin_key, self.retry
            )
        return self._connection

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        """The documents ranked against ``query`` by the server's reranker."""
        if not documents:
            return []
        texts = [doc.page_content for doc in documents]
        ranked = self._conn().call("rank", self.model, query, texts, k=self.top_n)
        return [
            Document(
                page_content=documents[r.index].page_content,
                metadata={**documents[r.index].metadata, "relevance_score": r.score},
                id=documents[r.index].id,
            )
            for r in ranked
        ]
