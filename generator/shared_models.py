"""Models shared by the entries of a family (``Family.shared``: ``fetch_image``) or by all."""

from __future__ import annotations

import hashlib
import sys
from dataclasses import fields

from embed_runtime.fetch.params import FetchParams
from embed_runtime.steps import Adapter

from .families import family
from .families.open_clip import FETCH_IMAGE
from .manager_config import ManagerConfig
from .manifest import Manifest
from .model_dir import ModelDir
from .render import Batching, Instances, IOSpec, python_model

MODEL_MANAGER = "model_manager"
SHARED_MODELS = (FETCH_IMAGE, MODEL_MANAGER)


def fetch_image_parameters(manifest: Manifest) -> dict[str, str]:
    """Config parameters of ``fetch_image`` from the manifest's ``[fetch_image]``."""
    s = manifest.fetch_image
    return FetchParams(**{f.name: getattr(s, f.name) for f in fields(FetchParams)}).to_parameters()


def model_manager_dir(manifest: Manifest) -> ModelDir:
    """The ``model_manager`` model: runtime load/unload/delete/list (JSON in, JSON out)."""
    config = python_model(
        MODEL_MANAGER,
        0,
        [IOSpec("REQUEST", "TYPE_STRING", (1,))],
        [IOSpec("RESPONSE", "TYPE_STRING", (1,))],
        ManagerConfig(
            health_probe_interval_s=manifest.model_manager.health_probe_interval_s,
            manifest=str(manifest.path),
            worker_python=sys.executable,
        ).to_parameters(),
        Batching(False),
        Instances(1),
    )
    return ModelDir(MODEL_MANAGER, config, Adapter.MODEL_MANAGER, {})


def shared_model_dirs(manifest: Manifest, code_fp: str) -> list[tuple[ModelDir, str]]:
    """The shared model dirs ``manifest`` needs, each with its fingerprint.

    ``model_manager`` comes with every manifest read from a file (it needs the path);
    ``fetch_image`` with any entry whose family needs it (open-clip's URL ensemble).
    """
    out = []
    if manifest.path is not None:
        manager = model_manager_dir(manifest)
        out.append((manager, hashlib.sha256((manager.config + code_fp).encode()).hexdigest()))
    clip = [e for e in manifest.models if FETCH_IMAGE in family(e.family).shared]
    if not clip:
        return out
    params = fetch_image_parameters(manifest)
    config = python_model(
        FETCH_IMAGE,
        max(e.max_batch_size for e in clip),
        [IOSpec("IMAGE_URL", "TYPE_STRING", (1,))],
        [IOSpec("IMAGE", "TYPE_STRING", (1,))],
        params,
        Batching(True, 0),
        Instances(manifest.fetch_image.instances),
    )
    fingerprint = hashlib.sha256((config + code_fp).encode()).hexdigest()
    return [*out, (ModelDir(FETCH_IMAGE, config, Adapter.FETCH_IMAGE, {}), fingerprint)]


def startup_models(manifest: Manifest) -> tuple[str, ...]:
    """Models to load at start: every ensemble (steps follow), plus the manager."""
    names = tuple(name for entry in manifest.models for name in entry.ensembles)
    return (*names, MODEL_MANAGER) if manifest.path is not None else names
