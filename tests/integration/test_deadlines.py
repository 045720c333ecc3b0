"""No step works for a request whose deadline has passed or whose client has gone.

Against the session server: the ``deadline_unix_us`` request parameter (what the
project's client sends) and a client that leaves (gRPC deadline, HTTP connection closed)
while ``fetch_image`` waits on a slow URL. The later steps' success counts show they did
no work; the slow route of the local image server shows whether the fetch ran.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from embed_runtime.serving.admission import DEADLINE_PARAMETER
from tests.http_servers import ImageServer
from tests.integration.clip_fixture import CLIP_MODEL, sample_images

pytestmark = pytest.mark.integration
TEXT_MODEL = "all-MiniLM-L6-v2"
SLOW_S = 1.2  # under the read timeout (2 s) of the test manifest's fetch_image
CLIENT_WAIT_S = 0.4
# Triton counts a Python step's request as a success even when its answer is an error, so
# the encoder's count (no request reaches it after a step refused) is what shows no work.
ENCODER = f"{CLIP_MODEL}_encode_image"


@pytest.fixture(scope="module")
def slow_images():
    with ImageServer({"photo.jpg": sample_images()["photo.jpg"]}, slow_s=SLOW_S) as srv:
        yield srv


def _deadline_in(seconds: float) -> int:
    return int((time.time() + seconds) * 1e6)


def _bytes_input(module, name: str, value: str):
    item = module.InferInput(name, [1, 1], "BYTES")
    item.set_data_from_numpy(np.array([[value.encode()]], dtype=object))
    return item


def _successes(server, model: str) -> int:
    with server.client("http") as c:
        return c.model_statistics(model)[0].success_count


def _wait_for_fetch(server, before: int) -> None:
    """Until ``fetch_image`` has answered once more than ``before`` (the slow URL served)."""
    until = time.monotonic() + SLOW_S + 30
    with server.client("http") as c:
        while time.monotonic() < until:
            stats = c.model_statistics("fetch_image")[0]
            if stats.success_count + stats.fail_count > before:
                return
            time.sleep(0.2)
    raise AssertionError("fetch_image never answered the slow request")


def _fetch_answers(server) -> int:
    with server.client("http") as c:
        stats = c.model_statistics("fetch_image")[0]
    return stats.success_count + stats.fail_count


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_request_past_its_deadline_is_refused_before_any_work(
    server, slow_images, protocol
) -> None:
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.url(protocol))
    past = {DEADLINE_PARAMETER: _deadline_in(-1.0)}
    url = slow_images.url(f"/slow/photo.jpg?past-{protocol}")
    for model, name, value in (
        (TEXT_MODEL, "TEXT", "a cat"),
        (f"{CLIP_MODEL}_image_url", "IMAGE_URL", url),
    ):
        with pytest.raises(InferenceServerException) as refused:
            client.infer(model, [_bytes_input(module, name, value)], parameters=past)
        assert "deadline passed" in refused.value.message(), model
        assert DEADLINE_PARAMETER in refused.value.message()
    assert not any("past-" in path for path in slow_images.httpd.seen)
    ahead = {DEADLINE_PARAMETER: _deadline_in(60.0)}
    served = client.infer(TEXT_MODEL, [_bytes_input(module, "TEXT", "a cat")], parameters=ahead)
    assert served.as_numpy("EMBEDDING").shape == (1, 384)
    client.close()


def test_a_deadline_passing_during_the_fetch_stops_the_later_steps(server, slow_images) -> None:
    before = _successes(server, ENCODER)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    url = slow_images.url("/slow/photo.jpg?during")
    with pytest.raises(InferenceServerException) as refused:
        client.infer(
            f"{CLIP_MODEL}_image_url",
            [_bytes_input(grpcclient, "IMAGE_URL", url)],
            parameters={DEADLINE_PARAMETER: _deadline_in(CLIENT_WAIT_S)},
            client_timeout=SLOW_S + 30,
        )
    client.close()
    # refused by the step after the fetch, late by what the fetch took past the deadline
    assert "deadline passed" in refused.value.message()
    assert any("during" in path for path in slow_images.httpd.seen)  # the fetch did run
    assert _successes(server, ENCODER) == before


def test_a_grpc_client_that_leaves_stops_the_rest_of_its_ensemble(server, slow_images) -> None:
    """A gRPC deadline cancels the ensemble: Triton stops scheduling its steps, and a step
    that still receives it answers it unread (``request.is_cancelled()``, unit-tested).

    Measured on Triton 2.51: an HTTP client that hangs up (a raw socket closed 0.4 s into
    the fetch) does not cancel the ensemble, and the encoder still ran; HTTP clients send
    the deadline parameter instead (the project's client does).
    """
    before = _successes(server, ENCODER)
    fetched = _fetch_answers(server)
    url = slow_images.url("/slow/photo.jpg?leaves")
    started = time.monotonic()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException, match="Deadline"):
        client.infer(
            f"{CLIP_MODEL}_image_url",
            [_bytes_input(grpcclient, "IMAGE_URL", url)],
            client_timeout=CLIENT_WAIT_S,
        )
    client.close()
    assert time.monotonic() - started < SLOW_S
    _wait_for_fetch(server, fetched)
    time.sleep(2.0)  # what would follow the fetch: preprocess, then the encoder
    assert _successes(server, ENCODER) == before
