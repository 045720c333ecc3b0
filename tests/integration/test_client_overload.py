"""The project's client against a server that refuses: retries within budget, deadlines kept.

The bounded model of ``test_overload`` (one encoder instance, one request per execution,
``max_queue_size = 2``, ``queue_timeout_us = 5000``) flooded by client threads that share
one :class:`~client.RetryBudget`, over HTTP and gRPC: every call returns the exact vector
the idle server gives or raises :class:`~client.ServerOverloadedError` after Triton's own
refusals; the retries stay within the budget's bound; and a call with a short deadline
never gets its answer after it.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import numpy as np
import pytest

from client import (
    DeadlineExceededError,
    EmbeddingClient,
    RetryBudget,
    ServerOverloadedError,
)
from tests.integration import test_overload
from tests.integration.conftest import ADMIN_KEY

MODEL = test_overload.MODEL
bounded_ports = test_overload.bounded_ports  # the fixture, a server of this module's own

THREADS = 12
CALLS = 12  # per thread
LONG = "Triton answers rather than piles up when its queues are bounded. " * 30
REFUSALS = ("Exceeds maximum queue size", "Request timeout expired")
SHORT_S = (0.25, 0.05)  # the probes' deadlines: room for a few retries; less than a run
# How long after its deadline a probe may take to come back: an answer arrives before the
# deadline (the transport gives up at it), but on a 2-core box shared with the server and
# the flood's threads, the probe's thread can wait for a core and the GIL to hand it back.
ANSWER_LATE_S = 0.15
ERROR_LATE_S = 0.5


@pytest.fixture(scope="module")
def bounded(bounded_ports):
    """The bounded server of ``test_overload``: its ports."""
    return bounded_ports


def _url(ports, protocol: str) -> str:
    return f"127.0.0.1:{ports.http if protocol == 'http' else ports.grpc}"


def _flood(
    url: str, protocol: str, budget: RetryBudget, calls: int, stop=None, pause_s: float = 0.0
) -> list:
    """One thread's calls: (vector or error, seconds) each; ``stop`` ends it early."""
    out = []
    with EmbeddingClient(url, protocol, 10.0, admin_key=ADMIN_KEY, retry_budget=budget) as c:
        for _ in range(calls):
            if stop is not None and stop.is_set():
                break
            time.sleep(pause_s)
            start = time.monotonic()
            try:
                out.append((c.embed_texts(MODEL, [LONG])[0], time.monotonic() - start))
            except (ServerOverloadedError, DeadlineExceededError) as exc:
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
    worst = max((float(np.abs(v - want).max()) for v in served), default=0.0)
    print(
        f"\n{protocol}: {len(served)} served (max abs {worst:.1e} from the idle answer), "
        f"{len(overloaded)} overloaded of {len(results)} "
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


def _flood_process(url: str, protocol: str, threads: int, seconds: float) -> int:
    """A flood of ``threads`` client threads for ``seconds``, in a process of its own (so
    the probes' process does not wait for the flood's threads to give up the GIL)."""
    stop, budget = threading.Event(), RetryBudget()
    with ThreadPoolExecutor(threads) as pool:
        runs = [
            pool.submit(_flood, url, protocol, budget, 10**6, stop, 0.01) for _ in range(threads)
        ]
        time.sleep(seconds)
        stop.set()
        return sum(len(run.result()) for run in runs)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_short_deadline_is_never_answered_after_it(bounded, protocol) -> None:
    """Probes with a 0.25 s or 0.05 s deadline while two processes of 6 client threads
    each flood the server (each thread pausing 10 ms between calls, still several times
    what one encoder serves): each probe returns the vector or raises within its
    deadline, plus the time a loaded 2-core box takes to hand it back."""
    url = _url(bounded, protocol)
    probes = []
    spawn = multiprocessing.get_context("spawn")  # no fork of a process with gRPC threads
    clients = [EmbeddingClient(url, protocol, s, admin_key=ADMIN_KEY) for s in SHORT_S]
    with ProcessPoolExecutor(2, mp_context=spawn) as pool:
        flood = [pool.submit(_flood_process, url, protocol, THREADS // 2, 6.0) for _ in range(2)]
        time.sleep(2.0)  # the processes start and the flood builds
        for i in range(30):
            c = clients[i % 2]
            start = time.monotonic()
            try:
                c.embed_texts(MODEL, [LONG])
                kind, message = "served", ""
            except (ServerOverloadedError, DeadlineExceededError) as exc:
                kind, message = type(exc).__name__, str(exc)
            probes.append((c.timeout_s, kind, time.monotonic() - start, message))
            time.sleep(0.05)
        flood_calls = sum(f.result() for f in flood)
    for c in clients:
        c.close()
    kinds = {(s, k): sum(1 for p in probes if p[:2] == (s, k)) for s, k, *_ in probes}
    late = max(seconds - s for s, _, seconds, _ in probes)
    print(
        f"\n{protocol}: probes {kinds}; latest {late * 1000:+.0f} ms past its deadline; "
        f"{flood_calls} flood calls"
    )
    print(f"latest three: {sorted(probes, key=lambda p: p[0] - p[2])[:3]}")
    for deadline, kind, seconds, _ in probes:
        assert seconds <= deadline + (ANSWER_LATE_S if kind == "served" else ERROR_LATE_S)
