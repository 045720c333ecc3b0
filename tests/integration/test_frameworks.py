"""LangChain and LlamaIndex on the real server: the packages from PyPI, the integrations
of ``client/langchain.py`` and ``client/llama_index.py``.

LangChain's own standard suites (``langchain-tests``) run here too: the embeddings
integration suite over ``TritonEmbeddings`` (HTTP and gRPC) and the retrievers suite over
a retriever that ranks a fixed corpus with ``TritonReranker`` (a document compressor is
no retriever itself). pytest-socket lets them reach 127.0.0.1 alone. Neither LlamaIndex
nor Haystack ships such a suite for embeddings: llama-index-core 0.14 packages no test
base classes, and ``haystack.testing`` has them for document stores only (we ship none).

Each must give what the plain client gives (float32 vectors turned into the frameworks'
float lists, so equal to 1e-7), send long lists in requests no larger than the model's
``max_batch_size`` (1,000 texts; Triton's own request count says how many went), and
raise the client's error the way the frameworks pass errors on.
"""

from __future__ import annotations

import asyncio
import math
import time
from io import BytesIO

import numpy as np
import pytest
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_tests.integration_tests import (
    EmbeddingsIntegrationTests,
    RetrieversIntegrationTests,
)
from llama_index.core.embeddings import BaseEmbedding, MultiModalEmbedding

from client import EmbeddingClientError
from client.langchain import TritonEmbeddings, TritonReranker
from client.llama_index import TritonEmbedding, TritonMultiModalEmbedding
from client.load.corpus import varied_sentences
from generator.fixtures.tiny_rerank import create_tiny_cross_encoder
from tests.integration.clip_fixture import CLIP_MODEL, sample_images
from tests.integration.conftest import MAX_BATCH, TEXT_MODEL
from tests.integration.families import serve_models
from tests.integration.text_helpers import PROTOCOLS

pytestmark = pytest.mark.integration

EXACT = 1e-7


def _success_count(server, model: str) -> int:
    """The model's success count once it stops moving.

    Triton counts a request after its answer has gone out, so a read right after the
    previous test's last request may miss it (seen once: 64 counted for 63 requests).
    """
    with server.client() as client:
        last = None
        for _ in range(50):
            (stats,) = client.model_statistics(model)
            if stats.success_count == last:
                return last
            last = stats.success_count
            time.sleep(0.1)
    raise AssertionError(f"{model}'s success count kept moving: {last}")


def _assert_equal_to_the_plain_client(server, protocol: str, texts, answers) -> None:
    """Each framework answer (``got``, ``rows``) equals the plain client's vectors of
    ``texts[rows]`` to :data:`EXACT`."""
    with server.client(protocol) as client:
        want = client.embed_texts(TEXT_MODEL, texts)
    for got, rows in answers:
        assert np.abs(np.asarray(got) - want[rows]).max() <= EXACT


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_langchain_embeddings_equal_the_plain_client(server, protocol) -> None:
    texts = varied_sentences(24)
    embeddings = TritonEmbeddings(TEXT_MODEL, server.url(protocol), protocol)
    documents = embeddings.embed_documents(texts)
    assert isinstance(documents, list) and isinstance(documents[0], list)
    assert isinstance(documents[0][0], float)
    _assert_equal_to_the_plain_client(
        server,
        protocol,
        texts,
        [
            (documents, slice(None)),
            (embeddings.embed_query(texts[0]), 0),
            (asyncio.run(embeddings.aembed_documents(texts[:3])), slice(3)),
            (asyncio.run(embeddings.aembed_query(texts[1])), 1),
        ],
    )
    embeddings.close()


def test_langchain_sends_1000_texts_in_requests_of_at_most_max_batch_size(server) -> None:
    texts = varied_sentences(1000)
    before = _success_count(server, TEXT_MODEL)
    vectors = TritonEmbeddings(TEXT_MODEL, server.http_url).embed_documents(texts)
    sent = _success_count(server, TEXT_MODEL) - before
    assert len(vectors) == 1000 and len(vectors[0]) == 384
    assert sent == math.ceil(1000 / MAX_BATCH), f"{sent} requests for 1000 texts"
    with server.client() as client:
        want = client.embed_texts(TEXT_MODEL, texts[-5:])
    assert np.abs(np.asarray(vectors[-5:]) - want).max() <= EXACT


def test_langchain_errors_surface_as_the_clients_error(server) -> None:
    with pytest.raises(EmbeddingClientError, match="no-such-model"):
        TritonEmbeddings("no-such-model", server.http_url).embed_query("x")
    with pytest.raises(EmbeddingClientError, match="empty"):
        TritonEmbeddings(TEXT_MODEL, server.http_url).embed_documents(["fine", ""])
    assert TritonEmbeddings(TEXT_MODEL, server.http_url).embed_documents([]) == []


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_llama_index_embedding_equals_the_plain_client(server, protocol) -> None:
    texts = varied_sentences(40)
    model = TritonEmbedding(
        model_name=TEXT_MODEL, url=server.url(protocol), protocol=protocol, embed_batch_size=16
    )
    assert isinstance(model, BaseEmbedding)
    _assert_equal_to_the_plain_client(
        server,
        protocol,
        texts,
        [
            (model.get_text_embedding_batch(texts), slice(None)),
            (model.get_query_embedding(texts[2]), 2),
            (asyncio.run(model.aget_text_embedding_batch(texts[:5])), slice(5)),
            (asyncio.run(model.aget_query_embedding(texts[3])), 3),
        ],
    )


def test_llama_index_errors_surface_as_the_clients_error(server) -> None:
    model = TritonEmbedding(model_name="no-such-model", url=server.http_url)
    with pytest.raises(EmbeddingClientError, match="no-such-model"):
        model.get_query_embedding("x")


def test_llama_index_multimodal_embeds_clip_texts_and_images(server, image_server) -> None:
    images = sample_images()
    names = sorted(images)[:3]
    model = TritonMultiModalEmbedding(model_name=CLIP_MODEL, url=server.http_url)
    assert isinstance(model, MultiModalEmbedding)
    by_bytes = [model.get_image_embedding(BytesIO(images[n])) for n in names]
    by_url = model.get_image_embedding_batch([image_server.url(f"/img/{n}") for n in names])
    text = model.get_text_embedding("a photo of a cat")
    with server.client() as client:
        want_images = client.embed_images(CLIP_MODEL, [images[n] for n in names])
        want_text = client.embed_texts(f"{CLIP_MODEL}_text", ["a photo of a cat"])[0]
    assert np.abs(np.asarray(by_bytes) - want_images).max() <= EXACT
    assert np.abs(np.asarray(by_url) - want_images).max() <= EXACT
    assert np.abs(np.asarray(text) - want_text).max() <= EXACT


@pytest.fixture(scope="module")
def image_server():
    from tests.http_servers import ImageServer

    with ImageServer(sample_images()) as srv:
        yield srv


@pytest.fixture(scope="module")
def reranker_server(tmp_path_factory):
    base = tmp_path_factory.mktemp("frameworks-rerank")
    folder = create_tiny_cross_encoder(base / "rr")
    entry = {"name": "rr", "family": "cross-encoder", "source": str(folder)}
    with serve_models(base, [entry]) as server:
        yield server


def test_langchain_reranker_keeps_the_best_documents_with_their_scores(reranker_server) -> None:
    query = "what is triton?"
    texts = varied_sentences(8)
    documents = [Document(page_content=t, metadata={"row": i}) for i, t in enumerate(texts)]
    compressor = TritonReranker(model="rr", url=reranker_server.http_url, top_n=3)
    kept = compressor.compress_documents(documents, query)
    with reranker_server.client() as client:
        scores = client.rerank("rr", query, texts)
    best = np.argsort(-scores, kind="stable")[:3]
    assert [d.metadata["row"] for d in kept] == best.tolist()
    for doc in kept:
        assert abs(doc.metadata["relevance_score"] - scores[doc.metadata["row"]]) <= EXACT
        assert doc.page_content == texts[doc.metadata["row"]]
    assert compressor.compress_documents([], query) == []
    everything = TritonReranker(model="rr", url=reranker_server.http_url, top_n=None)
    assert len(everything.compress_documents(documents, query)) == len(documents)


# --- LangChain's standard suites (langchain-tests) -----------------------------------------

LOOPBACK_ONLY = pytest.mark.allow_hosts(["127.0.0.1"])


@LOOPBACK_ONLY
class TestTritonEmbeddingsStandardHTTP(EmbeddingsIntegrationTests):
    protocol = "http"

    @property
    def embeddings_class(self) -> type[TritonEmbeddings]:
        return TritonEmbeddings

    @pytest.fixture
    def model(self, server) -> TritonEmbeddings:
        return TritonEmbeddings(TEXT_MODEL, server.url(self.protocol), self.protocol)


@LOOPBACK_ONLY
class TestTritonEmbeddingsStandardGRPC(TestTritonEmbeddingsStandardHTTP):
    protocol = "grpc"


class RerankedCorpus(BaseRetriever):
    """A retriever over a fixed corpus: the server's cross-encoder keeps the best ``k``."""

    url: str
    k: int = 3
    documents: list[Document] = [Document(page_content=t) for t in varied_sentences(12)]

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, k: int | None = None
    ) -> list[Document]:
        reranker = TritonReranker(model="rr", url=self.url, top_n=k or self.k)
        return list(reranker.compress_documents(self.documents, query))


@LOOPBACK_ONLY
class TestTritonRerankerRetrieverStandard(RetrieversIntegrationTests):
    @pytest.fixture(autouse=True)
    def _url(self, reranker_server) -> None:
        self.url = reranker_server.http_url

    @property
    def retriever_constructor(self) -> type[RerankedCorpus]:
        return RerankedCorpus

    @property
    def retriever_constructor_params(self) -> dict:
        return {"url": self.url}

    @property
    def retriever_query_example(self) -> str:
        return "what does Triton serve?"


@LOOPBACK_ONLY
@pytest.mark.filterwarnings("ignore:A test tried to use socket.socket.connect")
def test_the_standard_suites_cannot_leave_the_machine() -> None:
    import socket

    from pytest_socket import SocketConnectBlockedError

    with pytest.raises(SocketConnectBlockedError):
        socket.create_connection(("192.0.2.1", 80), timeout=1)


# --- text splitters that cut with the served tokenizer (client/splitters.py) ----------


@pytest.fixture(scope="module")
def long_document() -> str:
    return " ".join(varied_sentences(400, seed=23))  # about 5,000 tokens


def test_langchain_text_splitter_cuts_what_the_server_embeds_whole(
    server, reference, long_document
) -> None:
    from langchain_text_splitters import TextSplitter

    from client.splitters import TritonTextSplitter

    splitter = TritonTextSplitter(TEXT_MODEL, server.http_url, chunk_tokens=64, chunk_overlap=8)
    assert isinstance(splitter, TextSplitter)
    docs = splitter.split_documents([Document(long_document, metadata={"source": "s1"})])
    with server.client() as client:
        spans = client.chunk_spans(TEXT_MODEL, [long_document], chunk_tokens=64, chunk_overlap=8)
        # Every piece fits the window: embedded with truncate=false, none is refused.
        vectors = client.embed_texts(TEXT_MODEL, [d.page_content for d in docs], truncate=False)
    assert [d.page_content for d in docs] == [long_document[c.start : c.end] for c in spans]
    assert all(c.vector is None for c in spans) and len(docs) > 60
    assert {d.metadata["source"] for d in docs} == {"s1"}
    for doc in docs:
        tokens = reference.tokenizer(doc.page_content, add_special_tokens=False)["input_ids"]
        assert len(tokens) <= 64
    want = reference.encode([d.page_content for d in docs[:8]], normalize_embeddings=True)
    np.testing.assert_allclose(vectors[:8], want, atol=1e-5)


def test_llama_index_node_parser_gives_the_served_chunks(server, long_document) -> None:
    from llama_index.core import Document as LlamaDocument
    from llama_index.core.node_parser import NodeParser

    from client.splitters import TritonNodeParser

    parser = TritonNodeParser(model_name=TEXT_MODEL, url=server.url("grpc"), protocol="grpc")
    assert isinstance(parser, NodeParser)
    nodes = parser.get_nodes_from_documents([LlamaDocument(text=long_document, id_="d1")])
    with server.client() as client:
        spans = client.chunk_spans(TEXT_MODEL, [long_document])
    assert [n.get_content() for n in nodes] == [long_document[c.start : c.end] for c in spans]
    assert all(n.ref_doc_id == "d1" for n in nodes) and len(nodes) >= 15
    assert nodes[1].prev_node.node_id == nodes[0].node_id  # LlamaIndex's own relations
