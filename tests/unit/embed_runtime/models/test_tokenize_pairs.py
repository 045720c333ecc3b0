"""The tokenize_pairs adapter (``embed_runtime/models/tokenize_pairs.py``) on a fake ``pb_utils``.

Expected tokens come from the tokenizers library on the same file, without cut or padding.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from embed_runtime.text.pair_template import PairTemplate
from tests.unit import fake_pb_utils as pb
from tests.unit.embed_runtime.models.helpers import (
    TOKEN_NAMES,
    TOKENIZE_PARAMS,
    _args,
    _error,
    load_adapter,
)

TEMPLATE = PairTemplate(("query : ", " document : ", " relevant ?"))


def _reference(tokenizer_json: Path) -> Tokenizer:
    reference = Tokenizer.from_file(str(tokenizer_json))
    reference.no_truncation()
    reference.no_padding()
    return reference


def _pairs_model(tmp_path: Path, tokenizer_json: Path, **params: str):
    (tmp_path / "1").mkdir()
    shutil.copy(tokenizer_json, tmp_path / "1" / "tokenizer.json")
    model = load_adapter("tokenize_pairs").TritonPythonModel()
    model.initialize(_args(tmp_path, {**TOKENIZE_PARAMS, **params}))
    return model


def _pair_request(*pairs: tuple[str, str], parameters: dict | None = None) -> pb.InferenceRequest:
    queries = np.array([[q.encode()] for q, _ in pairs], dtype=object).reshape(-1, 1)
    texts = np.array([[t.encode()] for _, t in pairs], dtype=object).reshape(-1, 1)
    return pb.InferenceRequest([pb.Tensor("QUERY", queries), pb.Tensor("TEXT", texts)], parameters)


def test_tokenize_pairs_answers_each_request_with_its_own_pairs(
    backend, tmp_path, tokenizer_json
) -> None:
    model = _pairs_model(tmp_path, tokenizer_json)
    reference = _reference(tokenizer_json)
    asked = [
        [("what is a cat", "a cat is a small furry animal that purrs")],
        [("dogs", "bark"), ("where do birds live", "in nests")],
    ]
    responses = model.execute([_pair_request(*pairs) for pairs in asked])
    assert len(responses) == 2
    for pairs, response in zip(asked, responses, strict=True):
        assert [t.name() for t in response.output_tensors()] == list(TOKEN_NAMES)
        want = [reference.encode(q, t) for q, t in pairs]
        width = max(len(w.ids) for w in want)
        assert response.output("input_ids").shape == (len(pairs), width)
        for row, encoding in enumerate(want):
            n = len(encoding.ids)
            assert response.output("input_ids")[row, :n].tolist() == encoding.ids
            assert response.output("token_type_ids")[row, :n].tolist() == encoding.type_ids
            assert response.output("attention_mask")[row].tolist() == [1] * n + [0] * (width - n)
    model.finalize()
    assert model.tokenizer is None


def test_tokenize_pairs_cuts_a_long_pair_at_max_length(backend, tmp_path, tokenizer_json):
    model = _pairs_model(tmp_path, tokenizer_json)
    (response,) = model.execute([_pair_request(("short query", "word " * 100))])
    ids = response.output("input_ids")
    assert ids.shape == (1, 32)
    assert ids[0, :4].tolist() == _reference(tokenizer_json).encode("short query", "x").ids[:4]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (
            pb.InferenceRequest(
                [
                    pb.Tensor("QUERY", np.array([[b"a"], [b"b"]], dtype=object)),
                    pb.Tensor("TEXT", np.array([[b"c"]], dtype=object)),
                ]
            ),
            "QUERY has 2 rows and TEXT 1: send one QUERY row per TEXT row",
        ),
        (_pair_request(("", "text")), "QUERY row 0 is empty"),
        (_pair_request(("query", "ok"), ("query", "   ")), "TEXT row 1 is empty"),
        (_pair_request(("q", "x" * 3000)), "TEXT row 0"),
        (_pair_request(("q", "t"), parameters={"truncation_direction": "left"}), "rerankers"),
    ],
)
def test_tokenize_pairs_bad_request_gets_invalid_arg_while_others_succeed(
    backend, tmp_path, tokenizer_json, bad, message
) -> None:
    model = _pairs_model(tmp_path, tokenizer_json)
    responses = model.execute([_pair_request(("q", "t")), bad, _pair_request(("a", "b"))])
    code, text = _error(responses[1])
    assert code == pb.TritonError.INVALID_ARG
    assert message in text
    assert not responses[0].has_error() and not responses[2].has_error()


def test_tokenize_pairs_missing_text_input_is_its_own_internal_error(
    backend, tmp_path, tokenizer_json
) -> None:
    model = _pairs_model(tmp_path, tokenizer_json)
    only_query = pb.InferenceRequest([pb.Tensor("QUERY", np.array([[b"q"]], dtype=object))])
    responses = model.execute([only_query, _pair_request(("q", "t"))])
    assert _error(responses[0]) == (pb.TritonError.INTERNAL, "input TEXT is missing")
    assert not responses[1].has_error()


def test_tokenize_pairs_with_a_pair_template_renders_it(backend, tmp_path, tokenizer_json):
    model = _pairs_model(
        tmp_path,
        tokenizer_json,
        pair_template=TEMPLATE.to_parameter(),
        output_names="input_ids,attention_mask",
    )
    (response,) = model.execute([_pair_request(("cats", "they purr"))])
    want = _reference(tokenizer_json).encode(
        TEMPLATE.render("cats", "they purr"), add_special_tokens=False
    )
    assert [t.name() for t in response.output_tensors()] == ["input_ids", "attention_mask"]
    assert response.output("input_ids")[0].tolist() == want.ids


def test_tokenize_pairs_initialize_fails_on_missing_parameter(backend, tmp_path, tokenizer_json):
    (tmp_path / "1").mkdir()
    shutil.copy(tokenizer_json, tmp_path / "1" / "tokenizer.json")
    params = {k: v for k, v in TOKENIZE_PARAMS.items() if k != "max_length"}
    with pytest.raises(ValueError, match="'max_length' is missing"):
        load_adapter("tokenize_pairs").TritonPythonModel().initialize(_args(tmp_path, params))
