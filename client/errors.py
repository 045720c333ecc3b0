"""The exceptions the client raises: :class:`EmbeddingClientError` and two kinds of it."""

from __future__ import annotations


class EmbeddingClientError(Exception):
    """A failed call to Triton, or a local problem with the inputs.

    Attributes:
        message: Triton's own error text (``InferenceServerException.message()``), or
            a description of the local problem.
        status: Triton's status as tritonclient reports it (HTTP: the status code as a
            string, e.g. ``"400"``; gRPC: e.g. ``"StatusCode.NOT_FOUND"``); ``None`` for
            local problems and unreachable servers.
        model: the Triton model the call was about, if any.

    """

    def __init__(self, message: str, status: str | None = None, model: str | None = None):
        self.message = message
        self.status = status
        self.model = model
        super().__init__(message)

    def __str__(self) -> str:
        prefix = f"model '{self.model}': " if self.model else ""
        suffix = f" (status {self.status})" if self.status else ""
        return f"{prefix}{self.message}{suffix}"


class ServerOverloadedError(EmbeddingClientError):
    """The server refused (or could not be reached) on every attempt the client could make.

    Raised when a request was refused (HTTP 503 / 429, gRPC ``UNAVAILABLE`` /
    ``RESOURCE_EXHAUSTED``: a full queue, a queue timeout) or the server could not be
    reached, and no further attempt was allowed: the retry budget was spent, the call's
    deadline left no time for another attempt, or retries are off. The message starts
    ``server overloaded:`` (``server unreachable:`` when the last attempt could not connect)
    and says how many attempts were made and what the last refusal was.

    Attributes:
        attempts: the attempts made for the request that failed.
        last_error: the last refusal, as an :class:`EmbeddingClientError`.

    """

    def __init__(
        self,
        message: str,
        status: str | None = None,
        model: str | None = None,
        *,
        attempts: int = 1,
        last_error: EmbeddingClientError | None = None,
    ):
        super().__init__(message, status, model)
        self.attempts = attempts
        self.last_error = last_error


class DeadlineExceededError(EmbeddingClientError):
    """The call's deadline (``timeout_s``) passed before an answer came.

    Raised when the transport timed out (the client gave up the request; Triton cancels it),
    when the server answered that the request's deadline had passed before a step could
    run it, or when no time was left to send it. Never retried.
    """
