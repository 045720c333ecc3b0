"""The cross-encoder family served by a real Triton agrees with ``CrossEncoder.predict``.

A server of this module's own serves a tiny random-initialised cross-encoder
(``generator/fixtures/tiny_rerank.py``, 64-token limit) as ``rr``: ``QUERY`` [N, 1] and
``TEXT`` [N, 1] -> ``SCORE`` [N, 1]. Requests mix short pairs with pairs far over the
limit (truncated ``longest_first``); concurrent requests share ragged executions run in
length-sorted chunks of 4 rows. Bad requests fail alone with INVALID_ARG.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from client import EmbeddingClientError
from client.cli import main as client_main
from generator.fixtures.tiny_rerank import create_tiny_cross_encoder
from tests.integration.families import MAX_BATCH, entry, score_pairs_together, serve_models
from tests.integration.text_helpers import INVALID, PROTOCOLS, infer, plain_request_outputs
from tests.rerank_data import QUERY, rerank_pairs

pytestmark = pytest.mark.integration

MODEL = "rr"
MULTI = "rr3"  # a 3-label (NLI-style) cross-encoder: SCORE [N, 3]
# Its scores are raw logits of a model drawn with wide weights; the library's own
# predictions of the same 24 pairs batched and one by one differ by 7.1e-6 (measured), so
# served logits are gated at 1e-4, as the LLM reranker's are.
MULTI_MAX_ABS_DIFF = 1e-4
MAX_TEXT_BYTES = 4096
MAX_REQUEST_TEXT_BYTES = 16384
MAX_ABS_DIFF = 1e-5
IN_ENSEMBLE = f"in ensemble '{MODEL}', "


@pytest.fixture(scope="module")
def rerank_setup(tmp_path_factory):
    """Build the tiny cross-encoder, its repository and the reference; start Triton."""
    from sentence_transformers import CrossEncoder

    base = tmp_path_factory.mktemp("rerank")
    folder = create_tiny_cross_encoder(base / "tiny-rerank", seed=5)
    reference = CrossEncoder(str(folder), device="cpu")
    limits = {"max_text_bytes": MAX_TEXT_BYTES, "max_request_text_bytes": MAX_REQUEST_TEXT_BYTES}
    multi = create_tiny_cross_encoder(base / "tiny-rerank-3", seed=6, num_labels=3)
    entries = [
        entry(MODEL, "cross-encoder", folder, **limits),
        entry(MULTI, "cross-encoder", multi),
    ]
    with serve_models(base, entries) as server:
        yield server, reference


@pytest.fixture(scope="module")
def multi_reference(rerank_setup):
    """The 3-label model as the library loads it (its own folder)."""
    from sentence_transformers import CrossEncoder

    server, _ = rerank_setup
    return CrossEncoder(server.manifest.get(MULTI).source, device="cpu")


def _score(server, protocol: str, queries, texts, parameters=None) -> np.ndarray:
    """One raw request of ``QUERY`` and ``TEXT`` rows; returns ``SCORE``."""
    inputs = {"QUERY": queries, "TEXT": texts}
    return infer(server, protocol, MODEL, inputs, ["SCORE"], parameters)[0]


def _refusal(server, protocol: str, queries, texts) -> tuple[str, str]:
    try:
        _score(server, protocol, queries, texts)
    except InferenceServerException as exc:
        return str(exc.status()), str(exc.message())
    raise AssertionError("the request was expected to fail but succeeded")


def _predict(reference, pairs) -> np.ndarray:
    return np.asarray(reference.predict([list(p) for p in pairs], batch_size=len(pairs)))


def _check(label: str, got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == np.float32 and got.shape == want.shape
    diff = float(np.max(np.abs(got.astype(np.float64) - want)))
    print(f"\n{label}: max|diff| {diff:.2e} over {len(want)} pairs")
    assert diff <= MAX_ABS_DIFF


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_served_scores_match_cross_encoder_predict(rerank_setup, protocol):
    """Two requests mixing 3-token pairs with pairs truncated from hundreds of tokens."""
    server, reference = rerank_setup
    pairs = rerank_pairs()
    got = np.concatenate(
        [
            _score(server, protocol, [q for q, _ in part], [t for _, t in part])
            for part in (pairs[:MAX_BATCH], pairs[MAX_BATCH:])
        ]
    )
    assert got.shape == (len(pairs), 1)
    want = _predict(reference, pairs)
    _check(f"raw {protocol}", got[:, 0], want)
    # The stand-in's scores spread over (0, 1), so the gate sees a pairing bug: the same
    # served scores against the pairs shifted by one row fail it by far.
    assert want.max() - want.min() >= 0.3, f"scores span only {want.max() - want.min():.2e}"
    shifted = np.roll(want, 1)
    assert float(np.max(np.abs(got[:, 0].astype(np.float64) - shifted))) > 100 * MAX_ABS_DIFF


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_client_rerank_scores_one_query_against_many_texts(rerank_setup, protocol):
    server, reference = rerank_setup
    texts = [t for _, t in rerank_pairs()] * 2  # 24 texts: three requests of <= 8
    with server.client(protocol) as client:
        scores = client.rerank(MODEL, QUERY, texts)
        ranked = client.rank(MODEL, QUERY, texts, k=3)
        empty = client.rerank(MODEL, QUERY, [])
    _check(f"client {protocol}", scores, _predict(reference, [(QUERY, t) for t in texts]))
    assert scores.shape == (len(texts),) and empty.shape == (0,)
    best = np.argsort(-scores, kind="stable")[:3]
    assert [r.index for r in ranked] == best.tolist()
    assert [r.text for r in ranked] == [texts[i] for i in best]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_multi_label_scores_are_predicts_logits_per_label(rerank_setup, multi_reference, protocol):
    """SCORE [N, 3] equals ``CrossEncoder.predict`` column by column, raw and via the client."""
    server, _ = rerank_setup
    pairs = rerank_pairs()[:MAX_BATCH]
    want = np.asarray(multi_reference.predict([list(p) for p in pairs], batch_size=len(pairs)))
    assert want.shape == (len(pairs), 3)
    raw = infer(server, protocol, MULTI, {"QUERY": [q for q, _ in pairs],
                                          "TEXT": [t for _, t in pairs]}, ["SCORE"])[0]
    assert raw.dtype == np.float32 and raw.shape == want.shape
    diff = float(np.max(np.abs(raw.astype(np.float64) - want)))
    print(f"\nmulti-label {protocol}: max|diff| {diff:.2e} over {want.size} scores "
          f"({want.min():.2f} to {want.max():.2f})")
    assert diff <= MULTI_MAX_ABS_DIFF
    # Labels in the model's order: the same scores with two labels swapped miss the gate.
    swapped = want[:, [1, 0, 2]]
    assert float(np.max(np.abs(raw.astype(np.float64) - swapped))) > 100 * MULTI_MAX_ABS_DIFF
    texts = [t for _, t in rerank_pairs()]
    with server.client(protocol) as client:
        scores = client.rerank(MULTI, QUERY, texts)
    want = np.asarray(multi_reference.predict([[QUERY, t] for t in texts], batch_size=len(texts)))
    assert scores.shape == (len(texts), 3)
    assert float(np.max(np.abs(scores.astype(np.float64) - want))) <= MULTI_MAX_ABS_DIFF


def test_cli_prints_texts_best_first(rerank_setup, capsys):
    server, reference = rerank_setup
    texts = ["a server", "a fish", "Triton serves models over HTTP and gRPC."]
    argv = ["rerank", "--url", server.http_url, "--model", MODEL, "--query", QUERY, *texts]
    assert client_main([*argv, "--top-k", "2"], environ={}) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    want = _predict(reference, [(QUERY, t) for t in texts])
    order = np.argsort(-want, kind="stable")[:2]
    assert [line["index"] for line in lines] == order.tolist()
    assert [line["text"] for line in lines] == [texts[i] for i in order]
    assert np.allclose([line["score"] for line in lines], want[order], atol=MAX_ABS_DIFF)


@pytest.mark.parametrize(
    ("queries", "texts", "reason"),
    [
        (["q", ""], ["a", "b"], "QUERY row 1 is empty or whitespace only"),
        (["q", "q"], ["a", " \n"], "TEXT row 1 is empty or whitespace only"),
        (["q"], [b"\xff"], "TEXT row 0 is not valid UTF-8 (invalid start byte)"),
        (
            ["q"],
            ["a" * (MAX_TEXT_BYTES + 1)],
            f"TEXT row 0 is {MAX_TEXT_BYTES + 1} bytes, over this model's max_text_bytes=4096",
        ),
        (
            ["q" * MAX_TEXT_BYTES] * 4,
            ["a"] * 4,
            "QUERY and TEXT rows total 16388 bytes, over this model's max_request_text_bytes=16384",
        ),
        (
            ["q" * 2048] * 4,
            ["a" * 3000] * 4,
            "QUERY and TEXT rows total 20192 bytes, over this model's max_request_text_bytes=16384",
        ),
    ],
    ids=[
        "empty-query",
        "blank-text",
        "non-utf8",
        "row-over-cap",
        "long-queries-over-cap",
        "request-over-cap",
    ],
)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_pairs_are_refused_with_invalid_arg(rerank_setup, protocol, queries, texts, reason):
    server, _ = rerank_setup
    assert _refusal(server, protocol, queries, texts) == (INVALID[protocol], IN_ENSEMBLE + reason)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_mismatched_rows_and_too_many_pairs_are_refused(rerank_setup, protocol):
    server, _ = rerank_setup
    status, message = _refusal(server, protocol, ["q"], ["a", "b"])
    print(f"\nmismatched {protocol}: {message}")
    assert status == INVALID[protocol] and "batch size" in message
    many = MAX_BATCH + 1
    status, message = _refusal(server, protocol, ["q"] * many, ["a"] * many)
    print(f"too many {protocol}: {message}")
    assert status == INVALID[protocol]
    assert f"batch-size must be <= {MAX_BATCH}" in message


def test_client_surfaces_the_reason(rerank_setup):
    server, _ = rerank_setup
    with server.client("grpc") as client, pytest.raises(EmbeddingClientError) as caught:
        client.rerank(MODEL, QUERY, ["fine", ""])
    assert caught.value.message == IN_ENSEMBLE + "TEXT row 1 is empty or whitespace only"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_truncate_false_refuses_an_overlong_pair_and_left_is_refused(rerank_setup, protocol):
    """``truncate=false``: a pair at the limit is scored as the library scores it, one
    over is refused naming its tokens; ``truncation_direction=left`` is refused."""
    server, reference = rerank_setup
    limit = reference.max_seq_length

    def tokens(text: str) -> int:
        return len(reference.tokenizer(QUERY, text, truncation=False)["input_ids"])

    words = next(n for n in range(1, 400) if tokens("a " * n) == limit)
    at_limit, over = "a " * words, "a " * (words + 1)
    with server.client(protocol) as client:
        got = client.rerank(MODEL, QUERY, ["fine", at_limit], truncate=False)
        _check(
            "at the limit",
            got.astype(np.float32),
            _predict(reference, [(QUERY, "fine"), (QUERY, at_limit)]),
        )
        cut = client.rerank(MODEL, QUERY, [over])  # the default cuts, as CrossEncoder does
        _check("cut", cut.astype(np.float32), _predict(reference, [(QUERY, over)]))
        with pytest.raises(EmbeddingClientError) as refused:
            client.rerank(MODEL, QUERY, ["fine", over], truncate=False)
        assert f"pair row 1 has {limit + 1} tokens, over the model's limit of {limit}" in (
            refused.value.message
        )
    with pytest.raises(InferenceServerException, match="not available for rerankers"):
        _score(server, protocol, ["q"], ["q"], {"truncation_direction": "left"})


def test_bad_requests_fail_alone_among_concurrent_good_ones(rerank_setup):
    """Good and bad requests released together: the good ones score exactly, and the
    encoder runs the good ones in fewer executions than requests (ragged batching)."""
    server, reference = rerank_setup
    pairs = rerank_pairs()
    bad = {3: ("", "text"), 7: ("q", "")}

    def score(protocol: str, pair: tuple[str, str]) -> np.ndarray:
        return _score(server, protocol, [pair[0]], [pair[1]])

    refused, got = score_pairs_together(server, MODEL, score, pairs, bad)
    for exc in refused.values():
        assert "empty or whitespace only" in str(exc.message())
    _check("concurrent", got, _predict(reference, [p for i, p in enumerate(pairs) if i not in bad]))


def test_model_manager_loads_a_cross_encoder_at_runtime(server, tmp_path_factory):
    """A runtime load through ``model_manager`` (the session server), then a delete."""
    from sentence_transformers import CrossEncoder

    folder = create_tiny_cross_encoder(tmp_path_factory.mktemp("rt-rerank") / "rr", seed=7)
    request = {"action": "load", "family": "cross-encoder", "source": str(folder)}
    with server.client() as client:
        answer = client.manage({**request, "name": "rt-rerank", "options": {"max_batch_size": 8}})
        assert (answer["status"], answer["ensembles"]) == ("loaded", ["rt-rerank"])
        texts = ["a server", "a fish", "a long passage " * 40]
        scores = client.rerank("rt-rerank", QUERY, texts)
        want = CrossEncoder(str(folder), device="cpu").predict([(QUERY, t) for t in texts])
        _check("runtime load", scores, want)
        assert client.manage({"action": "delete", "name": "rt-rerank"})["status"] == "deleted"
        assert not client.is_model_ready("rt-rerank")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_request_naming_no_output_gets_the_documented_outputs(rerank_setup, protocol):
    """Raw JSON with no ``outputs`` (HTTP) and gRPC: the family's documented outputs alone."""
    server = rerank_setup[0]
    pairs = {"QUERY": ["a cat", "a cat"], "TEXT": ["a dog", "a cat"]}
    got = plain_request_outputs(server, protocol, MODEL, pairs)
    assert sorted(got) == sorted(["SCORE"])
