"""Append or remove one ``[[models]]`` table in a manifest file, keeping the rest as is."""

from __future__ import annotations

import json
import re
from pathlib import Path

from .manifest import load_manifest


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(str(value))


def append_entry(path: Path, fields: dict[str, object]) -> None:
    """Add a ``[[models]]`` table; refuses a name the manifest already has."""
    if path.exists():
        names = {e.name for e in load_manifest(path).models}
        if fields["name"] in names:
            raise ValueError(f"model {fields['name']!r} is already in {path}")
    lines = ["", "[[models]]", *(f"{k} = {_toml_value(v)}" for k, v in fields.items())]
    text = path.read_text() if path.exists() else ""
    path.write_text(text.rstrip("\n") + "\n" + "\n".join(lines) + "\n")
    load_manifest(path)


def remove_entry_text(path: Path, name: str) -> None:
    """Drop the ``[[models]]`` table whose ``name`` is ``name``."""
    text = path.read_text()
    blocks = re.split(r"(?m)^(?=\[\[models\]\]|\[fetch_image\])", text)
    pattern = re.compile(rf"(?m)^name\s*=\s*\"{re.escape(name)}\"\s*$")
    kept = [b for b in blocks if not (b.startswith("[[models]]") and pattern.search(b))]
    if len(kept) == len(blocks):
        raise KeyError(f"model {name!r} is not in {path}")
    path.write_text("".join(kept))
    load_manifest(path)
