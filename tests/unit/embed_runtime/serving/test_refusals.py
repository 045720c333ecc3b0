"""Overload refusals are counted where an operator looks: a Triton metric and a log line
at most every 10 s, with the total when the step unloads."""

from __future__ import annotations

from pathlib import Path

import pytest

from embed_runtime.ops.backlog_board import Admission, EncoderSlot
from embed_runtime.ops.cost_model import features
from embed_runtime.serving.admission import AdmissionGate
from embed_runtime.serving.refusals import REFUSAL_LOG_EVERY_S, REFUSED_METRIC, Refusals
from tests.unit import fake_pb_utils as pb
from tests.unit.embed_runtime.ops.test_backlog_board import MS, Clock


@pytest.fixture(autouse=True)
def _clean() -> None:
    pb.Logger.clear()
    pb.MetricFamily.families.clear()


def _warnings() -> list[str]:
    return [m for level, m in pb.Logger.messages if level == "warn"]


def test_the_metric_counts_every_refusal_and_the_log_at_most_one_line_per_period() -> None:
    now = [100.0]
    refusals = Refusals.for_step(pb, "m_tokenize", "m_encode")
    refusals._clock = lambda: now[0]
    (family,) = pb.MetricFamily.families
    assert family.name == REFUSED_METRIC and family.kind == pb.MetricFamily.COUNTER
    (metric,) = family.metrics
    assert metric.labels == {"model": "m_tokenize", "waits_for": "m_encode"}

    refusals.count("server overloaded: 3 request(s)")  # the first: logged at once
    assert metric.value == 1
    (first,) = _warnings()
    assert first.startswith("m_tokenize: refused 1 request(s), 1 since it loaded")
    assert "server overloaded: 3 request(s)" in first
    for _ in range(5):  # within the period: counted, not logged
        now[0] += 1.0
        refusals.count("server overloaded")
    assert metric.value == 6 and len(_warnings()) == 1
    now[0] = 100.0 + REFUSAL_LOG_EVERY_S
    refusals.count("server overloaded: 9 request(s)")
    assert metric.value == 7
    assert _warnings()[-1].startswith(
        "m_tokenize: refused 6 request(s) in the last 10 s, 7 since it loaded"
    )
    refusals.close()
    assert _warnings()[-1] == (
        "m_tokenize: refused 7 request(s) in total while loaded, waiting for m_encode"
    )


def test_a_step_that_refused_nothing_logs_nothing_on_unload() -> None:
    refusals = Refusals.for_step(pb, "m_tokenize", "m_encode")
    refusals.close()
    assert _warnings() == []
    assert pb.MetricFamily.families[0].metrics[0].value == 0


def test_without_triton_metrics_the_log_still_counts(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise RuntimeError("metrics are disabled")

    monkeypatch.setattr(pb.MetricFamily, "__init__", refuse)
    refusals = Refusals.for_step(pb, "m_tokenize", "m_encode")
    assert "no embed_requests_refused_total metric (metrics are disabled)" in _warnings()[0]
    refusals.count("server overloaded")
    assert refusals.total == 1
    assert "refused 1 request(s)" in _warnings()[-1]


def test_the_gate_counts_its_refusals_only(tmp_path: Path) -> None:
    clock = Clock()
    board = str(tmp_path / "board")
    encoder = EncoderSlot(board, clock)
    for n in (1, 2, 4, 8):  # 20 ms a row, nothing else
        with encoder.executing(features([[0]] * n)):
            clock.ns += 20 * n * MS
    refusals = Refusals.for_step(pb, "m_tokenize", "m_encode")
    gate = AdmissionGate(Admission(board, clock), "m_encode", 60_000, 0, refusals)
    gate.board.issue([1], [20 * MS])  # one waits: 20 ms of the 60 ms bound ahead
    with encoder.executing(features([[0]])):  # running: not idle, its 20 ms still ahead
        clock.ns += 10 * MS
        gate.begin()
        answers = [gate.admit([0]) for _ in range(5)]
    assert [a is None for a in answers] == [True, True, False, False, False]
    assert refusals.total == 3
    assert pb.MetricFamily.families[0].metrics[0].value == 3
    gate.close()
    assert "refused 3 request(s) in total" in _warnings()[-1]
    encoder.close()


def test_a_failing_metric_never_fails_the_refusal(monkeypatch) -> None:
    def broken(self, value: float) -> None:
        raise RuntimeError("the family has been deleted")

    monkeypatch.setattr(pb.Metric, "increment", broken)
    refusals = Refusals.for_step(pb, "m_tokenize", "m_encode")
    refusals.count("server overloaded")
    refusals.count("server overloaded")
    assert refusals.total == 2
    assert any("no embed_requests_refused_total metric (the family" in m for m in _warnings())
