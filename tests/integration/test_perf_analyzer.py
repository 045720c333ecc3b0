"""The real perf_analyzer against the session server, run the way ``make perf`` runs it.

``make test`` installs the binary first (``make perf-analyzer``: Triton 2.51's
perf_analyzer from the pinned tritonclient wheel, ``deploy/perf/install_perf_analyzer.sh``).
``deploy/perf/run_perf.sh`` finds the ready ensembles, writes the client's input data and
runs the binary for each kind of input, ``TEXT`` (the MiniLM and the CLIP text
ensembles), ``IMAGE`` and ``IMAGE_URL`` (``data:`` URIs), at concurrency 1 and 2. Each
run is a fixed request count: a time window must first turn out stable, which a shared
2-core machine does not promise (perf_analyzer then exits 2 with no result).
``deploy/perf/perf_table.py`` then turns the real output into the docs table.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from tests.integration.conftest import ADMIN_KEY, TEXT_MODEL

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PERF = ROOT / "deploy" / "perf"
BINARY = Path(
    os.environ.get("PERF_ANALYZER", ROOT / ".build" / "tools" / "perf_analyzer" / "perf_analyzer")
)
CONCURRENCY = (1, 2)
REQUESTS = 8
CSV_COLUMNS = {"Concurrency", "Inferences/Second", "p50 latency", "p95 latency", "p99 latency"}
KEY_HEADER = "triton-grpc-protocol-x-admin-key"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"deploy_perf_{name}", PERF / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return module


perf_plan = _load("perf_plan")
perf_table = _load("perf_table")


@pytest.fixture(scope="module")
def perf_analyzer() -> Path:
    if not os.access(BINARY, os.X_OK):
        pytest.fail(f"no perf_analyzer at {BINARY}: run `make perf-analyzer` (make test does)")
    return BINARY


@pytest.fixture(scope="module")
def ensembles(server) -> dict[str, tuple[str, list[str]]]:
    """``{ensemble: (input, steps in pipeline order)}``, one ensemble of each input kind."""
    clip = next(e for e in server.manifest.models if e.family == "open-clip").name
    return {
        TEXT_MODEL: ("TEXT", ["tokenize", "encode"]),
        f"{clip}_text": ("TEXT", ["tokenize", "encode_text"]),
        f"{clip}_image": ("IMAGE", ["admit_image", "preprocess_image", "encode_image"]),
        f"{clip}_image_url": (
            "IMAGE_URL",
            ["admit_url", "fetch_image", "admit_image", "preprocess_image", "encode_image"],
        ),
    }


def _env(server, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBED_ADMIN_KEY")}
    return {
        **env,
        "TRITON_HTTP_URL": server.http_url,
        "TRITON_GRPC_URL": server.grpc_url,
        "PYTHON": sys.executable,
        **extra,
    }


@pytest.fixture(scope="module")
def sweep(server, perf_analyzer, ensembles, tmp_path_factory):
    """One run of run_perf.sh with the real binary: (process, run folder, seconds taken)."""
    results = tmp_path_factory.mktemp("perf-results")
    env = _env(
        server,
        EMBED_ADMIN_KEY=ADMIN_KEY,
        PERF_ANALYZER=str(perf_analyzer),
        PERF_MODELS=" ".join(ensembles),
        PERF_CONCURRENCY=" ".join(map(str, CONCURRENCY)),
        PERF_REQUEST_COUNT=str(REQUESTS),
        PERF_RESULTS=str(results),
        PERF_COMMAND="pytest tests/integration/test_perf_analyzer.py",
    )
    start = time.monotonic()
    done = subprocess.run(
        ["bash", str(PERF / "run_perf.sh")], env=env, capture_output=True, text=True, timeout=600
    )
    elapsed = time.monotonic() - start
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = results.iterdir()
    return done, run_dir, elapsed


def test_plan_lists_every_ready_ensemble_and_no_step_or_model_manager(server, ensembles) -> None:
    ready = perf_plan.ready_ensembles(server.http_url)
    assert {m: ready.get(m) for m in ensembles} == {m: kind for m, (kind, _) in ensembles.items()}
    steps = set(server.manifest.get(TEXT_MODEL).model_dirs) - {TEXT_MODEL}
    assert "model_manager" not in ready and not steps & set(ready)


def test_sweep_measures_each_ensemble_kind_at_each_concurrency(sweep, ensembles) -> None:
    _, run_dir, _ = sweep
    with (run_dir / "summary.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert CSV_COLUMNS | {"Model"} <= set(rows[0])
    measured = sorted((r["Model"], int(r["Concurrency"])) for r in rows)
    assert measured == sorted((m, c) for m in ensembles for c in CONCURRENCY)
    for row in rows:
        assert float(row["Inferences/Second"]) > 0, row
        assert 0 < float(row["p50 latency"]) <= float(row["p99 latency"]), row


def test_every_request_succeeds_and_no_run_reports_an_error(sweep, ensembles) -> None:
    done, run_dir, _ = sweep
    assert "error" not in done.stderr.lower(), done.stderr
    for model in ensembles:
        for c in CONCURRENCY:
            log = (run_dir / f"{model}.c{c}.log").read_text()
            assert not re.search(r"\berror\b|failed", log, re.IGNORECASE), log
            assert f"Request count: {REQUESTS}" in log, log
            assert re.search(rf"Successful request count: {REQUESTS}\b", log), log


def test_composing_models_give_queue_and_compute_of_every_step(sweep, ensembles) -> None:
    _, run_dir, _ = sweep
    settings, points = perf_table.load_run(run_dir)
    assert settings["perf_analyzer"].startswith("Perf Analyzer Version 2.51.0")
    assert settings["window"] == f"{REQUESTS} requests"
    assert {(p.ensemble, p.concurrency) for p in points} == {
        (m, c) for m in ensembles for c in CONCURRENCY
    }
    for point in points:
        assert [s.stage for s in point.steps] == ensembles[point.ensemble][1], point
        for step in point.steps:
            assert step.successes == step.inferences > 0, step
            assert step.executions > 0 and step.compute_us > 0 and step.queue_us >= 0, step


def test_perf_table_replaces_only_its_marked_section(sweep, ensembles, tmp_path) -> None:
    _, run_dir, _ = sweep
    doc = tmp_path / "benchmarks.md"
    original = (ROOT / "docs" / "benchmarks.md").read_text()
    doc.write_text(original)
    args = [sys.executable, str(PERF / "perf_table.py"), str(run_dir.parent), "--doc", str(doc)]
    for _ in range(2):
        done = subprocess.run(args, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
    text = doc.read_text()
    assert text.count(perf_table.BEGIN) == text.count(perf_table.END) == 1
    start, end = text.index(perf_table.BEGIN), text.index(perf_table.END)
    section = text[start:end]
    for model in ensembles:
        assert f"### {model}\n" in section
    assert "pytest tests/integration/test_perf_analyzer.py" in section
    assert f"{KEY_HEADER}:<key>" in section and ADMIN_KEY not in text
    assert _without_section(text) == _without_section(original)
    assert "## Method" in text[end:]


def _without_section(doc: str) -> str:
    block = re.escape(perf_table.BEGIN) + ".*?" + re.escape(perf_table.END) + "\n*"
    return re.sub(block, "", doc, flags=re.DOTALL)


def test_perf_analyzer_without_the_admin_key_cannot_read_model_configs(
    server, perf_analyzer, tmp_path
) -> None:
    data = tmp_path / "text.json"
    data.write_text('{"data": [{"TEXT": {"content": ["a cat"], "shape": [1]}}]}')
    base = [str(perf_analyzer), "-m", TEXT_MODEL, "-u", server.grpc_url, "-i", "grpc"]
    base += ["--input-data", str(data), "--request-count", "1"]
    for header in ([], ["-H", f"x-admin-key:{ADMIN_KEY}"], ["-H", f"{KEY_HEADER}:wrong-key"]):
        done = subprocess.run(base + header, capture_output=True, text=True, timeout=60)
        assert done.returncode != 0, done.stdout
        assert f"restricted, expecting header '{KEY_HEADER}'" in done.stdout + done.stderr
    done = subprocess.run(
        base + ["-H", f"{KEY_HEADER}:{ADMIN_KEY}"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_run_perf_refuses_to_start_without_a_key(server, tmp_path) -> None:
    env = _env(server, PERF_ANALYZER="/nonexistent", PERF_RESULTS=str(tmp_path))
    done = subprocess.run(
        ["bash", str(PERF / "run_perf.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "EMBED_ADMIN_KEY" in done.stderr and not list(tmp_path.iterdir())
