"""``python -m client index --spark local[2]`` against two real Triton replicas (issue 47).

PySpark runs in local mode (a real JVM, two Python workers) and spreads the corpus's
shards over its tasks and the two servers: the session's and a second ``tritonserver``
on the same repository. The output must be the local run's, shard file for shard file
(same ids, same vectors), both replicas must have served, and a job whose tasks are
killed for real (SIGKILL of the Python worker once it wrote its first shard) must
resume to the same output without writing its finished shards again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from client.load.corpus import varied_sentences
from generator.admin import KEY_ENV
from generator.triton_local import TritonLaunch, TritonPorts, TritonProcess, free_ports
from tests.integration.conftest import ADMIN_KEY, TEXT_MODEL

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ROWS = 240
SHARD = 30
SHARDS = [f"part-{k:05d}.parquet" for k in range(ROWS // SHARD)]


@pytest.fixture(scope="module")
def replica(server, tmp_path_factory):
    """A second tritonserver on the session's built repository, text model only."""
    entry = next(m for m in server.manifest.models if m.name == TEXT_MODEL)
    launch = TritonLaunch(
        server.repo,
        TritonPorts(*free_ports(3)),
        load_models=tuple(entry.ensembles),
        admin_key=ADMIN_KEY,
    )
    process = TritonProcess(
        launch, tmp_path_factory.mktemp("replica"), extra_env={KEY_ENV: ADMIN_KEY}
    )
    process.start()
    try:
        process.wait_ready(timeout_s=float(os.environ.get("TRITON_START_TIMEOUT", 240)))
        yield f"127.0.0.1:{launch.ports.http}"
    finally:
        process.stop()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A Parquet corpus without an id column (ids are row numbers) and one more kept."""
    folder = tmp_path_factory.mktemp("spark-corpus")
    texts = list(dict.fromkeys(varied_sentences(2 * ROWS, seed=50)))[:ROWS]
    half = ROWS // 2 + 7  # the files do not end on a shard boundary
    for name, part in (("a", texts[:half]), ("b", texts[half:])):
        frame = pd.DataFrame({"text": part, "n": range(len(part))})
        frame.to_parquet(folder / f"{name}.parquet")
    return folder


def _index(url: str, corpus: Path, out: Path, *extra: str, env: dict | None = None):
    command = [
        sys.executable, "-m", "client", "index", "--url", url, "--admin-key", ADMIN_KEY,
        "--model", TEXT_MODEL, str(corpus), "--out", str(out), "--shard-rows", str(SHARD),
        "--keep-columns", "n", "--quiet", *extra,
    ]  # fmt: skip
    return subprocess.run(
        command,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=900,
    )


def _shards(out: Path) -> dict[str, pd.DataFrame]:
    return {p.name: pd.read_parquet(p) for p in sorted((out / "embeddings").glob("*.parquet"))}


def _assert_same_output(got: Path, want: Path) -> None:
    mine, theirs = _shards(got), _shards(want)
    assert list(mine) == list(theirs) == SHARDS
    for name in SHARDS:
        assert list(mine[name]["id"]) == list(theirs[name]["id"]), name
        assert list(mine[name]["n"]) == list(theirs[name]["n"]), name
        np.testing.assert_allclose(
            np.stack(mine[name]["embedding"]), np.stack(theirs[name]["embedding"]), atol=1e-5
        )


@pytest.fixture(scope="module")
def local_run(server, corpus, tmp_path_factory) -> Path:
    """The CLI's local run on the session's server: the reference output."""
    out = tmp_path_factory.mktemp("spark-local") / "out"
    done = _index(server.http_url, corpus, out)
    assert done.returncode == 0, done.stderr
    return out


def _served(url: str) -> int:
    from client import EmbeddingClient

    with EmbeddingClient(url, admin_key=ADMIN_KEY) as client:
        return sum(s.inference_count for s in client.model_statistics(TEXT_MODEL))


def test_spark_job_on_two_replicas_writes_the_local_runs_shards(
    server, replica, corpus, local_run, tmp_path
):
    before = _served(server.http_url), _served(replica)
    out = tmp_path / "out"
    urls = f"{server.http_url},{replica}"
    done = _index(urls, corpus, out, "--spark", "local[2]")
    assert done.returncode == 0, done.stderr
    assert f"indexed {ROWS} rows (0 failed)" in done.stderr
    _assert_same_output(out, local_run)
    frame = pd.read_parquet(out / "embeddings")
    assert sorted(frame["id"], key=int) == [str(i) for i in range(ROWS)]  # each row once
    mine = json.loads((out / "manifest.json").read_text())
    theirs = json.loads((local_run / "manifest.json").read_text())
    for key in ("model", "config_digest", "input", "options", "shard_rows"):
        assert mine[key] == theirs[key], key
    assert sorted(mine["shards"]) == SHARDS
    served = _served(server.http_url) - before[0], _served(replica) - before[1]
    assert min(served) > 0 and sum(served) >= ROWS, served  # both replicas took rows


def test_spark_tasks_killed_for_real_resume_to_the_same_output(
    server, replica, corpus, local_run, tmp_path
):
    out = tmp_path / "out"
    urls = f"{server.http_url},{replica}"
    killed = _index(
        urls, corpus, out, "--spark", "local[2]", "--spark-tasks", "2",
        env={"EMBED_INDEX_KILL_AFTER_SHARDS": "1"},
    )  # fmt: skip
    assert killed.returncode == 2, killed.stderr
    assert "the Spark job failed" in killed.stderr and "run the same job again" in killed.stderr
    before = {p.name: p.stat().st_mtime_ns for p in (out / "embeddings").glob("*.parquet")}
    assert 0 < len(before) < len(SHARDS), before

    resumed = _index(urls, corpus, out, "--spark", "local[2]", "--spark-tasks", "2")
    assert resumed.returncode == 0, resumed.stderr
    assert f"{len(before) * SHARD} rows already done" in resumed.stderr
    for name, mtime in before.items():  # finished shards are not written again
        assert (out / "embeddings" / name).stat().st_mtime_ns == mtime
    _assert_same_output(out, local_run)
    manifest = json.loads((out / "manifest.json").read_text())
    assert sum(s["rows"] for s in manifest["shards"].values()) == ROWS
    assert not list((out / "embeddings").glob(".*"))  # no temporary file left


def test_spark_job_of_chunks_writes_one_row_per_chunk(server, corpus, tmp_path):
    """The same job with ``--chunk-tokens``: each row's chunks, as the client cuts them."""
    out = tmp_path / "out"
    done = _index(server.http_url, corpus, out, "--spark", "local[2]", "--chunk-tokens", "8")
    assert done.returncode == 0, done.stderr
    frame = pd.read_parquet(out / "embeddings").sort_values(["id", "chunk"], key=_by_number)
    texts = [t for name in ("a", "b") for t in pd.read_parquet(corpus / f"{name}.parquet")["text"]]
    from client import EmbeddingClient

    with EmbeddingClient(server.http_url, admin_key=ADMIN_KEY) as client:
        want = client.embed_chunks(TEXT_MODEL, texts, chunk_tokens=8)
    assert len(frame) == len(want) > ROWS  # every chunk once, rows of several chunks
    assert list(frame["id"]) == [str(c.row) for c in want]
    assert list(zip(frame["start"], frame["end"], strict=True)) == [(c.start, c.end) for c in want]
    np.testing.assert_allclose(
        np.stack(frame["embedding"]), np.stack([c.vector for c in want]), atol=1e-5
    )


def _by_number(column: pd.Series) -> pd.Series:
    return column.astype(int) if column.name == "id" else column
