"""The int8 precision knob served for real: quantised graph, parity with sentence-transformers."""

from __future__ import annotations

import numpy as np
import pytest

from tests.integration.conftest import INT8_MODEL, TEXT_MODEL
from tests.integration.text_helpers import cosines

pytestmark = pytest.mark.integration

# Served here (220 texts, one row per run, HTTP and gRPC alike): mean cosine 0.99280,
# min 0.97192 against sentence-transformers fp32. Floors: a little under each.
MIN_COSINE, MEAN_COSINE = 0.965, 0.990


def test_int8_model_is_a_quantized_graph(server):
    import onnx

    graph = onnx.load(str(server.repo / f"{INT8_MODEL}_encode" / "1" / "model.onnx")).graph
    ops = {node.op_type for node in graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops
    assert [o.type.tensor_type.elem_type for o in graph.output] == [onnx.TensorProto.FLOAT]


def test_int8_served_embeddings_stay_close_to_sentence_transformers(client, corpus, expected):
    got = client.embed_texts(INT8_MODEL, corpus)
    fp32 = client.embed_texts(TEXT_MODEL, corpus)
    assert got.shape == expected.shape and got.dtype == np.float32
    cos = cosines(got, expected)
    print(
        f"\n{client.protocol}: int8 served vs sentence-transformers fp32, {len(corpus)} texts: "
        f"mean cos {cos.mean():.5f}, min {cos.min():.5f}"
    )
    assert cos.min() >= MIN_COSINE
    assert cos.mean() >= MEAN_COSINE
    assert np.abs(got - fp32).max() > 1e-3, "int8 answers must come from the quantised graph"
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_int8_rows_run_alone_do_not_depend_on_their_batch(client, corpus):
    """Dynamic quantisation scales activations per run; one row per run keeps rows apart."""
    texts = corpus[:24]
    together = client.embed_texts(INT8_MODEL, texts)
    alone = np.concatenate([client.embed_texts(INT8_MODEL, [t]) for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-6)


def test_int8_nearest_neighbours_are_as_good_as_fp32(client, corpus, expected):
    """The neighbour int8 picks for each sentence is (nearly) as similar as fp32's pick."""
    got = client.embed_texts(INT8_MODEL, corpus[:120])
    truth = expected[:120] @ expected[:120].T
    np.fill_diagonal(truth, -np.inf)
    mine = got @ got.T
    np.fill_diagonal(mine, -np.inf)
    rows = np.arange(len(truth))
    loss = truth.max(axis=1) - truth[rows, mine.argmax(axis=1)]
    print(f"\nsimilarity lost by int8 neighbours: max {loss.max():.4f}, mean {loss.mean():.5f}")
    assert loss.max() <= 0.05
    assert loss.mean() <= 0.005
