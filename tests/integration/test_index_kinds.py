"""``python -m client index`` with a sparse encoder and a multi-vector model (issue 47).

One Triton of this module serves a tiny SPLADE (``sp``) and a tiny ColBERT (``cb``); the
indexer finds each model's kind from its outputs, and its shards equal the client's own
``embed_sparse`` / ``embed_multivector`` rows. The sparse rows also go into Qdrant
(local mode), as the LangChain classes store them.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from generator.fixtures.tiny_colbert import create_tiny_colbert
from generator.fixtures.tiny_splade import create_tiny_splade
from tests.integration.families import entry, serve_models
from tests.integration.test_index import _read, _run
from tests.st_factory import parity_texts

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def kinds_server(tmp_path_factory):
    base = tmp_path_factory.mktemp("index-kinds")
    splade = create_tiny_splade(base / "tiny-splade", seed=3)
    colbert = create_tiny_colbert(base / "tiny-colbert", seed=3)
    entries = [entry("sp", "sparse-encoder", splade), entry("cb", "multi-vector", colbert)]
    with serve_models(base, entries) as server:
        yield server


@pytest.fixture(scope="module")
def texts_file(tmp_path_factory) -> tuple:
    texts = list(dict.fromkeys(parity_texts()))[:24]
    path = tmp_path_factory.mktemp("index-kinds-corpus") / "docs.jsonl"
    path.write_text(
        "".join(json.dumps({"id": f"d{i:02d}", "text": t}) + "\n" for i, t in enumerate(texts)),
        encoding="utf-8",
    )
    return path, texts


def test_sparse_shards_equal_embed_sparse_and_fill_a_sparse_collection(
    kinds_server, texts_file, tmp_path
):
    from qdrant_client import QdrantClient, models

    path, texts = texts_file
    out, store = tmp_path / "out", tmp_path / "qdrant"
    done = _run(
        kinds_server, "--model", "sp", str(path), "--out", str(out), "--shard-rows", "10",
        "--qdrant", str(store), "--collection", "sparse",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    frame = _read(out)
    assert list(frame.columns[:3]) == ["id", "indices", "values"]
    with kinds_server.client() as client:
        want = client.embed_sparse("sp", texts)
    for (i, v), got_i, got_v in zip(want, frame["indices"], frame["values"], strict=True):
        np.testing.assert_array_equal(got_i, i)
        np.testing.assert_allclose(got_v, v, atol=1e-5)
    assert json.loads((out / "manifest.json").read_text())["kind"] == "sparse"
    qdrant = QdrantClient(path=str(store))
    try:
        indices, values = want[3]
        query = models.SparseVector(indices=indices.tolist(), values=values.tolist())
        top = qdrant.query_points("sparse", query=query, using="langchain-sparse", limit=1)
        assert top.points[0].payload["id"] == "d03"
        assert qdrant.count("sparse").count == len(texts)
    finally:
        qdrant.close()


def test_multivector_shards_hold_each_texts_token_vectors(kinds_server, texts_file, tmp_path):
    path, texts = texts_file
    out = tmp_path / "out"
    done = _run(kinds_server, "--model", "cb", str(path), "--out", str(out), "--task", "query")
    assert done.returncode == 0, done.stderr
    with kinds_server.client() as client:
        want = client.embed_multivector("cb", texts, is_query=True)
    got = pd.read_parquet(out / "embeddings").sort_values("id")["embedding"]
    for tokens, expected in zip(got, want, strict=True):
        np.testing.assert_allclose(np.stack(tokens), expected, atol=1e-5)
    wrong = _run(kinds_server, "--model", "cb", str(path), "--out", str(tmp_path / "b"),
                 "--dimensions", "8")  # fmt: skip
    assert wrong.returncode == 2 and "do not apply to a multivector model" in wrong.stderr
