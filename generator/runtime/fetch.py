"""Fetch image URLs with SSRF guards, timeouts and a byte cap (standard library only).

Every hop of a fetch resolves its host once, refuses the hop unless every resolved
address is public (or allow-listed), then connects to exactly those checked addresses
while sending the original ``Host`` header and TLS server name, so a DNS answer that
changes between check and connect (rebinding) cannot reach a private address.
Redirects are followed by hand and each hop is checked again. ``read_timeout_s`` bounds
each socket read and the whole fetch, redirects included.
"""

from __future__ import annotations

import base64
import binascii
import functools
import http.client
import io
import ipaddress
import math
import socket
import ssl
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import quote, unquote_to_bytes, urljoin, urlsplit

from .errors import InvalidInputError, RequestError, UnavailableError

_IP = ipaddress.IPv4Address | ipaddress.IPv6Address
_NET = ipaddress.IPv4Network | ipaddress.IPv6Network
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_RETRYABLE = frozenset({408, 429})
_BINARY_TYPES = frozenset({"application/octet-stream", "binary/octet-stream"})
_NUMERIC_PARAMETERS = {
    "connect_timeout_s": float,
    "read_timeout_s": float,
    "max_bytes": int,
    "max_redirects": int,
}
_REFUSED = {
    "is_unspecified": "unspecified",
    "is_loopback": "loopback",
    "is_link_local": "link-local",
    "is_multicast": "multicast",
    "is_reserved": "reserved",
    "is_private": "private",
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
    _names: frozenset[str] = field(init=False, repr=False, compare=False)
    _networks: tuple[_NET, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Validate the limits and split ``allow_hosts`` into host names and networks."""
        for name in ("connect_timeout_s", "read_timeout_s", "max_bytes"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if self.max_redirects < 0:
            raise ValueError(f"max_redirects must be >= 0, got {self.max_redirects!r}")
        if not set(self.allowed_schemes) <= {"http", "https"}:
            raise ValueError(f"allowed_schemes must be http/https, got {self.allowed_schemes}")
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

    @classmethod
    def from_parameters(cls, params: dict[str, str]) -> FetchPolicy:
        """Build a policy from string config parameters; absent keys keep their defaults.

        Keys: ``allow_hosts`` (comma-separated), ``connect_timeout_s``, ``read_timeout_s``,
        ``max_bytes``, ``max_redirects``. Raises ``ValueError`` naming the bad key.
        """
        kwargs: dict[str, object] = {}
        if "allow_hosts" in params:
            hosts = (h.strip() for h in params["allow_hosts"].split(","))
            kwargs["allow_hosts"] = tuple(h for h in hosts if h)
        for key, kind in _NUMERIC_PARAMETERS.items():
            if key in params:
                try:
                    kwargs[key] = kind(params[key].strip())
                except ValueError:
                    raise ValueError(
                        f"config parameter {key}={params[key]!r} is not a valid {kind.__name__}"
                    ) from None
        try:
            return cls(**kwargs)  # type: ignore[arg-type]
        except ValueError as exc:
            raise ValueError(f"bad fetch config parameter: {exc}") from None

    def allows_name(self, host: str) -> bool:
        """Whether ``host`` is an allow-listed host name."""
        return host.lower().rstrip(".") in self._names

    def allows_address(self, addr: _IP) -> bool:
        """Whether ``addr`` lies in an allow-listed IP or CIDR."""
        return any(addr in net for net in self._networks)


class _Fail(Exception):
    """A failure of one hop, turned into a public ``RequestError`` by ``fetch_url``."""

    def __init__(self, error: type[RequestError], reason: str):
        super().__init__(reason)
        self.error, self.reason = error, reason


class _Redirect(Exception):
    def __init__(self, location: str):
        super().__init__(location)
        self.location = location


def _shown(url: str) -> str:
    return url if len(url) <= _URL_SHOWN else url[: _URL_SHOWN - 3] + "..."


def fetch_url(url: str, policy: FetchPolicy) -> bytes:
    """The body of ``url`` (http, https or data), checked against ``policy``.

    Raises ``InvalidInputError`` for a malformed or refused URL, too many redirects, a
    body over ``max_bytes``, a non-image content type or HTTP 4xx; ``UnavailableError``
    for DNS failure, refused connection, timeout or HTTP 5xx. Messages name the URL.
    """
    url = url.strip()
    deadline = time.monotonic() + policy.read_timeout_s
    current, seen = url, {url}
    try:
        if url[:5].lower() == "data:":
            return _decode_data_uri(url, policy)
        for _ in range(policy.max_redirects + 1):
            try:
                return _fetch_hop(current, policy, deadline)
            except _Redirect as redirect:
                current = urljoin(current, redirect.location).partition("#")[0]
                if current in seen:
                    raise _Fail(InvalidInputError, "redirect loop") from None
                seen.add(current)
        raise _Fail(InvalidInputError, f"more than max_redirects={policy.max_redirects} redirects")
    except _Fail as fail:
        verb = "unavailable" if fail.error is UnavailableError else "refused"
        hop = f" (after redirect to '{_shown(current)}')" if current != url else ""
        raise fail.error(f"IMAGE_URL '{_shown(url)}' {verb}: {fail.reason}{hop}") from None


def fetch_all(
    urls: Sequence[str], policy: FetchPolicy, executor: ThreadPoolExecutor
) -> list[bytes | RequestError]:
    """Fetch ``urls`` concurrently on ``executor``; failures are returned, not raised.

    Results follow input order; a URL repeated in ``urls`` is fetched once.
    """
    futures = {u: executor.submit(_fetch_or_error, u, policy) for u in dict.fromkeys(urls)}
    return [futures[u].result() for u in urls]


def _fetch_or_error(url: str, policy: FetchPolicy) -> bytes | RequestError:
    try:
        return fetch_url(url, policy)
    except RequestError as exc:
        return exc
    except Exception as exc:  # noqa: BLE001 - one bad URL must not fail the batch
        shown = _shown(url) if isinstance(url, str) else type(url).__name__
        return RequestError(f"IMAGE_URL '{shown}' failed: internal error ({type(exc).__name__})")


def _check_content_type(value: str | None) -> None:
    media = (value or "").partition(";")[0].strip().lower()
    if media and not media.startswith("image/") and media not in _BINARY_TYPES:
        raise _Fail(InvalidInputError, f"content type {media!r} is not an image")


def _decode_data_uri(url: str, policy: FetchPolicy) -> bytes:
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
    return data


def _parse(url: str, policy: FetchPolicy) -> tuple[str, str, int, str]:
    """Scheme, ASCII host, port and request target of an http(s) URL."""
    if any(c <= " " or c == "\x7f" for c in url):
        raise _Fail(InvalidInputError, "malformed URL (contains whitespace or control chars)")
    try:
        parts = urlsplit(url)
        port = parts.port
        host = (parts.hostname or "").encode("idna").decode("ascii")
    except (ValueError, UnicodeError) as exc:
        raise _Fail(InvalidInputError, f"malformed URL ({exc})") from None
    scheme = parts.scheme.lower()
    if not scheme:
        raise _Fail(InvalidInputError, "malformed URL (no scheme)")
    if scheme not in policy.allowed_schemes:
        allowed = ", ".join(policy.allowed_schemes)
        raise _Fail(InvalidInputError, f"scheme {scheme!r} is not allowed (allowed: {allowed})")
    if not host:
        raise _Fail(InvalidInputError, "malformed URL (no host)")
    target = quote(parts.path or "/", safe="/%:@!$&'()*+,;=~")
    if parts.query:
        target += "?" + quote(parts.query, safe="/%:@!$&'()*+,;=~?")
    return scheme, host, port or (443 if scheme == "https" else 80), target


def _refusal(addr: _IP) -> str | None:
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    for prop, what in _REFUSED.items():
        if getattr(addr, prop):
            return what
    return None if addr.is_global else "not globally routable"


def _resolve(host: str, port: int, policy: FetchPolicy) -> list[tuple[int, tuple]]:
    """Resolved ``(family, sockaddr)`` pairs of ``host``, each checked against ``policy``."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise _Fail(UnavailableError, f"DNS lookup of {host!r} failed ({exc})") from None
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
            raise _Fail(InvalidInputError, f"address {addr} is {what} ({hint})")
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


def _fetch_hop(url: str, policy: FetchPolicy, deadline: float) -> bytes:
    """The body of one http(s) URL; raises ``_Redirect`` for a redirect status."""
    scheme, host, port, target = _parse(url, policy)
    addrs = _resolve(host, port, policy)
    conn = _PinnedConnection(host, port, addrs, scheme == "https", policy, deadline)
    try:
        conn.request("GET", target, headers={"User-Agent": policy.user_agent, "Accept": _ACCEPT})
        resp = conn.getresponse()
        if resp.status in _REDIRECTS:
            location = resp.getheader("Location")
            if not location:
                raise _Fail(InvalidInputError, f"HTTP {resp.status} redirect without Location")
            raise _Redirect(location.strip())
        status = f"HTTP {resp.status} {resp.reason[:80]}".rstrip()
        if resp.status >= 500 or resp.status in _RETRYABLE:
            raise _Fail(UnavailableError, status)
        if not 200 <= resp.status < 300:
            raise _Fail(InvalidInputError, status)
        _check_content_type(resp.getheader("Content-Type"))
        over = f"body is over max_bytes={policy.max_bytes}"
        if resp.length is not None and resp.length > policy.max_bytes:
            raise _Fail(InvalidInputError, f"{over} (Content-Length {resp.length})")
        declared, chunks, total = resp.length, [], 0
        while chunk := resp.read(_CHUNK):
            total += len(chunk)
            if total > policy.max_bytes:
                raise _Fail(InvalidInputError, over)
            chunks.append(chunk)
        if declared is not None and total < declared:
            raise _Fail(UnavailableError, f"connection closed after {total} of {declared} bytes")
        return b"".join(chunks)
    except TimeoutError:
        limits = f"connect_timeout_s={policy.connect_timeout_s:g}, read_timeout_s="
        raise _Fail(UnavailableError, f"timed out ({limits}{policy.read_timeout_s:g})") from None
    except ConnectionRefusedError:
        raise _Fail(UnavailableError, f"connection to {host}:{port} refused") from None
    except ssl.SSLError as exc:
        raise _Fail(UnavailableError, f"TLS error ({exc.reason or exc})") from None
    except (OSError, http.client.HTTPException) as exc:
        raise _Fail(UnavailableError, f"connection failed ({type(exc).__name__}: {exc})") from None
    finally:
        conn.close()
        if conn.raw_sock is not None:
            conn.raw_sock.close()
