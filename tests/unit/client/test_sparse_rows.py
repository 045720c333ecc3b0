"""``client.sparse``: the server's padded sparse answers as rows and qdrant vectors."""

from __future__ import annotations

import numpy as np
import pytest
from qdrant_client.models import SparseVector

from client.sparse import as_lists, sparse_rows, to_qdrant

# Two rows of one request: the short one padded with index -1, value 0.
INDICES = np.array([[7, 3, -1, -1], [11, 2, 5, 9]], dtype=np.int32)
VALUES = np.array([[2.5, 0.5, 0.0, 0.0], [3.0, 2.0, 1.0, 0.25]], dtype=np.float32)


def test_sparse_rows_drop_the_padding_and_keep_the_server_order() -> None:
    rows = sparse_rows(INDICES, VALUES)
    assert [i.tolist() for i, _ in rows] == [[7, 3], [11, 2, 5, 9]]
    assert [v.tolist() for _, v in rows] == [[2.5, 0.5], [3.0, 2.0, 1.0, 0.25]]
    assert all(i.dtype == np.int32 and v.dtype == np.float32 for i, v in rows)


def test_a_row_with_no_active_dimension_is_empty() -> None:
    ((index, value),) = sparse_rows(np.full((1, 3), -1), np.zeros((1, 3)))
    assert index.size == value.size == 0


def test_sparse_rows_refuse_arrays_of_different_shapes() -> None:
    with pytest.raises(ValueError, match="one \\[N, K\\] shape"):
        sparse_rows(INDICES, VALUES[:, :3])
    with pytest.raises(ValueError, match="one \\[N, K\\] shape"):
        sparse_rows(INDICES[0], VALUES[0])


def test_rows_become_qdrant_vectors_with_unique_indices() -> None:
    vectors = to_qdrant(sparse_rows(INDICES, VALUES))
    assert vectors == [
        SparseVector(indices=[7, 3], values=[2.5, 0.5]),
        SparseVector(indices=[11, 2, 5, 9], values=[3.0, 2.0, 1.0, 0.25]),
    ]


def test_rows_become_llama_index_lists() -> None:
    indices, values = as_lists(sparse_rows(INDICES, VALUES))
    assert indices == [[7, 3], [11, 2, 5, 9]]
    assert values == [[2.5, 0.5], [3.0, 2.0, 1.0, 0.25]]
    assert isinstance(indices[0][0], int) and isinstance(values[0][0], float)
