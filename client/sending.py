"""How :class:`~client.EmbeddingClient` sends a request: deadline, transport timeout, retries.

A mixin, as the client's other parts are: it needs the client's ``_client`` (tritonclient's),
``_tc`` (its module), ``url``, ``protocol``, ``timeout_s``, ``retry``, ``retry_budget``,
``_deadline`` and, for HTTP, ``_gevent``.
"""

from __future__ import annotations

import http.client
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tritonclient.utils import InferenceServerException

from .deadline import Deadline, with_deadline
from .errors import EmbeddingClientError
from .payload import bytes_tensor
from .retry import call_with_retries


class _TransportTimeout(TimeoutError):
    """An HTTP request past its deadline (an OSError: geventhttpclient then closes the socket)."""


class SendMixin:
    """``_errors``, the call's deadline, and ``_send``: one infer request, retried on refusals."""

    @contextmanager
    def _errors(self, model: str | None = None) -> Iterator[None]:
        try:
            yield
        except InferenceServerException as exc:
            message = exc.message() or str(exc)
            raise EmbeddingClientError(message, status=exc.status(), model=model) from exc
        except (OSError, http.client.HTTPException) as exc:
            raise EmbeddingClientError(
                f"cannot reach Triton at {self.url} ({self.protocol}): {exc}", model=model
            ) from exc

    @contextmanager
    def _call_deadline(self) -> Iterator[Deadline]:
        """The deadline of the public call under way, set here when none is (``timeout_s``)."""
        if self._deadline is not None:
            yield self._deadline
            return
        self._deadline = self.retry.deadline(self.timeout_s)
        try:
            yield self._deadline
        finally:
            self._deadline = None

    @contextmanager
    def _transport(self, seconds: float) -> Iterator[dict[str, Any]]:
        """Keyword arguments and scope that end one request after ``seconds``.

        gRPC: the call's deadline. HTTP: a gevent timeout raising an OSError, on which
        geventhttpclient closes the connection (Triton then cancels the request).
        """
        seconds = max(seconds, 1e-3)
        if self.protocol == "grpc":
            yield {"client_timeout": seconds}
            return
        with self._gevent.Timeout(seconds, _TransportTimeout(f"no answer in {seconds:.3f} s")):
            yield {}

    def _retried(self, model: str | None, send) -> Any:
        """``send(deadline)`` within the call's deadline, retried on refusals."""
        with self._call_deadline() as deadline:
            return call_with_retries(
                lambda: send(deadline), deadline, self.retry, self.retry_budget, model
            )

    def _send(self, model: str, inputs: list, outputs: list, parameters: dict | None = None) -> Any:
        """One infer request of ``inputs`` (tritonclient ``InferInput``s with their data).

        Sent with the time left of the call's deadline (transport timeout and
        ``deadline_unix_us``, merged into ``parameters``), retried on refusals.
        """

        def attempt(deadline: Deadline) -> Any:
            with self._errors(model), self._transport(deadline.remaining()) as timeout:
                return self._client.infer(
                    model,
                    inputs,
                    outputs=outputs,
                    parameters=with_deadline(parameters, deadline),
                    **timeout,
                )

        return self._retried(model, attempt)

    def _text_input(self, name: str, items: list[bytes]) -> Any:
        """The BYTES input ``name`` [N, 1] holding ``items``."""
        data = bytes_tensor(items)
        tensor = self._tc.InferInput(name, list(data.shape), "BYTES")
        with self._errors():
            tensor.set_data_from_numpy(data)
        return tensor
