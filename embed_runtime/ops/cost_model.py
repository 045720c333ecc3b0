"""What a row of tokens costs an encoder instance, learned from its own runs.

An encoder runs rows sorted by length in chunks padded to their own longest row
(:mod:`embed_runtime.engines.ragged`), so an execution of ``requests`` requests whose rows
have ``w_i`` tokens costs about

    run + requests * request + sum_i (row + token * w_i + attention * w_i**2)

nanoseconds: a fixed cost per execution (Triton's call, merging, the responses), one per
request read and answered, one per row, the linear layers per token and self-attention's
quadratic term. :class:`CostFit` fits the five coefficients to the instance's own
executions by least squares, newer ones weighing more, so the figures are this model's on
this device with the threads it runs with, padding and every overhead of the step
included; a fixed-shape step (pixels, CLIP's fixed context) reports no tokens and learns
the first three alone.
:class:`Cost` prices a request's rows by their token counts: a 240-token row and an
8-token query are told apart, which a cost per row averaged over the last executions
could not do (an idle server refused one-sentence queries after a batch of documents).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

# Widths are fitted in units of this many tokens, which keeps the normal equations
# well-conditioned (a 64-row run of 256 tokens has rows * w**2 = 256, not 4 million).
WIDTH_UNIT = 128.0
FEATURES = 5
TOKEN_FEATURES = 3  # the index of the first token term (sum of w, then of w**2)
# Weight kept by the older executions at each new one: the fit follows the last ~100.
FORGET = 0.99
# Ridge term on the token terms, relative to the executions' own weight: their
# coefficients are pulled to 0 as if each execution also showed 0.01 unit of each at no
# cost. A token feature the executions have barely shown (only short queries, a few tokens
# each) is not extrapolated from noise (seen: 4.8 s a row priced after a few health
# probes), while one they have shown (a 64-row batch of 240 tokens is 120 units) is
# fitted as measured.
RIDGE = 1e-4


@dataclass(frozen=True)
class Cost:
    """An instance's costs (ns): per execution, request, row, row-token unit, attention."""

    run_ns: float = 0.0
    request_ns: float = 0.0
    row_ns: float = 0.0
    token_ns: float = 0.0
    attention_ns: float = 0.0

    @property
    def known(self) -> bool:
        """Whether anything has been learned (before the first execution, nothing is)."""
        return any(v > 0 for v in self.as_tuple())

    def rows_ns(self, lengths: Iterable[int]) -> float:
        """The time of rows with these token counts, run together, less the per-call cost."""
        widths = np.asarray(list(lengths), dtype=np.float64) / WIDTH_UNIT
        if widths.size == 0:
            return 0.0
        per_row = self.row_ns + self.token_ns * widths + self.attention_ns * widths**2
        return float(per_row.sum())

    def work_ns(self, lengths: Iterable[int]) -> float:
        """What one request with rows of these token counts adds to an execution."""
        return self.request_ns + self.rows_ns(lengths)

    def alone_ns(self, lengths: Iterable[int]) -> float:
        """The time of an execution of this one request."""
        return self.run_ns + self.work_ns(lengths)

    def of(self, x: np.ndarray) -> float:
        """The time of an execution of :func:`features` ``x``."""
        return float(np.dot(self.as_tuple(), x))

    def as_tuple(self) -> tuple[float, ...]:
        """The coefficients in board order."""
        return self.run_ns, self.request_ns, self.row_ns, self.token_ns, self.attention_ns

    @staticmethod
    def mean(costs: Iterable[Cost]) -> Cost:
        """The mean of the known costs (instances of one model), ``Cost()`` when none is."""
        known = [c.as_tuple() for c in costs if c.known]
        if not known:
            return Cost()
        return Cost(*(float(v) for v in np.mean(np.asarray(known), axis=0)))


def features(lengths: Iterable[Iterable[int]]) -> np.ndarray:
    """The regressors of one execution, from each request's rows' token counts.

    1, requests, rows, the sum of ``w`` and of ``w**2`` (``w`` in :data:`WIDTH_UNIT`s);
    a fixed-shape step gives its rows 0 tokens.
    """
    x = np.zeros(FEATURES)
    x[0] = 1.0
    for request in lengths:
        widths = np.asarray(list(request), dtype=np.float64) / WIDTH_UNIT
        x[1] += 1
        x[2] += widths.size
        x[3] += widths.sum()
        x[4] += (widths**2).sum()
    return x


class CostFit:
    """Least squares of execution time on its shape, older executions forgotten.

    Each execution weighs by the inverse square of its own time, so the fit keeps the
    *relative* error small for a 5 ms query and a 4 s batch alike (unweighted, the batches'
    noise set every price and a one-sentence query was priced at 70 ms). Coefficients are
    kept non-negative (Lawson and Hanson's active set), so a price never falls below what
    fewer tokens would cost.
    """

    def __init__(self, forget: float = FORGET):
        self.forget = forget
        self._xtx = np.zeros((FEATURES, FEATURES))
        self._xty = np.zeros(FEATURES)
        self.runs = 0

    def add(self, x: np.ndarray, ns: float) -> None:
        """Fold one execution of :func:`features` ``x``, which took ``ns``, in."""
        if x[2] <= 0 or ns <= 0:
            return
        scaled = x / ns
        self._xtx = self.forget * self._xtx + np.outer(scaled, scaled)
        self._xty = self.forget * self._xty + scaled
        self.runs += 1

    def cost(self) -> Cost:
        """The current fit (``Cost()`` before any execution)."""
        if self.runs == 0:
            return Cost()
        scale = self._xtx[0, 0]
        ridge = [RIDGE * scale if i >= TOKEN_FEATURES else 1e-9 * scale for i in range(FEATURES)]
        beta = nonnegative_solve(self._xtx + np.diag(ridge), self._xty)
        return Cost(*(float(v) for v in beta))


def nonnegative_solve(gram: np.ndarray, target: np.ndarray) -> np.ndarray:
    """``argmin b'Gb/2 - t'b`` over ``b >= 0`` (normal equations of NNLS; G positive definite)."""
    n = len(target)
    beta, passive = np.zeros(n), np.zeros(n, dtype=bool)
    for _ in range(3 * n):
        gradient = target - gram @ beta
        gradient[passive] = -np.inf
        j = int(np.argmax(gradient))
        if gradient[j] <= 1e-12 * max(1.0, float(np.abs(target).max())):
            break
        passive[j] = True
        for _ in range(3 * n):
            trial = np.zeros(n)
            idx = np.flatnonzero(passive)
            trial[idx] = np.linalg.solve(gram[np.ix_(idx, idx)], target[idx])
            if (trial[idx] > 0).all():
                beta = trial
                break
            shrinking = idx[trial[idx] <= 0]
            alpha = min(beta[i] / (beta[i] - trial[i]) for i in shrinking)
            beta = beta + alpha * (trial - beta)
            passive &= beta > 0
            beta[~passive] = 0.0
    return beta
