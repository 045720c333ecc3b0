"""Thin typed client for the embedding models served by Triton (HTTP and gRPC)."""

from .api import EmbeddingClient
from .errors import EmbeddingClientError
from .records import ModelInfo, ModelStats

__all__ = ["EmbeddingClient", "EmbeddingClientError", "ModelInfo", "ModelStats"]
