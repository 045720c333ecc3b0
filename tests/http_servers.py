"""Real HTTP servers on 127.0.0.1 for the tests, and a fake resolver: one place for both.

- :class:`LocalServer` runs any handler on a free port in a thread (a context manager);
  :class:`QuietHandler` is a handler base with reply / redirect helpers and no log;
- :class:`ImageServer` serves test images and misbehaves on purpose (the integration
  tests' image URLs);
- :class:`FakeDns` answers chosen addresses for chosen names (SSRF and rebinding tests);
- :func:`closed_port` is a port nothing listens on.

The fetch unit tests (tests/unit/embed_runtime/fetch/test_url_fetch.py) keep their own route table
on :class:`LocalServer`; the health check tests record requests with it.
"""

from __future__ import annotations

import collections
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing, with helpers for the common answers."""

    server: LocalServer

    def log_message(self, *args) -> None:
        """Quiet: the tests assert what they need."""

    def reply(
        self,
        status: int,
        body: bytes = b"",
        ctype: str | None = "image/png",
        length: int | None = -1,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Status, headers and body; ``length`` -1: the body's, None: no Content-Length."""
        self.send_response(status)
        if ctype:
            self.send_header("Content-Type", ctype)
        if length is not None:
            self.send_header("Content-Length", str(len(body) if length < 0 else length))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def redirect(self, location: str, status: int = 302) -> None:
        """A redirect without a body."""
        self.reply(status, ctype=None, headers={"Location": location})

    def image_headers(self, length: int) -> None:
        """A 200 with image headers promising ``length`` bytes; the body is up to the caller."""
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(length))
        self.end_headers()

    def drip(self, length: int, count: int, every_s: float = 0.2) -> None:
        """Image headers promising ``length`` bytes, then ``count`` single bytes, one every
        ``every_s`` s, until the server's ``release`` is set."""
        self.image_headers(length)
        for _ in range(count):
            if self.server.release.wait(every_s):
                return
            self.wfile.write(b"x")
            self.wfile.flush()


class LocalServer(ThreadingHTTPServer):
    """``handler`` on 127.0.0.1, a free port, in a daemon thread while the ``with`` lasts.

    ``hits`` counts requests by target (for handlers that record them), ``seen`` lists
    them in order, ``release`` ends handlers that hold a request open.
    """

    request_queue_size = 128
    daemon_threads = True

    def __init__(self, handler: type[BaseHTTPRequestHandler]):
        super().__init__(("127.0.0.1", 0), handler)
        self.hits: collections.Counter[str] = collections.Counter()
        self.seen: list[str] = []
        self.release = threading.Event()
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def base(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.server_port}"

    def url(self, path: str) -> str:
        """The URL of ``path`` on this server."""
        return f"{self.base}{path}"

    def handle_error(self, request, client_address) -> None:
        """Quiet: clients that hang up early are part of the tests."""

    def __enter__(self) -> LocalServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.shutdown()
        self.server_close()


class FakeDns:
    """``getaddrinfo`` answering ``first`` on a name's first lookup and ``later`` after.

    Names not in ``first`` resolve for real. Install it over the module under test's
    ``socket.getaddrinfo`` (monkeypatch).
    """

    def __init__(self) -> None:
        self.first: dict[str, list[str]] = {}
        self.later: dict[str, list[str]] = {}
        self.calls: collections.Counter[str] = collections.Counter()
        self._real = socket.getaddrinfo

    def getaddrinfo(self, host, port, *args, **kwargs):
        if host not in self.first:
            return self._real(host, port, *args, **kwargs)
        self.calls[host] += 1
        ips = self.first[host] if self.calls[host] == 1 else self.later.get(host, self.first[host])
        return [
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", (ip, port, 0, 0))
            if ":" in ip
            else (socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port))
            for ip in ips
        ]


class _ImageHandler(QuietHandler):
    """The routes of :class:`ImageServer`."""

    owner: ImageServer

    def _hold(self, drip_every_s: float | None) -> None:
        """Send image headers, then nothing (or one byte per ``drip_every_s``) for hang_s."""
        self.image_headers(100000)
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

    def do_GET(self) -> None:
        path = self.path
        self.server.seen.append(path)
        route = path.partition("?")[0]
        if route == "/silent":
            self._hold(None)
        elif route == "/tarpit":
            self._hold(0.3)
        elif route.startswith("/img/") and route[5:] in self.owner.images:
            self.reply(200, self.owner.images[route[5:]], "application/octet-stream")
        elif route.startswith("/slow/") and route[6:] in self.owner.images:
            time.sleep(self.owner.slow_s)
            self.reply(200, self.owner.images[route[6:]], "application/octet-stream")
        elif path == "/status/500":
            self.reply(500, b"boom", "text/plain")
        elif path == "/html":
            self.reply(200, b"<html>not an image</html>", "text/html")
        elif path == "/big":
            self.reply(200, b"\0" * 3_000_000, "image/jpeg")
        elif path == "/hang":
            time.sleep(self.owner.hang_s)
            self.reply(200, b"late")
        elif path == "/drip":
            self.drip(1000, 40)
        elif path in ("/loop/a", "/loop/b"):
            self.redirect("/loop/b" if path == "/loop/a" else "/loop/a")
        elif path == "/to-metadata":
            self.redirect("http://169.254.169.254/latest/meta-data/")
        elif path == "/to-photo":
            self.redirect("/img/photo.jpg")
        else:
            self.reply(404, b"not found", "text/plain")


class ImageServer:
    """Routes: ``/img/<name>`` plus failure routes (see ``_ImageHandler.do_GET``).

    ``/silent`` and ``/tarpit`` (any query) are tarpits: image headers, then nothing or a
    byte every 0.3 s, for ``hang_s``; ``/img/<name>?<anything>`` is the image;
    ``/slow/<name>`` is the image after ``slow_s`` seconds.
    """

    def __init__(self, images: dict[str, bytes], hang_s: float = 5.0, slow_s: float = 1.0):
        self.images = images
        self.hang_s = hang_s
        self.slow_s = slow_s
        self.httpd = LocalServer(type("Handler", (_ImageHandler,), {"owner": self}))

    @property
    def base(self) -> str:
        return self.httpd.base

    def url(self, path: str) -> str:
        return self.httpd.url(path)

    def __enter__(self) -> ImageServer:
        self.httpd.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.__exit__(*exc)
