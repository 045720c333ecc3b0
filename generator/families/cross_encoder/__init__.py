"""Family ``cross-encoder``: rerankers (declaration; build: ``export``).

An entry ``<name>`` builds ``<name>_tokenize`` (query and text tokenized as pairs),
``<name>_encode`` and the ensemble ``<name>`` (``QUERY`` + ``TEXT`` -> ``SCORE``).
"""

from __future__ import annotations

import json
from pathlib import Path

from embed_runtime.errors import InvalidInputError

from ...declared_kind import Served
from ..text_family import check_sentence_transformers_folder, text_family

# (query, text) pairs every reranker kind is checked on at build time: scripts, emoji, a
# one-character pair and long sides on both ends of the window.
SHARED_PAIRS = (
    ("what is the capital of France?", "Paris is the capital and largest city of France."),
    ("¿Dónde está la biblioteca?", "Está cerca del río."),
    ("東京", "東京は日本の首都です。"),
    ("x", "y"),
    ("emoji 🙂🚀", "punctuation!!! ... ???"),
    ("a long query " * 30, "short text"),
    ("short query", "The quick brown fox jumps over the lazy dog. " * 40),
    ("both long " * 60, "and longer still " * 60),
)


def check_cross_encoder_folder(folder: Path) -> None:
    """Refuse a reranker folder with custom code, as sentence-transformers folders are.

    Besides :func:`check_sentence_transformers_folder`, the activation named in
    ``config_sentence_transformers.json`` must be one of torch's (anything else is code
    of the model's own, which ``CrossEncoder`` would only run with ``trust_remote_code``).
    """
    check_sentence_transformers_folder(folder)
    path = folder / "config_sentence_transformers.json"
    try:
        config = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise InvalidInputError(
            "source has an unreadable config_sentence_transformers.json"
        ) from None
    activation = config.get("activation_fn") if isinstance(config, dict) else None
    if activation is not None and not (
        isinstance(activation, str) and activation.startswith("torch.")
    ):
        raise InvalidInputError(
            f"config_sentence_transformers.json names the activation {activation!r}, not a "
            "torch class: models with custom code are not loaded at runtime (add them to the "
            "manifest instead)"
        )


FAMILY = text_family(
    "cross-encoder",
    __name__,
    ("tokenize", "encode"),
    Served(
        types=("CrossEncoder",),
        modules=("Transformer", "LogitScore"),
        tasks=(None, "sequence-classification", "text-classification", "text-generation"),
        module_tasks=(("LogitScore", ("Transformer", "LogitScore"), ("text-generation",)),),
    ),
    check_folder=check_cross_encoder_folder,
)
