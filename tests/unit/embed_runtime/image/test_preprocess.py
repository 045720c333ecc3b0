"""Serve-time image decode + preprocess match open_clip's own eval transform."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import open_clip
import pytest
from open_clip.transform import PreprocessCfg, image_transform_v2
from PIL import Image, ImageOps, features

from embed_runtime.errors import InvalidInputError
from embed_runtime.image.preprocess import (
    PixelBudget,
    PreprocessParams,
    decode_image,
    load_image,
    open_image,
    preprocess,
    preprocess_batch,
    preprocess_opened,
)
from generator.families.open_clip.assets import (
    load_open_clip,
    preprocess_params_from_model,
)
from generator.fixtures.tiny_clip import create_tiny_checkpoint

RNG = np.random.default_rng(1234)
TOLERANCE = 0.0


def _encode(image: Image.Image, fmt: str = "PNG", **kwargs) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **kwargs)
    return buf.getvalue()


def _noise(width: int, height: int, channels: int = 3) -> np.ndarray:
    """Smooth-ish content plus noise, so resampling filters matter."""
    yy, xx = np.mgrid[0:height, 0:width]
    base = (np.sin(xx / 7.0) + np.cos(yy / 5.0) + 2) * 60
    noise = RNG.integers(0, 40, (height, width, channels))
    return ((base[..., None] + noise) % 256).astype(np.uint8)


def _animated_gif() -> bytes:
    frames = [Image.fromarray(_noise(120, 80)).quantize(32) for _ in range(3)]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    return buf.getvalue()


def _animated_webp() -> bytes:
    frames = [Image.fromarray(_noise(90, 70)) for _ in range(3)]
    buf = io.BytesIO()
    frames[0].save(buf, "WEBP", save_all=True, append_images=frames[1:], lossless=True)
    return buf.getvalue()


def _exif_jpeg(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return _encode(Image.fromarray(_noise(640, 480)), "JPEG", exif=exif.tobytes(), quality=90)


def _image_cases() -> dict[str, bytes]:
    rgba = _noise(640, 480, 4)
    rgba[..., 3] = np.linspace(0, 255, 640, dtype=np.uint8)[None, :]
    palette_t = Image.fromarray(_noise(200, 150)).quantize(16)
    palette_t.info["transparency"] = 3
    sixteen = RNG.integers(0, 65536, (300, 7), dtype=np.uint16)
    low16 = RNG.integers(0, 256, (64, 96), dtype=np.uint16)
    cases = {
        "rgb_1x1": _encode(Image.fromarray(_noise(1, 1))),
        "rgb_7x300": _encode(Image.fromarray(_noise(7, 300))),
        "rgb_640x480": _encode(Image.fromarray(_noise(640, 480))),
        "rgb_3000x200_panorama": _encode(Image.fromarray(_noise(3000, 200))),
        "jpeg_3000x200": _encode(Image.fromarray(_noise(3000, 200)), "JPEG"),
        "rgba_640x480": _encode(Image.fromarray(rgba, "RGBA")),
        "p_7x300": _encode(Image.fromarray(_noise(7, 300)).quantize(64)),
        "p_transparent_200x150": _encode(palette_t),
        "l_640x480": _encode(Image.fromarray(_noise(640, 480, 1)[..., 0], "L")),
        "la_333x222": _encode(Image.fromarray(_noise(333, 222, 2), "LA")),
        "cmyk_jpeg_640x480": _encode(
            Image.frombytes("CMYK", (640, 480), _noise(640, 480, 4).tobytes()), "JPEG"
        ),
        "i16_png_7x300": _encode(Image.fromarray(sixteen)),
        "i16_png_low_values": _encode(Image.fromarray(low16)),
        "gif_animated": _animated_gif(),
        "bmp_65x63": _encode(Image.fromarray(_noise(65, 63)), "BMP"),
    }
    if features.check("webp"):
        cases["webp_animated"] = _animated_webp()
    return cases


IMAGES = _image_cases()
CONFIGS = {
    "shortest_224": PreprocessCfg(size=224),
    "longest_224": PreprocessCfg(size=224, resize_mode="longest"),
    "squash_224": PreprocessCfg(size=224, resize_mode="squash"),
    "longest_96x64_bilinear_fill": PreprocessCfg(
        size=(64, 96), resize_mode="longest", interpolation="bilinear", fill_color=128
    ),
    "squash_64x96_bilinear": PreprocessCfg(
        size=(64, 96), resize_mode="squash", interpolation="bilinear"
    ),
    "shortest_64x96_nonsquare": PreprocessCfg(size=(96, 64), interpolation="bilinear"),
    "shortest_240_laion_mean": PreprocessCfg(size=240, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)),
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny checkpoint loaded the user's way, plus open_clip's own eval preprocess."""
    ckpt = tmp_path_factory.mktemp("tiny") / "tiny.pt"
    create_tiny_checkpoint(ckpt)
    model, preprocess_val, _ = load_open_clip(str(ckpt.parent / "tiny-clip.json"), None, str(ckpt))
    return model, preprocess_val


def _ours(data: bytes, params: PreprocessParams) -> np.ndarray:
    return preprocess(decode_image(data, params), params)


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_preprocess_matches_tiny_model_transform(tiny, name):
    model, preprocess_val = tiny
    params = preprocess_params_from_model(model)
    expected = preprocess_val(Image.open(io.BytesIO(IMAGES[name]))).numpy()
    got = _ours(IMAGES[name], params)
    assert got.shape == expected.shape == (3, 64, 64)
    assert got.dtype == np.float32
    assert np.abs(got - expected).max() <= TOLERANCE


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("name", sorted(IMAGES))
def test_preprocess_matches_open_clip_transform(config, name):
    cfg = CONFIGS[config]
    params = preprocess_params_from_model(cfg)
    expected = image_transform_v2(cfg, is_train=False)(Image.open(io.BytesIO(IMAGES[name])))
    got = _ours(IMAGES[name], params)
    assert got.shape == tuple(expected.shape)
    assert np.abs(got - expected.numpy()).max() <= TOLERANCE


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_exif_orientation_is_applied_before_preprocess(orientation):
    data = _exif_jpeg(orientation)
    cfg = CONFIGS["longest_96x64_bilinear_fill"]
    params = preprocess_params_from_model(cfg)
    transform = image_transform_v2(cfg, is_train=False)
    upright = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
    assert np.abs(_ours(data, params) - transform(upright).numpy()).max() <= TOLERANCE
    decoded = np.asarray(decode_image(data, params))
    assert np.array_equal(decoded, np.asarray(upright))
    raw = np.asarray(Image.open(io.BytesIO(data)))
    assert decoded.shape != raw.shape or not np.array_equal(decoded, raw)


def test_exif_can_be_ignored_for_bit_parity_with_raw_open_clip():
    data = _exif_jpeg(6)
    cfg = CONFIGS["shortest_224"]
    params = preprocess_params_from_model(cfg, apply_exif=False)
    expected = image_transform_v2(cfg, is_train=False)(Image.open(io.BytesIO(data))).numpy()
    assert np.abs(_ours(data, params) - expected).max() <= TOLERANCE


def test_decode_keeps_mode_and_takes_first_frame():
    params = PreprocessParams(size=(64, 64))
    gif = decode_image(IMAGES["gif_animated"], params)
    first = Image.open(io.BytesIO(IMAGES["gif_animated"]))
    assert gif.mode == first.mode == "P"
    assert np.array_equal(np.asarray(gif.convert("RGB")), np.asarray(first.convert("RGB")))
    assert decode_image(IMAGES["i16_png_7x300"], params).mode.startswith("I")


def test_sixteen_bit_png_follows_pillow_clipping_convert():
    params = PreprocessParams(size=(64, 96), resize_mode="squash")
    image = decode_image(IMAGES["i16_png_low_values"], params)
    rgb = np.asarray(image.convert("RGB"))
    assert np.array_equal(rgb[..., 0], np.asarray(image).astype(np.uint8))


def test_preprocess_batch_stacks_rows():
    params = preprocess_params_from_model(CONFIGS["shortest_224"])
    images = [decode_image(IMAGES[n], params) for n in ("rgb_1x1", "p_7x300", "l_640x480")]
    batch = preprocess_batch(images, params)
    assert batch.shape == (3, 3, 224, 224) and batch.dtype == np.float32
    assert np.array_equal(batch[1], preprocess(images[1], params))
    assert preprocess_batch([], params).shape == (0, 3, 224, 224)


def _png_header_only(width: int, height: int) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\0" * 64)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "IMAGE is empty"),
        (b"this is not an image, just some text" * 10, "not a supported image"),
        (IMAGES["rgb_640x480"][:200], "could not be decoded"),
        (_encode(Image.fromarray(_noise(640, 480)), "JPEG")[:3000], "could not be decoded"),
        (_encode(Image.new("RGB", (32, 32)), "ICO"), "not a supported image"),
        (_png_header_only(50_000, 50_000), "pixels"),
        (_png_header_only(5_000, 4_000), r"above the limit of 16777216 \(max_image_pixels\)"),
    ],
    ids=["empty", "garbage", "truncated_png", "truncated_jpeg", "ico", "bomb", "over_cap"],
)
def test_bad_images_raise_invalid_input(data, message):
    with pytest.raises(InvalidInputError, match=message) as info:
        decode_image(data, PreprocessParams(size=(224, 224)))
    assert info.value.code == "INVALID_ARG"


def test_pixel_cap_does_not_depend_on_pillow_global(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    with pytest.raises(InvalidInputError, match="above the limit"):
        decode_image(_png_header_only(50_000, 50_000), PreprocessParams(size=(224, 224)))
    small = PreprocessParams(size=(224, 224), max_image_pixels=100)
    with pytest.raises(InvalidInputError, match="above the limit of 100"):
        decode_image(IMAGES["rgb_640x480"], small)


def test_default_image_cap_admits_4096_squared_and_refuses_one_row_more():
    params = PreprocessParams(size=(224, 224))
    assert params.max_image_pixels == 4096 * 4096 and params.max_batch_pixels == 4 * 4096 * 4096
    assert open_image(_png_header_only(4096, 4096), params).size == (4096, 4096)
    assert open_image(_png_header_only(6000, 2796), params).size == (6000, 2796)
    with pytest.raises(InvalidInputError, match="4096x4097 = 16781312 pixels, above the limit"):
        open_image(_png_header_only(4096, 4097), params)


def test_pillow_bomb_error_becomes_invalid_input(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 640x480 > 2x: Pillow raises
    with pytest.raises(InvalidInputError, match="decompression bomb") as info:
        open_image(IMAGES["rgb_640x480"], PreprocessParams(size=(224, 224)))
    assert info.value.code == "INVALID_ARG"


def test_open_image_reads_the_header_only():
    params = PreprocessParams(size=(224, 224))
    image = open_image(_png_header_only(3000, 2000), params)  # IDAT holds 64 bytes only
    assert image.size == (3000, 2000)
    with pytest.raises(InvalidInputError, match="could not be decoded"):
        load_image(image, params)
    with pytest.raises(InvalidInputError, match="must be BYTES"):
        open_image("not bytes", params)  # type: ignore[arg-type]


def test_preprocess_opened_equals_decode_then_preprocess_and_releases_pixels():
    params = preprocess_params_from_model(CONFIGS["longest_224"])
    for name in ("cmyk_jpeg_640x480", "gif_animated", "p_transparent_200x150"):
        image = open_image(IMAGES[name], params)
        got = preprocess_opened(image, params)
        assert np.array_equal(got, _ours(IMAGES[name], params))
        with pytest.raises(ValueError, match="closed image"):
            image.getpixel((0, 0))
    rotated = _exif_jpeg(6)
    assert np.array_equal(
        preprocess_opened(open_image(rotated, params), params), _ours(rotated, params)
    )


def test_pixel_budget_charges_requests_in_order_and_refusals_charge_nothing():
    budget = PixelBudget(limit=20_000)
    budget.charge(8_000, 1)
    with pytest.raises(InvalidInputError) as info:
        budget.charge(16_000, 2)
    assert info.value.code == "INVALID_ARG"
    assert info.value.message == (
        "IMAGE request needs 16000 pixels for 2 image(s), but only 12000 of the "
        "per-execution budget max_batch_pixels=20000 are left after the requests batched "
        "before it; retry it, or send fewer or smaller images per request"
    )
    budget.charge(12_000, 1)  # exactly the rest
    assert budget.used == 20_000
    with pytest.raises(InvalidInputError, match="needs 1 pixels for 1 image.s., but only 0"):
        budget.charge(1, 1)
    with pytest.raises(InvalidInputError, match="above the per-execution budget max_batch_pix"):
        PixelBudget(limit=100).charge(101, 3)


def test_byte_cap_and_extreme_aspect_ratio_are_refused():
    with pytest.raises(InvalidInputError, match="bytes, above the limit"):
        decode_image(IMAGES["rgb_640x480"], PreprocessParams(size=(224, 224), max_bytes=100))
    params = PreprocessParams(size=(224, 224), max_image_pixels=1_000_000)
    sliver = decode_image(_encode(Image.fromarray(_noise(20_000, 1))), params)
    with pytest.raises(InvalidInputError, match="aspect ratio"):
        preprocess(sliver, params)


def test_longest_mode_survives_edges_open_clip_rounds_to_zero():
    params = PreprocessParams(size=(224, 224), resize_mode="longest")
    out = preprocess(decode_image(_encode(Image.fromarray(_noise(2000, 1))), params), params)
    assert out.shape == (3, 224, 224) and np.isfinite(out).all()


def test_params_round_trip_through_config_parameters():
    params = PreprocessParams(
        size=(96, 64),
        resize_mode="longest",
        interpolation="bilinear",
        mean=(0.1, 0.2, 0.30000000000000004),
        std=(0.5, 0.25, 1 / 3),
        fill_color=7,
        max_image_pixels=1234,
        max_batch_pixels=4321,
        max_bytes=5678,
        apply_exif=False,
    )
    parameters = params.to_parameters()
    assert all(isinstance(v, str) for v in parameters.values())
    assert PreprocessParams.from_parameters(parameters) == params


MISSING_KEYS = ("image_size", "mean", "max_image_pixels", "max_batch_pixels")
UNPARSABLE_VALUES = {"max_batch_pixels": "lots", "image_size": "224", "fill_color": "black",
                     "apply_exif": "maybe"}


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        *[(key, None, f"'{key}' is missing") for key in MISSING_KEYS],
        *[(key, value, f"'{key}' is invalid") for key, value in UNPARSABLE_VALUES.items()],
        ("max_batch_pixels", "1000", "max_batch_pixels .1000. must be at least max_image_pix"),
        ("resize_mode", "crop", "resize_mode must be one of"),
        ("interpolation", "lanczos", "interpolation must be one of"),
        ("std", "0.5,0,0.5", "std no zero"),
    ],
)
def test_from_parameters_rejects_missing_or_bad_keys(key, value, message):
    parameters = PreprocessParams(size=(224, 224)).to_parameters()
    if value is None:
        del parameters[key]
    else:
        parameters[key] = value
    with pytest.raises(ValueError, match=message):
        PreprocessParams.from_parameters(parameters)


def test_params_from_model_resolve_open_clip_quirks():
    nonsquare = preprocess_params_from_model(PreprocessCfg(size=(96, 64), interpolation="bilinear"))
    assert nonsquare.interpolation == "bicubic" and nonsquare.size == (96, 64)
    random = preprocess_params_from_model({"size": 224, "interpolation": "random"})
    assert random.interpolation == "bicubic" and random.mean == open_clip.OPENAI_DATASET_MEAN


@pytest.mark.parametrize(
    ("width", "height", "fmt"), [(1600, 1200, "JPEG"), (720, 1280, "JPEG"), (800, 600, "PNG")]
)
def test_draft_decode_stays_close_to_open_clip_and_leaves_other_formats_exact(width, height, fmt):
    """The opt-in reduced-scale JPEG decode: measured deviation from open_clip, bounded."""
    from client.load.workload import _photo

    buf = io.BytesIO()
    kwargs = {"quality": 88} if fmt == "JPEG" else {}
    _photo(width, height, np.random.default_rng(7)).save(buf, format=fmt, **kwargs)
    data = buf.getvalue()
    cfg = CONFIGS["shortest_224"]
    exact = preprocess_params_from_model(cfg, apply_exif=False)
    draft = preprocess_params_from_model(cfg, apply_exif=False, draft_decode=True)
    expected = image_transform_v2(cfg, is_train=False)(Image.open(io.BytesIO(data))).numpy()
    assert np.abs(_ours(data, exact) - expected).max() <= TOLERANCE
    got = _ours(data, draft)
    assert got.shape == expected.shape
    if fmt != "JPEG":
        assert np.abs(got - expected).max() == 0.0
        return
    diff = np.abs(got - expected)
    cosine = float(got.ravel() @ expected.ravel()) / (
        np.linalg.norm(got) * np.linalg.norm(expected)
    )
    assert 0.0 < diff.mean() <= 0.02  # the decode really changed, by little
    assert diff.max() <= 0.5
    assert cosine >= 0.9995
    opened = open_image(data, draft)
    loaded = load_image(opened, draft)
    assert min(loaded.size) >= max(draft.size)  # never decoded below the output size
    assert loaded.size[0] < width  # and really decoded at a reduced scale


def test_draft_decode_round_trips_and_defaults_off():
    params = PreprocessParams(size=(224, 224), draft_decode=True)
    assert PreprocessParams.from_parameters(params.to_parameters()) == params
    parameters = PreprocessParams(size=(224, 224)).to_parameters()
    del parameters["draft_decode"]  # configs rendered before the knob existed
    assert PreprocessParams.from_parameters(parameters).draft_decode is False
    parameters["draft_decode"] = "sometimes"
    with pytest.raises(ValueError, match="'draft_decode' is invalid"):
        PreprocessParams.from_parameters(parameters)
