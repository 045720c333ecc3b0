"""The build runs every CPU encoder graph from its weight-cache copy too (cache_check.py).

The SPLADE graph crashed ONNX Runtime from the cached copy (an unaligned pre-packed
weight), so the sparse family had served without the cache; it serves with it again, and
the build's check refuses a graph whose cached copy crashes or differs, naming it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from embed_runtime.engines.ort_encoder import EncoderParams, OrtEncoder
from generator.cache_check import check_weight_cache, encoder_params
from generator.families.sparse_encoder import export as sparse_family
from generator.fixtures.tiny_splade import create_tiny_splade
from generator.manifest import parse_manifest
from tests.unit.embed_runtime.ops.test_weight_cache_alignment import _aligned_loads_fault


@pytest.fixture(scope="module")
def splade(tmp_path_factory) -> Path:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return create_tiny_splade(tmp_path_factory.mktemp("splade") / "max", seed=1)


def _build(folder: Path, work: Path, **fields):
    manifest = parse_manifest(
        {
            "models": [
                {
                    "name": "sp",
                    "family": "sparse-encoder",
                    "source": str(folder),
                    "max_rows_per_run": 4,
                    **fields,
                }
            ]
        },
        work,
    )
    return sparse_family.build(manifest.models[0], manifest, work / "work")


@pytest.fixture(scope="module")
def splade_dirs(splade, tmp_path_factory):
    return _build(splade, tmp_path_factory.mktemp("built"))


def test_the_sparse_encoder_serves_from_the_weight_cache_again(splade_dirs) -> None:
    encode = next(d for d in splade_dirs if d.name == "sp_encode")
    params = encoder_params(encode)
    assert params is not None and params.weight_cache and params.execution_provider == "cpu"
    graph = str(encode.files[params.onnx_file])
    cached = OrtEncoder(graph, params)
    assert cached.cache_error == "" and cached.model_path != graph
    plain = OrtEncoder(
        graph, EncoderParams.from_parameters({**params.to_parameters(), "weight_cache": "false"})
    )
    rng = np.random.default_rng(0)
    tokens = [
        {
            "input_ids": rng.integers(1, 30000, (2, 9)),
            "attention_mask": np.ones((2, 9), np.int64),
            "token_type_ids": np.zeros((2, 9), np.int64),
        }
    ]
    tokens = [{k: v for k, v in t.items() if k in params.input_names} for t in tokens]
    got, want = cached.encode_tokens(tokens)[0], plain.encode_tokens(tokens)[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_the_build_check_passes_every_encoder_of_the_sparse_build(splade_dirs) -> None:
    lines: list[str] = []
    check_weight_cache(splade_dirs, lines.append)
    assert lines == []  # nothing off, nothing to say


def test_the_build_check_refuses_a_copy_that_crashes(splade_dirs, tmp_path, monkeypatch) -> None:
    """The cache as it was before the fix: the build names the model and the signal."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import embed_runtime.ops.weight_cache as cache\n"
        "cache.align_external_data = lambda *args, **kwargs: 0\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(site))
    if not _aligned_loads_fault():  # no aligned-load fault here: the copy answers right
        check_weight_cache(splade_dirs, print)
        return
    with pytest.raises(RuntimeError) as caught:
        check_weight_cache(splade_dirs, print)
    message = str(caught.value)
    assert message.startswith("sp_encode: the ONNX Runtime weight cache cannot serve this graph")
    assert "crashed (SIGSEGV)" in message and "ort_weight_cache = false" in message


def test_an_encoder_with_the_cache_off_is_named_in_the_build_log(splade, tmp_path) -> None:
    dirs = _build(splade, tmp_path, ort_weight_cache=False)
    lines: list[str] = []
    check_weight_cache(dirs, lines.append)
    assert lines == [
        "sp_encode: ONNX Runtime weight cache off (ort_weight_cache = false): "
        "each instance optimises and keeps its own copy of the weights"
    ]
