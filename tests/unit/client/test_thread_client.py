"""The client the framework integrations share across threads (``client.thread_client``)."""

from __future__ import annotations

import threading

import pytest

from client import thread_client
from client.thread_client import SparseSides, ThreadClient


class _FakeClient:
    made: list[_FakeClient] = []

    def __init__(self, url, protocol, timeout_s, admin_key=None, **retry):
        self.args = (url, protocol, timeout_s, admin_key)
        self.thread = threading.get_ident()
        self.closed = False
        _FakeClient.made.append(self)

    def __enter__(self) -> _FakeClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.closed = True

    def embed(self, text: str) -> tuple[str, int]:
        return text, threading.get_ident()

    def embed_sparse(self, model: str, texts: list[str], **options) -> list:
        return [(model, text, options) for text in texts]


@pytest.fixture(autouse=True)
def fake_client(monkeypatch):
    _FakeClient.made = []
    monkeypatch.setattr(thread_client, "EmbeddingClient", _FakeClient)


def test_the_first_thread_keeps_its_client_and_others_open_and_close_their_own() -> None:
    shared = ThreadClient("localhost:8000", "http", 5.0, "key")
    assert shared.call("embed", "a")[0] == "a"
    assert shared.call("embed", text="b")[0] == "b"
    kept = _FakeClient.made[0]
    assert len(_FakeClient.made) == 1 and kept.args == ("localhost:8000", "http", 5.0, "key")
    other: list = []
    worker = threading.Thread(target=lambda: other.append(shared.call("embed", "c")))
    worker.start()
    worker.join()
    visitor = _FakeClient.made[1]
    assert other[0] == ("c", visitor.thread) and visitor.thread != kept.thread
    assert visitor.closed and not kept.closed


def test_close_closes_the_kept_client_and_a_later_call_opens_a_new_one() -> None:
    shared = ThreadClient(None, "grpc", 1.0, None)
    shared.call("embed", "a")
    shared.close()
    assert _FakeClient.made[0].closed
    shared.call("embed", "b")
    assert len(_FakeClient.made) == 2 and not _FakeClient.made[1].closed


@pytest.mark.parametrize(("inference_free", "sent"), [(True, "query"), (False, None)])
def test_sparse_sides_send_the_task_only_to_an_inference_free_model(inference_free, sent) -> None:
    sides = SparseSides(ThreadClient(None, "http", 1.0, None), "s", inference_free, 4)
    rows = sides.rows(("a", "b"), "query")
    options = {"task": sent, "max_active_dims": 4}
    assert rows == [("s", "a", options), ("s", "b", options)]


def test_sparse_sides_of_no_texts_make_no_call() -> None:
    sides = SparseSides(ThreadClient(None, "http", 1.0, None), "s", True, 4)
    assert sides.rows([], "query") == []
    assert _FakeClient.made == []
