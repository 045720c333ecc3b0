"""The encode_sparse_router adapter (``embed_runtime/models/encode_sparse_router.py``).

On the fake ``pb_utils``, with the pieces of ``test_sparse_router``: the MiniLM tokenizer
file, a tiny masked-mean graph of non-negative weights as the document route, static
weights for queries.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from embed_runtime.engines.contract import Engine
from embed_runtime.engines.sparse import INDICES, VALUES, sparse_rows
from embed_runtime.engines.sparse_router import SparseRouter
from tests.unit import fake_pb_utils as pb
from tests.unit.embed_runtime.engines.test_ort_encoder import masked_mean_graph
from tests.unit.embed_runtime.engines.test_sparse_router import (
    DOCUMENT_PARAMS,
    DOCUMENT_TABLE,
    QUERY_PARAMS,
    WEIGHTS,
    _document_dense,
    _query_dense,
)
from tests.unit.embed_runtime.models.helpers import (
    ENCODE_PARAMS,
    _args,
    _assert_failure_spares_the_bad_request,
    _error,
    _text_request,
    load_adapter,
)

ROUTER_PARAMS = {
    **ENCODE_PARAMS,
    **QUERY_PARAMS,
    **DOCUMENT_PARAMS,  # last: the graph takes no token_type_ids
    "ragged": "false",
    "sparse": "true",
    "max_active_dims": "3",
    "query_weights_file": "weights.npy",
}


@pytest.fixture
def router_model(backend, tmp_path: Path, tokenizer_json: Path):
    version = tmp_path / "1"
    version.mkdir()
    masked_mean_graph(version / "model.onnx", DOCUMENT_TABLE)
    shutil.copy(tokenizer_json, version / "tokenizer.json")
    np.save(version / "weights.npy", WEIGHTS)
    model = load_adapter("encode_sparse_router").TritonPythonModel()
    model.initialize(_args(tmp_path, ROUTER_PARAMS))
    yield model
    model.finalize()


def _want(texts: list[str], task: str, k: int = 3) -> tuple[np.ndarray, np.ndarray]:
    dense = _query_dense if task == "query" else _document_dense
    return sparse_rows(np.stack([dense(t) for t in texts]), k)


def test_encode_sparse_router_answers_each_request_by_its_route(router_model) -> None:
    asked = [
        (["cats purr loudly", "dogs bark"], {}),
        (["cats and dogs"], {"task": "query"}),
        (["birds sing"], {"task": "document", "max_active_dims": 5}),
    ]
    responses = router_model.execute([_text_request(*t, parameters=p) for t, p in asked])
    assert len(responses) == 3
    for (texts, parameters), response in zip(asked, responses, strict=True):
        assert not response.has_error(), response.error()
        assert [t.name() for t in response.output_tensors()] == [INDICES, VALUES]
        indices, values = _want(
            texts, parameters.get("task", "document"), parameters.get("max_active_dims", 3)
        )
        np.testing.assert_array_equal(response.output(INDICES), indices)
        np.testing.assert_allclose(response.output(VALUES), values, rtol=1e-5, atol=1e-6)
    assert any("queries by static weights" in m for level, m in pb.Logger.messages)


def test_encode_sparse_router_bad_request_fails_alone(router_model) -> None:
    responses = router_model.execute(
        [
            _text_request("fine", parameters={"task": "query"}),
            _text_request("text", parameters={"task": "passage"}),
            _text_request("text", parameters={"task": "query", "dimensions": 2}),
            _text_request(b""),
            _text_request("also fine"),
        ]
    )
    for bad in responses[1:4]:
        assert _error(bad)[0] == pb.TritonError.INVALID_ARG
    assert "task must be one of" in _error(responses[1])[1]
    assert _error(responses[2])[1] == "this model does not support dimensions"
    np.testing.assert_array_equal(responses[0].output(INDICES), _want(["fine"], "query")[0])
    np.testing.assert_array_equal(responses[4].output(INDICES), _want(["also fine"], "d")[0])


def test_encode_sparse_router_failure_is_internal_for_every_valid_request(router_model) -> None:
    def broken(requests):
        raise RuntimeError("session died")

    router_model.engine.embed = broken
    responses = router_model.execute(
        [_text_request("a"), _text_request(b""), _text_request("b", parameters={"task": "query"})]
    )
    _assert_failure_spares_the_bad_request(responses)


def test_encode_sparse_router_runs_a_router_engine(router_model) -> None:
    assert isinstance(router_model.engine, SparseRouter)
    assert isinstance(router_model.engine, Engine)
