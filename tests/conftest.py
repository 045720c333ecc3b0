"""No silent skips: a skipped test fails the run unless this list names it, with a reason.

A broken install must not turn into skipped tests. Each allowed skip below is a test
that cannot run on some machine for a reason outside the project (another onnxruntime
build, a tool a later make target installs); the end of every run prints the skips,
allowed or not, and any skip not listed here makes pytest exit non-zero.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

# The encoders' host weight cache (embed_runtime.ops.weight_cache.cached_model) of this run
# only: every in-process encoder and every Triton the tests start (they inherit the
# environment) writes here, never into the user's own cache. Removed at the end; the
# folder names its pytest's pid, so a run that was killed (no end) leaves a folder the
# next run removes once that pid is gone (each holds about 1.4 GB of weights).
_CACHE_PREFIX = "embed-test-ort-cache-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_orphan_caches(tmp: str) -> list[str]:
    """Remove the weight caches in ``tmp`` whose pytest process no longer runs."""
    removed = []
    for entry in os.scandir(tmp):
        if not entry.name.startswith(_CACHE_PREFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        pid_text, sep, _ = entry.name.removeprefix(_CACHE_PREFIX).partition("-")
        # A name without a pid is not known to be orphaned: it stays.
        if not (sep and pid_text.isdigit()) or _pid_alive(int(pid_text)):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.path)
    return removed


remove_orphan_caches(tempfile.gettempdir())
_WEIGHT_CACHE = tempfile.mkdtemp(prefix=f"{_CACHE_PREFIX}{os.getpid()}-")
os.environ["EMBED_ORT_CACHE_DIR"] = _WEIGHT_CACHE

# node-id prefix -> why skipping it is acceptable
ALLOWED_SKIPS: dict[str, str] = {
    "tests/unit/embed_runtime/engines/test_ort_encoder.py"
    "::test_cpu_only_onnxruntime_refuses_a_cuda_encoder": (
        "runs only where onnxruntime is the CPU build (a GPU build has the CUDA provider)"
    ),
    "tests/unit/deploy/test_compose.py::test_docker_compose_1_29_merges": (
        "needs Debian's docker-compose 1.29 binary, which is not a project dependency"
    ),
    "tests/unit/deploy/test_k8s_schemas.py::test_a_current_kubectl_renders_the_same_objects": (
        "compares with a current kubectl on PATH where the machine has one (not a dependency)"
    ),
}

_skipped: list[tuple[str, str]] = []


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _allowed(nodeid: str) -> str | None:
    for prefix, why in ALLOWED_SKIPS.items():
        if nodeid.startswith(prefix):
            return why
    return None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Record every skipped test (setup skips included)."""
    if report.skipped and not hasattr(report, "wasxfail"):
        _skipped.append((report.nodeid, _reason(report)))


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """Record modules skipped at collection (e.g. a module-level skip)."""
    if report.skipped:
        _skipped.append((report.nodeid, _reason(report)))


def _unexpected() -> list[tuple[str, str]]:
    return [(nodeid, why) for nodeid, why in _skipped if _allowed(nodeid) is None]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Turn a run with an unexpected skip into a failed run; drop this run's weight cache."""
    shutil.rmtree(_WEIGHT_CACHE, ignore_errors=True)
    if _unexpected() and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter) -> None:
    """Print the skips: allowed ones with their reason, and the ones that fail the run."""
    if not _skipped:
        terminalreporter.write_line("skips: none")
        return
    terminalreporter.section("skips")
    for nodeid, why in _skipped:
        allowed = _allowed(nodeid)
        if allowed:
            terminalreporter.write_line(f"allowed  {nodeid}: {why} ({allowed})")
        else:
            terminalreporter.write_line(f"FAILING  {nodeid}: {why} (not in tests/conftest.py)")
    if _unexpected():
        terminalreporter.write_line(
            f"{len(_unexpected())} unexpected skip(s) fail the run (allow-list: tests/conftest.py)",
            red=True,
        )
