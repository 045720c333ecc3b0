"""Hybrid search in LangChain and LlamaIndex over Qdrant, with the server's sparse models.

A server of this module's own serves a tiny dense model (``st_factory``'s tiny-mean), a
tiny SPLADE (``sp``) and a tiny inference-free SPLADE (``free``: static query weights,
SPLADE documents). The same corpus (300 distinct texts) goes into qdrant-client's local
mode (``QdrantClient(":memory:")``) twice: once through the integrations of
``client.langchain`` / ``client.llama_index`` (vectors from the server), once through the
same pipeline in-process (``SentenceTransformer`` and ``SparseEncoder``). For 20
queries, the top 10 of each must be the same documents (overlap 1.0) in the same order
(documents of equal score in either order), in LangChain's hybrid and sparse modes and in
LlamaIndex's hybrid mode.
"""

from __future__ import annotations

import numpy as np
import pytest
from langchain_core.embeddings import Embeddings
from langchain_qdrant import QdrantVectorStore, RetrievalMode, SparseEmbeddings, SparseVector

from client.langchain import TritonEmbeddings, TritonSparseEmbeddings
from client.llama_index import TritonEmbedding, triton_sparse_functions
from client.load.corpus import varied_sentences
from client.sparse import as_lists, sparse_rows, to_qdrant
from generator.fixtures.tiny_splade import create_tiny_inference_free_splade, create_tiny_splade
from tests.integration.families import entry, serve_models
from tests.integration.text_helpers import infer
from tests.st_factory import VARIANTS, build_tiny_model, manifest_entry

pytestmark = pytest.mark.integration

DENSE = VARIANTS[0]  # tiny-mean, with its Normalize module
TOP_K = 10
# Distinct once lower-cased: the tokenizer is uncased, so two texts that differ in case
# alone are one vector, a tie whose order float noise decides.
DOCUMENTS = list({t.lower(): t for t in varied_sentences(800)}.values())[:300]
QUERIES = [
    "where do people go on holiday?",
    "a man is eating food",
    "what is the weather like today?",
    "how do servers batch requests",
    "music and art",
    *varied_sentences(40, seed=7)[-15:],
]
IDS = [f"00000000-0000-0000-0000-{i:012d}" for i in range(len(DOCUMENTS))]
SPARSE_MODELS = [("sp", False), ("free", True)]
Ranking = list[tuple[str, float]]  # (point id, score), best first


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Build the three models and start Triton; yields (server, in-process models)."""
    from sentence_transformers import SentenceTransformer, SparseEncoder

    base = tmp_path_factory.mktemp("frameworks-sparse")
    dense = build_tiny_model(DENSE, base / DENSE.name)
    splade = create_tiny_splade(base / "tiny-splade", seed=3)
    free = create_tiny_inference_free_splade(base / "tiny-free", seed=4)
    entries = [
        manifest_entry(DENSE, dense, max_batch_size=64, normalize=True),
        entry("sp", "sparse-encoder", splade),
        entry("free", "sparse-encoder", free),
    ]
    local = {
        "dense": SentenceTransformer(str(dense), device="cpu"),
        "sp": SparseEncoder(str(splade), device="cpu"),
        "free": SparseEncoder(str(free), device="cpu"),
    }
    with serve_models(base, entries) as server:
        yield server, local


# --- the same pipeline in-process ------------------------------------------------------


def _local_rows(model, texts: list[str], task: str, inference_free: bool):
    encode = model.encode
    if inference_free:
        encode = model.encode_query if task == "query" else model.encode_document
    dense = encode(texts, convert_to_tensor=True, convert_to_sparse_tensor=False).numpy()
    rows = []
    for row in dense:
        index = np.flatnonzero(row)
        order = np.argsort(-row[index], kind="stable")
        rows.append((index[order].astype(np.int32), row[index][order].astype(np.float32)))
    return rows


class _LocalDense(Embeddings):
    def __init__(self, model):
        self.model = model

    def embed_documents(self, texts):
        return self.model.encode(texts, batch_size=64).astype(float).tolist()

    def embed_query(self, text):
        return self.embed_documents([text])[0]


class _LocalSparse(SparseEmbeddings):
    def __init__(self, model, inference_free: bool):
        self.model, self.inference_free = model, inference_free

    def _vectors(self, texts, task):
        rows = _local_rows(self.model, texts, task, self.inference_free)
        return [SparseVector(indices=i.tolist(), values=v.tolist()) for i, v in rows]

    def embed_documents(self, texts):
        return self._vectors(texts, "document")

    def embed_query(self, text):
        return self._vectors([text], "query")[0]


def _ids(ranking: Ranking) -> list[str]:
    return [i for i, _ in ranking]


def _up_to_ties(ranking: Ranking) -> list[str]:
    """The ids, documents of equal score (to 1e-5) in id order: a store may order a tie
    either way (hybrid RRF gives equal scores to a dense-only and a sparse-only hit of the
    same rank)."""
    return _ids(sorted(ranking, key=lambda r: (-round(r[1], 5), r[0])))


def _assert_same_rankings(got: list[Ranking], want: list[Ranking], what: str) -> None:
    """Same documents, in the same order up to ties. A sparse-only search may find fewer
    than 10 (none for a query without active dimensions): then the same fewer."""
    pairs = list(zip(got, want, strict=True))
    overlaps = [len(set(_ids(g)) & set(_ids(w))) / len(w) if w else 1.0 for g, w in pairs]
    exact = sum(_ids(g) == _ids(w) for g, w in pairs)
    tied = sum(_up_to_ties(g) == _up_to_ties(w) for g, w in pairs)
    short = sum(len(w) < TOP_K for w in want)
    hits = sum(len(w) for w in want)
    print(
        f"\n{what}: {len(QUERIES)} queries over {len(DOCUMENTS)} documents, top-{TOP_K} "
        f"overlap min {min(overlaps):.2f}, same order {exact}/{len(QUERIES)} "
        f"({tied}/{len(QUERIES)} up to tied scores), {hits} hits, {short} queries with "
        f"fewer than {TOP_K}"
    )
    for g, w in pairs:
        if _ids(g) != _ids(w):
            print(f"  served    {[(i[-3:], round(x, 6)) for i, x in g]}")
            print(f"  in-process {[(i[-3:], round(x, 6)) for i, x in w]}")
    assert [len(g) for g in got] == [len(w) for w in want]
    assert min(overlaps) == 1.0
    assert tied == len(QUERIES)
    assert hits >= 2 * len(QUERIES), "too few hits to compare"


# --- LangChain: QdrantVectorStore, hybrid and sparse ---------------------------------------


def _langchain_top(store: QdrantVectorStore) -> list[Ranking]:
    return [
        [(d.metadata["_id"], score) for d, score in store.similarity_search_with_score(q, k=TOP_K)]
        for q in QUERIES
    ]


def _langchain_store(embedding, sparse, mode, name: str) -> QdrantVectorStore:
    return QdrantVectorStore.from_texts(
        DOCUMENTS,
        embedding=embedding,
        sparse_embedding=sparse,
        ids=IDS,
        location=":memory:",
        collection_name=name,
        retrieval_mode=mode,
        batch_size=64,
    )


@pytest.fixture(scope="module")
def in_process_tops(setup):
    """The in-process pipeline's top 10 per query, by (sparse model, retrieval mode)."""
    _, local = setup
    tops = {}
    for model, inference_free in SPARSE_MODELS:
        sparse = _LocalSparse(local[model], inference_free)
        for mode in (RetrievalMode.HYBRID, RetrievalMode.SPARSE):
            store = _langchain_store(
                _LocalDense(local["dense"]), sparse, mode, f"local-{model}-{mode.value}"
            )
            tops[model, mode] = _langchain_top(store)
    return tops


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize(("model", "inference_free"), SPARSE_MODELS)
def test_langchain_hybrid_retrieval_equals_the_pipeline_in_process(
    setup, in_process_tops, protocol, model, inference_free
) -> None:
    server, _ = setup
    url = server.url(protocol)
    dense = TritonEmbeddings(DENSE.name, url, protocol)
    sparse = TritonSparseEmbeddings(model, url, protocol, inference_free=inference_free)
    assert isinstance(sparse, SparseEmbeddings)
    for mode in (RetrievalMode.HYBRID, RetrievalMode.SPARSE):
        served = _langchain_store(dense, sparse, mode, f"served-{model}-{mode.value}")
        _assert_same_rankings(
            _langchain_top(served),
            in_process_tops[model, mode],
            f"langchain {mode.value} {model} {protocol}",
        )
    dense.close()
    sparse.close()


def test_langchain_sparse_vectors_are_the_in_process_rows(setup) -> None:
    """Documents and queries (both sides of the inference-free model), unpadded."""
    server, local = setup
    sparse = TritonSparseEmbeddings("free", server.http_url, inference_free=True)
    texts = DOCUMENTS[:12]
    for task, got in (
        ("document", sparse.embed_documents(texts)),
        ("query", [sparse.embed_query(t) for t in texts]),
    ):
        want = _local_rows(local["free"], texts, task, True)
        for vector, (index, value) in zip(got, want, strict=True):
            assert vector.indices == index.tolist()
            assert np.abs(np.asarray(vector.values) - value).max(initial=0) <= 1e-5
            assert -1 not in vector.indices and len(set(vector.indices)) == len(vector.indices)
    assert sparse.embed_documents([]) == []


# --- LlamaIndex: QdrantVectorStore(enable_hybrid=True) -------------------------------------


def _llama_store(name: str, doc_fn, query_fn, vectors: list[list[float]]):
    from llama_index.core.schema import TextNode
    from llama_index.vector_stores.qdrant import QdrantVectorStore as LlamaQdrant
    from qdrant_client import QdrantClient

    store = LlamaQdrant(
        collection_name=name,
        client=QdrantClient(":memory:"),
        enable_hybrid=True,
        sparse_doc_fn=doc_fn,
        sparse_query_fn=query_fn,
        batch_size=64,
    )
    nodes = [
        TextNode(id_=i, text=t, embedding=v)
        for i, t, v in zip(IDS, DOCUMENTS, vectors, strict=True)
    ]
    store.add(nodes)
    return store


def _llama_top(store, query_vectors: list[list[float]]) -> list[Ranking]:
    from llama_index.core.vector_stores.types import VectorStoreQuery, VectorStoreQueryMode

    tops = []
    for text, vector in zip(QUERIES, query_vectors, strict=True):
        query = VectorStoreQuery(
            query_embedding=vector,
            query_str=text,
            similarity_top_k=TOP_K,
            sparse_top_k=TOP_K,
            hybrid_top_k=TOP_K,
            mode=VectorStoreQueryMode.HYBRID,
        )
        result = store.query(query)
        tops.append(list(zip(result.ids, result.similarities, strict=True)))
    return tops


@pytest.mark.parametrize(("model", "inference_free"), SPARSE_MODELS)
def test_llama_index_hybrid_retrieval_equals_the_pipeline_in_process(
    setup, model, inference_free
) -> None:
    server, local = setup
    embed = TritonEmbedding(model_name=DENSE.name, url=server.http_url, embed_batch_size=64)
    served = _llama_store(
        f"served-{model}",
        *triton_sparse_functions(model, server.http_url, inference_free=inference_free),
        embed.get_text_embedding_batch(DOCUMENTS),
    )

    def local_fn(task: str):
        return lambda texts: as_lists(_local_rows(local[model], texts, task, inference_free))

    dense = local["dense"]
    in_process = _llama_store(
        f"local-{model}",
        local_fn("document"),
        local_fn("query"),
        dense.encode(DOCUMENTS, batch_size=64).astype(float).tolist(),
    )
    _assert_same_rankings(
        _llama_top(served, [embed.get_query_embedding(q) for q in QUERIES]),
        _llama_top(in_process, dense.encode(QUERIES).astype(float).tolist()),
        f"llama-index hybrid {model}",
    )


# --- the helper on raw tritonclient answers ---------------------------------------------


def test_raw_sparse_answers_become_unpadded_rows_and_qdrant_vectors(setup) -> None:
    from qdrant_client.models import SparseVector as QdrantSparseVector

    server, local = setup
    texts = ["x", "a much longer text with many different words in it, about Triton"]
    outputs = ("SPARSE_INDICES", "SPARSE_VALUES")
    indices, values = infer(server, "http", "sp", {"TEXT": texts}, outputs)
    assert (indices == -1).any(), "the short row is padded"
    rows = sparse_rows(indices, values)
    want = _local_rows(local["sp"], texts, "document", False)
    for (index, value), (want_index, want_value) in zip(rows, want, strict=True):
        assert sorted(index.tolist()) == sorted(want_index.tolist())
        assert np.abs(np.sort(value) - np.sort(want_value)).max() <= 1e-5
    points = to_qdrant(rows)
    assert all(isinstance(p, QdrantSparseVector) for p in points)
    assert [p.indices for p in points] == [i.tolist() for i, _ in rows]
