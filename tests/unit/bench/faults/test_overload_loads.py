"""bench.faults.overload's loads: the requests, their reference rows, arrivals, the deadline."""

from __future__ import annotations

import numpy as np

from bench.faults.overload_loads import (
    TEXT_ROWS,
    deadline_parameters,
    expected_rows,
    make_loads,
    plan,
)
from bench.manifest import TEXT_MODEL
from embed_runtime.serving.admission import DEADLINE_PARAMETER


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
