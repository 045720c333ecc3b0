"""``client.rerank``: requests sized with the query counted, the batch limit learnt."""

from __future__ import annotations

import numpy as np

from client import EmbeddingClient, EmbeddingClientError
from tests.unit.client.test_api import _closed_port


def test_rerank_counts_the_query_bytes_and_learns_the_batch_limit(monkeypatch):
    sent: list[list[bytes]] = []

    def score(model, query, items, parameters):
        if len(items) > 2:
            raise EmbeddingClientError("inference request batch-size must be <= 2")
        sent.append(items)
        return np.array([[float(len(i))] for i in items], dtype=np.float32)

    client = EmbeddingClient(f"127.0.0.1:{_closed_port()}", timeout_s=2, max_request_bytes=20)
    with client:
        client._max_batch["r"] = 0  # no config: the limit comes from the refusal
        monkeypatch.setattr(client, "_score", score)
        scores = client.rerank("r", "qqqq", ["a", "bb", "ccc", "dddd", "eeeeeeee"])
    np.testing.assert_array_equal(scores, [1, 2, 3, 4, 8])
    assert client._max_batch["r"] == 2
    assert all(sum(4 + len(i) for i in part) <= 20 for part in sent)
    assert sent == [[b"a", b"bb"], [b"ccc", b"dddd"], [b"eeeeeeee"]]
