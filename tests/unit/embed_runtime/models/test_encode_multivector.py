"""The encode_multivector adapter (``embed_runtime/models/encode_multivector.py``).

On the fake ``pb_utils``, from a model folder holding the MiniLM tokenizer file and a tiny
token-level graph (each token's vector is its row of a table, times its attention mask), so
every served vector is known: the table rows of the scored tokens.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Tokenizer

from embed_runtime.engines.contract import Engine
from embed_runtime.engines.multivector import (
    EMBEDDINGS,
    TOKEN_COUNT,
    MultiVectorParams,
    MultiVectorTextEncoder,
    TaskParams,
)
from tests.unit import fake_pb_utils as pb
from tests.unit.embed_runtime.models.helpers import (
    DIM,
    ENCODE_PARAMS,
    TABLE,
    TOKENIZE_PARAMS,
    _args,
    _error,
    _text_request,
    load_adapter,
)

CLS, SEP, MASK, COMMA = 101, 102, 103, 1010
SETTINGS = MultiVectorParams(
    query=TaskParams(max_length=8, expansion_length=8, expansion_id=MASK, expansion_attend=True),
    document=TaskParams(max_length=16, skip_ids=(COMMA,)),
)
PARAMS = {
    **ENCODE_PARAMS,
    **TOKENIZE_PARAMS,
    "output_names": "input_ids,attention_mask",
    "output_name": "token_embeddings",
    "ragged": "false",
    **SETTINGS.parameters(),
}


def token_graph(path: Path) -> Path:
    """``token_embeddings[b, t] = TABLE[input_ids[b, t]] * attention_mask[b, t]``."""
    ints = [
        helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])
        for n in ("input_ids", "attention_mask")
    ]
    out = helper.make_tensor_value_info(
        "token_embeddings", TensorProto.FLOAT, ["batch", "seq", DIM]
    )
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["emb"]),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "axis2"], ["mask3"]),
        helper.make_node("Mul", ["emb", "mask3"], ["token_embeddings"]),
    ]
    inits = [
        numpy_helper.from_array(TABLE, "table"),
        numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"),
    ]
    graph = helper.make_graph(nodes, "token_vectors", ints, [out], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def token_vectors_onnx(tmp_path_factory) -> Path:
    return token_graph(tmp_path_factory.mktemp("multivector") / "model.onnx")


@pytest.fixture
def multivector_model(backend, tmp_path: Path, tokenizer_json: Path, token_vectors_onnx: Path):
    (tmp_path / "1").mkdir()
    shutil.copy(tokenizer_json, tmp_path / "1" / "tokenizer.json")
    shutil.copy(token_vectors_onnx, tmp_path / "1" / "model.onnx")
    model = load_adapter("encode_multivector").TritonPythonModel()
    model.initialize(_args(tmp_path, PARAMS))
    yield model
    model.finalize()


def _ids(tokenizer_json: Path, text: str) -> list[int]:
    reference = Tokenizer.from_file(str(tokenizer_json))
    reference.no_truncation()
    reference.no_padding()
    return reference.encode(text).ids


def _query_vectors(tokenizer_json: Path, text: str) -> np.ndarray:
    ids = _ids(tokenizer_json, text)
    return TABLE[ids + [MASK] * (8 - len(ids))]  # expanded to 8, attended, all scored


def _document_vectors(tokenizer_json: Path, text: str) -> np.ndarray:
    return TABLE[[i for i in _ids(tokenizer_json, text) if i != COMMA]]  # skiplist dropped


def _assert_rows(response, want: list[np.ndarray]) -> None:
    assert not response.has_error(), response.error()
    assert [t.name() for t in response.output_tensors()] == [EMBEDDINGS, TOKEN_COUNT]
    embeddings, counts = response.output(EMBEDDINGS), response.output(TOKEN_COUNT)
    width = max(len(w) for w in want)
    assert embeddings.shape == (len(want), width, DIM) and embeddings.dtype == np.float32
    assert counts.tolist() == [[len(w)] for w in want]
    for row, vectors in enumerate(want):
        np.testing.assert_allclose(embeddings[row, : len(vectors)], vectors, rtol=1e-6)
        assert not embeddings[row, len(vectors) :].any()


def test_encode_multivector_answers_each_request_with_its_tasks_vectors(
    multivector_model, tokenizer_json
) -> None:
    documents = ["hello, world", "cats purr, dogs bark, birds sing"]
    responses = multivector_model.execute(
        [
            _text_request(*documents),
            _text_request("cats", parameters={"task": "query"}),
            _text_request("a short document", parameters={"task": "document"}),
        ]
    )
    _assert_rows(responses[0], [_document_vectors(tokenizer_json, d) for d in documents])
    _assert_rows(responses[1], [_query_vectors(tokenizer_json, "cats")])
    _assert_rows(responses[2], [_document_vectors(tokenizer_json, "a short document")])
    assert any("ONNX Runtime on" in m for level, m in pb.Logger.messages if level == "info")


def test_encode_multivector_bad_request_fails_alone(multivector_model) -> None:
    responses = multivector_model.execute(
        [
            _text_request("fine"),
            _text_request("x", parameters={"task": "passage"}),
            _text_request("x", parameters={"dimensions": 4}),
            _text_request("x", parameters={"truncation_direction": "left"}),
            _text_request(b""),
            _text_request("fine too", parameters={"task": "query"}),
        ]
    )
    assert all(_error(r)[0] == pb.TritonError.INVALID_ARG for r in responses[1:5])
    assert "task must be one of" in _error(responses[1])[1]
    assert _error(responses[2])[1] == "this model does not support dimensions"
    assert "not available for multi-vector models" in _error(responses[3])[1]
    assert not responses[0].has_error() and not responses[5].has_error()


def test_encode_multivector_initialize_needs_its_settings(backend, tmp_path, tokenizer_json):
    (tmp_path / "1").mkdir()
    shutil.copy(tokenizer_json, tmp_path / "1" / "tokenizer.json")
    token_graph(tmp_path / "1" / "model.onnx")
    params = {k: v for k, v in PARAMS.items() if k != "multi_vector"}
    with pytest.raises(ValueError, match="config parameter 'multi_vector' is missing"):
        load_adapter("encode_multivector").TritonPythonModel().initialize(_args(tmp_path, params))


def test_encode_multivector_runs_a_multivector_engine(multivector_model) -> None:
    assert isinstance(multivector_model.engine, MultiVectorTextEncoder)
    assert isinstance(multivector_model.engine, Engine)
