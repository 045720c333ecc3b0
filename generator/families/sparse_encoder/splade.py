"""The SPLADE graph of a sparse encoder: export, and parity of its rows with the library.

Both routes of the family use it: a plain ``SparseEncoder`` (:mod:`.export`) serves the
graph for every text; an inference-free one (:mod:`.inference_free`) for documents only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from embed_runtime.engines.sparse import densify, sparse_rows

from ...onnx_export import GraphSpec, TensorSpec, export_module, validate_graph
from ..text_export import VALIDATION_TEXTS, pipeline_module, token_features, validation_batches

# Parity gate of the served rows (made dense) against SparseEncoder.encode: max |diff|
# <= 1e-5, relative beyond values of 1 (sum pooling over long texts reaches tens, where
# float32 itself resolves only about 1e-6 of the value).
SPARSE_ATOL = 1e-5
ACTIVATIONS = "activations"


def is_splade(modules: list) -> bool:
    """Whether ``modules`` are a Transformer (right padded) and SpladePooling, no more."""
    from sentence_transformers.base.modules import Transformer  # noqa: PLC0415
    from sentence_transformers.sparse_encoder.modules import SpladePooling  # noqa: PLC0415

    return (
        len(modules) == 2
        and isinstance(modules[0], Transformer)
        and isinstance(modules[1], SpladePooling)
        and modules[0].tokenizer.padding_side == "right"
    )


def _output_width(encoder, sample: dict, input_names: list[str]) -> int:
    """V: the width of the pipeline's output (the MLM head's vocabulary)."""
    import torch  # noqa: PLC0415

    with torch.inference_mode():
        return int(encoder(*(sample[n] for n in input_names)).shape[1])


def sparse_parity(
    model, texts, input_names: list[str], onnx_path: Path, max_active_dims: int
) -> tuple[float, float]:
    """Max |served rows made dense - SparseEncoder.encode| over ``texts``; largest value."""
    import onnxruntime as ort  # noqa: PLC0415

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    dense = session.run([ACTIVATIONS], token_features(model, texts, input_names))[0]
    indices, values = sparse_rows(dense, max_active_dims)
    got = densify(indices, values, dense.shape[1])
    want = library_rows(model.encode, texts, max_active_dims)
    return float(np.max(np.abs(got - want))), float(np.max(np.abs(want)))


def library_rows(encode, texts, max_active_dims: int) -> np.ndarray:
    """Dense rows of ``texts`` from ``encode`` (SparseEncoder's, ``encode_query``, ...).

    In one batch, at most ``max_active_dims`` active dimensions a row (0: all).
    """
    rows = encode(
        list(texts),
        batch_size=len(texts),
        max_active_dims=max_active_dims or None,
        convert_to_tensor=True,
        convert_to_sparse_tensor=False,
    )
    return rows.to_dense().numpy()


def export_graph(model, input_names: list[str], work: Path) -> tuple:
    """Export the pipeline (Transformer + SpladePooling) to ``work/model.onnx``, validated.

    Returns the path, its :class:`GraphSpec`, the exported module and the validation cases.
    """
    encoder = pipeline_module(model, input_names, lambda out: out["sentence_embedding"])
    enc = model.preprocess(list(VALIDATION_TEXTS[:3]))
    sample = {n: enc[n] for n in input_names}
    vocab = _output_width(encoder, sample, input_names)
    spec = GraphSpec(
        inputs=tuple(TensorSpec(n, "int64", (-1,)) for n in input_names),
        outputs=(TensorSpec(ACTIVATIONS, "float32", (vocab,)),),
    )
    onnx_path = work / "model.onnx"
    export_module(encoder, spec, sample, onnx_path)
    cases = [token_features(model, b, input_names) for b in validation_batches(VALIDATION_TEXTS)]
    validate_graph(onnx_path, spec, encoder, cases)
    return onnx_path, spec, encoder, cases
