"""The SPLADE graph both routes of a sparse encoder serve (``sparse_encoder.splade``)."""

from __future__ import annotations

import numpy as np

from generator.families.sparse_encoder.splade import library_rows


class _Rows:
    def __init__(self, dense: np.ndarray):
        self.dense = dense

    def to_dense(self) -> _Rows:
        return self

    def numpy(self) -> np.ndarray:
        return self.dense


def test_library_rows_asks_for_one_dense_batch_and_every_dimension_for_zero() -> None:
    calls: list[tuple[list[str], dict]] = []

    def encode(texts: list[str], **kwargs) -> _Rows:
        calls.append((texts, kwargs))
        return _Rows(np.ones((len(texts), 4), dtype=np.float32))

    rows = library_rows(encode, ("a", "b", "c"), 0)
    library_rows(encode, ["a"], 2)
    assert rows.shape == (3, 4)
    assert calls[0] == (
        ["a", "b", "c"],
        {
            "batch_size": 3,
            "max_active_dims": None,
            "convert_to_tensor": True,
            "convert_to_sparse_tensor": False,
        },
    )
    assert calls[1][1]["max_active_dims"] == 2
