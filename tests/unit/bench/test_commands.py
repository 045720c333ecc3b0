"""Every ``python -m bench...`` command the docs give exists and answers ``--help``.

A benchmark retired from ``bench/`` must leave the docs as a runnable command too: the
docs then name it with the commit after which it was retired and its results file.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
# ``python -m bench.x.y``, the module possibly on the next line of a wrapped paragraph.
COMMAND = re.compile(r"python3?\s+-m\s+(bench(?:\.\w+)*)")


def documented_modules() -> dict[str, list[str]]:
    """Each module a doc runs with ``python -m``, and the docs that do (deduplicated)."""
    found: dict[str, list[str]] = {}
    for doc in DOCS:
        for module in COMMAND.findall(doc.read_text(encoding="utf-8")):
            where = found.setdefault(module, [])
            if doc.name not in where:
                where.append(doc.name)
    return dict(sorted(found.items()))


MODULES = documented_modules()


def exists(module: str) -> bool:
    """Whether ``module`` can be imported from the checkout (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is gone too
        return False


@cache
def help_runs() -> dict[str, subprocess.CompletedProcess]:
    """``python -m <module> --help`` of every documented module, a few at a time."""

    def run(module: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", module, "--help"],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    existing = [m for m in MODULES if exists(m)]
    with ThreadPoolExecutor(4) as pool:
        return dict(zip(existing, pool.map(run, existing), strict=True))


def test_the_docs_name_the_core_benchmarks_as_commands() -> None:
    assert {"bench.run", "bench.faults.overload", "bench.gpu"} <= set(MODULES)


@pytest.mark.parametrize("module", list(MODULES))
def test_each_documented_bench_command_exists_and_answers_help(module: str) -> None:
    docs = ", ".join(MODULES[module])
    assert exists(module), f"{docs} run {module}, which is gone"
    done = help_runs()[module]
    assert done.returncode == 0, f"{module} --help (named in {docs}):\n{done.stderr[-2000:]}"
    assert "usage:" in done.stdout
