"""Content digests of model files, written when they are made and checked when loaded.

A few flipped bytes in a weight file do not stop ONNX Runtime or the tokenizer from
loading it: the server comes up ready and answers every request with wrong vectors. So
whoever writes model files (the generator's build, the ONNX Runtime weight cache) records
their SHA-256 in :data:`DIGESTS_FILE` beside them, and whoever loads them checks it first
(:func:`verify_digests`): a mismatch is an error that names the file, never an answer.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable

DIGESTS_FILE = "files.sha256.json"
_BLOCK = 1 << 20


class IntegrityError(RuntimeError):
    """A model file differs from the digest recorded when it was written."""


def file_digest(path: str) -> str:
    """SHA-256 (hex) of the file at ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def write_digests(folder: str, names: Iterable[str]) -> dict[str, str]:
    """Record the digest of each file ``names`` (relative to ``folder``); returns them."""
    digests = {name: file_digest(os.path.join(folder, name)) for name in sorted(names)}
    path = os.path.join(folder, DIGESTS_FILE)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({"sha256": digests}, handle, indent=1, sort_keys=True)
    return digests


def recorded_digests(folder: str) -> dict[str, str] | None:
    """The digests recorded in ``folder``, or None where none were written."""
    path = os.path.join(folder, DIGESTS_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            recorded = json.load(handle)["sha256"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise IntegrityError(f"{path} is unreadable: {exc}") from None
    if not isinstance(recorded, dict):
        raise IntegrityError(f"{path} does not map file names to digests")
    return recorded


def verify_digests(folder: str, required: bool = False) -> dict[str, str]:
    """Check every recorded file of ``folder`` against its digest; returns the digests.

    Raises :class:`IntegrityError` naming the first file that is missing or differs. A
    folder without a record passes unless ``required`` (files written before digests
    were recorded).
    """
    recorded = recorded_digests(folder)
    if recorded is None:
        if required:
            raise IntegrityError(f"{folder} has no {DIGESTS_FILE}")
        return {}
    for name, want in recorded.items():
        path = os.path.join(folder, name)
        if os.path.dirname(os.path.normpath(name)).startswith("..") or os.path.isabs(name):
            raise IntegrityError(f"{DIGESTS_FILE} names a file outside {folder}: {name!r}")
        if not os.path.isfile(path):
            raise IntegrityError(f"{path} is missing (recorded in {DIGESTS_FILE})")
        got = file_digest(path)
        if got != want:
            raise IntegrityError(
                f"{path} is corrupt: SHA-256 {got[:16]}... where {want[:16]}... was recorded "
                "when it was written"
            )
    return recorded
