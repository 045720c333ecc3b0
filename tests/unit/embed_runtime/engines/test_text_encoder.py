"""The encode adapter with ``fused_tokenize``: ``TEXT`` in, embeddings out, in one stub."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from embed_runtime.engines.text_encoder import TextEncoder
from tests.unit import fake_pb_utils as pb
from tests.unit.embed_runtime.models import helpers
from tests.unit.embed_runtime.models.helpers import (
    BAD_TEXT_REQUESTS,
    ENCODE_PARAMS,
    LONG_PROMPT_PARAMS,
    OPTION_PARAMS,
    REQUEST_TEXTS,
    TOKENIZE_PARAMS,
    _args,
    _assert_byte_cap_excludes_the_prompt,
    _assert_initialize_refuses_without,
    _error,
    _execute_options,
    _expected_mean,
    _text_request,
    load_adapter,
)

backend = helpers.backend
tokenizer_json = helpers.tokenizer_json
token_onnx = helpers.token_onnx

GRAPH_INPUTS = "input_ids,attention_mask"  # the test graph's inputs: what the tokenizer emits
FUSED_PARAMS = {
    **ENCODE_PARAMS,
    **TOKENIZE_PARAMS,
    "output_names": GRAPH_INPUTS,
    "ragged": "false",
    "fused_tokenize": "true",
}


def _fused(tmp_path: Path, token_onnx: Path, tokenizer_json: Path, **params: str):
    (tmp_path / "1").mkdir(parents=True, exist_ok=True)
    shutil.copy(token_onnx, tmp_path / "1" / "model.onnx")
    shutil.copy(tokenizer_json, tmp_path / "1" / "tokenizer.json")
    model = load_adapter("encode").TritonPythonModel()
    model.initialize(_args(tmp_path, {**FUSED_PARAMS, **params}))
    return model


@pytest.fixture
def fused_model(backend, tmp_path: Path, token_onnx: Path, tokenizer_json: Path):
    model = _fused(tmp_path, token_onnx, tokenizer_json)
    yield model
    model.finalize()


def _split_pipeline(backend, tmp_path: Path, token_onnx: Path, tokenizer_json: Path):
    """The shipped two-step path: the tokenize adapter, then the ragged encode adapter."""
    tok_dir, enc_dir = tmp_path / "tok", tmp_path / "enc"
    for folder, src, name in (
        (tok_dir, tokenizer_json, "tokenizer.json"),
        (enc_dir, token_onnx, "model.onnx"),
    ):
        (folder / "1").mkdir(parents=True)
        shutil.copy(src, folder / "1" / name)
    tokenize = load_adapter("tokenize").TritonPythonModel()
    tokenize.initialize(_args(tok_dir, {**TOKENIZE_PARAMS, "output_names": GRAPH_INPUTS}))
    encode = load_adapter("encode").TritonPythonModel()
    encode.initialize(_args(enc_dir, ENCODE_PARAMS))

    def run(requests):
        tokens = tokenize.execute(requests)
        names = GRAPH_INPUTS.split(",")
        token_requests = [
            pb.InferenceRequest([pb.Tensor(n, t.output(n)) for n in names]) for t in tokens
        ]
        return encode.execute(token_requests)

    return run


def test_fused_encode_equals_tokenize_then_encode_per_request_in_order(
    backend, tmp_path, token_onnx, tokenizer_json
) -> None:
    fused = _fused(tmp_path / "fused", token_onnx, tokenizer_json)
    split = _split_pipeline(backend, tmp_path, token_onnx, tokenizer_json)
    requests = [_text_request(*texts) for texts in REQUEST_TEXTS]
    got, want = fused.execute(requests), split(requests)
    assert len(got) == len(REQUEST_TEXTS)
    for texts, g, w in zip(REQUEST_TEXTS, got, want, strict=True):
        assert [t.name() for t in g.output_tensors()] == ["EMBEDDING"]
        out = g.output("EMBEDDING")
        assert out.dtype == np.float32 and out.shape == (len(texts), helpers.DIM)
        np.testing.assert_allclose(out, w.output("EMBEDDING"), rtol=1e-5, atol=1e-6)
        tokens = fused.engine.tokenizer.encode(texts)
        np.testing.assert_allclose(out, _expected_mean(tokens), rtol=1e-5, atol=1e-6)
    fused.finalize()


def test_fused_encode_tokenizes_and_runs_each_execution_once(fused_model) -> None:
    calls = {"tokenize": [], "encode": []}
    tokenize, encode = fused_model.engine.tokenizer.encode, fused_model.encoder.encode_tokens

    def counting_tokenize(texts, keep_end=None):
        calls["tokenize"].append(len(texts))
        return tokenize(texts, keep_end)

    def counting_encode(requests):
        calls["encode"].append([len(r["input_ids"]) for r in requests])
        return encode(requests)

    fused_model.engine.tokenizer.encode = counting_tokenize
    fused_model.encoder.encode_tokens = counting_encode
    responses = fused_model.execute([_text_request(*texts) for texts in REQUEST_TEXTS])
    assert not any(r.has_error() for r in responses)
    assert calls == {"tokenize": [6], "encode": [[6]]}


@pytest.mark.parametrize("case", sorted(BAD_TEXT_REQUESTS))
def test_fused_bad_request_gets_the_tokenizers_invalid_arg_while_others_succeed(
    fused_model, case
) -> None:
    bad, message = BAD_TEXT_REQUESTS[case]
    good_before, good_after = _text_request("first good"), _text_request("second", "good")
    responses = fused_model.execute([good_before, bad, good_after])
    code, text = _error(responses[1])
    assert code == pb.TritonError.INVALID_ARG
    assert text.startswith(message)
    assert responses[0].output("EMBEDDING").shape == (1, helpers.DIM)
    assert responses[2].output("EMBEDDING").shape == (2, helpers.DIM)


def test_fused_byte_caps_refuse_their_request_alone(fused_model) -> None:
    responses = fused_model.execute(
        [
            _text_request("a" * 2049),
            _text_request("fine"),
            _text_request(*["b" * 2000] * 3),
            _text_request("a" * 2048),
        ]
    )
    assert _error(responses[0]) == (
        pb.TritonError.INVALID_ARG,
        "TEXT row 0 is 2049 bytes, over this model's max_text_bytes=2048",
    )
    assert _error(responses[2]) == (
        pb.TritonError.INVALID_ARG,
        "TEXT rows total 6000 bytes, over this model's max_request_text_bytes=4096",
    )
    assert not responses[1].has_error() and not responses[3].has_error()


def test_fused_prompts_and_dimensions_apply_per_request_in_one_execution(
    backend, tmp_path, token_onnx, tokenizer_json
) -> None:
    model = _fused(tmp_path, token_onnx, tokenizer_json, **OPTION_PARAMS, normalize="true")
    responses = _execute_options(model)
    tokens = model.engine.tokenizer.encode
    query, passage = (
        _expected_mean(tokens(["query: hello"])),
        _expected_mean(tokens(["passage: hello"])),
    )
    np.testing.assert_allclose(responses[0].output("EMBEDDING"), query, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(responses[1].output("EMBEDDING"), passage, rtol=1e-5, atol=1e-6)
    four = query[:, :4] / np.linalg.norm(query[:, :4], axis=1, keepdims=True)
    np.testing.assert_allclose(responses[4].output("EMBEDDING"), four, rtol=1e-5, atol=1e-6)
    model.finalize()


def test_fused_byte_cap_applies_to_the_text_without_its_prompt(
    backend, tmp_path, token_onnx, tokenizer_json
) -> None:
    model = _fused(tmp_path, token_onnx, tokenizer_json, **LONG_PROMPT_PARAMS)
    _assert_byte_cap_excludes_the_prompt(model)
    model.finalize()


def test_fused_without_max_dimensions_refuses_dimensions(fused_model) -> None:
    (response,) = fused_model.execute([_text_request("hello", parameters={"dimensions": 2})])
    assert _error(response) == (
        pb.TritonError.INVALID_ARG,
        "this model does not support dimensions",
    )


def test_fused_failing_run_is_retried_so_only_the_failing_request_errs(fused_model) -> None:
    tokenize = fused_model.engine.tokenizer.encode

    def poisoned(texts, keep_end=None):
        if "poison" in texts:
            raise RuntimeError("tokenizer exploded")
        return tokenize(texts, keep_end)

    fused_model.engine.tokenizer.encode = poisoned
    responses = fused_model.execute(
        [_text_request("fine"), _text_request("poison"), _text_request(b""), _text_request("ok")]
    )
    assert _error(responses[1]) == (
        pb.TritonError.INTERNAL,
        "internal error (RuntimeError); see the server log",
    )
    assert _error(responses[2])[0] == pb.TritonError.INVALID_ARG
    assert not responses[0].has_error() and not responses[3].has_error()
    assert any("tokenizer exploded" in m for level, m in pb.Logger.messages if level == "error")


def test_fused_request_without_text_gets_its_own_error(fused_model) -> None:
    responses = fused_model.execute([pb.InferenceRequest([]), _text_request("fine")])
    assert _error(responses[0]) == (pb.TritonError.INTERNAL, "input TEXT is missing")
    assert not responses[1].has_error()


def test_fused_initialize_fails_on_a_missing_tokenizer_parameter(
    backend, tmp_path, token_onnx, tokenizer_json
) -> None:
    _assert_initialize_refuses_without(
        "encode", tmp_path, FUSED_PARAMS, "max_length", token_onnx, tokenizer_json
    )


def test_encoder_without_the_knob_still_takes_token_tensors(
    fused_model, backend, tmp_path, token_onnx
) -> None:
    (tmp_path / "split").mkdir()
    split = helpers._encode_model(tmp_path / "split", token_onnx)
    assert not isinstance(split.engine, TextEncoder)
    tokens = fused_model.engine.tokenizer.encode(["hello world"])
    (response,) = split.execute([pb.InferenceRequest([pb.Tensor(n, a) for n, a in tokens.items()])])
    np.testing.assert_allclose(
        response.output("EMBEDDING"), _expected_mean(tokens), rtol=1e-5, atol=1e-6
    )
    split.finalize()


def test_fused_encode_cleans_like_the_tokenize_step_and_refuses_a_row_alone(
    backend, tmp_path, token_onnx, tokenizer_json
) -> None:
    """``text_clean`` applies on the fused path too (CLIP builds a tokenize step today)."""
    clean = {"text_clean": "_clean_lower", "refused_code_points": "558"}
    fused = _fused(tmp_path, token_onnx, tokenizer_json, **clean)
    requests = [_text_request("Caf&eacute; cafÃ©"), _text_request("a\u0558b"), _text_request("x")]
    got = fused.execute(requests)
    tokens = fused.engine.tokenizer.encode(["café café"])
    np.testing.assert_allclose(got[0].output("EMBEDDING"), _expected_mean(tokens), atol=1e-6)
    code, message = _error(got[1])
    assert code == pb.TritonError.INVALID_ARG and message.startswith("TEXT row 0 holds U+0558")
    assert not got[2].has_error()
    fused.finalize()
