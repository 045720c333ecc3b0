"""Models shared by every entry of a family (today: ``fetch_image`` for open-clip)."""

from __future__ import annotations

import hashlib

from .build_types import ModelDir
from .manifest import Manifest
from .render import Batching, Instances, IOSpec, python_model

FETCH_IMAGE = "fetch_image"


def fetch_image_parameters(manifest: Manifest) -> dict[str, str]:
    """Config parameters of ``fetch_image`` from the manifest's ``[fetch_image]``."""
    s = manifest.fetch_image
    return {
        "allow_hosts": ",".join(s.allow_hosts),
        "connect_timeout_s": str(s.connect_timeout_s),
        "read_timeout_s": str(s.read_timeout_s),
        "max_bytes": str(s.max_bytes),
        "max_redirects": str(s.max_redirects),
        "max_concurrency": str(s.max_concurrency),
    }


def shared_model_dirs(manifest: Manifest, code_fp: str) -> list[tuple[ModelDir, str]]:
    """The shared model dirs ``manifest`` needs, each with its fingerprint."""
    clip = [e for e in manifest.models if e.family == "open-clip"]
    if not clip:
        return []
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
    return [(ModelDir(FETCH_IMAGE, config, FETCH_IMAGE, {}), fingerprint)]
