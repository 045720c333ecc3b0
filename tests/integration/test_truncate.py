"""The request parameter ``truncate`` on the real server, two-step and fused text models.

Default (``truncate`` absent or true): a long text is cut at ``max_seq_length`` exactly as
sentence-transformers cuts it. ``truncate = false``: a text over the limit is refused with
INVALID_ARG naming its row, its token count and the limit, for that request alone; a
text of exactly the limit passes. Rows are built with known token counts: " a" is one
WordPiece, so k words make k + 2 tokens with [CLS] and [SEP].
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from client import EmbeddingClientError
from tests.integration.conftest import TEXT_MODEL
from tests.integration.test_fused_tokenize import MODEL as FUSED_MODEL
from tests.integration.test_fused_tokenize import fused_server  # noqa: F401 - fixture
from tests.integration.text_helpers import assert_parity

pytestmark = pytest.mark.integration

PROTOCOLS = ["http", "grpc"]


def _words(n: int) -> str:
    return " ".join(["a"] * n)


@pytest.fixture(scope="module")
def limit(reference) -> int:
    """The model's token limit (all-MiniLM-L6-v2: 256)."""
    return reference.max_seq_length


@pytest.fixture(params=["two-step", "fused"])
def target(request, server) -> tuple:
    if request.param == "fused":
        return request.getfixturevalue("fused_server"), FUSED_MODEL
    return server, TEXT_MODEL


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_default_and_true_cut_long_texts_as_sentence_transformers(
    target, protocol, reference, limit
) -> None:
    srv, model = target
    texts = [_words(limit - 2), _words(limit - 1), _words(5 * limit), "short text"]
    want = reference.encode(texts, normalize_embeddings=True)
    with srv.client(protocol) as client:
        assert_parity(client.embed_texts(model, texts), want)
        assert_parity(client.embed_texts(model, texts, truncate=True), want)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_truncate_false_passes_the_limit_and_refuses_one_over_and_far_over(
    target, protocol, reference, limit
) -> None:
    srv, model = target
    exact = _words(limit - 2)
    with srv.client(protocol) as client:
        got = client.embed_texts(model, ["short", exact], truncate=False)
        assert_parity(got, reference.encode(["short", exact], normalize_embeddings=True))
        for words, row in ((limit - 1, 1), (10 * limit, 0)):
            rows = ["short", _words(words)] if row else [_words(words), "short"]
            with pytest.raises(EmbeddingClientError) as refused:
                client.embed_texts(model, rows, truncate=False)
            message = refused.value.message
            assert f"TEXT row {row} has {words + 2} tokens" in message, message
            assert f"over the model's limit of {limit}" in message, message
            assert "INVALID_ARG" in str(refused.value.status) or "400" in str(
                refused.value.status
            ), refused.value.status


def test_a_refused_request_fails_alone_among_concurrent_good_ones(
    target, reference, limit
) -> None:
    srv, model = target
    good = ["a good text", _words(limit - 2)]
    want = reference.encode(good, normalize_embeddings=True)

    def call(i: int):
        with srv.client("grpc" if i % 2 else "http") as client:
            if i % 3 == 2:
                try:
                    client.embed_texts(model, [_words(limit)], truncate=False)
                except EmbeddingClientError as exc:
                    return exc
                return None
            return client.embed_texts(model, [good[i % 3]], truncate=i % 2 == 0)

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(call, range(24)))
    for i, result in enumerate(results):
        if i % 3 == 2:
            assert isinstance(result, EmbeddingClientError), (i, result)
            assert f"has {limit + 2} tokens" in result.message
        else:
            assert isinstance(result, np.ndarray), (i, result)
            assert_parity(result, want[i % 3][None])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_truncation_direction_left_keeps_the_end_as_the_library_cutting_left(
    target, protocol, reference, limit
) -> None:
    """``truncation_direction=left`` equals sentence-transformers with its tokenizer's
    ``truncation_side = "left"``: rows exactly at the limit, one over and far over,
    mixed with short ones; ``right`` equals the default cut."""
    srv, model = target
    texts = [
        f"first words {_words(limit - 4)}",  # exactly the limit: nothing cut
        f"first words {_words(limit - 3)}",  # one over
        f"first words {_words(4 * limit)} the last words differ",  # far over
        "short text",
    ]
    side = reference.tokenizer.truncation_side
    reference.tokenizer.truncation_side = "left"
    try:
        want_left = reference.encode(texts, normalize_embeddings=True)
    finally:
        reference.tokenizer.truncation_side = side
    want_right = reference.encode(texts, normalize_embeddings=True)
    assert np.abs(want_left[1:3] - want_right[1:3]).max() > 1e-3  # the two cuts differ
    with srv.client(protocol) as client:
        assert_parity(client.embed_texts(model, texts, truncation_direction="left"), want_left)
        assert_parity(client.embed_texts(model, texts, truncation_direction="Left"), want_left)
        assert_parity(client.embed_texts(model, texts, truncation_direction="right"), want_right)
        with pytest.raises(EmbeddingClientError) as refused:
            client.embed_texts(model, texts, truncation_direction="middle")
        assert "truncation_direction must be 'right' or 'left'" in refused.value.message


def test_left_and_right_cut_requests_batched_together_each_get_their_own(
    target, reference, limit
) -> None:
    """Concurrent requests of both directions share the server's batches."""
    srv, model = target
    text = f"start {_words(2 * limit)} the end"
    side = reference.tokenizer.truncation_side
    reference.tokenizer.truncation_side = "left"
    try:
        want_left = reference.encode([text], normalize_embeddings=True)
    finally:
        reference.tokenizer.truncation_side = side
    want_right = reference.encode([text], normalize_embeddings=True)

    def call(i: int) -> np.ndarray:
        with srv.client("grpc" if i % 2 else "http") as client:
            direction = "left" if i % 3 == 0 else "right"
            return client.embed_texts(model, [text], truncation_direction=direction)

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(call, range(24)))
    for i, got in enumerate(results):
        assert_parity(got, want_left if i % 3 == 0 else want_right)
