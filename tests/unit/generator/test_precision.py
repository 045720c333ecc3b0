"""Precision knobs: int8 and fp16 graphs derived from a validated fp32 export."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from generator import precision
from generator.manifest import ManifestError, ModelEntry, parse_manifest
from generator.onnx_export import (
    ExportValidationError,
    GraphSpec,
    TensorSpec,
    export_module,
    validate_graph,
)

VOCAB, WIDTH, DIM = 64, 48, 16
SPEC = GraphSpec(
    inputs=(TensorSpec("input_ids", "int64", (-1,)),),
    outputs=(TensorSpec("EMBEDDING", "float32", (DIM,)),),
)


class TinyEncoder(torch.nn.Module):
    """Embedding, self-attention scores (activation x activation) and two dense layers."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.up = torch.nn.Linear(WIDTH, 4 * WIDTH)
        self.down = torch.nn.Linear(4 * WIDTH, DIM)

    def forward(self, input_ids):
        x = self.embed(input_ids)
        scores = torch.softmax(x @ x.transpose(1, 2) / WIDTH**0.5, dim=-1)
        x = scores @ x
        out = self.down(torch.nn.functional.gelu(self.up(x))).mean(dim=1)
        return torch.nn.functional.normalize(out, dim=1)


def _cases() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"input_ids": rng.integers(0, VOCAB, (n, w))} for n, w in ((1, 5), (3, 9), (6, 17))]


@pytest.fixture()
def fp32_graph(tmp_path: Path) -> tuple[Path, TinyEncoder]:
    module = TinyEncoder().eval()
    path = tmp_path / "model.onnx"
    sample = {"input_ids": torch.from_numpy(_cases()[-1]["input_ids"])}
    export_module(module, SPEC, sample, path)
    validate_graph(path, SPEC, module, _cases())
    return path, module


def _ops(path: Path) -> set[str]:
    return {node.op_type for node in onnx.load(str(path)).graph.node}


def _io_types(path: Path) -> set[int]:
    graph = onnx.load(str(path)).graph
    return {t.type.tensor_type.elem_type for t in (*graph.input, *graph.output)}


def test_fp32_leaves_the_graph_alone(fp32_graph) -> None:
    path, module = fp32_graph
    before = path.read_bytes()
    assert precision.apply_precision(path, "fp32", SPEC, module, _cases()) is None
    assert path.read_bytes() == before


def test_int8_quantizes_weight_products_only_and_keeps_parity(fp32_graph) -> None:
    path, module = fp32_graph
    fp32_nodes = precision.weight_nodes(onnx.load(str(path)))
    matmuls = [n for n in onnx.load(str(path)).graph.node if n.op_type in ("MatMul", "Gemm")]
    assert 0 < len(fp32_nodes) < len(matmuls)  # the two attention products are not weights
    report = precision.apply_precision(path, "int8", SPEC, module, _cases())
    ops = _ops(path)
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops
    assert "MatMul" in ops  # activation x activation products stay float
    assert _io_types(path) == {onnx.TensorProto.INT64, onnx.TensorProto.FLOAT}
    assert report is not None and report.cases == 3
    assert precision.PARITY["int8"][1] <= report.min_cosine < 1.0
    assert not list(path.parent.glob("*.int8.onnx"))


def test_fp16_halves_weights_keeps_float32_io_and_parity(fp32_graph) -> None:
    path, module = fp32_graph
    size = path.stat().st_size
    report = precision.apply_precision(path, "fp16", SPEC, module, _cases())
    model = onnx.load(str(path))
    weights = {t.data_type for t in model.graph.initializer if t.dims and len(t.dims) >= 2}
    assert weights == {onnx.TensorProto.FLOAT16}
    assert _io_types(path) == {onnx.TensorProto.INT64, onnx.TensorProto.FLOAT}
    assert path.stat().st_size < 0.6 * size
    assert report is not None and report.min_cosine >= precision.PARITY["fp16"][1]
    assert report.max_abs_diff > 0.0


def test_failed_parity_names_the_precision_and_keeps_the_fp32_graph(
    fp32_graph, monkeypatch
) -> None:
    path, module = fp32_graph
    before = path.read_bytes()
    monkeypatch.setitem(precision.PARITY, "int8", (1e-9, 0.999999999))
    with pytest.raises(ExportValidationError, match=r"int8: case \d: EMBEDDING"):
        precision.apply_precision(path, "int8", SPEC, module, _cases())
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.onnx"]


def test_unknown_precision_is_refused(fp32_graph) -> None:
    path, module = fp32_graph
    with pytest.raises(ValueError, match="precision must be one of"):
        precision.apply_precision(path, "bf16", SPEC, module, _cases())


# --- manifest rules -------------------------------------------------------------------

ST = {"name": "m", "family": "sentence-transformers", "source": "x"}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"precision": "int8", "device": "gpu"}, "precision 'int8' .* needs device 'cpu'"),
        ({"precision": "fp16"}, "precision 'fp16' needs device 'gpu'"),
    ],
)
def test_manifest_ties_precision_to_its_device(extra: dict, message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        parse_manifest({"models": [{**ST, **extra}]}, Path("."))


@pytest.mark.parametrize(
    ("extra", "graph"),
    [
        ({}, "fp32"),
        ({"precision": "int8"}, "int8"),
        ({"precision": "fp16", "device": "gpu"}, "fp16"),
        (
            {
                "precision": "fp16",
                "device": "gpu",
                "encoder_backend": "onnxruntime",
                "gpu_accelerator": "tensorrt",
            },
            "fp32",
        ),
    ],
)
def test_graph_precision(extra: dict, graph: str) -> None:
    entry = parse_manifest({"models": [{**ST, **extra}]}, Path(".")).models[0]
    assert isinstance(entry, ModelEntry)
    assert entry.graph_precision == graph
