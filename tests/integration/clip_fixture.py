"""The tiny random-init OpenCLIP model the integration server serves, its images, and
open_clip's own answers for a checkpoint (:class:`ClipReference`)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

CLIP_MODEL = "clip-tiny"


def tiny_clip_entry(directory: Path) -> dict:
    """Save a tiny checkpoint under ``directory``; return its manifest entry."""
    from generator.fixtures.tiny_clip import create_tiny_checkpoint

    checkpoint = directory / "open_clip_pytorch_model.bin"
    create_tiny_checkpoint(checkpoint, seed=0)
    return {
        "name": CLIP_MODEL,
        "family": "open-clip",
        "arch": str(directory / "tiny-clip.json"),
        "checkpoint": str(checkpoint),
        "max_batch_size": 16,
        "encoder_instances": 1,  # one process per tower (the CPU profile would give two)
        "max_queue_delay_us": 5000,
        "max_rows_per_run": 8,
        "queue_timeout_us": 0,  # functional tests: no wait bound (conftest.QUEUE_TIMEOUT_US)
        "admission_wait_us": 60_000_000,  # nor an admission refusal (conftest.ADMISSION_WAIT_US)
    }


class ClipReference:
    """A served checkpoint in open_clip + PyTorch, the way users run it."""

    def __init__(self, arch: str, checkpoint: str):
        from generator.families.open_clip.assets import load_open_clip

        self.model, self.preprocess, self.tokenizer = load_open_clip(arch, checkpoint=checkpoint)

    def text(self, texts: list[str]) -> np.ndarray:
        import torch

        with torch.no_grad():
            return self.model.encode_text(self.tokenizer(texts), normalize=True).numpy()

    def pixels(self, blobs: list[bytes]):
        """open_clip's preprocessing of each encoded image, stacked (a torch tensor)."""
        import torch

        return torch.stack([self.preprocess(Image.open(io.BytesIO(b))) for b in blobs])

    def encode_pixels(self, pixels) -> np.ndarray:
        import torch

        with torch.no_grad():
            return self.model.encode_image(pixels, normalize=True).numpy()

    def images(self, blobs: list[bytes]) -> np.ndarray:
        return self.encode_pixels(self.pixels(blobs))

    def image(self, data: bytes) -> np.ndarray:
        return self.images([data])[0]

    def logits_per_image(self, blobs: list[bytes], texts: list[str]) -> np.ndarray:
        """open_clip's own forward: normalised features, scaled dot products [images, texts]."""
        import torch

        with torch.no_grad():
            image, text, scale = self.model(self.pixels(blobs), self.tokenizer(texts))[:3]
            return (scale * image @ text.T).numpy()


def _encode(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **kwargs)
    return buf.getvalue()


def sample_images() -> dict[str, bytes]:
    """Encoded test images of different sizes, aspect ratios, modes and formats."""
    rng = np.random.default_rng(0)

    def noise(h: int, w: int, channels: int = 3) -> np.ndarray:
        base = np.linspace(0, 255, h * w * channels).reshape(h, w, channels)
        return (base * 0.6 + rng.integers(0, 100, (h, w, channels))).clip(0, 255).astype(np.uint8)

    rgb = Image.fromarray(noise(240, 320))
    frames = [Image.fromarray(noise(48, 64)).convert("P") for _ in range(3)]
    gif = io.BytesIO()
    frames[0].save(gif, format="GIF", save_all=True, append_images=frames[1:], duration=50)
    deep = (np.linspace(0, 65535, 80 * 60).reshape(60, 80)).astype(np.uint16)
    exif = Image.Exif()
    exif[0x0112] = 6  # a phone photo taken upright: stored sideways, "rotate 90" in EXIF
    return {
        "photo.jpg": _encode(rgb, "JPEG", quality=90),
        "photo.png": _encode(rgb, "PNG"),
        "photo.webp": _encode(rgb, "WEBP", quality=90),
        "photo.bmp": _encode(rgb, "BMP"),
        "tall.png": _encode(Image.fromarray(noise(300, 7)), "PNG"),
        "panorama.jpg": _encode(Image.fromarray(noise(100, 3000)), "JPEG"),
        "pixel.png": _encode(Image.fromarray(noise(1, 1)), "PNG"),
        "rgba.png": _encode(Image.fromarray(noise(64, 64, 4), "RGBA"), "PNG"),
        "gray.png": _encode(Image.fromarray(noise(50, 70, 1)[:, :, 0], "L"), "PNG"),
        "cmyk.jpg": _encode(rgb.convert("CMYK"), "JPEG"),
        "rotated.jpg": _encode(Image.fromarray(noise(200, 320)), "JPEG", exif=exif, quality=90),
        "deep16.png": _encode(Image.fromarray(deep), "PNG"),
        "animated.gif": gif.getvalue(),
    }


def decompression_bomb() -> bytes:
    """A tiny PNG whose header claims 40000 x 40000 pixels."""
    return _encode(Image.new("1", (40000, 40000)), "PNG", optimize=True)


def mirrored(data: bytes) -> bytes:
    """The image of ``data`` flipped left to right, as PNG: other content, same statistics."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    return _encode(image.transpose(Image.Transpose.FLIP_LEFT_RIGHT), "PNG")
