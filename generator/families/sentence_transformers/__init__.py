"""Family ``sentence-transformers``: dense text embeddings (declaration; build: ``export``).

An entry ``<name>`` builds ``<name>_tokenize`` and ``<name>_encode`` (or, with
``fused_tokenize``, one ``<name>_encode`` that takes ``TEXT``) and the ensemble ``<name>``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from embed_runtime.errors import InvalidInputError
from embed_runtime.output_precision import EXTRA_PRECISIONS

from ...declared_kind import Served
from ..spec import Errors, Family

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
        if entry.encoder_backend != "python-ort":
            errors.append(f"{where}: truncate_dim needs encoder_backend 'python-ort'")
    if entry.fused_tokenize and entry.encoder_backend != "python-ort":
        errors.append(
            f"{where}: fused_tokenize needs encoder_backend 'python-ort' (the tokenizer runs "
            "inside the Python encoder; Triton's native onnxruntime backend takes only "
            "token tensors)"
        )
    unknown = [p for p in entry.output_precisions if p not in EXTRA_PRECISIONS]
    if unknown or len(set(entry.output_precisions)) != len(entry.output_precisions):
        errors.append(
            f"{where}: output_precisions must name distinct forms of {list(EXTRA_PRECISIONS)}, "
            f"got {list(entry.output_precisions)}"
        )
    if entry.output_precisions and entry.encoder_backend != "python-ort":
        errors.append(
            f"{where}: output_precisions needs encoder_backend 'python-ort' (the Python "
            "encoder computes the forms)"
        )


def check_sentence_transformers_folder(folder: Path) -> None:
    """Refuse a folder that would run code of its own when sentence-transformers loads it.

    Every module of ``modules.json`` must be one of sentence-transformers' classes, and
    ``config.json`` must not map to custom model code (``auto_map``).
    """
    modules_path = folder / "modules.json"
    if not modules_path.is_file() and not (folder / "config.json").is_file():
        raise InvalidInputError("source is not a sentence-transformers folder")
    try:
        modules = json.loads(modules_path.read_text()) if modules_path.is_file() else []
        config_path = folder / "config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise InvalidInputError("source has an unreadable modules.json or config.json") from None
    if not isinstance(modules, list) or not isinstance(config, dict):
        raise InvalidInputError("source has a malformed modules.json or config.json")
    for module in modules:
        kind = module.get("type") if isinstance(module, dict) else None
        if not isinstance(kind, str) or not kind.startswith("sentence_transformers."):
            raise InvalidInputError(
                f"modules.json names {kind!r}, not a sentence_transformers class: models with "
                "custom code are not loaded at runtime (add them to the manifest instead)"
            )
    if "auto_map" in config:
        raise InvalidInputError(
            "config.json maps to custom model code (auto_map): models with custom code are "
            "not loaded at runtime (add them to the manifest instead)"
        )


def name_from_source(request: dict[str, Any]) -> str:
    """A runtime load's default name: the last part of its source."""
    base = str(request.get("source", "")).rstrip("/").split("/")[-1]
    return re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip("-.") or "model"


FAMILY = Family(
    name="sentence-transformers",
    package=__name__,
    steps=_steps,
    ensembles=("",),
    required=("source",),
    check_entry=_check_entry,
    check_folder=check_sentence_transformers_folder,
    default_name=name_from_source,
    served=Served(
        types=("SentenceTransformer",),
        modules=("Transformer", "Pooling", "Dense", "Normalize"),
        tasks=(None, "feature-extraction"),
        pipelines=(("StaticEmbedding",), ("StaticEmbedding", "Normalize")),
    ),
    own_options=(*PROMPT_OPTIONS, "fused_tokenize", "output_precisions"),
)
