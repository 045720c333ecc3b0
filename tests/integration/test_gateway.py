"""The OpenAI-compatible gateway (deploy/gateway/openai_gateway.py, its own venv) before Triton.

The session's Triton (conftest ``server``: all-MiniLM-L6-v2 with ``max_batch_size`` 16 and
``token_count``, minilm-int8 with ``litellm = true`` as shipped, clip-tiny) and one
gateway process for the module, started from ``.build/gateway-venv`` (``make gateway``) by
``deploy/gateway/run_gateway.sh`` with the config ``python -m generator gateway-config``
writes for that manifest. The clients are the real ones a user runs: the ``openai`` SDK,
LangChain's ``OpenAIEmbeddings`` and LlamaIndex's ``OpenAILikeEmbedding``, over real HTTP;
vectors against sentence-transformers (max abs 1e-5) and against Triton's own answer.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import secrets
import subprocess
import sys
import urllib.error
import urllib.request
from functools import partial

import numpy as np
import pytest

from client.load.corpus import varied_sentences
from generator.gateway import RUN_GATEWAY, GatewayProcess, write_gateway_config
from generator.triton_local import free_ports
from tests.integration.clip_fixture import CLIP_MODEL
from tests.integration.conftest import INT8_MODEL, MAX_BATCH, TEXT_MODEL
from tests.integration.text_helpers import (
    assert_framework_parity,
    assert_parity,
    langchain_openai_embeddings,
)

pytestmark = pytest.mark.integration

START_TIMEOUT_S = float(os.environ.get("GATEWAY_START_TIMEOUT", 180))
TEXTS = [
    *varied_sentences(2 * MAX_BATCH + 3),  # three requests of <= 16 rows to Triton
    "¿Dónde está la biblioteca?",
    "naïve café — 東京",
    "The quick brown fox jumps over the lazy dog. " * 40,
]


class Gateway(GatewayProcess):
    """The running gateway, with a raw POST for the error cases."""

    def post(self, body: dict | bytes, key: str | None = None, **headers: str):
        """POST ``body`` to /v1/embeddings; (status, decoded JSON answer).

        The answer's headers are kept in :attr:`headers`."""
        headers = {"Content-Type": "application/json", **headers}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}/v1/embeddings", data, headers)
        try:
            with urllib.request.urlopen(request, timeout=120) as answer:
                self.headers = answer.headers
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as error:
            self.headers = error.headers
            return error.code, json.loads(error.read())


@pytest.fixture(scope="module")
def gateway(server, tmp_path_factory):
    """The gateway of the session server's manifest, from ``make gateway``'s venv."""
    base = tmp_path_factory.mktemp("gateway")
    config = base / "config.yaml"
    write_gateway_config(server.manifest, config)
    (port,) = free_ports(1)
    key = "sk-" + secrets.token_hex(16)
    gw = Gateway(config, f"http://{server.http_url}", key, port, base / "gateway.log")
    try:
        gw.start()
        gw.wait_ready(START_TIMEOUT_S)
        yield gw
    finally:
        gw.stop()


@pytest.fixture(scope="module")
def openai_client(gateway):
    import openai

    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key, max_retries=0)


def _want(reference, texts, **kwargs) -> np.ndarray:
    return reference.encode(texts, normalize_embeddings=True, **kwargs).astype(np.float64)


def _rows(response) -> np.ndarray:
    assert [d.index for d in response.data] == list(range(len(response.data)))
    return np.asarray([d.embedding for d in response.data], dtype=np.float32)


def _triton_token_count(server, texts) -> int:
    with server.client() as c:
        return int(c.embed_texts_with_counts(TEXT_MODEL, texts)[1].sum())


def test_openai_sdk_list_equals_sentence_transformers_with_usage_from_token_count(
    server, openai_client, reference
) -> None:
    response = openai_client.embeddings.create(
        model=TEXT_MODEL, input=TEXTS, encoding_format="float"
    )
    got = _rows(response)
    gap, diff = assert_parity(got, _want(reference, TEXTS))
    print(f"\nopenai SDK via gateway: {len(TEXTS)} texts, 1-cos {gap:.1e}, max|diff| {diff:.1e}")
    assert response.model == TEXT_MODEL
    assert response.usage.prompt_tokens == _triton_token_count(server, TEXTS)
    assert response.usage.total_tokens == response.usage.prompt_tokens


def test_openai_sdk_string_input_and_base64_give_the_same_floats(openai_client, reference) -> None:
    text = TEXTS[0]
    plain = openai_client.embeddings.create(model=TEXT_MODEL, input=text, encoding_format="float")
    # The SDK's default: it asks for base64 and decodes it itself.
    default = openai_client.embeddings.create(model=TEXT_MODEL, input=text)
    assert len(plain.data) == 1
    assert_parity(_rows(plain), _want(reference, [text]))
    assert np.array_equal(_rows(default), _rows(plain))


def test_raw_base64_answer_is_little_endian_float32_of_the_float_answer(gateway) -> None:
    body = {"model": TEXT_MODEL, "input": TEXTS[:3]}
    status, floats = gateway.post({**body, "encoding_format": "float"}, gateway.key)
    assert status == 200, floats
    status, encoded = gateway.post({**body, "encoding_format": "base64"}, gateway.key)
    assert status == 200, encoded
    for f, e in zip(floats["data"], encoded["data"], strict=True):
        assert isinstance(e["embedding"], str)
        decoded = np.frombuffer(base64.b64decode(e["embedding"]), dtype="<f4")
        assert np.array_equal(decoded, np.asarray(f["embedding"], dtype=np.float32))


@pytest.mark.parametrize("dimensions", [1, 64, 383])
def test_dimensions_is_matryoshka_truncation_as_sentence_transformers(
    openai_client, reference, dimensions
) -> None:
    response = openai_client.embeddings.create(
        model=TEXT_MODEL, input=TEXTS[:5], dimensions=dimensions
    )
    got = _rows(response)
    assert got.shape == (5, dimensions)
    assert_parity(got, _want(reference, TEXTS[:5], truncate_dim=dimensions))


def test_clip_text_tower_equals_triton_and_refuses_dimensions(server, openai_client) -> None:
    import openai

    name = f"{CLIP_MODEL}_text"
    texts = ["a photo of a cat", "a diagram"]
    response = openai_client.embeddings.create(model=name, input=texts, encoding_format="float")
    with server.client() as c:
        direct = c.embed_texts(name, texts)
    assert np.array_equal(_rows(response), direct)
    with pytest.raises(openai.BadRequestError, match="does not take dimensions"):
        openai_client.embeddings.create(model=name, input=texts, dimensions=8)


def test_usage_of_a_shipped_style_entry_is_the_models_token_count(
    server, openai_client, reference
) -> None:
    """``litellm = true`` without ``token_count`` (as the shipped all-MiniLM-L6-v2): the
    gateway calls ``<name>_openai``; usage equals the tokens sentence-transformers feeds
    its model (special tokens in, the long text cut at 256)."""
    response = openai_client.embeddings.create(model=INT8_MODEL, input=TEXTS)
    want = int(reference.preprocess(TEXTS)["attention_mask"].sum())
    print(f"\nusage of {INT8_MODEL} via gateway: {response.usage.prompt_tokens} (want {want})")
    assert response.usage.prompt_tokens == want
    assert response.usage.total_tokens == want
    assert response.model == INT8_MODEL
    with server.client() as c:
        direct = c.embed_texts(INT8_MODEL, TEXTS)
    assert np.array_equal(_rows(response), direct)


def test_int8_model_is_served_as_triton_answers_it(server, openai_client) -> None:
    response = openai_client.embeddings.create(model=INT8_MODEL, input=TEXTS[:3], user="u-1")
    with server.client() as c:
        direct = c.embed_texts(INT8_MODEL, TEXTS[:3])
    assert np.array_equal(_rows(response), direct)


def test_langchain_openai_embeddings_equal_sentence_transformers(gateway, reference) -> None:
    embeddings = langchain_openai_embeddings(f"{gateway.url}/v1", gateway.key, TEXT_MODEL, 20)
    assert_framework_parity(
        "LangChain via gateway", partial(_want, reference), TEXTS, embeddings.embed_documents,
        embeddings.embed_query, TEXTS[1],
    )


def test_llama_index_openai_like_embedding_equals_sentence_transformers(
    gateway, reference
) -> None:
    from llama_index.embeddings.openai_like import OpenAILikeEmbedding

    embedding = OpenAILikeEmbedding(
        model_name=TEXT_MODEL,
        api_base=f"{gateway.url}/v1",
        api_key=gateway.key,
        embed_batch_size=20,
        max_retries=0,
    )
    assert_framework_parity(
        "LlamaIndex via gateway", partial(_want, reference), TEXTS,
        embedding.get_text_embedding_batch, embedding.get_query_embedding, TEXTS[2],
    )


def _error(status_body: tuple[int, dict]) -> tuple[int, str]:
    status, body = status_body
    assert set(body) == {"error"}, body
    assert {"message", "type", "code"} <= set(body["error"]), body
    return status, body["error"]["message"]


def test_without_a_key_or_with_a_wrong_one_the_gateway_answers_401(gateway) -> None:
    body = {"model": TEXT_MODEL, "input": "hello"}
    status, message = _error(gateway.post(body))
    assert status == 401, message
    status, message = _error(gateway.post(body, "sk-" + secrets.token_hex(16)))
    assert status == 401, message


def test_openai_sdk_with_a_wrong_key_raises_authentication_error(gateway) -> None:
    import openai

    wrong = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="sk-wrong-key-0000", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.embeddings.create(model=TEXT_MODEL, input="hello")


def test_unknown_model_empty_and_too_many_inputs_are_openai_errors(gateway) -> None:
    key = gateway.key
    status, message = _error(gateway.post({"model": "no-such-model", "input": "x"}, key))
    assert status == 404, (status, message)
    assert "no-such-model" in message
    for empty in ([], "", ["a", ""]):
        status, message = _error(gateway.post({"model": TEXT_MODEL, "input": empty}, key))
        assert status == 400, (empty, status, message)
    status, message = _error(gateway.post({"model": TEXT_MODEL, "input": ["x"] * 2049}, key))
    assert status == 400 and "2048" in message, (status, message)
    image = {"model": f"{CLIP_MODEL}_text", "input": ["data:image/png;base64,iVBORw0KGgo="]}
    status, message = _error(gateway.post(image, key))
    assert status == 400 and "text only" in message, (status, message)
    status, message = _error(gateway.post({**image, "input": "x", "modality": "image"}, key))
    assert status == 400 and "text only" in message, (status, message)
    too_wide = {"model": TEXT_MODEL, "input": "x", "dimensions": 385}
    status, message = _error(gateway.post(too_wide, key))
    assert status == 400 and "dimensions" in message, (status, message)


def test_a_request_past_its_timeout_is_refused_by_triton_as_503_with_retry_after(
    gateway,
) -> None:
    """The client's timeout (the OpenAI SDK's ``X-Stainless-Read-Timeout``) becomes Triton's
    deadline: one that has passed when Triton reads it is refused there before any work, and
    the gateway answers that refusal as 503 with ``Retry-After``, in OpenAI's error shape."""
    body = {"model": TEXT_MODEL, "input": "hello"}
    status, message = _error(gateway.post(body, gateway.key, **{
        "X-Stainless-Read-Timeout": "0.000001"}))
    assert status == 503 and "deadline" in message, (status, message)
    assert gateway.headers["Retry-After"] == "1"
    status, answer = gateway.post(body, gateway.key, **{"X-Stainless-Read-Timeout": "30"})
    assert status == 200 and len(answer["data"][0]["embedding"]) == 384


def test_malformed_oversized_and_unknown_requests_are_refused_by_name(gateway) -> None:
    key = gateway.key
    status, message = _error(gateway.post(b"{not json", key))
    assert status == 400 and "not JSON" in message
    status, message = _error(gateway.post({"model": TEXT_MODEL, "input": "x", "n": 2}, key))
    assert status == 400 and "unsupported parameter: n" in message
    status, message = _error(gateway.post({"model": TEXT_MODEL, "input": [[1, 2]]}, key))
    assert status == 400 and "token arrays" in message
    # A body declared over 16 MiB is refused before a byte of it is read.
    connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=30)
    connection.putrequest("POST", "/v1/embeddings")
    connection.putheader("Authorization", f"Bearer {key}")
    connection.putheader("Content-Length", str(17 << 20))
    connection.endheaders()
    answer = connection.getresponse()
    assert answer.status == 413, answer.read()
    connection.close()
    # Only /health answers without the key; the model list needs it.
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{gateway.url}/v1/models", timeout=10)
    assert refused.value.code == 401
    models = urllib.request.Request(f"{gateway.url}/v1/models",
                                    headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(models, timeout=10) as answer:
        names = [m["id"] for m in json.loads(answer.read())["data"]]
    assert TEXT_MODEL in names and INT8_MODEL in names


def test_gateway_refuses_to_start_without_a_key(tmp_path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("model_list: []\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITELLM_MASTER_KEY")}
    run = subprocess.run(
        [str(RUN_GATEWAY), str(config)], env={**env, "GATEWAY_PYTHON": sys.executable},
        capture_output=True, text=True, timeout=30, check=False,
    )
    assert run.returncode == 2
    assert "refusing to start without an API key" in run.stderr
