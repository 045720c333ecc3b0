"""The GPU image path (``image_decode = "gpu"``) run on torch's CPU device.

Everything but the decoder itself is the serving code: the Pillow-exact resize, the crop
and pad, the lookup-table normalisation and the per-image routing between the GPU decoder
and the exact CPU path. The decoder stand-in is Pillow's own decode, so every result here
must be bit-equal to :func:`embed_runtime.image.preprocess.preprocess`; what a GPU decoder changes
is measured on a GPU by ``bench.gpu`` (docs/benchmarks.md).
"""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from embed_runtime.errors import InvalidInputError
from embed_runtime.image.gpu import (
    GpuPreprocessor,
    cuda_preprocessor,
    gpu_eligible,
    plan_geometry,
    require_cuda_device,
    resize_crop,
    visible_gpus,
)
from embed_runtime.image.preprocess import (
    PreprocessParams,
    open_image,
    preprocess,
    preprocess_opened,
)

CPU = torch.device("cpu")
PARAMS = PreprocessParams(size=(32, 32), image_decode="gpu")


def _encode(array: np.ndarray, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format=fmt, **kwargs)
    return buf.getvalue()


def _photo(height: int, width: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (height, width, 3), dtype=np.uint8)


def pillow_decode(log: list[int] | None = None):
    """A batch decoder with Pillow's pixels (EXIF orientation applied, RGB)."""

    def decode(datas, stream):
        if log is not None:
            log.append(len(datas))
        return [np.array(ImageOps.exif_transpose(Image.open(io.BytesIO(d))).convert("RGB"))
                for d in datas]

    return decode


def _exact(data: bytes, params: PreprocessParams) -> np.ndarray:
    cpu = dataclasses.replace(params, image_decode="cpu")
    return preprocess_opened(open_image(data, cpu), cpu)


def _run(gpu: GpuPreprocessor, *datas: bytes) -> list:
    return gpu.run([open_image(d, gpu.params) for d in datas], list(datas))


CASES = [  # (height, width, resize_mode, interpolation, output size)
    (int(h), int(w), mode, interp, size)
    for i, (h, w) in enumerate(np.random.default_rng(3).integers(1, 700, (90, 2)))
    for mode, interp, size in [(
        ("shortest", "longest", "squash")[i % 3],
        ("bicubic", "bilinear")[i % 2],
        (224, 224) if i % 4 else (int(17 + 13 * (i % 7)), int(40 + 11 * (i % 5))),
    )]
] + [(720, 1280, "shortest", "bicubic", (224, 224)), (1280, 720, "shortest", "bicubic",
                                                       (224, 224)), (584, 2, "squash", "bicubic",
                                                                     (224, 224))]


@pytest.mark.parametrize(("height", "width", "mode", "interp", "size"), CASES)
def test_resize_crop_is_bit_equal_to_the_pillow_path(height, width, mode, interp, size) -> None:
    params = PreprocessParams(size=size, resize_mode=mode, interpolation=interp, fill_color=77)
    pixels = _photo(height, width, seed=height * 1000 + width)
    expected = preprocess(Image.fromarray(pixels), params)
    planes = resize_crop(torch, torch.as_tensor(pixels), plan_geometry(height, width, params),
                         interp)
    got = GpuPreprocessor(params, torch, CPU, pillow_decode()).normalise(planes).numpy()
    np.testing.assert_array_equal(got, expected)


def test_grayscale_resize_equals_pillow_resizing_l_then_converting() -> None:
    gray = _photo(300, 200)[:, :, 0]
    expected = preprocess(Image.fromarray(gray, "L"), PARAMS)
    planes = resize_crop(torch, torch.as_tensor(np.repeat(gray[:, :, None], 3, axis=2)),
                         plan_geometry(300, 200, PARAMS), "bicubic")
    got = GpuPreprocessor(PARAMS, torch, CPU, pillow_decode()).normalise(planes).numpy()
    np.testing.assert_array_equal(got, expected)


def test_jpegs_go_to_the_decoder_and_every_other_format_to_the_cpu_path() -> None:
    photo = _photo(90, 120)
    cmyk = io.BytesIO()
    Image.fromarray(photo).convert("CMYK").save(cmyk, "JPEG")
    datas = {
        "jpeg": _encode(photo, "JPEG", quality=90),
        "gray_jpeg": _encode(photo[:, :, 1], "JPEG"),
        "progressive": _encode(photo, "JPEG", progressive=True),
        "png": _encode(photo, "PNG"),
        "webp": _encode(photo, "WEBP"),
        "gif": _encode(photo, "GIF"),
        "tiff": _encode(photo, "TIFF"),
        "cmyk_jpeg": cmyk.getvalue(),
    }
    batches: list[int] = []
    gpu = GpuPreprocessor(PARAMS, torch, CPU, pillow_decode(batches))
    out = _run(gpu, *datas.values())
    assert batches == [3]  # one decoder call for the three RGB / grayscale JPEGs
    assert (gpu.gpu_images, gpu.cpu_images) == (3, 5)
    for (name, data), got in zip(datas.items(), out, strict=True):
        np.testing.assert_array_equal(got.numpy(), _exact(data, PARAMS), err_msg=name)


def test_exif_orientation_is_applied_as_on_the_cpu_path() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6
    data = _encode(_photo(60, 100), "JPEG", exif=exif)
    out = _run(GpuPreprocessor(PARAMS, torch, CPU, pillow_decode()), data)
    np.testing.assert_array_equal(out[0].numpy(), _exact(data, PARAMS))


def test_truncated_jpeg_skips_the_decoder_and_fails_alone() -> None:
    good = _encode(_photo(80, 80), "JPEG")
    cut = good[: len(good) // 2]
    assert not gpu_eligible(open_image(cut, PARAMS), cut)
    gpu = GpuPreprocessor(PARAMS, torch, CPU, pillow_decode())
    out = _run(gpu, good, cut, good)
    assert isinstance(out[1], InvalidInputError) and "could not be decoded" in str(out[1])
    np.testing.assert_array_equal(out[0].numpy(), _exact(good, PARAMS))
    np.testing.assert_array_equal(out[2].numpy(), _exact(good, PARAMS))


def test_an_image_the_decoder_rejects_takes_the_cpu_path_and_its_error() -> None:
    good = _encode(_photo(50, 70), "JPEG")
    middle = len(good) // 2
    broken = good[:middle] + b"\xff\xd0" * 64 + good[middle + 128 :]  # still ends in EOI

    def decode(datas, stream):
        return [None if d == broken else pillow_decode()([d], stream)[0] for d in datas]

    gpu = GpuPreprocessor(PARAMS, torch, CPU, decode)
    out = _run(gpu, good, broken)
    np.testing.assert_array_equal(out[0].numpy(), _exact(good, PARAMS))
    try:
        expected = _exact(broken, PARAMS)
    except InvalidInputError as exc:
        assert isinstance(out[1], InvalidInputError) and str(out[1]) == str(exc)
    else:  # Pillow decodes it (with its corruption): the CPU path's pixels, exactly
        np.testing.assert_array_equal(out[1].numpy(), expected)
    assert (gpu.gpu_images, gpu.cpu_images) == (1, 1)


def test_a_failing_decoder_sends_the_whole_batch_to_the_cpu_path() -> None:
    datas = [_encode(_photo(40 + i, 60), "JPEG") for i in range(3)]

    def decode(datas, stream):
        raise RuntimeError("device lost")

    gpu = GpuPreprocessor(PARAMS, torch, CPU, decode)
    out = _run(gpu, *datas)
    for data, got in zip(datas, out, strict=True):
        np.testing.assert_array_equal(got.numpy(), _exact(data, PARAMS))
    assert (gpu.gpu_images, gpu.cpu_images) == (0, 3)


def test_extreme_aspect_ratio_is_refused_for_that_image_alone() -> None:
    params = dataclasses.replace(PARAMS, max_image_pixels=5000, max_batch_pixels=50_000)
    thin = _encode(_photo(1, 4000), "JPEG")
    good = _encode(_photo(40, 40), "JPEG")
    out = _run(GpuPreprocessor(params, torch, CPU, pillow_decode()), thin, good)
    assert isinstance(out[0], InvalidInputError) and "too extreme" in str(out[0])
    np.testing.assert_array_equal(out[1].numpy(), _exact(good, params))


def test_to_host_stacks_one_requests_images() -> None:
    gpu = GpuPreprocessor(PARAMS, torch, CPU, pillow_decode())
    out = _run(gpu, _encode(_photo(40, 40), "JPEG"), _encode(_photo(30, 50), "PNG"))
    stacked = gpu.to_host(out)
    assert stacked.shape == (2, 3, 32, 32) and stacked.dtype == np.float32


def test_params_round_trip_image_decode_and_refuse_what_the_gpu_cannot_do() -> None:
    assert PreprocessParams.from_parameters(PARAMS.to_parameters()) == PARAMS
    old = {k: v for k, v in PARAMS.to_parameters().items() if k != "image_decode"}
    assert PreprocessParams.from_parameters(old).image_decode == "cpu"
    with pytest.raises(ValueError, match="draft_decode exclude"):
        dataclasses.replace(PARAMS, draft_decode=True)
    with pytest.raises(ValueError, match="not nearest"):
        dataclasses.replace(PARAMS, interpolation="nearest")
    with pytest.raises(ValueError, match="image_decode must be one of"):
        dataclasses.replace(PARAMS, image_decode="tpu")


def test_no_visible_gpu_refuses_the_knob_with_a_message_naming_it(tmp_path: Path) -> None:
    empty = tmp_path / "gpus"
    empty.mkdir()
    with pytest.raises(ValueError, match="clip: image_decode 'gpu' needs an NVIDIA GPU"):
        require_cuda_device("clip: image_decode 'gpu'", str(empty), str(tmp_path))
    (tmp_path / "nvidia0").touch()
    assert visible_gpus(str(tmp_path / "missing"), str(tmp_path)) == ["nvidia0"]
    require_cuda_device("clip: image_decode 'gpu'", str(tmp_path / "missing"), str(tmp_path))
    (empty / "0000:17:00.0").mkdir()
    assert visible_gpus(str(empty), str(tmp_path / "none")) == ["0000:17:00.0"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_serving_constructor_fails_loudly_without_cuda() -> None:
    with pytest.raises(RuntimeError, match="image_decode 'gpu' needs a CUDA device"):
        cuda_preprocessor(PARAMS, 0)


def test_manifest_takes_image_decode_only_where_it_can_run() -> None:
    from generator.manifest import ManifestError, parse_manifest

    clip = {"name": "clip", "family": "open-clip", "arch": "ViT-B-32", "device": "gpu",
            "image_decode": "gpu"}
    manifest = parse_manifest({"models": [clip]}, Path("."))
    assert manifest.models[0].image_decode == "gpu"
    bad = [
        ({**clip, "device": "cpu"}, "image_decode 'gpu' needs device 'gpu'"),
        ({**clip, "image_draft_decode": True}, "exclude each other"),
        ({**clip, "image_decode": "tpu"}, "image_decode must be one of"),
        ({"name": "t", "family": "sentence-transformers", "source": "x", "device": "gpu",
          "image_decode": "gpu"}, "image_decode needs family 'open-clip'"),
    ]
    for entry, message in bad:
        with pytest.raises(ManifestError, match=message):
            parse_manifest({"models": [entry]}, Path("."))


@pytest.mark.skipif(bool(visible_gpus()), reason="checks the refusal on a host without a GPU")
def test_build_refuses_gpu_decode_on_a_host_without_a_gpu_before_exporting(tmp_path) -> None:
    from generator.families.open_clip import export as open_clip
    from generator.manifest import parse_manifest

    clip = {"name": "clip", "family": "open-clip", "arch": "no-such-arch", "device": "gpu",
            "image_decode": "gpu"}
    manifest = parse_manifest({"models": [clip]}, tmp_path)
    with pytest.raises(ValueError, match="clip: image_decode 'gpu' needs an NVIDIA GPU"):
        open_clip.build(manifest.models[0], manifest, tmp_path)


def test_manifest_image_apply_exif_is_off_unless_asked() -> None:
    from generator.manifest import parse_manifest

    clip = {"name": "clip", "family": "open-clip", "arch": "ViT-B-32"}
    assert parse_manifest({"models": [clip]}, Path(".")).models[0].image_apply_exif is False
    on = parse_manifest({"models": [{**clip, "image_apply_exif": True}]}, Path("."))
    assert on.models[0].image_apply_exif is True
