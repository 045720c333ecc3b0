"""Text embeddings through the real server: parity with sentence-transformers, truncation."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.integration.conftest import MAX_BATCH, TEXT_MODEL
from tests.integration.text_helpers import assert_parity, cosines

pytestmark = pytest.mark.integration

# Three topics of 11 and 12 word pieces a sentence: tokens 1-132 are all the first
# topic, tokens 133-276 the second, so the 128- and 256-token truncations differ.
TOPICS = (
    "The orchestra tuned their violins before the evening concert began. ",
    "Volcanic eruptions released ash and lava across the frozen northern islands. ",
    "Stock markets fell sharply after the central bank raised interest rates. ",
)


def test_embeddings_match_sentence_transformers(client, corpus, expected):
    got = client.embed_texts(TEXT_MODEL, corpus)
    assert got.shape == (len(corpus), 384)
    assert got.dtype == np.float32
    gap, diff = assert_parity(got, expected)
    print(
        f"\n{client.protocol}: {len(corpus)} texts, 1 - min cos {gap:.2e} (float64), "
        f"max|diff| {diff:.2e}"
    )
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_long_text_is_truncated_at_256_tokens_like_sentence_transformers(client, reference):
    text = "".join(topic * 12 for topic in TOPICS)
    ids = reference.tokenizer(text)["input_ids"]
    assert len(ids) > 400 and len(text.encode()) < 16384
    assert set(ids[133:256]) - set(ids[:128]), "tokens 128-256 must say something new"
    assert reference.max_seq_length == 256
    want = reference.encode([text], normalize_embeddings=True)
    reference.max_seq_length = 128
    try:
        at_128 = reference.encode([text], normalize_embeddings=True)
    finally:
        reference.max_seq_length = 256

    got = client.embed_texts(TEXT_MODEL, [text])
    assert_parity(got, want)
    cos_128 = float(cosines(got, at_128)[0])
    print(f"\n{client.protocol}: served vs 128-token truncation: cosine {cos_128:.4f}")
    assert cos_128 < 0.999, "the server must keep 256 tokens, not 128"


def test_one_request_with_many_rows_equals_rows_sent_one_by_one(client, corpus):
    texts = corpus[:16]
    together = client.embed_texts(TEXT_MODEL, texts)
    alone = np.stack([client.embed_texts(TEXT_MODEL, [t])[0] for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)


@pytest.mark.parametrize("admin", [True, False], ids=["admin", "anonymous"])
def test_more_texts_than_max_batch_size_are_split_by_the_client(server, admin, corpus, expected):
    """With the key the client reads max_batch_size; without, it learns it from the refusal."""
    n = 3 * MAX_BATCH + 2
    for protocol in ("http", "grpc"):
        with server.client(protocol, **({} if admin else {"admin_key": ""})) as c:
            assert_parity(c.embed_texts(TEXT_MODEL, corpus[:n]), expected[:n])


def test_32_concurrent_clients_get_their_own_answers(server, corpus, expected):
    def work(i: int) -> None:
        with server.client("http" if i % 2 else "grpc") as c:
            rows = list(range(i % 7, len(corpus), 32))[:5]
            assert_parity(c.embed_texts(TEXT_MODEL, [corpus[r] for r in rows]), expected[rows])

    with ThreadPoolExecutor(32) as pool:
        list(pool.map(work, range(32)))
