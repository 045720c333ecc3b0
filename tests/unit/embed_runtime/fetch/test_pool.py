"""``embed_runtime.fetch.pool.FetchPool`` against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import base64
import threading
import time

import pytest

from embed_runtime.errors import INTERNAL, INVALID_ARG, UNAVAILABLE, RequestError
from embed_runtime.fetch.pool import FetchPool
from embed_runtime.fetch.url_fetch import FetchPolicy
from tests.unit.embed_runtime.fetch import fetch_helpers
from tests.unit.embed_runtime.fetch.fetch_helpers import LOCAL, PNG, SMALL_CAP, TARPIT

server = fetch_helpers.server
base = fetch_helpers.base
closed_port = fetch_helpers.closed_port


@pytest.fixture
def pool():
    pools: list[FetchPool] = []

    def make(policy: FetchPolicy = LOCAL, max_concurrency: int = 16) -> FetchPool:
        pools.append(FetchPool(policy, max_concurrency))
        return pools[-1]

    yield make
    for p in pools:
        p.close()


class _Answers:
    """Records ``on_done`` calls of ``FetchPool.fetch_groups`` with their time."""

    def __init__(self, expected: int):
        self.expected = expected
        self.start = time.monotonic()
        self.calls: list[tuple[int, float, list]] = []
        self._lock = threading.Lock()
        self.all_done = threading.Event()

    def __call__(self, group: int, results: list) -> None:
        with self._lock:
            self.calls.append((group, time.monotonic() - self.start, results))
            if len(self.calls) >= self.expected:
                self.all_done.set()

    def wait(self) -> dict[int, tuple[float, list]]:
        assert self.all_done.wait(10)
        time.sleep(0.05)
        groups = [g for g, _, _ in self.calls]
        assert sorted(groups) == list(range(self.expected)), "one answer per group"
        return {g: (t, r) for g, t, r in self.calls}


def test_fetch_pool_runs_urls_concurrently(server, base, pool):
    # The server answers none of the 16 until all 16 are in flight at once (one after
    # another, the first waits for the others until its barrier breaks: 503).
    server.together = threading.Barrier(16)
    urls = [f"{base}/together?i={i}" for i in range(16)]
    assert pool(max_concurrency=16).fetch(urls) == [PNG] * 16


def test_fetch_pool_keeps_order_and_returns_errors(base, closed_port, pool):
    urls = [
        f"{base}/image.png",
        f"{base}/404",
        "file:///etc/passwd",
        "data:;base64," + base64.b64encode(b"abc").decode(),
        f"{base}/500",
        f"http://127.0.0.1:{closed_port}/x",
        f"{base}/octet",
    ]
    results = pool(max_concurrency=4).fetch(urls)
    assert results[0] == PNG and results[3] == b"abc" and results[6] == PNG
    codes = {i: r.code for i, r in enumerate(results) if isinstance(r, RequestError)}
    assert codes == {1: INVALID_ARG, 2: INVALID_ARG, 4: UNAVAILABLE, 5: UNAVAILABLE}
    for i in codes:
        assert urls[i] in results[i].message


def test_fetch_pool_fetches_repeated_url_once(base, server, pool):
    url = f"{base}/image.png?dedupe"
    assert pool(max_concurrency=4).fetch([url, url, url]) == [PNG] * 3
    assert server.hits["/image.png?dedupe"] == 1


def test_fetch_pool_wraps_unexpected_errors_as_internal(pool):
    results = pool(max_concurrency=2).fetch([None, "data:,ok"])  # type: ignore[list-item]
    assert isinstance(results[0], RequestError) and results[0].code == INTERNAL
    assert "internal error (AttributeError)" in results[0].message
    assert results[1] == b"ok"


def test_fetch_groups_answers_each_group_as_soon_as_its_own_urls_are_done(base, server, pool):
    groups = [
        [f"{base}/drip?tarpit"],
        [f"{base}/image.png?fast"],
        [f"{base}/octet?a", f"{base}/image.png?fast", "data:,x"],
        [],
        [f"{base}/image.png?fast", f"{base}/drip?tarpit"],
    ]
    answers = _Answers(len(groups))
    pool(TARPIT).fetch_groups(groups, answers)
    answered_at_return = {g for g, _, _ in list(answers.calls)}
    got = answers.wait()
    assert not answered_at_return & {0, 4}  # returned without waiting for the tarpit
    for fast in (1, 2, 3):  # each before any tarpit group, which waits out the 3 s deadline
        assert got[fast][0] < min(got[0][0], got[4][0])
    assert got[1][1] == [PNG] and got[2][1] == [PNG, PNG, b"x"] and got[3][1] == []
    for slow in (0, 4):
        assert got[slow][0] > TARPIT.read_timeout_s - 0.1
        assert got[slow][1][-1].code == UNAVAILABLE
        assert "timed out" in got[slow][1][-1].message
    assert got[4][1][0] == PNG
    assert server.hits["/image.png?fast"] == 1 and server.hits["/drip?tarpit"] == 1


def test_fetch_groups_blocks_while_max_concurrency_urls_are_in_flight(base, pool):
    fetcher = pool(TARPIT, max_concurrency=2)
    answers = _Answers(3)
    fetcher.fetch_groups([[f"{base}/hang?1"], [f"{base}/hang?2"]], answers)
    start = time.monotonic()
    fetcher.fetch_groups([[f"{base}/image.png?after-slot"]], lambda _g, r: answers(2, r))
    assert time.monotonic() - start > TARPIT.read_timeout_s / 2  # until a hang timed out
    assert {g for g, _, _ in list(answers.calls)} & {0, 1}
    got = answers.wait()
    assert got[2][1] == [PNG]
    assert got[0][1][0].code == got[1][1][0].code == UNAVAILABLE


def test_fetch_pool_close_returns_at_once_and_fails_waiting_urls(base, pool):
    fetcher = pool(TARPIT, max_concurrency=1)
    answers = _Answers(2)
    fetcher.fetch_groups([[f"{base}/hang?close"]], answers)
    waiting = threading.Thread(
        target=fetcher.fetch_groups,
        args=([[f"{base}/image.png?late"]], lambda _g, r: answers(1, r)),
    )
    waiting.start()  # blocks for the one slot, before or after close: "shutting down" both
    time.sleep(0.1)
    fetcher.close()
    assert not answers.calls  # close did not wait for the hang (3 s to its timeout)
    got = answers.wait()
    waiting.join(2)
    assert "timed out" in got[0][1][0].message
    late = got[1][1][0]
    assert late.code == UNAVAILABLE and "shutting down" in late.message
    after = fetcher.fetch(["data:,x"])
    assert after[0].code == UNAVAILABLE and "shutting down" in after[0].message


def test_fetch_pool_fails_the_url_that_passes_max_batch_bytes(base, pool):
    policy = FetchPolicy(allow_hosts=("127.0.0.1",), max_batch_bytes=2 * len(PNG) + 10)
    fetcher = pool(policy, max_concurrency=1)
    results = fetcher.fetch([f"{base}/image.png?b={i}" for i in range(3)])
    assert results[:2] == [PNG, PNG]
    err = results[2]
    assert err.code == INVALID_ARG
    assert err.message.endswith(
        f"refused: the images of this batch are over max_batch_bytes={2 * len(PNG) + 10} together"
    )
    assert fetcher.fetch([f"{base}/image.png?next-batch"]) == [PNG]


def test_fetch_pool_counts_streamed_bodies_and_data_uris_against_max_batch_bytes(base, pool):
    policy = FetchPolicy(allow_hosts=("127.0.0.1",), max_batch_bytes=SMALL_CAP * 6)
    data = "data:;base64," + base64.b64encode(b"x" * SMALL_CAP * 2).decode()
    results = pool(policy, max_concurrency=1).fetch([f"{base}/no-length-big", data])
    assert results[0] == b"x" * SMALL_CAP * 5
    assert results[1].code == INVALID_ARG and "max_batch_bytes" in results[1].message


def test_fetch_pool_rejects_zero_concurrency():
    with pytest.raises(ValueError, match="max_concurrency"):
        FetchPool(LOCAL, 0)
