"""A real HTTP server on 127.0.0.1 that serves test images and misbehaves on purpose."""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ImageServer:
    """Routes: ``/img/<name>`` plus the failure routes handled in ``_Handler``.

    ``/silent`` and ``/tarpit`` (any query) are tarpits: image headers, then nothing or a
    byte every 0.3 s, for ``hang_s``; ``/img/<name>?<anything>`` is the image.
    """

    def __init__(self, images: dict[str, bytes], hang_s: float = 5.0):
        self.images = images
        self.hang_s = hang_s
        handler = type("Handler", (_Handler,), {"owner": self})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.httpd.request_queue_size = 128
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def url(self, path: str) -> str:
        return f"{self.base}{path}"

    def __enter__(self) -> ImageServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class _Handler(BaseHTTPRequestHandler):
    owner: ImageServer

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, body: bytes, ctype: str = "image/png", **headers) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for key, value in headers.items():
            self.send_header(key.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def _redirect(self, location: str) -> None:
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _hold(self, drip_every_s: float | None) -> None:
        """Send image headers, then nothing (or one byte per ``drip_every_s``) for hang_s."""
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", "100000")
        self.end_headers()
        self.wfile.flush()
        end = time.monotonic() + self.owner.hang_s
        while time.monotonic() < end:
            time.sleep(drip_every_s or 0.1)
            if drip_every_s:
                try:
                    self.wfile.write(b"x")
                    self.wfile.flush()
                except OSError:
                    return

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        path = self.path
        route = path.partition("?")[0]
        if route == "/silent":
            self._hold(None)
        elif route == "/tarpit":
            self._hold(0.3)
        elif route.startswith("/img/") and route[5:] in self.owner.images:
            self._send(200, self.owner.images[route[5:]], "application/octet-stream")
        elif path == "/status/500":
            self._send(500, b"boom", "text/plain")
        elif path == "/html":
            self._send(200, b"<html>not an image</html>", "text/html")
        elif path == "/big":
            self._send(200, b"\0" * 3_000_000, "image/jpeg")
        elif path == "/hang":
            time.sleep(self.owner.hang_s)
            self._send(200, b"late")
        elif path == "/drip":
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", "1000")
            self.end_headers()
            for _ in range(40):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.2)
        elif path == "/loop/a":
            self._redirect("/loop/b")
        elif path == "/loop/b":
            self._redirect("/loop/a")
        elif path == "/to-metadata":
            self._redirect("http://169.254.169.254/latest/meta-data/")
        elif path == "/to-photo":
            self._redirect("/img/photo.jpg")
        else:
            self._send(404, b"not found", "text/plain")
