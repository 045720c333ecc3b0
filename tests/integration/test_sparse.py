"""The sparse-encoder family served by a real Triton agrees with ``SparseEncoder.encode``.

A server of this module's own serves a tiny random SPLADE model
(``generator/fixtures/tiny_splade.py``: max pooling, relu, 64-token limit) twice: ``sp``
(every active dimension) and ``sp-k16`` (manifest ``max_active_dims = 16``). ``TEXT``
[N, 1] -> ``SPARSE_INDICES`` INT32 / ``SPARSE_VALUES`` FP32 [N, K], K the largest count of
active dimensions among the rows of that request. Over HTTP and gRPC, the rows made dense
again equal ``SparseEncoder.encode``; an empty text fails its own request alone.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from client import EmbeddingClient, EmbeddingClientError
from generator.admin import KEY_ENV
from generator.build import build_repository
from generator.fixtures.tiny_splade import create_tiny_splade
from generator.manifest import parse_manifest
from generator.shared_models import startup_models
from generator.triton_local import TritonLaunch, TritonPorts, TritonProcess, free_ports
from tests.integration.conftest import ADMIN_KEY, Server
from tests.st_factory import parity_texts

pytestmark = pytest.mark.integration

MAX_BATCH = 8
MAX_ABS_DIFF = 1e-5
K = 16
PROTOCOLS = ["http", "grpc"]
INVALID = {"http": "400", "grpc": "StatusCode.INVALID_ARGUMENT"}
_MODULES = {"http": httpclient, "grpc": grpcclient}


@pytest.fixture(scope="module")
def sparse_setup(tmp_path_factory):
    """Build the tiny SPLADE model, its repository and the reference; start Triton."""
    from sentence_transformers import SparseEncoder

    base = tmp_path_factory.mktemp("sparse")
    folder = create_tiny_splade(base / "tiny-splade", seed=3)
    common = {"family": "sparse-encoder", "source": str(folder), "max_batch_size": MAX_BATCH,
              "max_queue_delay_us": 20000, "max_rows_per_run": 4}
    manifest = parse_manifest({"models": [{"name": "sp", **common},
                                          {"name": "sp-k16", "max_active_dims": K, **common}]},
                              base)
    repo = base / "model_repository"
    build_repository(manifest, repo, log=lambda _msg: None)
    reference = SparseEncoder(str(folder), device="cpu")
    ports = TritonPorts(*free_ports(3))
    launch = TritonLaunch(repo, ports, load_models=startup_models(manifest), admin_key=ADMIN_KEY)
    process = TritonProcess(launch, base / "work", extra_env={KEY_ENV: ADMIN_KEY})
    process.start()
    try:
        process.wait_ready(timeout_s=float(os.environ.get("TRITON_START_TIMEOUT", 240)))
        yield Server(ports, manifest, repo, process), reference
    finally:
        process.stop()


def _encode(reference, texts, k=None) -> np.ndarray:
    return reference.encode(texts, batch_size=16, max_active_dims=k, convert_to_tensor=True,
                            convert_to_sparse_tensor=False).numpy()


def _dense(rows, size: int) -> np.ndarray:
    out = np.zeros((len(rows), size), np.float32)
    for i, (index, value) in enumerate(rows):
        out[i, index] = value
    return out


def _raw(server, protocol: str, model: str, texts) -> tuple[np.ndarray, np.ndarray]:
    module = _MODULES[protocol]
    tc = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    try:
        array = np.array([t.encode() for t in texts], dtype=np.object_).reshape(-1, 1)
        inp = module.InferInput("TEXT", list(array.shape), "BYTES")
        inp.set_data_from_numpy(array)
        result = tc.infer(model, [inp])
        return result.as_numpy("SPARSE_INDICES"), result.as_numpy("SPARSE_VALUES")
    finally:
        tc.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(("model", "k"), [("sp", None), ("sp-k16", K)])
def test_served_rows_equal_sparse_encoder_encode(sparse_setup, protocol, model, k):
    server, reference = sparse_setup
    texts = parity_texts()
    want = _encode(reference, texts, k)
    url = server.http_url if protocol == "http" else server.grpc_url
    with EmbeddingClient(url, protocol) as client:
        rows = client.embed_sparse(model, texts)
    got = _dense(rows, want.shape[1])
    diff = float(np.abs(got - want).max())
    counts = (want != 0).sum(1)
    print(f"\n{model} {protocol}: {len(texts)} texts, max|diff| {diff:.2e}, "
          f"active dims {counts.min()}-{counts.max()}")
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
    assert (indices[0, counts[0]:] == -1).all() and (values[0, counts[0]:] == 0).all()
    narrow, _ = _raw(server, protocol, "sp", texts[:1])
    assert narrow.shape == (1, counts[0])
    indices, _ = _raw(server, protocol, "sp-k16", texts)
    assert indices.shape == (2, K)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_empty_text_fails_its_own_request_alone(sparse_setup, protocol):
    server, reference = sparse_setup
    good = [["a cat sat on the mat", "sparse retrieval"], ["Triton"], ["one more request"]]
    results: dict[int, object] = {}

    def send(i: int, texts) -> None:
        try:
            results[i] = _raw(server, protocol, "sp", texts)
        except InferenceServerException as exc:
            results[i] = exc

    requests = [*good, ["fine", "   "]]
    threads = [threading.Thread(target=send, args=(i, t)) for i, t in enumerate(requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bad = results[len(good)]
    assert isinstance(bad, InferenceServerException)
    assert str(bad.status()) == INVALID[protocol]
    assert "TEXT row 1 is empty or whitespace only" in str(bad.message())
    for i, texts in enumerate(good):
        indices, values = results[i]
        want = _encode(reference, texts)
        rows = [(r[r >= 0], v[r >= 0]) for r, v in zip(indices, values, strict=True)]
        assert float(np.abs(_dense(rows, want.shape[1]) - want).max()) <= MAX_ABS_DIFF
    url = server.http_url if protocol == "http" else server.grpc_url
    with EmbeddingClient(url, protocol) as client, pytest.raises(EmbeddingClientError,
                                                                 match="empty"):
        client.embed_sparse("sp", [""])
