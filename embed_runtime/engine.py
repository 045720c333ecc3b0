"""The engine contract of the encode steps, and the engines that take graph tensors.

An encode step (``<name>_encode``) runs one engine, picked once when it loads: it reads
each request's inputs and parameters (:meth:`Engine.read`, which refuses a bad request
alone) and embeds every valid request of an execution in one batched pass
(:meth:`Engine.embed`), answering one tuple of arrays per request in the order of
:attr:`Engine.output_names`. The engines:

- :class:`TokenEngine`: token tensors, ragged (dense text, cross-encoders, rerankers);
- :class:`FixedEngine`: one fixed-shape tensor (pixels, CLIP's fixed text context);
- :class:`SparseEngine`: either of those answered as active dimensions (SPLADE);
- ``TextEncoder`` (``embed_runtime.fused_encoder``): ``TEXT`` tokenized in the step;
- ``MultiVectorTextEncoder`` (``embed_runtime.multivector``): per-token vectors;
- ``SparseRouter`` (``embed_runtime.sparse_router``): queries by static weights,
  documents through SPLADE.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .ort_encoder import OrtEncoder, check_request
from .request_options import resolve_dimensions, truncate
from .sparse import INDICES, VALUES, request_max_active_dims, sparse_rows

COUNT_OUTPUT = "TOKEN_COUNT"  # the optional output of each row's token count
TEXT_INPUT = "TEXT"


@runtime_checkable
class Engine(Protocol):
    """What an encode step runs.

    ``input_names``: the request inputs :meth:`read` takes. ``output_names``: the arrays
    of each answer of :meth:`embed`, in order.
    """

    input_names: tuple[str, ...]
    output_names: tuple[str, ...]

    def read(self, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any]) -> Any:
        """One request's inputs and parameters, checked; raises ``RequestError``."""
        ...

    def embed(self, requests: Sequence[Any]) -> list[tuple[np.ndarray, ...]]:
        """One answer per request read, all of them run together."""
        ...


def text_rows(inputs: Mapping[str, np.ndarray] | np.ndarray) -> np.ndarray:
    """The ``TEXT`` rows of a text engine's inputs (a bare array is those rows)."""
    return inputs[TEXT_INPUT] if isinstance(inputs, Mapping) else inputs


def token_counts(attention_mask: np.ndarray) -> np.ndarray:
    """Tokens of each row (``TOKEN_COUNT``, INT32 [rows, 1]) from its attention mask."""
    return attention_mask.sum(axis=1, dtype=np.int32).reshape(-1, 1)


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
