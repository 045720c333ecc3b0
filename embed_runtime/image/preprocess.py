"""Decode image bytes and preprocess them exactly as open_clip's eval transform does.

Parity rule: ``preprocess(decode_image(data, p), p)`` equals open_clip's
``image_transform_v2(cfg, is_train=False)(PIL.Image.open(BytesIO(data)))`` for the same
configuration (max abs diff ~1e-7). open_clip resizes, crops and pads the image *in its
decoded mode* and converts to RGB only afterwards (``MaybeConvertMode``), and Pillow
resizes ``P`` images with NEAREST and ``RGBA``/``LA`` with premultiplied alpha, so this
module keeps that order: :func:`decode_image` returns the decoded mode and
:func:`preprocess` converts to RGB after the geometry. Every geometric step mirrors the
torchvision/open_clip code path (same size arithmetic and rounding, same Pillow calls).

Deliberate departures, all for inputs open_clip handles badly:

- EXIF orientation is applied (``apply_exif``, default on); open_clip ignores it.
  Turn it off for bit parity with embeddings computed from raw ``Image.open``.
- A resize edge that open_clip would round to 0 (extreme aspect ratios in 'longest'
  mode) is clamped to 1 px instead of crashing; an intermediate resize larger than
  ``max_image_pixels`` is refused instead of allocating it.
- Only common raster formats are decoded (:data:`ALLOWED_FORMATS`).
- Opt-in ``draft_decode`` (off by default): JPEGs are decoded at a reduced DCT scale
  that keeps both sides at least the output size, then resized as usual. Faster, and
  no longer bit-equal to open_clip (the deviation is measured in the parity tests).

Memory: decoding is split in two so that a caller can budget pixels before paying for
them. :func:`open_image` reads the header only (Pillow is lazy: the size is known, no
pixel is decoded); :func:`load_image` decodes the first frame. The full-size image is
then held once (plus one transposed copy only when EXIF orientation asks for it); the
resize is the first step that touches it, as in open_clip, and every later step works
on the model-sized image.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps

from ..errors import InvalidInputError

ALLOWED_FORMATS = ("JPEG", "MPO", "PNG", "GIF", "WEBP", "BMP", "TIFF", "AVIF")
RESIZE_MODES = ("shortest", "longest", "squash")
IMAGE_DECODERS = ("cpu", "gpu")
INTERPOLATIONS = {
    "bicubic": Image.Resampling.BICUBIC,
    "bilinear": Image.Resampling.BILINEAR,
    "nearest": Image.Resampling.NEAREST,
}
_RESIZABLE_MODES = frozenset(
    "1 L LA La P PA RGB RGBA RGBa RGBX CMYK YCbCr LAB HSV I I;16 I;16L I;16B F".split()
)
_EXIF_ORIENTATION = 0x0112
_TRANSPOSE_FOR_ORIENTATION = {  # as ImageOps.exif_transpose
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(v) for v in text.split(","))


def _flag(text: str) -> bool:
    flag = text.strip().lower()
    if flag not in ("true", "false"):
        raise ValueError(f"expected true/false, got {flag!r}")
    return flag == "true"


@dataclass(frozen=True)
class PreprocessParams:
    """How one model's images are decoded and turned into ``pixel_values``.

    ``size`` is (height, width). ``interpolation`` is the filter actually used by the
    resize (open_clip's non-square 'shortest' path always uses bicubic; the generator
    resolves that before building these params). ``max_image_pixels`` caps one image
    (checked from its header); ``max_batch_pixels`` caps the images one ``execute``
    decodes (see :class:`PixelBudget`), so it must admit at least one capped image.
    ``image_decode`` ``"gpu"`` decodes JPEGs on the GPU and resizes them there
    (:mod:`.gpu`); everything else keeps this module's exact path.
    """

    size: tuple[int, int]
    resize_mode: str = "shortest"
    interpolation: str = "bicubic"
    mean: tuple[float, float, float] = (0.48145466, 0.4578275, 0.40821073)
    std: tuple[float, float, float] = (0.26862954, 0.26130258, 0.27577711)
    fill_color: int = 0
    max_image_pixels: int = 16_777_216
    max_batch_pixels: int = 67_108_864
    max_bytes: int = 20 * 1024 * 1024
    apply_exif: bool = True
    draft_decode: bool = False
    image_decode: str = "cpu"

    def __post_init__(self):
        """Reject values the transform cannot honour."""
        if len(self.size) != 2 or min(self.size) < 1:
            raise ValueError(f"size must be two positive ints (h, w), got {self.size}")
        if self.resize_mode not in RESIZE_MODES:
            raise ValueError(f"resize_mode must be one of {RESIZE_MODES}, got {self.resize_mode!r}")
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(
                f"interpolation must be one of {tuple(INTERPOLATIONS)}, got {self.interpolation!r}"
            )
        if len(self.mean) != 3 or len(self.std) != 3 or any(s == 0 for s in self.std):
            raise ValueError(f"mean/std need 3 values and std no zero, got {self.mean}/{self.std}")
        if self.image_decode not in IMAGE_DECODERS:
            raise ValueError(
                f"image_decode must be one of {IMAGE_DECODERS}, got {self.image_decode!r}"
            )
        if self.image_decode == "gpu" and self.draft_decode:
            raise ValueError("image_decode 'gpu' and draft_decode exclude each other")
        if self.image_decode == "gpu" and self.interpolation == "nearest":
            raise ValueError("image_decode 'gpu' resizes with bicubic or bilinear, not nearest")
        if self.max_image_pixels < 1 or self.max_bytes < 1:
            raise ValueError("max_image_pixels and max_bytes must be positive")
        if self.max_batch_pixels < self.max_image_pixels:
            raise ValueError(
                f"max_batch_pixels ({self.max_batch_pixels}) must be at least "
                f"max_image_pixels ({self.max_image_pixels}): a single image under the "
                "per-image cap could never be served"
            )

    def to_parameters(self) -> dict[str, str]:
        """String config parameters of the Triton model (see :meth:`from_parameters`)."""
        return {
            "image_size": f"{self.size[0]},{self.size[1]}",
            "resize_mode": self.resize_mode,
            "interpolation": self.interpolation,
            "mean": ",".join(repr(float(v)) for v in self.mean),
            "std": ",".join(repr(float(v)) for v in self.std),
            "fill_color": str(self.fill_color),
            "max_image_pixels": str(self.max_image_pixels),
            "max_batch_pixels": str(self.max_batch_pixels),
            "max_bytes": str(self.max_bytes),
            "apply_exif": "true" if self.apply_exif else "false",
            "draft_decode": "true" if self.draft_decode else "false",
            "image_decode": self.image_decode,
        }

    @classmethod
    def from_parameters(cls, params: dict[str, str]) -> PreprocessParams:
        """Read the model's string config parameters; ValueError names a missing/bad key."""
        key = ""
        try:
            key = "image_size"
            height, width = (int(v) for v in params[key].split(","))
            values: dict[str, object] = {"size": (height, width)}
            for key in ("resize_mode", "interpolation"):
                values[key] = params[key]
            for key in ("mean", "std"):
                values[key] = _floats(params[key])
            for key in ("fill_color", "max_image_pixels", "max_batch_pixels", "max_bytes"):
                values[key] = int(params[key])
            key = "apply_exif"
            values[key] = _flag(params[key])
            key = "draft_decode"  # absent from configs rendered before it existed
            values[key] = _flag(params.get(key, "false"))
            values["image_decode"] = params.get("image_decode", "cpu")
        except KeyError:
            raise ValueError(f"preprocess config parameter {key!r} is missing") from None
        except ValueError as exc:
            raise ValueError(f"preprocess config parameter {key!r} is invalid: {exc}") from None
        return cls(**values)  # type: ignore[arg-type]


def _decode_error(exc: Exception) -> InvalidInputError:
    if isinstance(exc, Image.DecompressionBombError):
        return InvalidInputError(f"IMAGE refused as a decompression bomb: {exc}")
    return InvalidInputError(f"IMAGE could not be decoded: {exc or type(exc).__name__}")


def _open_formats() -> list[str]:
    Image.init()
    return [f for f in ALLOWED_FORMATS if f in Image.OPEN]


def open_image(data: bytes, params: PreprocessParams) -> Image.Image:
    """Parse the header of encoded image bytes; no pixel is decoded yet.

    The returned image is lazy: its ``size`` (and ``width * height``, the pixels that
    :func:`load_image` will decode) is known, its pixels are not. Raises
    :class:`InvalidInputError` for non-bytes, empty, oversized, unrecognised or corrupt
    headers and for images with more than ``params.max_image_pixels`` pixels, whatever
    Pillow's global ``MAX_IMAGE_PIXELS`` (Pillow's own bomb error, if it fires first,
    is reported the same way).
    """
    if not isinstance(data, bytes):
        raise InvalidInputError("IMAGE rows must be BYTES")
    if not data:
        raise InvalidInputError("IMAGE is empty")
    if len(data) > params.max_bytes:
        raise InvalidInputError(
            f"IMAGE is {len(data)} bytes, above the limit of {params.max_bytes}"
        )
    try:
        image = Image.open(io.BytesIO(data), formats=_open_formats())
    except Image.UnidentifiedImageError:
        raise InvalidInputError(
            f"IMAGE is not a supported image (formats: {', '.join(ALLOWED_FORMATS)})"
        ) from None
    except Exception as exc:  # noqa: BLE001 - any parser failure on untrusted bytes
        raise _decode_error(exc) from None
    width, height = image.size
    if width * height > params.max_image_pixels:
        raise InvalidInputError(
            f"IMAGE is {width}x{height} = {width * height} pixels, above the limit of "
            f"{params.max_image_pixels} (max_image_pixels)"
        )
    return image


def _exif_transpose(image: Image.Image) -> Image.Image:
    """``ImageOps.exif_transpose`` without its copy of an image that needs no transpose."""
    try:
        orientation = image.getexif().get(_EXIF_ORIENTATION, 1)
    except Exception:  # noqa: BLE001 - malformed EXIF: keep the pixels as stored
        return image
    method = _TRANSPOSE_FOR_ORIENTATION.get(orientation)
    return image if method is None else image.transpose(method)


def load_image(image: Image.Image, params: PreprocessParams) -> Image.Image:
    """Decode the first frame of an :func:`open_image` result, in its decoded mode.

    EXIF orientation is applied when ``params.apply_exif``, and the image keeps its
    decoded mode (``P``, ``RGBA``, ``CMYK``, ``L``, ``LA``, ``I;16`` ...) because
    open_clip converts to RGB only after resizing. 16-bit images therefore go through
    Pillow's own ``convert('RGB')`` later, which clips values above 255 rather than
    rescaling; that is what open_clip does. No full-size copy is made beyond the decode
    itself (and the transposed image when orientation asks for one). Raises
    :class:`InvalidInputError` for truncated or corrupt pixel data.
    """
    try:
        image.seek(0)
        if params.draft_decode and image.format == "JPEG":
            # Let libjpeg decode at 1/2, 1/4 or 1/8 scale (DCT scaling) while both
            # sides stay at least the largest output side: far less decode and resize
            # work for a photo, at a small, measured cost in parity (docs/benchmarks.md).
            side = max(params.size)
            image.draft(image.mode, (side, side))
        image.load()
    except Exception as exc:  # noqa: BLE001 - any decoder failure on untrusted bytes
        raise _decode_error(exc) from None
    if params.apply_exif:
        image = _exif_transpose(image)
    if image.mode not in _RESIZABLE_MODES:
        image = image.convert("RGB")
    return image


def decode_image(data: bytes, params: PreprocessParams) -> Image.Image:
    """:func:`open_image` then :func:`load_image`: bytes to a loaded single-frame image."""
    return load_image(open_image(data, params), params)


@dataclass
class PixelBudget:
    """The pixels one ``execute`` may still decode, charged request by request in order.

    A request that does not fit is refused whole and charges nothing, so a later,
    smaller request may still fit; the decision depends only on the order of the
    requests and their header sizes, never on decode timing.
    """

    limit: int
    used: int = 0

    def charge(self, pixels: int, images: int) -> None:
        """Take ``pixels`` (the request's ``images`` together) or raise InvalidInputError."""
        if pixels > self.limit:
            raise InvalidInputError(
                f"IMAGE request needs {pixels} pixels for {images} image(s), above the "
                f"per-execution budget max_batch_pixels={self.limit}; send fewer or "
                "smaller images per request"
            )
        if self.used + pixels > self.limit:
            raise InvalidInputError(
                f"IMAGE request needs {pixels} pixels for {images} image(s), but only "
                f"{self.limit - self.used} of the per-execution budget "
                f"max_batch_pixels={self.limit} are left after the requests batched "
                "before it; retry it, or send fewer or smaller images per request"
            )
        self.used += pixels


def _shortest_edge_size(height: int, width: int, size: int) -> tuple[int, int]:
    """Output (h, w) of torchvision ``Resize(int)``: short edge = ``size``, long one truncated."""
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = size, int(size * long / short)
    new_w, new_h = (new_short, new_long) if width <= height else (new_long, new_short)
    return new_h, new_w


def _keep_ratio_size(height: int, width: int, target: tuple[int, int], longest: float):
    """open_clip ``ResizeKeepRatio.get_params`` (no random scale), edges clamped to >= 1."""
    ratio_h, ratio_w = height / target[0], width / target[1]
    ratio = max(ratio_h, ratio_w) * longest + min(ratio_h, ratio_w) * (1.0 - longest)
    return tuple(max(1, round(x * 1.0 / ratio)) for x in (height, width))


def _resize(image: Image.Image, size: tuple[int, int], params: PreprocessParams) -> Image.Image:
    """Resize like torchvision ``F.resize`` on a PIL image to (h, w); a no-op at the same size."""
    if size == (image.height, image.width):
        return image
    if size[0] * size[1] > params.max_image_pixels:
        raise InvalidInputError(
            f"IMAGE aspect ratio {image.width}x{image.height} is too extreme: resizing it for "
            f"{params.size[1]}x{params.size[0]} needs {size[1]}x{size[0]} pixels"
        )
    return image.resize((size[1], size[0]), INTERPOLATIONS[params.interpolation])


def _pad(image: Image.Image, ltrb: list[int], fill: int) -> Image.Image:
    """Pad like torchvision ``F_pil.pad`` in constant mode (fill per band, ``P`` keeps palette)."""
    bands = len(image.getbands())
    fill_value: object = tuple([fill] * bands) if bands > 1 else fill
    if image.mode != "F":
        fill_value = tuple(int(v) for v in fill_value) if bands > 1 else int(fill)
    palette = image.getpalette() if image.mode == "P" else None
    out = ImageOps.expand(image, border=tuple(ltrb), fill=fill_value)
    if palette is not None:
        out.putpalette(palette)
    return out


def _center_crop_or_pad(image: Image.Image, size: tuple[int, int], fill: int) -> Image.Image:
    """Crop like torchvision ``center_crop`` / open_clip ``center_crop_or_pad`` (same rounding)."""
    crop_h, crop_w = size
    if crop_w > image.width or crop_h > image.height:
        dw, dh = max(crop_w - image.width, 0), max(crop_h - image.height, 0)
        image = _pad(image, [dw // 2, dh // 2, (dw + 1) // 2, (dh + 1) // 2], fill)
        if (crop_w, crop_h) == image.size:
            return image
    top = int(round((image.height - crop_h) / 2.0))
    left = int(round((image.width - crop_w) / 2.0))
    return image.crop((left, top, left + crop_w, top + crop_h))


def _geometry(image: Image.Image, params: PreprocessParams) -> Image.Image:
    height, width = params.size
    if params.resize_mode == "squash":
        return _resize(image, (height, width), params)
    if params.resize_mode == "longest":
        image = _resize(
            image, _keep_ratio_size(image.height, image.width, params.size, 1.0), params
        )
        return _center_crop_or_pad(image, params.size, params.fill_color)
    if height == width:
        target = _shortest_edge_size(image.height, image.width, height)
    else:
        target = _keep_ratio_size(image.height, image.width, params.size, 0.0)
    return _center_crop_or_pad(_resize(image, target, params), params.size, 0)


@functools.lru_cache(maxsize=32)
def channel_tables(mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """float32 [3, 256]: what ToTensor + Normalize make of each 8-bit value, per channel.

    The same float32 operations in the same order as ``(v / 255 - mean) / std`` on the
    whole image, so a lookup gives bit-equal pixels for a fraction of the work.
    """
    values = np.repeat(np.arange(256, dtype=np.float32)[:, None], 3, axis=1)
    table = values / np.float32(255)
    table -= np.asarray(mean, dtype=np.float32)
    table /= np.asarray(std, dtype=np.float32)
    tables = np.ascontiguousarray(table.T)
    tables.setflags(write=False)  # shared by every call with these mean/std
    return tables


def preprocess(image: Image.Image, params: PreprocessParams) -> np.ndarray:
    """Resize/crop/pad, convert to RGB, scale to [0, 1] and normalise: float32 [3, H, W]."""
    image = _geometry(image, params)
    if image.mode != "RGB":
        image = image.convert("RGB")
    rgb = np.asarray(image)  # uint8 [H, W, 3]
    tables = channel_tables(params.mean, params.std)
    pixels = np.empty((3, *rgb.shape[:2]), dtype=np.float32)
    for channel in range(3):  # straight into CHW: no float HWC copy, no transpose
        np.take(tables[channel], rgb[:, :, channel], out=pixels[channel])
    return pixels


def preprocess_opened(image: Image.Image, params: PreprocessParams) -> np.ndarray:
    """:func:`load_image` + :func:`preprocess` of an :func:`open_image` result, then close it.

    Closing releases the full-size pixels that ``load`` attached to ``image``, so a
    caller that still holds the opened image (a batch of them) holds no decoded pixels:
    the full-size image lives only during this call.
    """
    try:
        loaded = load_image(image, params)
        if loaded is not image:  # transposed or converted: the original is no longer needed
            image.close()
        return preprocess(loaded, params)
    finally:
        image.close()


def preprocess_batch(images: Sequence[Image.Image], params: PreprocessParams) -> np.ndarray:
    """:func:`preprocess` every image: float32 [N, 3, H, W]."""
    if not images:
        return np.zeros((0, 3, *params.size), dtype=np.float32)
    return np.stack([preprocess(image, params) for image in images])
