"""The encoders' host weight cache: one optimised, memory-mapped copy of the packed weights."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import numpy as np
import pytest

from embed_runtime.engines.ort_encoder import EncoderParams, OrtEncoder
from embed_runtime.ops.weight_cache import (
    cached_model,
    host_key,
    private_dir,
    prune_cache,
    weight_cache_root,
)
from tests.unit.embed_runtime.engines.test_ort_encoder import (
    BASE,
    TABLE,
    _expected,
    _tokens,
    masked_mean_graph,
)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    (tmp_path / "model").mkdir()
    return masked_mean_graph(tmp_path / "model" / "model.onnx")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("EMBED_ORT_CACHE_DIR", str(root))
    return root


def _params(**overrides: str) -> EncoderParams:
    return EncoderParams.from_parameters({**BASE, **overrides})


def _mapped(path: str) -> bool:
    return path in Path("/proc/self/maps").read_text()


def test_cache_root_is_the_env_folder_or_a_private_temp_folder(tmp_path: Path) -> None:
    assert weight_cache_root({"EMBED_ORT_CACHE_DIR": str(tmp_path)}) == str(tmp_path)
    assert weight_cache_root({}).endswith(f"embed-ort-cache-{os.getuid()}")


def test_encoder_loads_the_cached_graph_and_maps_its_weights(model: Path, cache: Path) -> None:
    enc = OrtEncoder(str(model), _params())
    assert enc.cache_error == ""
    assert Path(enc.model_path).parent.parent == cache
    weights = str(Path(enc.model_path).with_name("weights.bin"))
    assert _mapped(weights), "the packed weights must be memory-mapped, not copied"
    req = _tokens([3, 6], np.random.default_rng(0))
    np.testing.assert_allclose(enc.encode_tokens([req])[0], _expected(req), rtol=1e-5, atol=1e-6)


def test_cached_graph_gives_bit_equal_outputs(model: Path, cache: Path) -> None:
    cached = OrtEncoder(str(model), _params())
    plain = OrtEncoder(str(model), _params(weight_cache="false"))
    assert plain.model_path == str(model) and cached.model_path != str(model)
    rng = np.random.default_rng(3)
    reqs = [_tokens([2, 9, 5], rng), _tokens([7], rng)]
    for a, b in zip(cached.encode_tokens(reqs), plain.encode_tokens(reqs), strict=True):
        np.testing.assert_array_equal(a, b)


def test_second_encoder_reuses_the_written_copy(model: Path, cache: Path) -> None:
    first = OrtEncoder(str(model), _params()).model_path
    stamp = os.stat(first).st_mtime_ns
    second = OrtEncoder(str(model), _params()).model_path
    assert second == first and os.stat(second).st_mtime_ns == stamp
    assert sorted(p.name for p in cache.iterdir() if p.is_dir()) == [Path(first).parent.name]


def test_key_follows_the_graph_level_and_bytes(model: Path, tmp_path: Path) -> None:
    key = host_key(str(model), "all")
    assert host_key(str(model), "all") == key
    assert host_key(str(model), "basic") != key
    other = masked_mean_graph(model.with_name("other.onnx"), TABLE + 1)
    assert host_key(str(other), "all") != key


def test_a_changed_graph_gets_its_own_copy(model: Path, cache: Path) -> None:
    first = OrtEncoder(str(model), _params())
    masked_mean_graph(model, TABLE * 2)  # same path, new weights
    second = OrtEncoder(str(model), _params())
    assert second.model_path != first.model_path
    req = _tokens([4], np.random.default_rng(1))
    np.testing.assert_allclose(
        second.encode_tokens([req])[0], 2 * _expected(req), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("mode", [0o777, 0o755, 0o770])
def test_a_folder_others_can_reach_is_refused_and_the_encoder_still_serves(
    model: Path, cache: Path, mode: int
) -> None:
    cache.mkdir()
    cache.chmod(mode)
    with pytest.raises(PermissionError, match="mode 0700"):
        private_dir(str(cache))
    enc = OrtEncoder(str(model), _params())
    assert "PermissionError" in enc.cache_error and enc.model_path == str(model)
    assert not any(cache.iterdir()), "nothing may be written into a shared folder"
    req = _tokens([5], np.random.default_rng(2))
    np.testing.assert_allclose(enc.encode_tokens([req])[0], _expected(req), rtol=1e-5, atol=1e-6)


def test_a_symlinked_cache_folder_is_refused(model: Path, tmp_path: Path, monkeypatch) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    monkeypatch.setenv("EMBED_ORT_CACHE_DIR", str(link))
    enc = OrtEncoder(str(model), _params())
    assert "PermissionError" in enc.cache_error and not any(real.iterdir())


def test_a_corrupt_cached_copy_is_rewritten_before_it_is_loaded(model: Path, cache: Path) -> None:
    path = Path(OrtEncoder(str(model), _params()).model_path)
    path.write_bytes(b"not a graph")
    enc = OrtEncoder(str(model), _params())
    assert enc.model_path == str(path) and not enc.cache_error
    assert "model.onnx is corrupt" in enc.cache_repairs[0]
    req = _tokens([3], np.random.default_rng(4))
    np.testing.assert_allclose(enc.encode_tokens([req])[0], _expected(req), rtol=1e-5, atol=1e-6)


def test_gpu_providers_never_use_the_cache(model: Path, cache: Path) -> None:
    try:  # a CPU build refuses the provider; a GPU build serves from the original graph
        assert OrtEncoder(str(model), _params(execution_provider="cuda")).model_path == str(model)
    except RuntimeError as exc:
        assert "onnxruntime-gpu" in str(exc) or "placed" in str(exc)
    assert not cache.exists()


def _build(args: tuple[str, str]) -> str:
    model, root = args
    return cached_model(model, "all", root)


def test_instances_starting_together_write_one_copy(model: Path, tmp_path: Path) -> None:
    root = str(tmp_path / "shared")
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        paths = pool.map(_build, [(str(model), root)] * 8)
    assert len(set(paths)) == 1
    leftovers = [p.name for p in Path(root).iterdir() if p.is_dir()]
    assert leftovers == [Path(paths[0]).parent.name], "no half-written folder may remain"


def test_copies_unused_for_a_week_are_pruned_by_the_next_write(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    old_model = masked_mean_graph(tmp_path / "old.onnx", TABLE + 3)
    old = Path(cached_model(str(old_model), "all", str(root))).parent
    recent = Path(cached_model(str(old_model), "basic", str(root))).parent
    crashed = root / f"{old.name}.abc123"  # a write that never finished
    crashed.mkdir()
    week_ago = time.time() - 8 * 86400
    for folder in (old, crashed):
        os.utime(folder, (week_ago, week_ago))
    new = Path(cached_model(str(masked_mean_graph(tmp_path / "new.onnx")), "all", str(root)))
    left = sorted(p.name for p in root.iterdir() if p.is_dir())
    assert left == sorted([recent.name, new.parent.name])
    assert prune_cache(str(root)) == []  # nothing else is old


def test_loading_a_copy_marks_it_used(model: Path, tmp_path: Path) -> None:
    root = tmp_path / "cache"
    folder = Path(cached_model(str(model), "all", str(root))).parent
    week_ago = time.time() - 8 * 86400
    os.utime(folder, (week_ago, week_ago))
    cached_model(str(model), "all", str(root))
    assert folder.stat().st_mtime > week_ago + 86400
    assert prune_cache(str(root)) == []
