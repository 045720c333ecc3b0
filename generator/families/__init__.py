"""Model families: each module exports ``build(entry, manifest, work) -> list[ModelDir]``."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

REGISTRY = {
    "sentence-transformers": "generator.families.sentence_transformers",
    "open-clip": "generator.families.open_clip",
    "cross-encoder": "generator.families.cross_encoder",
}


def family_module_path(family: str) -> Path:
    """Source file of a family module (part of the build fingerprint)."""
    return Path(__file__).parent / (REGISTRY[family].rsplit(".", 1)[1] + ".py")


def family_builder(family: str) -> Callable:
    """The ``build`` function of ``family`` (imported lazily: it pulls in torch)."""
    return importlib.import_module(REGISTRY[family]).build
