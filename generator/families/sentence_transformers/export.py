"""Family ``sentence-transformers``: tokenizer + ONNX encoder with pooling in the graph.

The exported graph is the model's own module pipeline (``modules.json``): the
Transformer, its Pooling (mean / CLS / max / last-token / weighted mean, as set in
``1_Pooling/config.json``), any Dense layers and Normalize, plus a final L2
normalisation when the manifest asks for normalised embeddings. A StaticEmbedding
pipeline (no transformer) exports as the mean of its table's rows (``static``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np

from embed_runtime.engines.output_precision import EXTRA_PRECISIONS
from embed_runtime.text.tokenizer import BatchTokenizer

from ...calibration import CALIBRATION_FILE, DEFAULT_CORPUS, calibration_embeddings, read_corpus
from ...manifest import Manifest, ModelEntry
from ...model_dir import ModelDir
from ...onnx_export import GraphSpec, TensorSpec, export_module, validate_graph
from ...precision import apply_precision, fuse_graph
from ..common import (
    PRECISION_OUTPUTS,
    TEXT,
    TOKEN_COUNT,
    RunnerExtras,
    TextGraph,
    chain_dir,
    chunks_dir,
    fused_encoder_dir,
    litellm_dir,
    openai_dir,
    split_encoder_dirs,
)
from ..spec import serves_openai
from ..text_export import (
    VALIDATION_TEXTS,
    graph_input_names,
    is_static,
    load_checked,
    model_prompts,
    pipeline_module,
    refuse_tokenizer_failures,
    token_features,
    token_limits,
    validation_batches,
    write_checked_tokenizer,
)
from . import FAMILY, static
from .late_chunking import LateGraphs, export_late_graphs


def _load(entry: ModelEntry, manifest: Manifest):
    from sentence_transformers import SentenceTransformer  # noqa: PLC0415

    model = load_checked(FAMILY, SentenceTransformer, entry, manifest)
    if entry.max_seq_length and not is_static(model):
        model.max_seq_length = entry.max_seq_length
    return model


def _encoder_module(model, input_names: list[str], normalize: bool):
    import torch  # noqa: PLC0415

    def embedding(out: dict):
        out = out["sentence_embedding"]
        return torch.nn.functional.normalize(out, p=2, dim=1) if normalize else out

    return pipeline_module(model, input_names, embedding)


def _graph_spec(input_names: list[str], dim: int) -> GraphSpec:
    return GraphSpec(
        inputs=tuple(TensorSpec(n, "int64", (-1,)) for n in input_names),
        outputs=(TensorSpec("EMBEDDING", "float32", (dim,)),),
    )


# How far the graph fed the server's way may be from the library's own encode.
SERVED_PADDING_ATOL = 1e-4


def _check_served_padding(
    model, entry: ModelEntry, onnx_path: Path, tokenizer_json: Path, params, input_names
) -> None:
    """The graph, fed the way the server feeds it, must give ``SentenceTransformer.encode``.

    The library pads as its tokenizer says (on the left for Qwen3-style decoders) and the
    graph check above uses that padding; the server pads every chunk on the right to its
    own longest row. So the validation texts, of very different lengths, are tokenized by
    the serving tokenizer into one right-padded batch, run through the exported graph and
    compared with what the library returns for them.
    """
    import onnxruntime as ort  # noqa: PLC0415 - a build-time check of the exported graph

    texts = list(VALIDATION_TEXTS)
    arrays = BatchTokenizer(str(tokenizer_json), params).encode(texts)
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    got = session.run(["EMBEDDING"], {n: arrays[n] for n in input_names})[0]
    truncate_dim, model.truncate_dim = model.truncate_dim, None  # the graph's full width
    try:  # no prompt: the tokenizer above adds none either
        want = model.encode(
            texts, prompt="", convert_to_numpy=True, normalize_embeddings=entry.normalize
        )
    finally:
        model.truncate_dim = truncate_dim
    worst = float(np.abs(got - want).max())
    if worst > SERVED_PADDING_ATOL:
        raise RuntimeError(
            f"{entry.name}: fed the way the server pads (on the right, per chunk) the graph "
            f"differs from SentenceTransformer.encode by {worst:.2e} (max abs, allowed "
            f"{SERVED_PADDING_ATOL:g}): this model's output depends on padding the server "
            "does not reproduce, so it is not served"
        )


def _dimensions(entry: ModelEntry, model) -> tuple[ModelEntry, int, int]:
    """``entry`` with its default ``truncate_dim``, the width D, and D again or 0.

    The third value is D when requests may ask for fewer ``dimensions`` (python-ort).
    The model's own truncate_dim (config_sentence_transformers.json) is its default width,
    as in sentence-transformers; the graph itself returns every dimension.
    """
    own_truncate_dim, model.truncate_dim = model.truncate_dim, None
    dim = int(model.get_embedding_dimension())
    entry = dataclasses.replace(entry, truncate_dim=entry.truncate_dim or own_truncate_dim)
    truncatable = dim if entry.encoder_backend == "python-ort" else 0
    if entry.truncate_dim and not 1 <= entry.truncate_dim <= truncatable:
        raise ValueError(
            f"{entry.name}: truncate_dim {entry.truncate_dim} needs encoder_backend "
            f"'python-ort' and at most {dim}"
        )
    return entry, dim, truncatable


def resolved_normalize(entry: ModelEntry, model, log=print) -> ModelEntry:
    """``entry`` with ``normalize`` decided, and the build log told which and why.

    Unset, it follows the pipeline, as ``encode()`` does: L2 when a Normalize module ends
    it, the raw vectors otherwise (a dot-product model's scores depend on their norms).
    """
    has_module = any(type(module).__name__ == "Normalize" for module in model)
    if entry.normalize is None:
        why = "its pipeline has a Normalize module" if has_module else (
            "its pipeline has no Normalize module, so encode() returns them raw; "
            "set normalize = true to L2-normalise"
        )
        entry = dataclasses.replace(entry, normalize=has_module)
    else:
        why = f"normalize = {str(entry.normalize).lower()} in the manifest"
    shown = "L2-normalised" if entry.normalize else "raw (not normalised)"
    log(f"{entry.name}: serves {shown} vectors: {why}")
    return entry


def build(entry: ModelEntry, manifest: Manifest, work: Path) -> list[ModelDir]:
    """Export, validate and describe the model dirs of one text model.

    Three (tokenize, encode, the ensemble), or two with ``fused_tokenize`` (an encoder
    that takes ``TEXT`` itself, and the ensemble calling it).
    """
    model = _load(entry, manifest)
    entry = resolved_normalize(entry, model)
    if is_static(model):
        return _build_static(entry, model, work)
    prompts, default_prompt = model_prompts(entry, model)
    entry, dim, truncatable = _dimensions(entry, model)
    tokenizer_json, input_names, tok_params = write_checked_tokenizer(
        entry, model, work, prompts, default_prompt, max_dimensions=truncatable
    )

    spec = _graph_spec(input_names, dim)
    encoder = _encoder_module(model, input_names, entry.normalize)
    onnx_path = work / "model.onnx"
    sample = model.preprocess(list(VALIDATION_TEXTS[:3]))
    export_module(encoder, spec, {n: sample[n] for n in input_names}, onnx_path)
    batches = validation_batches(VALIDATION_TEXTS)
    cases = [token_features(model, batch, input_names) for batch in batches]
    validate_graph(onnx_path, spec, encoder, cases)
    fuse_graph(entry, model[0].auto_model.config, onnx_path, spec, encoder, cases)
    _check_served_padding(model, entry, onnx_path, tokenizer_json, tok_params, input_names)
    apply_precision(onnx_path, entry.graph_precision, spec, encoder, cases)
    graph = TextGraph(onnx_path, spec, tokenizer_json, tok_params, token_limits(model))
    late = None
    if entry.late_chunking:
        late = export_late_graphs(model, entry.name, input_names, entry.normalize, work, cases)
    return _model_dirs(entry, graph, dim, late)


def _build_static(entry: ModelEntry, model, work: Path) -> list[ModelDir]:
    """A StaticEmbedding pipeline (``static``): the masked-mean graph.

    Checked against ``SentenceTransformer.encode`` of the folder before anything is written.
    """
    if entry.late_chunking:
        raise ValueError(
            f"{entry.name}: late_chunking needs a transformer; a StaticEmbedding model has none"
        )
    if entry.max_seq_length:
        raise ValueError(
            f"{entry.name}: max_seq_length does not apply to a StaticEmbedding model (its "
            "tokenizer.json's own truncation, if any, applies; max_text_bytes bounds a row)"
        )
    normalize = static.normalize_steps(model, entry.normalize)
    tokenizer_json = work / "tokenizer.json"
    truncation = static.write_tokenizer(model, tokenizer_json)
    input_names = graph_input_names(model)
    prompts, default_prompt = model_prompts(entry, model)
    entry, dim, truncatable = _dimensions(entry, model)
    tok_params = static.tokenizer_params(input_names, prompts, default_prompt, truncatable)
    texts = (*VALIDATION_TEXTS, *static.EXTRA_TEXTS)
    refuse_tokenizer_failures(
        entry, static.check_tokenizer(model, tokenizer_json, tok_params, texts)
    )

    spec = _graph_spec(input_names, dim)
    encoder = static.encoder_module(model, normalize)
    onnx_path = work / "model.onnx"
    runtime = BatchTokenizer(str(tokenizer_json), tok_params)
    export_module(encoder, spec, runtime.encode(list(VALIDATION_TEXTS[:3])), onnx_path)
    cases = [runtime.encode(list(batch)) for batch in validation_batches(texts)]
    validate_graph(onnx_path, spec, encoder, cases)
    static.check_parity(model, onnx_path, tokenizer_json, tok_params, entry.normalize, texts)
    apply_precision(onnx_path, entry.graph_precision, spec, encoder, cases)
    limits = static.token_limits(model, truncation)
    return _model_dirs(entry, TextGraph(onnx_path, spec, tokenizer_json, tok_params, limits), dim)


def _model_dirs(
    entry: ModelEntry, graph: TextGraph, dim: int, late: LateGraphs | None = None
) -> list[ModelDir]:
    """The tokenize, encode and ensemble dirs (or the fused encoder and the ensemble).

    Also ``<name>_chunks`` (long texts cut into chunks), which the plain steps point to
    when a request sends them chunk options.
    """
    chunked = dataclasses.replace(graph.tok_params, chunks_model=f"{entry.name}_chunks")
    graph = dataclasses.replace(graph, tok_params=chunked)
    input_names = graph.spec.input_names
    truncatable = graph.tok_params.max_dimensions
    tokenize, encode = f"{entry.name}_tokenize", f"{entry.name}_encode"
    out_dim = -1 if truncatable else dim
    # The Python runner also answers the quantized forms the entry names (output_precisions:
    # float16, int8, ...); int8 / uint8 take their ranges from calibration embeddings made
    # here. The native backend cannot (the manifest refuses the option for it).
    forms = [o for p, o in zip(EXTRA_PRECISIONS, PRECISION_OUTPUTS, strict=True)
             if p in entry.output_precisions]
    calibration = None
    if {"int8", "uint8"} & set(entry.output_precisions):
        calibration = graph.onnx_path.parent / CALIBRATION_FILE
        corpus = read_corpus(DEFAULT_CORPUS)
        calibration_embeddings(
            graph.onnx_path, graph.tokenizer_json, graph.tok_params, corpus, calibration
        )
    if entry.fused_tokenize:
        extra = [*([TOKEN_COUNT] if entry.token_count else []), *forms]
        outs = ["EMBEDDING", *(o.name for o in extra)]
        return [
            fused_encoder_dir(entry, encode, graph, forms=forms, calibration=calibration),
            chain_dir(entry, entry.name, TEXT, out_dim, [(encode, ["TEXT"], outs)], extra),
            chunks_dir(entry, graph, out_dim, late),
            *_litellm_dirs(entry, out_dim, lambda outputs: [(encode, ["TEXT"], outputs)]),
        ]
    # The Python runner counts the tokens each row had (its attention mask); Triton's
    # native onnxruntime backend can only return what the graph does.
    counts = (
        entry.token_count
        and entry.encoder_backend == "python-ort"
        and "attention_mask" in input_names
    )
    extra = [*([TOKEN_COUNT] if counts else []), *forms]
    outs = ["EMBEDDING", *(o.name for o in extra)]
    return [
        *split_encoder_dirs(
            entry,
            graph,
            # The encoder also counts for <name>_openai (the gateway's usage).
            RunnerExtras(
                max_dimensions=truncatable,
                token_count=counts or serves_openai(entry),
                forms=forms,
                calibration=calibration,
            ),
        ),
        chain_dir(
            entry,
            entry.name,
            TEXT,
            out_dim,
            [(tokenize, ["TEXT"], input_names), (encode, input_names, outs)],
            extra,
        ),
        chunks_dir(entry, graph, out_dim, late),
        *_litellm_dirs(
            entry,
            out_dim,
            lambda outputs: [(tokenize, ["TEXT"], input_names), (encode, input_names, outputs)],
        ),
    ]


def _litellm_dirs(
    entry: ModelEntry, dim: int, steps: Callable[[list[str]], list]
) -> list[ModelDir]:
    """``<name>_litellm`` and ``<name>_openai`` where the entry opts in (``litellm = true``).

    ``steps(outputs)``: the plain ensemble's steps, the last one answering ``outputs``.
    ``<name>_openai`` only where the encoder counts tokens (:func:`serves_openai`).
    """
    if not entry.litellm:
        return []
    dirs = [litellm_dir(entry, dim, steps(["EMBEDDING"]))]
    if serves_openai(entry):
        dirs.append(openai_dir(entry, dim, steps(["EMBEDDING", TOKEN_COUNT.name])))
    return dirs
