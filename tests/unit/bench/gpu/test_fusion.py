"""The fusion study's helpers, on the CPU: batches cut to their own longest row, op counts."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from bench.gpu import fusion


def test_sorted_feeds_sort_by_length_and_cut_each_batch_to_its_longest_row():
    mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]], dtype=np.int64)
    arrays = {"input_ids": mask * 7, "attention_mask": mask}
    feeds = fusion.sorted_feeds(arrays, 2)
    assert [f["attention_mask"].shape for f in feeds] == [(2, 2), (2, 4)]
    assert feeds[0]["attention_mask"].sum(axis=1).tolist() == [1, 2]
    assert feeds[1]["attention_mask"].sum(axis=1).tolist() == [3, 4]


def test_op_counts_name_the_fused_operators_present(tmp_path):
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["y"]),
        helper.make_node("Softmax", ["y"], ["z"]),
        helper.make_node("MatMul", ["z", "w"], ["out"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 2])
    w = helper.make_tensor("w", TensorProto.FLOAT, [2, 2], [1.0, 0.0, 0.0, 1.0])
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", [x], [out], [w])), str(path))
    assert fusion.op_counts(path) == {"nodes": 3, "MatMul": 2, "Softmax": 1}
