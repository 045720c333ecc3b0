"""Ragged batching: requests of different token lengths share one encoder execution.

Without ``allow_ragged_batch`` on the encoder's token inputs, Triton batches only
requests of identical shape, so requests of pairwise distinct lengths run one by one
(execution count == inference count). This test fails on such a repository.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.integration.conftest import TEXT_MODEL
from tests.integration.text_helpers import (
    assert_parity,
    concurrent_round,
    model_stats,
    wait_stats,
)

pytestmark = pytest.mark.integration

ENCODER = f"{TEXT_MODEL}_encode"
# Token counts with [CLS] and [SEP]: all different, so no two requests share a shape.
LENGTHS = (3, 8, 13, 19, 24, 30, 35, 40)
WORDS = "the cat sat on a red mat while my dog ran in green park and we had tea".split()
ROUNDS = 6


def text_of_tokens(n: int) -> str:
    """A text of exactly ``n`` tokens ([CLS] and [SEP] included) with these single-token words."""
    return " ".join(WORDS[i % len(WORDS)] for i in range(n - 2))


def shared_executions(server, texts: list[str], want: np.ndarray, rounds: int = ROUNDS) -> list:
    """Send ``texts`` concurrently, one per request, up to ``rounds`` times.

    Each round checks every answer against ``want`` and reads the encoder's statistics
    delta; it stops at the first round whose requests shared an execution. Returns the
    ``(inferences, executions)`` of each round.
    """
    seen = []
    for _ in range(rounds):
        before = model_stats(server, ENCODER)
        results = concurrent_round(server, texts)
        delta = wait_stats(server, ENCODER, before, len(texts))
        failed = [r for r in results if isinstance(r, Exception)]
        assert not failed, failed
        got = np.stack(results)
        assert_parity(got, want)
        assert delta.inferences == len(texts), delta
        seen.append((delta.inferences, delta.executions))
        if delta.executions < delta.inferences:
            break
    return seen


def test_requests_of_distinct_token_lengths_share_encoder_executions(server, reference):
    texts = [text_of_tokens(n) for n in LENGTHS]
    lengths = [len(reference.tokenizer(t)["input_ids"]) for t in texts]
    assert lengths == list(LENGTHS), "each request must have its own token length"
    want = reference.encode(texts, normalize_embeddings=True)

    seen = shared_executions(server, texts, want)
    print(f"\n{ENCODER} (inferences, executions) per round: {seen}")
    inferences, executions = seen[-1]
    assert executions < inferences, (
        f"{len(LENGTHS)} concurrent requests of distinct lengths never shared an encoder "
        f"execution in {len(seen)} rounds: {seen} (is allow_ragged_batch set?)"
    )
