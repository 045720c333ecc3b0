"""The load generator and the statistics window, with fake senders (no server)."""

from __future__ import annotations

import threading
import time

import pytest

from client.load.loadgen import LoadSpec, format_result, run_load, summarize
from client.load.server_stats import window_stats
from client.load.workload import image_requests, text_pool, text_requests


class FakeSender:
    """Sleeps a little per request; fails every ``fail_every``-th one."""

    instances: list[FakeSender] = []
    lock = threading.Lock()

    def __init__(self, delay_s: float = 0.001, fail_every: int = 0):
        self.delay_s, self.fail_every = delay_s, fail_every
        self.sent = 0
        self.closed = False
        self.thread = threading.get_ident()
        with FakeSender.lock:
            FakeSender.instances.append(self)

    def prepare(self, items):
        return len(items)

    def send(self, prepared):
        assert threading.get_ident() == self.thread, "a sender must stay on its own thread"
        self.sent += 1
        time.sleep(self.delay_s)
        if self.fail_every and self.sent % self.fail_every == 0:
            raise RuntimeError("boom")
        return prepared

    def close(self):
        self.closed = True


@pytest.fixture(autouse=True)
def _reset():
    FakeSender.instances = []


def test_run_load_sends_every_request_and_counts_items():
    spec = LoadSpec(clients=4, items_per_request=3, requests_per_client=5, warmup_requests=2)
    requests = text_requests(text_pool(50), 3, 28)
    started = []
    result = run_load(FakeSender, requests, spec, on_start=lambda: started.append(1))
    assert started == [1]
    assert (result.requests, result.items, result.errors) == (20, 60, 0)
    assert result.qps > 0 and result.items_per_s == pytest.approx(3 * result.qps)
    assert 0 < result.min_ms <= result.median_ms <= result.p95_ms <= result.p99_ms
    assert len(FakeSender.instances) == 4
    assert all(s.closed and s.sent == 7 for s in FakeSender.instances)


def test_run_load_counts_errors_and_keeps_samples():
    spec = LoadSpec(clients=2, items_per_request=1, requests_per_client=6, warmup_requests=0)
    result = run_load(lambda: FakeSender(fail_every=3), [[b"x"]], spec)
    assert (result.requests, result.errors) == (8, 4)
    assert result.error_samples and "boom" in result.error_samples[0]
    assert "errors" in format_result(result)


def test_run_load_stops_at_the_time_cap():
    # Uncapped, each client sends for 100 s; capped at 1 s, each sends at most 101
    # (a request takes 10 ms or more), at least one unless a client waits 1 s for a CPU.
    spec = LoadSpec(clients=2, items_per_request=1, requests_per_client=10_000, max_seconds=1.0)
    start = time.monotonic()
    result = run_load(lambda: FakeSender(delay_s=0.01), [[b"x"]], spec)
    assert time.monotonic() - start < 30
    assert 0 < result.requests <= 2 * 101


def test_run_load_reports_a_sender_that_cannot_start():
    def broken():
        raise ConnectionRefusedError("nobody home")

    with pytest.raises(RuntimeError, match="nobody home"):
        run_load(broken, [[b"x"]], LoadSpec(2, 1, 3))


def test_each_client_sends_every_clients_th_request_warm_up_first():
    class Recording(FakeSender):
        def prepare(self, items):
            return items[0]

        def send(self, prepared):
            self.bodies = [*getattr(self, "bodies", []), prepared]
            return 1

    requests = [[b"r0"], [b"r1"], [b"r2"]]
    result = run_load(Recording, requests, LoadSpec(2, 1, 2, warmup_requests=1))
    bodies = sorted(s.bodies for s in FakeSender.instances)
    assert bodies == [[b"r0", b"r2", b"r1"], [b"r1", b"r0", b"r2"]]
    assert result.requests == 4 and result.items == 4


def test_summarize_percentiles():
    latencies = [i / 1000 for i in range(1, 101)]
    result = summarize("t", LoadSpec(1, 1, 100), latencies, 100, 0, 2.0)
    assert result.median_ms == pytest.approx(50.5)
    assert result.p99_ms == pytest.approx(99.01)
    assert result.qps == 50.0


def test_text_requests_cycle_the_pool_evenly():
    pool = ["a", "b", "c", "d", "e"]
    reqs = text_requests(pool, 2, 5)
    flat = [item.decode() for req in reqs for item in req]
    assert flat == pool * 2


def test_image_requests_cycle_items():
    assert image_requests([b"1", b"2", b"3"], 2, 2) == [[b"1", b"2"], [b"3", b"1"]]


def _stat(name, success, queue_ns, batches):
    return {
        "name": name,
        "version": "1",
        "inference_count": success,
        "execution_count": sum(batches.values()),
        "inference_stats": {
            "success": {"count": success, "ns": success * 5_000_000},
            "queue": {"count": success, "ns": queue_ns},
        },
        "batch_stats": [
            {"batch_size": size, "compute_infer": {"count": n, "ns": n * 1_000_000}}
            for size, n in batches.items()
        ],
    }


def test_window_stats_subtracts_snapshots_and_orders_models():
    before = {"enc:1": _stat("enc", 10, 10_000_000, {1: 10}), "idle:1": _stat("idle", 3, 0, {})}
    after = {
        "enc:1": _stat("enc", 30, 50_000_000, {1: 10, 4: 5}),
        "ens:1": _stat("ens", 20, 0, {}),
        "idle:1": _stat("idle", 3, 0, {}),
    }
    stats = window_stats(before, after, order=["ens", "enc"])
    assert [s.name for s in stats] == ["ens", "enc"]
    enc = stats[1]
    assert enc.success_count == 20
    assert enc.avg_queue_ms == pytest.approx(2.0)
    assert enc.batch_sizes == {4: 5}
    assert enc.execution_count == 5 and enc.avg_batch_size == pytest.approx(4.0)
