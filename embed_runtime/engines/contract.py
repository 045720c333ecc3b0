"""The engine contract of the encode steps (``embed_runtime.serving.encode_step``).

An encode step (``<name>_encode``) runs one engine, picked once when it loads: it reads
each request's inputs and parameters (:meth:`Engine.read`, which refuses a bad request
alone) and embeds every valid request of an execution in one batched pass
(:meth:`Engine.embed`), answering one tuple of arrays per request in the order of
:attr:`Engine.output_names`. The engines: ``TokenEngine``, ``FixedEngine`` and
``SparseEngine`` (``embed_runtime.engines.tensor``), ``TextEncoder``
(``embed_runtime.engines.text_encoder``), ``MultiVectorTextEncoder``
(``embed_runtime.engines.multivector``) and ``SparseRouter``
(``embed_runtime.engines.sparse_router``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

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
