"""Inference-free sparse encoders: a ``Router`` of static query weights and a SPLADE.

The folder's ``SparseEncoder`` is one ``Router`` module: the ``query`` route a
``SparseStaticEmbedding`` (the query's tokens, each once, times a weight per vocabulary
entry), the ``document`` route a fill-mask Transformer and ``SpladePooling``. The build
exports the document route as any SPLADE graph, stores the query route's tokenizer and
weights beside it, and serves both from one Python encoder (``<name>_encode``, ``TEXT`` in)
that routes each request by its ``task`` parameter. Before anything is written the served
rows are checked against the declared model's own ``encode_query`` and ``encode_document``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from embed_runtime.engines.sparse import INDICES, VALUES, densify
from embed_runtime.steps import Adapter
from embed_runtime.text.tokenizer import TokenizerParams

from ...declared_kind import UnsupportedModelError
from ...manifest import ModelEntry
from ...model_dir import ModelDir
from ...render import Step, ensemble, parse_config
from ..common import (
    QUERY_TOKENIZER_FILE,
    QUERY_WEIGHTS_FILE,
    TEXT,
    QueryRoute,
    SparseOutput,
    TextGraph,
    text_encoder_dir,
)
from ..text_export import (
    VALIDATION_TEXTS,
    check_tokenizer,
    refuse_tokenizer_failures,
    token_differences,
    token_limits,
    transformer_tokenizer_params,
    write_tokenizer,
)
from . import splade

# A tokenizer's "no limit" (transformers' VERY_LARGE_INTEGER): the query is then not cut.
NO_LIMIT = 1_000_000
ROUTES = ("document", "query")


def is_router(model) -> bool:
    """Whether the loaded SparseEncoder is a single Router module."""
    from sentence_transformers.base.modules import Router  # noqa: PLC0415

    return len(model) == 1 and isinstance(model[0], Router)


def check_pipeline(entry: ModelEntry, model) -> None:
    """Refuse any Router but query -> SparseStaticEmbedding, document -> SPLADE (right padded).

    The folder's declaration was checked before loading (``declared_kind``); this checks
    the loaded modules and the settings the server reproduces: no prompt text, the
    Router's default route ``document``, no manifest ``max_seq_length``.
    """
    from sentence_transformers.sparse_encoder.modules import (  # noqa: PLC0415
        SparseStaticEmbedding,
    )

    router = model[0]
    routes = {name: list(modules) for name, modules in router.sub_modules.items()}
    query, document = routes.get("query", []), routes.get("document", [])
    shape = {name: [type(m).__name__ for m in modules] for name, modules in routes.items()}
    if (
        set(routes) != set(ROUTES)
        or len(query) != 1
        or not isinstance(query[0], SparseStaticEmbedding)
        or not splade.is_splade(document)
    ):
        raise UnsupportedModelError(
            f"{entry.name}: only a Router of query -> SparseStaticEmbedding and document -> "
            f"Transformer (fill-mask) + SpladePooling, right padded, is supported; this "
            f"model routes {shape}"
        )
    if router.default_route != "document" or router.route_mappings:
        raise UnsupportedModelError(
            f"{entry.name}: a Router with default route {router.default_route!r} or route "
            "mappings of its own is not supported (the server routes by task: query / "
            "document, the default)"
        )
    prompts = {k: v for k, v in (model.prompts or {}).items() if v}
    if prompts or model.default_prompt_name:
        raise UnsupportedModelError(
            f"{entry.name}: prompts on an inference-free sparse encoder are not supported "
            f"(this model has {prompts or model.default_prompt_name!r})"
        )
    if entry.max_seq_length:
        raise UnsupportedModelError(
            f"{entry.name}: max_seq_length is not supported for an inference-free sparse "
            "encoder (each route keeps its own length)"
        )


def _document_model(model):
    """The document route as a SparseEncoder of its own (the graph to export)."""
    from sentence_transformers import SparseEncoder  # noqa: PLC0415

    return SparseEncoder(modules=list(model[0].sub_modules["document"]), device="cpu").eval()


def _query_route(model, work: Path) -> QueryRoute:
    """Save the query route's tokenizer (no padding, no truncation) and weights."""
    from tokenizers import Tokenizer  # noqa: PLC0415

    static = model[0].sub_modules["query"][0]
    tok = Tokenizer.from_str(static.tokenizer.backend_tokenizer.to_str())
    tok.no_padding()
    tok.no_truncation()
    tok.save(str(work / QUERY_TOKENIZER_FILE))
    np.save(work / QUERY_WEIGHTS_FILE, static.weight.detach().cpu().numpy().astype(np.float32))
    length = int(static.tokenizer.model_max_length)
    return QueryRoute(
        work,
        length if length < NO_LIMIT else 0,
        static.tokenizer.pad_token_id or 0,
        bool(getattr(static.tokenizer, "do_lower_case", False)),
    )


def _check_query_tokenizer(model, route: QueryRoute, doc_params: TokenizerParams) -> list[str]:
    """Differences between the served query tokens and ``SparseStaticEmbedding.preprocess``."""
    from embed_runtime.engines.sparse_router import query_tokenizer  # noqa: PLC0415

    static = model[0].sub_modules["query"][0]
    raw = {**doc_params.to_parameters(), **route.parameters()}
    runtime = query_tokenizer(raw, str(route.folder))
    return token_differences(static, runtime, "query tokenizer differs from the library")


def served_parity(model, router, texts, max_active_dims: int) -> dict[str, float]:
    """Max |served rows made dense - encode_query / encode_document| per route."""
    out = {}
    rows = np.asarray([t.encode() for t in texts], dtype=object).reshape(-1, 1)
    for task in ROUTES:
        request = router.read(rows, {"task": task})
        ((indices, values),) = router.embed([request])
        library = model.encode_query if task == "query" else model.encode_document
        want = splade.library_rows(library, texts, max_active_dims)
        got = densify(indices, values, want.shape[1])
        out[task] = float(np.max(np.abs(got - want)) / max(1.0, float(np.abs(want).max())))
    return out


def _serving_router(model_dir: ModelDir, work: Path):
    """The stub's own serving objects, built from the config parameters it will read."""
    from embed_runtime.engines.ort_encoder import EncoderParams, OrtEncoder  # noqa: PLC0415
    from embed_runtime.engines.sparse_router import SparseRouter, query_tokenizer  # noqa: PLC0415
    from embed_runtime.engines.text_encoder import TextEncoder  # noqa: PLC0415

    config = parse_config(model_dir.config)
    raw = {key: value.string_value for key, value in config.parameters.items()}
    params = EncoderParams.from_parameters({**raw, "weight_cache": "false"})
    encoder = OrtEncoder(str(work / "model.onnx"), params)
    return SparseRouter(
        TextEncoder.from_parameters(raw, str(work), encoder),
        query_tokenizer(raw, str(work)),
        np.load(work / QUERY_WEIGHTS_FILE),
        params.max_active_dims,
    )


def _ensemble_dir(entry: ModelEntry) -> ModelDir:
    encode = f"{entry.name}_encode"
    config = ensemble(
        entry.name,
        entry.max_batch_size,
        [TEXT],
        list(SparseOutput.outputs()),
        [Step(encode, (("TEXT", "TEXT"),), ((INDICES, INDICES), (VALUES, VALUES)))],
    )
    return ModelDir(entry.name, config, None, {})


def build(entry: ModelEntry, model, work: Path) -> list[ModelDir]:
    """Export, validate and describe the two model dirs of an inference-free encoder."""
    max_active_dims = entry.max_active_dims or model.max_active_dims or 0
    model.max_active_dims = None
    document = _document_model(model)
    tokenizer_json = work / "tokenizer.json"
    input_names = write_tokenizer(document, tokenizer_json)
    tok_params = transformer_tokenizer_params(
        document,
        input_names,
        max_text_bytes=entry.max_text_bytes,
        max_request_bytes=entry.max_request_text_bytes,
    )
    query = _query_route(model, work)
    failures = check_tokenizer(document, tokenizer_json, tok_params)
    refuse_tokenizer_failures(entry, failures + _check_query_tokenizer(model, query, tok_params))
    onnx_path, spec, _encoder, _cases = splade.export_graph(document, input_names, work)
    if entry.graph_precision != "fp32":
        raise UnsupportedModelError(
            f"{entry.name}: graph_precision {entry.graph_precision!r} is not supported for "
            "an inference-free sparse encoder (fp32 only)"
        )
    # Queries (request parameter task=query) are weighed by the query route's static
    # weights, documents go through the SPLADE graph; each route has its own tokenizer.
    encode = text_encoder_dir(
        entry,
        f"{entry.name}_encode",
        Adapter.ENCODE_SPARSE_ROUTER,
        TextGraph(onnx_path, spec, tokenizer_json, tok_params, token_limits(document)),
        outputs=SparseOutput.outputs(),
        parameters={**SparseOutput(max_active_dims).parameters(), **query.parameters()},
        files=query.files(),
    )
    router = _serving_router(encode, work)
    for texts in (VALIDATION_TEXTS[:1], VALIDATION_TEXTS):
        for task, diff in served_parity(model, router, texts, max_active_dims).items():
            if diff > splade.SPARSE_ATOL:
                raise RuntimeError(
                    f"{entry.name}: served {task} rows differ from SparseEncoder.encode_{task} "
                    f"by {diff:.2e} (max abs, relative beyond 1; gate "
                    f"{splade.SPARSE_ATOL:.0e})"
                )
    return [encode, _ensemble_dir(entry)]
