"""Family ``sentence-transformers``: tokenizer + ONNX encoder with pooling in the graph.

The exported graph is the model's own module pipeline (``modules.json``): the
Transformer, its Pooling (mean / CLS / max / last-token / weighted mean, as set in
``1_Pooling/config.json``), any Dense layers and Normalize, plus a final L2
normalisation when the manifest asks for normalised embeddings.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
from pathlib import Path

import numpy as np

from embed_runtime.tokenizer import BatchTokenizer, TokenizerParams

from ...declared_kind import check_source
from ...manifest import Manifest, ModelEntry, resolve_path
from ...model_dir import ModelDir
from ...onnx_export import GraphSpec, TensorSpec, export_module, validate_graph
from ...precision import apply_precision
from ...render import IOSpec
from ..common import chain_dir, encoder_dir, fused_encoder_dir, tokenize_dir
from . import FAMILY

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


def _load(entry: ModelEntry, manifest: Manifest):
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from sentence_transformers import SentenceTransformer  # noqa: PLC0415

    source = resolve_source(entry, manifest)
    check_source(FAMILY.name, FAMILY.served, source, entry.name)  # before anything converts it
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


def write_tokenizer(model, path: Path) -> list[str]:
    """Save the model's fast tokenizer (no padding, no truncation); its graph input names."""
    from tokenizers import Tokenizer  # noqa: PLC0415

    tok = Tokenizer.from_str(model.tokenizer.backend_tokenizer.to_str())
    tok.no_padding()
    tok.no_truncation()
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return graph_input_names(model)


def graph_input_names(model) -> list[str]:
    """The token tensors of the exported graph: emitted by the tokenizer *and* read by the model.

    A decoder's tokenizer may emit ``token_type_ids`` that its model never reads; such an
    input would not survive the export.
    """
    names = ["input_ids", "attention_mask"]
    forward = inspect.signature(model[0].auto_model.forward).parameters
    if "token_type_ids" in model.tokenizer.model_input_names and "token_type_ids" in forward:
        names.append("token_type_ids")
    return names


def check_tokenizer(model, path: Path, params: TokenizerParams) -> list[str]:
    """Differences between the runtime tokenizer and the model's ``preprocess``."""
    runtime = BatchTokenizer(str(path), params)
    failures = []
    for text in VALIDATION_TEXTS:
        want = model.preprocess([text])["input_ids"][0].tolist()
        got = runtime.encode([text])["input_ids"][0].tolist()
        if want != got:
            failures.append(f"tokenizer differs from sentence-transformers on {text[:40]!r}")
    return failures


def model_prompts(entry: ModelEntry, model) -> tuple[dict[str, str], str]:
    """The model's prompts and default prompt name, the manifest's on top.

    Refuses a Pooling with ``include_prompt=False`` (prompt tokens left out of pooling):
    the exported graph pools every attended token, so such a model would drift.
    """
    prompts = {k: v for k, v in (model.prompts or {}).items() if v is not None}
    prompts.update(entry.prompts or {})
    default = entry.default_prompt_name or model.default_prompt_name or ""
    if default and default not in prompts:
        raise ValueError(
            f"{entry.name}: default_prompt_name {default!r} is not in {sorted(prompts)}"
        )
    for module in model:
        if getattr(module, "include_prompt", True) is False and any(prompts.values()):
            raise ValueError(
                f"{entry.name}: Pooling include_prompt=False (prompt tokens left out of pooling) "
                "is not supported"
            )
    return prompts, default


def check_prompts(model, path: Path, params: TokenizerParams) -> list[str]:
    """Differences between prompt + text at runtime and ``preprocess(prompt=...)``."""
    runtime = BatchTokenizer(str(path), params)
    failures = []
    for name, prompt in params.prompts:
        for text in VALIDATION_TEXTS[:4] + VALIDATION_TEXTS[6:7]:
            want = model.preprocess([text], prompt=prompt)["input_ids"][0].tolist()
            got = runtime.encode([prompt + text])["input_ids"][0].tolist()
            if want != got:
                failures.append(f"prompt {name!r} tokenizes differently on {text[:40]!r}")
    return failures


def token_limits(model) -> dict[str, int]:
    """Bounds of valid token inputs: the embedding tables' sizes and the max width."""
    transformer = model[0].auto_model
    config = transformer.config
    limits = {
        "vocab_size": int(transformer.get_input_embeddings().num_embeddings),
        "max_width": int(model.max_seq_length),
    }
    if getattr(config, "type_vocab_size", None):
        limits["type_vocab_size"] = int(config.type_vocab_size)
    return limits


def build(entry: ModelEntry, manifest: Manifest, work: Path) -> list[ModelDir]:
    """Export, validate and describe the model dirs of one text model.

    Three (tokenize, encode, the ensemble), or two with ``fused_tokenize`` (an encoder
    that takes ``TEXT`` itself, and the ensemble calling it).
    """
    model, _ = _load(entry, manifest)
    max_len = int(model.max_seq_length)
    tokenizer_json = work / "tokenizer.json"
    input_names = write_tokenizer(model, tokenizer_json)
    pad_id = model.tokenizer.pad_token_id or 0
    lowercase = bool(getattr(model[0], "do_lower_case", False))
    prompts, default_prompt = model_prompts(entry, model)
    # The model's own truncate_dim (config_sentence_transformers.json) is its default
    # width, as in sentence-transformers; the graph itself returns every dimension.
    own_truncate_dim, model.truncate_dim = model.truncate_dim, None
    dim = int(model.get_embedding_dimension())
    entry = dataclasses.replace(entry, truncate_dim=entry.truncate_dim or own_truncate_dim)
    truncatable = dim if entry.encoder_backend == "python-ort" else 0
    if entry.truncate_dim and not 1 <= entry.truncate_dim <= truncatable:
        raise ValueError(
            f"{entry.name}: truncate_dim {entry.truncate_dim} needs encoder_backend "
            f"'python-ort' and at most {dim}"
        )
    tok_params = TokenizerParams(
        max_len,
        False,
        tuple(input_names),
        pad_id,
        lowercase,
        prompts=tuple(sorted(prompts.items())),
        default_prompt_name=default_prompt,
        max_dimensions=truncatable,
    )
    failures = check_tokenizer(model, tokenizer_json, tok_params)
    failures += check_prompts(model, tokenizer_json, tok_params)
    if failures:
        raise RuntimeError(f"{entry.name}: tokenizer parity failed:\n  " + "\n  ".join(failures))

    spec = _graph_spec(input_names, dim)
    encoder = _encoder_module(model, input_names, entry.normalize)
    onnx_path = work / "model.onnx"
    sample = model.preprocess(list(VALIDATION_TEXTS[:3]))
    export_module(encoder, spec, {n: sample[n] for n in input_names}, onnx_path)
    cases = []
    for batch in (VALIDATION_TEXTS[:1], VALIDATION_TEXTS[1:5], VALIDATION_TEXTS):
        enc = model.preprocess(list(batch))
        cases.append({n: enc[n].numpy().astype(np.int64) for n in input_names})
    validate_graph(onnx_path, spec, encoder, cases)
    apply_precision(onnx_path, entry.graph_precision, spec, encoder, cases)

    tokenize, encode = f"{entry.name}_tokenize", f"{entry.name}_encode"
    text = IOSpec("TEXT", "TYPE_STRING", (1,))
    out_dim = -1 if truncatable else dim
    if entry.fused_tokenize:
        return [
            fused_encoder_dir(
                entry, encode, onnx_path, spec, tokenizer_json, tok_params, token_limits(model)
            ),
            chain_dir(entry, entry.name, text, out_dim, [(encode, ["TEXT"], ["EMBEDDING"])]),
        ]
    return [
        tokenize_dir(entry, tokenize, tokenizer_json, tok_params, -1),
        encoder_dir(
            entry,
            encode,
            onnx_path,
            spec,
            ragged=True,
            limits=token_limits(model),
            max_dimensions=truncatable,
        ),
        chain_dir(
            entry,
            entry.name,
            text,
            out_dim,
            [(tokenize, ["TEXT"], input_names), (encode, input_names, ["EMBEDDING"])],
        ),
    ]
