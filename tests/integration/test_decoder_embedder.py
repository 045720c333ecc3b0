"""A decoder embedder (Qwen3-Embedding style) served by a real Triton agrees with the library.

The model: a tiny random Qwen3 (causal attention, rotary positions) saved by
sentence-transformers with last-token pooling, Normalize, a tokenizer that pads on the
left as Qwen3-Embedding's does, and a query prompt, all built offline here. The server
pads each chunk of rows its own way (rows sorted by length, padded to the chunk's
longest): what a user gets must still be ``SentenceTransformer.encode``'s vector, for
texts of very different lengths in one request, with and without the prompt, over HTTP
and gRPC. A negative control proves the comparison can fail: the same texts with the
prompt left out differ from the prompted reference far beyond the tolerance.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from generator.fixtures.common import (
    QWEN3_HEADS,
    minilm_tokenizer,
    pretrained_folder,
    seeded_model,
    tiny_config,
)
from generator.manifest import parse_manifest
from tests.integration.conftest import serve
from tests.st_factory import parity_texts

pytestmark = pytest.mark.integration

MAX_ABS_DIFF = 1e-5
HIDDEN = 32
QUERY_PROMPT = "Instruct: Given a question, find passages that answer it\nQuery: "
NAME = "tiny-qwen3"


def _build_decoder_embedder(folder: Path) -> Path:
    """A seeded random Qwen3 with last-token pooling and left padding, saved by the library."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import (
        Normalize,
        Pooling,
        Transformer,
    )
    from transformers import Qwen3Config, Qwen3Model

    tokenizer = minilm_tokenizer()
    config = tiny_config(Qwen3Config, tokenizer.vocab_size, hidden_size=HIDDEN, **QWEN3_HEADS)
    with pretrained_folder(seeded_model(Qwen3Model, config, 3), tokenizer, folder) as raw:
        transformer = Transformer(raw, max_seq_length=128, tokenizer_args={"padding_side": "left"})
        model = SentenceTransformer(
            modules=[transformer, Pooling(HIDDEN, pooling_mode="lasttoken"), Normalize()],
            prompts={"query": QUERY_PROMPT},
            device="cpu",
        )
        model.save(str(folder))
    return folder


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    """The model, the library's answers, and a server of this module's own serving it."""
    from sentence_transformers import SentenceTransformer

    base = tmp_path_factory.mktemp("decoder")
    folder = _build_decoder_embedder(base / "models" / NAME)
    reference = SentenceTransformer(str(folder), device="cpu")
    assert reference.tokenizer.padding_side == "left"
    texts = parity_texts()
    expected = {
        None: reference.encode(texts, normalize_embeddings=True),
        "query": reference.encode(texts, prompt_name="query", normalize_embeddings=True),
    }
    entry = {
        "name": NAME,
        "family": "sentence-transformers",
        "source": str(folder),
        "max_batch_size": 16,
        "max_rows_per_run": 4,
        "max_queue_delay_us": 20000,
    }
    manifest = parse_manifest({"models": [entry]}, base)
    with serve(manifest, base) as server:
        yield server, texts, expected


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("prompt_name", [None, "query"])
def test_decoder_embedder_matches_the_library(decoder, protocol, prompt_name) -> None:
    server, texts, expected = decoder
    lengths = sorted({len(t) for t in texts})
    assert lengths[-1] > 20 * max(lengths[0], 1), "the request must mix very different lengths"
    with server.client(protocol) as client:
        got = client.embed_texts(NAME, texts, prompt_name=prompt_name)
    want = expected[prompt_name]
    assert got.shape == want.shape
    worst = float(np.abs(got - want).max())
    assert worst <= MAX_ABS_DIFF, f"max abs {worst:.2e}"
    print(f"\n{NAME} {protocol} prompt={prompt_name}: max abs {worst:.2e} over {len(texts)} texts")


def test_rows_alone_and_in_a_mixed_request_get_the_same_vector(decoder) -> None:
    """Padding is the server's business: a row's vector does not depend on its neighbours."""
    server, texts, expected = decoder
    with server.client("grpc") as client:
        alone = np.stack([client.embed_texts(NAME, [t])[0] for t in texts[:6]])
        mixed = client.embed_texts(NAME, texts[:6])
    assert np.abs(alone - mixed).max() <= MAX_ABS_DIFF
    assert np.abs(alone - expected[None][:6]).max() <= MAX_ABS_DIFF


def test_the_comparison_can_fail(decoder) -> None:
    """Negative control: unprompted vectors are far from the prompted reference."""
    server, texts, expected = decoder
    with server.client("http") as client:
        unprompted = client.embed_texts(NAME, texts)
    assert np.abs(unprompted - expected["query"]).max() > 100 * MAX_ABS_DIFF
