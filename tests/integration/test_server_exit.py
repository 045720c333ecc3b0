"""No process outlives its server, however the server is stopped (issue 46, item 7).

Triton 2.51's stub, once its server has gone, first sends the log lines it has queued
and waits for each to be acknowledged: a line logged as the server dies kept the stub
running forever, parent 1, ignoring SIGTERM (``embed_runtime/ops/server_exit.py``). It
was ``model_manager``'s stub, the one that logs on its own. So each stop here comes while
clients send ``model_manager`` requests without the admin key, each refused with a
logged warning: lines in flight when the server dies.

The stops users use: Ctrl-C (SIGINT to ``generator serve``'s process group) and SIGTERM
to ``generator serve``; SIGTERM to its process group and SIGKILL 2 s later, while it
still serves (what a supervisor does, and ``docker stop`` to a container's main process
after its timeout); SIGKILL of ``tritonserver`` under ``generator serve`` (which starts
it again) and of a ``tritonserver`` started alone (as the tests, the benchmarks and a
user's own launcher start it). After each, within ``STOP_S``, no process of that server
is left: ``tritonserver``, its stubs and their reaper (any process whose command line
names the served repository).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from generator.admin import ADMIN_HEADER
from generator.build import build_repository
from generator.manifest import load_manifest
from tests.integration.conftest import ADMIN_KEY, serve, write_manifest
from tests.integration.supervised import Supervised, start_supervised
from tests.st_factory import STATIC_VARIANTS, build_static_model, manifest_entry

pytestmark = pytest.mark.integration

STOP_S = 30.0  # generous: a busy 2-core machine (measured: gone within 1 s)
START_S = 240.0
KILL_AFTER_S = 2.0  # the supervisor's SIGKILL after its SIGTERM
DRAIN_DELAY_S = "5"  # so that the SIGKILL 2 s later lands while the server still serves
SEEN_LIVE_S = 3.0
FROZEN_S = 0.5  # the server frozen this long before a kill (_freeze)
LIST = {  # model_manager's list: a readiness question to the server per ensemble
    "inputs": [
        {"name": "REQUEST", "shape": [1], "datatype": "BYTES", "data": ['{"action": "list"}']}
    ]
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """A tiny static model and ``model_manager``, built once (``<base>/model_repository``)."""
    base = tmp_path_factory.mktemp("server-exit")
    variant = STATIC_VARIANTS[0]
    folder = build_static_model(variant, base / "models" / variant.name)
    write_manifest(base / "models.toml", {"models": [manifest_entry(variant, folder)]})
    repo = base / "model_repository"
    build_repository(load_manifest(base / "models.toml"), repo, log=lambda _m: None)
    return repo


def _cmdline(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            args = handle.read().split(b"\0")
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            zombie = handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return []
    return [] if zombie else args


def _processes(repo: Path) -> dict[int, list[bytes]]:
    """Running processes whose command line names ``repo``, with their arguments."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            args = _cmdline(int(entry))
            if any(str(repo).encode() in a for a in args):
                found[int(entry)] = args
    return found


def _server_of(args: list[bytes]) -> int | None:
    """The server a stub (its 6th argument) or a reaper (its 5th) belongs to."""
    if args and args[0].endswith(b"triton_python_backend_stub") and len(args) > 5:
        return int(args[5])
    if len(args) > 4 and args[3].endswith(b"server_exit.py"):
        return int(args[4])
    return None


def _wait_gone(find: Callable[[], dict[int, list[bytes]]]) -> dict[int, list[bytes]]:
    deadline = time.monotonic() + STOP_S
    while (left := find()) and time.monotonic() < deadline:
        time.sleep(0.3)
    return left


class ManagerClients:
    """Clients that keep ``model_manager`` answering until stopped (module doc).

    Half list the models with the admin key (the stub asks the server whether each
    ensemble is ready, and waits for the answer), half send no key (refused, and the stub
    logs a warning).
    """

    def __init__(self, http: int):
        self.url = f"http://127.0.0.1:{http}/v2/models/model_manager/infer"
        self.stop = threading.Event()
        self.answered = 0
        self.threads = [
            threading.Thread(target=self._send, args=({ADMIN_HEADER: ADMIN_KEY},)),
            threading.Thread(target=self._send, args=({},)),
        ]

    def _send(self, headers: dict[str, str]) -> None:
        body = json.dumps(LIST).encode()
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while not self.stop.is_set():
            request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
            try:
                opener.open(request, timeout=5).close()
                self.answered += 1
            except urllib.error.HTTPError:
                self.answered += 1  # refused: no key
            except OSError:
                pass  # refused once it stops

    def __enter__(self) -> ManagerClients:
        for thread in self.threads:
            thread.start()
        deadline = time.monotonic() + 30
        while self.answered < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        return self

    def __exit__(self, *_exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)


@pytest.fixture
def supervised(repo, tmp_path) -> Iterator[Callable[..., Supervised]]:
    """Starts ``generator serve --no-build`` of ``repo``; stops what is left at the end."""
    started: list[Supervised] = []

    def start(**env: str) -> Supervised:
        serving = start_supervised(repo, tmp_path / f"serve-{len(started)}", env)
        started.append(serving)
        assert serving.wait_ready(START_S), serving.output()[-4000:]
        return serving

    yield start
    for serving in started:
        serving.stop()
    for pid in _processes(repo):  # what a failed test left, so the next starts clean
        os.kill(pid, signal.SIGKILL)


def _freeze(pid: int) -> None:
    """Stop ``pid`` answering (as a swamped or hung server does) while a line is on its way.

    The stub's line about the request it is answering waits for the frozen server's
    acknowledgement; the kill that follows makes sure it never comes. Without this the
    kill lands on a line in flight about one time in four (measured).
    """
    os.kill(pid, signal.SIGSTOP)
    time.sleep(FROZEN_S)


def _stop_ctrl_c(serving: Supervised) -> None:
    os.killpg(serving.process.pid, signal.SIGINT)


def _stop_sigterm(serving: Supervised) -> None:
    os.kill(serving.process.pid, signal.SIGTERM)


def _stop_term_then_kill_group(serving: Supervised) -> None:
    _freeze(serving.triton_pid())
    os.killpg(serving.process.pid, signal.SIGTERM)
    time.sleep(KILL_AFTER_S)
    os.killpg(serving.process.pid, signal.SIGKILL)


STOPS = {
    "ctrl-c": ({}, _stop_ctrl_c),
    "sigterm": ({}, _stop_sigterm),
    "term-then-kill-group": ({"EMBED_DRAIN_DELAY_S": DRAIN_DELAY_S}, _stop_term_then_kill_group),
}


@pytest.mark.parametrize("stop", list(STOPS))
def test_stopping_serve_leaves_no_process_of_the_server(repo, supervised, stop: str) -> None:
    env, stop_it = STOPS[stop]
    serving = supervised(**env)
    stubs = [p for p, a in _processes(repo).items() if _server_of(a) is not None]
    assert len(stubs) >= 2, _processes(repo)  # the model's stubs and model_manager's
    with ManagerClients(serving.http) as clients:
        stop_it(serving)
        serving.process.wait(timeout=STOP_S + 30)
        left = _wait_gone(lambda: _processes(repo))
    assert clients.answered >= 20
    assert not left, f"left after {STOP_S:g} s: {left}\n{serving.output()[-3000:]}"


def test_a_killed_tritonserver_under_serve_leaves_no_process_of_its_own(repo, supervised) -> None:
    serving = supervised()
    old = serving.triton_pid()
    # generator serve restarts a server it has seen live: it looks every 0.5 s, so a
    # kill right after the first ready answer would end it instead.
    time.sleep(SEEN_LIVE_S)
    with ManagerClients(serving.http):
        _freeze(old)
        os.kill(old, signal.SIGKILL)

        def of_old() -> dict[int, list[bytes]]:
            return {p: a for p, a in _processes(repo).items() if p == old or _server_of(a) == old}

        left = _wait_gone(of_old)
    assert not left, f"left after {STOP_S:g} s: {left}\n{serving.output()[-3000:]}"
    assert serving.wait_ready(START_S), serving.output()[-3000:]  # started again


def test_a_killed_lone_tritonserver_leaves_no_process(repo) -> None:
    with serve(load_manifest(repo.parent / "models.toml"), repo.parent) as server:
        pid = server.process.process.pid
        with ManagerClients(server.ports.http) as clients:
            _freeze(pid)
            os.kill(pid, signal.SIGKILL)
            server.process.process.wait(timeout=30)
            left = _wait_gone(lambda: _processes(repo))
        assert clients.answered >= 20
        assert not left, f"left after {STOP_S:g} s: {left}\n{server.process.log_tail()}"
