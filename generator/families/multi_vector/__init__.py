"""Family ``multi-vector``: ColBERT-style token embeddings (declaration; build: ``export``).

An entry ``<name>`` builds ``<name>_encode`` (a Python model that tokenizes ``TEXT`` for
the request's ``task``, query or document, and runs the token-level ONNX graph: the
Transformer, its projection and normalisation) and the ensemble ``<name>``: ``TEXT`` ->
``EMBEDDINGS`` FP32 ``[N, T, D]`` (zero-padded) + ``TOKEN_COUNT`` INT32 ``[N, 1]``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...declared_kind import PYLATE, Served
from ..spec import Errors
from ..text_family import text_family

if TYPE_CHECKING:
    from ...manifest import ModelEntry


def _check_entry(where: str, entry: ModelEntry, errors: Errors) -> None:
    if entry.precision != "fp32":
        errors.append(f"{where}: multi-vector models are served in precision 'fp32' only")


FAMILY = text_family(
    "multi-vector",
    __name__,
    ("encode",),
    Served(
        types=("MultiVectorEncoder", PYLATE),
        modules=("Transformer", "Dense", "Normalize", "MultiVectorMask"),
        tasks=(None, "feature-extraction"),
        declared_only=True,
    ),
    check_entry=_check_entry,
    python_ort_because="the Python encoder tokenizes per task and keeps each row's scored token "
    "vectors",
)
