"""The encode adapter (``embed_runtime/models/encode.py``) on ragged tokens and dense inputs."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit import fake_pb_utils as pb
from tests.unit.embed_runtime.engines.test_ort_encoder import dense_graph
from tests.unit.embed_runtime.models.helpers import (
    DIM,
    REQUEST_TEXTS,
    _assert_failure_spares_the_bad_request,
    _encode_model,
    _error,
    _expected_mean,
    _text_request,
    _token_request,
)


def _token_requests(tokenize_model) -> list[dict[str, np.ndarray]]:
    responses = tokenize_model.execute([_text_request(*texts) for texts in REQUEST_TEXTS])
    return [{n: r.output(n) for n in ("input_ids", "attention_mask")} for r in responses]


def test_encode_returns_masked_mean_per_request_in_order(tokenize_model, encode_model) -> None:
    arrays = _token_requests(tokenize_model)
    responses = encode_model.execute([_token_request(a) for a in arrays])
    assert len(responses) == len(arrays)
    for a, response in zip(arrays, responses, strict=True):
        assert [t.name() for t in response.output_tensors()] == ["EMBEDDING"]
        out = response.output("EMBEDDING")
        assert out.dtype == np.float32
        assert out.shape == (len(a["input_ids"]), DIM)
        np.testing.assert_allclose(out, _expected_mean(a), rtol=1e-5, atol=1e-6)


def test_encode_results_do_not_depend_on_batching(tokenize_model, encode_model) -> None:
    arrays = _token_requests(tokenize_model)
    together = encode_model.execute([_token_request(a) for a in arrays])
    one_by_one = [encode_model.execute([_token_request(a)])[0] for a in arrays]
    reversed_batch = encode_model.execute([_token_request(a) for a in reversed(arrays)])[::-1]
    # The same rows padded wider (as Triton's ragged batching may hand them over).
    padded = []
    for a in arrays:
        extra = np.zeros((len(a["input_ids"]), 5), dtype=np.int64)
        padded.append({n: np.concatenate([v, extra], axis=1) for n, v in a.items()})
    wider = encode_model.execute([_token_request(a) for a in padded])
    for variant in (one_by_one, reversed_batch, wider):
        for want, got in zip(together, variant, strict=True):
            np.testing.assert_allclose(
                got.output("EMBEDDING"), want.output("EMBEDDING"), rtol=1e-5, atol=1e-6
            )


def _good_tokens(n: int = 1, width: int = 3) -> dict[str, np.ndarray]:
    return {
        "input_ids": np.full((n, width), 1000, dtype=np.int64),
        "attention_mask": np.ones((n, width), dtype=np.int64),
    }


BAD_TOKEN_REQUESTS = {
    "row_count_mismatch": (
        {"input_ids": np.ones((2, 3), np.int64), "attention_mask": np.ones((1, 3), np.int64)},
        "need one shape and at least one row",
    ),
    "zero_rows": (
        {"input_ids": np.ones((0, 3), np.int64), "attention_mask": np.ones((0, 3), np.int64)},
        "need one shape and at least one row",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_TOKEN_REQUESTS))
def test_encode_bad_request_gets_invalid_arg_while_others_succeed(encode_model, case) -> None:
    bad, message = BAD_TOKEN_REQUESTS[case]
    good = _good_tokens(2)
    responses = encode_model.execute([_token_request(good), _token_request(bad)])
    code, text = _error(responses[1])
    assert code == pb.TritonError.INVALID_ARG
    assert message in text
    np.testing.assert_allclose(
        responses[0].output("EMBEDDING"), _expected_mean(good), rtol=1e-5, atol=1e-6
    )


def test_encode_request_with_mismatched_widths_fails_alone(encode_model) -> None:
    bad = {"input_ids": np.ones((1, 5), np.int64), "attention_mask": np.ones((1, 3), np.int64)}
    responses = encode_model.execute([_token_request(_good_tokens()), _token_request(bad)])
    assert _error(responses[1])[0] == pb.TritonError.INVALID_ARG
    assert not responses[0].has_error()


def test_encode_request_missing_an_input_gets_its_own_error(encode_model) -> None:
    bad = {"input_ids": np.ones((1, 3), np.int64)}
    responses = encode_model.execute([_token_request(bad), _token_request(_good_tokens())])
    assert _error(responses[0]) == (pb.TritonError.INTERNAL, "input attention_mask is missing")
    assert not responses[1].has_error()


def test_encode_failure_gives_every_valid_request_an_internal_error(encode_model) -> None:
    def broken(requests):
        raise RuntimeError("session died")

    encode_model.encoder.encode_tokens = broken
    zero_rows = BAD_TOKEN_REQUESTS["zero_rows"][0]
    responses = encode_model.execute(
        [
            _token_request(_good_tokens()),
            _token_request(zero_rows),
            _token_request(_good_tokens(2)),
        ]
    )
    _assert_failure_spares_the_bad_request(responses)


def test_encode_answers_every_request_when_all_are_bad(encode_model) -> None:
    bad = [_token_request(BAD_TOKEN_REQUESTS[case][0]) for case in sorted(BAD_TOKEN_REQUESTS)]
    responses = encode_model.execute(bad)
    assert [_error(r)[0] for r in responses] == [pb.TritonError.INVALID_ARG] * len(bad)


def test_encode_initialize_fails_when_graph_lacks_configured_input(
    backend, tmp_path, token_onnx
) -> None:
    with pytest.raises(ValueError, match="lacks inputs"):
        _encode_model(tmp_path, token_onnx, input_names="input_ids,attention_mask,token_type_ids")


# --- encode (dense inputs) -------------------------------------------------------------


def test_encode_dense_inputs_equal_regardless_of_batching(backend, tmp_path) -> None:
    onnx_path = dense_graph(tmp_path / "dense.onnx")
    (tmp_path / "repo").mkdir()
    model = _encode_model(tmp_path / "repo", onnx_path, input_names="pixel_values", ragged="false")
    rng = np.random.default_rng(5)
    inputs = [rng.normal(size=(n, 3)).astype(np.float32) for n in (2, 4, 1)]
    requests = [pb.InferenceRequest([pb.Tensor("pixel_values", x)]) for x in inputs]
    together = model.execute(requests)
    for x, request, response in zip(inputs, requests, together, strict=True):
        alone = model.execute([request])[0].output("EMBEDDING")
        assert response.output("EMBEDDING").shape == (len(x), DIM)
        np.testing.assert_allclose(response.output("EMBEDDING"), alone, rtol=1e-6, atol=1e-6)
