"""Fixed, reproducible benchmark workloads: texts, generated photos, a local image server.

Nothing here touches the network beyond 127.0.0.1: sentences come from
:mod:`client.corpus`, images are generated with numpy + Pillow from a fixed seed and,
for the ``IMAGE_URL`` ensembles, served by :class:`ImageServer` on 127.0.0.1.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from .corpus import varied_sentences

DEFAULT_POOL = 512

# (width, height, format): photo-like sizes from thumbnails to full HD, mixed formats.
IMAGE_SPECS = (
    (640, 480, "JPEG"),
    (1024, 768, "JPEG"),
    (800, 600, "PNG"),
    (1280, 720, "JPEG"),
    (500, 375, "WEBP"),
    (1920, 1080, "JPEG"),
    (300, 300, "PNG"),
    (720, 1280, "JPEG"),
    (1200, 800, "WEBP"),
    (224, 224, "JPEG"),
    (960, 640, "JPEG"),
    (1600, 1200, "JPEG"),
)
EXTENSIONS = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp"}


def text_pool(size: int = DEFAULT_POOL, seed: int = 0) -> list[str]:
    """The sentences every text load and the ORT ceiling draw from."""
    return varied_sentences(size, seed=seed)


def text_requests(
    pool: Sequence[str], per_request: int, count: int, start: int = 0
) -> list[list[bytes]]:
    """``count`` requests of ``per_request`` consecutive pool sentences (UTF-8), cycling.

    Request ``k`` takes the sentences starting at ``(start + k) * per_request``, so
    requests that together cover the pool cover it uniformly.
    """
    encoded = [text.encode("utf-8") for text in pool]
    out = []
    for k in range(count):
        first = (start + k) * per_request
        out.append([encoded[(first + j) % len(encoded)] for j in range(per_request)])
    return out


def _photo(width: int, height: int, rng: np.random.Generator):
    """A photo-like RGB image: smooth colour fields, shapes and sensor-like noise."""
    from PIL import Image, ImageDraw, ImageFilter  # noqa: PLC0415 - only for image loads

    coarse = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
    image = Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC)
    draw = ImageDraw.Draw(image)
    for _ in range(12):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        x1 = x0 + int(rng.integers(width // 20 + 1, width // 3 + 2))
        y1 = y0 + int(rng.integers(height // 20 + 1, height // 3 + 2))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
        shape((x0, y0, x1, y1), fill=colour)
    image = image.filter(ImageFilter.GaussianBlur(radius=1.5))
    noise = rng.normal(0, 6, (height, width, 3))
    pixels = (np.asarray(image, dtype=np.float32) + noise).clip(0, 255).astype(np.uint8)
    return Image.fromarray(pixels)


def generated_images(count: int = len(IMAGE_SPECS), seed: int = 0) -> dict[str, bytes]:
    """``count`` encoded photo-like images (name -> file bytes), identical on every call."""
    rng = np.random.default_rng(seed)
    images: dict[str, bytes] = {}
    for i in range(count):
        width, height, fmt = IMAGE_SPECS[i % len(IMAGE_SPECS)]
        buf = io.BytesIO()
        kwargs = {"quality": 88} if fmt in ("JPEG", "WEBP") else {}
        _photo(width, height, rng).save(buf, format=fmt, **kwargs)
        images[f"photo{i:02d}_{width}x{height}.{EXTENSIONS[fmt]}"] = buf.getvalue()
    return images


def image_requests(items: Sequence[bytes], per_request: int, count: int) -> list[list[bytes]]:
    """``count`` requests of ``per_request`` consecutive items (image bytes or URLs), cycling."""
    return [
        [items[(k * per_request + j) % len(items)] for j in range(per_request)]
        for k in range(count)
    ]


class ImageServer:
    """Serve images at ``http://127.0.0.1:<port>/img/<name>`` from a background thread.

    Use as a context manager; the port is chosen by the OS unless given.
    """

    def __init__(self, images: Mapping[str, bytes], port: int = 0):
        self.images = dict(images)
        handler = type("Handler", (_ImageHandler,), {"images": self.images})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.httpd.daemon_threads = True
        self.httpd.request_queue_size = 256
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def urls(self) -> list[str]:
        """The URL of every image, in name order."""
        return [f"{self.base_url}/img/{name}" for name in sorted(self.images)]

    def __enter__(self) -> ImageServer:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _ImageHandler(BaseHTTPRequestHandler):
    images: dict[str, bytes]
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        """Stay quiet: thousands of requests per run."""

    def do_GET(self) -> None:
        """Send ``/img/<name>`` or 404."""
        body = self.images.get(self.path[5:]) if self.path.startswith("/img/") else None
        status, ctype = (200, _content_type(self.path)) if body else (404, "text/plain")
        body = body or b"not found"
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _content_type(path: str) -> str:
    ext = path.rsplit(".", 1)[-1].lower()
    return {"jpg": "image/jpeg", "png": "image/png", "webp": "image/webp"}.get(
        ext, "application/octet-stream"
    )
