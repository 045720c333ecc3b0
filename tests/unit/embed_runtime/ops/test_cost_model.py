"""The cost model an encoder instance learns from its executions (no server, no clock)."""

from __future__ import annotations

import numpy as np
import pytest

from embed_runtime.ops.cost_model import Cost, CostFit, features

MS = 1_000_000
# 1 ms an execution, 0.2 ms a request, 0.1 ms a row, 40 us a token, a little attention
TRUE = Cost(1 * MS, 0.2 * MS, 0.1 * MS, 40_000 * 128, 0.3 * MS)


def _fit(shapes, cost: Cost = TRUE, noise: float = 0.0, seed: int = 0) -> CostFit:
    rng = np.random.default_rng(seed)
    fit = CostFit()
    for lengths in shapes:
        x = features(lengths)
        fit.add(x, cost.of(x) * (1 + noise * rng.standard_normal()))
    return fit


def test_varied_executions_give_back_the_cost_of_each_shape() -> None:
    rng = np.random.default_rng(1)
    shapes = [
        [list(rng.integers(4, 257, size=rng.integers(1, 65))) for _ in range(rng.integers(1, 5))]
        for _ in range(200)
    ]
    cost = _fit(shapes, noise=0.05).cost()
    for lengths in ([240] * 16, [128] * 64, [8, 240, 30] * 8):
        assert cost.alone_ns(lengths) == pytest.approx(TRUE.alone_ns(lengths), rel=0.1)
    # a lone short query's few ms are a share of the batches' noise: within 0.5-2
    for lengths in ([8], [240], [30, 60]):
        assert 0.5 < cost.alone_ns(lengths) / TRUE.alone_ns(lengths) < 2, lengths
    assert cost.work_ns([240]) > 4 * cost.work_ns([8])


def test_short_queries_alone_do_not_price_a_long_row_from_noise() -> None:
    """Health probes and one-sentence queries barely show the token term: a 256-token row
    is priced near a short one (the bias then corrects), not at seconds."""
    shapes = [[[int(n)]] for n in np.random.default_rng(2).integers(3, 12, size=40)]
    cost = _fit(shapes, noise=0.2).cost()
    short = TRUE.alone_ns([8])
    assert cost.alone_ns([8]) == pytest.approx(short, rel=0.3)
    assert cost.alone_ns([256]) < 3 * TRUE.alone_ns([256])


def test_a_fixed_shape_step_learns_its_cost_per_row() -> None:
    images = Cost(5 * MS, 0.0, 20 * MS)
    cost = _fit([[[0] * n] for n in (1, 4, 2, 8, 3, 16)] * 5, images).cost()
    assert cost.alone_ns([0] * 10) == pytest.approx(images.alone_ns([0] * 10), rel=0.05)
    assert cost.token_ns == 0 and cost.attention_ns == 0


def test_coefficients_are_never_negative_and_nothing_is_known_before_a_run() -> None:
    assert not CostFit().cost().known and Cost().alone_ns([5]) == 0
    falling = Cost(10 * MS, 0.0, 1 * MS)
    fit = _fit([[[8] * n] for n in (1, 2, 4, 8, 16, 32)] * 3, falling)
    fit.add(features([[256] * 2]), 1 * MS)  # a long run that took almost nothing
    assert all(v >= 0 for v in fit.cost().as_tuple())


def test_the_mean_of_instances_ignores_those_that_never_ran() -> None:
    a, b = Cost(2.0, 0, 4.0), Cost(4.0, 0, 8.0)
    assert Cost.mean([a, Cost(), b]) == Cost(3.0, 0.0, 6.0, 0.0, 0.0)
    assert Cost.mean([Cost()]) == Cost()
