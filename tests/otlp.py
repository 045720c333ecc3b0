"""A minimal OpenTelemetry collector for the tests: OTLP/HTTP traces on 127.0.0.1.

Triton 2.51's exporter (opentelemetry-cpp 1.13.0) posts ``ExportTraceServiceRequest`` as
OTLP/HTTP JSON (``Content-Type: application/json``; ids in hex, 64-bit integers as
strings), so the receiver needs no protobuf package. A body of another content type is
kept and fails :meth:`OtlpReceiver.spans` loudly: a Triton that switched to protobuf
must not pass as "no spans".
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from tests.http_servers import LocalServer, QuietHandler


def _value(any_value: dict) -> object:
    """An OTLP ``AnyValue`` in JSON as a Python value (int64 arrives as a string)."""
    (kind, value), = any_value.items()
    return int(value) if kind == "intValue" else value


def _attributes(items: list[dict] | None) -> dict[str, object]:
    return {item["key"]: _value(item["value"]) for item in items or []}


@dataclass(frozen=True)
class Span:
    """One exported span, with its resource's attributes."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, object]
    events: tuple[tuple[str, int], ...]
    resource: dict[str, object]
    scope: str

    @property
    def model(self) -> object:
        """The ``triton.model_name`` attribute (model spans only)."""
        return self.attributes.get("triton.model_name")


def parse_export(body: dict) -> list[Span]:
    """The spans of one ``ExportTraceServiceRequest`` in OTLP/HTTP JSON."""
    spans = []
    for resource_spans in body.get("resourceSpans", []):
        resource = _attributes(resource_spans.get("resource", {}).get("attributes"))
        for scope_spans in resource_spans.get("scopeSpans", []):
            scope = scope_spans.get("scope", {}).get("name", "")
            for raw in scope_spans.get("spans", []):
                spans.append(Span(
                    trace_id=raw["traceId"],
                    span_id=raw["spanId"],
                    parent_id=raw.get("parentSpanId", ""),
                    name=raw["name"],
                    kind=int(raw.get("kind", 0)),
                    start_ns=int(raw["startTimeUnixNano"]),
                    end_ns=int(raw["endTimeUnixNano"]),
                    attributes=_attributes(raw.get("attributes")),
                    events=tuple(
                        (e["name"], int(e["timeUnixNano"])) for e in raw.get("events", [])
                    ),
                    resource=resource,
                    scope=scope,
                ))
    return spans


class _OtlpHandler(QuietHandler):
    owner: OtlpReceiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.owner.record(self.path, self.headers.get("Content-Type", ""), body)
        self.reply(200, b"{}", "application/json")


class OtlpReceiver:
    """Records what is posted to ``/v1/traces``; :meth:`wait_for` polls the spans so far."""

    def __init__(self) -> None:
        self.bodies: list[tuple[str, str, bytes]] = []
        self._lock = threading.Lock()
        self.httpd = LocalServer(type("Handler", (_OtlpHandler,), {"owner": self}))

    @property
    def url(self) -> str:
        """The traces endpoint to give Triton."""
        return self.httpd.url("/v1/traces")

    def record(self, path: str, content_type: str, body: bytes) -> None:
        with self._lock:
            self.bodies.append((path, content_type, body))

    def spans(self) -> list[Span]:
        """Every span received so far; raises on a body that is not OTLP/HTTP JSON."""
        with self._lock:
            bodies = list(self.bodies)
        spans = []
        for path, content_type, body in bodies:
            if path != "/v1/traces" or content_type.split(";")[0] != "application/json":
                raise AssertionError(f"unexpected export: POST {path} ({content_type})")
            spans += parse_export(json.loads(body))
        return spans

    def wait_for(
        self, done: Callable[[list[Span]], bool], timeout_s: float = 15.0
    ) -> list[Span]:
        """The spans once ``done(spans)`` holds; the spans so far in the error otherwise."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.spans()
            if done(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted((s.trace_id, s.name) for s in spans)
                raise AssertionError(f"spans not complete after {timeout_s} s: {names}")
            time.sleep(0.1)

    def __enter__(self) -> OtlpReceiver:
        self.httpd.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.__exit__(*exc)
