"""``perf_analyzer --input-data`` JSON files for every kind of ensemble.

perf_analyzer takes a JSON object with one ``data`` list; each entry gives every input
of one batch-1 request. For a BYTES input the entry is ``{"content": [...], "shape":
[1]}`` with the strings themselves, or ``{"content": {"b64": ...}, "shape": [1]}``
where the base64 text encodes Triton's serialised BYTES tensor: each element as a
4-byte little-endian length followed by its bytes. With ``-b N`` perf_analyzer fills a
request from N consecutive entries.

Files written by :func:`write_perf_data` (``python -m client perf-data``):

- text models: ``text.json`` (``TEXT``: the benchmark's sentences)
- CLIP models: ``text.json``, ``image.json`` (``IMAGE``: the generated photos, base64),
  ``image_url.json`` (``IMAGE_URL``: ``<image-base-url>/<file>``) and ``images/``,
  the same photos as files, to serve for the URL ensemble, e.g.
  ``python -m http.server 8080 --bind 127.0.0.1 --directory <out>/images``.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..bench_cli import DEFAULT_IMAGE_BASE_URL, KINDS
from .workload import generated_images, text_pool


def serialize_bytes_tensor(items: Sequence[bytes]) -> bytes:
    """Triton's wire layout of a BYTES tensor: ``<uint32 LE length><bytes>`` per element."""
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def text_entries(texts: Sequence[str], input_name: str = "TEXT") -> list[dict[str, Any]]:
    """One ``data`` entry per text: ``{"TEXT": {"content": [text], "shape": [1]}}``."""
    return [{input_name: {"content": [text], "shape": [1]}} for text in texts]


def image_entries(images: Sequence[bytes], input_name: str = "IMAGE") -> list[dict[str, Any]]:
    """One entry per encoded image, as base64 of the serialised one-element BYTES tensor."""
    return [
        {
            input_name: {
                "content": {"b64": base64.b64encode(serialize_bytes_tensor([image])).decode()},
                "shape": [1],
            }
        }
        for image in images
    ]


def url_entries(urls: Sequence[str], input_name: str = "IMAGE_URL") -> list[dict[str, Any]]:
    """One entry per URL: ``{"IMAGE_URL": {"content": [url], "shape": [1]}}``."""
    return text_entries(urls, input_name)


def _write(path: Path, entries: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"data": entries}, ensure_ascii=False, indent=1) + "\n")
    return path


def write_perf_data(
    out: Path,
    model_kind: str,
    image_base_url: str = DEFAULT_IMAGE_BASE_URL,
    texts: int = 256,
    images: int = 12,
) -> list[Path]:
    """Write the input-data files for a ``text`` or ``clip`` model into ``out``.

    Returns the paths written (JSON files, then image files).
    """
    if model_kind not in KINDS:
        raise ValueError(f"model_kind must be one of {KINDS}, got {model_kind!r}")
    out.mkdir(parents=True, exist_ok=True)
    written = [_write(out / "text.json", text_entries(text_pool(texts)))]
    if model_kind == "clip":
        photos = generated_images(images)
        folder = out / "images"
        folder.mkdir(exist_ok=True)
        base = image_base_url.rstrip("/")
        written.append(_write(out / "image.json", image_entries(list(photos.values()))))
        written.append(
            _write(out / "image_url.json", url_entries([f"{base}/{name}" for name in photos]))
        )
        for name, data in photos.items():
            (folder / name).write_bytes(data)
            written.append(folder / name)
    return written


def perf_analyzer_commands(
    model: str, model_kind: str, data_dir: str = "/data", url: str = "localhost:8001"
) -> list[str]:
    """perf_analyzer command lines (gRPC) for the benchmark's loads on ``model``.

    Text ensembles: 16 clients x 1 text, 4 x 32 and 1 x 1; image ensembles: 8 x 1.
    """
    common = f"-u {url} -i grpc --measurement-interval 10000 --percentile 95"
    text_model = model if model_kind == "text" else f"{model}_text"
    loads = [
        (text_model, "text.json", 1, 16),
        (text_model, "text.json", 32, 4),
        (text_model, "text.json", 1, 1),
    ]
    if model_kind == "clip":
        loads += [
            (f"{model}_image", "image.json", 1, 8),
            (f"{model}_image_url", "image_url.json", 1, 8),
        ]
    return [
        f"perf_analyzer -m {name} {common} --input-data {data_dir}/{file} "
        f"-b {batch} --concurrency-range {clients}"
        for name, file, batch, clients in loads
    ]
