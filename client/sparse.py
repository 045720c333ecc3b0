"""Sparse rows for vector stores: the server's padding removed, in the stores' own types.

A sparse-encoder ensemble answers ``SPARSE_INDICES`` INT32 / ``SPARSE_VALUES`` FP32
[N, K], K the widest row of the request; shorter rows are padded with index -1 and
value 0. Stores want each row alone, with unique indices (qdrant refuses the repeated
-1: ``ValueError: Indices must be unique``)::

    indices, values = result.as_numpy("SPARSE_INDICES"), result.as_numpy("SPARSE_VALUES")
    rows = sparse_rows(indices, values)       # [(indices, values)] per text, no padding
    points = to_qdrant(rows)                   # qdrant_client.models.SparseVector per text

``EmbeddingClient.embed_sparse`` already returns such rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

SparseRow = tuple[np.ndarray, np.ndarray]


def sparse_rows(indices: np.ndarray, values: np.ndarray) -> list[SparseRow]:
    """Each row of ``SPARSE_INDICES`` / ``SPARSE_VALUES`` [N, K] without the -1 padding.

    Per row: its indices (int32) and values (float32), in the server's order (by weight,
    descending). Raises ``ValueError`` when the two arrays do not share one [N, K] shape.
    """
    indices, values = np.asarray(indices), np.asarray(values)
    if indices.ndim != 2 or indices.shape != values.shape:
        raise ValueError(
            f"SPARSE_INDICES and SPARSE_VALUES must share one [N, K] shape, got "
            f"{indices.shape} and {values.shape}"
        )
    keep = indices >= 0
    return [
        (i[k].astype(np.int32, copy=False), v[k].astype(np.float32, copy=False))
        for i, v, k in zip(indices, values, keep, strict=True)
    ]


def as_lists(rows: Sequence[SparseRow]) -> tuple[list[list[int]], list[list[float]]]:
    """``rows`` as two lists of Python lists: the indices, then the values, of each row."""
    return [i.tolist() for i, _ in rows], [v.tolist() for _, v in rows]


def to_qdrant(rows: Sequence[SparseRow]) -> list[Any]:
    """``rows`` as ``qdrant_client.models.SparseVector`` (needs qdrant-client)."""
    from qdrant_client.models import SparseVector  # noqa: PLC0415 - optional dependency

    return [SparseVector(indices=i.tolist(), values=v.tolist()) for i, v in rows]
