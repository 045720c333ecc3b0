"""The adapters a Python step can run: each a ``model.py`` the build copies into its folder.

A model folder names its adapter with :class:`Adapter` (``generator.model_dir.ModelDir``),
so the link between a step and the code Triton runs for it is declared once, here, and a
name that no adapter has fails the build.
"""

from __future__ import annotations

from enum import StrEnum


class Adapter(StrEnum):
    """The ``model.py`` of a Python step: ``embed_runtime/models/<value>.py``.

    ``MODEL_MANAGER`` is the exception: it drives the build, so its source is
    ``generator/manager_model.py``.
    """

    TOKENIZE = "tokenize"
    TOKENIZE_PAIRS = "tokenize_pairs"
    ENCODE = "encode"
    ENCODE_MULTIVECTOR = "encode_multivector"
    ENCODE_SPARSE_ROUTER = "encode_sparse_router"
    FETCH_IMAGE = "fetch_image"
    PREPROCESS_IMAGE = "preprocess_image"
    ADMIT_IMAGE = "admit_image"
    CHUNKS = "chunks"
    MODEL_MANAGER = "model_manager"


def adapter(name: str | Adapter) -> Adapter:
    """The :class:`Adapter` called ``name``; an unknown name raises ``ValueError`` naming all."""
    try:
        return Adapter(name)
    except ValueError:
        known = ", ".join(a.value for a in Adapter)
        raise ValueError(f"unknown adapter {name!r}; the adapters are: {known}") from None
