"""The output folder: Parquet shards, error tables and the manifest, every write atomic.

Layout (``OUT``)::

    OUT/embeddings/<part>-00000.parquet   id, embedding (or the kind's columns), kept columns
    OUT/errors/<part>-00000.parquet       id, input, reason: the shard's rows that failed
    OUT/manifest.json                     model, config digest, options, input, shards done

``pandas.read_parquet("OUT/embeddings")`` and embedding-reader's ``parquet`` layout
(``EmbeddingReader("OUT/embeddings", file_format="parquet")``) read the shards as they
are. Each file is written under a hidden temporary name (``.<name>.tmp-<pid>``, which
neither reader lists) and renamed into place: a file that exists is complete. A shard is
done when its embeddings file exists; its error table is written just before it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MANIFEST = "manifest.json"
EMBEDDINGS = "embeddings"
ERRORS = "errors"
FORMAT_VERSION = 1
# The manifest's fields that must match for a run to continue an earlier one.
IDENTITY = ("format", "model", "kind", "config_digest", "options", "input", "shard_rows")
_SHARD = re.compile(r"^(?P<part>.+)-(?P<shard>\d{5,})\.parquet$")


class OutputMismatchError(ValueError):
    """The folder holds the output of another model, input or options."""


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a hidden temporary file and a rename (fsync'd)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def atomic_write_table(path: Path, table: Any) -> None:
    """Write the pyarrow ``table`` as Parquet to ``path`` atomically."""
    import pyarrow.parquet as pq  # noqa: PLC0415 - the index extra

    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    pq.write_table(table, tmp)
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def vectors_array(vectors: np.ndarray) -> Any:
    """A 2-D array [N, D] as a pyarrow list column of its dtype."""
    import pyarrow as pa  # noqa: PLC0415 - the index extra

    vectors = np.ascontiguousarray(vectors)
    n, d = vectors.shape if vectors.ndim == 2 else (len(vectors), 0)
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * d)
    return pa.ListArray.from_arrays(offsets, pa.array(vectors.reshape(-1)))


def ragged_array(rows: Sequence[np.ndarray]) -> Any:
    """Per-row 1-D arrays (sparse indices or values) as a pyarrow list column."""
    import pyarrow as pa  # noqa: PLC0415 - the index extra

    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(rows) if rows else np.zeros(0, dtype=np.float32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))


def nested_array(rows: Sequence[np.ndarray]) -> Any:
    """Per-row 2-D arrays [T_i, D] (token vectors) as a list of lists column."""
    import pyarrow as pa  # noqa: PLC0415 - the index extra

    tokens = [vectors_array(r) for r in rows]
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum([len(r) for r in rows], out=offsets[1:])
    inner = pa.concat_arrays(tokens) if tokens else pa.array([], pa.list_(pa.float32()))
    return pa.ListArray.from_arrays(pa.array(offsets), inner)


@dataclass
class OutputFolder:
    """The output folder of one run (or of one partition of a distributed run)."""

    root: Path

    def __post_init__(self) -> None:
        self.root = Path(self.root)

    @property
    def embeddings(self) -> Path:
        """The shards' folder."""
        return self.root / EMBEDDINGS

    @property
    def errors(self) -> Path:
        """The error tables' folder."""
        return self.root / ERRORS

    def prepare(self) -> None:
        """Create the folders; remove temporary files a killed run left."""
        for folder in (self.embeddings, self.errors):
            folder.mkdir(parents=True, exist_ok=True)
            for leftover in folder.glob(".*.tmp-*"):
                leftover.unlink(missing_ok=True)

    def clear(self) -> None:
        """Remove an earlier run's shards, errors and manifest (``--restart``)."""
        for folder in (self.embeddings, self.errors):
            shutil.rmtree(folder, ignore_errors=True)
        (self.root / MANIFEST).unlink(missing_ok=True)

    @staticmethod
    def shard_name(part: str, shard: int) -> str:
        """``<part>-NNNNN.parquet``."""
        return f"{part}-{shard:05d}.parquet"

    def done_shards(self, part: str) -> set[int]:
        """The shards of partition ``part`` whose embeddings file exists."""
        done = set()
        if self.embeddings.is_dir():
            for path in self.embeddings.iterdir():
                match = _SHARD.match(path.name)
                if match and match["part"] == part:
                    done.add(int(match["shard"]))
        return done

    def write_shard(self, part: str, shard: int, table: Any, errors: Any) -> Path:
        """The shard's error table, then its embeddings (whose existence marks it done)."""
        name = self.shard_name(part, shard)
        atomic_write_table(self.errors / name, errors)
        path = self.embeddings / name
        atomic_write_table(path, table)
        return path

    def read_manifest(self) -> dict[str, Any] | None:
        """The manifest, or None when there is none."""
        path = self.root / MANIFEST
        if not path.exists():
            return None
        return json.loads(path.read_text(encoding="utf-8"))

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        """Write the manifest atomically."""
        text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
        atomic_write_bytes(self.root / MANIFEST, text.encode("utf-8"))


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The identity fields that differ between an earlier manifest and this run's."""
    changed = []
    for key in IDENTITY:
        if old.get(key) != new.get(key):
            changed.append(f"{key}: {_short(old.get(key))} -> {_short(new.get(key))}")
    return changed


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def check_resumable(folder: OutputFolder, identity: dict[str, Any], restart: bool) -> None:
    """Refuse to add to another run's output, naming what changed (unless ``restart``).

    An earlier manifest of the same identity, or none with no shards, lets the run go
    on; ``restart`` clears the folder first.
    """
    if restart:
        folder.clear()
        return
    old = folder.read_manifest()
    if old is None:
        if folder.embeddings.is_dir() and any(folder.embeddings.glob("*.parquet")):
            raise OutputMismatchError(
                f"{folder.root} holds shards but no {MANIFEST}: pass --restart to start anew"
            )
        return
    changed = differences(old, identity)
    if changed:
        raise OutputMismatchError(
            f"{folder.root} holds another run's output ({'; '.join(changed)}): use the same "
            "model, input and options to resume it, or pass --restart to start anew"
        )
