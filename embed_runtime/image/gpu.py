"""GPU image decode and preprocessing for CLIP image ensembles (``image_decode = "gpu"``).

Photos are decoded in one batch on the GPU by nvImageCodec (NVIDIA's hardware JPEG
decoder where the GPU has one, CUDA decoders otherwise), then resized, cropped and
normalised on the device with torch. The geometry reproduces Pillow exactly: the resize
is Pillow's own two-pass convolution (horizontal first, 8-bit result between the passes)
with Pillow's fixed-point coefficients, computed here in the same double arithmetic and
applied as float64 matrix products, whose integer sums are exact. Given the same decoded
pixels, :meth:`GpuPreprocessor.run` is therefore bit-equal to :func:`.image.preprocess`
(tested on the CPU with torch's CPU device). What is not exact is the decode: a GPU JPEG
decoder's inverse DCT and chroma upsampling differ from libjpeg-turbo's by a few levels;
the effect on embeddings is measured by ``bench.gpu`` (docs/benchmarks.md, "GPU").

Routing, image by image inside one batch: baseline/progressive JPEGs in RGB or grayscale
go to the GPU; every other format (PNG, WebP, GIF, TIFF, ...), CMYK JPEGs, multi-picture
JPEGs and JPEGs that do not end in an end-of-image marker take the exact CPU path
(:func:`.image.preprocess_opened`), as does any image the GPU decoder rejects, so a
corrupt JPEG fails with the CPU path's own message and only its own request. Headers are
read and budgeted by the caller (:func:`.image.open_image`, :class:`.image.PixelBudget`)
exactly as on the CPU path.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from ..errors import InvalidInputError
from .preprocess import (
    PreprocessParams,
    _keep_ratio_size,
    _shortest_edge_size,
    channel_tables,
    preprocess_opened,
)

PRECISION_BITS = 22  # Pillow's 8-bit resampling keeps 32 - 8 - 2 fractional bits
GPU_INTERPOLATIONS = ("bicubic", "bilinear")
GPU_FORMATS = ("JPEG",)
GPU_MODES = ("RGB", "L")
_EOI = b"\xff\xd9"
# nvJPEG's defaults: ":fancy_upsampling=1" gave the same pixels on every photo of the parity
# table and decoded 1.5 x slower (bench.gpu, H100).
DECODER_OPTIONS = ""


def _bicubic(x: np.ndarray) -> np.ndarray:
    """Pillow's ``bicubic_filter`` (a = -0.5), same operation order, vectorised."""
    x = np.abs(x)
    near = ((-0.5 + 2.0) * x - (-0.5 + 3.0)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * -0.5
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def _bilinear(x: np.ndarray) -> np.ndarray:
    """Pillow's ``bilinear_filter`` (triangle)."""
    x = np.abs(x)
    return np.where(x < 1.0, 1.0 - x, 0.0)


_FILTERS: dict[str, tuple[Callable[[np.ndarray], np.ndarray], float]] = {
    "bicubic": (_bicubic, 2.0),
    "bilinear": (_bilinear, 1.0),
}


@functools.lru_cache(maxsize=512)
def resample_weights(
    in_size: int, out_size: int, interpolation: str, first: int, count: int
) -> tuple[np.ndarray, int, int]:
    """Pillow's fixed-point weights of outputs ``first .. first + count - 1`` of one axis.

    Returns ``(weights, lo, hi)``: float64 ``[count, hi - lo]`` holding the integer
    coefficients Pillow's ``precompute_coeffs`` + ``normalize_coeffs_8bpc`` give (scaled
    by 2**22), for the input pixels ``lo .. hi - 1`` that those outputs read.
    """
    kernel, base_support = _FILTERS[interpolation]
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = base_support * filterscale
    ksize = int(np.ceil(support)) * 2 + 1
    out = np.arange(first, first + count, dtype=np.float64)
    center = (out + 0.5) * scale
    xmin = np.maximum(np.trunc(center - support + 0.5).astype(np.int64), 0)
    xmax = np.minimum(np.trunc(center + support + 0.5).astype(np.int64), in_size) - xmin
    taps = np.arange(ksize)
    inside = taps[None, :] < xmax[:, None]
    raw = kernel(((taps[None, :] + xmin[:, None]) - center[:, None] + 0.5) * (1.0 / filterscale))
    raw = np.where(inside, raw, 0.0)
    total = np.zeros(count)
    for tap in range(ksize):  # Pillow sums the taps in order; so does this (no pairwise sum)
        total += raw[:, tap]
    normed = np.where(total[:, None] != 0.0, raw / np.where(total == 0.0, 1.0, total)[:, None], raw)
    fixed = normed * float(1 << PRECISION_BITS)
    fixed = np.trunc(np.where(normed < 0, fixed - 0.5, fixed + 0.5))
    lo = int(xmin.min()) if count else 0
    hi = int((xmin + xmax).max()) if count else 0
    weights = np.zeros((count, max(hi - lo, 0)))
    rows, cols = np.nonzero(inside)
    weights[rows, xmin[rows] + cols - lo] = fixed[rows, cols]
    weights.setflags(write=False)
    return weights, lo, hi


@dataclass(frozen=True)
class Geometry:
    """Where each output pixel of one image comes from, as :func:`.image._geometry` does it.

    The image is resized to ``resized`` (h, w); output row ``i`` / column ``j`` read
    resized row ``top + i`` / column ``left + j`` when that lies inside it, else ``fill``.
    """

    resized: tuple[int, int]
    top: int
    left: int
    size: tuple[int, int]
    fill: int


def _crop_offset(extent: int, crop: int) -> tuple[int, int]:
    """(start in the resized image, padding before it) of a centre crop or pad on one axis."""
    pad = max(crop - extent, 0)
    before = pad // 2
    padded = extent + pad
    start = 0 if padded == crop else int(round((padded - crop) / 2.0))
    return start - before, before


def plan_geometry(height: int, width: int, params: PreprocessParams) -> Geometry:
    """The resize target and crop window of an image of ``height`` x ``width``."""
    out_h, out_w = params.size
    if params.resize_mode == "squash":
        target, fill = (out_h, out_w), 0
    elif params.resize_mode == "longest":
        target, fill = _keep_ratio_size(height, width, params.size, 1.0), params.fill_color
    elif out_h == out_w:
        target, fill = _shortest_edge_size(height, width, out_h), 0
    else:
        target, fill = _keep_ratio_size(height, width, params.size, 0.0), 0
    if target != (height, width) and target[0] * target[1] > params.max_image_pixels:
        raise InvalidInputError(
            f"IMAGE aspect ratio {width}x{height} is too extreme: resizing it for "
            f"{out_w}x{out_h} needs {target[1]}x{target[0]} pixels"
        )
    top, _ = _crop_offset(target[0], out_h)
    left, _ = _crop_offset(target[1], out_w)
    return Geometry(tuple(target), top, left, (out_h, out_w), fill)


def _window(start: int, crop: int, extent: int) -> tuple[int, int, int]:
    """(first output index inside the image, first resized index, how many)."""
    first_out = max(-start, 0)
    last_out = min(extent - start, crop)
    return first_out, start + first_out, max(last_out - first_out, 0)


@functools.lru_cache(maxsize=512)
def _device_weights(torch: Any, device: str, *key):
    """:func:`resample_weights` as a float64 tensor on ``device``, uploaded once per shape."""
    weights, lo, hi = resample_weights(*key)
    return torch.from_numpy(weights.copy()).to(device), lo, hi


def _pass(torch: Any, pixels, matrix, axis: int):
    """One Pillow resampling pass over ``axis`` (1 rows, 2 columns) of float64 [3, H, W]."""
    if axis == 2:
        summed = torch.matmul(pixels, matrix.T)
    else:
        summed = torch.matmul(matrix, pixels)
    half, one = float(1 << (PRECISION_BITS - 1)), float(1 << PRECISION_BITS)
    return torch.floor((summed + half) / one).clamp_(0.0, 255.0)


def resize_crop(torch: Any, rgb, geometry: Geometry, interpolation: str):
    """uint8 HWC ``rgb`` (any torch device) to uint8 [3, h, w]: Pillow's resize, then crop/pad."""
    height, width = int(rgb.shape[0]), int(rgb.shape[1])
    out_h, out_w = geometry.size
    (row0, src_row0, rows) = _window(geometry.top, out_h, geometry.resized[0])
    (col0, src_col0, cols) = _window(geometry.left, out_w, geometry.resized[1])
    out = torch.full((3, out_h, out_w), geometry.fill, dtype=torch.uint8, device=rgb.device)
    if rows == 0 or cols == 0:
        return out
    planes = rgb.permute(2, 0, 1)
    new_h, new_w = geometry.resized
    # Only the source rows / columns that the kept output pixels read take part.
    if new_h != height:
        row_w, row_lo, row_hi = _device_weights(
            torch, str(rgb.device), height, new_h, interpolation, src_row0, rows
        )
    else:
        row_w, row_lo, row_hi = None, src_row0, src_row0 + rows
    if new_w != width:
        col_w, col_lo, col_hi = _device_weights(
            torch, str(rgb.device), width, new_w, interpolation, src_col0, cols
        )
    else:
        col_w, col_lo, col_hi = None, src_col0, src_col0 + cols
    planes = planes[:, row_lo:row_hi, col_lo:col_hi].to(torch.float64)
    # Pillow (13) runs the vertical pass first when the height shrinks by more than twice
    # what the width does, else the horizontal one; the 8-bit rounding between the two
    # passes makes the order part of the result.
    vertical_first = height - new_h > 0 and height - new_h > (width - new_w) * 2
    passes = [(col_w, 2), (row_w, 1)]
    for weights, axis in reversed(passes) if vertical_first else passes:
        if weights is not None:
            planes = _pass(torch, planes, weights, axis)
    out[:, row0 : row0 + rows, col0 : col0 + cols] = planes.to(torch.uint8)
    return out


def gpu_eligible(image: Image.Image, data: bytes) -> bool:
    """Whether the GPU decoder takes this image (else the exact CPU path does)."""
    return (
        image.format in GPU_FORMATS
        and image.mode in GPU_MODES
        and data.rstrip(b"\x00").endswith(_EOI)
    )


def nvimgcodec_decoder(device_id: int, apply_exif: bool, options: str = DECODER_OPTIONS):
    """A batch decode function on GPU ``device_id``: list of bytes -> list of HWC arrays or None.

    Each result is an nvImageCodec image on the device (``__cuda_array_interface__``),
    decoded on the given CUDA stream, with EXIF orientation applied when ``apply_exif``.
    """
    from nvidia import nvimgcodec  # noqa: PLC0415 - serve-time dependency of the GPU path

    decoder = nvimgcodec.Decoder(device_id=device_id, options=options)
    params = nvimgcodec.DecodeParams(
        apply_exif_orientation=apply_exif,
        color_spec=nvimgcodec.ColorSpec.SRGB,
        allow_any_depth=False,
    )

    def decode(datas: Sequence[bytes], stream: int) -> list:
        return list(decoder.decode(list(datas), params=params, cuda_stream=stream))

    return decode


class GpuPreprocessor:
    """Decode + preprocess a batch of opened images on a torch device (see module doc).

    ``decode`` takes (list of bytes, CUDA stream handle) and returns one HWC uint8 array
    (anything ``torch.as_tensor`` takes) or None per image; ``cpu_map`` maps a function
    over a list (a thread pool's ``map``) for the CPU path.
    """

    def __init__(self, params: PreprocessParams, torch: Any, device, decode, cpu_map=map):
        if params.interpolation not in GPU_INTERPOLATIONS:
            raise ValueError(
                f"image_decode 'gpu' supports interpolation {GPU_INTERPOLATIONS}, "
                f"not {params.interpolation!r}"
            )
        self.params, self.torch, self.device = params, torch, device
        self.decode, self.cpu_map = decode, cpu_map
        tables = channel_tables(params.mean, params.std)
        self.tables = torch.as_tensor(np.array(tables), device=device)
        self.gpu_images = self.cpu_images = 0

    def _stream(self) -> int:
        torch = self.torch
        if getattr(self.device, "type", str(self.device)) == "cuda":
            return int(torch.cuda.current_stream(self.device).cuda_stream)
        return 0

    def normalise(self, planes):
        """uint8 [3, h, w] to float32 [3, h, w] through the CPU path's lookup tables."""
        flat = planes.reshape(3, -1).to(self.torch.int64)
        return self.torch.gather(self.tables, 1, flat).reshape(planes.shape)

    def _on_device(self, decoded) -> Any:
        rgb = self.torch.as_tensor(decoded, device=self.device)
        if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != self.torch.uint8:
            raise ValueError(f"decoder returned {tuple(rgb.shape)} {rgb.dtype}, not HWC RGB")
        geometry = plan_geometry(int(rgb.shape[0]), int(rgb.shape[1]), self.params)
        planes = resize_crop(self.torch, rgb, geometry, self.params.interpolation)
        return self.normalise(planes)

    def _cpu(self, image: Image.Image):
        try:
            return self.torch.as_tensor(preprocess_opened(image, self.params), device=self.device)
        except Exception as exc:  # noqa: BLE001 - reported for this image alone
            return exc

    def to_host(self, tensors: Sequence[Any]) -> np.ndarray:
        """float32 [N, 3, H, W] numpy array of one request's device tensors."""
        return self.torch.stack(list(tensors)).cpu().numpy()

    def run(self, images: Sequence[Image.Image], datas: Sequence[bytes]) -> list:
        """float32 [3, H, W] device tensors, or the exception of each failed image."""
        results: list = [None] * len(images)
        pairs = zip(images, datas, strict=True)
        gpu = [i for i, (image, data) in enumerate(pairs) if gpu_eligible(image, data)]
        decoded: list = [None] * len(gpu)
        if gpu:
            try:
                decoded = self.decode([datas[i] for i in gpu], self._stream())
            except Exception:  # noqa: BLE001 - the whole batch falls back to the CPU path
                decoded = [None] * len(gpu)
        for i, item in zip(gpu, decoded, strict=True):
            if item is None:
                continue
            try:
                results[i] = self._on_device(item)
                images[i].close()
                self.gpu_images += 1
            except InvalidInputError as exc:
                results[i] = exc
        rest = [i for i, r in enumerate(results) if r is None]
        for i, out in zip(rest, self.cpu_map(self._cpu, [images[i] for i in rest]), strict=True):
            results[i] = out
            self.cpu_images += 1
        return results


def visible_gpus(proc: str = "/proc/driver/nvidia/gpus", dev: str = "/dev") -> list[str]:
    """The NVIDIA GPUs this host's driver lists, else its ``/dev/nvidiaN`` device files."""
    import os  # noqa: PLC0415

    try:
        listed = sorted(os.listdir(proc))
    except OSError:
        listed = []
    if listed:
        return listed
    try:
        return sorted(n for n in os.listdir(dev) if n.startswith("nvidia") and n[6:].isdigit())
    except OSError:
        return []


def require_cuda_device(
    what: str, proc: str = "/proc/driver/nvidia/gpus", dev: str = "/dev"
) -> None:
    """Raise when no NVIDIA GPU is visible: a GPU-only knob is refused where it cannot run."""
    if not visible_gpus(proc, dev):
        raise ValueError(
            f"{what} needs an NVIDIA GPU with its driver, and this host has none "
            f"({proc} lists no GPU); build on the GPU host that serves the model, or "
            "leave image_decode at 'cpu' (the exact Pillow path)"
        )


def cuda_preprocessor(params: PreprocessParams, device_id: int, cpu_map=map) -> GpuPreprocessor:
    """The serving :class:`GpuPreprocessor` on CUDA device ``device_id`` (nvImageCodec + torch).

    Fails loudly (the model does not load) when torch, CUDA or nvImageCodec is missing:
    a model configured for the GPU never quietly decodes on the CPU instead.
    """
    try:
        import torch  # noqa: PLC0415 - serve-time dependency of the GPU path only
    except ImportError as exc:
        raise RuntimeError(f"image_decode 'gpu' needs torch with CUDA: {exc}") from None
    if not torch.cuda.is_available():
        raise RuntimeError("image_decode 'gpu' needs a CUDA device; torch sees none")
    try:
        decode = nvimgcodec_decoder(device_id, params.apply_exif)
    except ImportError as exc:
        raise RuntimeError(
            f"image_decode 'gpu' needs nvImageCodec (nvidia-nvimgcodec-cu13): {exc}"
        ) from None
    device = torch.device("cuda", device_id)
    torch.cuda.set_device(device)
    return GpuPreprocessor(params, torch, device, decode, cpu_map)
