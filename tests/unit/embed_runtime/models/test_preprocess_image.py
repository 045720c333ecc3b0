"""The preprocess_image adapter (``embed_runtime/models/preprocess_image.py``): decode,
pixel budgets, bad rows, the GPU decode path."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from embed_runtime.image.preprocess import (
    PreprocessParams,
    decode_image,
    preprocess,
    preprocess_opened,
)
from tests.unit import fake_pb_utils as pb
from tests.unit.embed_runtime.models.helpers import (
    _args,
    _error,
    load_adapter,
)

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

    from embed_runtime.image.gpu import GpuPreprocessor
    from tests.unit.embed_runtime.image.test_gpu import pillow_decode

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
