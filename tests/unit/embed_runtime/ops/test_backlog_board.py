"""The backlog board: encoders count what they take, the step in front admits within a bound.

Real shared files in a temporary directory, one process (each slot is its own open file,
as each stub is); the clock is injected, so no test waits on time.
"""

from __future__ import annotations

import math
import os

import pytest

from embed_runtime.ops.backlog_board import IDLE_NS, Admission, EncoderSlot
from embed_runtime.serving.adapter import gather_rows
from embed_runtime.serving.admission import AdmissionGate
from tests.unit import fake_pb_utils as pb
from tests.unit.embed_runtime.models.helpers import _error, _text_request

MS = 1_000_000


class Clock:
    def __init__(self) -> None:
        self.ns = 10_000 * MS

    def __call__(self) -> int:
        return self.ns


@pytest.fixture
def board(tmp_path):
    return str(tmp_path / "board")


def _run(slot: EncoderSlot, clock: Clock, requests: int, ms: float) -> None:
    with slot.executing(requests):
        clock.ns += int(ms * MS)


def test_the_backlog_is_what_was_passed_on_minus_what_the_encoders_took(board) -> None:
    clock = Clock()
    a, b = Admission(board, clock), Admission(board, clock)
    e1, e2 = EncoderSlot(board, clock), EncoderSlot(board, clock)
    a.passed(10)
    b.passed(5)
    _run(e1, clock, 4, 40)  # 10 ms a request
    _run(e2, clock, 2, 40)  # 20 ms a request
    backlog = a.read()
    assert backlog.queued == 15 - 6
    # the mean cost of a request (15 ms), over the two instances that run side by side
    assert backlog.per_request_ns == pytest.approx(7.5 * MS)
    assert backlog.wait_ns == pytest.approx(9 * 7.5 * MS)


def test_a_request_costs_what_the_executions_take_over_the_requests_they_ran(board) -> None:
    clock = Clock()
    admission, encoder = Admission(board, clock), EncoderSlot(board, clock)
    _run(encoder, clock, 1, 10)  # alone: its fixed cost all its own
    _run(encoder, clock, 16, 40)  # a batch
    # moving time (10 + 0.25 * 30 = 17.5 ms) over moving requests (1 + 0.25 * 15 = 4.75)
    assert admission.read().per_request_ns == pytest.approx(17.5 / 4.75 * MS, rel=1e-6)


def test_counts_survive_a_process_that_leaves_and_one_that_takes_its_slot(board) -> None:
    clock = Clock()
    admission = Admission(board, clock)
    admission.passed(7)
    first = EncoderSlot(board, clock)
    _run(first, clock, 3, 30)
    first.close()
    second = EncoderSlot(board, clock)
    assert second.slot == first.slot
    _run(second, clock, 2, 20)
    assert admission.read().queued == 2


def test_a_count_below_zero_is_set_to_zero_at_once(board) -> None:
    clock = Clock()
    admission, encoder = Admission(board, clock), EncoderSlot(board, clock)
    _run(encoder, clock, 5, 5)  # requests sent to the encoder model directly
    assert admission.read().queued == 0
    admission.passed(3)
    assert admission.read().queued == 3


def test_work_passed_and_taken_while_the_board_is_read_leaves_no_count_behind(
    board, monkeypatch
) -> None:
    """A tokenize and an encoder instance at work during a read (a busy closed loop).

    Read in the wrong order (admitters first), the encoder's take of a request passed
    after the admitters were read makes the backlog -1; the resync then counts one request
    too many for good, and a busy loop never idles long enough to reset it.
    """
    clock = Clock()
    reader, tokenize = Admission(board, clock), Admission(board, clock)
    encoder = EncoderSlot(board, clock)
    encoders = Admission._encoders

    def busy_read(self):  # a request passed on and taken in the middle of the read
        tokenize.passed(1)
        _run(encoder, clock, 1, 1)
        return encoders(self)

    monkeypatch.setattr(Admission, "_encoders", busy_read)
    for _ in range(5):
        assert reader.read().queued == 0
    monkeypatch.setattr(Admission, "_encoders", encoders)
    assert reader.read().queued == 0  # nothing waits: nothing may be counted


def _gate(board: str, clock: Clock, wait_ms: int) -> AdmissionGate:
    return AdmissionGate(Admission(board, clock), "mini_encode", wait_ms * 1000)


def test_the_gate_admits_until_the_estimated_wait_passes_its_bound(board) -> None:
    clock = Clock()
    gate, encoder = _gate(board, clock, 100), EncoderSlot(board, clock)
    _run(encoder, clock, 2, 20)  # 10 ms a request, one instance
    gate.board.passed(2 + 6)  # the 2 it ran, then 60 ms queued: room for 4 more
    requests = [_text_request(f"t{i}") for i in range(6)]
    with encoder.executing(0):  # the encoder is running
        batch = gather_rows(pb, requests, lambda r: ["row"], gate)
    assert batch.valid == [0, 1, 2, 3]
    for response in batch.responses[4:]:
        code, message = _error(response)
        assert code == pb.TritonError.UNAVAILABLE
        # the 6 queued and the 4 this execution admitted before it
        assert "server overloaded: 10 request(s) (about 100 ms of work) already wait" in message
        assert "mini_encode" in message and "admission_wait_us" in message


def test_a_full_count_beside_idle_encoders_is_reset_and_the_request_admitted(board) -> None:
    clock = Clock()
    gate, encoder = _gate(board, clock, 100), EncoderSlot(board, clock)
    _run(encoder, clock, 1, 10)
    gate.board.passed(50)  # requests cancelled in Triton's queue never reach the encoder
    gate.begin()
    assert gate.refusal() is not None  # the encoder ended a run just now: not idle yet
    clock.ns += IDLE_NS
    gate.begin()
    assert gate.refusal() is None
    assert gate.board.read().queued == 1 - 1 + 0  # reset to zero, then nothing passed yet
    gate.passed(1)
    assert gate.board.read().queued == 1


def test_a_running_encoder_is_never_idle(board) -> None:
    clock = Clock()
    gate, encoder = _gate(board, clock, 100), EncoderSlot(board, clock)
    _run(encoder, clock, 1, 10)
    gate.board.passed(50)
    with encoder.executing(1):
        clock.ns += 10 * IDLE_NS
        gate.begin()
        assert gate.refusal() is not None


def test_an_encoder_gone_while_running_does_not_hold_the_count(board) -> None:
    clock = Clock()
    gate = _gate(board, clock, 100)
    dead = EncoderSlot(board, clock)
    _run(dead, clock, 1, 10)
    gate.board.passed(50)
    dead._set(2, 1)  # died inside an execution: its flag stays set, its lock goes
    dead.close()
    gate.begin()
    assert gate.refusal() is None


def test_before_any_encoder_ran_everything_is_admitted(board) -> None:
    gate = _gate(board, Clock(), 1)
    gate.board.passed(1000)
    gate.begin()
    assert gate._room == math.inf
    assert all(gate.refusal() is None for _ in range(100))


def test_an_empty_queue_admits_one_request_costlier_than_the_whole_bound(board) -> None:
    clock = Clock()
    gate, encoder = _gate(board, clock, 10), EncoderSlot(board, clock)
    _run(encoder, clock, 1, 500)  # one request costs 500 ms, the bound is 10 ms
    with encoder.executing(0):
        gate.begin()
        assert gate.refusal() is None  # two waiting for the one instance
        assert gate.refusal() is None
        assert gate.refusal() is not None


def test_each_instance_has_two_requests_waiting_however_costly_one_is(board) -> None:
    clock = Clock()
    gate = _gate(board, clock, 10)
    e1, e2 = EncoderSlot(board, clock), EncoderSlot(board, clock)
    _run(e1, clock, 1, 400)  # a 32-sentence request: 400 ms, 40 x the bound
    _run(e2, clock, 1, 400)
    gate.board.passed(2 + 3)  # three already wait
    with e1.executing(0), e2.executing(0):
        gate.begin()
        assert gate.refusal() is None  # two waiting for each of the two instances
        assert gate.refusal() is not None


def test_the_last_slot_closed_removes_the_file(board) -> None:
    clock = Clock()
    admission, encoder = Admission(board, clock), EncoderSlot(board, clock)
    encoder.close()  # an encoder restarting: the admitting step still holds the board
    assert os.path.exists(board)
    admission.close()
    assert not os.path.exists(board)


def test_no_gate_without_an_encoder_or_a_bound(tmp_path) -> None:
    assert AdmissionGate.from_parameters({}, "1") is None
    params = {"admission_encoder": "m_encode", "admission_wait_us": "0"}
    assert AdmissionGate.from_parameters(params, "1") is None
