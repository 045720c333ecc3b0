"""A Python-backend stub killed under load is replaced within seconds (``StubWatch``).

The fault as the OOM killer deals it: ``kill -9`` of one stub while 8 clients send
requests. Before the watch, the stub was never started again and every request routed
to its instance failed for as long as anyone watched, with every health probe green.
Here, for a stub of each kind (tokenizer, encoder, image preprocessing, URL fetcher):
the model is reloaded with fresh stubs within 10 s, no answer is ever wrong, and no
request sent after the reload fails. The container health check (deploy/healthcheck.py)
is healthy before the kill, unhealthy while the model waits for its reload, and healthy
again after. The shipped models.toml is served too, with its two encoder processes: there
each kind of stub is killed in turn (both encoder instances, tokenize, image admit and
preprocess), and within 10 s the model runs its full set of stubs again, no more, and 40
later requests all get the right answer.

The server is ``generator serve`` (tests/integration/supervised.py), because a kill can
end ``tritonserver`` itself: Triton 2.51 aborts with
``boost::interprocess::lock_exception`` when the stub dies holding a lock in the shared
memory it shares with the server (seen in CI on the URL fetcher's stub, and here on the
first of 25 kills in one run and on none of 25 in the next). Then the outcome checked is
the supervisor's: the server is started again and answers right within
``RESTART_S``, with the same rules on wrong answers, failures and health. Any other
death of the server fails the test. ``test_a_crashed_server_is_restarted_by_serve``
causes that abort's end (SIGABRT) on purpose, so the restart is tested in every run.
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

from embed_runtime.ops.stub_watch import running_stubs, stub_processes
from tests.healthcheck_module import load_healthcheck
from tests.integration.clip_fixture import CLIP_MODEL, sample_images
from tests.integration.conftest import ADMIN_KEY, TEXT_MODEL
from tests.integration.supervised import Supervised, start_supervised

pytestmark = pytest.mark.integration

RECOVERY_S = 10.0
# Every request in flight when a stub dies ends (an error, or its right answer) within
# this long of the kill: the target is 5 s (measured ~1-2 s: Triton's backend sees the
# dead stub within its 1 s health poll), the bound has room for a loaded 2-core machine.
# Before the fetch stub held its batch, its requests waited for the client's 60 s.
IN_FLIGHT_S = 15.0
RESTART_S = 180.0  # a whole server loading the session's models on 2 busy cores
CLIENTS = 8
AFTER_S = 2.0  # load kept up this long after the recovery
# A gRPC channel that lost its server retries the connection after at most 1 s (the
# client's RECONNECT_BACKOFF_MS) plus gRPC's 20 % jitter: after a restart, requests sent
# within this long may still fail to connect. Twice that, for a retry timer that fires
# late on a busy machine (1.5 s left it 0.3 s).
RECONNECT_S = 2.5
CONNECT_ERRORS = ("failed to connect", "Connection refused")
TRITON_ABORT = "boost::interprocess::lock_exception"
RESTARTED = "starting it again"


@dataclass
class Load:
    """Results of the clients: (sent, finished, error or "") and every wrong answer."""

    results: list[tuple[float, float, str]] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)


_healthcheck = load_healthcheck


@pytest.fixture(scope="module")
def supervised(server, tmp_path_factory) -> Supervised:
    """The session's repository, served by ``generator serve`` for this module alone."""
    serving = start_supervised(server.repo, tmp_path_factory.mktemp("supervised"))
    try:
        assert serving.wait_ready(240), serving.output()[-4000:]
        yield serving
    finally:
        serving.stop()


def _stubs_of(triton_pid: int | None, model: str) -> dict[str, int]:
    if triton_pid is None:
        return {}
    return {i: s.pid for i, s in stub_processes(triton_pid).items() if s.model == model}


def _watch_reloads(health_file: str) -> int:
    """How many reloads the server's stub watch has finished (its health file)."""
    try:
        with open(health_file, encoding="utf-8") as handle:
            return int(json.load(handle).get("reloads", 0))
    except (OSError, ValueError):
        return 0


@dataclass
class Outcome:
    """How the server came back: ``restarted`` when the kill ended ``tritonserver``."""

    seconds: float
    restarted: bool
    stats: dict


def _load(serving: Supervised, call, check, load: Load) -> list[threading.Thread]:
    def client() -> None:
        with serving.client("grpc") as c:
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
                if error:
                    time.sleep(0.01)

    return [threading.Thread(target=client) for _ in range(CLIENTS)]


def _run(serving: Supervised, call, check, kill) -> tuple[Load, Outcome]:
    """Load ``call`` from 8 clients, ``kill()`` something, wait for the server to recover.

    ``kill`` returns the model whose stub it killed (recovered when that stub is back and
    the watch's reload returned), or "" for the server itself (recovered when a new
    ``tritonserver`` is ready with every stub it had).
    """
    load = Load()
    probe_module, port = _healthcheck(), serving.http
    health_file = probe_module.health_file(port)
    reloads_before = _watch_reloads(health_file)
    server_pid = serving.triton_pid()
    stubs_before = set(stub_processes(server_pid))
    health: list[tuple[float, bool]] = []

    def probe() -> None:  # deploy/healthcheck.py's verdict, as Docker's HEALTHCHECK runs it
        while not load.stop.is_set():
            healthy = probe_module.ready(port) and not probe_module.watch_problem(
                probe_module.health_file(port)
            )
            health.append((time.monotonic(), healthy))
            time.sleep(0.05)

    threads = [*_load(serving, call, check, load), threading.Thread(target=probe)]
    for thread in threads:
        thread.start()
    recovered, restarted = None, False
    try:
        time.sleep(1.0)
        killed = time.monotonic()
        model, victim = kill(server_pid)
        while time.monotonic() - killed < RESTART_S:
            now = serving.triton_pid()
            if now != server_pid:
                restarted = True
                if now is not None and serving.ready() and stubs_before <= set(
                        stub_processes(now)):
                    recovered = time.monotonic()
                    break
            elif model:
                # Recovered once the new stub runs and the watch's reload has returned (the
                # model swapped in): the process alone appears while the model still loads.
                stubs = _stubs_of(server_pid, model)
                if (
                    stubs_before <= set(stub_processes(server_pid))
                    and stubs.get(victim[0]) not in (None, victim[1])
                    and _watch_reloads(health_file) > reloads_before
                ):
                    recovered = time.monotonic()
                    break
            time.sleep(0.05)
        time.sleep(AFTER_S)
    finally:
        load.stop.set()
        for thread in threads:
            thread.join(timeout=90)
    output = serving.output()
    assert serving.process.poll() is None, f"generator serve ended:\n{output[-3000:]}"
    assert recovered is not None, f"not recovered after {RESTART_S} s:\n{output[-3000:]}"
    in_flight = [(s, d, e) for s, d, e in load.results if s < killed < d]
    stats = {
        "recovery_s": round(recovered - killed, 2),
        "restarted": restarted,
        "requests": len(load.results),
        "failed": sum(1 for r in load.results if r[2]),
        "failed_sent_after_kill": sum(1 for s, _, e in load.results if e and s > killed),
        "failed_sent_after_recovery": sum(1 for s, _, e in load.results if e and s > recovered),
        "reconnecting": sum(1 for s, _, e in load.results if e and recovered < s
                            <= recovered + RECONNECT_S and any(c in e for c in CONNECT_ERRORS)),
        "slowest_failure_s": round(max((d - s for s, d, e in load.results if e), default=0), 2),
        # requests sent before the kill and still open at it: how long after it they ended
        "in_flight": len(in_flight),
        "in_flight_failed": sum(1 for _, _, e in in_flight if e),
        "in_flight_ended_s": round(max((d - killed for _, d, _ in in_flight), default=0), 2),
        "errors": sorted({e.split(" (")[0][-120:] for _, _, e in load.results if e}),
        "unhealthy_s": round(sum(0.05 for t, ok in health if not ok and t > killed), 2),
        "healthy_before": all(ok for t, ok in health if t < killed),
        "healthy_at_end": bool(health) and health[-1][1],
    }
    return load, Outcome(recovered - killed, restarted, stats)


def _kill_stub(model: str):
    """A ``kill`` for :func:`_run` of the first stub of ``model``; ``kill.region`` its shm."""

    def kill(server_pid: int) -> tuple[str, tuple[str, int]]:
        instance, stub = sorted(
            (i, s) for i, s in stub_processes(server_pid).items() if s.model == model)[0]
        kill.region = stub.region
        os.kill(stub.pid, signal.SIGKILL)
        return model, (instance, stub.pid)

    kill.region = ""
    return kill


def _assert_recovered(serving: Supervised, load: Load, outcome: Outcome, what: str,
                      region: str) -> None:
    print(f"\n{what}: {outcome.stats}")
    if outcome.restarted:  # the kill took tritonserver down: only Triton's known abort
        output = serving.output()
        assert TRITON_ABORT in output and RESTARTED in output, output[-3000:]
    _assert_back(outcome, RESTART_S if outcome.restarted else RECOVERY_S)
    assert not load.wrong
    assert outcome.stats["in_flight_ended_s"] <= IN_FLIGHT_S
    # Triton leaves a dead stub's region in /dev/shm: the watch (or the restart) removes it
    assert region and not os.path.exists(f"/dev/shm/{region}")


def _assert_back(outcome: Outcome, within_s: float) -> None:
    stats = outcome.stats
    assert outcome.seconds <= within_s
    assert stats["healthy_before"] and stats["healthy_at_end"]
    assert stats["unhealthy_s"] > 0, "the health check never saw the fault"
    assert stats["failed_sent_after_recovery"] == stats["reconnecting"]
    assert outcome.restarted or stats["reconnecting"] == 0


@pytest.fixture(scope="module")
def photo() -> bytes:
    return sample_images()["photo.jpg"]


def _text_case(reference):
    text = "Triton batches requests from many clients."
    want = reference.encode([text], normalize_embeddings=True)[0]

    def call(c):
        return c.embed_texts(TEXT_MODEL, [text])

    return call, lambda got: np.abs(got[0] - want).max() <= 1e-5


@pytest.mark.parametrize("step", ["tokenize", "encode"])
def test_a_killed_text_stub_is_replaced_and_no_answer_is_wrong(supervised, reference,
                                                                step) -> None:
    call, check = _text_case(reference)
    model = f"{TEXT_MODEL}_{step}"
    kill = _kill_stub(model)
    load, outcome = _run(supervised, call, check, kill)
    _assert_recovered(supervised, load, outcome, f"kill -9 {model}", kill.region)
    assert outcome.stats["requests"] > outcome.stats["failed"] > 0 or (
        outcome.stats["failed"] == 0)


@pytest.mark.parametrize(("model", "by_url"), [
    (f"{CLIP_MODEL}_preprocess_image", False),
    ("fetch_image", True),
])
def test_a_killed_image_stub_is_replaced_and_no_answer_is_wrong(
    supervised, image_server, photo, model, by_url
) -> None:
    item = image_server.url("/img/photo.jpg") if by_url else photo
    with supervised.client("grpc") as c:
        want = c.embed_images(CLIP_MODEL, [item])[0]

    def call(c):
        return c.embed_images(CLIP_MODEL, [item])

    kill = _kill_stub(model)
    load, outcome = _run(supervised, call, lambda got: np.abs(got[0] - want).max() <= 1e-6,
                         kill)
    _assert_recovered(supervised, load, outcome, f"kill -9 {model}", kill.region)


def test_a_crashed_server_is_restarted_by_serve(supervised, reference) -> None:
    """SIGABRT, as Triton's lock_exception ends: serve starts it again, leaving nothing."""
    call, check = _text_case(reference)
    old: dict = {}

    def kill(server_pid: int) -> tuple[str, None]:
        old["pid"] = server_pid
        old["regions"] = {s.region for s in stub_processes(server_pid).values()}
        os.kill(server_pid, signal.SIGABRT)
        return "", None

    load, outcome = _run(supervised, call, check, kill)
    print(f"\nkill -ABRT tritonserver: {outcome.stats}")
    output = supervised.output()
    assert outcome.restarted
    assert "tritonserver died (signal SIGABRT); starting it again" in output
    _assert_back(outcome, RESTART_S)
    assert not load.wrong
    assert old["regions"] and not any(os.path.exists(f"/dev/shm/{r}") for r in old["regions"])
    assert not stub_processes(old["pid"])  # no stub of the dead server runs on
    with supervised.client("http") as c:
        assert check(c.embed_texts(TEXT_MODEL, ["Triton batches requests from many clients."]))


@pytest.fixture(scope="module")
def image_server():
    from tests.http_servers import ImageServer

    with ImageServer({"photo.jpg": sample_images()["photo.jpg"]}) as srv:
        yield srv


@pytest.fixture(scope="module")
def slow_image_server():
    """``/silent`` holds each response for 30 s: the fetch is in flight until it times out."""
    from tests.http_servers import ImageServer

    with ImageServer({"photo.jpg": sample_images()["photo.jpg"]}, hang_s=30.0) as srv:
        yield srv


def _wait_back(serving: Supervised, server_pid: int, model: str, victim: tuple[str, int],
               health_file: str, reloads_before: int) -> bool:
    """Until the killed stub's model is reloaded (or a restarted server is ready)."""
    deadline = time.monotonic() + RESTART_S
    while time.monotonic() < deadline:
        now = serving.triton_pid()
        if now != server_pid:
            if now is not None and serving.ready():
                return True
        elif (_stubs_of(server_pid, model).get(victim[0]) not in (None, victim[1])
              and _watch_reloads(health_file) > reloads_before):
            return True
        time.sleep(0.1)
    return False


def test_requests_inside_a_killed_fetch_stub_get_an_error_within_seconds(
    supervised, slow_image_server, photo
) -> None:
    """Slow URLs in flight in ``fetch_image`` when it is killed: each gets an error soon.

    Each of 8 clients sends one URL that the local server holds (the fetch would time out
    after the session's read_timeout_s); once the fetch stub is fetching, it is killed.
    Every request must end with an error (never an answer) within IN_FLIGHT_S of the
    kill; before the stub held its batch in ``execute``, they waited for the client's
    60 s deadline.
    """
    health_file = _healthcheck().health_file(supervised.http)
    reloads_before = _watch_reloads(health_file)
    server_pid = supervised.triton_pid()
    results: list[tuple[float, str]] = []  # (ended, error or "")

    def client(i: int) -> None:
        with supervised.client("grpc") as c:
            try:
                c.embed_images(CLIP_MODEL, [slow_image_server.url(f"/silent?in-flight={i}")])
                error = ""
            except Exception as exc:
                error = str(exc)[:300] or type(exc).__name__
            results.append((time.monotonic(), error))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while not any("in-flight" in p for p in list(slow_image_server.httpd.seen)):
        assert time.monotonic() < deadline, "no fetch started"
        time.sleep(0.02)
    time.sleep(0.3)  # inside the fetch: well before its read timeout
    kill = _kill_stub("fetch_image")
    _, victim = kill(server_pid)
    killed = time.monotonic()
    for thread in threads:
        thread.join(timeout=90)
    ended = sorted(round(t - killed, 2) for t, _ in results)
    errors = sorted({e.split(" (")[0][-120:] for _, e in results})
    print(f"\nkill -9 fetch_image with {CLIENTS} slow URLs in flight: ended after {ended} s; "
          f"errors {errors}")
    assert len(results) == CLIENTS
    assert all(error for _, error in results), "a request in flight was answered"
    assert max(ended) <= IN_FLIGHT_S
    assert _wait_back(supervised, server_pid, "fetch_image", victim, health_file,
                      reloads_before), supervised.output()[-3000:]
    with supervised.client("grpc") as c:  # and the model serves again
        deadline = time.monotonic() + RECOVERY_S
        while True:
            try:
                got = c.embed_images(CLIP_MODEL, [slow_image_server.url("/img/photo.jpg")])
                break
            except Exception:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert got.shape[0] == 1


# --- models.toml as shipped: two encoder processes, admitting steps in front -------------

# The stubs killed in turn on one server, each with the ensemble a request goes through.
# The first as the server turns ready, before the watch's first look (a stub it had not
# seen was never replaced). The encoder's instance 1 after its instance 0: Triton keeps
# the stub of instance 1 of the version the first reload replaced running under the new
# one's name, which hid this second death from the watch.
SHIPPED_KILLS = [
    (f"{TEXT_MODEL}_encode_0_0", TEXT_MODEL),
    (f"{TEXT_MODEL}_encode_0_1", TEXT_MODEL),
    (f"{TEXT_MODEL}_tokenize_0_0", TEXT_MODEL),
    (f"{CLIP_MODEL}_admit_image_0_0", CLIP_MODEL),
    (f"{CLIP_MODEL}_preprocess_image_0_0", CLIP_MODEL),
]
LATER_REQUESTS = 40


@pytest.fixture(scope="module")
def shipped_supervised(tmp_path_factory) -> Supervised:
    """The repository of models.toml as shipped, served by ``generator serve``."""
    from generator.build import build_repository
    from tests.integration.test_shipped_manifest import _shipped_manifest

    manifest = _shipped_manifest(tmp_path_factory)
    base = tmp_path_factory.mktemp("shipped-stubs")
    build_repository(manifest, base / "model_repository", log=lambda _msg: None)
    serving = start_supervised(base / "model_repository", base / "work",
                               manifest=manifest.path)
    try:
        assert serving.wait_ready(240), serving.output()[-4000:]
        yield serving
    finally:
        serving.stop()


def _started(pid: int) -> int:
    """When the process started, in clock ticks since boot (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


def _instances(serving: Supervised, model: str) -> list[str]:
    """The instance names of ``model``'s config (``<model>_<group>_<index>``)."""
    import urllib.request

    request = urllib.request.Request(f"http://127.0.0.1:{serving.http}/v2/models/{model}/config",
                                     headers={"X-Admin-Key": ADMIN_KEY})
    with urllib.request.urlopen(request, timeout=10) as response:
        groups = json.load(response).get("instance_group", [])
    return sorted(f"{model}_{g}_{i}" for g, group in enumerate(groups)
                  for i in range(int(group.get("count", 1))))


def _wait_stubs(serving: Supervised, server_pid: int, model: str, done, since: float,
                what: str) -> float:
    """Seconds from ``since`` until ``done(stubs of model)``; at most RECOVERY_S."""
    while not done(stubs := [s for s in running_stubs(server_pid) if s.model == model]):
        assert serving.triton_pid() == server_pid, serving.output()[-3000:]
        assert time.monotonic() - since < RECOVERY_S, (
            f"{what}: {sorted((s.instance, s.pid) for s in stubs)}\n{serving.output()[-3000:]}")
        time.sleep(0.1)
    return time.monotonic() - since


@pytest.mark.parametrize(("instance", "ensemble"), SHIPPED_KILLS,
                         ids=[k[0] for k in SHIPPED_KILLS])
def test_a_killed_stub_of_a_shipped_model_is_replaced_and_every_later_request_succeeds(
    shipped_supervised, photo, instance, ensemble
) -> None:
    """kill -9 of one stub: within 10 s the watch has reloaded the model, whose every
    instance runs a new stub, and 40 requests all get the right answer; within 10 s more
    the replaced version's stubs are ended, so the model runs its set of stubs, no more.
    """
    serving, text = shipped_supervised, "Triton batches requests from many clients."
    model = instance.rsplit("_", 2)[0]

    def call(c):
        if ensemble == TEXT_MODEL:
            return c.embed_texts(ensemble, [text])
        return c.embed_images(ensemble, [photo])

    with serving.client("grpc") as c:
        want = call(c)[0]
    expected = _instances(serving, model)
    health_file = _healthcheck().health_file(serving.http)
    reloads = _watch_reloads(health_file)
    server_pid = serving.triton_pid()
    before = [s for s in running_stubs(server_pid) if s.model == model]
    victim = max((s for s in before if s.instance == instance),
                 key=lambda s: _started(s.pid))  # where an old one shares the name: the new
    os.kill(victim.pid, signal.SIGKILL)
    killed = time.monotonic()
    back_s = _wait_stubs(serving, server_pid, model, lambda stubs: (
        _watch_reloads(health_file) > reloads
        and sorted({s.instance for s in stubs if s not in before}) == expected
    ), killed, f"{instance} not replaced (watch reloads {reloads} before the kill)")
    results: list[str] = []

    def client() -> None:
        with serving.client("grpc") as c:
            for _ in range(LATER_REQUESTS // 4):
                try:
                    right = np.abs(call(c)[0] - want).max() <= 1e-5
                    results.append("" if right else "wrong answer")
                except Exception as exc:
                    results.append(str(exc)[:200] or type(exc).__name__)

    threads = [threading.Thread(target=client) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    alone_s = _wait_stubs(serving, server_pid, model, lambda stubs: sorted(
        s.instance for s in stubs) == expected, killed + back_s, "old stubs left running")
    print(f"\nkill -9 {instance}: replaced after {back_s:.2f} s, the old stubs ended "
          f"{alone_s:.2f} s later; {results.count('')} of {len(results)} later requests right")
    assert results == [""] * LATER_REQUESTS, sorted(set(results))
