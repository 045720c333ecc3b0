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
# Ridge term on the token terms, per execution fitted: their coefficients are pulled to 0
# as if each execution also showed 0.1 unit of each at no cost. A token feature the
# executions have barely shown (only short queries, a few tokens each) is not extrapolated
# from noise (seen: 4.8 s a row priced after a few health probes), while one they have
# shown (a 64-row batch of 240 tokens is 120 units) is fitted as measured.
RIDGE = 0.01


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
    """Least squares of run time on run shape, older runs forgotten by :data:`FORGET`.

    Coefficients are kept non-negative (a feature whose fit goes negative is dropped and
    the rest refitted), so a price never falls below what fewer tokens would cost.
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
        self._xtx = self.forget * self._xtx + np.outer(x, x)
        self._xty = self.forget * self._xty + x * ns
        self.runs += 1

    def cost(self) -> Cost:
        """The current fit (``Cost()`` before any execution)."""
        if self.runs == 0:
            return Cost()
        active = [i for i in range(FEATURES) if self._xtx[i, i] > 0]
        while active:
            scale = max(self._xtx[0, 0], 1.0)
            ridge = [(RIDGE if i >= TOKEN_FEATURES else 1e-9) * scale for i in active]
            sub = self._xtx[np.ix_(active, active)] + np.diag(ridge)
            try:
                beta = np.linalg.solve(sub, self._xty[active])
            except np.linalg.LinAlgError:
                beta = np.linalg.lstsq(sub, self._xty[active], rcond=None)[0]
            if (beta >= 0).all():
                out = np.zeros(FEATURES)
                out[active] = beta
                return Cost(*(float(v) for v in out))
            active = [i for i, b in zip(active, beta, strict=True) if b > 0]
        return Cost()
