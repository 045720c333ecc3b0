"""Laying out the backend directory while a stub of another (or a stopping) server runs."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import generator.triton_local as triton_local
from generator.triton_local import PY_TAG, lay_out_file, prepare_backends

STUB = "triton_python_backend_stub"
SLEEP = shutil.which("sleep")

pytestmark = pytest.mark.skipif(
    SLEEP is None or not Path(SLEEP).is_file(), reason="needs a sleep binary"
)


@pytest.fixture
def fake_pytriton(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A pytriton tree whose stub is a copy of ``sleep`` (runnable, harmless)."""
    root = tmp_path / "pytriton"
    backend = root / "tritonserver" / "backends" / "python"
    backend.mkdir(parents=True)
    (backend / "libtriton_python.so").write_bytes(b"backend library")
    (backend / "triton_python_backend_utils.py").write_text("# utils\n")
    stubs = root / "tritonserver" / "python_backend_stubs" / PY_TAG
    stubs.mkdir(parents=True)
    shutil.copy2(SLEEP, stubs / STUB)
    monkeypatch.setattr(triton_local, "_pytriton_root", lambda: root)
    monkeypatch.delenv("TRITON_BACKEND_DIR", raising=False)
    return root


@pytest.fixture
def running() -> Iterator[Callable[[Path], subprocess.Popen]]:
    """Runs a file as ``<file> 60`` (a copy of sleep); killed after the test."""
    started: list[subprocess.Popen] = []

    def run(path: Path) -> subprocess.Popen:
        started.append(subprocess.Popen([str(path), "60"]))
        return started[-1]

    yield run
    for process in started:
        process.kill()
        process.wait(timeout=10)


def _source_stub(root: Path) -> Path:
    return root / "tritonserver" / "python_backend_stubs" / PY_TAG / STUB


def test_lays_out_again_while_the_stub_runs_from_the_target(
    fake_pytriton: Path, tmp_path: Path, running
) -> None:
    target = tmp_path / "work" / "backends"
    prepare_backends(target)
    laid_out = target / "python" / STUB
    process = running(laid_out)
    # The situation of the bug: writing into the running binary in place is refused.
    with pytest.raises(OSError) as refused:
        with laid_out.open("r+b"):
            pass
    assert refused.value.errno == errno.ETXTBSY
    prepare_backends(target)  # same stub: nothing to write
    source = _source_stub(fake_pytriton)
    source.write_bytes(source.read_bytes() + b"\0new build")  # the wheel's stub changed
    prepare_backends(target)
    assert laid_out.read_bytes() == source.read_bytes()
    assert os.access(laid_out, os.X_OK)
    assert process.poll() is None, "the running stub kept its own (old) file"
    assert sorted(p.name for p in laid_out.parent.iterdir()) == sorted(
        ["libtriton_python.so", "triton_python_backend_utils.py", STUB]
    ), "no temporary file left behind"


def test_an_identical_target_is_left_untouched(fake_pytriton: Path, tmp_path: Path) -> None:
    prepare_backends(tmp_path)
    laid_out = tmp_path / "python" / STUB
    inode = laid_out.stat().st_ino
    prepare_backends(tmp_path)
    assert laid_out.stat().st_ino == inode
    source = _source_stub(fake_pytriton)
    os.utime(source, ns=(1, 1))  # same bytes, other mtime: compared by content
    prepare_backends(tmp_path)
    assert laid_out.stat().st_ino == inode


def test_a_target_of_other_content_but_same_size_is_replaced(tmp_path: Path) -> None:
    source, target = tmp_path / "a", tmp_path / "b"
    source.write_bytes(b"new!")
    target.write_bytes(b"old!")
    lay_out_file(source, target)
    assert target.read_bytes() == b"new!"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_the_real_stub_is_laid_out_again_while_a_copy_of_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, running
) -> None:
    monkeypatch.delenv("TRITON_BACKEND_DIR", raising=False)
    try:
        prepare_backends(tmp_path)
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    laid_out = tmp_path / "python" / STUB
    shutil.copy2(SLEEP, laid_out)  # another build's stub, still executing
    running(laid_out)
    prepare_backends(tmp_path)
    real = triton_local._pytriton_root() / "tritonserver" / "python_backend_stubs" / PY_TAG
    assert laid_out.read_bytes() == (real / STUB).read_bytes()
