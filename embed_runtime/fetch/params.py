"""The shared ``fetch_image`` model's config parameters, written by the build, read by its stub.

:class:`FetchParams` holds the manifest's ``[fetch_image]`` limits in their config form;
:meth:`FetchParams.policy` turns them into the :class:`~.url_fetch.FetchPolicy` that each
fetch checks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import ClassVar

from ..config_params import ConfigParams, param
from .url_fetch import FetchPolicy

_POLICY = FetchPolicy()
# The fields that are the policy's own (the rest size the fetch pool).
_LIMITS = frozenset(f.name for f in fields(FetchPolicy) if f.init)


def _hosts(text: str) -> tuple[str, ...]:
    hosts = (h.strip() for h in text.split(","))
    return tuple(h for h in hosts if h)


def _ports(text: str) -> tuple[int, ...]:
    ports = [p.strip() for p in text.split(",") if p.strip()]
    if not all(p.isascii() and p.isdigit() for p in ports):
        raise ValueError(
            f"config parameter allowed_ports={text!r} is not a comma-separated list of ports"
        )
    return tuple(int(p) for p in ports)


def _ports_text(ports: tuple[int, ...]) -> str:
    return ",".join(str(p) for p in ports)


def _number(key: str, kind: type[int] | type[float]) -> Callable[[str], int | float]:
    """The decoder of numeric parameter ``key``; its error names the key and the value."""

    def decode(text: str) -> int | float:
        try:
            return kind(text.strip())
        except ValueError:
            raise ValueError(
                f"config parameter {key}={text!r} is not a valid {kind.__name__}"
            ) from None

    return decode


@dataclass(frozen=True)
class FetchParams(ConfigParams):
    """What ``fetch_image`` may reach, how long and how much it may read, and how many at once.

    Every value is written; a config without ``max_concurrency`` is refused, any other
    absent key keeps :class:`~.url_fetch.FetchPolicy`'s default.
    """

    params_name: ClassVar[str] = "fetch_image"

    allow_hosts: tuple[str, ...] = param(
        _POLICY.allow_hosts, always=True, encode=",".join, decode=_hosts
    )
    connect_timeout_s: float = param(
        _POLICY.connect_timeout_s, always=True, decode=_number("connect_timeout_s", float)
    )
    read_timeout_s: float = param(
        _POLICY.read_timeout_s, always=True, decode=_number("read_timeout_s", float)
    )
    max_bytes: int = param(_POLICY.max_bytes, always=True, decode=_number("max_bytes", int))
    max_redirects: int = param(
        _POLICY.max_redirects, always=True, decode=_number("max_redirects", int)
    )
    max_concurrency: int = param(32, required=True)
    allowed_ports: tuple[int, ...] = param(
        _POLICY.allowed_ports, always=True, encode=_ports_text, decode=_ports
    )
    max_batch_bytes: int = param(
        _POLICY.max_batch_bytes, always=True, decode=_number("max_batch_bytes", int)
    )

    @classmethod
    def from_parameters(cls, params: Mapping[str, str]) -> FetchParams:
        """Parse string config parameters; ``ValueError`` names a bad or missing key."""
        out = super().from_parameters(params)
        out.policy()
        return out

    def policy(self) -> FetchPolicy:
        """The fetch policy of these limits; ``ValueError`` if one is out of bounds."""
        limits = {f.name: getattr(self, f.name) for f in fields(self) if f.name in _LIMITS}
        try:
            return FetchPolicy(**limits)
        except ValueError as exc:
            raise ValueError(f"bad fetch config parameter: {exc}") from None
