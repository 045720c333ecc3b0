"""``generator serve``'s supervisor: drain order, signals, exit status, health check.

The drain against a real server under load is tests/integration/test_drain.py; here the
logic, with a fake repository API and real child processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from generator import supervisor as sup
from tests.healthcheck_module import load_healthcheck

_healthcheck = load_healthcheck


class FakeApi:
    """The repository API of a server whose unloads take ``polls`` index reads."""

    def __init__(self, models: dict[str, str], polls: int = 2, stuck: str = ""):
        self.state = dict.fromkeys(models, "READY")
        self.platform = models
        self.polls, self.stuck = polls, stuck
        self.pending: dict[str, int] = {}
        self.unloads: list[str] = []

    def call(self, path: str, body: dict | None = None) -> bytes:
        if path == "/v2/repository/index":
            for model in list(self.pending):
                self.pending[model] -= 1
                if self.pending[model] <= 0 and model != self.stuck:
                    self.state[model] = "UNAVAILABLE"
                    del self.pending[model]
            return json.dumps([{"name": m, "state": s} for m, s in self.state.items()]).encode()
        if path.endswith("/config"):
            return json.dumps({"platform": self.platform[path.split("/")[3]]}).encode()
        if path.endswith("/unload"):
            model = path.split("/")[4]
            assert body == {}
            self.unloads.append(model)
            self.state[model] = "UNLOADING"
            self.pending[model] = self.polls
            return b""
        raise AssertionError(path)


MODELS = {"t": "ensemble", "t_encode": "", "t_tokenize": "", "model_manager": "",
          "c_image": "ensemble", "c_preprocess": "onnxruntime_onnx"}


def test_ensembles_unload_first_then_their_steps_then_the_manager() -> None:
    api, lines = FakeApi(MODELS), []
    assert sup.Drainer(api, lines.append).unload_all(time.monotonic() + 5)
    assert api.unloads == ["c_image", "t", "c_preprocess", "t_encode", "t_tokenize",
                           "model_manager"]
    assert lines == ["drain: unloaded c_image, t",
                     "drain: unloaded c_preprocess, t_encode, t_tokenize",
                     "drain: unloaded model_manager"]
    assert set(api.state.values()) == {"UNAVAILABLE"}


def test_steps_are_not_unloaded_while_an_ensemble_still_holds_requests() -> None:
    api = FakeApi(MODELS, stuck="t")
    assert not sup.Drainer(api, lambda _m: None).unload_all(time.monotonic() + 0.3)
    assert api.unloads == ["c_image", "t"]


def test_models_already_unloaded_are_left_alone() -> None:
    api = FakeApi({"t": "ensemble", "old": ""})
    api.state["old"] = "UNAVAILABLE"
    assert sup.Drainer(api, lambda _m: None).unload_all(time.monotonic() + 5)
    assert api.unloads == ["t"]


def test_drain_settings_come_from_the_environment_and_refuse_nonsense() -> None:
    assert sup.DrainSettings.from_env({}) == sup.DrainSettings(0.0, 20.0)
    got = sup.DrainSettings.from_env({sup.DELAY_ENV: "5", sup.TIMEOUT_ENV: "40.5"})
    assert got == sup.DrainSettings(5.0, 40.5)
    for bad in ("-1", "soon", "99999"):
        with pytest.raises(ValueError, match=sup.DELAY_ENV):
            sup.DrainSettings.from_env({sup.DELAY_ENV: bad})


CHILD = """
import os, signal, sys, time
mode, here = sys.argv[1], sys.argv[2]

def seen():  # until the supervisor's liveness check has seen this process up
    while True:
        try:
            with open(os.path.join(here, "seen")) as handle:
                if handle.read() == str(os.getpid()):
                    return
        except FileNotFoundError:
            pass
        time.sleep(0.01)

if mode == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
elif mode == "hang":  # a start that never listens and uses no CPU (futex waits)
    time.sleep(600)
elif mode.startswith("busy:"):  # a slow start: CPU, no port, then a failure of its own
    end = time.monotonic() + float(mode[5:])
    while time.monotonic() < end:
        pass
    sys.exit(3)
elif mode == "exit3":
    sys.exit(3)
elif mode == "kill9":
    os.kill(os.getpid(), 9)
elif mode == "abort":  # up, then the crash Triton's lock_exception ends in
    seen(); os.abort()
elif mode.startswith("orphan:"):  # a "stub" that outlives its aborted server
    import subprocess
    stub = subprocess.Popen(["sleep", "60"])
    open(mode[7:], "w").write(str(stub.pid))
    seen(); os.abort()
open(os.path.join(here, "up"), "w").close()
print("up", flush=True)
time.sleep(60)
"""


class FakeDrainer:
    def __init__(self, marker: str, complete: bool = True):
        self.marker, self.complete = marker, complete
        self.marker_seen = False

    def unload_all(self, deadline: float) -> bool:
        self.marker_seen = os.path.exists(self.marker)
        return self.complete


def _supervisor(tmp_path: Path, mode: str, complete: bool = True, delay: float = 0.0,
                restarts: int = sup.DEFAULT_MAX_RESTARTS, live: bool = False,
                stall_s: float = sup.DEFAULT_STALL_S):
    health = str(tmp_path / "health.json")
    lines: list[str] = []

    def is_live() -> bool:  # and tells the child it was seen up: no sleep races the check
        (tmp_path / "seen.tmp").write_text(str(run.child.pid))
        (tmp_path / "seen.tmp").replace(tmp_path / "seen")
        return live

    run = sup.Supervisor([sys.executable, "-c", CHILD, mode, str(tmp_path)], dict(os.environ),
                         "127.0.0.1:1", "k" * 20, health, sup.DrainSettings(delay, 10.0),
                         lines.append, restarts=restarts, is_live=is_live, stall_s=stall_s)
    run.drainer = FakeDrainer(sup.drain_marker(health), complete)
    return run, lines


def _run_with_signal(run: sup.Supervisor, signum: int, after_s: float = 0.5,
                     when: Callable[[], bool] = lambda: True) -> int:
    """``run.run()``, sent ``signum`` ``after_s`` s in and once ``when()`` holds."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    stop = threading.Event()

    def send() -> None:
        deadline = time.monotonic() + 60
        if stop.wait(after_s):
            return
        while not when():
            if stop.wait(0.02) or time.monotonic() > deadline:
                return
        os.kill(os.getpid(), signum)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        return run.run()
    finally:
        stop.set()
        sender.join()
        for s, handler in saved.items():
            signal.signal(s, handler)


def test_sigterm_marks_draining_waits_the_delay_then_unloads_and_exits_zero(tmp_path) -> None:
    run, lines = _supervisor(tmp_path, "plain", delay=0.4)
    start = time.monotonic()
    assert _run_with_signal(run, signal.SIGTERM) == 0
    assert time.monotonic() - start >= 0.9
    assert run.drainer.marker_seen
    assert not os.path.exists(sup.drain_marker(str(tmp_path / "health.json")))
    assert lines[0] == "drain: SIGTERM: health check failing, serving 0.4 s more"


def test_sigint_drains_without_the_delay(tmp_path) -> None:
    run, lines = _supervisor(tmp_path, "plain", delay=30)
    start = time.monotonic()
    assert _run_with_signal(run, signal.SIGINT) == 0
    assert time.monotonic() - start < 10
    assert lines[0] == "drain: SIGINT: health check failing"


def test_a_server_that_ignores_sigterm_after_a_full_drain_is_killed_as_idle(tmp_path) -> None:
    run, _ = _supervisor(tmp_path, "ignore")
    start = time.monotonic()
    up = tmp_path / "up"  # written once the child ignores SIGTERM
    assert _run_with_signal(run, signal.SIGTERM, when=up.exists) == 0
    assert sup.STOP_WAIT_S <= time.monotonic() - start < sup.STOP_WAIT_S + 5


def test_a_server_that_never_came_up_ends_serve_with_its_status(tmp_path) -> None:
    assert _supervisor(tmp_path, "exit3", live=True)[0].run() == 3
    assert _supervisor(tmp_path, "kill9", live=True)[0].run() == 128 + signal.SIGKILL
    run, lines = _supervisor(tmp_path, "abort", live=False)  # up, never live
    assert run.run() == 128 + signal.SIGABRT
    assert lines == []


def test_a_server_that_crashes_after_coming_up_is_restarted_until_the_budget(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(sup, "RESTART_DELAY_S", 0.05)
    run, lines = _supervisor(tmp_path, "abort", restarts=2, live=True)
    pids = []
    started = sup.Supervisor._serve_once

    def serve_once(self):
        result = started(self)
        pids.append(self.child.pid)
        return result

    monkeypatch.setattr(sup.Supervisor, "_serve_once", serve_once)
    assert run.run() == 128 + signal.SIGABRT
    assert len(set(pids)) == 3  # the first server and two restarts
    assert lines == [
        "tritonserver died (signal SIGABRT); starting it again in 0.05 s "
        "(restart 1 of at most 2 within 600 s)",
        "tritonserver died (signal SIGABRT); starting it again in 0.05 s "
        "(restart 2 of at most 2 within 600 s)",
        "tritonserver died (signal SIGABRT); not restarted: 2 restarts within the last "
        "600 s (EMBED_MAX_RESTARTS=2)",
    ]


def test_restarts_older_than_the_window_do_not_count(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(sup, "RESTART_DELAY_S", 0.0)
    run, lines = _supervisor(tmp_path, "abort", restarts=1, live=True)
    run.restarts = [time.monotonic() - sup.RESTART_WINDOW_S - 1]
    assert run._restart(-signal.SIGSEGV)
    assert not run._restart(-signal.SIGSEGV)
    assert lines[0].startswith("tritonserver died (signal SIGSEGV); starting it again")
    assert "not restarted: 1 restarts" in lines[1]


def test_zero_restarts_and_a_clean_exit_end_serve_at_once(tmp_path) -> None:
    run, lines = _supervisor(tmp_path, "abort", restarts=0, live=True)
    assert run.run() == 128 + signal.SIGABRT
    assert "not restarted" in lines[0]
    assert sup.describe_status(0) == "exit status 0"
    assert sup.describe_status(-99) == "signal 99"


def test_a_signal_during_the_restart_delay_ends_serve(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(sup, "RESTART_DELAY_S", 60.0)
    run, lines = _supervisor(tmp_path, "abort", restarts=3, live=True)
    start = time.monotonic()
    in_delay = lambda: bool(lines)  # noqa: E731 - the restart line comes before the delay
    assert _run_with_signal(run, signal.SIGTERM, after_s=0, when=in_delay) == 128 + signal.SIGABRT
    assert time.monotonic() - start < 30  # not the 60 s delay
    assert len(lines) == 1 and "starting it again" in lines[0]


def test_processes_the_dead_server_left_running_are_killed(tmp_path) -> None:
    pid_file = tmp_path / "stub.pid"
    run, _ = _supervisor(tmp_path, f"orphan:{pid_file}", restarts=0, live=True)
    assert run.run() == 128 + signal.SIGABRT
    stub = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{stub}/stat", encoding="ascii") as handle:
                if handle.read().rsplit(")", 1)[-1].split()[0] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the orphan {stub} still runs")


def test_max_restarts_come_from_the_environment_and_refuse_nonsense() -> None:
    assert sup.max_restarts({}) == sup.DEFAULT_MAX_RESTARTS
    assert sup.max_restarts({sup.RESTARTS_ENV: "0"}) == 0
    assert sup.max_restarts({sup.RESTARTS_ENV: " 7 "}) == 7
    for bad in ("-1", "2.5", "many", "101"):
        with pytest.raises(ValueError, match=sup.RESTARTS_ENV):
            sup.max_restarts({sup.RESTARTS_ENV: bad})


def test_the_dead_servers_shared_memory_is_removed_and_nothing_else(tmp_path) -> None:
    from embed_runtime.ops.busy_board import board_dir, board_prefix

    shm = tmp_path / "shm"
    shm.mkdir()
    mine = [shm / "embed-shm-abc-1111", shm / "embed-shm-abc-2222"]
    others = [shm / "embed-shm-abd-3333", shm / "triton_python_backend_shm_region_x"]
    for path in mine + others:
        path.write_bytes(b"x" * 8192)
    dead_pid = 2**22 + 11  # beyond pid_max: no live process owns these boards
    boards = [Path(board_dir()) / f"{board_prefix(dead_pid)}m-1",
              Path(board_dir()) / f"{board_prefix(dead_pid + 1)}m-1"]
    for path in boards:
        path.write_bytes(b"\0" * 64)
    lines: list[str] = []
    run = sup.Supervisor(["true"], {}, "127.0.0.1:1", "k" * 20, str(tmp_path / "h.json"),
                         sup.DrainSettings(), lines.append, shm_prefix="embed-shm-abc-",
                         shm_dir=str(shm))
    try:
        removed = run.remove_leftovers(dead_pid)
        assert sorted(removed) == sorted(str(p) for p in [*mine, boards[0]])
        assert all(p.exists() for p in [*others, boards[1]])
        assert len(lines) == 1
        assert lines[0].startswith("removed 3 shared-memory files the server left behind (")
    finally:
        for path in boards:
            path.unlink(missing_ok=True)


def test_the_health_check_fails_while_draining_and_not_for_a_dead_drainer(tmp_path) -> None:
    check = _healthcheck()
    health = str(tmp_path / "h.json")
    assert check.draining(health) == ""
    marker = Path(sup.drain_marker(health))
    marker.write_text(json.dumps({"pid": os.getpid(), "since": 0, "signal": "SIGTERM"}))
    assert "draining since" in check.draining(health)
    marker.write_text(json.dumps({"pid": 2**22 + 7, "since": 0, "signal": "SIGTERM"}))
    assert check.draining(health) == ""
    assert check.DRAIN_SUFFIX == sup.DRAIN_SUFFIX


def test_liveness_ignores_a_degraded_model_but_not_failing_reloads(tmp_path) -> None:
    check = _healthcheck()
    path = tmp_path / "h.json"
    state = {"server_pid": os.getpid(), "updated": 1e18, "degraded": {"m": ["m_0_0"]},
             "failures_in_a_row": 0}
    path.write_text(json.dumps(state))
    assert "reload pending" in check.watch_problem(str(path), now=1e18)
    assert check.watch_problem(str(path), now=1e18, live=True) == ""
    path.write_text(json.dumps({**state, "failures_in_a_row": 3}))
    assert "failed in a row" in check.watch_problem(str(path), now=1e18, live=True)
    assert check.main(["--bogus"]) == 2


def test_a_stopped_test_server_leaves_no_stub_and_no_shared_memory(tmp_path) -> None:
    """``TritonProcess.stop`` (tests, benchmarks) cleans up as ``generator serve`` does."""
    import secrets
    import subprocess

    from generator.triton_local import TritonLaunch, TritonProcess

    launch = TritonLaunch(tmp_path, shm_prefix=f"embed-shm-unit{secrets.token_hex(4)}-")
    region = Path("/dev/shm") / f"{launch.shm_prefix}region"
    stub_pid = tmp_path / "stub.pid"
    server = (  # a "server" that ignores SIGINT, with a "stub" in its process group
        "import signal, subprocess, time\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        f"open({str(region)!r}, 'wb').write(b'x' * 4096)\n"
        f"open({str(stub_pid)!r}, 'w').write(str(subprocess.Popen(['sleep', '60']).pid))\n"
        "time.sleep(60)\n"
    )
    process = TritonProcess(launch, tmp_path)
    process.process = subprocess.Popen([sys.executable, "-c", server], start_new_session=True)
    deadline = time.monotonic() + 10
    while not (stub_pid.exists() and stub_pid.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        process.stop(timeout_s=1.0)
        stub = int(stub_pid.read_text())
        state = Path(f"/proc/{stub}/stat")
        deadline = time.monotonic() + 10  # the stub was killed: wait for it to be gone
        while _running(state) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(state)
        assert not region.exists()
    finally:
        region.unlink(missing_ok=True)


def _running(state: Path) -> bool:
    """Whether the process of ``/proc/<pid>/stat`` ``state`` exists and is not a zombie."""
    try:
        return state.read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


# --- a start that stops making progress ----------------------------------------------------


def test_start_watch_sees_progress_in_cpu_time_and_names_a_stall() -> None:
    now, used = [0.0], [5.0]
    watch = sup.StartWatch(10.0, lambda: used[0], lambda: now[0])
    now[0], used[0] = 9.9, 5.05
    assert watch.stalled() is None  # under the window, whatever the CPU
    now[0], used[0] = 10.0, 5.2  # >= 1 % of a core over the window: progress, window anew
    assert watch.stalled() is None
    now[0], used[0] = 19.9, 5.25
    assert watch.stalled() is None
    now[0] = 20.5
    why = watch.stalled()
    assert why is not None and why.startswith("no progress for 10 s (0.05 s of CPU")
    assert sup.STALL_ENV in why


def test_group_cpu_seconds_counts_a_busy_process_group() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "while True: pass"], start_new_session=True
    )
    try:
        deadline = time.monotonic() + 60
        while sup.group_cpu_seconds(child.pid) < 0.2:
            assert time.monotonic() < deadline, "a busy loop used no CPU for 60 s"
            time.sleep(0.05)
        assert sup.group_cpu_seconds(os.getpgrp() + 10**7) == 0.0  # no such group
    finally:
        child.kill()
        child.wait()


def test_a_start_that_hangs_is_killed_and_started_again_within_the_budget(tmp_path) -> None:
    run, lines = _supervisor(tmp_path, "hang", restarts=1, stall_s=1.5)
    status = run.run()
    assert status == 128 + signal.SIGKILL
    stalls = [line for line in lines if line.startswith("tritonserver start stalled: no progress")]
    assert len(stalls) == 2, lines
    assert any("start stalled; starting it again" in line for line in lines), lines
    assert any("start stalled; not restarted: 1 restarts" in line for line in lines), lines


def test_a_slow_start_that_uses_cpu_is_not_cut(tmp_path) -> None:
    run, lines = _supervisor(tmp_path, "busy:4", stall_s=1.0)
    assert run.run() == 3  # its own failure, after four windows with no port
    assert not [line for line in lines if "stalled" in line], lines


def test_the_stall_window_comes_from_the_environment_and_refuses_nonsense() -> None:
    assert sup.start_stall_s({}) == sup.DEFAULT_STALL_S
    assert sup.start_stall_s({sup.STALL_ENV: "0"}) == 0.0
    with pytest.raises(ValueError, match=sup.STALL_ENV):
        sup.start_stall_s({sup.STALL_ENV: "-5"})
