"""Pure helpers that build request tensors and split/reassemble batches (no server)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import EmbeddingClientError

IMAGE = "image"
IMAGE_URL = "image_url"
INPUT_NAMES = {IMAGE: "IMAGE", IMAGE_URL: "IMAGE_URL"}
URL_PREFIXES = ("http://", "https://", "data:")

ImageItem = bytes | str | os.PathLike


def bytes_tensor(items: Sequence[bytes]) -> np.ndarray:
    """Return ``items`` as Triton's BYTES layout: an object array of shape ``[N, 1]``."""
    arr = np.empty((len(items), 1), dtype=object)
    for row, item in enumerate(items):
        arr[row, 0] = item
    return arr


def encode_texts(texts: Sequence[str]) -> list[bytes]:
    """UTF-8 encode ``texts`` (``bytes`` items pass through unchanged)."""
    if isinstance(texts, (str, bytes)):
        raise EmbeddingClientError("texts must be a sequence of strings, not a single string")
    encoded = []
    for i, text in enumerate(texts):
        if isinstance(text, str):
            encoded.append(text.encode("utf-8"))
        elif isinstance(text, bytes):
            encoded.append(text)
        else:
            raise EmbeddingClientError(f"texts[{i}] is {type(text).__name__}, expected str")
    return encoded


def request_parameters(**options: Any) -> dict[str, Any]:
    """The request parameters of a call: each option it was given (not None), by its name."""
    return {name: value for name, value in options.items() if value is not None}


def split_batches(
    sizes: Sequence[int], max_items: int, max_bytes: int | None = None
) -> list[slice]:
    """Split items into consecutive slices of at most ``max_items`` items and ``max_bytes``.

    ``sizes`` holds each item's byte size. ``max_items <= 0`` means no count limit
    (a model without batching). An item larger than ``max_bytes`` goes in a slice alone.
    """
    slices: list[slice] = []
    start, total = 0, 0
    for i, size in enumerate(sizes):
        full = max_items > 0 and i - start >= max_items
        too_big = max_bytes is not None and i > start and total + size > max_bytes
        if full or too_big:
            slices.append(slice(start, i))
            start, total = i, 0
        total += size
    if start < len(sizes):
        slices.append(slice(start, len(sizes)))
    return slices


def is_url(item: str) -> bool:
    """Whether ``item`` is an http(s) URL or a data: URI (scheme case-insensitive)."""
    return item[:8].lower().startswith(URL_PREFIXES)


def image_target(model: str) -> tuple[str, str | None]:
    """Split a model name into (base name, forced kind).

    ``clip_image_url`` -> (``clip``, ``image_url``); ``clip_image`` -> (``clip``,
    ``image``); anything else is a base name with no forced kind.
    """
    for kind in (IMAGE_URL, IMAGE):
        suffix = f"_{kind}"
        if model.endswith(suffix) and len(model) > len(suffix):
            return model[: -len(suffix)], kind
    return model, None


@dataclass
class ImageGroup:
    """The images bound for one ensemble, with their positions in the caller's list."""

    kind: str
    indices: list[int] = field(default_factory=list)
    payloads: list[bytes] = field(default_factory=list)

    @property
    def input_name(self) -> str:
        """Name of the ensemble's input tensor (``IMAGE`` or ``IMAGE_URL``)."""
        return INPUT_NAMES[self.kind]


def _read_file(path: str | os.PathLike) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise EmbeddingClientError(f"cannot read image file {str(path)!r}: {exc}") from exc


def _kind_of(item: object, index: int) -> str:
    if isinstance(item, (bytes, bytearray, memoryview)):
        return IMAGE
    if isinstance(item, str) and is_url(item):
        return IMAGE_URL
    if isinstance(item, (str, os.PathLike)):
        return IMAGE
    raise EmbeddingClientError(
        f"images[{index}] is {type(item).__name__}, expected bytes, a URL or a path"
    )


def route_images(images: Sequence[ImageItem], forced: str | None = None) -> list[ImageGroup]:
    """Sort images into the ``image`` / ``image_url`` ensembles, reading local files.

    ``bytes`` are sent as they are; a ``str`` starting with http://, https:// or data:
    is a URL; any other ``str`` or ``PathLike`` is a local file read here. ``forced``
    (a kind from :func:`image_target`) rejects items the named ensemble cannot take.
    Returns only non-empty groups, ``image`` first.
    """
    if isinstance(images, (str, bytes, os.PathLike)):
        raise EmbeddingClientError("images must be a sequence, not a single image")
    groups = {IMAGE: ImageGroup(IMAGE), IMAGE_URL: ImageGroup(IMAGE_URL)}
    for i, item in enumerate(images):
        kind = _kind_of(item, i)
        if forced is not None and kind != forced:
            wanted = "URLs" if forced == IMAGE_URL else "image bytes or file paths"
            raise EmbeddingClientError(
                f"images[{i}] does not fit the '_{forced}' ensemble, which takes {wanted}; "
                "pass the base model name to route mixed inputs"
            )
        if isinstance(item, (bytes, bytearray, memoryview)):
            payload = bytes(item)
        elif kind == IMAGE_URL:
            payload = item.encode("utf-8")
        else:
            payload = _read_file(item)
        groups[kind].indices.append(i)
        groups[kind].payloads.append(payload)
    return [group for group in groups.values() if group.indices]


def reassemble(count: int, parts: Sequence[tuple[Sequence[int], np.ndarray]]) -> np.ndarray:
    """Place each part's rows at its indices, giving one ``[count, D]`` float32 array."""
    if not parts:
        return np.zeros((0, 0), dtype=np.float32)
    dim = parts[0][1].shape[1]
    out = np.empty((count, dim), dtype=np.float32)
    filled = np.zeros(count, dtype=bool)
    for indices, rows in parts:
        if rows.shape != (len(indices), dim):
            raise EmbeddingClientError(
                f"embedding shapes disagree: {rows.shape} for {len(indices)} inputs, D={dim}"
            )
        out[list(indices)] = rows
        filled[list(indices)] = True
    if not filled.all():
        raise EmbeddingClientError("some inputs received no embedding")
    return out
