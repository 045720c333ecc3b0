"""A client that the framework integrations share across threads.

tritonclient's HTTP client runs on gevent and may only be used, and closed, in the thread
that made it; LangChain's and LlamaIndex's async methods call from worker threads.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

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

    def embed_sparse_side(
        self,
        model: str,
        texts: Sequence[str],
        task: str,
        inference_free: bool,
        max_active_dims: int | None,
    ) -> list[SparseRow]:
        """``embed_sparse`` of ``texts`` as one side (``task``: query or document) of ``model``.

        The task is sent only to a model with an inference-free query side; no texts: no
        call, no rows.
        """
        if not texts:
            return []
        return self.call(
            "embed_sparse",
            model,
            list(texts),
            task=task if inference_free else None,
            max_active_dims=max_active_dims,
        )

    def close(self) -> None:
        """Close the kept client (from the thread that made it); a later call opens one."""
        with self._lock:
            client, self._client, self._owner = self._client, None, None
        if client is not None:
            client.close()
