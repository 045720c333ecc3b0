"""The servers of the family tests: tiny models built by the test module, served by its own
Triton (rerank, LLM rerank, sparse, multi-vector, PyLate), and what their encoders did."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path

import numpy as np
from tritonclient.utils import InferenceServerException

from generator.manifest import parse_manifest
from tests.integration.conftest import ADMISSION_WAIT_US, QUEUE_TIMEOUT_US, Server, serve
from tests.integration.text_helpers import PROTOCOLS, concurrently, model_stats, wait_stats

MAX_BATCH = 8


def entry(name: str, family: str, source: str | Path, **fields: object) -> dict:
    """A manifest entry: requests of up to :data:`MAX_BATCH` rows, gathered for up to 20 ms
    and run in chunks of 4 rows by one encoder process, so that concurrent requests share
    ragged executions."""
    return {
        "name": name,
        "family": family,
        "source": str(source),
        "max_batch_size": MAX_BATCH,
        "max_queue_delay_us": 20000,
        "max_rows_per_run": 4,
        "encoder_instances": 1,
        "queue_timeout_us": QUEUE_TIMEOUT_US,
        "admission_wait_us": ADMISSION_WAIT_US,
        **fields,
    }


@contextlib.contextmanager
def serve_models(base: Path, entries: list[dict]) -> Iterator[Server]:
    """Build the repository of ``entries`` under ``base`` and serve it (conftest's ``serve``)."""
    with serve(parse_manifest({"models": entries}, base), base) as server:
        yield server


def score_pairs_together(
    server: Server,
    model: str,
    score: Callable[[str, tuple], np.ndarray],
    pairs: Sequence[tuple],
    bad: dict[int, tuple],
) -> tuple[dict[int, InferenceServerException], np.ndarray]:
    """Send each of ``pairs`` (``bad`` ones, by row, in place of some) as its own request,
    all released together, alternately over HTTP and gRPC: ``score(protocol, pair)``.

    Asserts that the bad ones are refused, and that ``model``'s encoder step ran the good
    ones, and only them, in fewer executions than requests (ragged batching). Returns the
    refusals by row and the good ones' ``SCORE`` (float32, in order).
    """
    encode = f"{model}_encode"
    jobs = [bad.get(i, pair) for i, pair in enumerate(pairs)]
    good = [i for i in range(len(jobs)) if i not in bad]
    before = model_stats(server, encode)
    results = concurrently([partial(score, PROTOCOLS[i % 2], job) for i, job in enumerate(jobs)])
    delta = wait_stats(server, encode, before, len(good))
    refused = {i: results[i] for i in bad}
    assert all(isinstance(r, InferenceServerException) for r in refused.values()), refused
    got = np.asarray([results[i][0, 0] for i in good], dtype=np.float32)
    assert model_stats(server, encode).success_count - before.success_count == len(good)
    print(f"{model} concurrent: {len(good)} encoder requests in {delta.executions} executions")
    assert delta.executions < len(good)
    return refused, got
