"""Output precision per request on the real server: float16, int8, uint8, binary, ubinary.

Each form must equal ``quantize_embeddings`` of the float32 rows the same server answers
(int8 / uint8 with the ranges of the calibration embeddings stored in the encoder's
version folder), float16 the float32 rows cast. A bad ``precision`` fails its own request
only; a model without the forms (CLIP) refuses them.
"""

from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from client import EmbeddingClientError
from embed_runtime.engines.output_precision import CALIBRATION_FILE, quantization_ranges
from embed_runtime.text.request_options import truncate
from tests.integration.clip_fixture import CLIP_MODEL
from tests.integration.conftest import TEXT_MODEL
from tests.integration.test_fused_tokenize import MODEL as FUSED_MODEL
from tests.integration.test_fused_tokenize import fused_server  # noqa: F401 - fixture

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from sentence_transformers.quantization import quantize_embeddings

pytestmark = pytest.mark.integration

LIBRARY_FORMS = ("int8", "uint8", "binary", "ubinary")
DTYPES = {"float16": np.float16, "int8": np.int8, "uint8": np.uint8, "binary": np.int8}
DTYPES["ubinary"] = np.uint8


def _calibration(server, model: str) -> np.ndarray:
    return np.load(server.repo / f"{model}_encode" / "1" / CALIBRATION_FILE)


def _check_forms(client, model: str, texts: list[str], calib: np.ndarray, **options) -> None:
    floats = client.embed_texts(model, texts, **options)
    ranges = quantization_ranges(truncate(calib, floats.shape[1], True))
    got = client.embed_texts(model, texts, precision="float16", **options)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, floats.astype(np.float16))
    for precision in LIBRARY_FORMS:
        got = client.embed_texts(model, texts, precision=precision, **options)
        want = quantize_embeddings(floats, precision, ranges=ranges)
        assert got.dtype == want.dtype == DTYPES[precision]
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want, err_msg=f"{model} {precision} {options}")


def test_every_form_equals_quantize_embeddings_of_the_served_floats(server, client, corpus) -> None:
    calib = _calibration(server, TEXT_MODEL)
    assert calib.shape == (227, 384) and calib.dtype == np.float32
    _check_forms(client, TEXT_MODEL, corpus[:60], calib)
    packed = client.embed_texts(TEXT_MODEL, corpus[:3], precision="ubinary")
    assert packed.shape == (3, 48)  # 384 bits in 48 bytes: 32x fewer than 1,536 of float32


def test_forms_of_truncated_dimensions_use_ranges_of_the_cut_calibration(
    server, client, corpus
) -> None:
    calib = _calibration(server, TEXT_MODEL)
    _check_forms(client, TEXT_MODEL, corpus[60:90], calib, dimensions=100)
    assert client.embed_texts(TEXT_MODEL, ["x"], precision="binary", dimensions=100).shape == (
        1,
        13,
    )


def test_the_fused_model_answers_the_same_forms(fused_server, corpus) -> None:  # noqa: F811
    calib = _calibration(fused_server, FUSED_MODEL)
    for protocol in ("http", "grpc"):
        with fused_server.client(protocol) as client:
            _check_forms(client, FUSED_MODEL, corpus[:40], calib, prompt_name="query")


def test_rows_split_across_requests_keep_their_form(server, corpus) -> None:
    texts = corpus[:40]  # over max_batch_size: three requests
    with server.client("grpc") as client:
        one_by_one = np.concatenate(
            [client.embed_texts(TEXT_MODEL, [t], precision="int8") for t in texts[:5]]
        )
        together = client.embed_texts(TEXT_MODEL, texts, precision="int8")
    assert together.shape == (40, 384)
    np.testing.assert_array_equal(together[:5], one_by_one)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_output_asked_without_the_parameter_is_answered_alone(server, protocol) -> None:
    """A raw request names only EMBEDDING_UBINARY: Triton returns only that output."""
    with server.client(protocol) as client:
        want = client.embed_texts(TEXT_MODEL, ["a cat", "a dog"], precision="ubinary")
        tc, raw = client._tc, client._client
        data = np.array([[b"a cat"], [b"a dog"]], dtype=object)
        text = tc.InferInput("TEXT", [2, 1], "BYTES")
        text.set_data_from_numpy(data)
        result = raw.infer(
            TEXT_MODEL, [text], outputs=[tc.InferRequestedOutput("EMBEDDING_UBINARY")]
        )
        response = result.get_response()
        names = (
            [o["name"] for o in response["outputs"]]
            if isinstance(response, dict)
            else [o.name for o in response.outputs]
        )
    assert names == ["EMBEDDING_UBINARY"]
    np.testing.assert_array_equal(result.as_numpy("EMBEDDING_UBINARY"), want)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_bad_precision_fails_alone_among_concurrent_requests(server, protocol) -> None:
    def send(i: int):
        with server.client(protocol) as client:
            tc, raw = client._tc, client._client
            text = tc.InferInput("TEXT", [1, 1], "BYTES")
            text.set_data_from_numpy(np.array([[f"sentence {i}".encode()]], dtype=object))
            bad = i % 4 == 0
            parameters = {"precision": "int4" if bad else "int8"}
            output = "EMBEDDING_INT8"
            try:
                result = raw.infer(
                    TEXT_MODEL,
                    [text],
                    outputs=[tc.InferRequestedOutput(output)],
                    parameters=parameters,
                )
            except InferenceServerException as exc:  # the refusal is the result
                return bad, str(exc)
            return bad, result.as_numpy(output)

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(send, range(24)))
    for bad, out in results:
        if bad:
            assert isinstance(out, str) and "unknown precision 'int4'" in out
            assert "INVALID_ARG" in out or "400" in out or "invalid" in out.lower()
        else:
            assert isinstance(out, np.ndarray) and out.dtype == np.int8 and out.shape == (1, 384)


def test_clip_text_refuses_a_quantized_form(server) -> None:
    for protocol in ("http", "grpc"):
        with server.client(protocol) as client:
            with pytest.raises(EmbeddingClientError, match="precision 'int8'|EMBEDDING_INT8"):
                client.embed_texts(f"{CLIP_MODEL}_text", ["a photo of a cat"], precision="int8")
            plain = client.embed_texts(f"{CLIP_MODEL}_text", ["a photo"], precision="float32")
            assert plain.dtype == np.float32
