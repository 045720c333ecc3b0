"""``graph_fusion = "on"``: ONNX Runtime's transformer fusions, kept only when they hold.

A tiny BERT (``tests/st_factory.py``) is built with the fusions on: its graph must hold
the fused operators, answer as ``SentenceTransformer.encode`` down the served path
(length-sorted chunks, right padding), and the build log must say what was fused. A
model type without a known fusion is built unfused, with the reason in the log.
"""

from __future__ import annotations

from collections import Counter

import onnx
import pytest

from generator import precision
from tests.st_factory import VARIANTS, build_tiny_model, parity, parity_texts
from tests.unit.generator.families.built import export_variant

MIN_COSINE = 0.999999
MAX_ABS_DIFF = 1e-5


def _ops(exported) -> Counter:
    model = onnx.load(str(exported.work / "model.onnx"), load_external_data=False)
    return Counter(node.op_type for node in model.graph.node)


@pytest.fixture(scope="module")
def fused(tmp_path_factory):
    variant = VARIANTS[0]  # mean pooling + Normalize, as all-MiniLM-L6-v2
    base = tmp_path_factory.mktemp("fused")
    folder = build_tiny_model(variant, base / "model")
    return export_variant(variant, folder, base / "work", parity_texts(), graph_fusion="on")


def test_fused_graph_holds_the_fused_operators(fused):
    ops = _ops(fused)
    assert ops["Attention"] >= 1
    assert ops["SkipLayerNormalization"] >= 1
    assert ops["Softmax"] == 0  # every attention block fused


def test_fused_graph_answers_as_sentence_transformers_down_the_served_path(fused):
    got = fused.served(fused.serving_encoder())
    cos, diff = parity(got, fused.expected)
    assert cos >= MIN_COSINE
    assert diff <= MAX_ABS_DIFF


class _Entry:
    name = "m"
    graph_fusion = "on"
    gpu_accelerator = "none"


class _Config:
    model_type = "mpnet"
    num_attention_heads = 2
    hidden_size = 8


def test_a_model_type_without_a_known_fusion_stays_unfused_and_says_why(tmp_path):
    lines: list[str] = []
    graph = tmp_path / "model.onnx"
    graph.write_bytes(b"unchanged")
    assert not precision.fuse_graph(_Entry(), _Config(), graph, None, None, [], log=lines.append)
    assert graph.read_bytes() == b"unchanged"
    assert lines == ["m: graph_fusion: none known for model_type 'mpnet'; graph unfused"]


def test_off_and_tensorrt_leave_the_graph_alone(tmp_path):
    lines: list[str] = []
    entry = _Entry()
    entry.graph_fusion = "off"
    assert not precision.fuse_graph(entry, _Config(), tmp_path / "x", None, None, [], lines.append)
    entry.graph_fusion, entry.gpu_accelerator = "on", "tensorrt"
    assert not precision.fuse_graph(entry, _Config(), tmp_path / "x", None, None, [], lines.append)
    assert lines == []


def test_fusion_of_a_bert_config():
    class Bert:
        model_type, num_attention_heads, hidden_size = "bert", 12, 384

    assert precision.Fusion.of(Bert()) == precision.Fusion("bert", 12, 384)
    assert precision.Fusion.of(_Config()) is None


def test_a_fused_graph_that_misses_parity_is_not_kept_and_the_log_says_why(tmp_path, monkeypatch):
    """The other side of the gate: a fused graph whose answers differ stays unused."""
    from generator.onnx_export import ExportValidationError

    graph = tmp_path / "model.onnx"
    graph.write_bytes(b"validated fp32 graph")

    def fused(src, dst, *args, **kwargs):
        dst.write_bytes(b"fused graph")
        return {"Attention": 2}

    def refuse(path, *args, **kwargs):
        raise ExportValidationError(path, ["EMBEDDING max abs 0.3 > 1e-4"])

    monkeypatch.setattr(precision, "fuse_transformer", fused)
    monkeypatch.setattr(precision, "validate_graph", refuse)
    lines: list[str] = []

    class Bert(_Config):
        model_type = "bert"

    assert not precision.fuse_graph(_Entry(), Bert(), graph, None, None, [], lines.append)
    assert graph.read_bytes() == b"validated fp32 graph"
    assert not (tmp_path / "model.fused.onnx").exists()
    (line,) = lines
    assert line.startswith("m: graph_fusion: the fused graph was not kept (")
    assert "EMBEDDING max abs 0.3 > 1e-4" in line and line.endswith("graph unfused")
