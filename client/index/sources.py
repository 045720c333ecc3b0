"""Readers: the rows of a corpus, in one fixed order, with a fingerprint of what was read.

A source turns the command's inputs (files, folders, globs) into :class:`Row` s numbered
0, 1, 2, ... in a fixed order (files sorted by path, rows in file order), so that the
n-th row is the same row on every run: shards are slices of that numbering, and a
resumed run skips the rows of finished shards without embedding them.

- :class:`TableSource`: JSONL, CSV or Parquet tables; each row's text (or image path /
  URL) from one column, its id from another (the row number where the table has none),
  further columns carried through.
- :class:`ImageFolderSource`: every image file under a folder (recursive); the id is
  the path relative to the folder.
- :class:`WebDatasetSource`: webdataset tars (samples ``<key>.<ext>`` in a row); the id
  is the key, the image its first image member, kept columns other members by extension.
"""

from __future__ import annotations

import csv
import glob
import hashlib
import json
import os
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TABLE_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet"}
IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"})


class SourceError(ValueError):
    """The inputs cannot be read as asked (no files, an unknown format, a missing column)."""


@dataclass(frozen=True)
class Row:
    """One item of the corpus.

    ``index``: its number in the source's order; ``id``: its id (a string); ``item``:
    the text, the image's path or URL, or its bytes; ``extra``: the kept columns;
    ``error``: why the row cannot be embedded (found while reading), or None;
    ``origin``: where bytes came from (the error table's input).
    """

    index: int
    id: str
    item: str | bytes | None
    extra: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    origin: str | None = None


def expand_inputs(inputs: Sequence[str], suffixes: frozenset[str] | set[str]) -> list[Path]:
    """The files named by ``inputs`` (files, folders searched recursively, globs), sorted.

    Only files with one of ``suffixes`` are taken from folders and globs; a file named
    directly must have one too. Raises :class:`SourceError` when nothing matches.
    """
    found: set[Path] = set()
    for entry in inputs:
        path = Path(entry)
        if path.is_dir():
            candidates = [p for p in path.rglob("*") if p.is_file()]
        elif path.is_file():
            if path.suffix.lower() not in suffixes:
                raise SourceError(f"{entry}: not one of {', '.join(sorted(suffixes))}")
            candidates = [path]
        else:
            candidates = [Path(p) for p in glob.glob(entry, recursive=True)]
            if not candidates:
                raise SourceError(f"{entry}: no such file, folder or matching glob")
        found.update(
            p.resolve() for p in candidates if p.is_file() and p.suffix.lower() in suffixes
        )
    if not found:
        raise SourceError(f"no input files ({', '.join(sorted(suffixes))}) in {list(inputs)}")
    return sorted(found)


def files_fingerprint(files: Sequence[Path], settings: dict[str, Any]) -> str:
    """A digest of the files (path, size, modification time) and the reading settings."""
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for path in files:
        info = path.stat()
        digest.update(f"{path}\0{info.st_size}\0{info.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _kept_value(value: Any) -> str | None:
    """A kept column's value from JSONL / CSV as text (JSON for anything but a string)."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


class TableSource:
    """Rows of JSONL, CSV or Parquet tables.

    ``column``: the text (or image path / URL) of each row; ``id_column``: its id (when
    the tables have no such column, the row number); ``keep``: columns carried into the
    output (Parquet keeps their types; JSONL / CSV values become text). ``base`` of a
    relative image path is its table's folder (``resolve_paths``).
    """

    def __init__(
        self,
        inputs: Sequence[str],
        column: str = "text",
        id_column: str = "id",
        keep: Sequence[str] = (),
        resolve_paths: bool = False,
    ):
        self.files = expand_inputs(inputs, set(TABLE_SUFFIXES))
        self.column = column
        self.id_column = id_column
        self.keep = list(keep)
        self.resolve_paths = resolve_paths
        self._check_columns()

    @property
    def fingerprint(self) -> str:
        """What was read, as a digest (files and their sizes / times, the columns)."""
        settings = {"column": self.column, "id": self.id_column, "keep": self.keep}
        return files_fingerprint(self.files, settings)

    def kept_types(self) -> dict[str, Any]:
        """The pyarrow type of each kept column: a Parquet column's own, else string."""
        import pyarrow as pa  # noqa: PLC0415 - the index extra

        types = {name: pa.string() for name in self.keep}
        for path in self.files:
            if TABLE_SUFFIXES[path.suffix.lower()] == "parquet":
                schema = _parquet_schema(path)
                for name in self.keep:
                    if name in schema.names:
                        types[name] = schema.field(name).type
        return types

    def count(self) -> int:
        """How many rows the tables hold (Parquet: its footer; JSONL: non-blank lines; CSV read)."""
        return sum(self._file_count(path) for path in self.files)

    def _file_count(self, path: Path) -> int:
        kind = TABLE_SUFFIXES[path.suffix.lower()]
        if kind == "parquet":
            return int(_parquet_file(path).metadata.num_rows)
        if kind == "jsonl":
            with path.open("rb") as handle:
                return sum(1 for line in handle if line.strip())
        return sum(1 for _ in self._records(path, kind))

    def _check_columns(self) -> None:
        """Refuse at once a text column, or a kept column, that no table has."""
        for path in self.files:
            kind = TABLE_SUFFIXES[path.suffix.lower()]
            if kind == "parquet":
                names = set(_parquet_schema(path).names)
            elif kind == "csv":
                with path.open(newline="", encoding="utf-8") as handle:
                    names = set(next(csv.reader(handle), []))
            else:
                continue  # JSONL rows may differ: a missing value is that row's error
            missing = [c for c in [self.column, *self.keep] if c not in names]
            if missing:
                raise SourceError(f"{path}: no column {', '.join(missing)} (has {sorted(names)})")

    def _records(self, path: Path, kind: str) -> Iterator[dict[str, Any]]:
        if kind == "jsonl":
            with path.open(encoding="utf-8") as handle:
                for number, line in enumerate(handle, 1):
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as exc:
                        yield {"__error__": f"{path.name}:{number}: not JSON ({exc.msg})"}
                        continue
                    yield (
                        record
                        if isinstance(record, dict)
                        else {"__error__": f"{path.name}:{number}: not a JSON object"}
                    )
        elif kind == "csv":
            with path.open(newline="", encoding="utf-8") as handle:
                yield from csv.DictReader(handle)
        else:
            columns = list(dict.fromkeys([self.column, *self.keep]))
            parquet = _parquet_file(path)
            if self.id_column in parquet.schema_arrow.names:
                columns.append(self.id_column)
            for batch in parquet.iter_batches(batch_size=4096, columns=columns):
                yield from batch.to_pylist()

    def rows(self, start: int = 0, stop: int | None = None) -> Iterator[Row]:
        """Rows ``start`` to ``stop - 1`` (default: every row), numbered in order.

        Rows without a usable value carry their error. Files wholly before ``start`` are
        counted, not read (a Spark task reads only its slice's files).
        """
        index = 0
        for path in self.files:
            if stop is not None and index >= stop:
                return
            if start > index:
                size = self._file_count(path)
                if index + size <= start:
                    index += size
                    continue
            kind = TABLE_SUFFIXES[path.suffix.lower()]
            keep_text = kind != "parquet"
            for record in self._records(path, kind):
                if stop is not None and index >= stop:
                    return
                if index < start:
                    index += 1
                    continue
                raw_id = record.get(self.id_column)
                row_id = str(index) if raw_id is None or raw_id == "" else str(raw_id)
                extra = {
                    name: _kept_value(record.get(name)) if keep_text else record.get(name)
                    for name in self.keep
                }
                yield self._row(index, row_id, record, extra, path)
                index += 1

    def _row(self, index: int, row_id: str, record: dict, extra: dict, path: Path) -> Row:
        if "__error__" in record:
            return Row(index, row_id, None, extra, record["__error__"])
        value = record.get(self.column)
        if value is None:
            return Row(index, row_id, None, extra, f"no value in column {self.column!r}")
        if not isinstance(value, str):
            return Row(index, row_id, None, extra, f"{self.column!r} is not text: {value!r:.80}")
        if self.resolve_paths and value and "://" not in value and not value.startswith("data:"):
            value = str((path.parent / value).resolve()) if not os.path.isabs(value) else value
        return Row(index, row_id, value, extra)


class ImageFolderSource:
    """Every image file under the given folders (recursive), ids relative to their folder."""

    def __init__(self, inputs: Sequence[str]):
        self.roots: list[tuple[Path, Path]] = []
        for entry in inputs:
            root = Path(entry)
            base = root if root.is_dir() else root.parent
            for path in expand_inputs([entry], IMAGE_SUFFIXES):
                self.roots.append((base.resolve(), path))
        self.files = [path for _, path in self.roots]
        self.keep: list[str] = []

    @property
    def fingerprint(self) -> str:
        """What was read, as a digest (files and their sizes / times)."""
        return files_fingerprint(self.files, {"images": True})

    def kept_types(self) -> dict[str, Any]:
        """No kept columns."""
        return {}

    def count(self) -> int:
        """How many images."""
        return len(self.roots)

    def rows(self, start: int = 0, stop: int | None = None) -> Iterator[Row]:
        """One row per image file (``start`` to ``stop - 1``).

        Its id is the path relative to its folder, its item the absolute path.
        """
        for index, (base, path) in enumerate(self.roots[start:stop], start):
            yield Row(index, path.relative_to(base).as_posix(), str(path))


class WebDatasetSource:
    """Samples of webdataset tars: members ``<key>.<ext>`` grouped by key, in tar order.

    The image is the sample's first member with an image suffix (a sample without one
    is a row with its error); ``keep`` names other members by extension (``txt``,
    ``json``), carried as text.
    """

    def __init__(self, inputs: Sequence[str], keep: Sequence[str] = ()):
        self.files = expand_inputs(inputs, {".tar"})
        self.keep = list(keep)

    @property
    def fingerprint(self) -> str:
        """What was read, as a digest (tars and their sizes / times, the kept members)."""
        return files_fingerprint(self.files, {"webdataset": True, "keep": self.keep})

    def kept_types(self) -> dict[str, Any]:
        """Kept members are text."""
        import pyarrow as pa  # noqa: PLC0415 - the index extra

        return {name: pa.string() for name in self.keep}

    def count(self) -> int:
        """How many samples (the tars' member lists are read)."""
        return sum(1 for _ in self._samples(read=False))

    def _samples(
        self, read: bool = True, files: Sequence[Path] | None = None
    ) -> Iterator[tuple[str, str, dict[str, bytes]]]:
        for path in self.files if files is None else files:
            with tarfile.open(path) as tar:
                key, members = None, {}
                for member in tar:
                    if not member.isfile():
                        continue
                    folder, _, name = member.name.rpartition("/")
                    stem, _, ext = name.partition(".")
                    sample = f"{folder}/{stem}" if folder else stem
                    if sample != key and key is not None:
                        yield path.name, key, members
                        members = {}
                    key = sample
                    handle = tar.extractfile(member) if read else None
                    members[ext.lower()] = handle.read() if handle else b""
                if key is not None:
                    yield path.name, key, members

    def _skip_tars(self, start: int) -> tuple[int, list[Path]]:
        """The first row number and the tars left once whole tars before ``start`` go."""
        index = 0
        for number, path in enumerate(self.files):
            size = sum(1 for _ in self._samples(read=False, files=[path]))
            if index + size > start:
                return index, self.files[number:]
            index += size
        return index, []

    def rows(self, start: int = 0, stop: int | None = None) -> Iterator[Row]:
        """One row per sample (``start`` to ``stop - 1``): id its key, item its image bytes."""
        first, files = self._skip_tars(start) if start else (0, self.files)
        for index, (tar, key, members) in enumerate(self._samples(files=files), first):
            if stop is not None and index >= stop:
                return
            if index < start:
                continue
            extra = {
                name: members[name].decode("utf-8", "replace") if name in members else None
                for name in self.keep
            }
            image = next((ext for ext in members if f".{ext}" in IMAGE_SUFFIXES), None)
            origin = f"{tar}:{key}.{image or '?'}"
            if image is None:
                yield Row(index, key, None, extra, "no image member in the sample", origin)
            else:
                yield Row(index, key, members[image], extra, origin=origin)


def _parquet_file(path: Path) -> Any:
    import pyarrow.parquet as pq  # noqa: PLC0415 - the index extra

    return pq.ParquetFile(path)


def _parquet_schema(path: Path) -> Any:
    return _parquet_file(path).schema_arrow
