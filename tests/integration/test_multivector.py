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

import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from client import EmbeddingClient, EmbeddingClientError
from client.multivector import maxsim
from generator.fixtures.tiny_colbert import create_tiny_colbert
from generator.manifest import parse_manifest
from tests.integration.conftest import serve
from tests.st_factory import parity_texts

pytestmark = pytest.mark.integration

MAX_BATCH = 8
MAX_ABS_DIFF = 1e-5
PROTOCOLS = ["http", "grpc"]
INVALID = {"http": "400", "grpc": "StatusCode.INVALID_ARGUMENT"}
_MODULES = {"http": httpclient, "grpc": grpcclient}


@pytest.fixture(scope="module")
def colbert_setup(tmp_path_factory):
    """Build the tiny ColBERT model and its repository, load the reference, start Triton."""
    from sentence_transformers import MultiVectorEncoder

    base = tmp_path_factory.mktemp("multivector")
    folder = create_tiny_colbert(base / "tiny-colbert", seed=3)
    manifest = parse_manifest({"models": [{
        "name": "cb", "family": "multi-vector", "source": str(folder),
        "max_batch_size": MAX_BATCH, "max_queue_delay_us": 20000, "max_rows_per_run": 4,
    }]}, base)
    reference = MultiVectorEncoder(str(folder), device="cpu")
    with serve(manifest, base) as server:
        yield server, reference


def _url(server, protocol: str) -> str:
    return server.http_url if protocol == "http" else server.grpc_url


def _library(reference, texts, task: str) -> list[np.ndarray]:
    encode = reference.encode_query if task == "query" else reference.encode_document
    return [t.numpy() for t in encode(texts, batch_size=16)]


def _raw(server, protocol: str, texts, task: str | None, **parameters):
    module = _MODULES[protocol]
    tc = module.InferenceServerClient(_url(server, protocol))
    try:
        array = np.array([t.encode() for t in texts], dtype=np.object_).reshape(-1, 1)
        inp = module.InferInput("TEXT", list(array.shape), "BYTES")
        inp.set_data_from_numpy(array)
        parameters = {**({"task": task} if task else {}), **parameters}
        result = tc.infer("cb", [inp], parameters=parameters or None)
        return result.as_numpy("EMBEDDINGS"), result.as_numpy("TOKEN_COUNT")
    finally:
        tc.close()


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
    queries, documents = _library(reference, texts, "query"), _library(reference, texts,
                                                                         "document")
    with EmbeddingClient(_url(server, protocol), protocol) as client:
        got_queries = client.embed_multivector("cb", texts, is_query=True)
        got_docs = client.embed_multivector("cb", texts)
    diffs = _worst(got_queries, queries), _worst(got_docs, documents)
    scores = maxsim(got_queries, got_docs)
    want = reference.similarity(queries, documents).numpy()
    score_diff = float(np.abs(scores - want).max())
    print(f"\ncb {protocol}: {len(texts)} texts, max|diff| queries {diffs[0]:.2e}, documents "
          f"{diffs[1]:.2e}; MaxSim {score_diff:.2e} (scores {want.min():.2f}..{want.max():.2f})")
    assert max(diffs) <= MAX_ABS_DIFF
    assert score_diff <= 1e-4
    assert (scores.argmax(1) == want.argmax(1)).all()
    assert all(r.dtype == np.float32 for r in got_queries + got_docs)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_token_count_is_each_rows_vector_count_and_rows_are_zero_padded(colbert_setup,
                                                                        protocol):
    server, reference = colbert_setup
    texts = ["x", "A longer document, with punctuation; about late interaction!"]
    for task in ("document", "query"):
        embeddings, counts = _raw(server, protocol, texts, task)
        want = _library(reference, texts, task)
        assert counts.dtype == np.int32 and counts.reshape(-1).tolist() == [len(w) for w in want]
        assert embeddings.dtype == np.float32
        assert embeddings.shape == (2, max(len(w) for w in want), want[0].shape[1])
        assert not embeddings[0, len(want[0]):].any()
    default, _ = _raw(server, protocol, texts, None)  # no task: documents
    documents, _ = _raw(server, protocol, texts, "document")
    assert np.array_equal(default, documents)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_empty_text_or_a_bad_task_fails_its_own_request_alone(colbert_setup, protocol):
    server, reference = colbert_setup
    good = [(["a cat sat on the mat", "late interaction"], "document"),
            (["what is colbert?"], "query"), (["one more request"], "document")]
    bad = [(["fine", "   "], "document"), (["fine"], "passage")]
    results: dict[int, object] = {}

    def send(i: int, texts, task) -> None:
        try:
            results[i] = _raw(server, protocol, texts, task)
        except InferenceServerException as exc:
            results[i] = exc

    requests = [*good, *bad]
    threads = [threading.Thread(target=send, args=(i, *r)) for i, r in enumerate(requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, message in ((len(good), "TEXT row 1 is empty or whitespace only"),
                       (len(good) + 1, "task must be one of ['query', 'document']")):
        assert isinstance(results[i], InferenceServerException)
        assert str(results[i].status()) == INVALID[protocol]
        assert message in str(results[i].message())
    for i, (texts, task) in enumerate(good):
        embeddings, counts = results[i]
        got = [e[: int(n)] for e, n in zip(embeddings, counts.reshape(-1), strict=True)]
        assert _worst(got, _library(reference, texts, task)) <= MAX_ABS_DIFF
    with EmbeddingClient(_url(server, protocol), protocol) as client, pytest.raises(
            EmbeddingClientError, match="empty"):
        client.embed_multivector("cb", [""])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_truncate_false_refuses_a_long_document_and_left_cuts_are_refused(colbert_setup,
                                                                          protocol):
    """``truncate=false`` refuses a document over its length, naming its tokens; the
    default cuts it as ``encode_document`` does; ``truncation_direction=left`` is refused."""
    server, reference = colbert_setup
    long = " ".join(["word"] * 400)
    embeddings, counts = _raw(server, protocol, [long], "document")
    got = [e[: int(n)] for e, n in zip(embeddings, counts.reshape(-1), strict=True)]
    assert _worst(got, _library(reference, [long], "document")) <= MAX_ABS_DIFF
    for parameters, message in (({"truncate": False}, "TEXT row 0 has"),
                                ({"truncation_direction": "left"}, "not available for multi")):
        with pytest.raises(InferenceServerException) as refused:
            _raw(server, protocol, [long], "document", **parameters)
        assert str(refused.value.status()) == INVALID[protocol]
        assert message in str(refused.value.message())
    _raw(server, protocol, ["short"], "document", truncate=False)  # within the limit: fine
