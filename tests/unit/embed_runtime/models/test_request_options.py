"""The tokenize and encode adapters with ``prompt_name`` / ``dimensions`` request parameters."""

from __future__ import annotations

import json
import shutil

import numpy as np

from tests.unit import fake_pb_utils as pb
from tests.unit.embed_runtime.models import test_adapters
from tests.unit.embed_runtime.models.test_adapters import (
    TOKENIZE_PARAMS,
    _args,
    _encode_model,
    _error,
    load_adapter,
)

backend = test_adapters.backend
tokenizer_json = test_adapters.tokenizer_json
token_onnx = test_adapters.token_onnx

PROMPTS = {"query": "query: ", "passage": "passage: "}


def _request(parameters: dict, *texts: str) -> pb.InferenceRequest:
    rows = np.array([[t.encode()] for t in texts], dtype=object)
    return pb.InferenceRequest([pb.Tensor("TEXT", rows)], parameters)


def _tokenizer(tmp_path, tokenizer_json, **params):
    (tmp_path / "1").mkdir()
    shutil.copy(tokenizer_json, tmp_path / "1" / "tokenizer.json")
    model = load_adapter("tokenize").TritonPythonModel()
    model.initialize(_args(tmp_path, {**TOKENIZE_PARAMS, **params}))
    return model


def test_tokenize_prepends_the_chosen_or_default_prompt(backend, tmp_path, tokenizer_json):
    model = _tokenizer(
        tmp_path,
        tokenizer_json,
        prompts=json.dumps(PROMPTS),
        default_prompt_name="query",
        max_dimensions="8",
    )
    requests = [
        _request({}, "hello"),
        _request({"prompt_name": "passage"}, "hello"),
        _request({"prompt_name": "nope"}, "hello"),
        _request({"dimensions": 9}, "hello"),
        _request({"dimensions": 4, "prompt_name": "query"}, "hello"),
    ]
    responses = model.execute(requests)
    ids = [r.output_tensors()[0].as_numpy()[0].tolist() for r in responses if not r.has_error()]
    want = [model.tokenizer.encode([t])["input_ids"][0].tolist() for t in ("query: hello",)]
    passage = model.tokenizer.encode(["passage: hello"])["input_ids"][0].tolist()
    assert ids == [want[0], passage, want[0]]
    assert _error(responses[2]) == (
        pb.TritonError.INVALID_ARG,
        "unknown prompt_name 'nope'; this model's prompts: ['passage', 'query']",
    )
    assert _error(responses[3]) == (
        pb.TritonError.INVALID_ARG,
        "dimensions must be within [1, 8], got 9",
    )


def test_tokenize_byte_cap_applies_to_the_text_without_prompt(backend, tmp_path, tokenizer_json):
    model = _tokenizer(
        tmp_path, tokenizer_json, prompts=json.dumps({"long": "p" * 100}), max_text_bytes="64"
    )
    responses = model.execute([_request({"prompt_name": "long"}, "a" * 64), _request({}, "a" * 65)])
    assert not responses[0].has_error()
    assert _error(responses[1])[0] == pb.TritonError.INVALID_ARG


def test_encode_truncates_per_request_in_one_run(backend, tmp_path, token_onnx):
    model = _encode_model(tmp_path, token_onnx, max_dimensions="8", normalize="true")
    arrays = {
        "input_ids": np.array([[101, 7592, 102]], dtype=np.int64),
        "attention_mask": np.ones((1, 3), dtype=np.int64),
    }

    def req(parameters):
        return pb.InferenceRequest([pb.Tensor(n, a) for n, a in arrays.items()], parameters)

    full, four, bad = model.execute([req({}), req({"dimensions": 4}), req({"dimensions": 3.5})])
    full = full.output_tensors()[0].as_numpy()
    four = four.output_tensors()[0].as_numpy()
    assert full.shape == (1, 8) and four.shape == (1, 4)
    want = full[:, :4] / np.linalg.norm(full[:, :4], axis=1, keepdims=True)
    np.testing.assert_allclose(four, want, rtol=1e-6)
    assert _error(bad) == (pb.TritonError.INVALID_ARG, "dimensions must be an integer, got 3.5")
    model.finalize()


def test_encode_without_max_dimensions_refuses_dimensions(backend, tmp_path, token_onnx):
    model = _encode_model(tmp_path, token_onnx)
    arrays = {
        "input_ids": np.array([[101, 102]], dtype=np.int64),
        "attention_mask": np.ones((1, 2), dtype=np.int64),
    }
    request = pb.InferenceRequest([pb.Tensor(n, a) for n, a in arrays.items()], {"dimensions": 2})
    (response,) = model.execute([request])
    assert _error(response) == (
        pb.TritonError.INVALID_ARG,
        "this model does not support dimensions",
    )
    model.finalize()
