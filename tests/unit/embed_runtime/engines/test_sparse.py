"""Dense activations -> (indices, values) of the active dimensions, as SparseEncoder selects.

The reference is ``sentence_transformers.util.select_max_active_dims``, the function
``SparseEncoder.encode(max_active_dims=...)`` applies to its dense rows.
"""

from __future__ import annotations

import numpy as np
import pytest

from embed_runtime.engines.sparse import (
    PAD_INDEX,
    active_dims,
    densify,
    request_max_active_dims,
    sparse_rows,
    unpad,
)
from embed_runtime.errors import InvalidInputError


def _library(dense: np.ndarray, k: int | None) -> np.ndarray:
    from sentence_transformers.util import select_max_active_dims

    return np.asarray(select_max_active_dims(dense.copy(), max_active_dims=k))


def test_rows_keep_their_active_dimensions_by_value_descending() -> None:
    dense = np.array([[0.0, 0.5, 0.0, 2.0, 1.0], [0.0, 0.0, 3.0, 0.0, 0.0]], np.float32)
    indices, values = sparse_rows(dense)
    assert indices.dtype == np.int32 and values.dtype == np.float32
    assert indices.tolist() == [[3, 4, 1], [2, PAD_INDEX, PAD_INDEX]]
    assert values.tolist() == [[2.0, 1.0, 0.5], [3.0, 0.0, 0.0]]
    assert [i.tolist() for i, _ in unpad(indices, values)] == [[3, 4, 1], [2]]
    np.testing.assert_array_equal(densify(indices, values, 5), dense)


def test_ties_keep_the_lower_index_first() -> None:
    row = np.array([0.0, 1.0, 2.0, 1.0, 2.0, 1.0], np.float32)
    index, value = active_dims(row)
    assert index.tolist() == [2, 4, 1, 3, 5]
    assert value.tolist() == [2.0, 2.0, 1.0, 1.0, 1.0]
    index, _ = active_dims(row, 3)  # the cut falls inside the tie of 1.0s
    assert index.tolist() == [2, 4, 1]


def test_all_zero_rows_answer_padding_only() -> None:
    indices, values = sparse_rows(np.zeros((2, 7), np.float32))
    assert indices.tolist() == [[PAD_INDEX], [PAD_INDEX]]
    assert values.tolist() == [[0.0], [0.0]]
    assert [len(i) for i, _ in unpad(indices, values)] == [0, 0]
    indices, _ = sparse_rows(np.array([[0, 0, 0], [0, 1.5, 0]], np.float32))
    assert indices.tolist() == [[PAD_INDEX], [1]]


def test_width_is_the_largest_active_count_of_the_request() -> None:
    dense = np.zeros((3, 50), np.float32)
    dense[0, [3, 9]] = [1.0, 2.0]
    dense[1, :17] = np.arange(1, 18)
    dense[2, 40] = 0.25
    indices, values = sparse_rows(dense)
    assert indices.shape == values.shape == (3, 17)
    assert sparse_rows(dense, 5)[0].shape == (3, 5)
    assert sparse_rows(dense, 100)[0].shape == (3, 17)


@pytest.mark.parametrize("k", [None, 1, 2, 5, 37, 1000])
def test_max_active_dims_selects_as_sentence_transformers(k: int | None) -> None:
    rng = np.random.default_rng(k or 0)
    dense = np.maximum(rng.normal(size=(16, 300)), 0).astype(np.float32)
    dense[3] = 0.0  # an all-zero row
    dense[4, :] = 0.0
    dense[4, [5, 7, 9, 11]] = 1.0  # a tie across the cut
    dense[5, rng.choice(300, 80, replace=False)] = 0.75  # a wide tie
    dense[6] = -dense[6]  # negative values: selected by magnitude, as the library does
    indices, values = sparse_rows(dense, k or 0)
    want = _library(dense, k)
    np.testing.assert_array_equal(densify(indices, values, 300), want)
    for (index, value), row in zip(unpad(indices, values), want, strict=True):
        assert sorted(index.tolist()) == np.flatnonzero(row).tolist()
        assert (np.diff(value) <= 0).all()


def test_bad_shapes_and_caps_are_refused() -> None:
    with pytest.raises(ValueError, match="expected"):
        sparse_rows(np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="max_active_dims"):
        sparse_rows(np.zeros((1, 4), np.float32), -1)


@pytest.mark.parametrize(
    ("parameters", "want"),
    [({}, 7), ({"max_active_dims": 3}, 3), ({"max_active_dims": "12"}, 12),
     ({"max_active_dims": 500}, 500), ({"max_active_dims": None}, 7)],
)
def test_request_max_active_dims_replaces_the_models_cap(parameters, want) -> None:
    assert request_max_active_dims(parameters, 7) == want


@pytest.mark.parametrize("value", [0, -1, 2.5, "x", "", True, [3]])
def test_request_max_active_dims_must_be_a_positive_integer(value) -> None:
    with pytest.raises(InvalidInputError, match="max_active_dims must be a positive integer"):
        request_max_active_dims({"max_active_dims": value}, 7)
