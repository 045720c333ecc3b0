"""The backlog board: rows numbered by the admitting step, the highest ticket taken by the
encoders, and the gate that admits against them.

Real shared files in a temporary directory, one process (each slot is its own open file,
as each stub is); the clocks are injected, so no test waits on time.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from embed_runtime.ops.backlog_board import IDLE_NS, Admission, EncoderSlot
from embed_runtime.ops.cost_model import Cost, features
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


# A model whose work grows with tokens: 1 ms an execution, 0.2 ms a request, 0.1 ms a row
# and 40 us a token, so an 8-token query is 0.62 ms of work and a 240-token row 9.7 ms.
MODEL = Cost(1 * MS, 0.2 * MS, 0.1 * MS, 40_000 * 128, 0.0)


def _ms(lengths: list[list[int]]) -> float:
    return MODEL.of(features(lengths)) / MS


def _run(
    slot: EncoderSlot, clock: Clock, lengths: list[list[int]], ticket: int = 0, work: int = 0
) -> None:
    """One execution of requests with rows of these token counts, as long as MODEL says."""
    with slot.executing(features(lengths), ticket, work):
        clock.ns += int(_ms(lengths) * MS)


def _teach(slot: EncoderSlot, clock: Clock, n: int = 12) -> None:
    """Executions of short, long and mixed requests, enough for the fit to learn MODEL."""
    shapes = [[[8]], [[240] * 16], [[8], [120, 60]], [[30] * 4, [200]], [[256] * 64], [[12]] * 9]
    for i in range(n):
        _run(slot, clock, shapes[i % len(shapes)])


def test_the_backlog_is_the_rows_and_work_numbered_past_the_highest_tickets_taken(
    board,
) -> None:
    clock = Clock()
    a, b = Admission(board, clock), Admission(board, clock)
    e1, e2 = EncoderSlot(board, clock), EncoderSlot(board, clock)
    assert a.issue([3, 1], [30, 10]) == [(3, 30), (4, 40)]
    assert b.issue([6], [60]) == [(10, 100)] and a.issue([5], [50]) == [(15, 150)]
    _run(e1, clock, [[8] * 4], ticket=4, work=40)
    _run(e2, clock, [[8] * 2], ticket=10, work=100)  # rows 5-8 never came (cancelled)
    backlog = a.read()
    assert backlog.queued == 15 - 10 and backlog.work_ns == 150 - 100
    assert backlog.encoders == 2 and backlog.running == 0


def test_a_request_that_never_reaches_the_encoder_leaves_the_count_with_the_next_taken(
    board,
) -> None:
    """Cancelled in the queue, refused by a later step, died with a stub, a direct call of
    the admitting step: its ticket is passed over when any later one is taken."""
    clock = Clock()
    admission, encoder = Admission(board, clock), EncoderSlot(board, clock)
    lost = admission.issue([32] * 30, [5 * MS] * 30)  # 30 direct calls: nothing reaches it
    assert admission.read().queued == 960
    ((ticket, work),) = admission.issue([1], [MS])
    _run(encoder, clock, [[8]], ticket=ticket, work=work)
    assert ticket > lost[-1][0] and admission.read().queued == 0
    assert admission.read().work_ns == 0


def test_the_cost_is_learned_by_tokens_and_tells_a_long_row_from_a_query(board) -> None:
    clock = Clock()
    admission, encoder = Admission(board, clock), EncoderSlot(board, clock)
    _teach(encoder, clock)
    cost = admission.read().cost
    for lengths in ([8], [240], [128] * 64, [8, 240, 30]):
        want = MODEL.alone_ns(lengths)
        assert cost.alone_ns(lengths) == pytest.approx(want, rel=0.1), lengths
    # a one-sentence query is priced at a small share of a 240-token row
    assert cost.work_ns([240]) > 10 * cost.work_ns([8])
    assert encoder.cost == cost


def test_figures_survive_a_process_that_leaves_and_one_that_takes_its_slot(board) -> None:
    clock = Clock()
    admission, first = Admission(board, clock), EncoderSlot(board, clock)
    admission.issue([5, 5], [50, 50])
    _run(first, clock, [[8] * 5], ticket=5, work=50)
    first.close()  # its stub restarts
    assert admission.read().queued == 5 and admission.read().cost.known
    second = EncoderSlot(board, clock)
    assert second.slot == first.slot and admission.read().queued == 5
    _run(second, clock, [[8] * 5], ticket=10, work=100)
    assert admission.read().queued == 0 and admission.read().work_ns == 0


def _gate(board: str, clock: Clock, wait_ms: int = 0, max_rows: int = 0) -> AdmissionGate:
    gate = AdmissionGate(
        Admission(board, clock), "mini_encode", wait_ms * 1000, max_rows, max_tokens=256
    )
    gate.now_us = lambda: NOW_US
    return gate


def _queue(gate: AdmissionGate, lengths: list[list[int]]) -> None:
    """Requests with rows of these token counts, admitted and passed on."""
    cost = gate.board.read().cost
    gate.board.issue([len(rows) for rows in lengths], [cost.work_ns(rows) for rows in lengths])


def _admitted(gate: AdmissionGate, lengths=(8,), n: int = 1, deadline=None) -> list[bool]:
    return [gate.admit(list(lengths), deadline) is None for _ in range(n)]


def test_without_a_deadline_requests_queue_until_the_row_bound_is_ahead(board) -> None:
    clock = Clock()
    gate, encoder = _gate(board, clock, max_rows=500), EncoderSlot(board, clock)
    _teach(encoder, clock)
    _queue(gate, [[8]] * 490)
    with encoder.executing(features([[8]])):
        gate.begin()
        assert _admitted(gate, n=12) == [True] * 10 + [False] * 2
        error = gate.admit([8])
    assert error is not None and error.code == "UNAVAILABLE"
    assert "server overloaded: 500 row(s) already wait for mini_encode" in error.message
    assert ADMISSION_ROWS in error.message


def test_without_a_deadline_the_wait_bound_refuses_past_the_work_ahead(board) -> None:
    clock = Clock()
    gate, encoder = _gate(board, clock, wait_ms=100), EncoderSlot(board, clock)
    _teach(encoder, clock)
    _queue(gate, [[240]] * 9)  # 9 x 9.9 ms + 1 ms: about 90 ms of work
    with encoder.executing(features([[8]])):
        gate.begin()
        assert _admitted(gate, [240], n=2) == [True, False]
        error = gate.admit([8])
    assert "server overloaded: 10 row(s) (about 10" in error.message
    assert ADMISSION_WAIT in error.message


def test_a_request_with_nothing_ahead_is_admitted_whatever_its_size(board) -> None:
    clock = Clock()
    gate, encoder = _gate(board, clock, wait_ms=10, max_rows=64), EncoderSlot(board, clock)
    _teach(encoder, clock)
    clock.ns += IDLE_NS
    gate.begin()
    assert gate.admit([256] * 64) is None  # about 700 ms of work, 70 x the bound: its own
    assert gate.admit([8]) is not None  # now 64 rows wait ahead of the next one


def test_after_long_rows_an_idle_server_answers_short_queries_with_deadlines(board) -> None:
    """The everyday retrieval shape: documents indexed, then queries that state 250 ms."""
    clock = Clock()
    gate, encoder = _gate(board, clock), EncoderSlot(board, clock)
    for _ in range(6):  # 64 rows of ~240 tokens each, seconds an execution
        _run(encoder, clock, [[240] * 64])
    _teach(encoder, clock)
    clock.ns += IDLE_NS
    gate.begin()
    assert _admitted(gate, [10], n=8, deadline=NOW_US + 250_000) == [True] * 8
    assert gate.estimate_us < 20_000  # the eighth waits for seven queries, not a document


def test_a_deadline_counts_the_work_ahead_and_the_requests_own(board) -> None:
    clock = Clock()
    gate, encoder = _gate(board, clock), EncoderSlot(board, clock)
    _teach(encoder, clock)
    _queue(gate, [[240]] * 50)  # about 500 ms ahead of a newcomer
    with encoder.executing(features([[8]])):
        gate.begin()
        assert gate.admit([8], NOW_US + 1_300_000) is None  # ~500 ms of the 650 it may take
        late = gate.admit([8], NOW_US + 900_000)
        assert gate.admit([8] * 10, NOW_US + 3_000_000) is None  # a later deadline fits
    assert late is not None and late.code == "UNAVAILABLE"
    assert "until mini_encode could answer" in late.message
    assert "900 ms left before the request's deadline" in late.message


def test_on_an_idle_server_a_deadline_shorter_than_the_work_itself_is_refused(board) -> None:
    clock = Clock()
    gate, encoder = _gate(board, clock), EncoderSlot(board, clock)
    _teach(encoder, clock)
    clock.ns += IDLE_NS
    gate.begin()
    own_us = MODEL.alone_ns([240] * 64) / 1000
    assert gate.admit([240] * 64, NOW_US + int(3 * own_us)) is None  # 3 x its own time
    gate.begin()
    assert gate.admit([240] * 64, NOW_US + int(0.3 * own_us)) is not None  # 0.3 x


def test_a_count_no_encoder_will_take_is_cleared_once_the_encoders_are_idle(board) -> None:
    clock = Clock()
    gate, encoder = _gate(board, clock, wait_ms=100), EncoderSlot(board, clock)
    _teach(encoder, clock)
    _queue(gate, [[240]] * 50)  # direct calls of the admitting step: no encoder takes them
    gate.begin()
    assert gate.admit([8]) is not None  # the encoder ended a run just now: not idle yet
    clock.ns += IDLE_NS
    gate.begin()
    assert gate.admit([8]) is None
    assert gate.board.read().queued == 0 and gate.board.read().work_ns == 0
    _queue(gate, [[8]])
    assert gate.board.read().queued == 1


def test_a_running_encoder_is_never_idle_and_its_rest_is_counted(board) -> None:
    clock = Clock()
    gate, encoder = _gate(board, clock, wait_ms=100), EncoderSlot(board, clock)
    _teach(encoder, clock)
    _queue(gate, [[240]] * 50)
    with encoder.executing(features([[256] * 64])):  # about 700 ms
        clock.ns += 10 * IDLE_NS
        backlog = gate.board.read()
        assert backlog.running == 1
        want = MODEL.alone_ns([256] * 64) - 100 * MS
        (busy,) = backlog.busy_ns
        assert busy == pytest.approx(want, rel=1e-3)
        gate.begin()
        assert gate.admit([8]) is not None


def test_an_encoder_gone_while_running_does_not_hold_the_count(board) -> None:
    clock = Clock()
    gate = _gate(board, clock, wait_ms=100)
    dead = EncoderSlot(board, clock)
    _teach(dead, clock)
    _queue(gate, [[240]] * 50)
    dead._set(1, 1)  # died inside an execution: its flag stays set, its lock goes
    dead.close()
    gate.begin()
    assert gate.admit([8]) is None


def test_before_any_encoder_ran_everything_is_admitted(board) -> None:
    gate = _gate(board, Clock(), wait_ms=1, max_rows=2000)
    gate.board.issue([1000])
    gate.begin()
    assert all(_admitted(gate, n=100, deadline=NOW_US + 1))


def test_the_tickets_carry_each_requests_rows_deadline_estimate_and_work(board) -> None:
    clock = Clock()
    gate, encoder = _gate(board, clock, wait_ms=100), EncoderSlot(board, clock)
    _teach(encoder, clock)
    gate.begin()
    first, second = gate.tickets([[8, 8], [240]], [None, NOW_US + 9], [0, 70_000])
    work = gate.board.read().cost.work_ns
    w1, w2 = int(work([8, 8])), int(work([240]))
    assert first.tolist() == [[2, 0, NOW_US, 0, w1]] * 2
    assert second.tolist() == [[3, NOW_US + 9, NOW_US, 70_000, w1 + w2]]
    assert w2 > 5 * w1


def test_text_is_priced_by_its_bytes_before_it_is_tokenized(board) -> None:
    from tests.unit import fake_pb_utils as pb

    rows = np.array([[b"a cat"], [b"x" * 4000]], dtype=object)
    gate = _gate(board, Clock())
    request = pb.InferenceRequest([pb.Tensor("TEXT", rows)])
    assert gate.weigh(request) == [2 + int(5 * 0.3), 256]  # capped at the window
    gate.learn(1000, 250)
    assert gate.tokens_per_byte == pytest.approx(0.3 + 0.25 * (0.25 - 0.3))


def test_parts_granted_by_the_step_in_front_are_counted_never_refused(board) -> None:
    clock = Clock()
    gate, encoder = _gate(board, clock, max_rows=10), EncoderSlot(board, clock)
    _teach(encoder, clock)
    _queue(gate, [[8]] * 20)
    with encoder.executing(features([[8]])):
        gate.begin()
        assert not gate.granted({"admission_grant": "0" * 32})
        assert gate.admit([8]) is not None
        assert gate.granted({"admission_grant": encoder.secret})
        granted = gate.granted({"admission_grant": gate.grant})
        assert gate.admit([128] * 64, granted=granted) is None
        assert gate._rows == 64
    assert gate.grant == encoder.secret and len(gate.grant) == 32


def test_estimates_are_scaled_by_how_the_last_answers_compared_with_theirs(board) -> None:
    clock = Clock()
    gate, encoder = _gate(board, clock), EncoderSlot(board, clock)
    _teach(encoder, clock)
    _queue(gate, [[240]] * 20)
    taken = Taken(((8,),), 0, (None,), ((NOW_US - 300_000, 100_000), (NOW_US - 100_000, 100_000)))
    assert taken.ratios(NOW_US) == [3.0, 1.0]
    encoder.observe(taken.ratios(NOW_US))  # twice as slow as estimated: 1 + 0.25 x (2 - 1)
    assert gate.board.read().bias == pytest.approx(1.25)
    gate.begin()
    gate.admit([8], NOW_US + 10_000_000)
    plain = gate.estimate_us
    gate.begin()
    assert gate.admit([8], NOW_US + int(plain * 2 * 1.25) + 5_000) is None
    gate.begin()
    assert gate.admit([8], NOW_US + int(plain * 2 * 1.25) - 5_000) is not None
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
    taken = Taken(((240,) * 20,), 9, (None, NOW_US + 500_000, NOW_US + 100_000))
    late = late_refusals(taken, MODEL, now_us=lambda: NOW_US)  # about 200 ms of work
    assert late[0] is None and late[1] is None
    assert late[2] is not None and "before this execution could end" in late[2].message
    assert late_refusals(taken, Cost()) == [None, None, None]  # never ran: no estimate


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


def test_bulk_parts_leave_an_instance_free_while_queries_come(board) -> None:
    from embed_runtime.ops.backlog_board import INTERACTIVE_NS, BulkSlots

    clock = Clock()
    admission = Admission(board, clock)
    chunks_a, chunks_b = BulkSlots(board, 2, clock), BulkSlots(board, 2, clock)
    # a quiet spell: documents take both instances
    first, second = chunks_a.try_take(), chunks_b.try_take()
    assert {first, second} == {0, 1} and chunks_a.try_take() is None
    chunks_a.give(first)
    chunks_b.give(second)
    admission.mark_interactive()  # a query was admitted
    taken = chunks_a.try_take()
    assert taken == 0 and chunks_a.try_take() is None and chunks_b.try_take() is None
    chunks_a.give(taken)
    assert chunks_b.try_take() == 0  # freed for another process
    clock.ns += INTERACTIVE_NS
    assert chunks_a.try_take() == 1  # quiet again: the second instance too


def test_only_requests_that_are_not_bulk_parts_mark_interactive_traffic(board) -> None:
    from embed_runtime.ops.backlog_board import BulkSlots

    clock = Clock()
    gate = _gate(board, clock)
    slots = BulkSlots(board, 2, clock)
    gate.interactive = False  # the chunks step's own gate: documents
    gate.begin()
    assert gate.admit([128] * 40) is None
    assert gate.admit([8], granted=True) is None
    assert slots.limit() == 2
    gate.interactive = True
    gate.admit([8])
    assert slots.limit() == 1


def test_a_documents_part_holds_one_instance_not_half_of_two() -> None:
    """Two instances, one running a query (5 ms left), one free; a 64-row part of 3 s
    queued: the next query starts when the first instance is free again, not after half
    the part (before: 1.6 s estimated, refused with a 2 s deadline)."""
    from embed_runtime.ops.backlog_board import Backlog

    backlog = Backlog(64, 3000 * MS, MODEL, encoders=2, running=1, busy_ns=(5 * MS,))
    assert backlog.ahead_ns() == pytest.approx(5 * MS + MODEL.run_ns)
    queries = Backlog(100, 500 * MS, MODEL, encoders=2)  # 100 queued queries: two executions
    assert queries.ahead_ns() == pytest.approx(250 * MS + MODEL.run_ns)
    both = Backlog(0, 0.0, MODEL, encoders=2, running=2, busy_ns=(9 * MS, 4 * MS))
    assert both.ahead_ns() == 4 * MS
