"""Random-initialised sentence-transformers models of a published model's size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from generator.fixtures.random_text import SHAPES, BertShape, create_random_text_model

TINY = BertShape(layers=2, hidden=32, heads=2, intermediate=64, max_positions=128,
                 max_seq_length=64)


def test_random_model_loads_as_sentence_transformer_with_its_size(tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    folder = create_random_text_model(tmp_path / "m", TINY)
    model = SentenceTransformer(str(folder), device="cpu")
    out = model.encode(["a short sentence", "another, somewhat longer sentence here"])
    assert out.shape == (2, 32)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    assert model.max_seq_length == 64
    assert model[0].auto_model.config.num_hidden_layers == 2


def test_same_seed_same_weights_other_seed_other_weights(tmp_path: Path) -> None:
    a = load_file(create_random_text_model(tmp_path / "a", TINY, seed=1) / "model.safetensors")
    b = load_file(create_random_text_model(tmp_path / "b", TINY, seed=1) / "model.safetensors")
    c = load_file(create_random_text_model(tmp_path / "c", TINY, seed=2) / "model.safetensors")
    name = next(k for k in a if k.endswith("query.weight"))
    np.testing.assert_array_equal(a[name], b[name])
    assert not np.array_equal(a[name], c[name])


def test_e5_small_shape_is_the_published_size() -> None:
    shape = SHAPES["e5-small"]
    assert (shape.layers, shape.hidden, shape.heads, shape.intermediate) == (12, 384, 12, 1536)


def test_unknown_shape_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown shape"):
        create_random_text_model(tmp_path / "m", "e5-huge")
