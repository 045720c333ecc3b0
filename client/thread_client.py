"""A client that the framework integrations share across threads.

tritonclient's HTTP client runs on gevent and may only be used, and closed, in the thread
that made it; LangChain's and LlamaIndex's async methods call from worker threads.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .api import EmbeddingClient
from .retry import DEFAULT_RETRY, NO_RETRY, RetryBudget, RetryPolicy
from .sparse import SparseRow


class ThreadClient:
    """The integration object's client, kept for the thread that made it.

    tritonclient's HTTP client runs on gevent and may only be used, and closed, in the
    thread that made it. The first thread to call keeps a client; calls from any other
    thread (the frameworks' async methods run in worker threads) open a client, use it
    and close it there. All of them retry with ``retry`` from one :class:`RetryBudget`
    (``retry_budget``, default a new one): the object's retries stay within one budget
    however many threads call it.
    """

    def __init__(
        self,
        url: str | None,
        protocol: str,
        timeout_s: float,
        admin_key: str | None,
        retry: RetryPolicy | None = DEFAULT_RETRY,
        retry_budget: RetryBudget | None = None,
    ):
        self._args = (url, protocol, timeout_s)
        self._admin_key = admin_key
        self._retry = retry
        self._budget = retry_budget or RetryBudget(clock=(retry or NO_RETRY).clock)
        self._client: EmbeddingClient | None = None
        self._owner: int | None = None
        self._lock = threading.Lock()

    def _new(self) -> EmbeddingClient:
        url, protocol, timeout_s = self._args
        return EmbeddingClient(
            url,
            protocol,
            timeout_s,
            admin_key=self._admin_key,
            retry=self._retry,
            retry_budget=self._budget,
        )

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``EmbeddingClient.<method>(*args, **kwargs)`` on this thread's client."""
        me = threading.get_ident()
        with self._lock:
            if self._owner is None:
                self._owner, self._client = me, self._new()
            mine = self._owner == me
        if mine:
            return getattr(self._client, method)(*args, **kwargs)
        with self._new() as client:
            return getattr(client, method)(*args, **kwargs)

    def close(self) -> None:
        """Close the kept client (from the thread that made it); a later call opens one."""
        with self._lock:
            client, self._client, self._owner = self._client, None, None
        if client is not None:
            client.close()


@dataclass(frozen=True)
class SparseSides:
    """A sparse-encoder model's document and query sides, over one :class:`ThreadClient`.

    ``inference_free``: the model has an inference-free query side (a ``Router`` with a
    static query route), so each call names its side as ``task``; otherwise no task is
    sent. ``max_active_dims`` keeps each row's k largest weights.
    """

    connection: ThreadClient
    model: str
    inference_free: bool
    max_active_dims: int | None

    def rows(self, texts: Sequence[str], task: str) -> list[SparseRow]:
        """``embed_sparse`` of ``texts`` as the side ``task`` (query or document).

        No texts: no call, no rows.
        """
        if not texts:
            return []
        return self.connection.call(
            "embed_sparse",
            self.model,
            list(texts),
            task=task if self.inference_free else None,
            max_active_dims=self.max_active_dims,
        )


V = TypeVar("V")  # what one text embeds to


class ThreadedEmbeddings(Generic[V]):
    """The async forms and ``close`` that this package's LangChain embeddings share.

    A class that mixes it in sets ``_connection`` and defines ``embed_documents`` /
    ``embed_query``, whose rows are ``V``.
    """

    _connection: ThreadClient

    async def aembed_documents(self, texts: list[str]) -> list[V]:
        """:meth:`embed_documents` in a worker thread."""
        return await asyncio.to_thread(self.embed_documents, texts)

    async def aembed_query(self, text: str) -> V:
        """:meth:`embed_query` in a worker thread."""
        return await asyncio.to_thread(self.embed_query, text)

    def close(self) -> None:
        """Close the connection (a later call opens a new one)."""
        self._connection.close()
