"""Flipped bytes in a model file never reach an answer: digests written, then checked.

The fault is the one seen on ``make serve``: 3 x 4 KiB of the weight cache's
``weights.bin`` overwritten, after which the server answered every request wrongly. Here
the same bytes are flipped in a cached copy (it is rewritten before any session loads
it) and in a repository file the build wrote (its model refuses to load, naming it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from embed_runtime.engines.ort_encoder import EncoderParams, OrtEncoder
from embed_runtime.ops.integrity import (
    DIGESTS_FILE,
    IntegrityError,
    verify_digests,
    write_digests,
)
from embed_runtime.ops.weight_cache import cached_model
from generator.build import RepositoryWriter
from generator.model_dir import ModelDir
from tests.unit.embed_runtime.engines.test_ort_encoder import (
    BASE,
    _expected,
    _tokens,
    masked_mean_graph,
)


def flip(path: Path, offsets=(0.2, 0.5, 0.8), size: int = 4096) -> None:
    """Overwrite ``size`` bytes (bit-inverted) at each fraction of the file."""
    data = bytearray(path.read_bytes())
    for fraction in offsets:
        start = min(int(len(data) * fraction), max(len(data) - size, 0))
        data[start : start + size] = bytes(b ^ 0xFF for b in data[start : start + size])
    path.write_bytes(bytes(data))


def test_digests_round_trip_and_name_the_corrupt_or_missing_file(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(os.urandom(10_000))
    (tmp_path / "b.json").write_text("{}")
    recorded = write_digests(str(tmp_path), ["a.bin", "b.json"])
    assert verify_digests(str(tmp_path)) == recorded
    flip(tmp_path / "a.bin", offsets=(0.5,), size=1)
    with pytest.raises(IntegrityError, match=r"a\.bin is corrupt"):
        verify_digests(str(tmp_path))
    (tmp_path / "a.bin").unlink()
    with pytest.raises(IntegrityError, match=r"a\.bin is missing"):
        verify_digests(str(tmp_path))


def test_a_folder_without_digests_passes_only_when_they_are_not_required(tmp_path) -> None:
    assert verify_digests(str(tmp_path)) == {}
    with pytest.raises(IntegrityError, match="has no"):
        verify_digests(str(tmp_path), required=True)
    (tmp_path / DIGESTS_FILE).write_text(json.dumps({"sha256": {"../x": "0"}}))
    with pytest.raises(IntegrityError, match="outside"):
        verify_digests(str(tmp_path))


@pytest.fixture
def graph(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("EMBED_ORT_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "model").mkdir()
    return masked_mean_graph(tmp_path / "model" / "model.onnx")


def test_a_corrupt_weight_cache_copy_is_rewritten_before_any_session_loads_it(graph) -> None:
    params = EncoderParams.from_parameters(BASE)
    first = OrtEncoder(str(graph), params)
    weights = Path(first.model_path).with_name("weights.bin")
    assert weights.stat().st_size > 3 * 64
    request = _tokens([3, 6, 2], np.random.default_rng(1))
    good = first.encode_tokens([request])[0]
    del first
    flip(weights, size=64)  # the tiny graph's weights are 1.6 KB; 3 x 4 KiB on a real model
    repaired = OrtEncoder(str(graph), params)
    assert len(repaired.cache_repairs) == 1 and "weights.bin is corrupt" in (
        repaired.cache_repairs[0]
    )
    np.testing.assert_array_equal(repaired.encode_tokens([request])[0], good)
    np.testing.assert_allclose(good, _expected(request), rtol=1e-5, atol=1e-6)
    verify_digests(str(weights.parent), required=True)  # the copy on disk is whole again
    assert OrtEncoder(str(graph), params).cache_repairs == []


def test_a_cached_copy_without_digests_is_not_trusted(graph) -> None:
    path = Path(cached_model(str(graph)))
    (path.parent / DIGESTS_FILE).unlink()
    repairs: list[str] = []
    assert cached_model(str(graph), on_repair=repairs.append) == str(path)
    assert repairs and "has no" in repairs[0]
    verify_digests(str(path.parent), required=True)


def test_the_build_records_digests_and_a_flipped_model_file_refuses_to_load(
    graph, tmp_path: Path
) -> None:
    writer = RepositoryWriter(tmp_path / "repo")
    staged = writer.stage(ModelDir("m_encode", "name: \"m_encode\"\n", None,
                                   {"model.onnx": graph}))
    version = staged / "1"
    recorded = json.loads((version / DIGESTS_FILE).read_text())["sha256"]
    assert set(recorded) == {"model.onnx"}
    verify_digests(str(version), required=True)
    flip(version / "model.onnx", offsets=(0.6,), size=16)
    with pytest.raises(IntegrityError, match=r"model\.onnx is corrupt"):
        verify_digests(str(version))
