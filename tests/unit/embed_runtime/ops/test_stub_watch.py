"""The stub watch's decisions on a fake ``/proc``: which stub died, which model to reload."""

from __future__ import annotations

from pathlib import Path

from embed_runtime.ops.stub_watch import (
    RETIRE_AFTER_S,
    Stub,
    StubWatch,
    live_stubs,
    server_http_url,
)
from tests.healthcheck_module import load_healthcheck
from tests.unit.embed_runtime.ops.fake_proc import SERVER, fake_process, fake_stub


def test_live_stubs_are_this_servers_running_instances_only(tmp_path: Path) -> None:
    fake_stub(tmp_path, 10, "m_encode", "m_encode_0_0")
    fake_stub(tmp_path, 11, "m_encode", "m_encode_0_1", state="Z")  # killed, not yet reaped
    fake_stub(tmp_path, 12, "m_encode", "m_encode")  # the short-lived config-completion stub
    fake_stub(tmp_path, 13, "other", "other_0_0", parent=999)  # another server's
    fake_process(tmp_path, 14, ["/bin/sleep", "5"])
    (tmp_path / "self").mkdir()
    assert live_stubs(SERVER, str(tmp_path)) == {"m_encode_0_0": "m_encode"}


def _watch(proc: Path, ready: set[str]) -> tuple[StubWatch, list[str]]:
    reloads: list[str] = []
    watch = StubWatch(SERVER, lambda m: m in ready, reloads.append, "model_manager", str(proc))
    return watch, reloads


def _new_version(proc: Path, instances: int, reloads: list[str]):
    """A ``reload``: Triton's load returns once the new version's stubs run."""

    def reload(model: str) -> None:
        reloads.append(model)
        for index in range(instances):
            pid = 100 * len(reloads) + index
            fake_stub(proc, pid, model, f"{model}_0_{index}", region=f"r-{pid}")

    return reload


def test_a_vanished_instance_of_a_ready_model_reloads_that_model_once(tmp_path: Path) -> None:
    fake_stub(tmp_path, 10, "m_encode", "m_encode_0_0")
    fake_stub(tmp_path, 11, "m_encode", "m_encode_0_1")
    fake_stub(tmp_path, 12, "m_tokenize", "m_tokenize_0_0")
    fake_stub(tmp_path, 13, "model_manager", "model_manager_0_0")
    reloads: list[str] = []
    watch = StubWatch(SERVER, lambda m: m != "model_manager", _new_version(tmp_path, 2, reloads),
                      "model_manager", str(tmp_path), kill=lambda pid: None)
    assert watch.poll() == [] and "model_manager_0_0" not in watch.seen
    (tmp_path / "11" / "stat").write_text("11 (x) Z 4242")  # kill -9: a zombie
    assert watch.poll() == ["m_encode"] and reloads == ["m_encode"]
    assert watch.events[0][:2] == ("m_encode", ("m_encode_0_1",))
    assert watch.poll() == []  # the new stubs are seen: no second reload
    assert watch.seen["m_encode_0_1"].pid == 101
    (tmp_path / "101" / "stat").write_text("101 (x) Z 4242")  # a new stub dies as well
    assert watch.poll() == ["m_encode"] and watch.seen["m_encode_0_1"].pid == 201


def test_a_stub_that_died_before_the_first_look_is_replaced(tmp_path: Path) -> None:
    """Its model's config names it; the process list never showed it to the watch."""
    fake_stub(tmp_path, 11, "m", "m_0_1")
    answers = [None, {"m": {"m_0_0", "m_0_1"}, "model_manager": {"model_manager_0_0"}}]
    reloads: list[str] = []
    watch = StubWatch(SERVER, lambda m: True, _new_version(tmp_path, 2, reloads),
                      "model_manager", str(tmp_path), configured=lambda: answers.pop(0),
                      kill=lambda pid: None)
    assert watch.poll() == [] and answers  # the server is not ready yet: asked again
    assert watch.poll() == ["m"] and watch.events[0][:2] == ("m", ("m_0_0",))
    assert watch.poll() == [] and watch.configured is None  # asked once it answered


def test_a_model_unloaded_on_purpose_is_left_alone(tmp_path: Path) -> None:
    fake_stub(tmp_path, 10, "gone", "gone_0_0")
    watch, reloads = _watch(tmp_path, set())
    watch.poll()
    (tmp_path / "10" / "cmdline").unlink()
    (tmp_path / "10" / "stat").unlink()
    assert watch.poll() == [] and reloads == [] and watch.seen == {}


def test_a_failed_reload_is_recorded_and_retried_at_the_next_poll(tmp_path: Path) -> None:
    fake_stub(tmp_path, 10, "m", "m_0_0")
    answers = [OSError("connection refused"), None]

    def reload(model: str) -> None:
        answer = answers.pop(0)
        if answer is not None:
            raise answer

    watch = StubWatch(SERVER, lambda m: True, reload, proc=str(tmp_path))
    watch.poll()
    (tmp_path / "10" / "stat").write_text("10 (x) Z 4242")
    assert watch.poll() == []
    assert watch.events[0][3] == "OSError: connection refused"
    assert watch.poll() == ["m"] and watch.events[1][3] == "" and answers == []


def test_a_dead_stubs_region_is_unlinked_once_its_model_is_reloaded(tmp_path: Path) -> None:
    proc, shm = tmp_path / "proc", tmp_path / "shm"
    shm.mkdir()
    for name in ("r-dead", "r-alive", "r-other", "r-tok"):
        (shm / name).write_bytes(b"x")
    fake_stub(proc, 10, "m", "m_0_0", region="r-dead")
    fake_stub(proc, 11, "m", "m_0_1", region="r-alive")
    fake_stub(proc, 12, "t", "t_0_0", region="../r-tok")  # never a path outside the folder
    answers = [OSError("refused"), None, None]
    new_version = _new_version(proc, 2, [])

    def reload(model: str) -> None:
        answer = answers.pop(0)
        if answer is not None:
            raise answer
        new_version(model)

    watch = StubWatch(SERVER, lambda m: True, reload, proc=str(proc), shm_dir=str(shm),
                      kill=lambda pid: None)
    watch.poll()
    (proc / "10" / "stat").write_text("10 (x) Z 4242")
    assert watch.poll() == [] and (shm / "r-dead").exists()  # reload failed: kept
    assert watch.poll() == ["m"]
    assert sorted(p.name for p in shm.iterdir()) == ["r-alive", "r-other", "r-tok"]
    (proc / "12" / "stat").write_text("12 (x) Z 4242")
    assert watch.poll() == ["t"]
    assert sorted(p.name for p in shm.iterdir()) == ["r-alive", "r-other", "r-tok"]
    assert set(watch.retiring) == {11}  # m_0_1 ran the version that the reload replaced


def test_a_replaced_versions_stub_neither_hides_a_later_death_nor_outlives_its_time(
    tmp_path: Path,
) -> None:
    """Triton keeps the replaced version's other stub running, under the new one's name."""
    proc, shm = tmp_path / "proc", tmp_path / "shm"
    shm.mkdir()
    for pid in (10, 11, 20, 21, 30, 31):
        (shm / f"r-{pid}").write_bytes(b"x")
    fake_stub(proc, 10, "m", "m_0_0", region="r-10")
    fake_stub(proc, 11, "m", "m_0_1", region="r-11")
    now, killed, reloads = [100.0], [], []

    def reload(model: str) -> None:  # Triton's swap: new stubs; the old ones run on
        reloads.append(model)
        for index in (0, 1):
            pid = 10 * len(reloads) + 10 + index
            fake_stub(proc, pid, "m", f"m_0_{index}", region=f"r-{pid}")

    watch = StubWatch(SERVER, lambda m: True, reload, proc=str(proc), shm_dir=str(shm),
                      clock=lambda: now[0], kill=killed.append)
    watch.poll()
    (proc / "10" / "stat").write_text("10 (x) Z 4242")
    assert watch.poll() == ["m"] and watch.poll() == []
    assert set(watch.retiring) == {11} and killed == []
    (proc / "21" / "stat").write_text("21 (x) Z 4242")  # the new _0_1 dies; pid 11 runs
    assert watch.poll() == ["m"] and watch.events[-1][:2] == ("m", ("m_0_1",))
    assert watch.poll() == [] and set(watch.retiring) == {11, 20}
    now[0] += RETIRE_AFTER_S
    watch.poll()
    assert killed == [11, 20]
    for pid in killed:
        (proc / str(pid) / "stat").write_text(f"{pid} (x) Z 4242")
    assert watch.poll() == [] and watch.retiring == {}
    assert sorted(p.name for p in shm.iterdir()) == ["r-30", "r-31"]
    assert {s.pid for s in watch.seen.values()} == {30, 31}


def test_the_servers_http_address_comes_from_its_command_line(tmp_path: Path) -> None:
    fake_process(tmp_path, SERVER, ["tritonserver", "--http-address=0.0.0.0", "--http-port=18000"])
    assert server_http_url(SERVER, str(tmp_path)) == "127.0.0.1:18000"


_healthcheck = load_healthcheck


def test_the_health_check_reads_the_file_the_watch_writes(tmp_path: Path) -> None:
    import os

    from embed_runtime.ops.stub_watch import health_path

    check = _healthcheck()
    assert check.health_file(18000, {}) == health_path(18000, {})
    assert check.health_file(1, {"EMBED_HEALTH_FILE": "/x"}) == health_path(1, {
        "EMBED_HEALTH_FILE": "/x"}) == "/x"
    proc = tmp_path / "proc"
    fake_stub(proc, 10, "m", "m_0_0")
    states: list[str] = []
    health = str(tmp_path / "health.json")

    def reload(model: str) -> None:  # what the health check says while the reload runs
        states.append(check.watch_problem(health))

    watch = StubWatch(os.getpid(), lambda m: True, reload, proc=str(proc), health_file=health)
    watch.server_pid = SERVER
    watch.poll()
    (proc / "10" / "stat").write_text("10 (x) Z 4242")
    watch.server_pid = os.getpid()  # the file names a live server: this process
    watch.proc = str(tmp_path / "empty")
    (tmp_path / "empty").mkdir()
    watch.seen = {"m_0_0": Stub("m", 10, "shm", "m_0_0")}
    watch.poll()
    assert states and "reload pending: ['m']" in states[0]
    assert check.watch_problem(health) == ""
    assert "stopped" in check.watch_problem(health, now=10**12)


def test_repeated_reload_failures_make_the_health_check_fail(tmp_path: Path) -> None:
    import json
    import os

    check = _healthcheck()
    path = tmp_path / "h.json"
    state = {"server_pid": os.getpid(), "updated": 1e18, "degraded": {}, "failures_in_a_row": 3}
    path.write_text(json.dumps(state))
    assert "3 reloads of dead stubs failed in a row" in check.watch_problem(str(path), now=1e18)
    path.write_text(json.dumps({**state, "server_pid": 2**22 + 7}))  # a server that is gone
    assert check.watch_problem(str(path)) == ""
    assert check.watch_problem(str(tmp_path / "none.json")) == ""
