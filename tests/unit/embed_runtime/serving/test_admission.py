"""Every step answers a request whose client has gone or whose deadline passed, unread."""

from __future__ import annotations

import numpy as np

from embed_runtime.serving.adapter import embed_requests, gather_rows
from embed_runtime.serving.admission import (
    DEADLINE_PARAMETER,
    deadline_us,
    gone_reason,
    wall_clock_us,
)
from tests.unit import fake_pb_utils as pb
from tests.unit.embed_runtime.models.helpers import _error, _text_request

NOW_US = 1_800_000_000_000_000


def _params(request) -> dict:
    import json

    return json.loads(request.parameters())


def _late(*texts: str, by_us: int) -> pb.InferenceRequest:
    return _text_request(*texts, parameters={DEADLINE_PARAMETER: NOW_US - by_us})


def test_a_request_before_its_deadline_or_without_one_is_wanted() -> None:
    clock = lambda: NOW_US  # noqa: E731
    assert gone_reason(_text_request("a"), _params, clock) is None
    ahead = _text_request("a", parameters={DEADLINE_PARAMETER: NOW_US + 1})
    assert gone_reason(ahead, _params, clock) is None


def test_a_passed_deadline_is_refused_naming_the_parameter_and_the_lateness() -> None:
    reason = gone_reason(_late("a", by_us=2_500), _params, lambda: NOW_US)
    assert reason is not None
    assert reason.code == "UNAVAILABLE"
    assert "deadline passed 2.5 ms" in reason.message
    assert DEADLINE_PARAMETER in reason.message


def test_a_cancelled_request_is_refused_as_cancelled() -> None:
    request = _text_request("a")
    request.cancelled = True
    reason = gone_reason(request, _params, lambda: NOW_US)
    assert reason is not None and "cancelled" in reason.message


def test_malformed_deadlines_never_withhold_work() -> None:
    for value in ("soon", -5, 0, 1.5, True, None, [1]):
        assert deadline_us({DEADLINE_PARAMETER: value}) is None, value
    assert deadline_us({DEADLINE_PARAMETER: "17"}) == 17
    assert deadline_us({}) is None


def test_the_wall_clock_is_microseconds_since_the_epoch() -> None:
    import time

    assert abs(wall_clock_us() / 1e6 - time.time()) < 60


def test_gather_rows_reads_nothing_of_gone_requests_and_keeps_the_rest() -> None:
    read: list = []
    gone = _text_request("late", parameters={DEADLINE_PARAMETER: 1})
    cancelled = _text_request("left")
    cancelled.cancelled = True
    requests = [_text_request("kept"), gone, cancelled, _text_request("also kept")]

    def rows(request):
        read.append(request)
        return [request.inputs()[0].as_numpy()[0, 0]]

    batch = gather_rows(pb, requests, rows)
    assert read == [requests[0], requests[3]]
    assert batch.valid == [0, 3]
    assert batch.items == [b"kept", b"also kept"]
    for i, word in ((1, "deadline passed"), (2, "cancelled")):
        code, message = _error(batch.responses[i])
        assert code == pb.TritonError.UNAVAILABLE and word in message


def test_embed_requests_runs_only_the_wanted_requests() -> None:
    ran: list = []
    requests = [_text_request("a"), _text_request("b", parameters={DEADLINE_PARAMETER: 1})]

    def run(items):
        ran.extend(items)
        return [np.ones((1, 2), dtype=np.float32) for _ in items]

    responses = embed_requests(pb, requests, lambda r: "item", run, "EMBEDDING", print)
    assert ran == ["item"]
    assert not responses[0].has_error()
    assert "deadline passed" in _error(responses[1])[1]
