"""An LLM reranker (causal LM + ``LogitScore``) served by a real Triton agrees with ``predict``.

A server of this module's own serves the tiny random Qwen3 reranker
(``generator/fixtures/tiny_llm_rerank.py``: Qwen3-Reranker-style chat template, prompts
``web`` (the default) and ``code``, 160-token limit) as ``llm``: ``QUERY`` [N, 1] and
``TEXT`` [N, 1] -> ``SCORE`` [N, 1]. The library pads on the left; the server renders
the template, pads on the right and the graph moves each row left. Requests mix short
pairs with pairs cut at the limit (the template's tail restored), concurrent requests of
different lengths share ragged executions run in length-sorted chunks of 4 rows, and bad
requests fail alone with INVALID_ARG.
"""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from client import EmbeddingClientError
from generator.fixtures.tiny_llm_rerank import PROMPTS, create_tiny_llm_reranker
from tests.integration.families import MAX_BATCH, entry, score_pairs_together, serve_models
from tests.integration.text_helpers import INVALID, PROTOCOLS, infer
from tests.rerank_data import QUERY, llm_rerank_pairs

pytestmark = pytest.mark.integration

MODEL = "llm"
# Right padding in the server, left padding in the library: equal up to float rounding.
MAX_ABS_DIFF = 1e-4


@pytest.fixture(scope="module")
def llm_setup(tmp_path_factory):
    """Build the tiny LLM reranker, its repository and the reference; start Triton."""
    from sentence_transformers import CrossEncoder

    base = tmp_path_factory.mktemp("llm-rerank")
    folder = create_tiny_llm_reranker(
        base / "tiny-llm", seed=2, prompts=PROMPTS, default_prompt_name="web"
    )
    reference = CrossEncoder(str(folder), device="cpu")
    with serve_models(base, [entry(MODEL, "cross-encoder", folder)]) as server:
        yield server, reference


def _score(server, protocol: str, pairs, parameters=None) -> np.ndarray:
    """One raw request of ``QUERY`` and ``TEXT`` rows; returns ``SCORE``."""
    inputs = {"QUERY": [q for q, _ in pairs], "TEXT": [t for _, t in pairs]}
    return infer(server, protocol, MODEL, inputs, ["SCORE"], parameters)[0]


def _predict(reference, pairs, **kwargs) -> np.ndarray:
    return np.asarray(reference.predict([list(p) for p in pairs], batch_size=len(pairs),
                                        **kwargs))


def _check(label: str, got: np.ndarray, want: np.ndarray) -> float:
    assert got.dtype == np.float32 and got.shape == want.shape
    diff = float(np.max(np.abs(got.astype(np.float64) - want)))
    print(f"\n{label}: max|diff| {diff:.2e} over {len(want)} pairs")
    assert diff <= MAX_ABS_DIFF
    return diff


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_served_scores_match_cross_encoder_predict(llm_setup, protocol):
    """Requests of 8 pairs mixing short pairs with pairs cut at the 160-token limit."""
    server, reference = llm_setup
    pairs = llm_rerank_pairs()
    parts = [pairs[i : i + MAX_BATCH] for i in range(0, len(pairs), MAX_BATCH)]
    got = np.concatenate([_score(server, protocol, part) for part in parts])
    assert got.shape == (len(pairs), 1)
    want = _predict(reference, pairs)
    _check(f"llm raw {protocol}", got[:, 0], want)
    assert np.ptp(want) >= 0.1, f"scores span only {np.ptp(want):.2e}"
    shifted = np.roll(want, 1)  # negative control: a pairing bug misses the gate by far
    assert float(np.max(np.abs(got[:, 0].astype(np.float64) - shifted))) > 100 * MAX_ABS_DIFF
    lengths = [len(reference.preprocess([list(p)])["input_ids"][0]) for p in pairs]
    assert min(lengths) < 130 and max(lengths) == reference.max_seq_length


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_prompt_name_picks_the_instruction_as_predict_does(llm_setup, protocol):
    server, reference = llm_setup
    pairs = llm_rerank_pairs()[:MAX_BATCH]
    code = _score(server, protocol, pairs, {"prompt_name": "code"})[:, 0]
    _check(f"llm prompt code {protocol}", code, _predict(reference, pairs, prompt_name="code"))
    web = _score(server, protocol, pairs, {"prompt_name": "web"})[:, 0]
    np.testing.assert_array_equal(web, _score(server, protocol, pairs)[:, 0])  # the default
    assert float(np.max(np.abs(code - web))) > 100 * MAX_ABS_DIFF


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_client_rerank_and_rank(llm_setup, protocol):
    server, reference = llm_setup
    texts = [t for _, t in llm_rerank_pairs()]  # 16 texts: two requests of <= 8
    with server.client(protocol) as client:
        scores = client.rerank(MODEL, QUERY, texts)
        ranked = client.rank(MODEL, QUERY, texts, k=3)
        code = client.rerank(MODEL, QUERY, texts[:4], prompt_name="code")
    _check(f"llm client {protocol}", scores, _predict(reference, [(QUERY, t) for t in texts]))
    _check(f"llm client code {protocol}", code,
           _predict(reference, [(QUERY, t) for t in texts[:4]], prompt_name="code"))
    best = np.argsort(-scores, kind="stable")[:3]
    assert [r.index for r in ranked] == best.tolist()
    assert [r.text for r in ranked] == [texts[i] for i in best]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_request_options_refused_alone(llm_setup, protocol):
    """truncate=false, truncation_direction=left, an unknown prompt_name: INVALID_ARG."""
    server, reference = llm_setup
    long_pair = (QUERY, "word " * 300)
    with server.client(protocol) as client:
        with pytest.raises(EmbeddingClientError, match="pair row 1 has .* tokens, over the "
                                                       "model's limit of 160"):
            client.rerank(MODEL, QUERY, ["fine", long_pair[1]], truncate=False)
        fine = client.rerank(MODEL, QUERY, ["fine"], truncate=False)
    _check("llm truncate=false short", fine, _predict(reference, [(QUERY, "fine")]))
    for parameters, reason in (
        ({"truncation_direction": "left"}, "not available for rerankers"),
        ({"prompt_name": "nope"}, "unknown prompt_name 'nope'"),
    ):
        with pytest.raises(InferenceServerException) as refused:
            _score(server, protocol, [long_pair], parameters)
        assert str(refused.value.status()) == INVALID[protocol]
        assert reason in str(refused.value.message())


def test_concurrent_requests_of_different_lengths_share_executions(llm_setup):
    """Good and bad requests released together: the good ones score as predict does, the
    bad ones fail alone, and the encoder runs the good ones in fewer executions."""
    server, reference = llm_setup
    pairs = llm_rerank_pairs()
    bad = {3: ("", "text"), 7: ("q", b"\xff")}

    def score(protocol: str, pair: tuple) -> np.ndarray:
        return _score(server, protocol, [pair])

    refused, got = score_pairs_together(server, MODEL, score, pairs, bad)
    assert "QUERY row 0 is empty or whitespace only" in str(refused[3].message())
    assert "TEXT row 0 is not valid UTF-8" in str(refused[7].message())
    good = [pair for i, pair in enumerate(pairs) if i not in bad]
    _check("llm concurrent", got, _predict(reference, good))
