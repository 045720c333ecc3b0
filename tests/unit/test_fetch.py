"""Tests of generator.runtime.fetch against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import base64
import collections
import io
import shutil
import socket
import ssl
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote

import pytest
from PIL import Image

from generator.runtime import fetch
from generator.runtime.errors import INTERNAL, INVALID_ARG, UNAVAILABLE, RequestError
from generator.runtime.fetch import FetchPolicy, fetch_all, fetch_url

SMALL_CAP = 1000
LOCAL = FetchPolicy(allow_hosts=("127.0.0.1",), connect_timeout_s=0.5, read_timeout_s=0.5)


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (4, 3), (200, 10, 10)).save(buf, format="PNG")
    return buf.getvalue()


PNG = _png()


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args) -> None:
        pass

    def _reply(
        self,
        status: int,
        body: bytes = b"",
        ctype: str | None = "image/png",
        length: int | None = -1,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        if ctype:
            self.send_header("Content-Type", ctype)
        if length is not None:
            self.send_header("Content-Length", str(len(body) if length < 0 else length))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _redirect(self, location: str, status: int = 302) -> None:
        self._reply(status, ctype=None, headers={"Location": location})

    def do_GET(self) -> None:  # noqa: N802
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
            self._reply(*simple[path])
        elif path in redirects:
            self._redirect(redirects[path])
        elif path == "/see-other":
            self._redirect("/image.png", status=303)
        elif path == "/redirect-no-location":
            self._reply(302, ctype=None)
        elif path.startswith("/chain/"):
            left = int(path.rsplit("/", 1)[1])
            if left:
                self._redirect(f"/chain/{left - 1}")
            else:
                self._reply(200, PNG)
        elif path == "/claims-huge":
            self._reply(200, PNG, length=10**9)
        elif path == "/no-length-big":
            self._reply(200, b"x" * (SMALL_CAP * 5), length=None)
        elif path == "/chunked-big":
            chunk = b"x" * 100
            body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(50)) + b"0\r\n\r\n"
            self._reply(200, body, length=None, headers={"Transfer-Encoding": "chunked"})
        elif path == "/short":
            self._reply(200, PNG[:10], length=len(PNG))
        elif path == "/echo":
            body = f"{self.headers['Host']}|{self.headers['User-Agent']}".encode()
            self._reply(200, body, ctype="application/octet-stream")
        elif path == "/slow":
            time.sleep(0.3)
            self._reply(200, PNG)
        elif path == "/hang":
            self.server.release.wait(5)
        elif path == "/drip":
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", "100")
            self.end_headers()
            for _ in range(100):
                if self.server.release.wait(0.2):
                    return
                self.wfile.write(b"x")
                self.wfile.flush()
        else:
            self._reply(404, b"unknown", "text/plain")


class _Server(ThreadingHTTPServer):
    request_queue_size = 64

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.hits: collections.Counter[str] = collections.Counter()
        self.release = threading.Event()

    def handle_error(self, request, client_address) -> None:
        pass


@pytest.fixture(scope="module")
def server():
    srv = _Server()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.release.set()
    srv.shutdown()
    srv.server_close()


@pytest.fixture(scope="module")
def base(server) -> str:
    return f"http://127.0.0.1:{server.server_port}"


@pytest.fixture
def closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


class _FakeDns:
    """``getaddrinfo`` answering ``first`` on a name's first lookup and ``later`` after."""

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
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port)) for ip in ips]


@pytest.fixture
def fake_dns(monkeypatch) -> _FakeDns:
    dns = _FakeDns()
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
    policy = FetchPolicy(allow_hosts=("LOCALHOST",), read_timeout_s=0.5)
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
    assert "address 10.1.2.3 is private" in err.message


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
    assert "DNS lookup" in err.message


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
    policy = FetchPolicy(allow_hosts=("127.0.0.1",), max_bytes=SMALL_CAP, read_timeout_s=0.5)
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


def test_fetch_reports_connection_refused_as_unavailable(closed_port):
    err = _error(f"http://127.0.0.1:{closed_port}/x.png")
    assert err.code == UNAVAILABLE
    assert "refused" in err.message


def test_fetch_times_out_when_server_never_answers(base):
    start = time.monotonic()
    err = _error(f"{base}/hang")
    assert time.monotonic() - start < 1.5
    assert err.code == UNAVAILABLE
    assert "timed out" in err.message


def test_fetch_cuts_off_slow_drip_at_total_deadline(base):
    start = time.monotonic()
    err = _error(f"{base}/drip")
    elapsed = time.monotonic() - start
    assert 0.4 < elapsed < 1.5
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
    srv = _Server()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    srv.socket = context.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv, cert
    srv.release.set()
    srv.shutdown()
    srv.server_close()


def test_fetch_verifies_tls_certificate_for_original_host(tls_server, fake_dns, monkeypatch):
    srv, cert = tls_server
    fake_dns.first["images.example"] = ["127.0.0.1"]
    fake_dns.first["other.example"] = ["127.0.0.1"]
    url = f"https://images.example:{srv.server_port}/image.png"
    untrusted = _error(url)
    assert untrusted.code == UNAVAILABLE
    assert "CERTIFICATE_VERIFY_FAILED" in untrusted.message
    monkeypatch.setattr(fetch, "_tls_context", lambda: ssl.create_default_context(cafile=cert))
    assert fetch_url(url, LOCAL) == PNG
    mismatch = _error(f"https://other.example:{srv.server_port}/image.png")
    assert mismatch.code == UNAVAILABLE


def test_fetch_all_runs_concurrently(base):
    urls = [f"{base}/slow?i={i}" for i in range(16)]
    start = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        results = fetch_all(urls, LOCAL, pool)
    assert time.monotonic() - start < 2.0
    assert results == [PNG] * 16


def test_fetch_all_keeps_order_and_returns_errors(base, closed_port):
    urls = [
        f"{base}/image.png",
        f"{base}/404",
        "file:///etc/passwd",
        "data:;base64," + base64.b64encode(b"abc").decode(),
        f"{base}/500",
        f"http://127.0.0.1:{closed_port}/x",
        f"{base}/octet",
    ]
    with ThreadPoolExecutor(4) as pool:
        results = fetch_all(urls, LOCAL, pool)
    assert results[0] == PNG and results[3] == b"abc" and results[6] == PNG
    codes = {i: r.code for i, r in enumerate(results) if isinstance(r, RequestError)}
    assert codes == {1: INVALID_ARG, 2: INVALID_ARG, 4: UNAVAILABLE, 5: UNAVAILABLE}
    for i in codes:
        assert urls[i] in results[i].message


def test_fetch_all_fetches_repeated_url_once(base, server):
    url = f"{base}/image.png?dedupe"
    with ThreadPoolExecutor(4) as pool:
        assert fetch_all([url, url, url], LOCAL, pool) == [PNG] * 3
    assert server.hits["/image.png?dedupe"] == 1


def test_fetch_all_wraps_unexpected_errors_as_internal():
    with ThreadPoolExecutor(2) as pool:
        results = fetch_all([None, "data:,ok"], LOCAL, pool)  # type: ignore[list-item]
    assert isinstance(results[0], RequestError) and results[0].code == INTERNAL
    assert "internal error (AttributeError)" in results[0].message
    assert results[1] == b"ok"


def test_from_parameters_parses_all_keys():
    policy = FetchPolicy.from_parameters(
        {
            "allow_hosts": " 127.0.0.1, 10.0.0.0/8 ,images.example,",
            "connect_timeout_s": "1.5",
            "read_timeout_s": "4",
            "max_bytes": "1048576",
            "max_redirects": "0",
            "unrelated": "ignored",
        }
    )
    assert policy.allow_hosts == ("127.0.0.1", "10.0.0.0/8", "images.example")
    assert (policy.connect_timeout_s, policy.read_timeout_s) == (1.5, 4.0)
    assert (policy.max_bytes, policy.max_redirects) == (1048576, 0)


def test_from_parameters_keeps_defaults_for_absent_keys():
    assert FetchPolicy.from_parameters({}) == FetchPolicy()
    assert FetchPolicy.from_parameters({"allow_hosts": ""}).allow_hosts == ()


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
    ],
)
def test_from_parameters_rejects_bad_value(key, value):
    with pytest.raises(ValueError, match=key):
        FetchPolicy.from_parameters({key: value})
