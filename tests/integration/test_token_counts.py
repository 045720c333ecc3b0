"""``TOKEN_COUNT``: the tokens each text cost, on the real server (two-step and fused).

Text ensembles with the python-ort encoder answer an optional INT32 output per row: the
tokens the encoder saw, prompt and special tokens included, after truncation, so callers
can meter usage. It must equal what sentence-transformers' own tokenizer makes of the
same (prompted) text cut at ``max_seq_length``, and asking for it must not change the
embedding. A model that does not offer it (CLIP's text ensemble) refuses the request.
"""

from __future__ import annotations

import numpy as np
import pytest

from client import EmbeddingClientError
from tests.integration.clip_fixture import CLIP_MODEL
from tests.integration.conftest import TEXT_MODEL
from tests.integration.test_fused_tokenize import MODEL as FUSED_MODEL
from tests.integration.test_fused_tokenize import (
    PROMPTS,
    fused_server,  # noqa: F401 - fixture
)
from tests.integration.text_helpers import assert_parity

pytestmark = pytest.mark.integration

TEXTS = ["x", "A man is eating food.", "emoji 🙂🚀", "long " * 400, "東京は日本の首都です。"]


def _expected(reference, texts: list[str]) -> list[int]:
    """Tokens per text as sentence-transformers tokenizes them (truncated to the limit)."""
    return [int(n) for n in reference.preprocess(texts)["attention_mask"].sum(axis=1)]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_two_step_model_counts_tokens_like_sentence_transformers(
    server, reference, protocol
) -> None:
    with server.client(protocol) as client:
        vectors, counts = client.embed_texts_with_counts(TEXT_MODEL, TEXTS)
        plain = client.embed_texts(TEXT_MODEL, TEXTS)
    assert counts.dtype == np.int32 and counts.shape == (len(TEXTS),)
    assert counts.tolist() == _expected(reference, TEXTS)
    assert counts[3] == reference.max_seq_length  # cut at the limit, as encoded
    assert_parity(vectors, plain)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_fused_model_counts_the_prompt_too(fused_server, reference, protocol) -> None:  # noqa: F811
    with fused_server.client(protocol) as client:
        _, plain_counts = client.embed_texts_with_counts(FUSED_MODEL, TEXTS)
        _, query_counts = client.embed_texts_with_counts(
            FUSED_MODEL, TEXTS, prompt_name="query"
        )
    assert plain_counts.tolist() == _expected(reference, TEXTS)
    prompted = [PROMPTS["query"] + t for t in TEXTS]
    assert query_counts.tolist() == _expected(reference, prompted)
    assert query_counts[0] > plain_counts[0]


def test_counts_follow_a_batch_split_across_requests(server, reference) -> None:
    texts = [f"sentence number {i} " * (i % 7 + 1) for i in range(40)]  # > max_batch_size
    with server.client() as client:
        _, counts = client.embed_texts_with_counts(TEXT_MODEL, texts)
    assert counts.tolist() == _expected(reference, texts)


def test_a_model_without_counts_refuses_the_output(server) -> None:
    with server.client() as client:
        with pytest.raises(EmbeddingClientError, match="TOKEN_COUNT"):
            client.embed_texts_with_counts(f"{CLIP_MODEL}_text", ["a photo of a cat"])
