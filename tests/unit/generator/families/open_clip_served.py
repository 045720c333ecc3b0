"""What the open_clip family's unit tests share: test images, the export, the served path.

A tiny open_clip model is loaded and its towers exported as the build does
(:func:`export_tiny`); the served path is then run the way Triton runs it (tokenizer.json,
runtime preprocessing, ONNX) beside open_clip's own tokenizer, transform and PyTorch.
Importing this module skips the importing test module where torch, open_clip or
onnxruntime is missing.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
open_clip = pytest.importorskip("open_clip")
ort = pytest.importorskip("onnxruntime")
from PIL import Image  # noqa: E402

from embed_runtime.image.preprocess import decode_image, preprocess_batch  # noqa: E402
from embed_runtime.text.tokenizer import BatchTokenizer, TokenizerParams  # noqa: E402
from generator.families.open_clip import assets  # noqa: E402

IMAGE_SIZES = ((640, 480), (31, 200), (64, 64), (300, 90))


def smooth_pngs(seed: int, sizes: tuple[tuple[int, int], ...] = IMAGE_SIZES) -> list[bytes]:
    """PNGs of smooth colour ramps with noise, one per ``(width, height)``.

    Smooth, so that resampling differences between two implementations stay small.
    """
    rng = np.random.default_rng(seed)
    blobs = []
    for width, height in sizes:
        grid = np.mgrid[0:height, 0:width].astype(np.float32)
        smooth = np.stack([grid[0] * 3, grid[1] * 2, grid[0] + grid[1]], axis=-1) % 256
        noisy = (smooth * 0.7 + rng.integers(0, 70, (height, width, 3))).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(noisy).save(buf, "PNG")
        blobs.append(buf.getvalue())
    return blobs


def export_tiny(fields: dict, out: Path) -> tuple:
    """Load a fixture's model (its manifest ``fields``) and export both towers to ``out``.

    Returns ``(model, open_clip transform, tokenizer, export reports)``.
    """
    model, preprocess_val, tokenizer = assets.load_open_clip(
        fields["arch"], None, fields.get("checkpoint")
    )
    size = assets.preprocess_params_from_model(model).size
    reports = assets.export_towers(model, out, tokenizer.context_length, size, tokenizer)
    return model, preprocess_val, tokenizer, reports


def served_ids(tokenizer_json: Path, texts: list[str], params: TokenizerParams) -> np.ndarray:
    """The token ids of ``texts`` as the tokenize step serves them, one row each.

    The step's path: ``params``' clean, then the served ``tokenizer.json``.
    """
    tokenizer = BatchTokenizer(str(tokenizer_json), params)
    return tokenizer.encode(tokenizer.clean(list(texts)))["input_ids"]


def onnx_embedding(graph: Path, input_name: str, values: np.ndarray) -> np.ndarray:
    """The ``EMBEDDING`` output of the exported tower ``graph`` on ``values``."""
    (embedding,) = ort.InferenceSession(str(graph)).run(["EMBEDDING"], {input_name: values})
    return embedding


def served_pixels(blobs: list[bytes], params) -> np.ndarray:
    """``blobs`` decoded and preprocessed by the runtime with ``params`` (served pixels)."""
    return preprocess_batch([decode_image(b, params) for b in blobs], params)


def open_clip_pixels(transform, blobs: list[bytes]) -> torch.Tensor:
    """``blobs`` through an open_clip image ``transform``, stacked."""
    return torch.stack([transform(Image.open(io.BytesIO(b))) for b in blobs])


def pixels_both_ways(model, preprocess_val, blobs: list[bytes]) -> tuple[np.ndarray, torch.Tensor]:
    """``blobs`` preprocessed by the runtime as ``model`` says and by open_clip's transform."""
    params = assets.preprocess_params_from_model(model)
    return served_pixels(blobs, params), open_clip_pixels(preprocess_val, blobs)
