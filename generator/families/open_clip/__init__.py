"""Family ``open-clip``: CLIP text and image towers (declaration; build: ``export``).

An entry ``<name>`` builds ``<name>_tokenize``, ``<name>_encode_text``,
``<name>_admit_image`` and ``<name>_admit_url`` (where it admits requests),
``<name>_preprocess_image`` and
``<name>_encode_image``, and the ensembles
``<name>_text``, ``<name>_image`` and ``<name>_image_url`` (the last one through the
shared ``fetch_image``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ..spec import Errors, Family, admits
from . import preprocess_cfg

if TYPE_CHECKING:
    from ...manifest import ModelEntry

FETCH_IMAGE = "fetch_image"  # the shared model (shared_models.py) of the URL ensemble


def _steps(entry: ModelEntry) -> tuple[str, ...]:
    # where the entry admits requests: the steps in front of the decode and of the fetch
    admit = ("admit_image", "admit_url") if admits(entry) else ()
    return ("tokenize", "encode_text", *admit, "preprocess_image", "encode_image")


def _check_entry(where: str, entry: ModelEntry, errors: Errors) -> None:
    if entry.pretrained and entry.checkpoint:
        errors.append(f"{where}: give either 'pretrained' or 'checkpoint', not both")
    preprocess_cfg.check_entry(where, entry, errors)
    if entry.image_decode == "gpu":
        if entry.device != "gpu":
            errors.append(f"{where}: image_decode 'gpu' needs device 'gpu'")
        if entry.image_draft_decode:
            errors.append(f"{where}: image_decode 'gpu' and image_draft_decode exclude each other")


def _default_name(request: dict[str, Any]) -> str:
    base = "-".join(p for p in (request.get("arch"), request.get("pretrained")) if p)
    return re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip("-.") or "model"


FAMILY = Family(
    name="open-clip",
    package=__name__,
    steps=_steps,
    ensembles=("_text", "_image", "_image_url"),
    required=("arch",),
    check_entry=_check_entry,
    check_folder=None,
    default_name=_default_name,
    own_options=("image_decode", *preprocess_cfg.MANIFEST_KEYS),
    shared=(FETCH_IMAGE,),
)
