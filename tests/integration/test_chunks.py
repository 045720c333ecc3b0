"""``<name>_chunks`` on the real server: long texts cut in the served tokenizer's tokens.

Gates, against sentence-transformers on the same weights: each chunk's vector is
``encode(text[start:end])`` within 1e-5; each span re-tokenizes to at most
``chunk_tokens``; the spans cover every token of their row; a row that fits one window is
one chunk equal to the plain ensemble's answer; ``long_text=mean`` is the token-weighted
mean of the chunk vectors, normalised; ``late_chunking`` equals a reference written here
from the library's token embeddings and the published algorithm, rows longer than the
window included, and so do rows joined as pieces of one document. Every refusal names
its reason.
"""

from __future__ import annotations

import unicodedata

import numpy as np
import pytest

from client import EmbeddingClientError
from client.load.corpus import varied_sentences
from tests.integration.clip_fixture import CLIP_MODEL
from tests.integration.conftest import TEXT_MODEL
from tests.integration.text_helpers import assert_parity, infer, model_stats, wait_stats

pytestmark = pytest.mark.integration

CHUNKS = f"{TEXT_MODEL}_chunks"
OUTPUTS = ["EMBEDDING", "CHUNK_ROW", "CHUNK_SPAN", "TOKEN_COUNT"]
WINDOW_ROOM = 254  # all-MiniLM-L6-v2: 256 tokens less [CLS] and [SEP]


@pytest.fixture(scope="module")
def documents() -> list[str]:
    """Rows of about 60, 700 and 2,500 tokens, joined from varied sentences."""
    sentences = varied_sentences(300)
    return [" ".join(sentences[:4]), " ".join(sentences[4:60]), " ".join(sentences[60:260])]


def _tokens(reference, text: str) -> list[tuple[int, int]]:
    """The offsets of ``text``'s tokens in the reference tokenizer, no special tokens."""
    encoded = reference.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return encoded["offset_mapping"]


def _check_chunks(reference, texts, chunks, size: int) -> None:
    spans = [texts[c.row][c.start : c.end] for c in chunks]
    want = reference.encode(spans, normalize_embeddings=True, batch_size=32)
    assert_parity(np.stack([c.vector for c in chunks]), want)
    for row, text in enumerate(texts):
        mine = [c for c in chunks if c.row == row]
        assert mine and [c.start for c in mine] == sorted(c.start for c in mine)
        for chunk in mine:
            own = len(_tokens(reference, text[chunk.start : chunk.end]))
            assert own == chunk.tokens <= size
        for start, end in _tokens(reference, text):  # every token lies in a chunk
            assert any(c.start <= start and end <= c.end for c in mine), (row, start)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_chunks_are_sentence_transformers_of_their_spans(
    server, reference, documents, protocol
) -> None:
    with server.client(protocol) as client:
        chunks = client.embed_chunks(TEXT_MODEL, documents)
        plain = client.embed_texts(TEXT_MODEL, documents[:1])
    _check_chunks(reference, documents, chunks, WINDOW_ROOM)
    first = [c for c in chunks if c.row == 0]
    assert len(first) == 1 and (first[0].start, first[0].end) == (0, len(documents[0]))
    assert_parity(first[0].vector[None], plain[:1])  # one window: today's answer
    assert len([c for c in chunks if c.row == 2]) >= 9  # ~2,500 tokens, 254 a chunk


def test_small_overlapping_chunks_end_at_word_boundaries(server, reference) -> None:
    text = " ".join(s for s in varied_sentences(300) if s.isascii())  # spaces between words
    with server.client() as client:
        chunks = client.embed_chunks(TEXT_MODEL, [text], chunk_tokens=64, chunk_overlap=16)
    _check_chunks(reference, [text], chunks, 64)
    offsets = _tokens(reference, text)
    ends = [end for _, end in offsets]
    for before, after in zip(chunks, chunks[1:], strict=False):
        assert after.start < before.end  # neighbours share their overlap
        if text[before.end - 1].isalnum() and text[before.end].isalnum():
            # A cut inside a word only where no boundary lay in the last tenth (6 tokens).
            last = ends.index(before.end)
            tail = text[offsets[last - 5][0] : before.end]
            assert not any(c.isspace() or unicodedata.category(c)[0] == "P" for c in tail)


def test_long_text_mean_is_the_token_weighted_mean(server, reference, documents) -> None:
    with server.client("grpc") as client:
        chunks = client.embed_chunks(TEXT_MODEL, documents, chunk_tokens=128)
        means = client.embed_long_texts(TEXT_MODEL, documents, chunk_tokens=128)
    want = []
    for row, text in enumerate(documents):
        mine = [c for c in chunks if c.row == row]
        vectors = reference.encode([text[c.start : c.end] for c in mine], normalize_embeddings=True)
        weights = np.array([c.tokens for c in mine], dtype=np.float64)
        mean = (vectors.astype(np.float64) * weights[:, None]).sum(0) / weights.sum()
        want.append(mean / np.linalg.norm(mean))
    assert_parity(means, np.stack(want).astype(np.float32))


def test_chunks_go_to_the_encoder_in_full_batches(server, documents) -> None:
    """40 chunks reach the encoder as requests of the ensemble's batch size (16), no fewer."""
    text = documents[2]
    before = model_stats(server, f"{TEXT_MODEL}_encode")
    with server.client() as client:
        chunks = client.embed_chunks(TEXT_MODEL, [text], chunk_tokens=60)
    delta = wait_stats(server, f"{TEXT_MODEL}_encode", before, len(chunks))
    assert len(chunks) >= 33 and delta.inferences == len(chunks)
    assert delta.executions <= -(-len(chunks) // 16)


REFUSED = [
    ({"chunk_tokens": 7}, "chunk_tokens must be at least 8"),
    ({"chunk_tokens": 255}, "over the model's window"),
    ({"chunk_tokens": 32, "chunk_overlap": 32}, "chunk_overlap=32 must be below chunk_tokens=32"),
    ({"truncate": False}, "truncate=false does not apply to chunks"),
    ({"long_text": "max"}, "long_text must be one of"),
    ({"precision": "int8"}, "does not offer precision 'int8'"),
]


@pytest.mark.parametrize(("parameters", "reason"), REFUSED)
def test_bad_chunk_options_are_refused_with_the_reason(server, parameters, reason) -> None:
    with pytest.raises(Exception, match="400|INVALID_ARG") as caught:
        infer(server, "http", CHUNKS, {"TEXT": ["a long text"]}, ["EMBEDDING"], parameters)
    assert reason in str(caught.value)


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (TEXT_MODEL, f"send the request to {CHUNKS}"),
        (f"{CLIP_MODEL}_text", "this model kind does not cut texts into chunks"),
    ],
)
def test_chunk_options_elsewhere_are_refused_by_name(server, model, reason) -> None:
    with pytest.raises(Exception, match="chunk_tokens is not taken by this model") as caught:
        infer(server, "grpc", model, {"TEXT": ["a text"]}, ["EMBEDDING"], {"chunk_tokens": 64})
    assert reason in str(caught.value)


def test_a_request_over_the_chunk_bound_is_refused_not_cut(server) -> None:
    words = " ".join(["a"] * (8 * 4096 + 8))  # 4,097 chunks of 8 tokens
    with server.client() as client, pytest.raises(EmbeddingClientError) as caught:
        client.embed_chunks(TEXT_MODEL, [words], chunk_tokens=8)
    assert "4097 chunks" in caught.value.message and "bound of 4096" in caught.value.message
    with server.client() as client, pytest.raises(EmbeddingClientError) as caught:
        client.embed_chunks(TEXT_MODEL, ["a " * (1 << 19) + "b"])
    assert "max_text_bytes=1048576" in caught.value.message
    with server.client() as client:  # the server goes on
        assert len(client.embed_chunks(TEXT_MODEL, ["still here"])) == 1


# Late chunking's reference, written here from sentence-transformers' token embeddings and
# the published algorithm (github.com/jina-ai/late-chunking, chunked_pooling/
# mteb_chunked_eval.py: _embed_with_overlap, _extend_special_tokens; chunked_pooling/
# __init__.py: chunked_pooling), with the server's window: max_seq_length, overlap half.


def _token_vectors(reference, ids: list[int]) -> np.ndarray:
    """The Transformer's output of every token, in windows as the published code runs them."""
    import torch

    window = reference.max_seq_length
    overlap = window // 2
    starts = [0] if len(ids) <= window else range(0, len(ids), window - overlap)
    parts = []
    for start in starts:
        piece = torch.tensor([ids[start : start + window]])
        features = {"input_ids": piece, "attention_mask": torch.ones_like(piece)}
        features["token_type_ids"] = torch.zeros_like(piece)
        with torch.no_grad():
            out = reference[0](features)["token_embeddings"][0].numpy()
        parts.append(out if start == 0 else out[overlap:])
    return np.concatenate(parts)


def _late_reference(reference, document: str, spans: list[tuple[int, int]]) -> np.ndarray:
    """Per character span of ``document``: its late-chunked vector."""
    import torch

    encoded = reference.tokenizer(document, return_offsets_mapping=True)
    ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    vectors = _token_vectors(reference, ids)
    pooled = []
    for n, (start, end) in enumerate(spans):
        inside = [j for j, (a, b) in enumerate(offsets) if b > a and start <= a and b <= end]
        first = 0 if n == 0 else inside[0]  # the first chunk takes [CLS], the last [SEP]
        last = len(ids) if n == len(spans) - 1 else inside[-1] + 1
        pooled.append(vectors[first:last].mean(axis=0))
    features = {"sentence_embedding": torch.tensor(np.stack(pooled))}
    for module in list(reference)[2:]:  # the modules after Pooling: Normalize here
        features = module(features)
    return features["sentence_embedding"].numpy()


def test_late_reference_reads_the_library_token_embeddings(reference, documents) -> None:
    ids = reference.tokenizer(documents[0])["input_ids"]
    want = reference.encode(documents[0], output_value="token_embeddings")
    assert_parity(_token_vectors(reference, ids), want.numpy())


@pytest.mark.parametrize(("protocol", "size"), [("http", None), ("grpc", 48)])
def test_late_chunks_match_the_published_algorithm(
    server, reference, documents, protocol, size
) -> None:
    parameters = {"late_chunking": True, **({"chunk_tokens": size} if size else {})}
    vectors, rows, spans, counts = infer(
        server, protocol, CHUNKS, {"TEXT": documents}, OUTPUTS, parameters
    )
    rows = rows.reshape(-1)
    for row, text in enumerate(documents):
        mine = [tuple(span) for span, r in zip(spans, rows, strict=True) if r == row]
        assert mine[0][0] == 0 and mine[-1][1] == len(text)
        assert_parity(vectors[rows == row], _late_reference(reference, text, mine))
    assert counts.reshape(-1).max() <= (size or WINDOW_ROOM)
    assert (rows == 2).sum() >= 2500 // (size or WINDOW_ROOM)  # past the window: windows


def test_joined_rows_are_one_document_pieces(server, reference) -> None:
    pieces = [s for s in varied_sentences(120) if s.isascii()][:16]  # one request: <= 16 rows
    joined = {"late_chunking": True, "join_rows": True}
    vectors, rows, spans, _ = infer(server, "http", CHUNKS, {"TEXT": pieces}, OUTPUTS, joined)
    assert rows.reshape(-1).tolist() == list(range(len(pieces)))
    assert spans.tolist() == [[0, len(p)] for p in pieces]
    document, at, bounds = " ".join(pieces), 0, []
    for piece in pieces:
        bounds.append((at, at + len(piece)))
        at += len(piece) + 1
    assert_parity(vectors, _late_reference(reference, document, bounds))
    alone = reference.encode(pieces, normalize_embeddings=True)
    assert float(np.abs(vectors - alone).max()) > 1e-2  # context changed them


def test_late_chunking_on_a_model_built_without_it_is_refused(server) -> None:
    with pytest.raises(Exception, match="late_chunking is not built for this model"):
        infer(
            server,
            "http",
            "minilm-int8_chunks",
            {"TEXT": ["a text"]},
            OUTPUTS,
            {"late_chunking": True},
        )
    with pytest.raises(Exception, match="join_rows applies to late_chunking=true only"):
        infer(server, "http", CHUNKS, {"TEXT": ["a text"]}, OUTPUTS, {"join_rows": True})


def test_late_chunking_and_plain_chunks_side_by_side_neither_waits_for_the_other(
    server, documents
) -> None:
    """The late transformer runs off the chunks step's event loop, and each request is
    answered when its own work is done: short plain chunk requests sent while a long
    late-chunking one runs are all answered before it (on the old code the late run held
    the event loop, and every request of its execution waited for it)."""
    import threading

    book = " ".join(documents * 2)  # many transformer windows
    finished: list[str] = []
    lock = threading.Lock()

    def record(name: str, call) -> None:
        try:
            call()
        except Exception as exc:
            name = f"{name} failed: {exc}"
        with lock:
            finished.append(name)

    def late() -> None:
        parameters = {"late_chunking": True}
        record(
            "late", lambda: infer(server, "http", CHUNKS, {"TEXT": [book] * 2}, OUTPUTS, parameters)
        )

    def plain(k: int) -> None:
        record("plain", lambda: infer(server, "http", CHUNKS, {"TEXT": [f"short {k}"]}, OUTPUTS))

    long_run = threading.Thread(target=late)
    long_run.start()
    shorts = [threading.Thread(target=plain, args=(k,)) for k in range(6)]
    for thread in shorts:
        thread.start()
    for thread in shorts:
        thread.join()
    long_run.join()
    assert finished == ["plain"] * 6 + ["late"]
