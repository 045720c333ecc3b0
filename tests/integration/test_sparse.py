"""The sparse-encoder family served by a real Triton agrees with ``SparseEncoder.encode``.

A server of this module's own serves a tiny random SPLADE model
(``generator/fixtures/tiny_splade.py``: max pooling, relu, 64-token limit) twice: ``sp``
(every active dimension) and ``sp-k16`` (manifest ``max_active_dims = 16``). ``TEXT``
[N, 1] -> ``SPARSE_INDICES`` INT32 / ``SPARSE_VALUES`` FP32 [N, K], K the largest count of
active dimensions among the rows of that request. Over HTTP and gRPC, the rows made dense
again equal ``SparseEncoder.encode``; an empty text fails its own request alone.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from client import EmbeddingClientError
from generator.fixtures.tiny_splade import create_tiny_inference_free_splade, create_tiny_splade
from tests.integration import text_helpers
from tests.integration.families import entry, serve_models
from tests.integration.text_helpers import PROTOCOLS, concurrently, infer, plain_request_outputs
from tests.st_factory import parity_texts

pytestmark = pytest.mark.integration

MAX_ABS_DIFF = 1e-5
K = 16
OUTPUTS = ("SPARSE_INDICES", "SPARSE_VALUES")


@pytest.fixture(scope="module")
def sparse_setup(tmp_path_factory):
    """Build the tiny SPLADE model, its repository and the reference; start Triton."""
    from sentence_transformers import SparseEncoder

    base = tmp_path_factory.mktemp("sparse")
    folder = create_tiny_splade(base / "tiny-splade", seed=3)
    free = create_tiny_inference_free_splade(base / "tiny-free", seed=4)
    entries = [
        entry("sp", "sparse-encoder", folder),
        entry("sp-k16", "sparse-encoder", folder, max_active_dims=K),
        entry("free", "sparse-encoder", free),
    ]
    reference = SparseEncoder(str(folder), device="cpu")
    with serve_models(base, entries) as server:
        yield server, reference


@pytest.fixture(scope="module")
def free_reference(sparse_setup):
    """The inference-free model as the library loads it (its own folder)."""
    from sentence_transformers import SparseEncoder

    server, _ = sparse_setup
    return SparseEncoder(server.manifest.get("free").source, device="cpu")


def _encode(reference, texts, k=None, encode=None) -> np.ndarray:
    """The library's dense rows of ``texts`` (``encode``: one of its encode methods)."""
    encode = encode or reference.encode
    dense = encode(
        texts,
        batch_size=16,
        max_active_dims=k,
        convert_to_tensor=True,
        convert_to_sparse_tensor=False,
    )
    return dense.numpy()


def _dense(rows, size: int) -> np.ndarray:
    out = np.zeros((len(rows), size), np.float32)
    for i, (index, value) in enumerate(rows):
        out[i, index] = value
    return out


def _raw(
    server, protocol: str, model: str, texts, parameters=None
) -> tuple[np.ndarray, np.ndarray]:
    return infer(server, protocol, model, {"TEXT": texts}, OUTPUTS, parameters)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(("model", "k"), [("sp", None), ("sp-k16", K)])
def test_served_rows_equal_sparse_encoder_encode(sparse_setup, protocol, model, k):
    server, reference = sparse_setup
    texts = parity_texts()
    want = _encode(reference, texts, k)
    with server.client(protocol) as client:
        rows = client.embed_sparse(model, texts)
    got = _dense(rows, want.shape[1])
    diff = float(np.abs(got - want).max())
    counts = (want != 0).sum(1)
    print(
        f"\n{model} {protocol}: {len(texts)} texts, max|diff| {diff:.2e}, "
        f"active dims {counts.min()}-{counts.max()}"
    )
    assert diff <= MAX_ABS_DIFF
    for (index, value), row in zip(rows, want, strict=True):
        assert index.dtype == np.int32 and value.dtype == np.float32
        assert sorted(index.tolist()) == np.flatnonzero(row).tolist()
        assert (np.diff(value) <= 0).all()
    if k:
        assert counts.max() == k


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_each_request_is_as_wide_as_its_widest_row(sparse_setup, protocol):
    server, reference = sparse_setup
    texts = ["x", "a much longer text with many different words in it, about Triton"]
    indices, values = _raw(server, protocol, "sp", texts)
    counts = (_encode(reference, texts) != 0).sum(1)
    assert indices.dtype == np.int32 and values.dtype == np.float32
    assert indices.shape == values.shape == (2, counts.max())
    assert (indices[0, counts[0] :] == -1).all() and (values[0, counts[0] :] == 0).all()
    narrow, _ = _raw(server, protocol, "sp", texts[:1])
    assert narrow.shape == (1, counts[0])
    indices, _ = _raw(server, protocol, "sp-k16", texts)
    assert indices.shape == (2, K)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_empty_text_fails_its_own_request_alone(sparse_setup, protocol):
    server, reference = sparse_setup
    good = [["a cat sat on the mat", "sparse retrieval"], ["Triton"], ["one more request"]]
    requests = [*good, ["fine", "   "]]
    results = concurrently([partial(_raw, server, protocol, "sp", texts) for texts in requests])
    bad = results[len(good)]
    assert isinstance(bad, InferenceServerException)
    assert str(bad.status()) == text_helpers.INVALID[protocol]
    assert "TEXT row 1 is empty or whitespace only" in str(bad.message())
    for i, texts in enumerate(good):
        indices, values = results[i]
        want = _encode(reference, texts)
        rows = [(r[r >= 0], v[r >= 0]) for r, v in zip(indices, values, strict=True)]
        assert float(np.abs(_dense(rows, want.shape[1]) - want).max()) <= MAX_ABS_DIFF
    with server.client(protocol) as client, pytest.raises(EmbeddingClientError, match="empty"):
        client.embed_sparse("sp", [""])


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(("model", "k"), [("sp", 5), ("sp", 1), ("sp-k16", 40), ("sp-k16", 3)])
def test_request_max_active_dims_replaces_the_models_cap(sparse_setup, protocol, model, k):
    """A request's ``max_active_dims`` k is ``SparseEncoder.encode(max_active_dims=k)``,
    also above the manifest's cap of 16; requests with and without it share batches."""
    server, reference = sparse_setup
    texts = parity_texts()[:12]
    want = _encode(reference, texts, k)
    with server.client(protocol) as client:
        rows = client.embed_sparse(model, texts, max_active_dims=k)
    diff = float(np.abs(_dense(rows, want.shape[1]) - want).max())
    print(f"\n{model} k={k} {protocol}: max|diff| {diff:.2e}")
    assert diff <= MAX_ABS_DIFF
    assert max(len(index) for index, _ in rows) == min(k, int((want != 0).sum(1).max()))
    assert k <= K or max(len(index) for index, _ in rows) > K  # above the manifest's cap


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("value", [0, -3, 2.5, "many", True])
def test_a_bad_max_active_dims_fails_its_own_request_alone(sparse_setup, protocol, value):
    server, reference = sparse_setup
    cases = [{"max_active_dims": value}, {"max_active_dims": 4}, None]
    send = partial(_raw, server, protocol, "sp", ["a cat sat on the mat"])
    results = concurrently([partial(send, parameters) for parameters in cases])
    bad = results[0]
    assert isinstance(bad, InferenceServerException), bad
    assert str(bad.status()) == text_helpers.INVALID[protocol]
    assert "max_active_dims must be a positive integer" in str(bad.message())
    for i, k in ((1, 4), (2, None)):
        indices, values = results[i]
        want = _encode(reference, ["a cat sat on the mat"], k)
        rows = [(r[r >= 0], v[r >= 0]) for r, v in zip(indices, values, strict=True)]
        assert float(np.abs(_dense(rows, want.shape[1]) - want).max()) <= MAX_ABS_DIFF


# --- inference-free (Router: static query weights, SPLADE documents) --------------------


def _routed(reference, texts, task: str, k=None) -> np.ndarray:
    encode = reference.encode_query if task == "query" else reference.encode_document
    return _encode(reference, texts, k, encode)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("task", ["query", "document"])
def test_inference_free_routes_equal_encode_query_and_encode_document(
    sparse_setup, free_reference, protocol, task
):
    server, _ = sparse_setup
    reference = free_reference
    texts = parity_texts()
    want = _routed(reference, texts, task)
    with server.client(protocol) as client:
        rows = client.embed_sparse("free", texts, task=task)
        capped = client.embed_sparse("free", texts, task=task, max_active_dims=3)
    diff = float(np.abs(_dense(rows, want.shape[1]) - want).max())
    counts = (want != 0).sum(1)
    print(
        f"\nfree {task} {protocol}: {len(texts)} texts, max|diff| {diff:.2e}, "
        f"active dims {counts.min()}-{counts.max()}"
    )
    assert diff <= MAX_ABS_DIFF
    want_capped = _routed(reference, texts, task, 3)
    assert float(np.abs(_dense(capped, want.shape[1]) - want_capped).max()) <= MAX_ABS_DIFF
    other = _routed(reference, texts, "document" if task == "query" else "query")
    assert float(np.abs(other - want).max()) > 0.1  # the two routes differ


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_inference_free_defaults_to_documents_and_answers_queries_without_active_dims(
    sparse_setup, free_reference, protocol
):
    """No task: the Router's default route (document). A query none of whose tokens has
    a weight answers a well-formed row of padding (K at least 1)."""
    server, _ = sparse_setup
    reference = free_reference
    texts = ["a cat sat on the mat", "sparse retrieval with triton"]
    default = _raw(server, protocol, "free", texts)
    document = _raw(server, protocol, "free", texts, {"task": "document"})
    assert all(np.array_equal(a, b) for a, b in zip(default, document, strict=True))
    weights = reference[0].sub_modules["query"][0].weight.detach().numpy()
    tokenizer = reference[0].sub_modules["query"][0].tokenizer
    silent = next(
        w
        for w in ("hello", "world", "cat", "dog", "tree", "house", "river")
        if weights[tokenizer.convert_tokens_to_ids(w)] == 0
    )
    assert not _routed(reference, [silent], "query").any()
    indices, values = _raw(server, protocol, "free", [silent], {"task": "query"})
    assert indices.shape == values.shape == (1, 1)
    assert indices[0, 0] == -1 and values[0, 0] == 0


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_inference_free_mixed_tasks_share_batches_and_a_bad_task_fails_alone(
    sparse_setup, free_reference, protocol
):
    server, _ = sparse_setup
    reference = free_reference
    cases = [
        (["what is a sparse encoder?"], "query"),
        (["Triton serves models."], "document"),
        (["where is the river", "cats"], "query"),
        (["a document", "and another"], None),
        (["fine"], "passage"),
    ]
    send = partial(_raw, server, protocol, "free")
    results = concurrently(
        [partial(send, texts, {"task": task} if task else None) for texts, task in cases]
    )
    bad = results[len(cases) - 1]
    assert isinstance(bad, InferenceServerException), bad
    assert str(bad.status()) == text_helpers.INVALID[protocol]
    assert "task must be one of ['query', 'document']" in str(bad.message())
    for i, (texts, task) in enumerate(cases[:-1]):
        indices, values = results[i]
        want = _routed(reference, texts, task or "document")
        rows = [(r[r >= 0], v[r >= 0]) for r, v in zip(indices, values, strict=True)]
        assert float(np.abs(_dense(rows, want.shape[1]) - want).max()) <= MAX_ABS_DIFF


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_request_naming_no_output_gets_the_documented_outputs(sparse_setup, protocol):
    """Raw JSON with no ``outputs`` (HTTP) and gRPC: the family's documented outputs alone."""
    server = sparse_setup[0]
    got = plain_request_outputs(server, protocol, "sp", {"TEXT": ["a cat", "a dog"]})
    assert sorted(got) == sorted(["SPARSE_INDICES", "SPARSE_VALUES"])
