"""Family ``sentence-transformers``: tokenizer + ONNX encoder with pooling in the graph.

The exported graph is the model's own module pipeline (``modules.json``): the
Transformer, its Pooling (mean / CLS / max / last-token / weighted mean, as set in
``1_Pooling/config.json``), any Dense layers and Normalize, plus a final L2
normalisation when the manifest asks for normalised embeddings.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import numpy as np

from ..build_types import ModelDir
from ..manifest import Manifest, ModelEntry, resolve_path
from ..onnx_export import GraphSpec, TensorSpec, export_module, validate_graph
from ..render import Batching, Instances, IOSpec, Step, ensemble, onnxruntime_model, python_model
from ..runtime.text import BatchTokenizer, TokenizerParams

VALIDATION_TEXTS = (
    "A man is eating food.",
    "Triton batches requests from many clients into one execution.",
    "¿Dónde está la biblioteca? Está cerca del río.",
    "東京は日本の首都です。",
    "emoji 🙂🚀 and punctuation!!! ... ???",
    "x",
    "The quick brown fox jumps over the lazy dog. " * 40,
    "   leading and trailing spaces   ",
    "Numbers 3.14159, 2,718 and 1e-10 in one line.",
    "URLs like https://example.com/a?b=c and e-mail x@y.z",
)
POOLING_MODES = (
    "pooling_mode_cls_token",
    "pooling_mode_mean_tokens",
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
    "pooling_mode_lasttoken",
)


def resolve_source(entry: ModelEntry, manifest: Manifest) -> str:
    """A local folder or Hugging Face id for ``entry.source``.

    ``package:<module>`` names an installed package that bundles a model and exposes
    ``get_model_path()``; a path that exists is used as a local folder; anything else
    is a Hugging Face hub id.
    """
    source = entry.source or ""
    if source.startswith("package:"):
        module = importlib.import_module(source.removeprefix("package:"))
        return str(module.get_model_path())
    local = resolve_path(manifest, source)
    if local.exists() or source.startswith((".", "/", "~")):
        if not (local / "modules.json").is_file() and not (local / "config.json").is_file():
            raise FileNotFoundError(f"{entry.name}: {local} is not a sentence-transformers folder")
        return str(local)
    return source


def pooling_modes(model_dir: str) -> list[str]:
    """Pooling modes switched on in the model's ``1_Pooling/config.json`` (if local)."""
    modules = Path(model_dir) / "modules.json"
    if not modules.is_file():
        return []
    for module in json.loads(modules.read_text()):
        if module["type"].endswith("Pooling"):
            cfg = json.loads((Path(model_dir) / module["path"] / "config.json").read_text())
            return [m.removeprefix("pooling_mode_") for m in POOLING_MODES if cfg.get(m)]
    return []


def _load(entry: ModelEntry, manifest: Manifest):
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from sentence_transformers import SentenceTransformer  # noqa: PLC0415

    source = resolve_source(entry, manifest)
    model = SentenceTransformer(
        source, device="cpu", model_kwargs={"attn_implementation": "eager"}
    ).eval()
    if entry.max_seq_length:
        model.max_seq_length = entry.max_seq_length
    return model, source


def _encoder_module(model, input_names: list[str], normalize: bool):
    import torch  # noqa: PLC0415

    class Encoder(torch.nn.Module):
        """The sentence-transformers pipeline, taking token tensors positionally."""

        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *tensors):
            features = dict(zip(input_names, tensors, strict=True))
            out = self.model(features)["sentence_embedding"]
            return torch.nn.functional.normalize(out, p=2, dim=1) if normalize else out

    return Encoder().eval()


def _graph_spec(input_names: list[str], dim: int) -> GraphSpec:
    return GraphSpec(
        inputs=tuple(TensorSpec(n, "int64", (-1,)) for n in input_names),
        outputs=(TensorSpec("EMBEDDING", "float32", (dim,)),),
    )


def _write_tokenizer(model, path: Path) -> list[str]:
    from tokenizers import Tokenizer  # noqa: PLC0415

    tok = Tokenizer.from_str(model.tokenizer.backend_tokenizer.to_str())
    tok.no_padding()
    tok.no_truncation()
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in model.tokenizer.model_input_names:
        names.append("token_type_ids")
    return names


def _check_tokenizer(model, path: Path, params: TokenizerParams) -> list[str]:
    runtime = BatchTokenizer(str(path), params)
    failures = []
    for text in VALIDATION_TEXTS:
        want = model.tokenize([text])["input_ids"][0].tolist()
        got = runtime.encode([text])["input_ids"][0].tolist()
        if want != got:
            failures.append(f"tokenizer differs from sentence-transformers on {text[:40]!r}")
    return failures


def build(entry: ModelEntry, manifest: Manifest, work: Path) -> list[ModelDir]:
    """Export, validate and describe the three model dirs of one text model."""
    model, _ = _load(entry, manifest)
    max_len = int(model.max_seq_length)
    tokenizer_json = work / "tokenizer.json"
    input_names = _write_tokenizer(model, tokenizer_json)
    pad_id = model.tokenizer.pad_token_id or 0
    lowercase = bool(getattr(model[0], "do_lower_case", False))
    tok_params = TokenizerParams(max_len, False, tuple(input_names), pad_id, lowercase)
    failures = _check_tokenizer(model, tokenizer_json, tok_params)
    if failures:
        raise RuntimeError(f"{entry.name}: tokenizer parity failed:\n  " + "\n  ".join(failures))

    dim = int(model.get_sentence_embedding_dimension())
    spec = _graph_spec(input_names, dim)
    encoder = _encoder_module(model, input_names, entry.normalize)
    onnx_path = work / "model.onnx"
    sample = model.tokenize(list(VALIDATION_TEXTS[:3]))
    export_module(encoder, spec, {n: sample[n] for n in input_names}, onnx_path)
    cases = []
    for batch in (VALIDATION_TEXTS[:1], VALIDATION_TEXTS[1:5], VALIDATION_TEXTS):
        enc = model.tokenize(list(batch))
        cases.append({n: enc[n].numpy().astype(np.int64) for n in input_names})
    validate_graph(onnx_path, spec, encoder, cases)

    return [
        _tokenize_dir(entry, tokenizer_json, tok_params, input_names),
        _encode_dir(entry, onnx_path, spec),
        _ensemble_dir(entry, input_names, dim),
    ]


def _tokenize_dir(
    entry: ModelEntry, tokenizer_json: Path, params: TokenizerParams, input_names: list[str]
) -> ModelDir:
    name = f"{entry.name}_tokenize"
    config = python_model(
        name,
        entry.max_batch_size,
        [IOSpec("TEXT", "TYPE_STRING", (1,))],
        [IOSpec(n, "TYPE_INT64", (-1,)) for n in input_names],
        {
            "max_length": str(params.max_length),
            "pad_to_max_length": "false",
            "pad_id": str(params.pad_id),
            "output_names": ",".join(input_names),
            "tokenizer_file": "tokenizer.json",
            "lowercase": str(params.lowercase).lower(),
        },
        Batching(True, entry.max_queue_delay_us // 2),
        Instances(entry.preprocess_instances),
    )
    return ModelDir(name, config, "tokenize", {"tokenizer.json": tokenizer_json})


def _encoder_parameters(entry: ModelEntry, spec: GraphSpec, ragged: bool) -> dict[str, str]:
    return {
        "onnx_file": "model.onnx",
        "input_names": ",".join(spec.input_names),
        "output_name": spec.output_names[0],
        "ragged": str(ragged).lower(),
        "max_rows_per_run": str(entry.max_rows_per_run),
        "intra_op_threads": str(entry.ort_threads),
        "graph_optimization": entry.graph_optimization,
        "execution_provider": "cuda" if entry.device == "gpu" else "cpu",
    }


def _encode_dir(entry: ModelEntry, onnx_path: Path, spec: GraphSpec) -> ModelDir:
    name = f"{entry.name}_encode"
    kind = "KIND_GPU" if entry.device == "gpu" else "KIND_CPU"
    instances = Instances(entry.encoder_instances, kind)
    batching = Batching(True, entry.max_queue_delay_us)
    outputs = [IOSpec.from_tensor(t) for t in spec.outputs]
    if entry.encoder_backend == "onnxruntime":
        inputs = [IOSpec.from_tensor(t) for t in spec.inputs]
        config = onnxruntime_model(name, entry.max_batch_size, inputs, outputs, batching, instances)
        return ModelDir(name, config, None, {"model.onnx": onnx_path})
    inputs = [IOSpec.from_tensor(t, ragged=True) for t in spec.inputs]
    config = python_model(
        name,
        entry.max_batch_size,
        inputs,
        outputs,
        _encoder_parameters(entry, spec, ragged=True),
        batching,
        instances,
    )
    return ModelDir(name, config, "encode", {"model.onnx": onnx_path})


def _ensemble_dir(entry: ModelEntry, input_names: list[str], dim: int) -> ModelDir:
    config = ensemble(
        entry.name,
        entry.max_batch_size,
        [IOSpec("TEXT", "TYPE_STRING", (1,))],
        [IOSpec("EMBEDDING", "TYPE_FP32", (dim,))],
        [
            Step(
                f"{entry.name}_tokenize",
                (("TEXT", "TEXT"),),
                tuple((n, n) for n in input_names),
            ),
            Step(
                f"{entry.name}_encode",
                tuple((n, n) for n in input_names),
                (("EMBEDDING", "EMBEDDING"),),
            ),
        ],
    )
    return ModelDir(entry.name, config, None, {})
