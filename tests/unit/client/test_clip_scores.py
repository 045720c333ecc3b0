"""CLIP / SigLIP scores from embeddings equal open_clip's formulas (no server)."""

from __future__ import annotations

import numpy as np
import pytest

from client.clip_scores import ClipLogits, clip_scores
from client.errors import EmbeddingClientError

torch = pytest.importorskip("torch")

# float32 on both sides; measured max abs 6e-8 (sigmoid) and 3e-8 (softmax)
MAX_ABS = 1e-6


def _embeddings(n: int, d: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_sigmoid_scores_equal_open_clips_siglip_formula():
    image, text = _embeddings(5, 32, 0), _embeddings(7, 32, 1)
    log_scale, bias = torch.tensor(np.log(10.0), dtype=torch.float32), torch.tensor(-10.0)
    scale = log_scale.exp()
    want = torch.sigmoid(torch.from_numpy(image) @ torch.from_numpy(text).T * scale + bias)
    logits = ClipLogits(float(scale.item()), float(bias.item()))
    got = clip_scores(image, text, logits)
    assert got.dtype == np.float32 and got.shape == (5, 7)
    assert np.abs(got - want.numpy()).max() <= MAX_ABS
    extreme = ClipLogits(1000.0, -10.0)  # saturated both ways, no overflow warning
    with np.errstate(over="raise"):
        out = clip_scores(image, -image, extreme)
    assert np.isfinite(out).all()


def test_softmax_scores_equal_open_clips_zero_shot_probabilities():
    image, text = _embeddings(4, 16, 2), _embeddings(3, 16, 3)
    scale = torch.tensor(np.log(1 / 0.07), dtype=torch.float32).exp()
    want = (scale * torch.from_numpy(image) @ torch.from_numpy(text).T).softmax(dim=-1)
    got = clip_scores(image, text, ClipLogits(float(scale.item())))
    assert np.abs(got - want.numpy()).max() <= MAX_ABS
    np.testing.assert_allclose(got.sum(axis=1), 1.0, atol=1e-6)


def test_logits_are_read_from_the_config_parameters():
    parameters = {"logit_scale": {"string_value": "14.5"}, "logit_bias": {"string_value": "-10.0"}}
    assert ClipLogits.from_config({"parameters": parameters}) == ClipLogits(14.5, -10.0)
    del parameters["logit_bias"]
    assert ClipLogits.from_config({"parameters": parameters}) == ClipLogits(14.5)


def test_a_config_without_a_scale_is_refused_by_name():
    with pytest.raises(EmbeddingClientError, match="no logit_scale config parameter"):
        ClipLogits.from_config({"parameters": {}}, "m_text")
    with pytest.raises(EmbeddingClientError, match="not a number"):
        ClipLogits.from_config({"parameters": {"logit_scale": {"string_value": "x"}}})


def test_mismatched_widths_are_refused():
    with pytest.raises(EmbeddingClientError, match="expected"):
        clip_scores(np.zeros((2, 3)), np.zeros((2, 4)), ClipLogits(1.0))
