"""Thin typed client for the embedding models served by Triton (HTTP and gRPC)."""

from .api import EmbeddingClient
from .chunks import TextChunk
from .deadline import DEADLINE_PARAMETER
from .errors import DeadlineExceededError, EmbeddingClientError, ServerOverloadedError
from .records import ModelInfo, ModelStats
from .retry import RetryBudget, RetryPolicy

__all__ = [
    "DEADLINE_PARAMETER",
    "DeadlineExceededError",
    "EmbeddingClient",
    "EmbeddingClientError",
    "ModelInfo",
    "ModelStats",
    "RetryBudget",
    "RetryPolicy",
    "ServerOverloadedError",
    "TextChunk",
]
