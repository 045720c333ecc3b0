"""A Python-backend stub killed under load is replaced within seconds (``StubWatch``).

The fault as the OOM killer deals it: ``kill -9`` of one stub while 8 clients send
requests. Before the watch, the stub was never started again and every request routed
to its instance failed for as long as anyone watched, with every health probe green.
Here, for a stub of each kind (tokenizer, encoder, image preprocessing, URL fetcher):
the model is reloaded with fresh stubs within 10 s, no answer is ever wrong, and no
request sent after the reload fails. The container health check (deploy/healthcheck.py)
is healthy before the kill, unhealthy while the model waits for its reload, and healthy
again after.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pytest

from embed_runtime.stub_watch import live_stubs
from tests.healthcheck_module import load_healthcheck
from tests.integration.clip_fixture import CLIP_MODEL, sample_images
from tests.integration.conftest import TEXT_MODEL

RECOVERY_S = 10.0
CLIENTS = 8
AFTER_S = 2.0  # load kept up this long after the recovery


@dataclass
class Load:
    """Results of the clients: (sent, finished, error or "") and every wrong answer."""

    results: list[tuple[float, float, str]] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)


_healthcheck = load_healthcheck


def _stub_pids(server_pid: int, model: str) -> dict[str, int]:
    pids = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            args = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if len(args) > 8 and args[5] == str(server_pid).encode() and (
            args[8].decode().startswith(model + "_")
        ):
            pids[args[8].decode()] = int(entry)
    return pids


def _watch_reloads(health_file: str) -> int:
    """How many reloads the server's stub watch has finished (its health file)."""
    try:
        with open(health_file, encoding="utf-8") as handle:
            return int(json.load(handle).get("reloads", 0))
    except (OSError, ValueError):
        return 0


def _run(server, call, check, model: str) -> tuple[Load, float, dict]:
    """Load ``call`` from 8 clients, kill one stub of ``model``, wait for its return."""
    load = Load()
    server_pid = server.process.process.pid
    before = {i for i, m in live_stubs(server_pid).items() if m == model}
    assert before, f"no stub of {model} is running"

    def client() -> None:
        with server.client("grpc") as c:
            while not load.stop.is_set():
                sent = time.monotonic()
                try:
                    answer = call(c)
                    error = ""
                    if not check(answer):
                        load.wrong.append(f"wrong answer at {sent:.2f}")
                except Exception as exc:
                    error = str(exc)[:300] or type(exc).__name__
                load.results.append((sent, time.monotonic(), error))

    probe_module, port = _healthcheck(), server.ports.http
    health_file = probe_module.health_file(port)
    reloads_before = _watch_reloads(health_file)
    health: list[tuple[float, bool]] = []

    def probe() -> None:  # deploy/healthcheck.py's verdict, as Docker's HEALTHCHECK runs it
        while not load.stop.is_set():
            healthy = probe_module.ready(port) and not probe_module.watch_problem(
                probe_module.health_file(port)
            )
            health.append((time.monotonic(), healthy))
            time.sleep(0.05)

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    threads.append(threading.Thread(target=probe))
    for thread in threads:
        thread.start()
    try:
        time.sleep(1.0)
        victim = sorted(_stub_pids(server_pid, model).items())[0]
        killed = time.monotonic()
        os.kill(victim[1], signal.SIGKILL)
        recovered = None
        while time.monotonic() - killed < RECOVERY_S + 5:
            pids = _stub_pids(server_pid, model)
            live = {i for i, m in live_stubs(server_pid).items() if m == model}
            # Recovered once the new stub runs and the watch's reload has returned (the
            # model swapped in): the process alone appears while the model still loads.
            if (
                live >= before
                and pids.get(victim[0]) not in (None, victim[1])
                and _watch_reloads(health_file) > reloads_before
            ):
                recovered = time.monotonic()
                break
            time.sleep(0.05)
        time.sleep(AFTER_S)
    finally:
        load.stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert recovered is not None, f"{model}: {victim[0]} was not replaced"
    stats = {
        "recovery_s": round(recovered - killed, 2),
        "requests": len(load.results),
        "failed": sum(1 for r in load.results if r[2]),
        "failed_sent_after_kill": sum(1 for s, _, e in load.results if e and s > killed),
        "failed_sent_after_recovery": sum(1 for s, _, e in load.results if e and s > recovered),
        "errors": sorted({e.split(" (")[0][-120:] for _, _, e in load.results if e}),
        "unhealthy_s": round(sum(0.05 for t, ok in health if not ok and t > killed), 2),
        "healthy_before": all(ok for t, ok in health if t < killed),
        "healthy_at_end": bool(health) and health[-1][1],
    }
    return load, recovered - killed, stats


@pytest.fixture(scope="module")
def photo() -> bytes:
    return sample_images()["photo.jpg"]


def _text_case(expected_row):
    def call(c):
        return c.embed_texts(TEXT_MODEL, ["Triton batches requests from many clients."])

    return call, lambda got: np.abs(got[0] - expected_row).max() <= 1e-5


@pytest.mark.parametrize("step", ["tokenize", "encode"])
def test_a_killed_text_stub_is_replaced_and_no_answer_is_wrong(server, reference, step) -> None:
    want = reference.encode(["Triton batches requests from many clients."],
                            normalize_embeddings=True)[0]
    call, check = _text_case(want)
    load, seconds, stats = _run(server, call, check, f"{TEXT_MODEL}_{step}")
    print(f"\nkill -9 {TEXT_MODEL}_{step}: {stats}")
    assert stats["healthy_before"] and stats["healthy_at_end"]
    assert stats["unhealthy_s"] > 0, "the health check never saw the dead stub"
    assert not load.wrong
    assert seconds <= RECOVERY_S
    assert stats["failed_sent_after_recovery"] == 0
    assert stats["requests"] > stats["failed"] > 0 or stats["failed"] == 0


@pytest.mark.parametrize(("model", "by_url"), [
    (f"{CLIP_MODEL}_preprocess_image", False),
    ("fetch_image", True),
])
def test_a_killed_image_stub_is_replaced_and_no_answer_is_wrong(
    server, image_server, photo, model, by_url
) -> None:
    item = image_server.url("/img/photo.jpg") if by_url else photo
    with server.client("grpc") as c:
        want = c.embed_images(CLIP_MODEL, [item])[0]

    def call(c):
        return c.embed_images(CLIP_MODEL, [item])

    load, seconds, stats = _run(server, call, lambda got: np.abs(got[0] - want).max() <= 1e-6,
                                model)
    print(f"\nkill -9 {model}: {stats}")
    assert stats["healthy_before"] and stats["healthy_at_end"]
    assert stats["unhealthy_s"] > 0, "the health check never saw the dead stub"
    assert not load.wrong
    assert seconds <= RECOVERY_S
    assert stats["failed_sent_after_recovery"] == 0


@pytest.fixture(scope="module")
def image_server():
    from tests.http_servers import ImageServer

    with ImageServer({"photo.jpg": sample_images()["photo.jpg"]}) as srv:
        yield srv
