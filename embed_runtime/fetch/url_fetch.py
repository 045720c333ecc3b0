"""Fetch image URLs with SSRF guards, timeouts and byte caps (standard library only).

Every hop of a fetch checks its port, resolves its host once (on a helper thread, so the
lookup counts against the deadline), refuses the hop unless every resolved address is
public (or allow-listed), then connects to exactly those checked addresses while sending
the original ``Host`` header and TLS server name, so a DNS answer that changes between
check and connect (rebinding) cannot reach a private address. Redirects are followed by
hand and each hop is checked again. ``read_timeout_s`` bounds each socket read and the
whole fetch, DNS and redirects included. Messages never show what a host name resolved
to, an upstream status line or exception text: only fixed phrases.

:class:`~.fetch_pool.FetchPool` runs the URLs of a batch concurrently.
"""

from __future__ import annotations

import base64
import binascii
import errno
import functools
import http.client
import io
import ipaddress
import math
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import quote, unquote_to_bytes, urljoin, urlsplit

from ..errors import InvalidInputError, RequestError, UnavailableError

_IP = ipaddress.IPv4Address | ipaddress.IPv6Address
_NET = ipaddress.IPv4Network | ipaddress.IPv6Network
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_RETRYABLE = frozenset({408, 429})
_BINARY_TYPES = frozenset({"application/octet-stream", "binary/octet-stream"})
_REFUSED = {
    "is_unspecified": "unspecified",
    "is_loopback": "loopback",
    "is_link_local": "link-local",
    "is_multicast": "multicast",
    "is_reserved": "reserved",
    "is_private": "private",
}
_EMBEDS_IPV4 = "which embeds an IPv4 address"
_REFUSED_V6 = tuple(
    (ipaddress.IPv6Network(net), what)
    for net, what in (
        ("2002::/16", f"6to4, {_EMBEDS_IPV4}"),
        ("2001::/32", f"Teredo, {_EMBEDS_IPV4}"),
        ("64:ff9b::/96", f"NAT64, {_EMBEDS_IPV4}"),
        ("64:ff9b:1::/48", f"NAT64, {_EMBEDS_IPV4}"),
        ("fec0::/10", "site-local"),
    )
)
_NETWORK_FAILURES: tuple[tuple[type[BaseException], str], ...] = (
    (http.client.RemoteDisconnected, "connection closed without a response"),
    (http.client.IncompleteRead, "connection closed before the body was complete"),
    (http.client.HTTPException, "malformed HTTP response"),
    (ssl.SSLCertVerificationError, "TLS certificate verification failed"),
    (ssl.SSLError, "TLS error"),
    (ConnectionResetError, "connection reset"),
    (ConnectionError, "connection failed"),
)
_ERRNO_FAILURES = {
    errno.ENETUNREACH: "network unreachable",
    errno.EHOSTUNREACH: "host unreachable",
    errno.EADDRNOTAVAIL: "address not available",
}
_GAI_FAILURES = {
    socket.EAI_NONAME: "no such host",
    socket.EAI_AGAIN: "temporary failure",
}
_ACCEPT = "image/*, */*;q=0.5"
_CHUNK = 65536
_URL_SHOWN = 200


@dataclass(frozen=True)
class FetchPolicy:
    """What ``fetch_url`` may reach and how long and how much it may read."""

    allow_hosts: tuple[str, ...] = ()
    connect_timeout_s: float = 3.0
    read_timeout_s: float = 10.0
    max_bytes: int = 20 * 1024 * 1024
    max_redirects: int = 3
    allowed_schemes: tuple[str, ...] = ("http", "https")
    user_agent: str = "triton-embeddings-fetch/1.0"
    allowed_ports: tuple[int, ...] = ()
    max_batch_bytes: int = 128 * 1024 * 1024
    _names: frozenset[str] = field(init=False, repr=False, compare=False)
    _networks: tuple[_NET, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Validate the limits and split ``allow_hosts`` into host names and networks."""
        for name in ("connect_timeout_s", "read_timeout_s", "max_bytes", "max_batch_bytes"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if self.max_redirects < 0:
            raise ValueError(f"max_redirects must be >= 0, got {self.max_redirects!r}")
        if not set(self.allowed_schemes) <= {"http", "https"}:
            raise ValueError(f"allowed_schemes must be http/https, got {self.allowed_schemes}")
        bad_ports = [p for p in self.allowed_ports if isinstance(p, bool) or not 0 < p < 65536]
        if bad_ports:
            raise ValueError(f"allowed_ports must be ports in 1..65535, got {bad_ports}")
        names, networks = set(), []
        for entry in self.allow_hosts:
            try:
                networks.append(ipaddress.ip_network(entry.strip(), strict=False))
            except ValueError:
                if "/" in entry or not entry.strip():
                    raise ValueError(
                        f"allow_hosts entry {entry!r} is not a host, IP or CIDR"
                    ) from None
                names.add(entry.strip().lower().rstrip("."))
        object.__setattr__(self, "_names", frozenset(names))
        object.__setattr__(self, "_networks", tuple(networks))

    def allows_name(self, host: str) -> bool:
        """Whether ``host`` is an allow-listed host name."""
        return host.lower().rstrip(".") in self._names

    def allows_address(self, addr: _IP) -> bool:
        """Whether ``addr`` lies in an allow-listed IP or CIDR."""
        return any(addr in net for net in self._networks)


class ByteBudget:
    """The bytes that the fetches of one batch may still read together (thread-safe)."""

    def __init__(self, limit: int):
        self.limit = limit
        self._used = 0
        self._lock = threading.Lock()

    def left(self) -> int:
        """Bytes not yet taken."""
        with self._lock:
            return self.limit - self._used

    def take(self, n: int) -> bool:
        """Take ``n`` bytes; False (taking nothing) if that would pass the limit."""
        with self._lock:
            if self._used + n > self.limit:
                return False
            self._used += n
            return True


class _Fail(Exception):
    """A failure of one hop, turned into a public ``RequestError`` by ``fetch_url``."""

    def __init__(self, error: type[RequestError], reason: str):
        super().__init__(reason)
        self.error, self.reason = error, reason


class _Redirect(Exception):
    def __init__(self, location: str):
        super().__init__(location)
        self.location = location


def shown_url(url: str) -> str:
    """``url`` cut to a length fit for an error message."""
    return url if len(url) <= _URL_SHOWN else url[: _URL_SHOWN - 3] + "..."


def _budget_spent(budget: ByteBudget) -> _Fail:
    return _Fail(
        InvalidInputError,
        f"the images of this batch are over max_batch_bytes={budget.limit} together",
    )


def fetch_url(url: str, policy: FetchPolicy, budget: ByteBudget | None = None) -> bytes:
    """The body of ``url`` (http, https or data), checked against ``policy``.

    Bytes read are also taken from ``budget`` when given (shared by one batch).
    Raises ``InvalidInputError`` for a malformed or refused URL or port, too many
    redirects, a body over ``max_bytes`` or over the batch budget, a non-image content
    type or HTTP 4xx; ``UnavailableError`` for DNS failure, refused connection, timeout
    (DNS included) or HTTP 5xx. Messages name the URL.
    """
    url = url.strip()
    deadline = time.monotonic() + policy.read_timeout_s
    current, seen = url, {url}
    try:
        if url[:5].lower() == "data:":
            return _decode_data_uri(url, policy, budget)
        for _ in range(policy.max_redirects + 1):
            try:
                return _fetch_hop(current, policy, deadline, budget)
            except _Redirect as redirect:
                current = urljoin(current, redirect.location).partition("#")[0]
                if current in seen:
                    raise _Fail(InvalidInputError, "redirect loop") from None
                seen.add(current)
        raise _Fail(InvalidInputError, f"more than max_redirects={policy.max_redirects} redirects")
    except _Fail as fail:
        verb = "unavailable" if fail.error is UnavailableError else "refused"
        hop = f" (after redirect to '{shown_url(current)}')" if current != url else ""
        raise fail.error(f"IMAGE_URL '{shown_url(url)}' {verb}: {fail.reason}{hop}") from None


def _check_content_type(value: str | None) -> None:
    media = (value or "").partition(";")[0].strip().lower()
    if media and not media.startswith("image/") and media not in _BINARY_TYPES:
        raise _Fail(InvalidInputError, f"content type {media!r} is not an image")


def _decode_data_uri(url: str, policy: FetchPolicy, budget: ByteBudget | None) -> bytes:
    header, comma, payload = url[5:].partition(",")
    if not comma:
        raise _Fail(InvalidInputError, "malformed data URI (no ',')")
    params = [p.strip().lower() for p in header.split(";")]
    _check_content_type(params[0])
    data = unquote_to_bytes(payload)
    if params[-1] == "base64":
        data = b"".join(data.split()).replace(b"-", b"+").replace(b"_", b"/")
        try:
            data = base64.b64decode(data + b"=" * (-len(data) % 4), validate=True)
        except binascii.Error:
            raise _Fail(InvalidInputError, "malformed data URI (invalid base64)") from None
    if len(data) > policy.max_bytes:
        raise _Fail(InvalidInputError, f"data URI body is over max_bytes={policy.max_bytes}")
    if budget is not None and not budget.take(len(data)):
        raise _budget_spent(budget)
    return data


def _parse(url: str, policy: FetchPolicy) -> tuple[str, str, int, str]:
    """Scheme, ASCII host, port and request target of an http(s) URL."""
    if any(c <= " " or c == "\x7f" for c in url):
        raise _Fail(InvalidInputError, "malformed URL (contains whitespace or control chars)")
    try:
        parts = urlsplit(url)
        port = parts.port
        host = (parts.hostname or "").encode("idna").decode("ascii")
    except (ValueError, UnicodeError):
        raise _Fail(InvalidInputError, "malformed URL (bad host or port)") from None
    scheme = parts.scheme.lower()
    if not scheme:
        raise _Fail(InvalidInputError, "malformed URL (no scheme)")
    if scheme not in policy.allowed_schemes:
        allowed = ", ".join(policy.allowed_schemes)
        raise _Fail(InvalidInputError, f"scheme {scheme!r} is not allowed (allowed: {allowed})")
    if not host:
        raise _Fail(InvalidInputError, "malformed URL (no host)")
    port = port or (443 if scheme == "https" else 80)
    if policy.allowed_ports and port not in policy.allowed_ports:
        allowed = ", ".join(map(str, policy.allowed_ports))
        raise _Fail(InvalidInputError, f"port {port} is not allowed (allowed: {allowed})")
    target = quote(parts.path or "/", safe="/%:@!$&'()*+,;=~")
    if parts.query:
        target += "?" + quote(parts.query, safe="/%:@!$&'()*+,;=~?")
    return scheme, host, port, target


def _refusal(addr: _IP) -> str | None:
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        else:
            for net, what in _REFUSED_V6:
                if addr in net:
                    return what
    for prop, what in _REFUSED.items():
        if getattr(addr, prop):
            return what
    return None if addr.is_global else "not globally routable"


def _is_literal(host: str) -> bool:
    """Whether ``host`` is an IP address written out (any form the resolver takes as one)."""
    try:
        ipaddress.ip_address(host.partition("%")[0])
        return True
    except ValueError:
        pass
    try:
        socket.inet_aton(host)
        return True
    except OSError:
        return False


def _lookup(host: str, port: int, timeout: float) -> list:
    """``getaddrinfo`` on a helper thread, waited for at most ``timeout`` seconds."""
    box: list = []
    done = threading.Event()

    def run() -> None:
        try:
            box.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except Exception as exc:  # noqa: BLE001 - handed to the waiting thread
            box.append(exc)
        done.set()

    threading.Thread(target=run, name="fetch-dns", daemon=True).start()
    if not done.wait(timeout):
        raise TimeoutError("DNS lookup")
    if isinstance(box[0], Exception):
        raise box[0]
    return box[0]


def _resolve(host: str, port: int, policy: FetchPolicy, deadline: float) -> list[tuple[int, tuple]]:
    """Resolved ``(family, sockaddr)`` pairs of ``host``, each checked against ``policy``.

    A host name's lookup is bounded by ``connect_timeout_s`` and the fetch's deadline;
    refusals name the address only when the URL wrote it.
    """
    literal = _is_literal(host)
    try:
        if literal:
            flags = socket.AI_NUMERICHOST
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=flags)
        else:
            infos = _lookup(host, port, _time_left(deadline, policy.connect_timeout_s))
    except TimeoutError:
        raise _Fail(UnavailableError, f"DNS lookup of {host!r} timed out") from None
    except socket.gaierror as exc:
        reason = _GAI_FAILURES.get(exc.errno, "lookup failed")
        raise _Fail(UnavailableError, f"DNS lookup of {host!r} failed ({reason})") from None
    except (OSError, UnicodeError):
        raise _Fail(UnavailableError, f"DNS lookup of {host!r} failed (lookup failed)") from None
    addrs = list(dict.fromkeys((family, sockaddr) for family, _, _, _, sockaddr in infos))
    if policy.allows_name(host):
        return addrs
    for _, sockaddr in addrs:
        addr = ipaddress.ip_address(sockaddr[0].partition("%")[0])
        plain = addr.ipv4_mapped if isinstance(addr, ipaddress.IPv6Address) else None
        if policy.allows_address(addr) or (plain and policy.allows_address(plain)):
            continue
        what = _refusal(addr)
        if what:
            hint = "add the host to allow_hosts to permit it"
            if literal:
                raise _Fail(InvalidInputError, f"address {addr} is {what} ({hint})")
            reason = f"host {host!r} resolves to an address that is {what} ({hint})"
            raise _Fail(InvalidInputError, reason)
    return addrs


class _DeadlineSocket(io.RawIOBase):
    """A socket whose every send and read waits at most ``read_timeout``, never past ``deadline``.

    It is also the raw stream under the response's buffered reader.
    """

    def __init__(self, sock: socket.socket, deadline: float, read_timeout: float):
        self._sock, self._deadline, self._read_timeout = sock, deadline, read_timeout

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        self._sock.settimeout(_time_left(self._deadline, self._read_timeout))
        return self._sock.recv_into(buffer)

    def sendall(self, data: bytes) -> None:
        self._sock.settimeout(_time_left(self._deadline, self._read_timeout))
        self._sock.sendall(data)

    def makefile(self, mode: str = "rb", *args, **kwargs) -> io.BufferedReader:
        return io.BufferedReader(self)

    def close(self) -> None:
        """Keep the socket for a response still reading; ``_fetch_hop`` closes it."""


def _time_left(deadline: float, limit: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("total deadline passed")
    return min(limit, left)


@functools.lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    return ssl.create_default_context()


class _PinnedConnection(http.client.HTTPConnection):
    """An HTTP(S) connection to already-checked addresses, sending the original host."""

    def __init__(
        self, host: str, port: int, addrs: list, tls: bool, policy: FetchPolicy, deadline: float
    ):
        super().__init__(host, port)
        self.default_port = 443 if tls else 80
        self._addrs, self._tls, self._policy, self._deadline = addrs, tls, policy, deadline
        self.raw_sock: socket.socket | None = None

    def connect(self) -> None:
        error: OSError = OSError("no address")
        for family, sockaddr in self._addrs:
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.settimeout(_time_left(self._deadline, self._policy.connect_timeout_s))
                sock.connect(sockaddr)
                if self._tls:
                    sock = _tls_context().wrap_socket(sock, server_hostname=self.host)
                break
            except OSError as exc:
                sock.close()
                error = exc
        else:
            raise error
        self.raw_sock = sock
        self.sock = _DeadlineSocket(sock, self._deadline, self._policy.read_timeout_s)


def _status(code: int) -> str:
    """``HTTP <code> <standard phrase>``: never the server's own reason text."""
    try:
        return f"HTTP {code} {HTTPStatus(code).phrase}"
    except ValueError:
        return f"HTTP {code}"


def _network_failure(exc: OSError | http.client.HTTPException) -> str:
    """A fixed short description of a network error (never its text)."""
    for kind, what in _NETWORK_FAILURES:
        if isinstance(exc, kind):
            return what
    return _ERRNO_FAILURES.get(getattr(exc, "errno", None), "connection failed")


def _fetch_hop(url: str, policy: FetchPolicy, deadline: float, budget: ByteBudget | None) -> bytes:
    """The body of one http(s) URL; raises ``_Redirect`` for a redirect status."""
    scheme, host, port, target = _parse(url, policy)
    addrs = _resolve(host, port, policy, deadline)
    conn = _PinnedConnection(host, port, addrs, scheme == "https", policy, deadline)
    try:
        conn.request("GET", target, headers={"User-Agent": policy.user_agent, "Accept": _ACCEPT})
        resp = conn.getresponse()
        if resp.status in _REDIRECTS:
            location = resp.getheader("Location")
            if not location:
                raise _Fail(InvalidInputError, f"{_status(resp.status)} redirect without Location")
            raise _Redirect(location.strip())
        if resp.status >= 500 or resp.status in _RETRYABLE:
            raise _Fail(UnavailableError, _status(resp.status))
        if not 200 <= resp.status < 300:
            raise _Fail(InvalidInputError, _status(resp.status))
        _check_content_type(resp.getheader("Content-Type"))
        return _read_body(resp, policy, budget)
    except TimeoutError:
        limits = f"connect_timeout_s={policy.connect_timeout_s:g}, read_timeout_s="
        raise _Fail(UnavailableError, f"timed out ({limits}{policy.read_timeout_s:g})") from None
    except ConnectionRefusedError:
        raise _Fail(UnavailableError, f"connection to {host}:{port} refused") from None
    except (OSError, http.client.HTTPException) as exc:
        raise _Fail(UnavailableError, _network_failure(exc)) from None
    finally:
        conn.close()
        if conn.raw_sock is not None:
            conn.raw_sock.close()


def _read_body(
    resp: http.client.HTTPResponse, policy: FetchPolicy, budget: ByteBudget | None
) -> bytes:
    over = f"body is over max_bytes={policy.max_bytes}"
    declared = resp.length
    if declared is not None and declared > policy.max_bytes:
        raise _Fail(InvalidInputError, f"{over} (Content-Length {declared})")
    if declared is not None and budget is not None and declared > budget.left():
        raise _budget_spent(budget)
    chunks, total = [], 0
    while chunk := resp.read(_CHUNK):
        total += len(chunk)
        if total > policy.max_bytes:
            raise _Fail(InvalidInputError, over)
        if budget is not None and not budget.take(len(chunk)):
            raise _budget_spent(budget)
        chunks.append(chunk)
    if declared is not None and total < declared:
        raise _Fail(UnavailableError, f"connection closed after {total} of {declared} bytes")
    return b"".join(chunks)
