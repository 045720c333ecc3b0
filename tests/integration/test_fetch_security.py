"""``fetch_image`` on a real Triton: tarpit URLs hold back no other request; IPv6 guards."""

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


def _blocker_sizes(slots: int, rows: int) -> list[int]:
    """Row counts of requests that hold ``slots`` URLs, none of 2 rows, none batchable."""
    assert slots >= 3 and rows >= 4, (slots, rows)
    sizes = [rows] * (slots // rows) + ([slots % rows] if slots % rows else [])
    if sizes[-1] == 2:
        sizes[-2:] = [rows - 1, 3] if len(sizes) > 1 else [3]
    return sizes


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


def test_fast_url_is_answered_while_a_tarpit_url_sent_with_it_hangs(server, image_server, limits):
    tarpit = image_server.url("/tarpit?alone")
    fast = image_server.url("/img/photo.jpg?alone")
    start = time.monotonic()
    slow_call = _Timed(lambda: _infer(server, URL_ENSEMBLE, [tarpit]), start)
    time.sleep(0.05)
    fast_call = _Timed(lambda: _infer(server, URL_ENSEMBLE, [fast]), start)
    fast_call.join()
    slow_call.join()
    print(f"fast answered at {fast_call.done_at:.3f} s, tarpit failed at {slow_call.done_at:.3f} s")
    assert isinstance(fast_call.result, np.ndarray), fast_call.result
    # Answered before the tarpit timed out: an order, not a time (a busy machine slows the
    # fast one's fetch and encoding, it cannot make the tarpit's timeout fire sooner).
    assert fast_call.done_at < slow_call.done_at
    assert slow_call.done_at >= limits["read_timeout_s"] - 0.1
    _assert_tarpit_failed(slow_call.result, tarpit, limits["read_timeout_s"])


def test_tarpit_and_fast_request_in_one_execution_are_answered_apart(server, image_server, limits):
    """Fill every fetch slot so ``execute`` blocks; the two requests then queue together.

    Blockers hold ``max_concurrency`` slots with silent URLs (rows of at most
    ``max_batch_size``); a gate request then blocks ``execute`` until they time out, so
    the tarpit and fast requests sent meanwhile land in the next execution together: a
    batch of 2 rows, a size no other request here can make.
    """
    read_timeout = limits["read_timeout_s"]
    sizes = _blocker_sizes(int(limits["max_concurrency"]), int(limits["max_batch_size"]))
    before = _batch_counts(server)
    start = time.monotonic()
    blockers, first = [], 0
    for size in sizes:
        urls = [image_server.url(f"/silent?slot={first + i}") for i in range(size)]
        blockers.append(_Timed(lambda urls=urls: _infer(server, FETCH_IMAGE, urls), start))
        first += size
    _wait_in_flight(image_server, "/silent?slot=", first)
    gate_url = image_server.url("/img/pixel.png?gate")
    gate = _Timed(lambda: _infer(server, FETCH_IMAGE, [gate_url]), start)
    time.sleep(0.5)
    tarpit = image_server.url("/tarpit?batched")
    fast = image_server.url("/img/photo.png?batched")
    slow_call = _Timed(lambda: _infer(server, URL_ENSEMBLE, [tarpit]), start)
    fast_call = _Timed(lambda: _infer(server, URL_ENSEMBLE, [fast]), start)
    for call in (gate, fast_call, slow_call, *blockers):
        call.join()
    after = _batch_counts(server)
    print(
        f"execution unblocked at {gate.done_at:.3f} s, fast answered at "
        f"{fast_call.done_at:.3f} s, tarpit failed at {slow_call.done_at:.3f} s; "
        f"fetch_image batches before {before}, after {after}"
    )
    assert after.get(2, 0) - before.get(2, 0) == 1, "tarpit and fast were not batched"
    assert gate.done_at >= read_timeout - 0.1, "execute did not block on the full pool"
    assert isinstance(gate.result, np.ndarray)
    assert isinstance(fast_call.result, np.ndarray), fast_call.result
    # answered apart: the fast one first, the tarpit a read timeout after the execution
    # began (orders and lower bounds, which a busy machine cannot break)
    assert fast_call.done_at < slow_call.done_at
    assert slow_call.done_at - gate.done_at > read_timeout - 0.5
    _assert_tarpit_failed(slow_call.result, tarpit, read_timeout)
    for blocker in blockers:
        assert isinstance(blocker.result, InferenceServerException)
        assert blocker.result.status() == "503"


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
