"""Output precision: quantized forms equal ``quantize_embeddings``; the encode stub's choice."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from embed_runtime.engines.output_precision import (
    CALIBRATION_FILE,
    EXTRA_PRECISIONS,
    FORMS,
    PRECISIONS,
    Calibration,
    OutputForms,
    forms_to_compute,
    quantization_ranges,
    quantize,
    resolve_precision,
)
from embed_runtime.errors import InvalidInputError
from embed_runtime.text.request_options import truncate
from tests.unit import fake_pb_utils as pb
from tests.unit.embed_runtime.models import helpers
from tests.unit.embed_runtime.models.helpers import ENCODE_PARAMS, load_adapter

backend = helpers.backend
token_onnx = helpers.token_onnx

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from sentence_transformers.quantization import quantize_embeddings


def _normalized(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


RNG = np.random.default_rng(11)
CALIB = _normalized(RNG.normal(size=(300, 48)).astype(np.float32))


def _edge_rows(ranges: np.ndarray) -> np.ndarray:
    """Rows at each range limit, a step inside them, beyond them, and exact zeros."""
    low, high = ranges
    step = (high - low) / 255
    return np.stack(
        [
            low,
            high,
            low + step,
            high - step,
            low - 1.0,
            high + 1.0,
            np.zeros_like(low),
            np.nextafter(high, np.float32(-np.inf)),
            np.nextafter(low, np.float32(np.inf)),
        ]
    ).astype(np.float32)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_quantize_equals_the_library_on_random_rows_zeros_and_range_limits(precision) -> None:
    ranges = quantization_ranges(CALIB)
    rows = np.concatenate([_normalized(RNG.normal(size=(500, 48))), _edge_rows(ranges)])
    rows[3, :5] = 0.0  # exact zeros: binary packs 0 as bit 0 (> 0 only)
    if precision == "float16":  # not a library form: float32 rows cast to float16
        want = rows.astype(np.float16)
    else:
        want = quantize_embeddings(rows, precision, ranges=ranges)
    got = quantize(rows, precision, ranges)
    assert got.dtype == want.dtype == FORMS[precision][1]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_ranges_equal_the_library_s_calibration_embeddings() -> None:
    rows = _normalized(RNG.normal(size=(40, 48)))
    for precision in ("int8", "uint8"):
        want = quantize_embeddings(rows, precision, calibration_embeddings=CALIB)
        np.testing.assert_array_equal(quantize(rows, precision, quantization_ranges(CALIB)), want)


def test_a_dimension_with_one_value_everywhere_is_quantized_as_the_library_does() -> None:
    calib = CALIB.copy()
    calib[:, 2] = 0.25  # max == min: the library steps by 1 there
    rows = np.concatenate([calib[:5], _normalized(RNG.normal(size=(5, 48)))])
    ranges = quantization_ranges(calib)
    for precision in ("int8", "uint8"):
        want = quantize_embeddings(rows, precision, ranges=ranges)
        np.testing.assert_array_equal(quantize(rows, precision, ranges), want)


def test_binary_forms_pack_widths_that_are_not_a_multiple_of_eight() -> None:
    rows = RNG.normal(size=(6, 13)).astype(np.float32)
    for precision in ("binary", "ubinary"):
        got = quantize(rows, precision)
        assert got.shape == (6, 2)
        np.testing.assert_array_equal(got, quantize_embeddings(rows, precision))


def test_calibration_ranges_for_a_width_cut_the_rows_as_requests_are() -> None:
    calibration = Calibration(CALIB, normalize=True)
    np.testing.assert_array_equal(calibration.ranges(48), quantization_ranges(CALIB))
    cut = truncate(CALIB, 16, True)
    np.testing.assert_array_equal(calibration.ranges(16), quantization_ranges(cut))
    rows = truncate(_normalized(RNG.normal(size=(20, 48))), 16, True)
    want = quantize_embeddings(rows, "int8", calibration_embeddings=cut)
    np.testing.assert_array_equal(quantize(rows, "int8", calibration.ranges(16)), want)
    assert calibration.ranges(16) is calibration.ranges(16)  # computed once per width


def test_calibration_refuses_too_few_rows() -> None:
    with pytest.raises(ValueError, match="N >= 2"):
        Calibration(CALIB[:1], normalize=True)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("int4", "unknown precision 'int4'; one of float32, float16, int8"),
        ("INT8", "unknown precision 'INT8'"),
        (8, "precision must be a string, got 8"),
        ("uint8", "this model does not offer precision 'uint8'; it offers float32, int8"),
    ],
)
def test_a_bad_precision_parameter_is_refused(value, message) -> None:
    with pytest.raises(InvalidInputError, match=message):
        resolve_precision({"precision": value}, ["int8"])


def test_float32_and_no_parameter_are_always_accepted() -> None:
    assert resolve_precision({}, []) is None
    assert resolve_precision({"precision": "float32"}, []) == "float32"


def test_forms_follow_requested_outputs_and_the_parameter() -> None:
    declared = EXTRA_PRECISIONS
    assert forms_to_compute(declared, None, None) == list(EXTRA_PRECISIONS)
    assert forms_to_compute(declared, ["EMBEDDING", "EMBEDDING_UBINARY"], None) == ["ubinary"]
    assert forms_to_compute(declared, None, "int8") == ["int8"]
    assert forms_to_compute(declared, None, "float32") == []
    assert forms_to_compute(declared, ["EMBEDDING"], "int8") == []
    assert forms_to_compute(["float16"], None, None) == ["float16"]


def test_int8_outputs_need_calibration() -> None:
    with pytest.raises(ValueError, match=CALIBRATION_FILE):
        OutputForms(["int8"])
    assert OutputForms(["float16", "binary"]).declared == ("float16", "binary")


# The encode stub, on the fake pb_utils: a masked-mean graph of width 8 (not normalised).
ALL_OUTPUTS = ["EMBEDDING", *(FORMS[p][0] for p in EXTRA_PRECISIONS)]


def _precision_encoder(tmp_path: Path, onnx_path: Path, calib: np.ndarray, **params: str):
    (tmp_path / "1").mkdir(exist_ok=True)
    shutil.copy(onnx_path, tmp_path / "1" / "model.onnx")
    np.save(tmp_path / "1" / CALIBRATION_FILE, calib)
    config = {
        "parameters": {k: {"string_value": v} for k, v in {**ENCODE_PARAMS, **params}.items()},
        "output": [{"name": n} for n in ALL_OUTPUTS],
    }
    args = {**helpers._args(tmp_path, {}), "model_config": json.dumps(config)}
    model = load_adapter("encode").TritonPythonModel()
    model.initialize(args)
    return model


def _tokens(ids: list[list[int]]) -> dict[str, np.ndarray]:
    width = max(map(len, ids))
    input_ids = np.zeros((len(ids), width), np.int64)
    mask = np.zeros((len(ids), width), np.int64)
    for i, row in enumerate(ids):
        input_ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    return {"input_ids": input_ids, "attention_mask": mask}


def _request(ids, parameters=None, requested=None) -> pb.InferenceRequest:
    inputs = [pb.Tensor(n, a) for n, a in _tokens(ids).items()]
    return pb.InferenceRequest(inputs, parameters, requested)


@pytest.fixture
def precision_encoder(backend, tmp_path, token_onnx):
    calib = helpers.TABLE[RNG.integers(0, 30522, size=(64, 3))].mean(axis=1)
    model = _precision_encoder(tmp_path, token_onnx, calib, max_dimensions="8", normalize="false")
    yield model, calib
    model.finalize()


def test_stub_answers_every_form_equal_to_the_library(precision_encoder) -> None:
    model, calib = precision_encoder
    ids = [[101, 2000, 3000, 102], [101, 7, 102], [101, 999, 1000, 1001, 1002, 102]]
    (response,) = model.execute([_request(ids)])
    floats = response.output("EMBEDDING")
    for precision in EXTRA_PRECISIONS:
        got = response.output(FORMS[precision][0])
        if precision == "float16":
            want = floats.astype(np.float16)
        else:
            want = quantize_embeddings(floats, precision, calibration_embeddings=calib)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_stub_quantizes_the_rows_cut_to_the_request_s_dimensions(precision_encoder) -> None:
    model, calib = precision_encoder
    ids = [[101, 2000, 3000, 102], [101, 7, 102]]
    (response,) = model.execute([_request(ids, {"dimensions": 5})])
    floats = response.output("EMBEDDING")
    assert floats.shape == (2, 5)
    cut = truncate(calib, 5, False)
    want = quantize_embeddings(floats, "uint8", calibration_embeddings=cut)
    np.testing.assert_array_equal(response.output("EMBEDDING_UINT8"), want)
    assert response.output("EMBEDDING_UBINARY").shape == (2, 1)


def test_stub_computes_only_what_the_request_asks_for(precision_encoder) -> None:
    model, _ = precision_encoder
    ids = [[101, 2000, 102]]
    by_output, by_parameter = model.execute(
        [
            _request(ids, requested=["EMBEDDING_BINARY"]),
            _request(ids, {"precision": "int8"}),
        ]
    )
    names = [t.name() for t in by_output.output_tensors()]
    assert names == ["EMBEDDING", "EMBEDDING_BINARY"]
    names = [t.name() for t in by_parameter.output_tensors()]
    assert names == ["EMBEDDING", "EMBEDDING_INT8"]


def test_stub_refuses_a_bad_precision_for_that_request_alone(precision_encoder) -> None:
    model, _ = precision_encoder
    ids = [[101, 2000, 102]]
    good, bad, worse, also_good = model.execute(
        [
            _request(ids, {"precision": "ubinary"}),
            _request(ids, {"precision": "int4"}),
            _request(ids, {"precision": ["int8"]}),
            _request(ids),
        ]
    )
    assert bad.error().code() == pb.TritonError.INVALID_ARG
    assert "unknown precision 'int4'" in bad.error().message()
    assert worse.error().code() == pb.TritonError.INVALID_ARG
    assert good.output("EMBEDDING_UBINARY").dtype == np.uint8
    assert also_good.output("EMBEDDING_INT8").dtype == np.int8


def test_a_model_without_the_forms_refuses_a_precision_but_takes_float32(
    backend, tmp_path, token_onnx
) -> None:
    model = helpers._encode_model(tmp_path, token_onnx)
    ids = [[101, 2000, 102]]
    refused, plain = model.execute(
        [_request(ids, {"precision": "binary"}), _request(ids, {"precision": "float32"})]
    )
    assert refused.error().code() == pb.TritonError.INVALID_ARG
    assert "does not offer precision 'binary'; it offers float32" in refused.error().message()
    assert [t.name() for t in plain.output_tensors()] == ["EMBEDDING"]
    model.finalize()


def test_initialize_fails_when_int8_is_declared_without_calibration(
    backend, tmp_path, token_onnx
) -> None:
    model = _precision_encoder(tmp_path, token_onnx, CALIB[:, :8])
    model.finalize()
    (tmp_path / "1" / CALIBRATION_FILE).unlink()
    with pytest.raises(FileNotFoundError):
        _precision_encoder_without_file(tmp_path)


def _precision_encoder_without_file(tmp_path: Path):
    config = {
        "parameters": {k: {"string_value": v} for k, v in ENCODE_PARAMS.items()},
        "output": [{"name": n} for n in ALL_OUTPUTS],
    }
    args = {**helpers._args(tmp_path, {}), "model_config": json.dumps(config)}
    load_adapter("encode").TritonPythonModel().initialize(args)
