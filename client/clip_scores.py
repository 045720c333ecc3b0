"""Image-text scores of a served OpenCLIP model, computed as open_clip computes them.

Each ensemble of an ``open-clip`` model (``<model>_text``, ``<model>_image``,
``<model>_image_url``) carries config parameters ``logit_scale`` (the multiplier,
``logit_scale.exp()`` of the model, as its forward returns it) and, for SigLIP-style models,
``logit_bias``. With a bias the scores are SigLIP's independent sigmoid probabilities,
``sigmoid(image @ text.T * logit_scale + logit_bias)``; without one, CLIP's zero-shot
probabilities over the given texts, ``softmax(logit_scale * image @ text.T)`` per image.
Embeddings are the served ones (L2-normalised).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import EmbeddingClientError

SCALE_PARAMETER = "logit_scale"
BIAS_PARAMETER = "logit_bias"


@dataclass(frozen=True)
class ClipLogits:
    """How a model turns cosine similarities into logits: ``cos * scale + bias``."""

    scale: float
    bias: float | None = None

    @classmethod
    def from_config(cls, config: dict[str, Any], model: str = "") -> ClipLogits:
        """Read ``logit_scale`` / ``logit_bias`` from a model config (HTTP or gRPC JSON)."""
        parameters = config.get("parameters") or {}

        def value(key: str) -> float | None:
            entry = parameters.get(key)
            if entry is None:
                return None
            text = entry.get("string_value") if isinstance(entry, dict) else entry
            try:
                return float(text)
            except (TypeError, ValueError):
                raise EmbeddingClientError(
                    f"config parameter {key} is not a number: {text!r}", model=model
                ) from None

        scale = value(SCALE_PARAMETER)
        if scale is None:
            raise EmbeddingClientError(
                f"{model or 'the model'} has no {SCALE_PARAMETER} config parameter "
                "(not an open-clip ensemble, or built before scores were exposed)",
                model=model,
            )
        return cls(scale, value(BIAS_PARAMETER))

    @property
    def sigmoid(self) -> bool:
        """Whether scores are SigLIP's sigmoid probabilities (the model has a bias)."""
        return self.bias is not None


def clip_logits(image_embeddings: np.ndarray, text_embeddings: np.ndarray, logits: ClipLogits):
    """``[images, texts]`` float32 logits ``image @ text.T * scale (+ bias)``."""
    image = np.asarray(image_embeddings, dtype=np.float32)
    text = np.asarray(text_embeddings, dtype=np.float32)
    if image.ndim != 2 or text.ndim != 2 or image.shape[1] != text.shape[1]:
        raise EmbeddingClientError(
            f"expected [N, D] image and [M, D] text embeddings, got {image.shape} and {text.shape}"
        )
    out = (image @ text.T) * np.float32(logits.scale)
    if logits.bias is not None:
        out = out + np.float32(logits.bias)
    return out


def clip_scores(
    image_embeddings: np.ndarray, text_embeddings: np.ndarray, logits: ClipLogits
) -> np.ndarray:
    """``[images, texts]`` float32 probabilities as open_clip gives them.

    SigLIP (a bias): ``torch.sigmoid(image @ text.T * logit_scale.exp() + logit_bias)``,
    each pair on its own. CLIP: ``(logit_scale.exp() * image @ text.T).softmax(dim=-1)``,
    each image's row over the texts given.
    """
    z = clip_logits(image_embeddings, text_embeddings, logits)
    if logits.sigmoid:  # numerically stable on both sides: exp of a non-positive number
        e = np.exp(-np.abs(z))
        return np.where(z >= 0, 1 / (1 + e), e / (1 + e)).astype(np.float32)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


class ClipScoresMixin:
    """``clip_logit_params`` and ``clip_scores`` for :class:`client.api.EmbeddingClient`."""

    def clip_logit_params(self, model: str) -> ClipLogits:
        """The scale and bias of the open-clip model ``model`` (any of its ensembles).

        ``model`` is the entry's name or one of its ensembles; read from the
        ``<model>_text`` ensemble's config (the model-config API, which may need the
        admin key).
        """
        ensemble = model if model.endswith(("_text", "_image", "_image_url")) else f"{model}_text"
        return ClipLogits.from_config(self.model_config(ensemble), ensemble)

    def clip_scores(
        self, model: str, image_embeddings: np.ndarray, text_embeddings: np.ndarray
    ) -> np.ndarray:
        """:func:`clip_scores` of served embeddings with ``model``'s own scale and bias."""
        return clip_scores(image_embeddings, text_embeddings, self.clip_logit_params(model))
