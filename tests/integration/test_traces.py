"""OpenTelemetry traces from the real Triton: one trace per request, every ensemble step in it.

A server of this module's own runs with ``generator serve``'s trace settings (rate 1,
resource attributes, a 100 ms export interval) and exports to a local OTLP/HTTP
receiver (tests/otlp.py). It serves a tiny text model and the tiny CLIP model; the step
names each ensemble must show come from the built repository's ensemble configs.

Each request's trace is: ``InferRequest`` (Triton's HTTP/gRPC frontend) -> the ensemble's
span -> one span per step -> one ``compute`` span per step, all with one trace id. A
client's W3C ``traceparent`` (HTTP header, gRPC metadata) makes ``InferRequest`` a child
of the client's span, in the client's trace.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from generator.manifest import parse_manifest
from generator.render import parse_config
from generator.tracing import TraceSettings
from tests.http_servers import ImageServer
from tests.integration.clip_fixture import CLIP_MODEL, sample_images
from tests.integration.conftest import Server, serve
from tests.otlp import OtlpReceiver, Span
from tests.st_factory import VARIANTS, build_tiny_model, manifest_entry

pytestmark = pytest.mark.integration

TEXT = VARIANTS[0]
RESOURCE = (("service.name", "triton-embeddings-test"), ("deployment.environment", "ci"))
FRONTEND_SPAN = "InferRequest"
MODEL_EVENTS = ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
COMPUTE_EVENTS = ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]
FRONTEND_EVENTS = {
    "http": ["HTTP_RECV_START", "HTTP_RECV_END", "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START",
             "HTTP_SEND_END"],
    "grpc": ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "INFER_RESPONSE_COMPLETE",
             "GRPC_SEND_START", "GRPC_SEND_END"],
}


@dataclass(frozen=True)
class Traced:
    """The traced server, its collector and the image server its URLs point at."""

    server: Server
    receiver: OtlpReceiver
    images: ImageServer


@pytest.fixture(scope="module")
def traced(tmp_path_factory, extra_models) -> Traced:
    base = tmp_path_factory.mktemp("traces")
    folder = build_tiny_model(TEXT, base / "models" / TEXT.name)
    manifest = parse_manifest(
        # The two-step text model: a trace with a span for each of its steps.
        {"models": [manifest_entry(TEXT, folder, fused_tokenize=False), *extra_models],
         "fetch_image": {"allow_hosts": ["127.0.0.1"]}},
        base,
    )
    with OtlpReceiver() as receiver, ImageServer(sample_images()) as images:
        settings = TraceSettings(receiver.url, rate=1, resource=RESOURCE, export_delay_ms=100)
        with serve(manifest, base, trace=settings) as server:
            yield Traced(server, receiver, images)


def ensemble_steps(repo: Path, ensemble: str) -> list[str]:
    """The step models of ``ensemble``, in the order its built config lists them."""
    config = parse_config((repo / ensemble / "config.pbtxt").read_text(encoding="utf-8"))
    return [step.model_name for step in config.ensemble_scheduling.step]


def traceparent() -> tuple[str, str, str]:
    """A fresh sampled W3C ``traceparent`` and its trace id and span id."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def infer(
    server: Server, protocol: str, model: str, tensor: str, value: bytes, request_id: str,
    headers: dict[str, str] | None = None,
) -> np.ndarray:
    """One row through Triton's own client; ``headers`` go as HTTP headers / gRPC metadata."""
    lib = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    client = lib.InferenceServerClient(url)
    try:
        item = lib.InferInput(tensor, [1, 1], "BYTES")
        item.set_data_from_numpy(np.array([[value]], dtype=object))
        result = client.infer(model, [item], request_id=request_id, headers=headers)
        return result.as_numpy("EMBEDDING")
    finally:
        client.close()


def trace_of(receiver: OtlpReceiver, request_id: str, n_spans: int) -> list[Span]:
    """The spans of the one trace whose ensemble span carries ``request_id``, once complete."""

    def trace_ids(spans: list[Span]) -> set[str]:
        return {s.trace_id for s in spans if s.attributes.get("triton.request_id") == request_id}

    def complete(spans: list[Span]) -> bool:
        ids = trace_ids(spans)
        return len(ids) == 1 and sum(s.trace_id in ids for s in spans) >= n_spans

    spans = receiver.wait_for(complete)
    (trace_id,) = trace_ids(spans)
    return [s for s in spans if s.trace_id == trace_id]


def check_trace(
    spans: list[Span], protocol: str, ensemble: str, steps: list[str], request_id: str,
    parent: str = "",
) -> dict[str, Span]:
    """Assert the span tree of one request; return its model spans by model name."""
    assert len(spans) == 2 + 2 * len(steps), sorted(s.name for s in spans)
    assert len({s.trace_id for s in spans}) == 1 and len({s.span_id for s in spans}) == len(spans)
    for span in spans:
        assert dict(RESOURCE).items() <= span.resource.items()
        assert span.resource["telemetry.sdk.language"] == "cpp"
        assert span.scope == "triton-server"
        assert 0 < span.start_ns <= span.end_ns
        times = [t for _, t in span.events]
        assert times == sorted(times) and times[-1] <= span.end_ns
        if span.name != FRONTEND_SPAN:
            assert span.start_ns <= times[0]
    (root,) = [s for s in spans if s.name == FRONTEND_SPAN]
    assert root.parent_id == parent
    # The frontend span opens once the request is read: its receive events come first.
    assert root.events[0][1] <= root.start_ns
    assert [name for name, _ in root.events] == FRONTEND_EVENTS[protocol]
    models = {s.model: s for s in spans if s.model is not None}
    assert sorted(models) == sorted([ensemble, *steps])
    top = models[ensemble]
    assert top.name == ensemble and top.parent_id == root.span_id
    assert top.attributes["triton.request_id"] == request_id
    assert top.attributes["triton.model_version"] == 1
    assert top.attributes["triton.trace_parent_id"] == 0
    assert [name for name, _ in top.events] == MODEL_EVENTS
    assert root.start_ns <= top.start_ns
    for step in steps:
        span = models[step]
        assert span.name == step and span.parent_id == top.span_id
        # Triton's own trace ids link them the same way as the OpenTelemetry ids
        assert span.attributes["triton.trace_parent_id"] == top.attributes["triton.trace_id"]
        assert [name for name, _ in span.events] == MODEL_EVENTS
        assert top.start_ns <= span.start_ns
        (compute,) = [s for s in spans if s.parent_id == span.span_id]
        assert compute.name == "compute" and not compute.attributes
        assert [name for name, _ in compute.events] == COMPUTE_EVENTS
        assert span.start_ns <= compute.start_ns
    starts = [models[step].start_ns for step in steps]
    assert starts == sorted(starts), "the steps start in the order the ensemble lists them"
    return models


@pytest.mark.parametrize(
    ("protocol", "kind"),
    [("http", "text"), ("http", "image_url"), ("grpc", "text"), ("grpc", "image")],
)
def test_a_request_is_one_trace_with_a_span_for_the_ensemble_and_every_step(
    traced, protocol, kind
) -> None:
    model, tensor, value = {
        "text": (TEXT.name, "TEXT", b"a trace through every step"),
        "image_url": (f"{CLIP_MODEL}_image_url", "IMAGE_URL",
                      traced.images.url("/img/photo.jpg").encode()),
        "image": (f"{CLIP_MODEL}_image", "IMAGE", sample_images()["photo.png"]),
    }[kind]
    steps = ensemble_steps(traced.server.repo, model)
    assert len(steps) >= 2
    request_id = f"{protocol}-{kind}-{secrets.token_hex(4)}"
    embedding = infer(traced.server, protocol, model, tensor, value, request_id)
    assert embedding.shape[0] == 1
    spans = trace_of(traced.receiver, request_id, 2 + 2 * len(steps))
    check_trace(spans, protocol, model, steps, request_id)


GRPC_ATTEMPTS = 3


@pytest.mark.parametrize(
    ("protocol", "model"),
    [("http", TEXT.name), ("grpc", TEXT.name), ("http", f"{CLIP_MODEL}_image")],
)
def test_a_client_traceparent_is_the_parent_of_the_request(traced, protocol, model) -> None:
    """HTTP: every time. gRPC metadata: Triton 2.51 sometimes starts a trace of its own
    instead (2 of 70 requests on a loaded host, 0 of 88 idle; docs/tracing.md), so
    a request that lost its parent must be a whole trace of its own and a retry must link.
    """
    tensor, value = ("IMAGE", sample_images()["photo.jpg"]) if model.endswith("_image") else (
        "TEXT", b"a traced client")
    steps = ensemble_steps(traced.server.repo, model)
    for _ in range(GRPC_ATTEMPTS if protocol == "grpc" else 1):
        header, trace_id, span_id = traceparent()
        request_id = f"{protocol}-parent-{secrets.token_hex(4)}"
        infer(traced.server, protocol, model, tensor, value, request_id, {"traceparent": header})
        spans = trace_of(traced.receiver, request_id, 2 + 2 * len(steps))
        if {s.trace_id for s in spans} == {trace_id}:
            check_trace(spans, protocol, model, steps, request_id, parent=span_id)
            return
        assert protocol == "grpc", f"HTTP traceparent {header} was not the parent"
        check_trace(spans, protocol, model, steps, request_id, parent="")
    pytest.fail(f"gRPC traceparent ignored {GRPC_ATTEMPTS} times in a row")
