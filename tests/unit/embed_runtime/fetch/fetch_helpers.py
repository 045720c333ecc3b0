"""What the fetch tests share: the local HTTP server with every route they use, its
fixtures, the policies and ``_error``."""

from __future__ import annotations

import dataclasses
import io
import socket
import struct
import threading

import pytest
from PIL import Image

from embed_runtime.errors import RequestError
from embed_runtime.fetch import url_fetch as fetch
from embed_runtime.fetch.url_fetch import FetchPolicy, fetch_url
from tests.http_servers import FakeDns, LocalServer, QuietHandler
from tests.http_servers import closed_port as free_port

SMALL_CAP = 1000
# Timeouts far above what an answer takes, for tests whose point is not a timeout: on a
# busy machine a 0.5 s timeout fired before the local server's answer (a timing flake).
LOCAL = FetchPolicy(allow_hosts=("127.0.0.1",), connect_timeout_s=5.0, read_timeout_s=5.0)
# For a timeout that must fire: what it waits for takes 20 s or more, and the elapsed
# time is only bounded far below that (SLOW_S), never just above the timeout.
SHORT = dataclasses.replace(LOCAL, connect_timeout_s=0.5, read_timeout_s=0.5)
SLOW_S = 10.0
# Tests where a slow URL must time out while local answers must not: the local ones get
# seconds, and the assertions compare the order of answers, not their times.
TARPIT = dataclasses.replace(LOCAL, read_timeout_s=3.0)


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (4, 3), (200, 10, 10)).save(buf, format="PNG")
    return buf.getvalue()


PNG = _png()


class _Handler(QuietHandler):
    """The fetch tests' routes: every way a server can answer (or not)."""

    def do_GET(self) -> None:
        path = self.path.partition("?")[0]
        self.server.hits[self.path] += 1
        base = f"http://127.0.0.1:{self.server.server_port}"
        simple = {
            "/image.png": (200, PNG, "image/png"),
            "/octet": (200, PNG, "application/octet-stream"),
            "/binary-octet": (200, PNG, "binary/octet-stream"),
            "/jpeg-charset": (200, PNG, "image/jpeg; charset=binary"),
            "/notype": (200, PNG, None),
            "/html": (200, b"<html>hi</html>", "text/html; charset=utf-8"),
            "/json": (200, b"{}", "application/json"),
            "/404": (404, b"nope", "text/plain"),
            "/429": (429, b"slow down", "text/plain"),
            "/500": (500, b"boom", "text/plain"),
            "/503": (503, b"busy", "text/plain"),
            "/big": (200, b"x" * (SMALL_CAP + 1), "image/png"),
            "/599": (599, b"odd", "text/plain"),
        }
        redirects = {
            "/redirect": "/image.png",
            "/redirect-absolute": f"{base}/image.png",
            "/loop-a": "/loop-b",
            "/loop-b": "/loop-a",
            "/to-metadata": "http://169.254.169.254/latest/meta-data/",
            "/to-private": "http://10.0.0.1/x.jpg",
            "/to-file": "file:///etc/passwd",
        }
        if path in simple:
            self.reply(*simple[path])
        elif path in redirects:
            self.redirect(redirects[path])
        elif path == "/see-other":
            self.redirect("/image.png", status=303)
        elif path.startswith("/to-port/"):
            self.redirect(f"http://127.0.0.1:{path.rsplit('/', 1)[1]}/image.png")
        elif path.startswith("/reason/"):
            self.send_response(int(path.rsplit("/", 1)[1]), "Secret upstream detail 10.9.8.7")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path == "/reset":
            linger = struct.pack("ii", 1, 0)
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
            self.connection.close()
        elif path == "/close":
            self.close_connection = True
        elif path == "/redirect-no-location":
            self.reply(302, ctype=None)
        elif path.startswith("/chain/"):
            left = int(path.rsplit("/", 1)[1])
            if left:
                self.redirect(f"/chain/{left - 1}")
            else:
                self.reply(200, PNG)
        elif path == "/claims-huge":
            self.reply(200, PNG, length=10**9)
        elif path == "/no-length-big":
            self.reply(200, b"x" * (SMALL_CAP * 5), length=None)
        elif path == "/chunked-big":
            chunk = b"x" * 100
            body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(50)) + b"0\r\n\r\n"
            self.reply(200, body, length=None, headers={"Transfer-Encoding": "chunked"})
        elif path == "/short":
            self.reply(200, PNG[:10], length=len(PNG))
        elif path == "/echo":
            body = f"{self.headers['Host']}|{self.headers['User-Agent']}".encode()
            self.reply(200, body, ctype="application/octet-stream")
        elif path == "/late":  # answers long after the time a test's fetch has left
            self.server.release.wait(2.5)
            self.reply(200, PNG)
        elif path == "/together":  # answers once ``server.together`` requests are here
            try:
                self.server.together.wait(10)
            except threading.BrokenBarrierError:
                self.reply(503, b"not concurrent", "text/plain")
            else:
                self.reply(200, PNG)
        elif path == "/hang":
            self.server.release.wait(30)
        elif path == "/drip":
            self.drip(100, 100)
        else:
            self.reply(404, b"unknown", "text/plain")


@pytest.fixture(scope="module")
def server():
    with LocalServer(_Handler) as srv:
        yield srv


@pytest.fixture(scope="module")
def base(server) -> str:
    return f"http://127.0.0.1:{server.server_port}"


@pytest.fixture
def closed_port() -> int:
    return free_port()


@pytest.fixture
def fake_dns(monkeypatch) -> FakeDns:
    dns = FakeDns()
    monkeypatch.setattr(fetch.socket, "getaddrinfo", dns.getaddrinfo)
    return dns


def _error(url: str, policy: FetchPolicy = LOCAL) -> RequestError:
    with pytest.raises(RequestError) as info:
        fetch_url(url, policy)
    assert url[:150] in info.value.message
    return info.value
