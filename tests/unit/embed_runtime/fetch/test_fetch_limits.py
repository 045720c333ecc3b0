"""``embed_runtime.fetch.url_fetch`` limits and deadlines: DNS, body size, timeouts, batch cap."""

from __future__ import annotations

import dataclasses
import socket
import threading
import time

import pytest

from embed_runtime.errors import INVALID_ARG, UNAVAILABLE, RequestError
from embed_runtime.fetch import url_fetch as fetch
from embed_runtime.fetch.url_fetch import ByteBudget, FetchPolicy, fetch_url
from tests.unit.embed_runtime.fetch import fetch_helpers
from tests.unit.embed_runtime.fetch.fetch_helpers import (
    LOCAL,
    PNG,
    SHORT,
    SLOW_S,
    SMALL_CAP,
    _error,
)

server = fetch_helpers.server
base = fetch_helpers.base


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


def test_fetch_refuses_declared_length_over_batch_budget_before_reading(base):
    budget = ByteBudget(len(PNG) - 1)
    with pytest.raises(RequestError, match="max_batch_bytes") as info:
        fetch_url(f"{base}/image.png", LOCAL, budget)
    assert info.value.code == INVALID_ARG
    assert budget.left() == len(PNG) - 1
