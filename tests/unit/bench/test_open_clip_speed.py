"""The tower-kind speed benchmark names its models, tabulates and applies its gate."""

from __future__ import annotations

import pytest

from bench.open_clip_speed import KINDS, served_name, table, under_gate


def _load(served: float, library: float, gap: float = 1e-7) -> dict:
    return {
        "items": 32,
        "rates": {"served": [served], "library": [library]},
        "ratio": served / library,
        "max_abs_diff": gap,
    }


def test_every_kind_has_its_own_valid_model_name():
    names = [served_name(kind) for kind in KINDS]
    assert len(set(names)) == len(KINDS)
    assert all(name.isidentifier() for name in names)
    assert served_name("tiny-pe-core") == "pe_core"


def test_table_has_one_row_per_kind_with_both_ratios_and_gaps():
    results = {"tiny-eva": {"images": _load(80, 10), "texts": _load(500, 250, 3e-7)}}
    header, _, row = table(results)
    assert header.count("ratio") == 2
    assert row == "| tiny-eva | 80.0 | 10.0 | 8.00 x | 500.0 | 250.0 | 2.00 x | 1.0e-07 / 3.0e-07 |"


@pytest.mark.parametrize(("served", "slow"), [(90.0, []), (89.0, ["tiny-coca texts 0.89x"])])
def test_gate_is_nine_tenths_of_open_clips_rate(served, slow):
    results = {"tiny-coca": {"images": _load(50, 10), "texts": _load(served, 100)}}
    assert under_gate(results) == slow
