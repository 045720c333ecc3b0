"""The tokenize adapter (``embed_runtime/models/tokenize.py``) on a fake ``pb_utils``."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from embed_runtime.text.tokenizer import BatchTokenizer, TokenizerParams
from tests.unit import fake_pb_utils as pb
from tests.unit.embed_runtime.models.helpers import (
    BAD_TEXT_REQUESTS,
    REQUEST_TEXTS,
    TOKEN_NAMES,
    TOKENIZE_PARAMS,
    _args,
    _assert_initialize_refuses_without,
    _error,
    _text_request,
    load_adapter,
)


def test_tokenize_returns_one_response_per_request_in_order(tokenize_model, tokenizer_json):
    reference = BatchTokenizer(
        str(tokenizer_json), TokenizerParams.from_parameters(TOKENIZE_PARAMS)
    )
    responses = tokenize_model.execute([_text_request(*texts) for texts in REQUEST_TEXTS])
    assert len(responses) == len(REQUEST_TEXTS)
    for texts, response in zip(REQUEST_TEXTS, responses, strict=True):
        assert not response.has_error()
        assert [t.name() for t in response.output_tensors()] == list(TOKEN_NAMES)
        alone = reference.encode(texts)
        for name in TOKEN_NAMES:
            assert response.output(name).dtype == np.int64
            np.testing.assert_array_equal(response.output(name), alone[name])


def test_tokenize_trims_each_request_to_its_own_longest_row(tokenize_model) -> None:
    long_text = "many words " * 20
    responses = tokenize_model.execute(
        [_text_request("hi"), _text_request(long_text), _text_request("hi", "hello there")]
    )
    widths = [r.output("input_ids").shape[1] for r in responses]
    assert widths[0] == 3  # [CLS] hi [SEP]
    assert widths[1] == 32  # truncated at max_length
    assert widths[2] == 4  # [CLS] hello there [SEP]
    for response in responses:
        mask = response.output("attention_mask")
        assert mask.shape == response.output("input_ids").shape
        assert mask.sum(axis=1).max() == mask.shape[1]


@pytest.mark.parametrize("case", sorted(BAD_TEXT_REQUESTS))
def test_tokenize_bad_request_gets_invalid_arg_while_others_succeed(tokenize_model, case):
    bad, message = BAD_TEXT_REQUESTS[case]
    good_before, good_after = _text_request("first good"), _text_request("second", "good")
    responses = tokenize_model.execute([good_before, bad, good_after])
    assert len(responses) == 3
    code, text = _error(responses[1])
    assert code == pb.TritonError.INVALID_ARG
    assert text.startswith(message)
    assert responses[0].output("input_ids").shape == (1, 4)
    assert responses[2].output("input_ids").shape[0] == 2
    assert not responses[0].has_error() and not responses[2].has_error()


def test_tokenize_request_missing_text_input_gets_its_own_error(tokenize_model) -> None:
    # Triton rejects a request lacking a required input before execute(), so reaching
    # the adapter without TEXT means config and adapter disagree: a server-side INTERNAL.
    responses = tokenize_model.execute([pb.InferenceRequest([]), _text_request("fine")])
    assert _error(responses[0]) == (pb.TritonError.INTERNAL, "input TEXT is missing")
    assert not responses[1].has_error()


def test_tokenize_answers_every_request_when_all_are_bad(tokenize_model) -> None:
    responses = tokenize_model.execute([_text_request(b""), _text_request(b"\xff")])
    assert [_error(r)[0] for r in responses] == [pb.TritonError.INVALID_ARG] * 2


def test_tokenize_failure_gives_every_valid_request_an_internal_error(tokenize_model) -> None:
    def broken(texts, keep_end=None):
        raise RuntimeError("tokenizer exploded")

    tokenize_model.tokenizer.encode = broken
    responses = tokenize_model.execute(
        [_text_request("fine"), _text_request(b""), _text_request("ok")]
    )
    assert _error(responses[0]) == (
        pb.TritonError.INTERNAL,
        "internal error (RuntimeError); see the server log",
    )
    assert _error(responses[2])[0] == pb.TritonError.INTERNAL
    assert _error(responses[1])[0] == pb.TritonError.INVALID_ARG
    errors = [m for level, m in pb.Logger.messages if level == "error"]
    assert any("tokenizer exploded" in m for m in errors)


def test_tokenize_initialize_fails_on_missing_parameter(backend, tmp_path, tokenizer_json):
    _assert_initialize_refuses_without(
        "tokenize", tmp_path, TOKENIZE_PARAMS, "max_length", tokenizer_json
    )


def test_tokenize_before_a_float32_only_encoder_refuses_other_precisions(
    backend, tmp_path, tokenizer_json
) -> None:
    """Triton's native backend answers EMBEDDING alone: the tokenize step refuses the
    parameter for it, so a request is never silently answered in float32."""
    (tmp_path / "1").mkdir()
    shutil.copy(tokenizer_json, tmp_path / "1" / "tokenizer.json")
    model = load_adapter("tokenize").TritonPythonModel()
    model.initialize(_args(tmp_path, {**TOKENIZE_PARAMS, "float32_only": "true"}))
    rows = np.array([[b"fine"]], dtype=object)

    def request(parameters):
        return pb.InferenceRequest([pb.Tensor("TEXT", rows)], parameters=parameters)

    responses = model.execute(
        [request({"precision": "int8"}), request({"precision": "float32"}), request(None)]
    )
    code, message = _error(responses[0])
    assert code == pb.TritonError.INVALID_ARG
    assert "does not offer precision 'int8'; it offers float32" in message
    assert not responses[1].has_error() and not responses[2].has_error()
    plain = load_adapter("tokenize").TritonPythonModel()  # without the flag: the encoder decides
    plain.initialize(_args(tmp_path, TOKENIZE_PARAMS))
    assert not plain.execute([request({"precision": "int8"})])[0].has_error()


def test_tokenize_cleans_as_open_clip_and_refuses_an_unmatchable_row_alone(
    backend, tmp_path, tokenizer_json
):
    """``text_clean`` runs before the tokenizer; a refused row fails its request only."""
    (tmp_path / "1").mkdir()
    shutil.copy(tokenizer_json, tmp_path / "1" / "tokenizer.json")
    clean = {"text_clean": "_clean_lower", "refused_code_points": "558"}
    model = load_adapter("tokenize").TritonPythonModel()
    model.initialize(_args(tmp_path, {**TOKENIZE_PARAMS, **clean}))
    reference = BatchTokenizer(
        str(tokenizer_json), TokenizerParams.from_parameters(TOKENIZE_PARAMS)
    )
    good = _text_request("Caf&eacute; &amp;amp; cafÃ©", "&#233;t&#xe9;")
    responses = model.execute([good, _text_request("fine", "a\u0558b"), _text_request("x")])
    want = reference.encode(["café & café", "été"])["input_ids"]
    np.testing.assert_array_equal(responses[0].output("input_ids"), want)
    code, message = _error(responses[1])
    assert code == pb.TritonError.INVALID_ARG
    assert message.startswith("TEXT row 1 holds U+0558") and "so it is refused" in message
    assert not responses[2].has_error()
    model.finalize()
