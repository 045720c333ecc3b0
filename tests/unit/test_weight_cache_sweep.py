"""The test run's weight-cache folders: a killed run's folder goes, a live run's stays."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import remove_orphan_caches


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_only_folders_of_gone_runs_are_removed(tmp_path):
    dead = tmp_path / f"embed-test-ort-cache-{_dead_pid()}-ab12cd_x"
    live = tmp_path / f"embed-test-ort-cache-{os.getpid()}-zz99yy_q"
    legacy = tmp_path / "embed-test-ort-cache-k3j4h5g6"  # before the pid was named
    other = tmp_path / "embed-ort-cache-0"  # a user's own cache
    for folder in (dead, live, legacy, other):
        folder.mkdir()
        (folder / "weights.bin").write_bytes(b"\0" * 16)
    (tmp_path / f"embed-test-ort-cache-{_dead_pid()}-file").write_text("not a folder")

    assert remove_orphan_caches(str(tmp_path)) == [str(dead)]
    assert not dead.exists()
    assert live.exists() and legacy.exists() and other.exists()
