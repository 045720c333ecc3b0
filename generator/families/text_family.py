"""The declaration every sentence-transformers text family builds its ``FAMILY`` from.

``sentence-transformers``, ``cross-encoder``, ``sparse-encoder`` and ``multi-vector`` serve
one ensemble per entry from the weights its ``source`` names; a runtime load is named
after that source, and its folder must not run code of its own. None of them owns this.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from embed_runtime.errors import InvalidInputError

from .spec import Errors, Family

if TYPE_CHECKING:
    from ..declared_kind import Served
    from ..manifest import ModelEntry


def needs_python_ort(
    where: str, entry: ModelEntry, errors: Errors, what: str, why: str = ""
) -> None:
    """Refuse ``what`` (an option or a family) for Triton's native onnxruntime backend."""
    if entry.encoder_backend != "python-ort":
        because = f" ({why})" if why else ""
        errors.append(f"{where}: {what} needs encoder_backend 'python-ort'{because}")


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


def _no_checks(where: str, entry: ModelEntry, errors: Errors) -> None:
    """Nothing beyond the generic checks (``source`` is required)."""


def text_family(
    name: str,
    package: str,
    steps: tuple[str, ...] | Callable[[ModelEntry], tuple[str, ...]],
    served: Served,
    check_entry: Callable[[str, ModelEntry, Errors], None] = _no_checks,
    check_folder: Callable[[Path], None] = check_sentence_transformers_folder,
    python_ort_because: str | None = None,
    own_options: tuple[str, ...] = (),
    ensembles: tuple[str, ...] = ("",),
) -> Family:
    """The declaration of a family of sentence-transformers text models.

    An entry serves one ensemble, ``<name>``, of the weights its ``source`` names; a
    runtime load is named after that source, and its folder passes ``check_folder``.
    ``steps``: the step suffixes of every entry, or a function giving an entry's.
    ``python_ort_because``: why the family's entries need encoder_backend 'python-ort'
    (checked before ``check_entry``); None where they do not. ``ensembles``: the suffixes
    of the models a user calls (``_chunks`` where the family cuts long texts).
    """

    def checks(where: str, entry: ModelEntry, errors: Errors) -> None:
        if python_ort_because is not None:
            needs_python_ort(where, entry, errors, name, python_ort_because)
        check_entry(where, entry, errors)

    return Family(
        name=name,
        package=package,
        steps=steps if callable(steps) else lambda entry: steps,
        ensembles=ensembles,
        required=("source",),
        check_entry=checks,
        check_folder=check_folder,
        default_name=name_from_source,
        served=served,
        own_options=own_options,
    )
