"""Text embeddings through the real server: parity with sentence-transformers, batching."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.integration.conftest import TEXT_MODEL

pytestmark = pytest.mark.integration


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_embeddings_match_sentence_transformers(client, corpus, expected):
    got = client.embed_texts(TEXT_MODEL, corpus)
    assert got.shape == (len(corpus), 384)
    assert got.dtype == np.float32
    cos = _cosines(got, expected)
    diff = np.abs(got - expected).max()
    print(
        f"\n{client.protocol}: {len(corpus)} texts, min cos {cos.min():.7f}, max|diff| {diff:.2e}"
    )
    assert cos.min() >= 0.9999
    assert diff <= 1e-4
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_long_text_is_truncated_like_sentence_transformers(client, reference):
    long_text = "word " * 2000
    got = client.embed_texts(TEXT_MODEL, [long_text])[0]
    want = reference.encode([long_text], normalize_embeddings=True)[0]
    assert float(np.dot(got, want)) >= 0.9999


def test_one_request_with_many_rows_equals_rows_sent_one_by_one(client, corpus):
    texts = corpus[:16]
    together = client.embed_texts(TEXT_MODEL, texts)
    alone = np.stack([client.embed_texts(TEXT_MODEL, [t])[0] for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)


def test_more_texts_than_max_batch_size_are_chunked_by_the_client(client, corpus, expected):
    got = client.embed_texts(TEXT_MODEL, corpus[:50])
    assert _cosines(got, expected[:50]).min() >= 0.9999


def test_32_concurrent_clients_get_their_own_answers(server, corpus, expected):
    def work(i: int) -> float:
        with server.client("http" if i % 2 else "grpc") as c:
            rows = list(range(i % 7, len(corpus), 32))[:5]
            got = c.embed_texts(TEXT_MODEL, [corpus[r] for r in rows])
            return float(_cosines(got, expected[rows]).min())

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(work, range(32)))
    assert min(results) >= 0.9999


def test_dynamic_batcher_groups_requests_of_different_lengths(server, corpus):
    def send(text: str) -> None:
        with server.client() as own:
            own.embed_texts(TEXT_MODEL, [text])

    with server.client() as c:
        before = {s.name: s for s in c.model_statistics(f"{TEXT_MODEL}_encode")}
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(send, corpus[:64]))
        after = {s.name: s for s in c.model_statistics(f"{TEXT_MODEL}_encode")}
    name = f"{TEXT_MODEL}_encode"
    inferences = after[name].inference_count - before[name].inference_count
    executions = after[name].execution_count - before[name].execution_count
    assert inferences == 64
    assert executions < inferences, "ragged inputs should let requests share executions"
