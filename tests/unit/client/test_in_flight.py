"""The requests of one call kept in flight together (``SendMixin._each_part``), no server.

gRPC parts run on the client's threads, HTTP parts on greenlets of its connection pool;
answers keep part order, a failure stops further parts and the first in order is raised.
"""

from __future__ import annotations

import threading

import gevent
import pytest

from client import EmbeddingClient, EmbeddingClientError


def _client(protocol: str, max_in_flight: int) -> EmbeddingClient:
    port = 8001 if protocol == "grpc" else 8000
    return EmbeddingClient(f"127.0.0.1:{port}", protocol, admin_key="", max_in_flight=max_in_flight)


def test_grpc_parts_are_sent_together_and_answered_in_order() -> None:
    # Each part waits for a second one: sent one after another, the barrier would break.
    both = threading.Barrier(2, timeout=30)
    with _client("grpc", 2) as client:

        def call(part: int) -> int:
            both.wait()
            return part * 10

        assert client._each_part(call, list(range(6))) == [0, 10, 20, 30, 40, 50]
        assert client._each_part(call, [1, 2]) == [10, 20]  # the threads are kept


def test_http_parts_share_the_pool_up_to_max_in_flight() -> None:
    active, most = [0], [0]

    def call(part: int) -> int:
        active[0] += 1
        most[0] = max(most[0], active[0])
        gevent.sleep(0.001)
        active[0] -= 1
        return -part

    with _client("http", 3) as client:
        assert client._each_part(call, list(range(10))) == [-p for p in range(10)]
    assert most[0] == 3


def test_one_in_flight_sends_one_part_after_another() -> None:
    order = []
    with _client("grpc", 1) as client:
        client._each_part(lambda part: order.append((part, threading.current_thread())), [1, 2])
    assert [part for part, _ in order] == [1, 2]
    assert {thread for _, thread in order} == {threading.current_thread()}


def test_the_first_failure_in_part_order_is_raised() -> None:
    # Part 2 fails first; part 1, already sent, fails after it: part 1's error is raised.
    second_failed = threading.Event()

    def call(part: int) -> int:
        if part == 2:
            second_failed.set()
            raise EmbeddingClientError("part 2")
        if part == 1:
            second_failed.wait(30)
            raise EmbeddingClientError("part 1")
        return part

    with _client("grpc", 3) as client, pytest.raises(EmbeddingClientError, match="part 1"):
        client._each_part(call, [0, 1, 2])


def test_after_a_failure_no_further_part_is_sent() -> None:
    sent = []

    def call(part: int) -> int:
        sent.append(part)
        gevent.sleep(0)
        if part == 0:
            raise EmbeddingClientError("part 0 refused")
        return part

    with _client("http", 2) as client, pytest.raises(EmbeddingClientError, match="part 0"):
        client._each_part(call, list(range(20)))
    assert sent == [0, 1]


@pytest.mark.parametrize("value", [0, -1, 2.0, True])
def test_max_in_flight_must_be_a_positive_integer(value) -> None:
    with pytest.raises(EmbeddingClientError, match="max_in_flight"):
        EmbeddingClient("127.0.0.1:8001", "grpc", admin_key="", max_in_flight=value)


def test_chunks_are_numbered_by_part_order_whatever_order_the_parts_end_in(monkeypatch) -> None:
    from client.chunks import TextChunk

    def infer_chunks(model, items, parameters, first_row, names):
        gevent.sleep(0.05 if items[0] == b"t0" else 0)  # the first part ends last
        return [TextChunk(first_row + r, 0, 1, 1, None) for r in range(len(items))]

    with _client("http", 4) as client:
        monkeypatch.setattr(client, "_max_batch_size", lambda model: 2)
        monkeypatch.setattr(client, "_infer_chunks", infer_chunks)
        chunks = client._chunked("m", [f"t{i}" for i in range(6)])
    assert [chunk.row for chunk in chunks] == [0, 1, 2, 3, 4, 5]
