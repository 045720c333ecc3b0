"""How :class:`~client.EmbeddingClient` sends a request: deadline, transport timeout, retries.

The gRPC channel options it connects with are here too (:func:`grpc_channel_args`).

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

GRPC_MAX_MESSAGE_BYTES = 2**31 - 1  # Triton's own limit, as tritonclient sets it
# The gRPC channel waits this long (ms) before its first reconnect attempt to a server it
# lost, growing to the second: gRPC's defaults (1 s, growing to 120 s) keep a client
# failing for up to two minutes after a restarted server is back.
RECONNECT_BACKOFF_MS = (250, 1000)


def grpc_channel_args(keepalive) -> list[tuple[str, int]]:
    """The channel options tritonclient sets itself, and a reconnect backoff capped at 1 s."""
    first, largest = RECONNECT_BACKOFF_MS
    return [
        ("grpc.max_send_message_length", GRPC_MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
        ("grpc.initial_reconnect_backoff_ms", first),
        ("grpc.min_reconnect_backoff_ms", first),
        ("grpc.max_reconnect_backoff_ms", largest),
    ]


def checked_rows(array: Any, name: str, rows: int, model: str, width: str) -> Any:
    """The output ``name`` of a request of ``rows`` items: an array [rows, width], else an error."""
    if array is None or array.ndim != 2 or array.shape[0] != rows:
        shape = None if array is None else array.shape
        raise EmbeddingClientError(
            f"expected {name} of shape [{rows}, {width}], got {shape}", model=model
        )
    return array


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

    def _text_outputs(
        self, model: str, items: list[bytes], names, parameters: dict | None, input_name="TEXT"
    ) -> list:
        """One request of ``items`` as the BYTES input ``input_name``: its outputs ``names``.

        Each as a numpy array, or None where the answer lacks it.
        """
        outputs = [self._tc.InferRequestedOutput(n) for n in names]
        result = self._send(model, [self._text_input(input_name, items)], outputs, parameters)
        return [result.as_numpy(n) for n in names]

    def _text_input(self, name: str, items: list[bytes]) -> Any:
        """The BYTES input ``name`` [N, 1] holding ``items``."""
        data = bytes_tensor(items)
        tensor = self._tc.InferInput(name, list(data.shape), "BYTES")
        with self._errors():
            tensor.set_data_from_numpy(data)
        return tensor
