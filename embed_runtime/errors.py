"""Per-request errors raised by the runtime and mapped to Triton error codes by adapters."""

from __future__ import annotations

INVALID_ARG = "INVALID_ARG"
UNAVAILABLE = "UNAVAILABLE"
INTERNAL = "INTERNAL"


class RequestError(Exception):
    """A failure that belongs to one request; ``code`` names the Triton error code."""

    code = INTERNAL

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidInputError(RequestError):
    """The request itself is malformed or refused (Triton ``INVALID_ARG``)."""

    code = INVALID_ARG


class UnavailableError(RequestError):
    """A resource the request names could not be reached (Triton ``UNAVAILABLE``)."""

    code = UNAVAILABLE
