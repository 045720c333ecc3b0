"""The engines that take the graph's own tensors (``Engine``, ``embed_runtime.engines.contract``).

- :class:`TokenEngine`: token tensors, ragged (dense text, cross-encoders, rerankers);
- :class:`FixedEngine`: one fixed-shape tensor (pixels, CLIP's fixed text context);
- :class:`SparseEngine`: either of those answered as active dimensions (SPLADE).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..text.request_options import resolve_dimensions, truncate
from .contract import COUNT_OUTPUT, token_counts
from .ort_encoder import OrtEncoder, check_request
from .sparse import INDICES, VALUES, request_max_active_dims, sparse_rows


@dataclass(frozen=True)
class TensorRequest:
    """One valid request of graph tensors, and the width it asks for (0: all)."""

    arrays: dict[str, np.ndarray]
    dimensions: int


class TokenEngine:
    """Ragged token tensors in: rows of all requests sorted by length, run in chunks.

    With ``counted`` each answer also holds its rows' token counts (``TOKEN_COUNT``).
    """

    def __init__(self, encoder: OrtEncoder, counted: bool = False):
        self.encoder = encoder
        self.params = encoder.params
        self.input_names = tuple(self.params.input_names)
        self.output_names = (self.params.output_name, *((COUNT_OUTPUT,) if counted else ()))

    def read(self, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any]):
        """The request's tensors, checked (ids, widths, masks), and its ``dimensions``."""
        arrays = {name: inputs[name] for name in self.input_names}
        check_request(self.params, arrays)
        full, default = self.params.max_dimensions, self.params.default_dimensions
        return TensorRequest(arrays, resolve_dimensions(parameters, full, default))

    def _cut(self, rows: np.ndarray, request: TensorRequest) -> np.ndarray:
        if not request.dimensions:
            return rows
        return truncate(rows, request.dimensions, self.params.normalize)

    def embed(self, requests: Sequence[TensorRequest]) -> list[tuple[np.ndarray, ...]]:
        """Each request's embeddings (and token counts); one sorted, chunked run."""
        outputs = self.encoder.encode_tokens([r.arrays for r in requests])
        counted = len(self.output_names) > 1
        return [
            (self._cut(rows, r), *((token_counts(r.arrays["attention_mask"]),) if counted else ()))
            for rows, r in zip(outputs, requests, strict=True)
        ]


class FixedEngine(TokenEngine):
    """One fixed-shape input (pixels, CLIP's fixed text context): rows run in chunks."""

    def __init__(self, encoder: OrtEncoder):
        super().__init__(encoder, counted=False)

    def embed(self, requests: Sequence[TensorRequest]) -> list[tuple[np.ndarray, ...]]:
        """Each request's embeddings; all rows concatenated and run in chunks."""
        name = self.input_names[0]
        outputs = self.encoder.encode_dense([r.arrays[name] for r in requests])
        return [(self._cut(rows, r),) for rows, r in zip(outputs, requests, strict=True)]


class SparseEngine:
    """A dense engine's rows answered as their active dimensions (``SPARSE_*``).

    Each request may cap its rows' active dimensions (``max_active_dims``); the model's
    own cap applies otherwise.
    """

    output_names = (INDICES, VALUES)

    def __init__(self, dense: TokenEngine, max_active_dims: int = 0):
        self.dense = dense
        self.input_names = dense.input_names
        self.max_active_dims = max_active_dims

    def read(self, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any]):
        """The dense engine's request (no ``dimensions``) and the request's cap."""
        request = self.dense.read(inputs, parameters)
        return request, request_max_active_dims(parameters, self.max_active_dims)

    def embed(self, requests: Sequence[tuple[TensorRequest, int]]) -> list[tuple[np.ndarray, ...]]:
        """``(SPARSE_INDICES, SPARSE_VALUES)`` per request."""
        answers = self.dense.embed([request for request, _ in requests])
        pairs = zip(answers, requests, strict=True)
        return [sparse_rows(answer[0], k) for answer, (_, k) in pairs]
