"""How :class:`~client.EmbeddingClient` sends a request: deadline, transport timeout, retries.

The gRPC channel options it connects with are here too (:func:`grpc_channel_args`), and how
the requests of one call are kept in flight together (``SendMixin._each_part``).

A mixin, as the client's other parts are: it needs the client's ``_client`` (tritonclient's),
``_tc`` (its module), ``url``, ``protocol``, ``timeout_s``, ``retry``, ``retry_budget``,
``_deadline``, ``max_in_flight``, ``_threads`` (None until first used) and, for HTTP,
``_gevent``.
"""

from __future__ import annotations

import http.client
import importlib
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from tritonclient.utils import InferenceServerException

from .deadline import Deadline, with_deadline
from .errors import EmbeddingClientError
from .payload import bytes_tensor
from .retry import call_with_retries

T = TypeVar("T")

# Requests of one call (a list longer than the model's max_batch_size) in flight at once by
# default: the next request's tokenizing or image decode overlaps this one's encoding, and
# a model's two encoder instances both work. One at a time, a single caller got 0.52-0.76x
# of open_clip's own text rate on a 2-core CPU, 4 at a time 0.94-1.50x (docs/clients.md).
MAX_IN_FLIGHT = 4
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

    def _each_part(self, call: Callable[[Any], T], parts: Sequence[Any]) -> list[T]:
        """``call(part)`` of each of ``parts``, answered in order, ``max_in_flight`` at once.

        gRPC: the client's worker threads share its channel; HTTP: greenlets share its
        connection pool (made with ``concurrency=max_in_flight``). Once a part has failed
        no further part is sent, and the first failure in part order is raised when the
        parts sent have ended (within the call's deadline).
        """
        if len(parts) < 2 or self.max_in_flight < 2:
            return [call(part) for part in parts]
        outcomes: list[tuple[bool, Any]] = [(False, None)] * len(parts)
        failed = threading.Event()

        def run(index: int) -> None:
            if failed.is_set():
                return  # not sent: an earlier part failed
            try:
                outcomes[index] = (True, call(parts[index]))
            except Exception as exc:  # noqa: BLE001 - raised below, in part order
                outcomes[index] = (False, exc)
                failed.set()

        if self.protocol == "grpc":
            if self._threads is None:
                self._threads = ThreadPoolExecutor(
                    self.max_in_flight, thread_name_prefix="embedding-client"
                )
            list(self._threads.map(run, range(len(parts))))
        else:
            group = importlib.import_module("gevent.pool").Pool(self.max_in_flight)
            for index in range(len(parts)):
                if failed.is_set():
                    break
                group.spawn(run, index)
            group.join()
        for sent, value in outcomes:
            if not sent:
                raise value  # a part sent after another failed is never before it
        return [value for _, value in outcomes]

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
