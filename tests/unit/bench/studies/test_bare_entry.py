"""The bare-entry study compares what it says: a bare entry, the hand-tuned one, the generic one."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.studies.bare_entry import TUNED, ratios, run_order, variants
from generator.manifest import ModelEntry, parse_manifest


def _served(entry: dict) -> ModelEntry:
    return parse_manifest({"models": [entry]}, Path("/b")).models[0]


def test_the_bare_entry_names_no_knob_and_the_tuned_one_writes_them_out() -> None:
    bare, tuned, plain, control = (_served(e) for e in variants().values())
    assert list(variants()) == ["bare", "tuned", "plain", "control"]
    assert set(variants()["bare"]) == {"name", "family", "source"}
    # Served alike: the profile is the tuned settings; the study checks it stays so.
    assert bare == tuned == control
    for key, value in TUNED.items():
        assert getattr(tuned, key) == value
    # The generic entry is what a bare one was before the profile.
    assert (plain.fused_tokenize, plain.encoder_instances, plain.max_queue_delay_us) == (
        False,
        1,
        2000,
    )
    assert (plain.max_rows_per_run, plain.max_padding_share, plain.max_queue_size) == (32, 1.0, 0)


def test_ratios_are_taken_inside_each_repeat_and_their_median_kept() -> None:
    per_repeat = ((90.0, 100.0, 10.0, 110.0), (200.0, 100.0, 10.0, 90.0), (99.0, 100.0, 1.0, 95.0))
    rows = [
        {
            "repeat": r,
            "load": "1 x 1",
            "variant": v,
            "items_per_s": rate,
            "p50_ms": 1.0,
            "errors": 0,
        }
        for r, rates in enumerate(per_repeat)
        for v, rate in enumerate(rates)
    ]
    figures = ratios(rows, ["1 x 1"], ["bare", "tuned", "plain", "control"])["1 x 1"]
    assert figures["bare_over_tuned_runs"] == [0.9, 2.0, 0.99]
    assert figures["bare_over_tuned"] == 0.99
    # Pooled: the mean rate over the repeats over tuned's mean rate, (90 + 200 + 99) / 300.
    assert figures["bare_over_tuned_pooled"] == pytest.approx(389 / 300)
    assert figures["control_over_tuned_runs"] == [1.1, 0.9, 0.95]
    assert figures["control_over_tuned_pooled"] == pytest.approx(295 / 300)
    assert "tuned_over_tuned" not in figures
    assert figures["tuned"]["items_per_s"] == 100.0


def test_no_server_always_runs_right_after_the_same_other_one() -> None:
    """A plain rotation of three put server 0 (bare) right after server 2 (plain) in every
    repeat, across loads too; the order must vary who precedes whom."""
    sequence = [i for repeat in range(4) for _load in range(2) for i in run_order(3, repeat)]
    before_zero = {sequence[k - 1] for k in range(1, len(sequence)) if sequence[k] == 0}
    assert before_zero == {1, 2}
    for repeat in range(6):
        assert sorted(run_order(3, repeat)) == [0, 1, 2]


def test_repository_differences_name_changed_missing_and_extra_files(tmp_path: Path) -> None:
    from bench.studies.bare_entry import repository_differences

    a, b = tmp_path / "a", tmp_path / "b"
    for root in (a, b):
        (root / "m" / "1" / "__pycache__").mkdir(parents=True)
        (root / "m" / "config.pbtxt").write_text("same")
    (a / "m" / "1" / "__pycache__" / "model.pyc").write_bytes(b"\x01")
    (b / "m" / "1" / "__pycache__" / "model.pyc").write_bytes(b"\x02")
    (a / ".generator-state.json").write_text('{"fingerprint": "1"}')
    (b / ".generator-state.json").write_text('{"fingerprint": "2"}')
    # Bytecode caches and the build's own bookkeeping are not what is served.
    assert repository_differences(a, b) == []
    (b / "m" / "config.pbtxt").write_text("other")
    (a / "m" / "1" / "only-here").write_text("x")
    (b / "extra").write_text("y")
    assert repository_differences(a, b) == ["extra", "m/1/only-here", "m/config.pbtxt"]
