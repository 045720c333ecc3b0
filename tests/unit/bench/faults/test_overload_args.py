"""bench.faults.overload's options: loads, factors, rates, the cores split, names."""

from __future__ import annotations

import pytest

from bench.faults.overload_args import config_name, cpu_split, parse_args, parse_loads, parse_rates


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
