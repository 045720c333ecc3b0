"""Export steps the sentence-transformers text families share.

The families built on sentence-transformers (``sentence-transformers``, ``cross-encoder``,
``sparse-encoder``, ``multi-vector``) load their model the same way, after checking what
the folder declares; export it as a torch module taking the graph's token tensors; gate
the serving tokenizer against the library's; and validate the graph on the same batches.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from embed_runtime.text.tokenizer import BatchTokenizer, TokenizerParams

from ..declared_kind import DeclaredKind, check_source
from ..manifest import Manifest, ModelEntry, resolve_path
from .spec import Family

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


def checked_source(
    family: Family, entry: ModelEntry, manifest: Manifest
) -> tuple[str, DeclaredKind]:
    """``entry``'s source (:func:`resolve_source`) and its declared kind.

    ``family`` must serve that kind: checked before anything loads or converts the folder.
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    source = resolve_source(entry, manifest)
    return source, check_source(family.name, family.served, source, entry.name)


def load_on_cpu(model_class, source: str, **kwargs):
    """``model_class`` (a sentence-transformers model class) of ``source``, for export.

    On the CPU, in eval mode, with eager attention (the exported graph's).
    """
    model_kwargs = {"attn_implementation": "eager"}
    return model_class(source, device="cpu", model_kwargs=model_kwargs, **kwargs).eval()


def load_checked(family: Family, model_class, entry: ModelEntry, manifest: Manifest, **kwargs):
    """:func:`load_on_cpu` of ``entry``'s source, once :func:`checked_source` passed it."""
    source, _ = checked_source(family, entry, manifest)
    return load_on_cpu(model_class, source, **kwargs)


def pipeline_module(model, input_names: list[str], head: Callable):
    """A torch module: ``model`` on token tensors, then ``head`` on the dict it returns.

    The tensors come positionally, as the graph's inputs, in ``input_names`` order.
    """
    import torch  # noqa: PLC0415

    class Pipeline(torch.nn.Module):
        """The sentence-transformers pipeline, taking token tensors positionally."""

        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *tensors):
            return head(self.model(dict(zip(input_names, tensors, strict=True))))

    return Pipeline().eval()


def token_differences(library, runtime: BatchTokenizer, differs: str) -> list[str]:
    """``<differs> on <text>`` for each validation text that ``runtime`` tokenizes otherwise.

    ``library``'s ``preprocess`` gives the ids wanted.
    """
    failures = []
    for text in VALIDATION_TEXTS:
        want = library.preprocess([text])["input_ids"][0].tolist()
        got = runtime.encode([text])["input_ids"][0].tolist()
        if want != got:
            failures.append(f"{differs} on {text[:40]!r}")
    return failures


def refuse_tokenizer_failures(entry: ModelEntry, failures: list[str]) -> None:
    """Fail the build of ``entry`` on any tokenizer parity failure, listing them all."""
    if failures:
        raise RuntimeError(f"{entry.name}: tokenizer parity failed:\n  " + "\n  ".join(failures))


def token_features(model, texts: Sequence, input_names: list[str]) -> dict[str, np.ndarray]:
    """The graph inputs ``model.preprocess`` makes of ``texts`` (int64 arrays)."""
    enc = model.preprocess(list(texts))
    return {n: enc[n].numpy().astype(np.int64) for n in input_names}


def validation_batches(items: Sequence) -> tuple:
    """The batches a graph is validated on: the first item, the next four, all of them."""
    return items[:1], items[1:5], items


def transformer_tokenizer_params(
    model, input_names: list[str], max_length: int | None = None, **options
) -> TokenizerParams:
    """The serving tokenizer of ``model``'s Transformer, ``options`` set.

    Its length (``max_length`` if given, else the model's max_seq_length), token inputs,
    pad id and lower-casing; rows are not padded to the length.
    """
    return TokenizerParams(
        int(model.max_seq_length) if max_length is None else max_length,
        False,
        tuple(input_names),
        model.tokenizer.pad_token_id or 0,
        bool(getattr(model[0], "do_lower_case", False)),
        **options,
    )


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


# The module of a StaticEmbedding pipeline (a token table, no transformer).
STATIC_MODULE = "StaticEmbedding"


def is_static(model) -> bool:
    """Whether a loaded SentenceTransformer is a StaticEmbedding pipeline."""
    return type(model[0]).__name__ == STATIC_MODULE


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
    input would not survive the export. A StaticEmbedding reads ids and the mask only.
    """
    names = ["input_ids", "attention_mask"]
    if is_static(model):
        return names
    forward = inspect.signature(model[0].auto_model.forward).parameters
    if "token_type_ids" in model.tokenizer.model_input_names and "token_type_ids" in forward:
        names.append("token_type_ids")
    return names


def check_tokenizer(model, path: Path, params: TokenizerParams) -> list[str]:
    """Differences between the runtime tokenizer and the model's ``preprocess``."""
    runtime = BatchTokenizer(str(path), params)
    return token_differences(model, runtime, "tokenizer differs from sentence-transformers")


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


def write_checked_tokenizer(
    entry: ModelEntry, model, work: Path, prompts: dict[str, str], default_prompt: str, **params
) -> tuple[Path, list[str], TokenizerParams]:
    """``work/tokenizer.json`` of ``model``, its graph input names and params with ``prompts``.

    The build of ``entry`` fails when the file tokenizes a validation text or a prompt
    otherwise than ``model`` does (:func:`refuse_tokenizer_failures`).
    """
    tokenizer_json = work / "tokenizer.json"
    input_names = write_tokenizer(model, tokenizer_json)
    tok_params = transformer_tokenizer_params(
        model,
        input_names,
        prompts=tuple(sorted(prompts.items())),
        default_prompt_name=default_prompt,
        **params,
    )
    failures = check_tokenizer(model, tokenizer_json, tok_params)
    refuse_tokenizer_failures(entry, failures + check_prompts(model, tokenizer_json, tok_params))
    return tokenizer_json, input_names, tok_params
