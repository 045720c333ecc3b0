"""Family ``multi-vector``: a sentence-transformers ``MultiVectorEncoder`` or PyLate ColBERT.

Served pipelines: a text ``Transformer`` (feature extraction, right padding), then any
token-level ``Dense`` projections and ``Normalize``, and one ``MultiVectorMask`` (its
skiplist; no ``keep_only_token_ids``). The exported graph is that pipeline without the
mask: token tensors in, token embeddings ``[B, T, D]`` out. The encoder stub does the
rest (``embed_runtime.engines.multivector``): prompts, query expansion, skiplist, padding.

The build runs that serving code on the exported graph over the validation texts, as
queries and as documents, and compares every row with ``encode_query`` /
``encode_document`` of the folder loaded as the ``MultiVectorEncoder`` it declares;
anything over the gate, or any other pipeline, is refused before anything is written.

A folder saved by PyLate is rebuilt from sentence-transformers' modules (``pylate.py``)
and gated against PyLate's own ``ColBERT.encode``, run from its pinned reference
packages (``generator.pylate_reference``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from embed_runtime.engines.multivector import (
    EMBEDDINGS,
    TASKS,
    TOKEN_COUNT,
    MultiVectorParams,
    MultiVectorTextEncoder,
    TaskParams,
)
from embed_runtime.engines.ort_encoder import EncoderParams, OrtEncoder
from embed_runtime.steps import Adapter
from embed_runtime.text.tokenizer import TokenizerParams

from ...declared_kind import PYLATE, UnsupportedModelError
from ...manifest import Manifest, ModelEntry
from ...model_dir import ModelDir
from ...onnx_export import GraphSpec, TensorSpec, export_module, validate_graph
from ...pylate_reference import PyLateReference
from ...render import IOSpec, Step, ensemble, parse_config
from ..common import TEXT, TextGraph, text_encoder_dir
from ..text_export import (
    VALIDATION_TEXTS,
    checked_source,
    load_on_cpu,
    token_limits,
    transformer_tokenizer_params,
    write_tokenizer,
)
from . import FAMILY, pylate

# Parity gate of every served row against encode_query / encode_document: max |diff|.
MULTI_VECTOR_ATOL = 1e-5
TOKEN_EMBEDDINGS = "token_embeddings"  # noqa: S105 - a tensor name
PARITY_TEXTS = (*VALIDATION_TEXTS, "What is the capital of France?", "a, b; c!")


def _load(entry: ModelEntry, manifest: Manifest):
    """(the pipeline, its serving settings, the library reference the gate compares with)."""
    from sentence_transformers import MultiVectorEncoder  # noqa: PLC0415

    source, kind = checked_source(FAMILY, entry, manifest)
    if kind.model_type == PYLATE:
        reference = PyLateReference(source, entry.name)  # refused here when not installed
        model = pylate.load(source, entry.name, entry.max_seq_length)
        return model, pylate.params(model), reference
    model = load_on_cpu(MultiVectorEncoder, source)
    if entry.max_seq_length:
        model.max_seq_length = entry.max_seq_length
    _check_pipeline(entry.name, model)
    return model, multi_vector_params(model), model


def _check_pipeline(name: str, model) -> None:
    """Refuse what the serving code does not reproduce, naming it."""
    from sentence_transformers.base.modules import Dense, Normalize, Transformer  # noqa: PLC0415
    from sentence_transformers.multi_vector_encoder.modules import (  # noqa: PLC0415
        MultiVectorMask,
    )

    modules = list(model)
    classes = [type(m).__name__ for m in modules]
    problems = []
    first = modules[0]
    if not isinstance(first, Transformer):
        problems.append(f"the pipeline starts with {classes[0]}, not a Transformer")
    else:
        if first.transformer_task != "feature-extraction" or set(first.modality_config) != {
            "text"
        }:
            problems.append(
                f"Transformer task {first.transformer_task!r} with modalities "
                f"{sorted(first.modality_config)} (only text feature extraction is served)"
            )
        if first.processing_kwargs:
            problems.append(f"Transformer processing_kwargs {first.processing_kwargs!r}")
        if first.tokenizer is None or first.tokenizer.padding_side != "right":
            problems.append("a tokenizer that pads on the left (or none)")
    for module, cls in zip(modules[1:], classes[1:], strict=True):
        if isinstance(module, (Dense, Normalize)):
            ios = {module.module_input_name, module.module_output_name}
            if ios != {TOKEN_EMBEDDINGS}:
                problems.append(f"{cls} on {sorted(ios)} (only token_embeddings is served)")
        elif isinstance(module, MultiVectorMask):
            if module.keep_only_token_ids:
                problems.append("MultiVectorMask keep_only_token_ids (an allow-list of tokens)")
        else:
            problems.append(f"module {cls}")
    if classes.count("MultiVectorMask") != 1:
        problems.append(f"{classes.count('MultiVectorMask')} MultiVectorMask modules (needs one)")
    if problems:
        raise UnsupportedModelError(
            f"{name}: not supported by family 'multi-vector' ({'; '.join(problems)}); it "
            f"serves a Transformer, token-level Dense / Normalize and one MultiVectorMask "
            f"exactly (modules of this folder: {', '.join(classes)})"
        )


def multi_vector_params(model) -> MultiVectorParams:
    """The serving settings of ``model``: prompts, and per task what the library applies.

    Truncation and query expansion as ``Transformer.preprocess`` applies them, the
    skiplist as ``MultiVectorMask`` resolved it against the tokenizer (unknown words
    dropped).
    """
    from sentence_transformers.multi_vector_encoder.modules import (  # noqa: PLC0415
        MultiVectorMask,
    )

    transformer = model[0]
    tokenizer = transformer.tokenizer
    max_len = int(model.max_seq_length)
    mask = next(m for m in model if isinstance(m, MultiVectorMask))
    skip = mask._skiplist_ids
    skip_ids = tuple(int(i) for i in skip.tolist()) if skip is not None else ()
    tasks = {}
    for task in TASKS:
        length = transformer.query_length if task == "query" else transformer.document_length
        params = {"max_length": int(length or max_len)}
        expansion = transformer.query_expansion if task == "query" else None
        if expansion is not None:
            floor = int(expansion["length"])
            if expansion["strategy"] == "fixed":
                params["max_length"] = floor
            elif length is not None:
                params["max_length"] = max(int(length), floor)
            if expansion["token"] is not None:
                token_id = tokenizer.convert_tokens_to_ids(expansion["token"])
            else:
                token_id = tokenizer.mask_token_id
                if token_id is None:
                    token_id = tokenizer.eos_token_id
            params.update(
                expansion_length=floor,
                expansion_id=int(token_id if token_id is not None else tokenizer.pad_token_id or 0),
                expansion_attend=bool(expansion["attend"]),
            )
        if task in mask.skiplist_tasks:
            params["skip_ids"] = skip_ids
        tasks[task] = TaskParams(**params)
    prompts = {k: v for k, v in (model.prompts or {}).items() if v is not None}
    return MultiVectorParams(
        tasks["query"],
        tasks["document"],
        tuple(sorted(prompts.items())),
        model.default_prompt_name or "",
    )


def _encoder_module(model, input_names: list[str]):
    import torch  # noqa: PLC0415
    from sentence_transformers.multi_vector_encoder.modules import (  # noqa: PLC0415
        MultiVectorMask,
    )

    steps = [m for m in model if not isinstance(m, MultiVectorMask)]

    class Encoder(torch.nn.Module):
        """The pipeline without its scoring mask: token tensors in, token vectors out."""

        def __init__(self):
            super().__init__()
            self.steps = torch.nn.ModuleList(steps)

        def forward(self, *tensors):
            features = dict(zip(input_names, tensors, strict=True))
            features["modality"] = "text"
            for step in self.steps:
                features = step(features)
            return features[TOKEN_EMBEDDINGS]

    return Encoder().eval()


def _features(model, texts, task: str, input_names: list[str]) -> dict[str, np.ndarray]:
    if isinstance(model, pylate.PyLateModel):
        return pylate.features(model, texts, task, input_names)
    prompt = model.prompts.get(task) if model.prompts else None
    enc = model.preprocess(list(texts), prompt=prompt, task=task)
    return {n: enc[n].numpy().astype(np.int64) for n in input_names}


def served_parity(model, text: MultiVectorTextEncoder, texts) -> dict[str, float]:
    """Max |served row - library row| per task over ``texts`` (shapes must agree).

    ``model`` has the library's ``encode_query`` / ``encode_document``.
    """
    from embed_runtime.engines.multivector import MultiVectorRequest, unpad  # noqa: PLC0415

    out = {}
    for task in TASKS:
        request = text.read(np.asarray([t.encode() for t in texts], dtype=object), {"task": task})
        embeddings, counts = text.embed([MultiVectorRequest(request.texts, request.task)])[0]
        got = unpad(embeddings, counts)
        library = model.encode_query if task == "query" else model.encode_document
        want = [np.asarray(w) for w in library(list(texts), batch_size=len(texts))]
        worst = 0.0
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            if g.shape != w.shape:
                raise RuntimeError(
                    f"{task} row {i} ({texts[i][:30]!r}): served {g.shape[0]} vectors, "
                    f"the library {w.shape[0]}"
                )
            worst = max(worst, float(np.abs(g - w).max()))
        out[task] = worst
    return out


def _outputs(dim: int) -> list[IOSpec]:
    """``EMBEDDINGS`` ``[N, T, D]`` (zero-padded) and ``TOKEN_COUNT``, of encoder and ensemble."""
    return [IOSpec(EMBEDDINGS, "TYPE_FP32", (-1, dim)), IOSpec(TOKEN_COUNT, "TYPE_INT32", (1,))]


def _ensemble_dir(entry: ModelEntry, dim: int) -> ModelDir:
    encode = f"{entry.name}_encode"
    config = ensemble(
        entry.name,
        entry.max_batch_size,
        [TEXT],
        _outputs(dim),
        [Step(encode, (("TEXT", "TEXT"),), ((EMBEDDINGS, EMBEDDINGS), (TOKEN_COUNT, TOKEN_COUNT)))],
    )
    return ModelDir(entry.name, config, None, {})


def build(entry: ModelEntry, manifest: Manifest, work: Path) -> list[ModelDir]:
    """Export, validate and describe the two model dirs of one multi-vector model."""
    model, mv_params, reference = _load(entry, manifest)
    tokenizer_json = work / "tokenizer.json"
    input_names = write_tokenizer(model, tokenizer_json)
    if set(input_names) - {"input_ids", "attention_mask", "token_type_ids"}:
        raise UnsupportedModelError(f"{entry.name}: token inputs {input_names} are not served")
    tok_params = transformer_tokenizer_params(
        model,
        input_names,
        mv_params.document.max_length,
        max_text_bytes=entry.max_text_bytes,
        max_request_bytes=entry.max_request_text_bytes,
    )
    encoder = _encoder_module(model, input_names)
    sample = _features(model, VALIDATION_TEXTS[:3], "document", input_names)
    import torch  # noqa: PLC0415

    with torch.inference_mode():
        dim = int(encoder(*(torch.from_numpy(sample[n]) for n in input_names)).shape[-1])
    spec = GraphSpec(
        inputs=tuple(TensorSpec(n, "int64", (-1,)) for n in input_names),
        outputs=(TensorSpec(TOKEN_EMBEDDINGS, "float32", (-1, dim)),),
    )
    onnx_path = work / "model.onnx"
    export_module(encoder, spec, sample, onnx_path)
    cases = [
        _features(model, batch, task, input_names)
        for task in TASKS
        for batch in (VALIDATION_TEXTS[:1], VALIDATION_TEXTS)
    ]
    validate_graph(onnx_path, spec, encoder, cases)

    # The encoder tokenizes per request task itself (query expansion feeds positions the
    # attention mask leaves out, which the split tokenize step would trim).
    model_dir = text_encoder_dir(
        entry,
        f"{entry.name}_encode",
        Adapter.ENCODE_MULTIVECTOR,
        TextGraph(onnx_path, spec, tokenizer_json, tok_params, token_limits(model)),
        outputs=_outputs(dim),
        parameters=mv_params.parameters(),
    )
    served = _serving_encoder(model_dir, onnx_path, tokenizer_json)
    for texts in (PARITY_TEXTS[:1], PARITY_TEXTS):
        for task, diff in served_parity(reference, served, texts).items():
            if diff > MULTI_VECTOR_ATOL:
                library = ("PyLate ColBERT.encode" if reference is not model
                           else "MultiVectorEncoder.encode")
                raise RuntimeError(
                    f"{entry.name}: served {task} vectors differ from {library}_{task} by "
                    f"{diff:.2e} (max abs, gate {MULTI_VECTOR_ATOL:.0e})"
                )
    return [model_dir, _ensemble_dir(entry, dim)]


def _serving_encoder(model_dir: ModelDir, onnx_path: Path, tokenizer_json: Path):
    """The stub's own serving objects, built from the config parameters it will read."""
    config = parse_config(model_dir.config)
    raw = {key: value.string_value for key, value in config.parameters.items()}
    params = EncoderParams.from_parameters({**raw, "weight_cache": "false"})
    return MultiVectorTextEncoder(
        str(tokenizer_json),
        TokenizerParams.from_parameters(raw),
        MultiVectorParams.from_parameters(raw),
        OrtEncoder(str(onnx_path), params),
    )
