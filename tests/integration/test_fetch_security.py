"""``fetch_image`` on a real Triton: a tarpit URL holds back no request of its batch; IPv6.

Each instance runs one execution at a time and holds it until every request is answered.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from generator.shared_models import FETCH_IMAGE
from tests.http_servers import ImageServer
from tests.integration.clip_fixture import CLIP_MODEL, sample_images
from tests.integration.text_helpers import INVALID, PROTOCOLS, infer

URL_ENSEMBLE = f"{CLIP_MODEL}_image_url"


@pytest.fixture(scope="module")
def image_server():
    with ImageServer(sample_images(), hang_s=8.0) as srv:
        yield srv


@pytest.fixture(scope="module")
def limits(server) -> dict[str, float]:
    """The ``fetch_image`` settings of the session server."""
    settings = server.manifest.fetch_image
    clip = [e.max_batch_size for e in server.manifest.models if e.family == "open-clip"]
    return {
        "read_timeout_s": settings.read_timeout_s,
        "max_concurrency": settings.max_concurrency,
        "max_batch_size": max(clip),
    }


def _infer(server, model: str, urls: list[str]) -> np.ndarray | InferenceServerException:
    output = "EMBEDDING" if model == URL_ENSEMBLE else "IMAGE"
    try:
        return infer(server, "http", model, {"IMAGE_URL": urls}, [output])[0]
    except InferenceServerException as exc:
        return exc


class _Timed:
    """Runs one call on a thread; keeps its result and when it finished."""

    def __init__(self, call: Callable[[], object], origin: float):
        self.origin = origin
        self.result: object = None
        self.done_at = float("nan")
        self.thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self.thread.start()

    def _run(self, call: Callable[[], object]) -> None:
        self.result = call()
        self.done_at = time.monotonic() - self.origin

    def join(self) -> _Timed:
        self.thread.join(60)
        return self


def _batch_counts(server) -> dict[int, int]:
    """``{batch size: executions}`` of ``fetch_image`` so far."""
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        stats = client.get_inference_statistics(FETCH_IMAGE)["model_stats"][0]
    finally:
        client.close()
    return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]}


def _wait_in_flight(image_server, prefix: str, count: int, timeout_s: float = 30.0) -> None:
    """Until the image server has received ``count`` requests whose path starts ``prefix``."""
    deadline = time.monotonic() + timeout_s
    while sum(p.startswith(prefix) for p in list(image_server.httpd.seen)) < count:
        assert time.monotonic() < deadline, f"{count} {prefix} requests never arrived"
        time.sleep(0.05)


def _assert_tarpit_failed(result: object, url: str, read_timeout_s: float) -> None:
    assert isinstance(result, InferenceServerException), result
    assert result.status() == "503", str(result)
    assert f"IMAGE_URL '{url}' unavailable: timed out" in result.message()
    assert f"read_timeout_s={read_timeout_s:g}" in result.message()


def test_a_request_behind_a_tarpit_waits_for_that_execution_only(server, image_server, limits):
    """One execution at a time per ``fetch_image`` instance, each held until all of its
    requests are answered (so a stub that dies leaves none unanswered: test_stub_recovery).

    A fast request sent while a tarpit's execution runs is answered once that execution
    ends (the tarpit's read timeout), and then at once: the cost of holding, bounded.
    """
    tarpit = image_server.url("/tarpit?alone")
    fast = image_server.url("/img/photo.jpg?alone")
    start = time.monotonic()
    slow_call = _Timed(lambda: _infer(server, URL_ENSEMBLE, [tarpit]), start)
    _wait_in_flight(image_server, "/tarpit?alone", 1)
    fast_call = _Timed(lambda: _infer(server, URL_ENSEMBLE, [fast]), start)
    fast_call.join()
    slow_call.join()
    print(f"tarpit failed at {slow_call.done_at:.3f} s, fast answered at {fast_call.done_at:.3f} s")
    assert isinstance(fast_call.result, np.ndarray), fast_call.result
    assert slow_call.done_at >= limits["read_timeout_s"] - 0.1
    _assert_tarpit_failed(slow_call.result, tarpit, limits["read_timeout_s"])
    # waited for the tarpit's execution, then no longer than a loaded machine takes
    assert slow_call.done_at - 0.5 <= fast_call.done_at <= slow_call.done_at + 15


def test_tarpit_and_fast_request_in_one_execution_are_answered_apart(server, image_server, limits):
    """A silent URL holds ``fetch_image``'s execution; the tarpit and fast requests sent
    meanwhile queue and land in the next execution together (a batch of 2 rows, a size no
    other request here makes). There the fast one is answered first, the tarpit a read
    timeout after the execution began: a slow URL holds back no request of its batch.
    """
    read_timeout = limits["read_timeout_s"]
    before = _batch_counts(server)
    start = time.monotonic()
    gate = _Timed(lambda: _infer(server, FETCH_IMAGE, [image_server.url("/silent?gate")]), start)
    _wait_in_flight(image_server, "/silent?gate", 1)
    tarpit = image_server.url("/tarpit?batched")
    fast = image_server.url("/img/photo.png?batched")
    slow_call = _Timed(lambda: _infer(server, URL_ENSEMBLE, [tarpit]), start)
    fast_call = _Timed(lambda: _infer(server, URL_ENSEMBLE, [fast]), start)
    for call in (gate, fast_call, slow_call):
        call.join()
    after = _batch_counts(server)
    print(
        f"execution unblocked at {gate.done_at:.3f} s, fast answered at "
        f"{fast_call.done_at:.3f} s, tarpit failed at {slow_call.done_at:.3f} s; "
        f"fetch_image batches before {before}, after {after}"
    )
    assert after.get(2, 0) - before.get(2, 0) == 1, "tarpit and fast were not batched"
    assert gate.done_at >= read_timeout - 0.1, "the silent URL did not hold the execution"
    assert isinstance(gate.result, InferenceServerException) and gate.result.status() == "503"
    assert isinstance(fast_call.result, np.ndarray), fast_call.result
    # answered apart: the fast one first, the tarpit a read timeout after the execution
    # began (orders and lower bounds, which a busy machine cannot break)
    assert fast_call.done_at < slow_call.done_at
    assert slow_call.done_at - gate.done_at > read_timeout - 0.5
    _assert_tarpit_failed(slow_call.result, tarpit, read_timeout)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        (
            "http://[2002:7f00:1::1]/x.png",
            "address 2002:7f00:1::1 is 6to4, which embeds an IPv4 address",
        ),
        ("http://[fec0::1]/x.png", "address fec0::1 is site-local"),
    ],
    ids=["6to4", "site-local"],
)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_ipv6_6to4_and_site_local_urls_are_refused_over_http_and_grpc(
    server, url, reason, protocol
):
    message = (
        f"in ensemble '{URL_ENSEMBLE}', IMAGE_URL '{url}' refused: {reason} "
        "(add the host to allow_hosts to permit it)"
    )
    with pytest.raises(InferenceServerException) as info:
        infer(server, protocol, URL_ENSEMBLE, {"IMAGE_URL": [url]}, ["EMBEDDING"])
    assert info.value.status() == INVALID[protocol]
    assert info.value.message() == message
