"""StaticEmbedding models (model2vec-style) on a real Triton, over HTTP and gRPC.

A server of this module's own serves two tiny static models of ``tests/st_factory.py``:
``static-normalize`` (the tokenizer's own 128-token truncation, a Normalize module; the
split tokenize + encode pipeline) and ``static-raw`` (no truncation, raw means;
``fused_tokenize``). Answers must equal ``SentenceTransformer.encode`` of the saved
folders; an empty text or one without tokens is refused alone while the good requests
of the same execution are answered.
"""

from __future__ import annotations

import numpy as np
import pytest

from generator.manifest import parse_manifest
from tests.integration.conftest import serve
from tests.integration.text_helpers import (
    INVALID,
    PROTOCOLS,
    assert_bad_requests_fail_alone,
    refusal,
    text_tensor,
)
from tests.st_factory import (
    STATIC_VARIANTS,
    build_static_model,
    load_reference,
    manifest_entry,
    reference_embeddings,
    static_texts,
)

pytestmark = pytest.mark.integration

MAX_ABS_DIFF = 1e-5
SPLIT, FUSED = STATIC_VARIANTS[0], STATIC_VARIANTS[1]
BAD = {
    "": "TEXT row 0 is empty or whitespace only",
    "\x00": "TEXT row 0 has no tokens (the tokenizer drops all of its characters); its "
    "embedding would be all zeros",
    "\u0301\u200b": "TEXT row 0 has no tokens (the tokenizer drops all of its characters); "
    "its embedding would be all zeros",
}
GOOD = ["good one", "another good one, a little longer", "x", "naïve café 🙂"]


@pytest.fixture(scope="module")
def static_setup(tmp_path_factory):
    """Build both models and their repository, start Triton; the references too."""
    base = tmp_path_factory.mktemp("static")
    entries, references = [], {}
    for variant, fields in ((SPLIT, {"fused_tokenize": False}), (FUSED, {"fused_tokenize": True})):
        folder = build_static_model(variant, base / "models" / variant.name)
        references[variant.name] = load_reference(folder)
        entries.append(
            manifest_entry(
                variant,
                folder,
                max_batch_size=16,
                max_queue_delay_us=20000,
                max_rows_per_run=4,
                **fields,
            )
        )
    manifest = parse_manifest({"models": entries}, base)
    with serve(manifest, base) as server:
        yield server, references


@pytest.mark.parametrize("variant", [SPLIT, FUSED], ids=lambda v: v.name)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_static_embeddings_match_sentence_transformers(static_setup, protocol, variant):
    server, references = static_setup
    texts = static_texts()
    want = reference_embeddings(references[variant.name], variant, texts)
    with server.client(protocol) as c:
        got = c.embed_texts(variant.name, texts)
    assert got.shape == (len(texts), variant.dim) and got.dtype == np.float32
    diff = float(np.abs(got.astype(np.float64) - want).max())
    print(f"\n{variant.name} {protocol}: {len(texts)} texts, max|diff| {diff:.2e}")
    assert diff <= MAX_ABS_DIFF


@pytest.mark.parametrize("variant", [SPLIT, FUSED], ids=lambda v: v.name)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_static_empty_or_tokenless_text_is_refused_with_its_reason(
    static_setup, protocol, variant
):
    server, _ = static_setup
    for payload, reason in BAD.items():
        status, message = refusal(server, protocol, text_tensor([payload]), model=variant.name)
        assert (status, message) == (INVALID[protocol], f"in ensemble '{variant.name}', {reason}")


@pytest.mark.parametrize(
    ("variant", "step"), [(SPLIT, "tokenize"), (FUSED, "encode")], ids=["split", "fused"]
)
def test_static_bad_requests_do_not_fail_good_ones_in_the_same_execution(
    static_setup, variant, step
):
    """Good and bad requests reach the tokenizing step together; each gets its own answer."""
    server, references = static_setup
    model = variant.name
    bad = list(BAD)
    payloads = [GOOD[0], bad[0], bad[1], GOOD[1], GOOD[2], bad[2], GOOD[3]]
    want = dict(zip(GOOD, reference_embeddings(references[model], variant, GOOD), strict=True))

    def check(got: np.ndarray, expected: np.ndarray) -> None:
        assert float(np.abs(got - expected).max()) <= MAX_ABS_DIFF

    assert_bad_requests_fail_alone(server, f"{model}_{step}", payloads, want, BAD, check, model)
