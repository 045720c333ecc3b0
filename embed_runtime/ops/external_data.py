"""Re-lay an ONNX model's external-data file so that every blob starts aligned.

ONNX Runtime writes the optimised copy of the weight cache (``weight_cache.py``) with its
initializers and their pre-packed forms back to back in one file, at whatever offset the
previous blob ended. A session that loads the copy memory-maps that file and hands each
pre-packed blob's address straight to MLAS, whose SGEMM kernels read packed B with
aligned AVX loads (``vmovaps``, 32 bytes; 64 with AVX-512). One initializer whose size is
not a multiple of 32 bytes (SPLADE's MLM decoder bias: 30,522 floats, 122,088 bytes)
shifts every later blob off alignment, and the first MatMul faults (SIGSEGV). ONNX
Runtime 1.31 can align the blobs itself (``ModelSavingOptions.align_offset``) but no
session option reaches it, so the cache moves the blobs after the write.

The serving image has no ``onnx`` package, so the model is edited at the protobuf wire
level: only the ``external_data`` entries of ``TensorProto`` messages change (their
``offset`` and the offsets inside ``prepacked_<n>`` values, ``key|offset;length;checksum``
per blob), reached through the fields that can hold tensors (graph initializers, sparse
initializers, attribute tensors and sub-graphs). Every other byte is copied as it was.
"""

from __future__ import annotations

import os
from collections.abc import Callable

ALIGNMENT = 64  # MLAS's preferred buffer alignment: covers AVX (32) and AVX-512 (64) loads
# ONNX Runtime itself already starts blobs over 1 MiB on a page (4096): kept so
PAGE, PAGE_FROM = 4096, 1 << 20

# field numbers of onnx.proto3 messages that lead to a TensorProto's external_data
_MODEL_GRAPH = 7
_GRAPH_NODE, _GRAPH_INITIALIZER, _GRAPH_SPARSE_INITIALIZER = 1, 5, 15
_NODE_ATTRIBUTE = 5
_ATTR_T, _ATTR_G, _ATTR_TENSORS, _ATTR_GRAPHS = 5, 6, 10, 11
_ATTR_SPARSE_TENSOR, _ATTR_SPARSE_TENSORS = 22, 23
_SPARSE_VALUES, _SPARSE_INDICES = 1, 2
_TENSOR_EXTERNAL_DATA = 13
_ENTRY_KEY, _ENTRY_VALUE = 1, 2
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5

Entry = tuple[str, str]
EntryMap = Callable[[list[Entry]], list[Entry]]


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _fields(buf: bytes):
    """(field number, wire type, raw bytes of the whole field, payload of a LEN field)."""
    pos = 0
    while pos < len(buf):
        start = pos
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        payload = b""
        if wire == _VARINT:
            _, pos = _read_varint(buf, pos)
        elif wire == _I64:
            pos += 8
        elif wire == _I32:
            pos += 4
        elif wire == _LEN:
            size, pos = _read_varint(buf, pos)
            payload = buf[pos : pos + size]
            pos += size
        else:
            raise ValueError(f"unsupported protobuf wire type {wire} (field {number})")
        if pos > len(buf):
            raise ValueError("truncated protobuf message")
        yield number, wire, buf[start:pos], payload


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | _LEN) + _varint(len(payload)) + payload


def _entry(payload: bytes) -> Entry:
    parts = {n: p.decode() for n, w, _, p in _fields(payload) if w == _LEN}
    return parts.get(_ENTRY_KEY, ""), parts.get(_ENTRY_VALUE, "")


def _tensor(buf: bytes, edit: EntryMap) -> bytes:
    entries = [_entry(p) for n, w, _, p in _fields(buf) if n == _TENSOR_EXTERNAL_DATA]
    if not entries:
        return buf
    new = iter(edit(entries))
    out = bytearray()
    for number, _, raw, _ in _fields(buf):
        if number != _TENSOR_EXTERNAL_DATA:
            out += raw
            continue
        key, value = next(new)
        entry = _len_field(_ENTRY_KEY, key.encode()) + _len_field(_ENTRY_VALUE, value.encode())
        out += _len_field(_TENSOR_EXTERNAL_DATA, entry)
    return bytes(out)


def _message(buf: bytes, children: dict, edit: EntryMap) -> bytes:
    out = bytearray()
    for number, wire, raw, payload in _fields(buf):
        child = children.get(number) if wire == _LEN else None
        out += raw if child is None else _len_field(number, child(payload, edit))
    return bytes(out)


def _graph(buf: bytes, edit: EntryMap) -> bytes:
    return _message(
        buf,
        {_GRAPH_NODE: _node, _GRAPH_INITIALIZER: _tensor, _GRAPH_SPARSE_INITIALIZER: _sparse},
        edit,
    )


def _node(buf: bytes, edit: EntryMap) -> bytes:
    return _message(buf, {_NODE_ATTRIBUTE: _attribute}, edit)


def _attribute(buf: bytes, edit: EntryMap) -> bytes:
    return _message(
        buf,
        {
            _ATTR_T: _tensor,
            _ATTR_TENSORS: _tensor,
            _ATTR_G: _graph,
            _ATTR_GRAPHS: _graph,
            _ATTR_SPARSE_TENSOR: _sparse,
            _ATTR_SPARSE_TENSORS: _sparse,
        },
        edit,
    )


def _sparse(buf: bytes, edit: EntryMap) -> bytes:
    return _message(buf, {_SPARSE_VALUES: _tensor, _SPARSE_INDICES: _tensor}, edit)


def edit_external_data(model: bytes, edit: EntryMap) -> bytes:
    """``model`` (a serialised ModelProto) with each tensor's external_data rewritten.

    ``edit(entries)`` returns the new (key, value) entries: the same count, in order.
    """
    return _message(model, {_MODEL_GRAPH: _graph}, edit)


def blob_spans(entries: list[Entry]) -> list[tuple[int, int]]:
    """(offset, length) of every blob one tensor's entries point at: data and pre-packs."""
    spans = []
    values = dict(entries)
    if "offset" in values or "length" in values:
        spans.append((int(values.get("offset", "0")), int(values.get("length", "0"))))
    for key, value in entries:
        if key.startswith("prepacked"):
            for blob in value.split("|")[1:]:
                offset, length, _checksum = blob.split(";")
                spans.append((int(offset), int(length)))
    return spans


def _moved(entries: list[Entry], where: dict[tuple[int, int], int]) -> list[Entry]:
    out = []
    for key, value in entries:
        if key == "offset":
            length = int(dict(entries).get("length", "0"))
            value = str(where[(int(value), length)])
        elif key.startswith("prepacked"):
            head, *blobs = value.split("|")
            moved = []
            for blob in blobs:
                offset, length, checksum = blob.split(";")
                moved.append(f"{where[(int(offset), int(length))]};{length};{checksum}")
            value = "|".join([head, *moved])
        out.append((key, value))
    return out


def align_external_data(model_path: str, data_name: str, alignment: int = ALIGNMENT) -> int:
    """Move every blob of ``data_name`` (beside ``model_path``) onto ``alignment``.

    Blobs over 1 MiB go on a page, as ONNX Runtime lays them; the offsets in
    ``model_path`` follow. Returns how many blobs had to move.

    Both files are replaced (written under temporary names, then renamed). Only tensors
    whose ``location`` is ``data_name`` are expected; any other location is refused, as
    is a blob that lies outside the file.
    """
    folder = os.path.dirname(os.path.abspath(model_path))
    data_path = os.path.join(folder, data_name)
    with open(model_path, "rb") as handle:
        model = handle.read()
    spans: set[tuple[int, int]] = set()

    def collect(entries: list[Entry]) -> list[Entry]:
        location = dict(entries).get("location", "")
        if location != data_name:
            raise ValueError(f"{model_path}: external data in {location!r}, not {data_name!r}")
        spans.update(blob_spans(entries))
        return entries

    edit_external_data(model, collect)
    size = os.path.getsize(data_path)
    where, end, moved = {}, 0, 0
    for offset, length in sorted(spans):
        if offset < 0 or length < 0 or offset + length > size:
            raise ValueError(f"{model_path}: blob {offset}+{length} outside {data_name}")
        step = max(alignment, PAGE) if length > PAGE_FROM else alignment
        end = -(-end // step) * step
        where[(offset, length)] = end
        moved += end != offset
        end += length
    if not moved:
        return 0
    with open(data_path, "rb") as source, open(data_path + ".aligned", "wb") as target:
        for (offset, length), new in sorted(where.items(), key=lambda item: item[1]):
            target.write(b"\0" * (new - target.tell()))
            source.seek(offset)
            target.write(source.read(length))
    with open(model_path + ".aligned", "wb") as handle:
        handle.write(edit_external_data(model, lambda entries: _moved(entries, where)))
    os.replace(data_path + ".aligned", data_path)
    os.replace(model_path + ".aligned", model_path)
    return moved


def misaligned_blobs(model_path: str, alignment: int = ALIGNMENT) -> list[tuple[int, int]]:
    """The (offset, length) of every external blob of ``model_path`` not on ``alignment``."""
    with open(model_path, "rb") as handle:
        model = handle.read()
    spans: list[tuple[int, int]] = []

    def collect(entries: list[Entry]) -> list[Entry]:
        spans.extend(blob_spans(entries))
        return entries

    edit_external_data(model, collect)
    return sorted(s for s in spans if s[0] % alignment)
