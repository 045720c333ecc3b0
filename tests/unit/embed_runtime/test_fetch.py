"""Tests of embed_runtime.fetch against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import base64
import dataclasses
import importlib.util
import io
import json
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pytest
from PIL import Image

import embed_runtime
from embed_runtime import fetch
from embed_runtime.errors import INTERNAL, INVALID_ARG, UNAVAILABLE, RequestError
from embed_runtime.fetch import ByteBudget, FetchPolicy, fetch_url
from embed_runtime.fetch_pool import FetchPool
from tests.http_servers import FakeDns, LocalServer, QuietHandler
from tests.http_servers import closed_port as free_port
from tests.unit import fake_pb_utils as pb

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


def test_fetch_returns_image_bytes_from_allowed_host(base):
    assert fetch_url(f"{base}/image.png", LOCAL) == PNG


@pytest.mark.parametrize("path", ["/octet", "/binary-octet", "/jpeg-charset", "/notype"])
def test_fetch_accepts_binary_and_missing_content_types(base, path):
    assert fetch_url(base + path, LOCAL) == PNG


@pytest.mark.parametrize("path", ["/html", "/json"])
def test_fetch_rejects_non_image_content_type(base, path):
    err = _error(base + path)
    assert err.code == INVALID_ARG
    assert "is not an image" in err.message


def test_fetch_rejects_loopback_when_not_allowed(base):
    err = _error(f"{base}/image.png", FetchPolicy(read_timeout_s=0.5))
    assert err.code == INVALID_ARG
    assert "address 127.0.0.1 is loopback" in err.message
    assert "allow_hosts" in err.message


def test_fetch_allows_loopback_inside_allowed_cidr(base):
    assert fetch_url(f"{base}/image.png", FetchPolicy(allow_hosts=("127.0.0.0/8",))) == PNG


def test_fetch_allows_host_name_on_allow_list(server):
    policy = FetchPolicy(allow_hosts=("LOCALHOST",), read_timeout_s=5.0)
    body = fetch_url(f"http://localhost:{server.server_port}/echo", policy)
    assert body.split(b"|")[0] == f"localhost:{server.server_port}".encode()


def test_fetch_sends_user_agent(base):
    policy = FetchPolicy(allow_hosts=("127.0.0.1",), user_agent="embed-test/9")
    assert fetch_url(f"{base}/echo", policy).endswith(b"|embed-test/9")


def test_fetch_accepts_upper_case_scheme(server):
    assert fetch_url(f"HTTP://127.0.0.1:{server.server_port}/image.png", LOCAL) == PNG


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://10.0.0.1/x.jpg", "10.0.0.1 is private"),
        ("http://172.16.5.4/x.jpg", "172.16.5.4 is private"),
        ("http://192.168.1.1/x.jpg", "192.168.1.1 is private"),
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is link-local"),
        ("http://100.64.0.1/x.jpg", "not globally routable"),
        ("http://224.0.0.1/x.jpg", "multicast"),
        ("http://0.0.0.0/x.jpg", "unspecified"),
        ("http://240.0.0.1/x.jpg", "reserved"),
        ("http://2130706433/x.jpg", "127.0.0.1 is loopback"),
        ("http://[::1]/x.jpg", "::1 is loopback"),
        ("http://[fc00::1]/x.jpg", "private"),
        ("http://[fe80::1]/x.jpg", "link-local"),
        ("http://[::ffff:10.0.0.1]/x.jpg", "private"),
        ("http://[::ffff:169.254.169.254]/x.jpg", "link-local"),
    ],
)
def test_fetch_rejects_private_address_when_not_allowed(url, reason):
    err = _error(url, FetchPolicy(read_timeout_s=0.5))
    assert err.code == INVALID_ARG
    assert f"IMAGE_URL '{url}' refused" in err.message
    assert reason in err.message


def test_fetch_allows_private_address_inside_allowed_cidr_only(server, fake_dns):
    fake_dns.first["images.example"] = ["127.0.0.1"]
    url = f"http://images.example:{server.server_port}/image.png"
    assert fetch_url(url, FetchPolicy(allow_hosts=("127.0.0.0/24",))) == PNG
    assert "loopback" in _error(url, FetchPolicy(allow_hosts=("10.0.0.0/8",))).message


def test_fetch_rejects_host_when_any_resolved_address_is_private(fake_dns):
    fake_dns.first["mixed.example"] = ["93.184.216.34", "10.1.2.3"]
    err = _error("http://mixed.example/x.png")
    assert err.code == INVALID_ARG
    assert "host 'mixed.example' resolves to an address that is private" in err.message


def test_fetch_never_shows_what_a_host_name_resolved_to(fake_dns):
    fake_dns.first["inside.example"] = ["10.1.2.3"]
    fake_dns.first["nat64.example"] = ["64:ff9b::a9fe:a9fe"]
    err = _error("http://inside.example/x.png")
    assert "10.1.2.3" not in err.message
    err = _error("http://nat64.example/x.png")
    assert err.code == INVALID_ARG
    assert "host 'nat64.example' resolves to an address that is NAT64" in err.message
    assert "a9fe" not in err.message


def test_fetch_names_the_literal_address_the_url_wrote():
    err = _error("http://2130706433/x.png", FetchPolicy(read_timeout_s=0.5))
    assert "address 127.0.0.1 is loopback" in err.message


def test_fetch_rejects_6to4_address_when_not_allowed():
    for url in ("http://[2002:7f00:1::1]/x.png", "http://[2002:808:808::1]/x.png"):
        err = _error(url)
        assert err.code == INVALID_ARG
        assert "is 6to4, which embeds an IPv4 address" in err.message


def test_fetch_rejects_site_local_address_when_not_allowed():
    err = _error("http://[fec0::1]/x.png")
    assert err.code == INVALID_ARG
    assert "address fec0::1 is site-local (add the host to allow_hosts" in err.message


@pytest.mark.parametrize("addr", ["64:ff9b::a9fe:a9fe", "64:ff9b:1::a00:1", "64:ff9b::808:808"])
def test_fetch_rejects_nat64_address_when_not_allowed(addr):
    err = _error(f"http://[{addr}]/x.png")
    assert err.code == INVALID_ARG
    assert f"address {addr} is NAT64, which embeds an IPv4 address" in err.message


def test_fetch_rejects_teredo_address_when_not_allowed():
    assert "is Teredo" in _error("http://[2001:0:4136:e378::1]/x.png").message


def test_fetch_allows_6to4_address_inside_allowed_cidr(monkeypatch):
    def refuse(self):
        raise ConnectionRefusedError("no network in unit tests")

    monkeypatch.setattr(fetch._PinnedConnection, "connect", refuse)
    policy = FetchPolicy(allow_hosts=("2002::/16",), read_timeout_s=0.5)
    err = _error("http://[2002:7f00:1::1]/x.png", policy)
    assert err.code == UNAVAILABLE
    assert "refused" in err.message and "6to4" not in err.message


def test_fetch_connects_to_the_checked_address_despite_dns_rebinding(server, fake_dns):
    fake_dns.first["rebind.example"] = ["127.0.0.1"]
    fake_dns.later["rebind.example"] = ["10.0.0.1"]
    body = fetch_url(f"http://rebind.example:{server.server_port}/echo", LOCAL)
    assert body.split(b"|")[0] == f"rebind.example:{server.server_port}".encode()
    assert fake_dns.calls["rebind.example"] == 1


def test_fetch_reports_dns_failure_as_unavailable(monkeypatch):
    def fail(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(fetch.socket, "getaddrinfo", fail)
    err = _error("http://no-such-host.invalid/x.png")
    assert err.code == UNAVAILABLE
    assert err.message.endswith("DNS lookup of 'no-such-host.invalid' failed (no such host)")


class _SlowDns:
    """``getaddrinfo`` taking ``delay_s`` (or until released) for ``*.slow.example``."""

    def __init__(self, delay_s: float):
        self.delay_s = delay_s
        self.release = threading.Event()
        self._real = socket.getaddrinfo

    def getaddrinfo(self, host, port, *args, **kwargs):
        if not host.endswith("slow.example"):
            return self._real(host, port, *args, **kwargs)
        self.release.wait(self.delay_s)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]


@pytest.fixture
def slow_dns(monkeypatch):
    dns = _SlowDns(60.0)
    monkeypatch.setattr(fetch.socket, "getaddrinfo", dns.getaddrinfo)
    yield dns
    dns.release.set()


class _SteppedClock:
    """``fetch``'s view of ``time``: the real monotonic clock plus ``skipped`` seconds."""

    def __init__(self) -> None:
        self.skipped = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.skipped


class _InstantSlowDns:
    """``getaddrinfo`` for ``*.slow.example`` that takes ``took_s`` of ``clock`` at once."""

    def __init__(self, clock: _SteppedClock):
        self.clock, self.took_s = clock, 0.0

    def getaddrinfo(self, host, port, *args, **kwargs):
        self.clock.skipped += self.took_s
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]


def test_fetch_bounds_a_hanging_dns_lookup_by_the_deadline(server, slow_dns):
    policy = dataclasses.replace(SHORT, connect_timeout_s=30.0)  # the deadline bounds it
    start = time.monotonic()
    err = _error(f"http://hang.slow.example:{server.server_port}/image.png", policy)
    assert time.monotonic() - start < SLOW_S  # the lookup hangs 60 s, the deadline is 0.5 s
    assert err.code == UNAVAILABLE
    assert err.message.endswith("DNS lookup of 'hang.slow.example' timed out")


def test_fetch_bounds_dns_lookup_by_connect_timeout(server, slow_dns):
    policy = FetchPolicy(allow_hosts=("127.0.0.1",), connect_timeout_s=0.5, read_timeout_s=30)
    start = time.monotonic()
    err = _error(f"http://hang.slow.example:{server.server_port}/image.png", policy)
    assert time.monotonic() - start < SLOW_S  # not the 30 s deadline
    assert "DNS lookup of 'hang.slow.example' timed out" in err.message


def test_fetch_counts_dns_time_against_the_deadline(server, monkeypatch):
    # The lookup takes seconds of fetch's clock and none of the wall's: what is left of
    # the 5 s deadline after it is exact, whatever the load on the machine.
    clock = _SteppedClock()
    dns = _InstantSlowDns(clock)
    monkeypatch.setattr(fetch, "time", clock)
    monkeypatch.setattr(fetch.socket, "getaddrinfo", dns.getaddrinfo)
    dns.took_s = 2.0  # under connect_timeout_s, 3 s of the deadline left
    assert fetch_url(f"http://a.slow.example:{server.server_port}/image.png", LOCAL) == PNG
    dns.took_s = 4.9  # under connect_timeout_s, 0.1 s left for an answer that takes 2.5 s
    start = time.monotonic()
    err = _error(f"http://b.slow.example:{server.server_port}/late")
    assert time.monotonic() - start < 2.5  # timed out before the answer, not after it
    assert err.code == UNAVAILABLE
    assert "timed out" in err.message


@pytest.mark.parametrize(
    "url",
    ["file:///etc/passwd", "ftp://example.com/x.png", "gopher://example.com/", "javascript:x"],
)
def test_fetch_rejects_forbidden_scheme(url):
    err = _error(url)
    assert err.code == INVALID_ARG
    assert "is not allowed" in err.message


def test_fetch_rejects_https_when_scheme_not_allowed():
    policy = FetchPolicy(allowed_schemes=("http",))
    assert "'https' is not allowed" in _error("https://example.com/x.png", policy).message


@pytest.mark.parametrize(
    "url",
    [
        "",
        "not a url",
        "http://",
        "http:///x.png",
        "example.com/x.png",
        "http://[::1/x",
        "http://host:99999/x",
        "http://exa mple.com/x",
        "http://a..b/x",
        "data:no-comma",
    ],
)
def test_fetch_rejects_malformed_url(url):
    err = _error(url)
    assert err.code == INVALID_ARG
    assert "malformed" in err.message


def test_fetch_decodes_base64_data_uri():
    url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert fetch_url(url, LOCAL) == PNG


def test_fetch_decodes_percent_encoded_data_uri():
    assert fetch_url("data:," + quote(PNG), LOCAL) == PNG
    assert fetch_url("data:,hello%20world", LOCAL) == b"hello world"


def test_fetch_rejects_data_uri_over_max_bytes():
    policy = FetchPolicy(max_bytes=SMALL_CAP)
    url = "data:image/png;base64," + base64.b64encode(b"x" * (SMALL_CAP + 1)).decode()
    err = _error(url, policy)
    assert err.code == INVALID_ARG
    assert f"max_bytes={SMALL_CAP}" in err.message
    assert fetch_url("data:;base64," + base64.b64encode(b"x" * SMALL_CAP).decode(), policy)


def test_fetch_rejects_bad_data_uris():
    assert "invalid base64" in _error("data:image/png;base64,@@@@").message
    assert "is not an image" in _error("data:text/html,<b>hi</b>").message


@pytest.mark.parametrize("path", ["/big", "/claims-huge", "/no-length-big", "/chunked-big"])
def test_fetch_rejects_body_over_max_bytes(base, path):
    policy = FetchPolicy(allow_hosts=("127.0.0.1",), max_bytes=SMALL_CAP, read_timeout_s=5.0)
    err = _error(base + path, policy)
    assert err.code == INVALID_ARG
    assert f"over max_bytes={SMALL_CAP}" in err.message


def test_fetch_reports_truncated_body_as_unavailable(base):
    err = _error(f"{base}/short")
    assert err.code == UNAVAILABLE
    assert f"after 10 of {len(PNG)} bytes" in err.message


@pytest.mark.parametrize(
    ("path", "code"),
    [("/404", INVALID_ARG), ("/429", UNAVAILABLE), ("/500", UNAVAILABLE), ("/503", UNAVAILABLE)],
)
def test_fetch_maps_http_status_to_error_code(base, path, code):
    err = _error(base + path)
    assert err.code == code
    assert f"HTTP {path[1:]}" in err.message


@pytest.mark.parametrize(
    ("status", "shown", "code"),
    [
        (404, "HTTP 404 Not Found", INVALID_ARG),
        (403, "HTTP 403 Forbidden", INVALID_ARG),
        (503, "HTTP 503 Service Unavailable", UNAVAILABLE),
    ],
)
def test_fetch_shows_standard_status_phrase_not_the_upstream_reason(base, status, shown, code):
    err = _error(f"{base}/reason/{status}")
    assert err.code == code
    assert err.message.endswith(f"unavailable: {shown}" if code == UNAVAILABLE else shown)
    assert "Secret" not in err.message and "10.9.8.7" not in err.message


def test_fetch_shows_bare_code_for_unknown_status(base):
    err = _error(f"{base}/599")
    assert err.code == UNAVAILABLE
    assert err.message.endswith("unavailable: HTTP 599")


@pytest.mark.parametrize(
    ("path", "phrase"),
    [("/reset", "connection reset"), ("/close", "connection closed without a response")],
)
def test_fetch_describes_network_errors_with_a_fixed_phrase(base, path, phrase):
    err = _error(base + path)  # a reset or a close arrives at once
    assert err.code == UNAVAILABLE
    assert err.message.endswith(f"unavailable: {phrase}")
    assert "Errno" not in err.message and "peer" not in err.message


@pytest.mark.parametrize("path", ["/redirect", "/redirect-absolute", "/see-other", "/chain/3"])
def test_fetch_follows_redirects(base, path):
    assert fetch_url(base + path, LOCAL) == PNG


def test_fetch_rejects_too_many_redirects(base):
    err = _error(f"{base}/chain/4")
    assert err.code == INVALID_ARG
    assert "more than max_redirects=3" in err.message
    assert "after redirect to" in err.message


def test_fetch_rejects_redirect_when_max_redirects_is_zero(base):
    policy = FetchPolicy(allow_hosts=("127.0.0.1",), max_redirects=0)
    assert "more than max_redirects=0" in _error(f"{base}/redirect", policy).message


def test_fetch_rejects_redirect_loop(base):
    err = _error(f"{base}/loop-a")
    assert err.code == INVALID_ARG
    assert "redirect loop" in err.message


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/to-metadata", "address 169.254.169.254 is link-local"),
        ("/to-private", "address 10.0.0.1 is private"),
        ("/to-file", "scheme 'file' is not allowed"),
        ("/redirect-no-location", "without Location"),
    ],
)
def test_fetch_checks_every_redirect_hop(base, path, reason):
    err = _error(base + path)
    assert err.code == INVALID_ARG
    assert reason in err.message


def test_fetch_redirect_error_names_original_url_and_hop(base):
    err = _error(f"{base}/to-private")
    assert err.message == (
        f"IMAGE_URL '{base}/to-private' refused: address 10.0.0.1 is private (add the host to "
        "allow_hosts to permit it) (after redirect to 'http://10.0.0.1/x.jpg')"
    )


def test_fetch_allows_ports_on_allowed_ports(server, base):
    policy = FetchPolicy(allow_hosts=("127.0.0.1",), allowed_ports=(server.server_port, 8443))
    assert fetch_url(f"{base}/image.png", policy) == PNG


def test_fetch_rejects_port_not_on_allowed_ports(server, closed_port):
    policy = FetchPolicy(allow_hosts=("127.0.0.1",), allowed_ports=(server.server_port,))
    err = _error(f"http://127.0.0.1:{closed_port}/image.png", policy)
    assert err.code == INVALID_ARG
    assert f"port {closed_port} is not allowed (allowed: {server.server_port})" in err.message


def test_fetch_checks_default_port_against_allowed_ports(fake_dns):
    fake_dns.first["example.com"] = ["93.184.216.34"]
    err = _error("http://example.com/x.png", FetchPolicy(allowed_ports=(443,)))
    assert "port 80 is not allowed (allowed: 443)" in err.message
    assert fake_dns.calls["example.com"] == 0


def test_fetch_checks_allowed_ports_on_every_redirect_hop(server, base, closed_port):
    policy = FetchPolicy(allow_hosts=("127.0.0.1",), allowed_ports=(server.server_port,))
    err = _error(f"{base}/to-port/{closed_port}", policy)
    assert err.code == INVALID_ARG
    assert f"port {closed_port} is not allowed" in err.message
    assert "after redirect to" in err.message


def test_fetch_reports_connection_refused_as_unavailable(closed_port):
    err = _error(f"http://127.0.0.1:{closed_port}/x.png")
    assert err.code == UNAVAILABLE
    assert "refused" in err.message


def test_fetch_times_out_when_server_never_answers(base):
    start = time.monotonic()
    err = _error(f"{base}/hang", SHORT)
    assert time.monotonic() - start < SLOW_S  # the server holds it 30 s
    assert err.code == UNAVAILABLE
    assert "timed out" in err.message


def test_fetch_cuts_off_slow_drip_at_total_deadline(base):
    start = time.monotonic()
    err = _error(f"{base}/drip", SHORT)
    elapsed = time.monotonic() - start
    assert 0.4 < elapsed < SLOW_S  # a byte every 0.2 s for 20 s
    assert err.code == UNAVAILABLE
    assert "timed out" in err.message


def test_fetch_reports_tls_failure_as_unavailable(server):
    err = _error(f"https://127.0.0.1:{server.server_port}/image.png")
    assert err.code == UNAVAILABLE
    assert "TLS" in err.message or "connection" in err.message


def test_fetch_truncates_long_url_in_message():
    url = "ftp://example.com/" + "a" * 500
    with pytest.raises(RequestError) as info:
        fetch_url(url, LOCAL)
    assert url[:150] in info.value.message
    assert "..." in info.value.message
    assert len(info.value.message) < 350


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    tmp = tmp_path_factory.mktemp("tls")
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=images.example",
            "-addext",
            "subjectAltName=DNS:images.example",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    srv = LocalServer(_Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    srv.socket = context.wrap_socket(srv.socket, server_side=True)
    with srv:
        yield srv, cert


def test_fetch_verifies_tls_certificate_for_original_host(tls_server, fake_dns, monkeypatch):
    srv, cert = tls_server
    fake_dns.first["images.example"] = ["127.0.0.1"]
    fake_dns.first["other.example"] = ["127.0.0.1"]
    url = f"https://images.example:{srv.server_port}/image.png"
    untrusted = _error(url)
    assert untrusted.code == UNAVAILABLE
    assert untrusted.message.endswith("unavailable: TLS certificate verification failed")
    monkeypatch.setattr(fetch, "_tls_context", lambda: ssl.create_default_context(cafile=cert))
    assert fetch_url(url, LOCAL) == PNG
    mismatch = _error(f"https://other.example:{srv.server_port}/image.png")
    assert mismatch.code == UNAVAILABLE


@pytest.fixture
def pool():
    pools: list[FetchPool] = []

    def make(policy: FetchPolicy = LOCAL, max_concurrency: int = 16) -> FetchPool:
        pools.append(FetchPool(policy, max_concurrency))
        return pools[-1]

    yield make
    for p in pools:
        p.close()


class _Answers:
    """Records ``on_done`` calls of ``FetchPool.fetch_groups`` with their time."""

    def __init__(self, expected: int):
        self.expected = expected
        self.start = time.monotonic()
        self.calls: list[tuple[int, float, list]] = []
        self._lock = threading.Lock()
        self.all_done = threading.Event()

    def __call__(self, group: int, results: list) -> None:
        with self._lock:
            self.calls.append((group, time.monotonic() - self.start, results))
            if len(self.calls) >= self.expected:
                self.all_done.set()

    def wait(self) -> dict[int, tuple[float, list]]:
        assert self.all_done.wait(10)
        time.sleep(0.05)
        groups = [g for g, _, _ in self.calls]
        assert sorted(groups) == list(range(self.expected)), "one answer per group"
        return {g: (t, r) for g, t, r in self.calls}


def test_fetch_pool_runs_urls_concurrently(server, base, pool):
    # The server answers none of the 16 until all 16 are in flight at once (one after
    # another, the first waits for the others until its barrier breaks: 503).
    server.together = threading.Barrier(16)
    urls = [f"{base}/together?i={i}" for i in range(16)]
    assert pool(max_concurrency=16).fetch(urls) == [PNG] * 16


def test_fetch_pool_keeps_order_and_returns_errors(base, closed_port, pool):
    urls = [
        f"{base}/image.png",
        f"{base}/404",
        "file:///etc/passwd",
        "data:;base64," + base64.b64encode(b"abc").decode(),
        f"{base}/500",
        f"http://127.0.0.1:{closed_port}/x",
        f"{base}/octet",
    ]
    results = pool(max_concurrency=4).fetch(urls)
    assert results[0] == PNG and results[3] == b"abc" and results[6] == PNG
    codes = {i: r.code for i, r in enumerate(results) if isinstance(r, RequestError)}
    assert codes == {1: INVALID_ARG, 2: INVALID_ARG, 4: UNAVAILABLE, 5: UNAVAILABLE}
    for i in codes:
        assert urls[i] in results[i].message


def test_fetch_pool_fetches_repeated_url_once(base, server, pool):
    url = f"{base}/image.png?dedupe"
    assert pool(max_concurrency=4).fetch([url, url, url]) == [PNG] * 3
    assert server.hits["/image.png?dedupe"] == 1


def test_fetch_pool_wraps_unexpected_errors_as_internal(pool):
    results = pool(max_concurrency=2).fetch([None, "data:,ok"])  # type: ignore[list-item]
    assert isinstance(results[0], RequestError) and results[0].code == INTERNAL
    assert "internal error (AttributeError)" in results[0].message
    assert results[1] == b"ok"


def test_fetch_groups_answers_each_group_as_soon_as_its_own_urls_are_done(base, server, pool):
    groups = [
        [f"{base}/drip?tarpit"],
        [f"{base}/image.png?fast"],
        [f"{base}/octet?a", f"{base}/image.png?fast", "data:,x"],
        [],
        [f"{base}/image.png?fast", f"{base}/drip?tarpit"],
    ]
    answers = _Answers(len(groups))
    pool(TARPIT).fetch_groups(groups, answers)
    answered_at_return = {g for g, _, _ in list(answers.calls)}
    got = answers.wait()
    assert not answered_at_return & {0, 4}  # returned without waiting for the tarpit
    for fast in (1, 2, 3):  # each before any tarpit group, which waits out the 3 s deadline
        assert got[fast][0] < min(got[0][0], got[4][0])
    assert got[1][1] == [PNG] and got[2][1] == [PNG, PNG, b"x"] and got[3][1] == []
    for slow in (0, 4):
        assert got[slow][0] > TARPIT.read_timeout_s - 0.1
        assert got[slow][1][-1].code == UNAVAILABLE
        assert "timed out" in got[slow][1][-1].message
    assert got[4][1][0] == PNG
    assert server.hits["/image.png?fast"] == 1 and server.hits["/drip?tarpit"] == 1


def test_fetch_groups_blocks_while_max_concurrency_urls_are_in_flight(base, pool):
    fetcher = pool(TARPIT, max_concurrency=2)
    answers = _Answers(3)
    fetcher.fetch_groups([[f"{base}/hang?1"], [f"{base}/hang?2"]], answers)
    start = time.monotonic()
    fetcher.fetch_groups([[f"{base}/image.png?after-slot"]], lambda _g, r: answers(2, r))
    assert time.monotonic() - start > TARPIT.read_timeout_s / 2  # until a hang timed out
    assert {g for g, _, _ in list(answers.calls)} & {0, 1}
    got = answers.wait()
    assert got[2][1] == [PNG]
    assert got[0][1][0].code == got[1][1][0].code == UNAVAILABLE


def test_fetch_pool_close_returns_at_once_and_fails_waiting_urls(base, pool):
    fetcher = pool(TARPIT, max_concurrency=1)
    answers = _Answers(2)
    fetcher.fetch_groups([[f"{base}/hang?close"]], answers)
    waiting = threading.Thread(
        target=fetcher.fetch_groups,
        args=([[f"{base}/image.png?late"]], lambda _g, r: answers(1, r)),
    )
    waiting.start()  # blocks for the one slot, before or after close: "shutting down" both
    time.sleep(0.1)
    fetcher.close()
    assert not answers.calls  # close did not wait for the hang (3 s to its timeout)
    got = answers.wait()
    waiting.join(2)
    assert "timed out" in got[0][1][0].message
    late = got[1][1][0]
    assert late.code == UNAVAILABLE and "shutting down" in late.message
    after = fetcher.fetch(["data:,x"])
    assert after[0].code == UNAVAILABLE and "shutting down" in after[0].message


def test_fetch_pool_fails_the_url_that_passes_max_batch_bytes(base, pool):
    policy = FetchPolicy(allow_hosts=("127.0.0.1",), max_batch_bytes=2 * len(PNG) + 10)
    fetcher = pool(policy, max_concurrency=1)
    results = fetcher.fetch([f"{base}/image.png?b={i}" for i in range(3)])
    assert results[:2] == [PNG, PNG]
    err = results[2]
    assert err.code == INVALID_ARG
    assert err.message.endswith(
        f"refused: the images of this batch are over max_batch_bytes={2 * len(PNG) + 10} together"
    )
    assert fetcher.fetch([f"{base}/image.png?next-batch"]) == [PNG]


def test_fetch_pool_counts_streamed_bodies_and_data_uris_against_max_batch_bytes(base, pool):
    policy = FetchPolicy(allow_hosts=("127.0.0.1",), max_batch_bytes=SMALL_CAP * 6)
    data = "data:;base64," + base64.b64encode(b"x" * SMALL_CAP * 2).decode()
    results = pool(policy, max_concurrency=1).fetch([f"{base}/no-length-big", data])
    assert results[0] == b"x" * SMALL_CAP * 5
    assert results[1].code == INVALID_ARG and "max_batch_bytes" in results[1].message


def test_fetch_refuses_declared_length_over_batch_budget_before_reading(base):
    budget = ByteBudget(len(PNG) - 1)
    with pytest.raises(RequestError, match="max_batch_bytes") as info:
        fetch_url(f"{base}/image.png", LOCAL, budget)
    assert info.value.code == INVALID_ARG
    assert budget.left() == len(PNG) - 1


def test_fetch_pool_rejects_zero_concurrency():
    with pytest.raises(ValueError, match="max_concurrency"):
        FetchPool(LOCAL, 0)


FINAL = 2


class _Sender:
    """Records what the adapter sends for one request."""

    def __init__(self) -> None:
        self.sent: list[tuple[pb.InferenceResponse, int, float]] = []
        self.start = time.monotonic()
        self.event = threading.Event()

    def send(self, response=None, flags=0) -> None:
        self.sent.append((response, flags, time.monotonic() - self.start))
        self.event.set()

    def one(self) -> tuple[pb.InferenceResponse, float]:
        assert self.event.wait(5)
        time.sleep(0.05)
        assert len(self.sent) == 1 and self.sent[0][1] == FINAL
        return self.sent[0][0], self.sent[0][2]


class _UrlRequest(pb.InferenceRequest):
    def __init__(self, *urls: bytes | str):
        rows = [[u.encode() if isinstance(u, str) else u] for u in urls]
        super().__init__([pb.Tensor("IMAGE_URL", np.array(rows, dtype=object))])
        self.sender = _Sender()

    def get_response_sender(self) -> _Sender:
        return self.sender


@pytest.fixture
def fetch_model(monkeypatch, request):
    """The ``fetch_image`` adapter on the fake ``pb_utils``, as Triton loads it.

    Its read timeout is 5 s, or ``request.param`` (indirect parametrization).
    """
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    monkeypatch.setattr(pb, "TRITONSERVER_RESPONSE_COMPLETE_FINAL", FINAL, raising=False)
    path = Path(embed_runtime.__file__).parent / "models" / "fetch_image.py"
    spec = importlib.util.spec_from_file_location("_adapter_fetch_image", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    params = {
        "allow_hosts": "127.0.0.1",
        "connect_timeout_s": "5",
        "read_timeout_s": str(getattr(request, "param", 5.0)),
        "max_bytes": "100000",
        "max_redirects": "3",
        "max_concurrency": "4",
        "allowed_ports": "",
        "max_batch_bytes": str(3 * len(PNG)),
    }
    model = module.TritonPythonModel()
    model.initialize(
        {
            "model_config": json.dumps(
                {"parameters": {k: {"string_value": v} for k, v in params.items()}}
            )
        }
    )
    yield model
    model.finalize()


@pytest.mark.parametrize("fetch_model", [TARPIT.read_timeout_s], indirect=True)
def test_fetch_model_answers_each_request_when_its_own_urls_are_done(fetch_model, base):
    tarpit = _UrlRequest(f"{base}/image.png?a", f"{base}/drip?model")
    fast = _UrlRequest(f"{base}/image.png?a", "data:,x")
    bad = _UrlRequest(b"\xff\xfe")
    refused = _UrlRequest("http://[2002:7f00:1::1]/x.png")
    assert fetch_model.execute([tarpit, fast, bad, refused]) is None
    # execute held its batch until every request was answered (a stub that dies while it
    # holds them leaves Triton's backend to fail them, never to forget them) ...
    assert all(len(r.sender.sent) == 1 for r in (tarpit, fast, bad, refused))
    response, at = fast.sender.one()
    assert at < tarpit.sender.sent[0][2]  # ... and answered the fast one first
    assert response.output("IMAGE")[:, 0].tolist() == [PNG, b"x"]
    for request, code, fragment in (
        (bad, pb.TritonError.INVALID_ARG, "not valid UTF-8"),
        (refused, pb.TritonError.INVALID_ARG, "is 6to4"),
        (tarpit, pb.TritonError.UNAVAILABLE, "timed out"),
    ):
        response, at = request.sender.one()
        assert response.error().code() == code
        assert fragment in response.error().message()
    assert tarpit.sender.sent[0][2] > TARPIT.read_timeout_s - 0.1


def test_fetch_model_execute_returns_only_once_its_batch_is_answered(fetch_model, base):
    """A request left open after ``execute`` is lost with the stub; so none is left."""

    def late(groups, on_done):
        timer = threading.Timer(0.4, on_done, args=(0, [PNG]))
        timer.start()

    fetch_model.pool.fetch_groups = late
    request = _UrlRequest(f"{base}/image.png?late")
    start = time.monotonic()
    fetch_model.execute([request])
    assert time.monotonic() - start >= 0.35
    assert len(request.sender.sent) == 1 and not request.sender.sent[0][0].has_error()


def test_fetch_model_stops_holding_a_request_no_fetch_answers(fetch_model, monkeypatch):
    """A bug that never answers does not hold the instance for ever: logged, returned."""
    monkeypatch.setitem(type(fetch_model).execute.__globals__, "HOLD_MARGIN_S", 0.2)
    fetch_model.url_deadline_s = 0.1
    fetch_model.pool.fetch_groups = lambda groups, on_done: None
    pb.Logger.clear()
    start = time.monotonic()
    fetch_model.execute([_UrlRequest("http://127.0.0.1:9/x.png")])
    assert time.monotonic() - start < 5
    assert any("1 request(s) still open" in m for level, m in pb.Logger.messages)


def test_fetch_model_applies_max_batch_bytes_per_execute(fetch_model, base):
    requests = [_UrlRequest(f"{base}/image.png?budget={i}") for i in range(4)]
    fetch_model.execute(requests)
    errors = [r for r in requests if r.sender.one()[0].has_error()]
    assert len(errors) == 1
    assert "max_batch_bytes" in errors[0].sender.sent[0][0].error().message()
    again = _UrlRequest(f"{base}/image.png?next")
    fetch_model.execute([again])
    assert not again.sender.one()[0].has_error()


def test_fetch_model_sends_one_response_per_request_when_the_pool_fails(fetch_model, base):
    def fail_after_first(groups, on_done):
        on_done(0, [PNG])
        raise RuntimeError("pool broke")

    fetch_model.pool.fetch_groups = fail_after_first
    first, second = _UrlRequest(f"{base}/image.png"), _UrlRequest(f"{base}/octet")
    fetch_model.execute([first, second])
    assert not first.sender.one()[0].has_error()
    error = second.sender.one()[0].error()
    assert error.code() == pb.TritonError.INTERNAL
    assert "pool broke" not in error.message()


class _BrokenTensor(pb.Tensor):
    def as_numpy(self):
        raise RuntimeError("tensor broke")


def test_fetch_model_answers_every_request_when_reading_inputs_fails(fetch_model, base):
    good = _UrlRequest(f"{base}/image.png")
    broken = _UrlRequest()
    broken._inputs = [_BrokenTensor("IMAGE_URL", np.empty((1, 1), dtype=object))]
    assert fetch_model.execute([good, broken]) is None
    for request in (good, broken):
        error = request.sender.one()[0].error()
        assert error.code() == pb.TritonError.INTERNAL
        assert "tensor broke" not in error.message()


def test_from_parameters_parses_all_keys():
    policy = FetchPolicy.from_parameters(
        {
            "allow_hosts": " 127.0.0.1, 10.0.0.0/8 ,images.example,",
            "connect_timeout_s": "1.5",
            "read_timeout_s": "4",
            "max_bytes": "1048576",
            "max_redirects": "0",
            "allowed_ports": " 443, 8443,",
            "max_batch_bytes": "4194304",
            "unrelated": "ignored",
        }
    )
    assert policy.allow_hosts == ("127.0.0.1", "10.0.0.0/8", "images.example")
    assert (policy.allowed_ports, policy.max_batch_bytes) == ((443, 8443), 4194304)
    assert (policy.connect_timeout_s, policy.read_timeout_s) == (1.5, 4.0)
    assert (policy.max_bytes, policy.max_redirects) == (1048576, 0)


def test_from_parameters_keeps_defaults_for_absent_keys():
    assert FetchPolicy.from_parameters({}) == FetchPolicy()
    assert FetchPolicy.from_parameters({"allow_hosts": ""}).allow_hosts == ()
    assert FetchPolicy.from_parameters({"allowed_ports": ""}).allowed_ports == ()


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("connect_timeout_s", "abc"),
        ("connect_timeout_s", "0"),
        ("read_timeout_s", "-1"),
        ("read_timeout_s", "nan"),
        ("read_timeout_s", "inf"),
        ("max_bytes", "1.5"),
        ("max_bytes", "0"),
        ("max_redirects", "-1"),
        ("max_redirects", ""),
        ("allow_hosts", "10.0.0.0/33"),
        ("allowed_ports", "80,http"),
        ("allowed_ports", "0"),
        ("allowed_ports", "65536"),
        ("allowed_ports", "-1"),
        ("max_batch_bytes", "0"),
        ("max_batch_bytes", "1e9"),
    ],
)
def test_from_parameters_rejects_bad_value(key, value):
    with pytest.raises(ValueError, match=key):
        FetchPolicy.from_parameters({key: value})
