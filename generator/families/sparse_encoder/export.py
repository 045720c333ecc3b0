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

from embed_runtime.engines.sparse import INDICES, VALUES

from ...manifest import Manifest, ModelEntry
from ...model_dir import ModelDir
from ...precision import apply_precision
from ...render import Step, ensemble
from ..common import TEXT, RunnerExtras, SparseOutput, TextGraph, split_encoder_dirs
from ..text_export import (
    VALIDATION_TEXTS,
    load_checked,
    model_prompts,
    token_limits,
    validation_batches,
    write_checked_tokenizer,
)
from . import FAMILY, inference_free
from .splade import SPARSE_ATOL, export_graph, is_splade, sparse_parity


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
    prompts, default_prompt = model_prompts(dataclasses.replace(entry, prompts=None), model)
    tokenizer_json, input_names, tok_params = write_checked_tokenizer(
        entry, model, work, prompts, default_prompt
    )

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
