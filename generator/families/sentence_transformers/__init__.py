"""Family ``sentence-transformers``: dense text embeddings (declaration; build: ``export``).

An entry ``<name>`` builds ``<name>_tokenize`` and ``<name>_encode`` (or, with
``fused_tokenize``, one ``<name>_encode`` that takes ``TEXT``) and the ensemble ``<name>``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from embed_runtime.engines.output_precision import EXTRA_PRECISIONS

from ...declared_kind import Served
from ..spec import Errors
from ..text_family import needs_python_ort, text_family

if TYPE_CHECKING:
    from ...manifest import ModelEntry

PROMPT_OPTIONS = ("prompts", "default_prompt_name", "truncate_dim")


def _steps(entry: ModelEntry) -> tuple[str, ...]:
    return ("encode",) if entry.fused_tokenize else ("tokenize", "encode")


def _check_entry(where: str, entry: ModelEntry, errors: Errors) -> None:
    if entry.prompts is not None and not all(
        isinstance(v, str) and len(k) <= 64 and len(v) <= 1024 for k, v in entry.prompts.items()
    ):
        errors.append(f"{where}: prompts must map names (<= 64 chars) to strings (<= 1024)")
    if entry.truncate_dim is not None:
        if entry.truncate_dim < 1:
            errors.append(f"{where}: truncate_dim must be >= 1")
        needs_python_ort(where, entry, errors, "truncate_dim")
    if entry.fused_tokenize:
        needs_python_ort(
            where,
            entry,
            errors,
            "fused_tokenize",
            "the tokenizer runs inside the Python encoder; Triton's native onnxruntime backend "
            "takes only token tensors",
        )
    unknown = [p for p in entry.output_precisions if p not in EXTRA_PRECISIONS]
    if unknown or len(set(entry.output_precisions)) != len(entry.output_precisions):
        errors.append(
            f"{where}: output_precisions must name distinct forms of {list(EXTRA_PRECISIONS)}, "
            f"got {list(entry.output_precisions)}"
        )
    if entry.output_precisions:
        needs_python_ort(
            where, entry, errors, "output_precisions", "the Python encoder computes the forms"
        )
    if entry.token_count:
        needs_python_ort(
            where, entry, errors, "token_count", "the Python encoder counts each row's tokens"
        )


FAMILY = text_family(
    "sentence-transformers",
    __name__,
    _steps,
    Served(
        types=("SentenceTransformer",),
        modules=("Transformer", "Pooling", "Dense", "Normalize"),
        tasks=(None, "feature-extraction"),
        pipelines=(("StaticEmbedding",), ("StaticEmbedding", "Normalize")),
    ),
    check_entry=_check_entry,
    own_options=(*PROMPT_OPTIONS, "fused_tokenize", "output_precisions", "token_count", "litellm",
                 "late_chunking"),
    ensembles=("", "_chunks"),  # <name>_chunks: long texts cut into chunks
)
