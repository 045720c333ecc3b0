"""The multi-vector family served by a real Triton agrees with ``MultiVectorEncoder``.

A server of this module's own serves the tiny random ColBERT model
(``generator/fixtures/tiny_colbert.py``: ``[Q]`` / ``[D]`` markers, queries expanded
with ``[MASK]`` to 16 tokens, documents cut at 48 tokens without punctuation, 16-wide
normalised projection) as ``cb``: ``TEXT`` [N, 1] + request parameter ``task`` ->
``EMBEDDINGS`` FP32 [N, T, D] and ``TOKEN_COUNT`` INT32 [N, 1]. Over HTTP and gRPC,
every row equals ``encode_query`` / ``encode_document``, its count the library's
number of vectors, MaxSim the library's ``similarity``; an empty text fails its own
request alone.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from client import EmbeddingClientError
from client.multivector import maxsim
from generator.fixtures.tiny_colbert import create_tiny_colbert
from tests.integration import text_helpers
from tests.integration.families import entry, serve_models
from tests.integration.text_helpers import PROTOCOLS, concurrently, infer, plain_request_outputs
from tests.st_factory import parity_texts

pytestmark = pytest.mark.integration

MAX_ABS_DIFF = 1e-5
OUTPUTS = ("EMBEDDINGS", "TOKEN_COUNT")


@pytest.fixture(scope="module")
def colbert_setup(tmp_path_factory):
    """Build the tiny ColBERT model and its repository, load the reference, start Triton."""
    from sentence_transformers import MultiVectorEncoder

    base = tmp_path_factory.mktemp("multivector")
    folder = create_tiny_colbert(base / "tiny-colbert", seed=3)
    reference = MultiVectorEncoder(str(folder), device="cpu")
    with serve_models(base, [entry("cb", "multi-vector", folder)]) as server:
        yield server, reference


def _library(reference, texts, task: str) -> list[np.ndarray]:
    encode = reference.encode_query if task == "query" else reference.encode_document
    return [t.numpy() for t in encode(texts, batch_size=16)]


def _raw(server, protocol: str, texts, task: str | None, **parameters):
    parameters = {**({"task": task} if task else {}), **parameters}
    return infer(server, protocol, "cb", {"TEXT": texts}, OUTPUTS, parameters)


def _worst(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        worst = max(worst, float(np.abs(g - w).max()))
    return worst


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_queries_and_documents_equal_the_library_and_maxsim_too(colbert_setup, protocol):
    server, reference = colbert_setup
    texts = parity_texts()
    queries, documents = _library(reference, texts, "query"), _library(reference, texts, "document")
    with server.client(protocol) as client:
        got_queries = client.embed_multivector("cb", texts, is_query=True)
        got_docs = client.embed_multivector("cb", texts)
    diffs = _worst(got_queries, queries), _worst(got_docs, documents)
    scores = maxsim(got_queries, got_docs)
    want = reference.similarity(queries, documents).numpy()
    score_diff = float(np.abs(scores - want).max())
    print(
        f"\ncb {protocol}: {len(texts)} texts, max|diff| queries {diffs[0]:.2e}, documents "
        f"{diffs[1]:.2e}; MaxSim {score_diff:.2e} (scores {want.min():.2f}..{want.max():.2f})"
    )
    assert max(diffs) <= MAX_ABS_DIFF
    assert score_diff <= 1e-4
    assert (scores.argmax(1) == want.argmax(1)).all()
    assert all(r.dtype == np.float32 for r in got_queries + got_docs)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_token_count_is_each_rows_vector_count_and_rows_are_zero_padded(colbert_setup, protocol):
    server, reference = colbert_setup
    texts = ["x", "A longer document, with punctuation; about late interaction!"]
    for task in ("document", "query"):
        embeddings, counts = _raw(server, protocol, texts, task)
        want = _library(reference, texts, task)
        assert counts.dtype == np.int32 and counts.reshape(-1).tolist() == [len(w) for w in want]
        assert embeddings.dtype == np.float32
        assert embeddings.shape == (2, max(len(w) for w in want), want[0].shape[1])
        assert not embeddings[0, len(want[0]) :].any()
    default, _ = _raw(server, protocol, texts, None)  # no task: documents
    documents, _ = _raw(server, protocol, texts, "document")
    assert np.array_equal(default, documents)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_empty_text_or_a_bad_task_fails_its_own_request_alone(colbert_setup, protocol):
    server, reference = colbert_setup
    good = [
        (["a cat sat on the mat", "late interaction"], "document"),
        (["what is colbert?"], "query"),
        (["one more request"], "document"),
    ]
    bad = [(["fine", "   "], "document"), (["fine"], "passage")]
    results = concurrently([partial(_raw, server, protocol, *r) for r in [*good, *bad]])
    for i, message in (
        (len(good), "TEXT row 1 is empty or whitespace only"),
        (len(good) + 1, "task must be one of ['query', 'document']"),
    ):
        assert isinstance(results[i], InferenceServerException)
        assert str(results[i].status()) == text_helpers.INVALID[protocol]
        assert message in str(results[i].message())
    for i, (texts, task) in enumerate(good):
        embeddings, counts = results[i]
        got = [e[: int(n)] for e, n in zip(embeddings, counts.reshape(-1), strict=True)]
        assert _worst(got, _library(reference, texts, task)) <= MAX_ABS_DIFF
    with server.client(protocol) as client, pytest.raises(EmbeddingClientError, match="empty"):
        client.embed_multivector("cb", [""])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_truncate_false_refuses_a_long_document_and_left_cuts_are_refused(colbert_setup, protocol):
    """``truncate=false`` refuses a document over its length, naming its tokens; the
    default cuts it as ``encode_document`` does; ``truncation_direction=left`` is refused."""
    server, reference = colbert_setup
    long = " ".join(["word"] * 400)
    embeddings, counts = _raw(server, protocol, [long], "document")
    got = [e[: int(n)] for e, n in zip(embeddings, counts.reshape(-1), strict=True)]
    assert _worst(got, _library(reference, [long], "document")) <= MAX_ABS_DIFF
    for parameters, message in (
        ({"truncate": False}, "TEXT row 0 has"),
        ({"truncation_direction": "left"}, "not available for multi"),
    ):
        with pytest.raises(InferenceServerException) as refused:
            _raw(server, protocol, [long], "document", **parameters)
        assert str(refused.value.status()) == text_helpers.INVALID[protocol]
        assert message in str(refused.value.message())
    _raw(server, protocol, ["short"], "document", truncate=False)  # within the limit: fine


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_request_naming_no_output_gets_the_documented_outputs(colbert_setup, protocol):
    """Raw JSON with no ``outputs`` (HTTP) and gRPC: the family's documented outputs alone."""
    server = colbert_setup[0]
    got = plain_request_outputs(server, protocol, "cb", {"TEXT": ["a cat", "a dog"]})
    assert sorted(got) == sorted(["EMBEDDINGS", "TOKEN_COUNT"])
