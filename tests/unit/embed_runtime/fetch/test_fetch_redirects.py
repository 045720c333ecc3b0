"""``embed_runtime.fetch.url_fetch`` redirects: followed, counted, looped, and every hop checked."""

from __future__ import annotations

import pytest

from embed_runtime.errors import INVALID_ARG
from embed_runtime.fetch.url_fetch import FetchPolicy, fetch_url
from tests.unit.embed_runtime.fetch import fetch_helpers
from tests.unit.embed_runtime.fetch.fetch_helpers import LOCAL, PNG, _error

server = fetch_helpers.server
base = fetch_helpers.base


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
