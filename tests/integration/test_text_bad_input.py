"""Bad text input: each request fails alone with a clear message; the server keeps serving."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from client import EmbeddingClientError
from tests.integration.conftest import MAX_BATCH, TEXT_MODEL

pytestmark = pytest.mark.integration


def _raw_infer(server, protocol: str, array: np.ndarray, name: str = "TEXT", dtype: str = "BYTES"):
    module = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    tc = module.InferenceServerClient(url)
    inp = module.InferInput(name, list(array.shape), dtype)
    inp.set_data_from_numpy(array)
    return tc.infer(TEXT_MODEL, [inp]).as_numpy("EMBEDDING")


@pytest.mark.parametrize(
    ("text", "message"),
    [("", "empty or whitespace only"), ("  \t\n ", "empty or whitespace only")],
)
def test_empty_or_blank_text_is_rejected(client, text, message):
    with pytest.raises(EmbeddingClientError, match=message):
        client.embed_texts(TEXT_MODEL, ["fine", text])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_non_utf8_bytes_are_rejected(server, protocol):
    bad = np.array([[b"ok"], [b"\xff\xfe\xfa"]], dtype=np.object_)
    with pytest.raises(InferenceServerException, match="not valid UTF-8"):
        _raw_infer(server, protocol, bad)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_batch_larger_than_max_batch_size_is_refused_by_triton(server, protocol):
    rows = np.array([[b"text"]] * (MAX_BATCH + 1), dtype=np.object_)
    with pytest.raises(InferenceServerException, match="batch-size must be <= 16"):
        _raw_infer(server, protocol, rows)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_wrong_datatype_is_refused(server, protocol):
    with pytest.raises(
        InferenceServerException, match="data-type is .FP32., but .* expects .BYTES."
    ):
        _raw_infer(server, protocol, np.zeros((1, 1), dtype=np.float32), dtype="FP32")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_wrong_input_name_is_refused(server, protocol):
    rows = np.array([[b"text"]], dtype=np.object_)
    with pytest.raises(InferenceServerException, match="INPUT0|unexpected inference input"):
        _raw_infer(server, protocol, rows, name="INPUT0")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_request_with_zero_rows_is_refused(server, protocol):
    rows = np.zeros((0, 1), dtype=np.object_)
    with pytest.raises(InferenceServerException):
        _raw_infer(server, protocol, rows)


def test_bad_requests_do_not_fail_good_ones_in_the_same_batch(server):
    texts = ["good one", "", "another good one", "\xff", "   ", "third good"]

    def send(text: str):
        with server.client() as c:
            try:
                return c.embed_texts(TEXT_MODEL, [text])[0]
            except EmbeddingClientError as exc:
                return exc

    with ThreadPoolExecutor(len(texts) * 4) as pool:
        results = list(pool.map(send, texts * 4))
    for text, result in zip(texts * 4, results, strict=True):
        if text.strip():
            assert isinstance(result, np.ndarray), f"{text!r} failed: {result}"
        else:
            assert isinstance(result, EmbeddingClientError)
            assert "empty or whitespace" in str(result)


def test_server_keeps_serving_after_bad_input(client):
    for bad in ("", "   "):
        with pytest.raises(EmbeddingClientError):
            client.embed_texts(TEXT_MODEL, [bad])
    assert client.is_server_ready()
    assert client.embed_texts(TEXT_MODEL, ["still here"]).shape == (1, 384)
