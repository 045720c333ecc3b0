"""The one exception type the client raises."""

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
