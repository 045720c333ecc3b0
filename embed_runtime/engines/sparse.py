"""Dense vocabulary-sized rows -> the (indices, values) of their active dimensions.

A sparse encoder's graph returns one vocabulary-sized row per text; what goes over the
wire is only its active (non-zero) dimensions, ordered by value descending. With
``max_active_dims`` k, a row keeps the k dimensions of largest absolute value first, as
``sentence_transformers.util.select_max_active_dims`` does inside ``SparseEncoder.encode``
(its zeros among them stay inactive).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import InvalidInputError

INDICES, VALUES = "SPARSE_INDICES", "SPARSE_VALUES"
PAD_INDEX, PAD_VALUE = -1, 0.0


def active_dims(row: np.ndarray, max_active_dims: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The active dimensions of one row: indices (int32) and values, by value descending.

    Ties keep the lower index first, in the selection by ``max_active_dims`` (0: no cap)
    and in the order.
    """
    index = np.flatnonzero(row)
    values = row[index]
    if max_active_dims and len(index) > max_active_dims:
        keep = np.argsort(-np.abs(values), kind="stable")[:max_active_dims]
        keep.sort()
        index, values = index[keep], values[keep]
    order = np.argsort(-values, kind="stable")
    return index[order].astype(np.int32), values[order].astype(np.float32)


def request_max_active_dims(parameters: Mapping[str, Any], default: int) -> int:
    """The request parameter ``max_active_dims`` k >= 1, else the model's ``default``.

    As ``SparseEncoder.encode(max_active_dims=k)``: the request's k replaces the model's
    own cap (also a larger one); anything but a positive integer is refused.
    """
    value = parameters.get("max_active_dims")
    if value is None:
        return default
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidInputError(f"max_active_dims must be a positive integer, got {value!r}")
    return value


def sparse_rows(dense: np.ndarray, max_active_dims: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The rows of one request ``[N, V]`` as ``[N, K]`` indices and values.

    K is the largest count of active dimensions among the rows (at least 1, so a request
    whose rows are all zero still answers a well-formed ``[N, 1]`` of padding); shorter
    rows are padded with index -1 and value 0.
    """
    if dense.ndim != 2:
        raise ValueError(f"expected [rows, vocabulary] activations, got shape {dense.shape}")
    if max_active_dims < 0:
        raise ValueError(f"max_active_dims must be >= 0, got {max_active_dims}")
    rows = [active_dims(row, max_active_dims) for row in dense]
    width = max([1, *(len(index) for index, _ in rows)])
    indices = np.full((len(rows), width), PAD_INDEX, dtype=np.int32)
    values = np.full((len(rows), width), PAD_VALUE, dtype=np.float32)
    for i, (index, value) in enumerate(rows):
        indices[i, : len(index)] = index
        values[i, : len(value)] = value
    return indices, values


def unpad(indices: np.ndarray, values: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per row, the (indices, values) of ``sparse_rows`` without the padding."""
    out = []
    for index, value in zip(indices, values, strict=True):
        keep = index != PAD_INDEX
        out.append((index[keep], value[keep]))
    return out


def densify(indices: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """The ``[N, size]`` dense rows of ``sparse_rows``'s output (tests, clients)."""
    dense = np.zeros((len(indices), size), dtype=np.float32)
    for i, (index, value) in enumerate(unpad(indices, values)):
        dense[i, index] = value
    return dense
