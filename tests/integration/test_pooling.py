"""Every pooling mode and head served by a real Triton agrees with sentence-transformers.

A server of this module's own serves the tiny models of ``tests/st_factory.py`` (mean,
CLS, max, last-token and weighted-mean pooling, a Dense head; raw and normalised
outputs). Requests mix short and long texts, and concurrent requests share executions
(ragged batching), which the encoder sorts by length and runs in chunks of 4 rows padded
to their own longest row: every pooling mode must ignore that padding.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from generator.manifest import parse_manifest
from tests.integration.conftest import Server, serve
from tests.st_factory import (
    VARIANTS,
    build_tiny_model,
    load_reference,
    manifest_entry,
    parity,
    parity_texts,
    reference_embeddings,
)

pytestmark = pytest.mark.integration

MIN_COSINE = 0.999999
MAX_ABS_DIFF = 1e-5
MAX_BATCH = 8
ROWS_PER_RUN = 4
VARIANT_IDS = [v.name for v in VARIANTS]


@pytest.fixture(scope="module")
def pooling_setup(tmp_path_factory) -> tuple[Server, dict[str, np.ndarray], list[str]]:
    """Build the tiny models, their repository and sentence-transformers' answers; start Triton."""
    base = tmp_path_factory.mktemp("pooling")
    texts = parity_texts()
    entries, expected = [], {}
    for variant in VARIANTS:
        folder = build_tiny_model(variant, base / "models" / variant.name)
        expected[variant.name] = reference_embeddings(load_reference(folder), variant, texts)
        entries.append(
            manifest_entry(
                variant,
                folder,
                max_batch_size=MAX_BATCH,
                max_queue_delay_us=20000,
                max_rows_per_run=ROWS_PER_RUN,
            )
        )
    manifest = parse_manifest({"models": entries}, base)
    with serve(manifest, base) as server:
        yield server, expected, texts


def _stats_after(client, model: str, before, requests: int, timeout_s: float = 10.0):
    """The model's statistics once ``requests`` more have been counted (Triton counts a
    request after its response has gone out, so the last ones can lag a little)."""
    deadline = time.monotonic() + timeout_s
    while True:
        after = {s.name: s for s in client.model_statistics(model)}[model]
        if after.success_count - before.success_count >= requests or time.monotonic() > deadline:
            return after
        time.sleep(0.05)


def _check(label: str, got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape and got.dtype == np.float32
    cos, diff = parity(got, want)
    print(f"\n{label}: min cos {cos:.9f}, max|diff| {diff:.2e}")
    assert cos >= MIN_COSINE
    assert diff <= MAX_ABS_DIFF


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("name", VARIANT_IDS)
def test_served_embeddings_match_sentence_transformers(pooling_setup, name, protocol):
    """Requests of 8 rows mixing 3- and 64-token texts, run as length-sorted chunks of 4."""
    server, expected, texts = pooling_setup
    with server.client(protocol) as client:
        got = client.embed_texts(name, texts)
    _check(f"{name} {protocol}", got, expected[name])


@pytest.mark.parametrize("name", VARIANT_IDS)
def test_concurrent_requests_of_different_lengths_share_executions_and_match(pooling_setup, name):
    """Single-row and mixed requests at once: Triton merges them into ragged executions."""
    server, expected, texts = pooling_setup
    groups = [[i] for i in range(0, len(texts), 2)] + [
        list(range(i, min(i + 3, len(texts)))) for i in range(1, len(texts), 6)
    ]

    def send(job: tuple[int, list[int]]) -> np.ndarray:
        n, rows = job
        with server.client("grpc" if n % 2 else "http") as own:
            return own.embed_texts(name, [texts[r] for r in rows])

    encode = f"{name}_encode"
    with server.client() as client:
        before = {s.name: s for s in client.model_statistics(encode)}[encode]
        with ThreadPoolExecutor(12) as pool:
            answers = list(pool.map(send, enumerate(groups)))
        after = _stats_after(client, encode, before, len(groups))
    rows = [r for group in groups for r in group]
    _check(f"{name} concurrent", np.concatenate(answers), expected[name][rows])
    requests = after.success_count - before.success_count
    executions = after.execution_count - before.execution_count
    assert requests == len(groups)
    assert executions < requests, "ragged inputs should let requests share executions"
