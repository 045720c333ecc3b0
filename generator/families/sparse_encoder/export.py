"""Family ``sparse-encoder``: a sentence-transformers ``SparseEncoder`` (SPLADE).

The exported graph is the model's pipeline, its MLM transformer and ``SpladePooling``
(pooling ``max`` / ``sum``, activation ``relu`` / ``log1p_relu``): token tensors in,
vocabulary-sized activations ``[B, V]`` out. The encoder stub turns each request's rows
into the ``SPARSE_INDICES`` / ``SPARSE_VALUES`` of their active dimensions, capped by
``max_active_dims`` (the manifest's, else the model's own), so nothing vocabulary-sized
goes over the wire. The build checks those rows, made dense again, against
``SparseEncoder.encode`` before anything is written.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from embed_runtime.sparse import INDICES, VALUES, densify, sparse_rows

from ...manifest import Manifest, ModelEntry
from ...model_dir import ModelDir
from ...onnx_export import GraphSpec, TensorSpec, export_module, validate_graph
from ...precision import apply_precision
from ...render import Step, ensemble
from ..common import TEXT, RunnerExtras, SparseOutput, TextGraph, split_encoder_dirs
from ..sentence_transformers.export import (
    check_prompts,
    check_tokenizer,
    model_prompts,
    write_tokenizer,
)
from ..text_export import (
    VALIDATION_TEXTS,
    load_checked,
    pipeline_module,
    refuse_tokenizer_failures,
    token_features,
    token_limits,
    transformer_tokenizer_params,
    validation_batches,
)
from . import FAMILY, inference_free

# Parity gate of the served rows (made dense) against SparseEncoder.encode: max |diff|
# <= 1e-5, relative beyond values of 1 (sum pooling over long texts reaches tens, where
# float32 itself resolves only about 1e-6 of the value).
SPARSE_ATOL = 1e-5
ACTIVATIONS = "activations"


def _load(entry: ModelEntry, manifest: Manifest):
    from sentence_transformers import SparseEncoder  # noqa: PLC0415

    model = load_checked(FAMILY, SparseEncoder, entry, manifest)
    if inference_free.is_router(model):
        inference_free.check_pipeline(entry, model)
        return model
    if not is_splade(list(model)):
        raise ValueError(
            f"{entry.name}: only a Transformer (fill-mask) followed by SpladePooling, with "
            f"right padding, is supported; this model has {[type(m).__name__ for m in model]}"
        )
    if entry.max_seq_length:
        model.max_seq_length = entry.max_seq_length
    return model


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


def _ensemble_dir(entry: ModelEntry, input_names: list[str]) -> ModelDir:
    tokenize, encode = f"{entry.name}_tokenize", f"{entry.name}_encode"
    tokens = tuple((n, n) for n in input_names)
    outputs = SparseOutput.outputs()
    config = ensemble(
        entry.name,
        entry.max_batch_size,
        [TEXT],
        list(outputs),
        [
            Step(tokenize, (("TEXT", "TEXT"),), tokens),
            Step(encode, tokens, ((INDICES, INDICES), (VALUES, VALUES))),
        ],
    )
    return ModelDir(entry.name, config, None, {})


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


def build(entry: ModelEntry, manifest: Manifest, work: Path) -> list[ModelDir]:
    """Export, validate and describe the model dirs of one sparse encoder.

    Three (tokenize, encode, the ensemble); two for an inference-free one (a Router:
    its encoder takes ``TEXT`` and routes per request, :mod:`.inference_free`).
    """
    model = _load(entry, manifest)
    if inference_free.is_router(model):
        return inference_free.build(entry, model, work)
    max_active_dims = entry.max_active_dims or model.max_active_dims or 0
    model.max_active_dims = None  # the graph returns every dimension; the stub selects
    tokenizer_json = work / "tokenizer.json"
    input_names = write_tokenizer(model, tokenizer_json)
    prompts, default_prompt = model_prompts(dataclasses.replace(entry, prompts=None), model)
    tok_params = transformer_tokenizer_params(
        model,
        input_names,
        prompts=tuple(sorted(prompts.items())),
        default_prompt_name=default_prompt,
    )
    failures = check_tokenizer(model, tokenizer_json, tok_params)
    refuse_tokenizer_failures(entry, failures + check_prompts(model, tokenizer_json, tok_params))

    onnx_path, spec, encoder, cases = export_graph(model, input_names, work)
    if entry.graph_precision == "fp32":
        for batch in validation_batches(VALIDATION_TEXTS):
            diff, top = sparse_parity(model, batch, input_names, onnx_path, max_active_dims)
            if diff > SPARSE_ATOL * max(1.0, top):
                raise RuntimeError(
                    f"{entry.name}: served sparse rows differ from SparseEncoder.encode by "
                    f"{diff:.2e} (gate {SPARSE_ATOL:.0e}, relative beyond 1; largest value "
                    f"{top:.3g})"
                )
    apply_precision(onnx_path, entry.graph_precision, spec, encoder, cases)

    return [
        *split_encoder_dirs(
            entry,
            TextGraph(onnx_path, spec, tokenizer_json, tok_params, token_limits(model)),
            RunnerExtras(sparse=SparseOutput(max_active_dims)),
        ),
        _ensemble_dir(entry, input_names),
    ]
