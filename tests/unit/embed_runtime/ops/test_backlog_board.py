"""The backlog board: rows numbered by the admitting step, the highest ticket taken by the
encoders, and the gate that admits against them.

Real shared files in a temporary directory, one process (each slot is its own open file,
as each stub is); the clocks are injected, so no test waits on time.
"""

from __future__ import annotations

import os

import pytest

from embed_runtime.ops.backlog_board import IDLE_NS, Admission, EncoderSlot
from embed_runtime.serving.admission import (
    ADMISSION_ROWS,
    ADMISSION_WAIT,
    AdmissionGate,
    Taken,
    late_refusals,
    request_deadline_us,
)

MS = 1_000_000
NOW_US = 1_800_000_000_000_000


class Clock:
    def __init__(self) -> None:
        self.ns = 10_000 * MS

    def __call__(self) -> int:
        return self.ns


@pytest.fixture
def board(tmp_path):
    return str(tmp_path / "board")


def _run(slot: EncoderSlot, clock: Clock, rows: int, ms: float, ticket: int = 0) -> None:
    with slot.executing(rows, ticket):
        clock.ns += int(ms * MS)


def test_the_backlog_is_the_rows_numbered_past_the_highest_ticket_taken(board) -> None:
    clock = Clock()
    a, b = Admission(board, clock), Admission(board, clock)
    e1, e2 = EncoderSlot(board, clock), EncoderSlot(board, clock)
    assert a.issue([3, 1]) == [3, 4] and b.issue([6]) == [10] and a.issue([5]) == [15]
    _run(e1, clock, 4, 40, ticket=4)  # 10 ms a row
    _run(e2, clock, 2, 40, ticket=10)  # 20 ms a row; rows 5-8 never came (cancelled)
    backlog = a.read()
    assert backlog.queued == 15 - 10
    # the mean cost of a row (15 ms), over the two instances that run side by side
    assert backlog.row_ns == pytest.approx(7.5 * MS)
    assert backlog.exec_ns == pytest.approx(40 * MS) and backlog.running == 0
    assert backlog.wait_ns(1) == pytest.approx(6 * 7.5 * MS + 40 * MS)


def test_a_request_that_never_reaches_the_encoder_leaves_the_count_with_the_next_taken(
    board,
) -> None:
    """Cancelled in the queue, refused by a later step, died with a stub, a direct call of
    the admitting step: its ticket is passed over when any later one is taken."""
    clock = Clock()
    admission, encoder = Admission(board, clock), EncoderSlot(board, clock)
    lost = admission.issue([32] * 30)  # 30 direct calls of 32 rows: nothing reaches it
    assert admission.read().queued == 960
    (ticket,) = admission.issue([1])
    _run(encoder, clock, 1, 5, ticket=ticket)
    assert ticket > lost[-1] and admission.read().queued == 0


def test_a_row_costs_what_the_executions_take_over_the_rows_they_ran(board) -> None:
    clock = Clock()
    admission, encoder = Admission(board, clock), EncoderSlot(board, clock)
    _run(encoder, clock, 1, 10)  # alone: its fixed cost all its own
    _run(encoder, clock, 16, 40)  # a batch
    # moving time 17.5 ms over moving rows 4.75: a few ms, not the lone row's 10
    assert admission.read().row_ns == pytest.approx(17.5 / 4.75 * MS, rel=1e-3)
    assert encoder.row_ns == admission.read().row_ns


def test_figures_survive_a_process_that_leaves_and_one_that_takes_its_slot(board) -> None:
    clock = Clock()
    admission, first = Admission(board, clock), EncoderSlot(board, clock)
    admission.issue([5, 5])
    _run(first, clock, 5, 50, ticket=5)
    first.close()  # its stub restarts
    assert admission.read().queued == 5
    second = EncoderSlot(board, clock)
    assert second.slot == first.slot and admission.read().queued == 5
    _run(second, clock, 5, 50, ticket=10)
    assert admission.read().queued == 0


def _gate(board: str, clock: Clock, wait_ms: int = 0, max_rows: int = 0) -> AdmissionGate:
    gate = AdmissionGate(Admission(board, clock), "mini_encode", wait_ms * 1000, max_rows)
    gate.now_us = lambda: NOW_US
    return gate


def _admitted(gate: AdmissionGate, rows: int = 1, n: int = 1, deadline=None) -> list[bool]:
    return [gate.admit(rows, deadline) is None for _ in range(n)]


def test_without_a_deadline_requests_queue_up_to_the_row_bound(board) -> None:
    clock = Clock()
    gate, encoder = _gate(board, clock, max_rows=500), EncoderSlot(board, clock)
    _run(encoder, clock, 2, 20, ticket=0)  # 10 ms a row: 500 rows are 5 s of work
    gate.board.issue([1] * 490)
    with encoder.executing(0):  # the encoder is running
        gate.begin()
        assert _admitted(gate, n=12) == [True] * 10 + [False] * 2
        error = gate.admit(1)
    assert error is not None and error.code == "UNAVAILABLE"
    assert "server overloaded: 500 row(s) already wait for mini_encode" in error.message
    assert ADMISSION_ROWS in error.message


def test_without_a_deadline_the_wait_bound_refuses_past_its_work(board) -> None:
    clock = Clock()
    gate, encoder = _gate(board, clock, wait_ms=100), EncoderSlot(board, clock)
    _run(encoder, clock, 2, 20)  # 10 ms a row, 20 ms an execution, one instance
    gate.board.issue([1] * 6)  # 6 queued: 6 x 10 + 20 = 80 ms with one more
    with encoder.executing(0):
        gate.begin()
        assert _admitted(gate, n=3) == [True, True, False]
        error = gate.admit(1)
    assert "server overloaded: 8 row(s) (about 110 ms of work)" in error.message
    assert ADMISSION_WAIT in error.message


def test_an_empty_queue_admits_two_rows_an_instance_however_costly(board) -> None:
    clock = Clock()
    gate = _gate(board, clock, wait_ms=10, max_rows=1)
    e1, e2 = EncoderSlot(board, clock), EncoderSlot(board, clock)
    _run(e1, clock, 1, 400)  # 400 ms a row, 40 x the bound
    _run(e2, clock, 1, 400)
    with e1.executing(0), e2.executing(0):
        gate.begin()
        assert _admitted(gate, n=5) == [True] * 4 + [False]


def test_a_request_with_a_deadline_is_refused_when_its_answer_would_come_too_late(
    board,
) -> None:
    clock = Clock()
    gate, encoder = _gate(board, clock), EncoderSlot(board, clock)
    _run(encoder, clock, 10, 100)  # 10 ms a row, 100 ms an execution
    gate.board.issue([1] * 50)  # 50 rows queued: 500 + 100 ms ahead of a newcomer
    with encoder.executing(0):
        gate.begin()
        assert gate.admit(1, NOW_US + 1_300_000) is None  # 610 ms of the 650 ms it may take
        late = gate.admit(1, NOW_US + 1_200_000)  # 620 ms > 0.5 x 1,200 ms
        assert gate.admit(10, NOW_US + 3_000_000) is None  # a later deadline still fits
    assert late is not None and late.code == "UNAVAILABLE"
    assert "server overloaded: about 620 ms until mini_encode could answer" in late.message
    assert "1200 ms left before the request's deadline" in late.message


def test_a_deadline_shorter_than_the_work_itself_is_refused_on_an_idle_server(board) -> None:
    clock = Clock()
    gate, encoder = _gate(board, clock), EncoderSlot(board, clock)
    _run(encoder, clock, 1, 30)
    clock.ns += IDLE_NS
    gate.begin()
    assert gate.admit(1, NOW_US + 20_000) is not None  # 30 ms of work, 20 ms left
    assert gate.admit(1, NOW_US + 100_000) is None


def test_a_count_no_encoder_will_take_is_cleared_once_the_encoders_are_idle(board) -> None:
    clock = Clock()
    gate, encoder = _gate(board, clock, wait_ms=100), EncoderSlot(board, clock)
    _run(encoder, clock, 1, 10)
    gate.board.issue([1] * 50)  # direct calls of the admitting step: no encoder takes them
    gate.begin()
    assert gate.admit(1) is not None  # the encoder ended a run just now: not idle yet
    clock.ns += IDLE_NS
    gate.begin()
    assert gate.admit(1) is None
    assert gate.board.read().queued == 0
    gate.board.issue([1])
    assert gate.board.read().queued == 1


def test_a_running_encoder_is_never_idle(board) -> None:
    clock = Clock()
    gate, encoder = _gate(board, clock, wait_ms=100), EncoderSlot(board, clock)
    _run(encoder, clock, 1, 10)
    gate.board.issue([1] * 50)
    with encoder.executing(1):
        clock.ns += 10 * IDLE_NS
        gate.begin()
        assert gate.admit(1) is not None


def test_an_encoder_gone_while_running_does_not_hold_the_count(board) -> None:
    clock = Clock()
    gate = _gate(board, clock, wait_ms=100)
    dead = EncoderSlot(board, clock)
    _run(dead, clock, 1, 10)
    gate.board.issue([1] * 50)
    dead._set(2, 1)  # died inside an execution: its flag stays set, its lock goes
    dead.close()
    gate.begin()
    assert gate.admit(1) is None


def test_before_any_encoder_ran_everything_is_admitted(board) -> None:
    gate = _gate(board, Clock(), wait_ms=1, max_rows=2000)
    gate.board.issue([1000])
    gate.begin()
    assert all(_admitted(gate, n=100, deadline=NOW_US + 1))


def test_the_tickets_carry_each_requests_rows_deadline_and_estimate(board) -> None:
    gate = _gate(board, Clock(), wait_ms=100)
    first, second = gate.tickets([2, 1], [None, NOW_US + 9], [0, 70_000])
    assert first.tolist() == [[2, 0, NOW_US, 0]] * 2
    assert second.tolist() == [[3, NOW_US + 9, NOW_US, 70_000]]


def test_estimates_are_scaled_by_how_the_last_answers_compared_with_theirs(board) -> None:
    clock = Clock()
    gate, encoder = _gate(board, clock), EncoderSlot(board, clock)
    _run(encoder, clock, 10, 100)  # 10 ms a row, 100 ms an execution
    gate.board.issue([1] * 20)
    taken = Taken(1, 0, (None,), ((NOW_US - 300_000, 100_000), (NOW_US - 100_000, 100_000)))
    assert taken.ratios(NOW_US) == [3.0, 1.0]
    encoder.observe(taken.ratios(NOW_US))  # twice as slow as estimated: 1 + 0.25 x (2 - 1)
    assert gate.board.read().bias == pytest.approx(1.25)
    with encoder.executing(0):
        gate.begin()
        assert gate.admit(1, NOW_US + 790_000) is None  # 310 ms x 1.25 of the 395 allowed
        assert gate.estimate_us == 310_000  # the model's own estimate goes on the ticket
        assert gate.admit(1, NOW_US + 790_000) is not None  # 320 ms x 1.25 > 395 ms
    encoder.observe([100.0])  # never beyond 4 x
    assert gate.board.read().bias == pytest.approx(1.25 + 0.25 * (4.0 - 1.25), abs=1e-3)


def test_the_deadline_is_the_earlier_of_the_parameter_and_tritons_timeout() -> None:
    class Request:
        def __init__(self, timeout_us: int) -> None:
            self.timeout_us = timeout_us

        def timeout(self) -> int:
            return self.timeout_us

    clock = lambda: NOW_US  # noqa: E731
    stated = {"deadline_unix_us": NOW_US + 5_000}
    assert request_deadline_us(Request(0), {}, clock) is None
    assert request_deadline_us(Request(0), stated, clock) == NOW_US + 5_000
    assert request_deadline_us(Request(1_000), stated, clock) == NOW_US + 1_000
    assert request_deadline_us(Request(9_000), stated, clock) == NOW_US + 5_000
    assert request_deadline_us(object(), stated, clock) == NOW_US + 5_000


def test_the_encoder_refuses_what_its_run_would_answer_after_the_deadline() -> None:
    taken = Taken(40, 9, (None, NOW_US + 500_000, NOW_US + 100_000))
    late = late_refusals(taken, row_ns=5 * MS, now_us=lambda: NOW_US)  # 200 ms of work
    assert late[0] is None and late[1] is None
    assert late[2] is not None and "passes 100 ms before this execution" in late[2].message
    assert late_refusals(taken, row_ns=0) == [None, None, None]  # never ran: no estimate


def test_the_last_slot_closed_removes_the_file(board) -> None:
    clock = Clock()
    admission, encoder = Admission(board, clock), EncoderSlot(board, clock)
    encoder.close()  # an encoder restarting: the admitting step still holds the board
    assert os.path.exists(board)
    admission.close()
    assert not os.path.exists(board)


def test_no_gate_without_an_encoder_or_a_bound(tmp_path) -> None:
    assert AdmissionGate.from_parameters({}, "1") is None
    params = {"admission_encoder": "m_encode", ADMISSION_WAIT: "0", ADMISSION_ROWS: "0"}
    assert AdmissionGate.from_parameters(params, "1") is None
