"""The weight cache's copy keeps every blob aligned: the SPLADE crash, reduced and fixed.

ONNX Runtime writes the cached copy's weights file with its blobs back to back and later
runs MLAS's SGEMM on the pre-packed blobs where the file is mapped, with aligned AVX loads
(``vmovaps``). One initializer whose size is not a multiple of 32 bytes (SPLADE's decoder
bias, 30,522 floats) put every later pre-packed MatMul weight 8 bytes off: SIGSEGV at the
first run, at every optimisation level. The reduced graph here has the same shape of
problem: a 258-float bias written before two MatMul weights.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper, save_model

from embed_runtime.ops.external_data import (
    align_external_data,
    edit_external_data,
    misaligned_blobs,
)
from embed_runtime.ops.weight_cache import cached_model, check_cached_copy, compare_cached_copy

ROWS, HIDDEN, ODD = 3, 64, 258  # 258 floats: 1032 bytes, external and 8 bytes off 32


def odd_bias_graph(path: Path) -> Path:
    """Y = relu(X @ W1 + b) @ W2 with ``b`` (1032 bytes) first among the initializers."""
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", HIDDEN])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", HIDDEN])
    nodes = [
        helper.make_node("MatMul", ["X", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["Y"]),
    ]
    inits = [
        numpy_helper.from_array(rng.standard_normal(ODD).astype(np.float32), "b"),
        numpy_helper.from_array(rng.standard_normal((HIDDEN, ODD)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal((ODD, HIDDEN)).astype(np.float32), "w2"),
    ]
    graph = helper.make_graph(nodes, "odd_bias", [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    save_model(model, str(path))
    return path


def _ort_copy(model: Path, folder: Path) -> Path:
    """The optimised copy exactly as ONNX Runtime writes it for the cache (no re-layout)."""
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(folder / "model.onnx")
    for name, value in (
        ("session.optimized_model_external_initializers_file_name", "weights.bin"),
        ("session.optimized_model_external_initializers_min_size_in_bytes", "1024"),
        ("session.save_external_prepacked_constant_initializers", "1"),
    ):
        options.add_session_config_entry(name, value)
    ort.InferenceSession(str(model), sess_options=options, providers=["CPUExecutionProvider"])
    return folder / "model.onnx"


def _aligned_loads_fault() -> bool:
    """x86-64 with AVX: MLAS's SGEMM kernels load packed B with vmovaps, which faults."""
    flags = Path("/proc/cpuinfo").read_text() if os.path.exists("/proc/cpuinfo") else ""
    return platform.machine() in ("x86_64", "AMD64") and " avx" in flags


@pytest.fixture
def graph(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    return odd_bias_graph(tmp_path / "src" / "model.onnx")


@pytest.fixture
def unaligned_cache(tmp_path: Path, monkeypatch) -> dict[str, str]:
    """An environment whose Python runs the cache as before the fix (no re-layout)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import embed_runtime.ops.weight_cache as cache\n"
        "cache.align_external_data = lambda *args, **kwargs: 0\n"
    )
    root = str(Path(__file__).resolve().parents[3])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), root]))
    return dict(os.environ)


def test_onnx_runtime_writes_blobs_unaligned_and_the_cache_moves_them(graph, tmp_path) -> None:
    (tmp_path / "raw").mkdir()
    raw = _ort_copy(graph, tmp_path / "raw")
    off = misaligned_blobs(str(raw))
    assert off and all(offset % 32 for offset, _ in off), off  # what ORT wrote: 8 bytes off
    assert align_external_data(str(raw), "weights.bin") == len(off)
    assert misaligned_blobs(str(raw)) == []
    assert align_external_data(str(raw), "weights.bin") == 0  # already aligned: untouched
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    copy = cached_model(str(graph), "all", root=str(root))
    assert misaligned_blobs(copy) == []


def test_the_aligned_copy_answers_bit_equal(graph, tmp_path) -> None:
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    copy = cached_model(str(graph), "all", root=str(root))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    feeds = {"X": np.random.default_rng(1).standard_normal((ROWS, HIDDEN)).astype(np.float32)}
    got = ort.InferenceSession(copy, options, providers=["CPUExecutionProvider"]).run(None, feeds)
    want = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_array_equal(got[0], want[0])
    assert compare_cached_copy(str(graph), "all") == ""


def test_the_wire_edit_rewrites_nothing_else(graph, tmp_path) -> None:
    (tmp_path / "raw").mkdir()
    model = _ort_copy(graph, tmp_path / "raw").read_bytes()
    assert edit_external_data(model, lambda entries: entries) == model
    seen: list[list[tuple[str, str]]] = []
    edit_external_data(model, lambda entries: seen.append(entries) or entries)
    keys = {key for entries in seen for key, _ in entries}
    assert {"location", "offset", "length"} <= keys
    assert any(key.startswith("prepacked") for key in keys), keys  # pre-packs moved too


def test_the_check_reports_the_crash_of_an_unaligned_copy(graph, unaligned_cache) -> None:
    """Before the fix the child dies on the first MatMul; the check names the signal."""
    problem = check_cached_copy(str(graph), "all")
    if _aligned_loads_fault():
        assert "ONNX Runtime crashed (SIGSEGV) running the cached copy" in problem, problem
    else:  # no aligned-load fault on this CPU: the unaligned copy still has to answer right
        assert problem == "" or "crashed" in problem, problem


def test_the_fixed_cache_runs_in_a_child_as_the_build_runs_it(graph) -> None:
    assert check_cached_copy(str(graph), "all") == ""
    assert check_cached_copy(str(graph), "disable") == ""


def test_the_child_crash_seen_directly(graph, unaligned_cache, tmp_path) -> None:
    """The reduced reproduction as a plain script: the unaligned copy ends the process."""
    code = (
        "import sys, numpy as np, onnxruntime as ort\n"
        "from embed_runtime.ops.weight_cache import cached_model\n"
        "copy = cached_model(sys.argv[1], 'all', root=sys.argv[2])\n"
        "x = np.ones((3, 64), np.float32)\n"
        "ort.InferenceSession(copy, providers=['CPUExecutionProvider']).run(None, {'X': x})\n"
        "print('ran')\n"
    )
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    done = subprocess.run(
        [sys.executable, "-c", code, str(graph), str(root)],
        env=unaligned_cache,
        capture_output=True,
        text=True,
        check=False,
    )
    if _aligned_loads_fault():
        assert done.returncode == -11, (done.returncode, done.stderr[-2000:])
    else:
        assert done.returncode in (0, -11), done.stderr[-2000:]
