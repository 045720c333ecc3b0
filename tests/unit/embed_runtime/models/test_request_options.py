"""The tokenize and encode adapters with ``prompt_name`` / ``dimensions`` request parameters."""

from __future__ import annotations

import shutil

import numpy as np

from tests.unit import fake_pb_utils as pb
from tests.unit.embed_runtime.models import helpers
from tests.unit.embed_runtime.models.helpers import (
    LONG_PROMPT_PARAMS,
    OPTION_PARAMS,
    TOKENIZE_PARAMS,
    _args,
    _assert_byte_cap_excludes_the_prompt,
    _encode_model,
    _error,
    _execute_options,
    load_adapter,
)

backend = helpers.backend
tokenizer_json = helpers.tokenizer_json
token_onnx = helpers.token_onnx


def _tokenizer(tmp_path, tokenizer_json, **params):
    (tmp_path / "1").mkdir()
    shutil.copy(tokenizer_json, tmp_path / "1" / "tokenizer.json")
    model = load_adapter("tokenize").TritonPythonModel()
    model.initialize(_args(tmp_path, {**TOKENIZE_PARAMS, **params}))
    return model


def test_tokenize_prepends_the_chosen_or_default_prompt(backend, tmp_path, tokenizer_json):
    model = _tokenizer(tmp_path, tokenizer_json, **OPTION_PARAMS)
    responses = _execute_options(model)
    ids = [r.output_tensors()[0].as_numpy()[0].tolist() for r in responses if not r.has_error()]
    query = model.tokenizer.encode(["query: hello"])["input_ids"][0].tolist()
    passage = model.tokenizer.encode(["passage: hello"])["input_ids"][0].tolist()
    assert ids == [query, passage, query]


def test_tokenize_byte_cap_applies_to_the_text_without_prompt(backend, tmp_path, tokenizer_json):
    _assert_byte_cap_excludes_the_prompt(_tokenizer(tmp_path, tokenizer_json, **LONG_PROMPT_PARAMS))


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
