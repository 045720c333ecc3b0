"""The busy board shared by the encoder instances: real processes, real shared memory."""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path

import numpy as np
import pytest

from embed_runtime.engines.ort_encoder import (
    AUTO_THREADS,
    EncoderParams,
    OrtEncoder,
    available_cores,
    shared_threads,
)
from embed_runtime.ops.busy_board import BusyBoard, board_path
from tests.unit.embed_runtime.engines.test_ort_encoder import (
    BASE,
    _expected,
    _tokens,
    masked_mean_graph,
)

CTX = mp.get_context("spawn")


def _hold(path: str, busy: bool, ready, release) -> None:
    """Another instance: claim a slot, optionally sit inside an execution, then leave."""
    board = BusyBoard(path)
    if busy:
        with board.running():
            ready.put(board.slot)
            release.wait(30)
    else:
        ready.put(board.slot)
        release.wait(30)
    board.close()


def _start(path: str, busy: bool):
    ready, release = CTX.Queue(), CTX.Event()
    proc = CTX.Process(target=_hold, args=(path, busy, ready, release))
    proc.start()
    slot = ready.get(timeout=60)
    return proc, release, slot


def test_a_lone_instance_sees_nobody(tmp_path):
    board = BusyBoard(str(tmp_path / "board"))
    with board.running() as others:
        assert others == 0
    board.close()


def test_another_process_inside_an_execution_is_seen_and_idle_ones_are_not(tmp_path):
    path = str(tmp_path / "board")
    board = BusyBoard(path)
    idle, idle_release, idle_slot = _start(path, busy=False)
    busy, busy_release, busy_slot = _start(path, busy=True)
    try:
        assert len({board.slot, idle_slot, busy_slot}) == 3  # each process its own slot
        with board.running() as others:
            assert others == 1
        assert board.others_running() == 1
    finally:
        busy_release.set()
        idle_release.set()
        busy.join(30)
        idle.join(30)
    assert board.others_running() == 0  # the busy one left its execution
    board.close()


def test_a_process_killed_inside_an_execution_does_not_stay_busy(tmp_path):
    path = str(tmp_path / "board")
    proc, _release, slot = _start(path, busy=True)
    proc.kill()
    proc.join(30)
    board = BusyBoard(path)  # a new instance (Triton restarting the stub)
    try:
        assert board.slot == slot  # the dead process's lock is gone: its slot is free
        with board.running() as others:
            assert others == 0
    finally:
        board.close()


def test_an_orphaned_busy_mark_in_another_slot_is_cleared(tmp_path):
    path = str(tmp_path / "board")
    first = BusyBoard(path)  # holds slot 0
    proc, _release, slot = _start(path, busy=True)
    assert slot == 1
    proc.kill()
    proc.join(30)
    assert first.others_running() == 1  # the dead process's mark is still there
    second_proc, second_release, second_slot = _start(path, busy=False)
    try:
        assert second_slot == 1
        assert first.others_running() == 0  # the newcomer cleared it
    finally:
        second_release.set()
        second_proc.join(30)
        first.close()


def test_the_last_instance_out_removes_the_file(tmp_path):
    path = str(tmp_path / "board")
    first, second = BusyBoard(path), None
    proc, release, _slot = _start(path, busy=False)
    try:
        first.close()
        assert os.path.exists(path)  # the other process still holds a slot
    finally:
        release.set()
        proc.join(30)
    second = BusyBoard(path)
    second.close()
    assert not os.path.exists(path)


def test_board_path_is_per_server_and_model_version():
    a = board_path("m/odd name", "1", server_pid=10)
    assert Path(a).name == "embed-busy-10-m_odd_name-1"
    assert a != board_path("m/odd name", "2", server_pid=10)
    assert a != board_path("m/odd name", "1", server_pid=11)


@pytest.mark.parametrize(
    ("setting", "instances", "cores", "expected"),
    [(AUTO_THREADS, 2, 2, 1), (AUTO_THREADS, 2, 16, 8), (AUTO_THREADS, 4, 2, 1), (3, 2, 16, 3)],
)
def test_shared_threads(setting, instances, cores, expected):
    assert shared_threads(setting, instances, cores) == expected


def test_params_parse_auto_and_refuse_nonsense():
    params = {**BASE, "shared_intra_op_threads": "auto", "spin_duration_us": "20"}
    parsed = EncoderParams.from_parameters(params)
    assert parsed.shared_intra_op_threads == AUTO_THREADS
    assert parsed.spin_duration_us == 20
    with pytest.raises(ValueError, match="shared_intra_op_threads"):
        EncoderParams.from_parameters({**BASE, "shared_intra_op_threads": "-5"})
    with pytest.raises(ValueError, match="cpu provider only"):
        EncoderParams.from_parameters(
            {**BASE, "shared_intra_op_threads": "1", "execution_provider": "cuda"}
        )


def test_encoder_runs_on_the_shared_session_only_while_another_instance_runs(tmp_path):
    model = masked_mean_graph(tmp_path / "model.onnx")
    params = EncoderParams.from_parameters(
        {**BASE, "intra_op_threads": "2", "shared_intra_op_threads": "1"}
    )
    path = str(tmp_path / "board")
    encoder = OrtEncoder(str(model), params, board=BusyBoard(path))
    assert encoder.shared_session is not None
    used = []
    run = encoder._run

    def spy(inputs):
        used.append("shared" if encoder._current is encoder.shared_session else "solo")
        return run(inputs)

    encoder._run = spy
    req = _tokens([3, 5, 2], np.random.default_rng(0))
    (alone,) = encoder.encode_tokens([req])
    assert set(used) == {"solo"} and encoder.shared_runs == 0
    used.clear()
    proc, release, _slot = _start(path, busy=True)
    try:
        (beside,) = encoder.encode_tokens([req])
    finally:
        release.set()
        proc.join(30)
    assert set(used) == {"shared"} and encoder.shared_runs == 1
    np.testing.assert_allclose(alone, _expected(req), atol=1e-6)
    np.testing.assert_allclose(beside, alone, atol=1e-6)
    assert encoder._current is encoder.session  # back to the solo session afterwards
    encoder.board.close()


def test_without_a_board_there_is_one_session(tmp_path):
    model = masked_mean_graph(tmp_path / "model.onnx")
    params = EncoderParams.from_parameters({**BASE, "shared_intra_op_threads": "1"})
    encoder = OrtEncoder(str(model), params)
    assert encoder.shared_session is None and encoder.board is None


def test_available_cores_honours_a_cgroup_quota(tmp_path):
    affinity = len(os.sched_getaffinity(0))
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("max 100000\n")
    assert available_cores(str(cpu_max)) == affinity
    cpu_max.write_text("50000 100000\n")  # half a CPU
    assert available_cores(str(cpu_max)) == 1
    cpu_max.write_text(f"{(affinity + 8) * 100000} 100000\n")  # more than the mask: the mask
    assert available_cores(str(cpu_max)) == affinity
    assert available_cores(str(tmp_path / "absent")) == affinity
