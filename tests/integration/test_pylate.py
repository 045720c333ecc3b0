"""PyLate ColBERT folders served by a real Triton agree with PyLate's own ``encode``.

Two tiny random ColBERT models are made by PyLate 1.6.0 itself (``create`` of
``generator/reference/pylate_colbert.py``, in the pinned reference packages of ``make
pylate-reference``) and saved with its ``save``: ``plc`` with PyLate's defaults (markers
``[Q] `` / ``[D] `` added to the tokenizer, queries expanded with ``[MASK]`` to 16 tokens
and not attended to, documents cut at 48 tokens without punctuation) and ``plc-attend``
with BERT's ``[unused0]`` / ``[unused1]`` markers and attended expansion. Built through
the manifest like any model (the build's own gate runs PyLate), then over HTTP and gRPC
every row equals ``ColBERT.encode(is_query=...)`` from a separate PyLate process, the
counts are PyLate's vector counts and MaxSim scores agree.
"""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from client.multivector import maxsim
from generator import pylate_reference
from tests.integration.families import entry, serve_models
from tests.integration.text_helpers import PROTOCOLS, infer
from tests.st_factory import parity_texts

pytestmark = pytest.mark.integration

MAX_ABS_DIFF = 1e-5
MODELS = {"plc": [], "plc-attend": ["--attend", "--prefix-tokens"]}


@pytest.fixture(scope="module")
def pylate_setup(tmp_path_factory):
    """PyLate's own tiny folders, their repository and server, and PyLate's reference."""
    folder = pylate_reference.reference_dir()
    if pylate_reference.installed_version(folder) != pylate_reference.PINNED_VERSION:
        pytest.fail(f"no PyLate {pylate_reference.PINNED_VERSION} in {folder}: make "
                    "pylate-reference (make test installs it)")
    base = tmp_path_factory.mktemp("pylate")
    entries, references = [], {}
    for seed, (name, flags) in enumerate(MODELS.items()):
        out = base / name
        pylate_reference.run(["create", str(out), "--seed", str(seed + 5), *flags], folder)
        entries.append(entry(name, "multi-vector", out))
        references[name] = pylate_reference.PyLateReference(str(out), name)
    with serve_models(base, entries) as server:
        yield server, references


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("model", list(MODELS))
def test_queries_and_documents_equal_pylates_encode(pylate_setup, model, protocol) -> None:
    server, references = pylate_setup
    reference = references[model]
    texts = [*parity_texts(), "  spaces around  ", "Punctuation: a, b; c! (d) [e]?"]
    with server.client(protocol) as client:
        queries = client.embed_multivector(model, texts, is_query=True)
        documents = client.embed_multivector(model, texts)
    want_q, want_d = reference.encode_query(texts), reference.encode_document(texts)
    worst = 0.0
    for got, want in zip(queries + documents, want_q + want_d, strict=True):
        assert got.shape == want.shape
        worst = max(worst, float(np.abs(got - want).max()))
    scores, want_scores = maxsim(queries, documents), maxsim(want_q, want_d)
    score_diff = float(np.abs(scores - want_scores).max())
    print(f"\n{model} {protocol}: {len(texts)} texts, PyLate {reference.version}: max|diff| "
          f"{worst:.2e}, MaxSim {score_diff:.2e}; query vectors "
          f"{sorted({len(q) for q in queries})}, document vectors "
          f"{min(len(d) for d in documents)}..{max(len(d) for d in documents)}")
    assert worst <= MAX_ABS_DIFF
    assert score_diff <= 1e-4
    assert (scores.argmax(1) == want_scores.argmax(1)).all()
    assert {len(q) for q in queries} == {16}  # expanded to query_length, every position
    assert max(len(d) for d in documents) <= 48


def _infer(server, model: str, texts: list[str], **parameters):
    return infer(server, "http", model, {"TEXT": texts}, ("EMBEDDINGS", "TOKEN_COUNT"), parameters)


def test_a_query_over_its_length_is_refused_with_truncate_false(pylate_setup) -> None:
    """PyLate keeps query_length - 1 tokens of a query (its marker takes one)."""
    server, references = pylate_setup
    fits = "a b c d e f g h i j k l m"  # 13 words + [CLS] + [SEP] = 15 tokens
    embeddings, counts = _infer(server, "plc", [fits], task="query", truncate=False)
    want = references["plc"].encode_query([fits])[0]
    assert int(counts[0, 0]) == len(want) == 16
    assert np.abs(embeddings[0] - want).max() <= MAX_ABS_DIFF
    with pytest.raises(InferenceServerException, match="TEXT row 0 has 16 tokens"):
        _infer(server, "plc", [fits + " n"], task="query", truncate=False)
