"""A request that names no output gets the model's primary output, and nothing else.

Triton answers such a request with every output the ensemble declares, in no fixed
order, and the README's first curl (and most JSON clients, which read ``outputs[0]``)
send exactly that. So an ensemble declares ``EMBEDDING`` alone unless its manifest entry
opts into more (``token_count``, ``output_precisions``); those then come back too and are
always available by name. Checked with raw JSON over HTTP and with gRPC on the session
server: a text model with a bare entry (``litellm = true`` only, as shipped: its encoder
counts tokens for ``<name>_openai``, its plain ensemble still answers ``EMBEDDING``
alone), one that opted in, the CLIP ensembles. The
sparse, multi-vector and rerank families are checked beside their own servers.
"""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from tests.integration.clip_fixture import CLIP_MODEL
from tests.integration.conftest import INT8_MODEL, TEXT_MODEL
from tests.integration.text_helpers import PROTOCOLS, plain_request_outputs

pytestmark = pytest.mark.integration

TEXTS = ["a cat", "a dog"]
FORMS = ["EMBEDDING_FP16", "EMBEDDING_INT8", "EMBEDDING_UINT8", "EMBEDDING_BINARY",
         "EMBEDDING_UBINARY"]


def _png_data_uri() -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (40, 30), (200, 30, 60)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_bare_text_entry_answers_its_embeddings_alone(server, protocol):
    got = plain_request_outputs(server, protocol, INT8_MODEL, {"TEXT": TEXTS})
    assert got == {"EMBEDDING": [2, 384]}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_openai_ensemble_answers_embedding_and_token_count(server, protocol):
    got = plain_request_outputs(server, protocol, f"{INT8_MODEL}_openai", {"TEXT": TEXTS})
    assert got == {"EMBEDDING": [2, 384], "TOKEN_COUNT": [2, 1]}


def test_outputs_an_entry_opted_into_come_back_too(server):
    got = plain_request_outputs(server, "grpc", TEXT_MODEL, {"TEXT": TEXTS})
    assert sorted(got) == sorted(["EMBEDDING", "TOKEN_COUNT", *FORMS])
    assert got["EMBEDDING"] == [2, 384]
    assert got["TOKEN_COUNT"] == [2, 1]


def test_json_cannot_carry_an_fp16_form_so_such_a_model_wants_outputs_named(server):
    """Triton's JSON answers have no FP16: with ``float16`` among an entry's
    ``output_precisions``, a JSON request that names no output is refused whole
    (docs/requests.md)."""
    with pytest.raises(RuntimeError, match="HTTP 400: .*sending FP16 data via JSON"):
        plain_request_outputs(server, "http", TEXT_MODEL, {"TEXT": TEXTS})


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_clip_ensembles_answer_their_embeddings_alone(server, protocol):
    text = plain_request_outputs(server, protocol, f"{CLIP_MODEL}_text", {"TEXT": TEXTS})
    url = {"IMAGE_URL": [_png_data_uri()]}
    image = plain_request_outputs(server, protocol, f"{CLIP_MODEL}_image_url", url)
    assert list(text) == ["EMBEDDING"] and text["EMBEDDING"][0] == 2
    assert list(image) == ["EMBEDDING"] and image["EMBEDDING"][0] == 1
