"""``embed_runtime.fetch.url_fetch`` address checks: private, loopback and embedded-IPv4 addresses,
DNS answers and rebinding, the host allow list and allowed ports."""

from __future__ import annotations

import socket

import pytest

from embed_runtime.errors import INVALID_ARG, UNAVAILABLE
from embed_runtime.fetch import url_fetch as fetch
from embed_runtime.fetch.url_fetch import FetchPolicy, fetch_url
from tests.unit.embed_runtime.fetch import fetch_helpers
from tests.unit.embed_runtime.fetch.fetch_helpers import LOCAL, PNG, _error

server = fetch_helpers.server
base = fetch_helpers.base
closed_port = fetch_helpers.closed_port
fake_dns = fetch_helpers.fake_dns


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
