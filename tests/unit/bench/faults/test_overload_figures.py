"""bench.faults.overload's figures: how shots are counted, goodput, the issue's goal, the table."""

from __future__ import annotations

import numpy as np
import pytest

from bench.faults.overload_figures import (
    Shot,
    classify,
    cpu_share,
    judge,
    outcome,
    status_key,
    table,
)

REF = np.eye(4, dtype=np.float32)
REFUSED = "StatusCode.UNAVAILABLE: Exceeds maximum queue size"
GONE = "StatusCode.UNAVAILABLE: deadline passed 12.5 ms before this step ran"
LATE = "StatusCode.DEADLINE_EXCEEDED: Deadline Exceeded"


class Clock:
    """A clock the test moves by hand (seconds)."""

    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def fire(clock: Clock, item: int, at: float, after: float, status: str = "", vector=None) -> Shot:
    """A shot planned and sent at ``at``, answered ``after`` s later on ``clock``."""
    clock.now = at
    shot = Shot(item, planned=at, sent=clock())
    clock.now = at + after
    shot.answer(REF[[item]] if vector is None and not status else vector, status, clock())
    return shot


def expected(item: int) -> np.ndarray:
    return REF[[item]]


def test_each_shot_ends_one_way():
    clock = Clock()
    assert classify(fire(clock, 0, 1.0, 0.01), 5.0) == "accepted"
    assert classify(fire(clock, 0, 1.0, 0.002, REFUSED), 5.0) == "refused"
    assert classify(fire(clock, 0, 1.0, 4.0, GONE), 5.0) == "refused"
    assert classify(fire(clock, 0, 1.0, 5.0, LATE), 5.0) == "past_deadline"
    # An answer that came after the client's deadline is late, not accepted.
    assert classify(fire(clock, 0, 1.0, 5.2), 5.0) == "past_deadline"
    # So is a refusal that came after it (a step that found the deadline passed, too late).
    assert classify(fire(clock, 0, 1.0, 5.01, GONE), 5.0) == "past_deadline"
    assert classify(fire(clock, 0, 1.0, 0.1, "StatusCode.INTERNAL: boom"), 5.0) == "other_error"
    assert classify(Shot(0, planned=1.0, sent=1.0), 5.0) == "no_answer"


def test_goodput_counts_right_answers_within_the_deadline_per_second():
    clock = Clock()
    # Ten answers a second for 2 s (20 good), 0.1 s each, then a late answer, a refusal,
    # a wrong vector and one that never came.
    shots = [fire(clock, i % 4, 10.0 + i / 10, 0.1) for i in range(20)]
    shots.append(fire(clock, 1, 12.0, 6.0))
    shots.append(fire(clock, 1, 12.0, 0.003, REFUSED))
    shots.append(fire(clock, 2, 12.0, 0.1, vector=REF[[3]]))
    shots.append(Shot(3, planned=12.0, sent=12.0))
    run = outcome(shots, expected, deadline_s=5.0, target_rate=12.0, sent_s=2.0)
    assert (run["sent"], run["accepted"], run["good"]) == (24, 21, 20)
    assert (run["refused"], run["past_deadline"], run["no_answer"], run["wrong"]) == (1, 1, 1, 1)
    # From the first planned arrival (10.0) to the last good answer (11.9 + 0.1).
    assert run["goodput"] == pytest.approx(20 / 2.0)
    assert run["accepted_ms"]["p50"] == pytest.approx(100.0)
    assert run["refused_ms"]["p99"] == pytest.approx(3.0)
    assert run["send_rate"] == 12.0
    assert run["max_abs_diff"] == pytest.approx(1.0)


def test_a_wrong_shape_is_a_wrong_vector_and_statuses_count_alike_messages_together():
    clock = Clock()
    shots = [
        fire(clock, 0, 1.0, 0.1, vector=np.zeros((2, 4), np.float32)),
        fire(clock, 0, 1.0, 0.4, GONE),
        fire(clock, 0, 1.0, 0.6, GONE.replace("12.5", "40.1")),
    ]
    run = outcome(shots, expected, 5.0, 3.0, 1.0)
    assert run["wrong"] == 1 and run["good"] == 0 and run["goodput"] == 0.0
    assert run["statuses"][status_key(GONE)] == 2
    assert status_key(GONE) == "StatusCode.UNAVAILABLE: deadline passed # ms before this step ran"
    assert status_key("in ensemble 'all-MiniLM-L6-v2', 3 rows") == (
        "in ensemble 'all-MiniLM-L6-v2', # rows"
    )


def judged(
    goodput: float = 95.0,
    p99: float = 100.0,
    refusal_p99: float | None = 5.0,
    past: int = 0,
    wrong: int = 0,
) -> dict:
    run = {
        "goodput": goodput,
        "accepted_ms": {"p50": 20.0, "p99": p99},
        "refused_ms": {} if refusal_p99 is None else {"p99": refusal_p99},
        "past_deadline": past,
        "no_answer": 0,
        "wrong": wrong,
        "other_errors": 0,
    }
    judge(run, sustainable=100.0, reference_ms={"p50": 10.0, "p99": 50.0})
    return run


def test_the_goal_is_met_at_0_9_goodput_2x_p99_and_50_ms_refusals():
    run = judged()
    assert (run["goodput_ratio"], run["accepted_p50_ratio"], run["accepted_p99_ratio"]) == (
        0.95,
        2.0,
        2.0,
    )
    assert run["goal"]["met"]
    assert judged(refusal_p99=None)["goal"]["met"]


@pytest.mark.parametrize(
    ("kwargs", "missed"),
    [
        ({"goodput": 89.0}, "goodput"),
        ({"p99": 101.0}, "accepted_p99"),
        ({"refusal_p99": 51.0}, "refusal_p99"),
        ({"past": 1}, "deadline"),
        ({"wrong": 1}, "vectors"),
    ],
)
def test_each_part_of_the_goal_fails_alone(kwargs, missed):
    goal = judged(**kwargs)["goal"]
    assert not goal["met"]
    assert [k for k, ok in goal.items() if not ok] == [missed, "met"]


def test_no_accepted_answer_misses_the_latency_goal():
    run = judged()
    run["accepted_ms"] = {}
    judge(run, 100.0, {"p50": 10.0, "p99": 50.0})
    assert run["accepted_p99_ratio"] is None and not run["goal"]["accepted_p99"]


def test_the_table_has_one_row_per_record_and_names_what_was_missed():
    met = {
        **judged(),
        "config": "default",
        "load": "text1",
        "factor": 1.0,
        "target_rate": 100.0,
        "refused": 0,
        "load_generator_cpu_share": 0.31,
    }
    missed = {
        **judged(goodput=50.0, past=2),
        "config": "queue-4",
        "load": "images",
        "factor": 3.0,
        "target_rate": 30.0,
        "refused": 40,
        "load_generator_cpu_share": 0.1,
    }
    lines = table([met, missed]).splitlines()
    assert lines[0].split()[:3] == ["config", "load", "x"]
    assert lines[1].split()[:5] == ["default", "text1", "1", "100.0", "0.95"]
    assert lines[1].split()[-2:] == ["31%", "met"]
    assert lines[2].endswith("missed goodput,deadline")
    assert cpu_share(3.0, 10.0, 2) == 0.15 and cpu_share(1.0, 0.0, 2) == 0.0


def test_the_latency_reference_is_an_open_loop_at_0_8x_and_the_unloaded_one_optional(
    monkeypatch,
):
    from bench.faults import overload

    calls = []

    def fake_open_loop(url, load, rate, seconds, deadline_s, senders, seed, send_deadline):
        calls.append((rate, seconds, senders, send_deadline))
        clock = Clock()
        return [fire(clock, 0, 1.0 + i / rate, 0.02) for i in range(int(rate * seconds))], seconds

    monkeypatch.setattr(overload, "open_loop", fake_open_loop)
    args = overload.parse_args(["--pin", "none", "--reference-s", "2", "--unloaded-s", "0"])
    ref, unloaded = overload.latency_reference(args, "url", None, expected, 100.0)
    assert calls == [(80.0, 2.0, 2, True)] and unloaded == {}
    assert ref["target_rate"] == 80.0 and ref["accepted_ms"]["p99"] == pytest.approx(20.0)
    args.unloaded_s = 3.0
    overload.latency_reference(args, "url", None, expected, 100.0)
    assert calls[-1] == (10.0, 3.0, 1, True)
