"""``embed_runtime.fetch.url_fetch`` against a real HTTP server on 127.0.0.1: content types,
schemes and URLs, data URIs, HTTP status and network errors, TLS."""

from __future__ import annotations

import base64
import shutil
import ssl
import subprocess
from urllib.parse import quote

import pytest

from embed_runtime.errors import INVALID_ARG, UNAVAILABLE, RequestError
from embed_runtime.fetch import url_fetch as fetch
from embed_runtime.fetch.url_fetch import FetchPolicy, fetch_url
from tests.http_servers import LocalServer
from tests.unit.embed_runtime.fetch import fetch_helpers
from tests.unit.embed_runtime.fetch.fetch_helpers import LOCAL, PNG, SMALL_CAP, _error, _Handler

server = fetch_helpers.server
base = fetch_helpers.base
closed_port = fetch_helpers.closed_port
fake_dns = fetch_helpers.fake_dns


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


def test_fetch_sends_user_agent(base):
    policy = FetchPolicy(allow_hosts=("127.0.0.1",), user_agent="embed-test/9")
    assert fetch_url(f"{base}/echo", policy).endswith(b"|embed-test/9")


def test_fetch_accepts_upper_case_scheme(server):
    assert fetch_url(f"HTTP://127.0.0.1:{server.server_port}/image.png", LOCAL) == PNG


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


def test_fetch_reports_connection_refused_as_unavailable(closed_port):
    err = _error(f"http://127.0.0.1:{closed_port}/x.png")
    assert err.code == UNAVAILABLE
    assert "refused" in err.message


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
