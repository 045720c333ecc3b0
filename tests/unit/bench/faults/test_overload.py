"""bench.faults.overload: options, loads, arrivals, how shots are counted, the goal, the table."""

from __future__ import annotations

import numpy as np
import pytest

from bench.faults import overload, overload_loop
from bench.faults.overload import config_name, cpu_split, parse_args, parse_loads, parse_rates
from bench.faults.overload_loop import (
    TEXT_ROWS,
    Shot,
    classify,
    cpu_share,
    deadline_parameters,
    expected_rows,
    judge,
    make_loads,
    outcome,
    plan,
    status_key,
    table,
)
from bench.manifest import TEXT_MODEL
from embed_runtime.serving.admission import DEADLINE_PARAMETER

REF = np.eye(4, dtype=np.float32)
REFUSED = "StatusCode.UNAVAILABLE: Exceeds maximum queue size"
GONE = "StatusCode.UNAVAILABLE: deadline passed 12.5 ms before this step ran"
LATE = "StatusCode.DEADLINE_EXCEEDED: Deadline Exceeded"


def fire(item: int, at: float, after: float, status: str = "", vector=None) -> Shot:
    """A shot planned and sent at ``at``, answered ``after`` s later."""
    answer = REF[[item]] if vector is None and not status else vector
    return Shot(item, planned=at, sent=at, done=at + after, status=status, vector=answer)


def expected(item: int) -> np.ndarray:
    return REF[[item]]


def test_each_shot_ends_one_way():
    assert classify(fire(0, 1.0, 0.01), 5.0) == "accepted"
    assert classify(fire(0, 1.0, 0.002, REFUSED), 5.0) == "refused"
    assert classify(fire(0, 1.0, 4.0, GONE), 5.0) == "refused"
    assert classify(fire(0, 1.0, 5.0, LATE), 5.0) == "past_deadline"
    # An answer that came after the client's deadline is late, not accepted.
    assert classify(fire(0, 1.0, 5.2), 5.0) == "past_deadline"
    # So is a refusal that came after it (a step that found the deadline passed, too late).
    assert classify(fire(0, 1.0, 5.01, GONE), 5.0) == "past_deadline"
    assert classify(fire(0, 1.0, 0.1, "StatusCode.INTERNAL: boom"), 5.0) == "other_error"
    assert classify(Shot(0, planned=1.0, sent=1.0), 5.0) == "no_answer"


def test_goodput_counts_right_answers_within_the_deadline_per_second():
    # Ten answers a second for 2 s (20 good), 0.1 s each, then a late answer, a refusal,
    # a wrong vector and one that never came.
    shots = [fire(i % 4, 10.0 + i / 10, 0.1) for i in range(20)]
    shots.append(fire(1, 12.0, 6.0))
    shots.append(fire(1, 12.0, 0.003, REFUSED))
    shots.append(fire(2, 12.0, 0.1, vector=REF[[3]]))
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
    shots = [
        fire(0, 1.0, 0.1, vector=np.zeros((2, 4), np.float32)),
        fire(0, 1.0, 0.4, GONE),
        fire(0, 1.0, 0.6, GONE.replace("12.5", "40.1")),
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
    calls = []

    def fake_open_loop(url, load, rate, seconds, deadline_s, senders, seed, send_deadline):
        calls.append((rate, seconds, senders, send_deadline))
        return [fire(0, 1.0 + i / rate, 0.02) for i in range(int(rate * seconds))], seconds

    monkeypatch.setattr(overload_loop, "open_loop", fake_open_loop)
    args = overload.parse_args(["--pin", "none", "--reference-s", "2", "--unloaded-s", "0"])
    ref, unloaded = overload.latency_reference(args, "url", None, expected, 100.0)
    assert calls == [(80.0, 2.0, 2, True)] and unloaded == {}
    assert ref["target_rate"] == 80.0 and ref["accepted_ms"]["p99"] == pytest.approx(20.0)
    args.unloaded_s = 3.0
    overload.latency_reference(args, "url", None, expected, 100.0)
    assert calls[-1] == (10.0, 3.0, 1, True)


def test_auto_keeps_the_generator_on_the_last_quarter_of_the_cores():
    assert cpu_split("auto", list(range(8))) == {"server": list(range(6)), "load_generator": [6, 7]}
    assert cpu_split("auto", [4, 5, 6, 7]) == {"server": [4, 5, 6], "load_generator": [7]}
    # Under 4 cores the server keeps them all: on 2, pinned did worse than shared.
    assert cpu_split("auto", [0, 1]) is None
    assert cpu_split("auto", [3]) is None
    assert cpu_split("none", list(range(8))) is None
    assert cpu_split("0/1", [0, 1]) == {"server": [0], "load_generator": [1]}


def test_an_explicit_split_is_read_and_must_not_overlap():
    assert cpu_split("0-2,5/3", list(range(8))) == {"server": [0, 1, 2, 5], "load_generator": [3]}
    with pytest.raises(SystemExit, match="disjoint"):
        cpu_split("0-1/1", [0, 1])
    with pytest.raises(SystemExit, match="SERVER/CLIENT"):
        cpu_split("0-1", [0, 1])


def test_factors_and_queues_are_parsed():
    args = parse_args(["--factor", "2,3", "--queue", "4:10000", "--pin", "none"])
    assert args.factor == [2.0, 3.0]
    assert args.queue == [
        {"max_queue_size": 4, "queue_timeout_us": 10000, "admission_wait_us": 0,
         "admission_max_rows": 0}
    ]
    assert args.pin is None


def test_defaults_measure_every_load_at_1x_2x_3x_and_send_the_deadline():
    args = parse_args(["--pin", "none"])
    assert args.load == ["text1", "text32", "images"]
    assert args.factor == [1.0, 2.0, 3.0]
    assert args.send_deadline is True
    assert args.clip == "tiny"
    assert (args.seconds, args.reference_s, args.unloaded_s) == (30.0, 20.0, 10.0)
    assert args.rate == {}


def test_quick_shortens_every_run_and_drops_the_unloaded_one():
    args = parse_args(["--quick", "--pin", "none", "--no-send-deadline"])
    assert (args.seconds, args.reference_s, args.unloaded_s) == (4.0, 4.0, 0.0)
    assert args.send_deadline is False
    assert parse_args(["--quick", "--pin", "none", "--seconds", "6"]).seconds == 6.0


def test_loads_are_kept_in_their_own_order_and_unknown_ones_refused():
    assert parse_loads("images, text1") == ["text1", "images"]
    assert parse_args(["--load", "text32", "--pin", "none"]).load == ["text32"]
    with pytest.raises(SystemExit, match="subset"):
        parse_loads("text1,video")
    with pytest.raises(SystemExit, match="subset"):
        parse_loads(",")


def test_given_rates_are_read_per_load():
    assert parse_rates("text1=200,images=12.5") == {"text1": 200.0, "images": 12.5}
    assert parse_rates("") == {}
    with pytest.raises(SystemExit, match="LOAD=REQ_PER_S"):
        parse_rates("text1:200")
    with pytest.raises(SystemExit, match="LOAD=REQ_PER_S"):
        parse_rates("video=3")


def test_a_configuration_is_named_by_what_bounds_it():
    assert config_name({}) == "default"
    assert config_name({"max_queue_size": 0, "queue_timeout_us": 0}) == "unbounded"
    assert config_name({"max_queue_size": 8, "queue_timeout_us": 0}) == "queue-8"
    assert config_name({"max_queue_size": 8, "queue_timeout_us": 20000}) == (
        "queue-8-timeout-20000us"
    )


def test_text32_requests_cover_the_pool_and_point_at_each_sentences_reference_row():
    sentences = [f"sentence {i}" for i in range(64)]
    text1, text32, images = make_loads(
        ["text1", "text32", "images"], sentences, "clip-tiny", [b"jpeg0", b"jpeg1"]
    )
    assert (text1.model, text1.input_name, text1.source) == (TEXT_MODEL, "TEXT", "text")
    assert text1.requests[5] == [b"sentence 5"] and text1.rows[5] == [5]
    assert len(text32.requests) == 2 and all(len(r) == TEXT_ROWS for r in text32.requests)
    assert text32.requests[1][0] == b"sentence 32" and text32.rows[1][0] == 32
    assert sorted(i for rows in text32.rows for i in rows) == list(range(64))
    assert (images.model, images.input_name, images.base) == (
        "clip-tiny_image",
        "IMAGE",
        "clip-tiny",
    )
    assert images.requests == [[b"jpeg0"], [b"jpeg1"]] and images.rows == [[0], [1]]
    # Each source's rows, sent alone, give the references the rows above point at.
    assert text1.pool == text32.pool == [s.encode() for s in sentences]
    assert images.pool == [b"jpeg0", b"jpeg1"]
    reference = np.arange(64 * 3, dtype=np.float32).reshape(64, 3)
    assert np.array_equal(expected_rows(reference, text32.rows, 1), reference[32:64])
    assert expected_rows(reference, text1.rows, 7).shape == (1, 3)


def test_32_row_requests_measure_their_sustainable_rate_with_a_quarter_of_the_clients():
    text1, text32 = make_loads(["text1", "text32"], [f"s{i}" for i in range(64)], "clip-tiny")
    assert text1.closed_loop_clients([8, 16, 32]) == [8, 16, 32]
    assert text32.closed_loop_clients([8, 16, 32]) == [2, 4, 8]
    assert text32.closed_loop_clients([1, 2]) == [1]


def test_only_the_named_loads_are_built():
    loads = make_loads(["images"], ["a", "b"], "clip-vit-b-32", [b"x"])
    assert [load.name for load in loads] == ["images"]
    assert loads[0].model == "clip-vit-b-32_image"


def test_arrivals_are_poisson_at_the_rate_from_the_start():
    shots = plan(rate=200.0, seconds=5.0, requests=7, seed=1, start=50.0)
    planned = np.array([s.planned for s in shots])
    assert len(shots) == 1000 and planned[0] == 50.0
    assert np.all(np.diff(planned) >= 0)
    assert 4.0 < planned[-1] - 50.0 < 6.0
    assert {s.item for s in shots} == set(range(7))
    assert [s.planned for s in plan(200.0, 5.0, 7, 1, 50.0)] == planned.tolist()


def test_the_deadline_parameter_is_absolute_microseconds_on_the_wall_clock():
    assert deadline_parameters(5.0, wall=lambda: 1_700_000_000.25) == {
        DEADLINE_PARAMETER: 1_700_000_005_250_000
    }
    assert DEADLINE_PARAMETER == "deadline_unix_us"
