"""Opt-in step timing: one line per execution, phases that add up, nothing when off."""

from __future__ import annotations

from pathlib import Path

import pytest

from embed_runtime.ops.step_times import COLUMNS, ENV, StepTimes


class StepClock:
    """A clock that moves 1 ms at every reading."""

    def __init__(self):
        self.now = 0

    def __call__(self) -> int:
        self.now += 1_000_000
        return self.now


def step_lines(path: Path) -> list[dict[str, float]]:
    header, *rows = path.read_text().splitlines()
    assert header.split("\t") == list(COLUMNS)
    return [dict(zip(COLUMNS, map(float, row.split("\t")), strict=True)) for row in rows]


def test_phases_are_summed_then_written_once_per_execution(tmp_path: Path) -> None:
    times = StepTimes(str(tmp_path / "m.1.tsv"), clock=StepClock())
    read = times.timed("read", lambda x: x)
    embed = times.timed("embed", lambda xs: xs)
    read(1), read(2), embed([1, 2])  # each call: two readings, 1 ms apart
    times.rows = 3
    times.write(requests=2, ort_ns=400_000, total_ns=5_000_000)
    (line,) = step_lines(tmp_path / "m.1.tsv")
    assert line == {
        "requests": 2,
        "rows": 3,
        "read_us": 2000.0,
        "ort_us": 400.0,
        "embed_other_us": 600.0,
        "respond_us": 2000.0,
        "total_us": 5000.0,
    }
    assert times.phases == {} and times.rows == 0  # the next execution starts from zero


def test_a_failing_phase_is_still_timed(tmp_path: Path) -> None:
    times = StepTimes(str(tmp_path / "m.tsv"), clock=StepClock())

    def bad(_):
        raise ValueError("bad request")

    with pytest.raises(ValueError):
        times.timed("read", bad)(0)
    assert times.phases == {"read": 1_000_000}


def test_off_unless_the_environment_names_a_folder(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert StepTimes.from_env("m") is None
    monkeypatch.setenv(ENV, str(tmp_path / "times"))
    times = StepTimes.from_env("m")
    assert times is not None and Path(times.path).parent == tmp_path / "times"
    assert Path(times.path).read_text().startswith("requests\t")


def test_admission_estimates_are_recorded_only_when_asked(tmp_path, monkeypatch) -> None:
    from embed_runtime.ops.step_times import ESTIMATES_ENV, EstimateLog

    monkeypatch.delenv(ESTIMATES_ENV, raising=False)
    assert EstimateLog.from_env("m_encode") is None
    monkeypatch.setenv(ESTIMATES_ENV, str(tmp_path / "estimates"))
    log = EstimateLog.from_env("m_encode")
    log.write([(1, 9, 5000, 6100), (16, 2048, 90_000, 88_000)])
    log.write([])
    lines = open(log.path).read().splitlines()
    assert lines == ["rows\ttokens\testimate_us\tactual_us", "1\t9\t5000\t6100",
                     "16\t2048\t90000\t88000"]
