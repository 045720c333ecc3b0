"""Append or remove one ``[[models]]`` table in a manifest file, keeping the rest as is."""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .manifest import ManifestError, parse_manifest


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, dict):
        items = ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items())
        return "{" + items + "}"
    return json.dumps(str(value))


def _write_checked(path: Path, text: str) -> None:
    """Validate ``text`` as a manifest, then replace ``path`` atomically."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError([f"not valid TOML: {exc}"], str(path)) from exc
    parse_manifest(data, path.parent.resolve(), str(path))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def append_entry(path: Path, fields: dict[str, object]) -> None:
    """Add a ``[[models]]`` table; refuses a name the manifest already has.

    The file is only written when the result is a valid manifest.
    """
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if text:
        names = {m.get("name") for m in tomllib.loads(text).get("models", [])}
        if fields["name"] in names:
            raise ValueError(f"model {fields['name']!r} is already in {path}")
    lines = ["", "[[models]]", *(f"{k} = {_toml_value(v)}" for k, v in fields.items())]
    _write_checked(path, text.rstrip("\n") + "\n" + "\n".join(lines) + "\n")


def remove_entry_text(path: Path, name: str) -> None:
    """Drop the ``[[models]]`` table whose ``name`` is ``name``."""
    text = path.read_text(encoding="utf-8")
    blocks = re.split(r"(?m)^(?=\[)", text)
    pattern = re.compile(rf"(?m)^name\s*=\s*\"{re.escape(name)}\"\s*$")
    kept = [b for b in blocks if not (b.startswith("[[models]]") and pattern.search(b))]
    if len(kept) == len(blocks):
        raise KeyError(f"model {name!r} is not in {path}")
    _write_checked(path, "".join(kept))


@contextmanager
def restored_on_error(path: Path) -> Iterator[None]:
    """Put ``path`` back byte for byte (or remove it, if it did not exist) when the block raises."""
    original = path.read_bytes() if path.exists() else None
    try:
        yield
    except BaseException:
        if original is None:
            path.unlink(missing_ok=True)
        else:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(original)
            tmp.replace(path)
        raise
