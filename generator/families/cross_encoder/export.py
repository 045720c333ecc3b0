"""Family ``cross-encoder``: a sentence-transformers ``CrossEncoder`` reranker.

Three model dirs: ``<name>_tokenize`` (pairs of ``QUERY`` and ``TEXT`` rows tokenized
together, truncated ``longest_first`` as ``CrossEncoder`` does), ``<name>_encode`` (the
ONNX classifier with the model's activation in the graph, exactly what
``CrossEncoder.predict`` returns, run ragged in length-sorted chunks) and the ensemble
``<name>``: ``QUERY`` [N, 1] + ``TEXT`` [N, 1] -> ``SCORE`` [N, num_labels].
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from embed_runtime.steps import Adapter
from embed_runtime.text.pair_template import TemplatePairTokenizer
from embed_runtime.text.pair_tokenizer import PairTokenizer
from embed_runtime.text.tokenizer import TokenizerParams

from ...manifest import Manifest, ModelEntry
from ...model_dir import ModelDir
from ...onnx_export import GraphSpec, TensorSpec, export_module, validate_graph
from ...precision import apply_precision
from ...render import Instances, IOSpec, Step, ensemble, python_model
from ..common import (
    admission_parameters,
    admits,
    encoder_dir,
    step_batching,
    tokenizer_parameters,
)
from ..text_export import (
    load_checked,
    pipeline_module,
    refuse_tokenizer_failures,
    token_features,
    token_limits,
    validation_batches,
)
from . import FAMILY, SHARED_PAIRS, llm

# Score parity gate of the exported graph against ``CrossEncoder.predict`` (max |diff|).
SCORE_ATOL = 1e-5

VALIDATION_PAIRS = (
    *SHARED_PAIRS,
    ("   spaces   ", "Numbers 3.14159, 2,718 and 1e-10; URLs like https://example.com/a?b=c"),
)


def _load(entry: ModelEntry, manifest: Manifest):
    from sentence_transformers import CrossEncoder  # noqa: PLC0415

    kwargs = {"max_length": entry.max_seq_length} if entry.max_seq_length else {}
    model = load_checked(FAMILY, CrossEncoder, entry, manifest, **kwargs)
    if llm.is_llm_reranker(model):
        llm.check_llm_reranker(model, entry.name)
        return model
    transformer = model[0]
    if len(model) != 1 or transformer.tokenizer.padding_side != "right":
        raise ValueError(
            f"{entry.name}: only sequence-classification cross-encoders (one Transformer "
            "module, right padding) and LLM rerankers (Transformer + LogitScore) are supported"
        )
    return model


def _scorer_module(model, input_names: list[str]):
    activation = model.activation_fn

    def score(out: dict):
        """Logits of the classifier and the activation ``CrossEncoder.predict`` applies."""
        scores = out["scores"].float()
        return activation(scores) if activation is not None else scores

    return pipeline_module(model, input_names, score)


def _features(model, pairs, input_names: list[str]) -> dict[str, np.ndarray]:
    return token_features(model, [list(p) for p in pairs], input_names)


def _write_tokenizer(model, path: Path) -> list[str]:
    from tokenizers import Tokenizer  # noqa: PLC0415

    tok = Tokenizer.from_str(model[0].tokenizer.backend_tokenizer.to_str())
    tok.no_padding()
    tok.no_truncation()
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in model[0].tokenizer.model_input_names:
        names.append("token_type_ids")
    return names


def check_pair_tokenizer(model, path: Path, params: TokenizerParams) -> list[str]:
    """Differences between the runtime pair tokenizer and ``CrossEncoder.preprocess``."""
    runtime = PairTokenizer(str(path), params)
    failures = []
    for pair in VALIDATION_PAIRS:
        want = _features(model, [pair], list(params.output_names))
        got = runtime.encode([pair])
        for name in params.output_names:
            if want[name].tolist() != got[name].tolist():
                failures.append(f"{name} differs from CrossEncoder on {pair[0][:30]!r}")
    return failures


def score_parity(model, scorer, pairs, input_names: list[str], onnx_path: Path) -> float:
    """Max |ONNX - CrossEncoder.predict| over ``pairs`` (scored one batch at once)."""
    import onnxruntime as ort  # noqa: PLC0415

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    want = np.asarray(model.predict([list(p) for p in pairs], batch_size=len(pairs)))
    got = session.run(["SCORE"], _features(model, pairs, input_names))[0]
    return float(np.max(np.abs(got.reshape(want.shape) - want)))


def _tokenize_dir(
    entry: ModelEntry,
    name: str,
    tokenizer_json: Path,
    params: TokenizerParams,
    extra: dict[str, str] | None = None,
):
    config = python_model(
        name,
        entry.max_batch_size,
        [IOSpec("QUERY", "TYPE_STRING", (1,)), IOSpec("TEXT", "TYPE_STRING", (1,))],
        [IOSpec(n, "TYPE_INT64", (-1,)) for n in params.output_names],
        {
            **tokenizer_parameters(entry, params),
            **(extra or {}),
            **admission_parameters(entry, f"{entry.name}_encode"),
        },
        step_batching(entry, entry.max_queue_delay_us // 2, admitted=admits(entry)),
        Instances(entry.preprocess_instances),
    )
    return ModelDir(name, config, Adapter.TOKENIZE_PAIRS, {"tokenizer.json": tokenizer_json})


def _ensemble_dir(entry: ModelEntry, labels: int, input_names: list[str]) -> ModelDir:
    tokenize, encode = f"{entry.name}_tokenize", f"{entry.name}_encode"
    pairs = (("QUERY", "QUERY"), ("TEXT", "TEXT"))
    tokens = tuple((n, n) for n in input_names)
    config = ensemble(
        entry.name,
        entry.max_batch_size,
        [IOSpec("QUERY", "TYPE_STRING", (1,)), IOSpec("TEXT", "TYPE_STRING", (1,))],
        [IOSpec("SCORE", "TYPE_FP32", (labels,))],
        [Step(tokenize, pairs, tokens), Step(encode, tokens, (("SCORE", "SCORE"),))],
    )
    return ModelDir(entry.name, config, None, {})


def build(entry: ModelEntry, manifest: Manifest, work: Path) -> list[ModelDir]:
    """Export, validate and describe the three model dirs of one reranker."""
    model = _load(entry, manifest)
    if llm.is_llm_reranker(model):
        return _build_llm(entry, model, work)
    tokenizer_json = work / "tokenizer.json"
    input_names = _write_tokenizer(model, tokenizer_json)
    pad_id = model[0].tokenizer.pad_token_id or 0
    params = TokenizerParams(int(model.max_seq_length), False, tuple(input_names), pad_id)
    refuse_tokenizer_failures(entry, check_pair_tokenizer(model, tokenizer_json, params))

    labels = int(model.num_labels)
    spec = GraphSpec(
        inputs=tuple(TensorSpec(n, "int64", (-1,)) for n in input_names),
        outputs=(TensorSpec("SCORE", "float32", (labels,)),),
    )
    scorer = _scorer_module(model, input_names)
    onnx_path = work / "model.onnx"
    sample = model.preprocess([list(p) for p in VALIDATION_PAIRS[:3]])
    export_module(scorer, spec, {n: sample[n] for n in input_names}, onnx_path)
    cases = [_features(model, b, input_names) for b in validation_batches(VALIDATION_PAIRS)]
    atol = SCORE_ATOL if entry.graph_precision == "fp32" else 1e-2
    validate_graph(onnx_path, spec, scorer, cases, atol=atol, min_cosine=0.0)
    if entry.graph_precision == "fp32":
        diff = score_parity(model, scorer, VALIDATION_PAIRS, input_names, onnx_path)
        if diff > SCORE_ATOL:
            raise RuntimeError(
                f"{entry.name}: ONNX scores differ from CrossEncoder.predict by {diff:.2e}"
            )
    apply_precision(onnx_path, entry.graph_precision, spec, scorer, cases)

    tokenize, encode = f"{entry.name}_tokenize", f"{entry.name}_encode"
    return [
        _tokenize_dir(entry, tokenize, tokenizer_json, params),
        encoder_dir(entry, encode, onnx_path, spec, ragged=True, limits=token_limits(model)),
        _ensemble_dir(entry, labels, input_names),
    ]


def _build_llm(entry: ModelEntry, model, work: Path) -> list[ModelDir]:
    """An LLM reranker (``LogitScore``): template tokenizer, rotated-padding graph, gates."""
    template = llm.pair_template(model, entry.name)
    tokenizer_json = work / "tokenizer.json"
    _write_tokenizer(model, tokenizer_json)
    params = llm.tokenizer_params(model)
    tokenizer = TemplatePairTokenizer(str(tokenizer_json), params, template)
    refuse_tokenizer_failures(entry, llm.check_template_tokenizer(model, tokenizer))

    spec = llm.graph_spec()
    scorer = llm.scorer_module(model)
    onnx_path = work / "model.onnx"
    pairs = list(llm.LLM_VALIDATION_PAIRS)
    cases = [tokenizer.encode(tokenizer.prepare(b, {})) for b in validation_batches(pairs)]
    export_module(scorer, spec, cases[1], onnx_path)
    atol = SCORE_ATOL if entry.graph_precision == "fp32" else 1e-2
    validate_graph(onnx_path, spec, scorer, cases, atol=atol, min_cosine=0.0)
    if entry.graph_precision == "fp32":
        diff = llm.served_score_parity(model, tokenizer, onnx_path)
        if diff > llm.SERVED_SCORE_ATOL:
            raise RuntimeError(
                f"{entry.name}: fed the way the server pads (on the right) the graph differs "
                f"from CrossEncoder.predict by {diff:.2e} (max abs, allowed "
                f"{llm.SERVED_SCORE_ATOL:g}): this model's scores depend on padding the "
                "server does not reproduce, so it is not served"
            )
    apply_precision(onnx_path, entry.graph_precision, spec, scorer, cases)

    tokenize, encode = f"{entry.name}_tokenize", f"{entry.name}_encode"
    parameters = {"pair_template": template.to_parameter()}  # prompts: in tokenizer_parameters
    return [
        _tokenize_dir(entry, tokenize, tokenizer_json, params, parameters),
        encoder_dir(entry, encode, onnx_path, spec, ragged=True, limits=token_limits(model)),
        _ensemble_dir(entry, 1, list(llm.INPUT_NAMES)),
    ]
