"""The fetch_image adapter (``embed_runtime/models/fetch_image.py``) on the fake ``pb_utils``."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import embed_runtime
from tests.unit import fake_pb_utils as pb
from tests.unit.embed_runtime.fetch import fetch_helpers
from tests.unit.embed_runtime.fetch.fetch_helpers import PNG, TARPIT

server = fetch_helpers.server
base = fetch_helpers.base


FINAL = 2


class _Sender:
    """Records what the adapter sends for one request."""

    def __init__(self) -> None:
        self.sent: list[tuple[pb.InferenceResponse, int, float]] = []
        self.start = time.monotonic()
        self.event = threading.Event()

    def send(self, response=None, flags=0) -> None:
        self.sent.append((response, flags, time.monotonic() - self.start))
        self.event.set()

    def one(self) -> tuple[pb.InferenceResponse, float]:
        assert self.event.wait(5)
        time.sleep(0.05)
        assert len(self.sent) == 1 and self.sent[0][1] == FINAL
        return self.sent[0][0], self.sent[0][2]


class _UrlRequest(pb.InferenceRequest):
    def __init__(self, *urls: bytes | str):
        rows = [[u.encode() if isinstance(u, str) else u] for u in urls]
        super().__init__([pb.Tensor("IMAGE_URL", np.array(rows, dtype=object))])
        self.sender = _Sender()

    def get_response_sender(self) -> _Sender:
        return self.sender


@pytest.fixture
def fetch_model(monkeypatch, request):
    """The ``fetch_image`` adapter on the fake ``pb_utils``, as Triton loads it.

    Its read timeout is 5 s, or ``request.param`` (indirect parametrization).
    """
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    monkeypatch.setattr(pb, "TRITONSERVER_RESPONSE_COMPLETE_FINAL", FINAL, raising=False)
    path = Path(embed_runtime.__file__).parent / "models" / "fetch_image.py"
    spec = importlib.util.spec_from_file_location("_adapter_fetch_image", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    params = {
        "allow_hosts": "127.0.0.1",
        "connect_timeout_s": "5",
        "read_timeout_s": str(getattr(request, "param", 5.0)),
        "max_bytes": "100000",
        "max_redirects": "3",
        "max_concurrency": "4",
        "allowed_ports": "",
        "max_batch_bytes": str(3 * len(PNG)),
    }
    model = module.TritonPythonModel()
    model.initialize(
        {
            "model_config": json.dumps(
                {"parameters": {k: {"string_value": v} for k, v in params.items()}}
            )
        }
    )
    yield model
    model.finalize()


@pytest.mark.parametrize("fetch_model", [TARPIT.read_timeout_s], indirect=True)
def test_fetch_model_answers_each_request_when_its_own_urls_are_done(fetch_model, base):
    tarpit = _UrlRequest(f"{base}/image.png?a", f"{base}/drip?model")
    fast = _UrlRequest(f"{base}/image.png?a", "data:,x")
    bad = _UrlRequest(b"\xff\xfe")
    refused = _UrlRequest("http://[2002:7f00:1::1]/x.png")
    assert fetch_model.execute([tarpit, fast, bad, refused]) is None
    # execute held its batch until every request was answered (a stub that dies while it
    # holds them leaves Triton's backend to fail them, never to forget them) ...
    assert all(len(r.sender.sent) == 1 for r in (tarpit, fast, bad, refused))
    response, at = fast.sender.one()
    assert at < tarpit.sender.sent[0][2]  # ... and answered the fast one first
    assert response.output("IMAGE")[:, 0].tolist() == [PNG, b"x"]
    for request, code, fragment in (
        (bad, pb.TritonError.INVALID_ARG, "not valid UTF-8"),
        (refused, pb.TritonError.INVALID_ARG, "is 6to4"),
        (tarpit, pb.TritonError.UNAVAILABLE, "timed out"),
    ):
        response, at = request.sender.one()
        assert response.error().code() == code
        assert fragment in response.error().message()
    assert tarpit.sender.sent[0][2] > TARPIT.read_timeout_s - 0.1


def test_fetch_model_execute_returns_only_once_its_batch_is_answered(fetch_model, base):
    """A request left open after ``execute`` is lost with the stub; so none is left."""

    def late(groups, on_done):
        timer = threading.Timer(0.4, on_done, args=(0, [PNG]))
        timer.start()

    fetch_model.pool.fetch_groups = late
    request = _UrlRequest(f"{base}/image.png?late")
    start = time.monotonic()
    fetch_model.execute([request])
    assert time.monotonic() - start >= 0.35
    assert len(request.sender.sent) == 1 and not request.sender.sent[0][0].has_error()


def test_fetch_model_stops_holding_a_request_no_fetch_answers(fetch_model, monkeypatch):
    """A bug that never answers does not hold the instance for ever: logged, returned."""
    monkeypatch.setitem(type(fetch_model).execute.__globals__, "HOLD_MARGIN_S", 0.2)
    fetch_model.url_deadline_s = 0.1
    fetch_model.pool.fetch_groups = lambda groups, on_done: None
    pb.Logger.clear()
    start = time.monotonic()
    fetch_model.execute([_UrlRequest("http://127.0.0.1:9/x.png")])
    assert time.monotonic() - start < 5
    assert any("1 request(s) still open" in m for level, m in pb.Logger.messages)


def test_fetch_model_applies_max_batch_bytes_per_execute(fetch_model, base):
    requests = [_UrlRequest(f"{base}/image.png?budget={i}") for i in range(4)]
    fetch_model.execute(requests)
    errors = [r for r in requests if r.sender.one()[0].has_error()]
    assert len(errors) == 1
    assert "max_batch_bytes" in errors[0].sender.sent[0][0].error().message()
    again = _UrlRequest(f"{base}/image.png?next")
    fetch_model.execute([again])
    assert not again.sender.one()[0].has_error()


def test_fetch_model_sends_one_response_per_request_when_the_pool_fails(fetch_model, base):
    def fail_after_first(groups, on_done):
        on_done(0, [PNG])
        raise RuntimeError("pool broke")

    fetch_model.pool.fetch_groups = fail_after_first
    first, second = _UrlRequest(f"{base}/image.png"), _UrlRequest(f"{base}/octet")
    fetch_model.execute([first, second])
    assert not first.sender.one()[0].has_error()
    error = second.sender.one()[0].error()
    assert error.code() == pb.TritonError.INTERNAL
    assert "pool broke" not in error.message()


class _BrokenTensor(pb.Tensor):
    def as_numpy(self):
        raise RuntimeError("tensor broke")


def test_fetch_model_answers_every_request_when_reading_inputs_fails(fetch_model, base):
    good = _UrlRequest(f"{base}/image.png")
    broken = _UrlRequest()
    broken._inputs = [_BrokenTensor("IMAGE_URL", np.empty((1, 1), dtype=object))]
    assert fetch_model.execute([good, broken]) is None
    for request in (good, broken):
        error = request.sender.one()[0].error()
        assert error.code() == pb.TritonError.INTERNAL
        assert "tensor broke" not in error.message()
