"""Calibration embeddings for the int8 / uint8 outputs, computed at build time.

``sentence_transformers.quantization.quantize_embeddings`` maps each dimension's
``[min, max]`` onto 256 steps. Those ranges must come from a fixed, representative set
of embeddings, or a query and a document would be quantized on different scales. The
build embeds a corpus (:data:`DEFAULT_CORPUS`, 227 varied sentences written for this
project, or a manifest's ``calibration_corpus``) with the exported graph and the serving
tokenizer, and stores the float32 rows in the encoder's version folder
(``calibration_embeddings.npy``, covered by its digests). The served ranges are
``[min, max]`` per dimension of those rows (cut to a request's ``dimensions`` first).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from embed_runtime.engines.output_precision import CALIBRATION_FILE
from embed_runtime.text.tokenizer import BatchTokenizer, TokenizerParams, prompted_texts

DEFAULT_CORPUS = Path(__file__).parent / "calibration" / "sentences.txt"
MIN_TEXTS = 16
BATCH = 32

__all__ = ["CALIBRATION_FILE", "DEFAULT_CORPUS", "calibration_embeddings", "read_corpus"]


def read_corpus(path: Path) -> list[str]:
    """The corpus's texts: one per non-blank line (UTF-8)."""
    texts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    texts = [t for t in texts if t]
    if len(texts) < MIN_TEXTS:
        raise ValueError(f"calibration corpus {path} has {len(texts)} texts; at least {MIN_TEXTS}")
    return texts


def calibration_embeddings(
    onnx_path: Path,
    tokenizer_json: Path,
    params: TokenizerParams,
    texts: list[str],
    out_path: Path,
    output_name: str = "EMBEDDING",
) -> np.ndarray:
    """Embed ``texts`` as the server would (default prompt, graph's full width); save them.

    Rows run in length-sorted batches padded on the right, as the server runs them.
    """
    import onnxruntime as ort  # noqa: PLC0415 - build time only

    tokenizer = BatchTokenizer(str(tokenizer_json), params)
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    prompted = prompted_texts(list(texts), {}, params)
    order = sorted(range(len(prompted)), key=lambda i: len(prompted[i]))
    rows = np.zeros((len(prompted), 0), np.float32)
    for start in range(0, len(order), BATCH):
        chunk = order[start : start + BATCH]
        arrays = tokenizer.encode([prompted[i] for i in chunk])
        feed = {n: arrays[n] for n in params.output_names}
        out = session.run([output_name], feed)[0].astype(np.float32)
        if not rows.shape[1]:
            rows = np.zeros((len(prompted), out.shape[1]), np.float32)
        rows[chunk] = out
    if not np.isfinite(rows).all():
        raise RuntimeError("calibration embeddings are not all finite")
    np.save(out_path, rows, allow_pickle=False)
    return rows
