"""OpenTelemetry traces of Triton itself: the ``--trace-config`` flags ``generator serve`` adds.

Triton 2.51 (the pytriton wheel's binary, NGC's alike) exports spans over OTLP/HTTP
(JSON bodies) from ``--trace-config mode=opentelemetry``: one span for the request at the
HTTP/gRPC frontend, one per model (the ensemble and each of its steps) and one per
``compute`` of a step, all in one trace, under the client's span when the request carries
a W3C ``traceparent`` header or gRPC metadata entry (docs/tracing.md has what was
verified). Off unless an endpoint is given.

Settings come from ``generator serve``'s options or, for containers, the environment:

- ``EMBED_TRACE_ENDPOINT``: the collector's OTLP/HTTP traces URL
  (``http://collector:4318/v1/traces``); empty or unset: no tracing.
- ``EMBED_TRACE_RATE``: trace one request in N (Triton's ``rate``, 1000 by default);
  0 traces only requests that bring a ``traceparent``, which Triton traces at any rate.
- ``EMBED_TRACE_RESOURCE``: resource attributes, ``key=value`` separated by commas
  (``service.name=triton-embeddings,k8s.pod.name=...``).
- ``EMBED_TRACE_EXPORT_DELAY_MS``: the batch span processor's export interval (Triton's
  ``bsp_schedule_delay``, 5000 ms by default).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

ENDPOINT_ENV = "EMBED_TRACE_ENDPOINT"
RATE_ENV = "EMBED_TRACE_RATE"
RESOURCE_ENV = "EMBED_TRACE_RESOURCE"
EXPORT_DELAY_ENV = "EMBED_TRACE_EXPORT_DELAY_MS"
DEFAULT_RATE = 1000  # Triton's own default: one request in a thousand


class TraceConfigError(ValueError):
    """A trace setting Triton would reject or misread."""


def parse_resource(items: Sequence[str], where: str) -> tuple[tuple[str, str], ...]:
    """``key=value`` items as pairs; an empty key, no ``=`` or a ``,`` is an error."""
    pairs = []
    for item in items:
        key, sep, value = item.strip().partition("=")
        key = key.strip()
        if not sep or not key or "," in item or not item.isprintable():
            raise TraceConfigError(
                f"{where}: {item!r} is not key=value (printable, no ',' in key or value)"
            )
        pairs.append((key, value.strip()))
    return tuple(pairs)


def _int(value: str, where: str, minimum: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise TraceConfigError(f"{where}={value!r} is not a whole number") from None
    if number < minimum:
        raise TraceConfigError(f"{where}={number} must be at least {minimum}")
    return number


@dataclass(frozen=True)
class TraceSettings:
    """Where spans go, which requests are traced, and what every span's resource says."""

    endpoint: str
    rate: int = DEFAULT_RATE
    resource: tuple[tuple[str, str], ...] = ()
    export_delay_ms: int | None = None

    def __post_init__(self) -> None:
        """Refuse what Triton would misread: a non-HTTP URL, a negative rate."""
        parts = urlsplit(self.endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise TraceConfigError(
                f"trace endpoint {self.endpoint!r} must be an http(s) URL, e.g. "
                "http://otel-collector:4318/v1/traces"
            )
        if any(c.isspace() for c in self.endpoint) or not self.endpoint.isprintable():
            raise TraceConfigError(f"trace endpoint {self.endpoint!r} holds whitespace")
        if self.rate < 0:
            raise TraceConfigError(f"trace rate {self.rate} must be 0 or more")
        if self.export_delay_ms is not None and self.export_delay_ms < 1:
            raise TraceConfigError(f"trace export delay {self.export_delay_ms} ms must be >= 1")

    @classmethod
    def resolve(
        cls,
        endpoint: str | None = None,
        rate: int | None = None,
        resource: Sequence[str] | None = None,
        export_delay_ms: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> TraceSettings | None:
        """Options given (not None) over the environment; None when no endpoint is set.

        Every value is checked even without an endpoint, so a typo in a deployment
        fails at start instead of when tracing is turned on.
        """
        env = os.environ if env is None else env
        env_rate = env.get(RATE_ENV, "").strip()
        env_delay = env.get(EXPORT_DELAY_ENV, "").strip()
        if rate is None:
            rate = _int(env_rate, RATE_ENV, 0) if env_rate else DEFAULT_RATE
        if export_delay_ms is None and env_delay:
            export_delay_ms = _int(env_delay, EXPORT_DELAY_ENV, 1)
        if resource is None:
            items = [i for i in env.get(RESOURCE_ENV, "").split(",") if i.strip()]
            pairs = parse_resource(items, RESOURCE_ENV)
        else:
            pairs = parse_resource(resource, "--trace-resource")
        if rate < 0:
            raise TraceConfigError(f"trace rate {rate} must be 0 or more")
        if export_delay_ms is not None and export_delay_ms < 1:
            raise TraceConfigError(f"trace export delay {export_delay_ms} ms must be >= 1")
        endpoint = (env.get(ENDPOINT_ENV, "") if endpoint is None else endpoint).strip()
        if not endpoint:
            return None
        return cls(endpoint, rate, pairs, export_delay_ms)

    def args(self) -> list[str]:
        """The ``tritonserver`` flags: OpenTelemetry mode, timestamps, every count."""
        args = [
            "--trace-config=mode=opentelemetry",
            "--trace-config=level=TIMESTAMPS",
            f"--trace-config=rate={self.rate}",
            "--trace-config=count=-1",
            f"--trace-config=opentelemetry,url={self.endpoint}",
        ]
        args += [f"--trace-config=opentelemetry,resource={k}={v}" for k, v in self.resource]
        if self.export_delay_ms is not None:
            args.append(f"--trace-config=opentelemetry,bsp_schedule_delay={self.export_delay_ms}")
        return args

    def describe(self) -> str:
        """One line for the start message (the URL without any user or password)."""
        parts = urlsplit(self.endpoint)
        host = parts.hostname or ""
        host = f"[{host}]" if ":" in host else host
        netloc = f"{host}:{parts.port}" if parts.port else host
        url = urlunsplit((parts.scheme, netloc, parts.path, "", ""))
        sampled = "requests with a traceparent only" if self.rate == 0 else (
            f"1 request in {self.rate} and every one with a traceparent"
        )
        return f"OTLP/HTTP to {url}, {sampled}"
