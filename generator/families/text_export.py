"""Export steps the sentence-transformers text families share.

The families built on sentence-transformers (``sentence-transformers``, ``cross-encoder``,
``sparse-encoder``, ``multi-vector``) load their model the same way, after checking what
the folder declares; export it as a torch module taking the graph's token tensors; gate
the serving tokenizer against the library's; and validate the graph on the same batches.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence

import numpy as np

from embed_runtime.tokenizer import BatchTokenizer, TokenizerParams

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
