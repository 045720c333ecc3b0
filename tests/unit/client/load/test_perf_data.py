"""perf_analyzer input-data files: layout, BYTES serialisation, CLI."""

from __future__ import annotations

import base64
import io
import json
import struct

import pytest
from PIL import Image

from client.cli import main
from client.load.perf_data import (
    image_entries,
    perf_analyzer_commands,
    serialize_bytes_tensor,
    text_entries,
    url_entries,
    write_perf_data,
)


def _load(path) -> list[dict]:
    doc = json.loads(path.read_text())
    assert list(doc) == ["data"], "perf_analyzer wants one top-level member, 'data'"
    return doc["data"]


def test_serialize_bytes_tensor_prefixes_each_element_with_its_le_length():
    assert serialize_bytes_tensor([b"ab", b""]) == b"\x02\x00\x00\x00ab\x00\x00\x00\x00"


def test_serialize_bytes_tensor_matches_tritonclient():
    import numpy as np
    from tritonclient.utils import serialize_byte_tensor

    items = [b"\xff\xd8\x00jpeg", "é".encode(), b""]
    expected = serialize_byte_tensor(np.array(items, dtype=object)).item()
    assert serialize_bytes_tensor(items) == expected


def test_text_entry_gives_content_and_batch1_shape():
    assert text_entries(["a cat"]) == [{"TEXT": {"content": ["a cat"], "shape": [1]}}]


def test_url_entry_uses_image_url_input():
    assert url_entries(["http://h/x.jpg"]) == [
        {"IMAGE_URL": {"content": ["http://h/x.jpg"], "shape": [1]}}
    ]


def test_image_entry_b64_decodes_to_serialised_bytes_tensor():
    (entry,) = image_entries([b"\xff\xd8jpeg"])
    tensor = entry["IMAGE"]
    assert tensor["shape"] == [1]
    raw = base64.b64decode(tensor["content"]["b64"])
    (length,) = struct.unpack("<I", raw[:4])
    assert length == 6 and raw[4:] == b"\xff\xd8jpeg"


def test_write_perf_data_text_writes_only_text_json(tmp_path):
    written = write_perf_data(tmp_path, "text", texts=20)
    assert [p.name for p in written] == ["text.json"]
    data = _load(tmp_path / "text.json")
    assert len(data) == 20
    assert all(set(e) == {"TEXT"} and e["TEXT"]["shape"] == [1] for e in data)
    assert all(isinstance(e["TEXT"]["content"][0], str) for e in data)


def test_write_perf_data_clip_writes_all_three_ensembles_and_images(tmp_path):
    write_perf_data(tmp_path, "clip", "http://127.0.0.1:9999/", texts=5, images=3)
    images = _load(tmp_path / "image.json")
    urls = _load(tmp_path / "image_url.json")
    files = sorted(p.name for p in (tmp_path / "images").iterdir())
    assert len(_load(tmp_path / "text.json")) == 5
    assert len(images) == len(urls) == len(files) == 3
    got_urls = sorted(e["IMAGE_URL"]["content"][0] for e in urls)
    assert got_urls == [f"http://127.0.0.1:9999/{name}" for name in files]
    for entry in images:
        raw = base64.b64decode(entry["IMAGE"]["content"]["b64"])
        assert struct.unpack("<I", raw[:4])[0] == len(raw) - 4
        assert Image.open(io.BytesIO(raw[4:])).size[0] > 0


def test_write_perf_data_is_reproducible(tmp_path):
    write_perf_data(tmp_path / "a", "clip", images=2, texts=4)
    write_perf_data(tmp_path / "b", "clip", images=2, texts=4)
    for name in ("text.json", "image.json", "image_url.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_write_perf_data_rejects_unknown_kind(tmp_path):
    with pytest.raises(ValueError, match="model_kind"):
        write_perf_data(tmp_path, "audio")


def test_perf_analyzer_commands_cover_every_load_and_ensemble():
    commands = perf_analyzer_commands("clip-b32", "clip")
    assert any("-m clip-b32_text " in c and "-b 32 --concurrency-range 4" in c for c in commands)
    assert any("-m clip-b32_image " in c and "image.json" in c for c in commands)
    assert any("-m clip-b32_image_url " in c and "image_url.json" in c for c in commands)
    assert all(c.startswith("perf_analyzer ") and "-i grpc" in c for c in commands)


def test_cli_perf_data_writes_files_and_prints_commands(tmp_path, capsys):
    code = main(["perf-data", "--out", str(tmp_path), "--model-kind", "clip", "--images", "2"])
    assert code == 0
    assert (tmp_path / "image_url.json").is_file()
    assert "perf_analyzer -m clip-vit-b-32_image_url" in capsys.readouterr().out
