"""Text splitters that cut with the served model's own tokenizer (extra ``frameworks``).

    from client.splitters import TritonTextSplitter, TritonNodeParser

    splitter = TritonTextSplitter(model="all-MiniLM-L6-v2", chunk_tokens=128, chunk_overlap=16)
    docs = splitter.split_documents(documents)            # LangChain Documents

    parser = TritonNodeParser(model_name="all-MiniLM-L6-v2", chunk_tokens=128)
    nodes = parser.get_nodes_from_documents(documents)    # LlamaIndex nodes

Both ask the server's ``<model>_chunks`` for the spans of each text (no vector is
computed: the request names the spans alone), so every piece is one the model embeds
whole: never cut again by the server, whatever tokenizer the client would have guessed.
``chunk_tokens`` None takes the model's window less its special tokens (and its prompt,
``prompt_name``). Pieces are ``text[start:end]`` of the spans.
"""

from __future__ import annotations

from typing import Any

from langchain_text_splitters import TextSplitter
from llama_index.core.node_parser.interface import TextSplitter as LlamaTextSplitter
from pydantic import Field, PrivateAttr

from .retry import DEFAULT_RETRY, RetryPolicy
from .thread_client import ThreadClient


def served_pieces(
    connection: ThreadClient,
    model: str,
    texts: list[str],
    chunk_tokens: int | None,
    chunk_overlap: int | None,
    prompt_name: str | None,
) -> list[list[str]]:
    """Each text's pieces, as the server cuts it."""
    if not texts:
        return []
    spans = connection.call(
        "chunk_spans",
        model,
        texts,
        chunk_tokens=chunk_tokens,
        chunk_overlap=chunk_overlap,
        prompt_name=prompt_name,
    )
    pieces: list[list[str]] = [[] for _ in texts]
    for chunk in spans:
        pieces[chunk.row].append(texts[chunk.row][chunk.start : chunk.end])
    return pieces


class TritonTextSplitter(TextSplitter):
    """A LangChain ``TextSplitter`` whose pieces are the served model's chunks.

    ``chunk_tokens`` / ``chunk_overlap`` are counted in the model's tokens (LangChain's own
    ``chunk_size`` / ``chunk_overlap`` are set from them and not used to cut).
    """

    def __init__(
        self,
        model: str,
        url: str | None = None,
        protocol: str = "http",
        *,
        chunk_tokens: int | None = None,
        chunk_overlap: int | None = None,
        prompt_name: str | None = None,
        timeout_s: float = 60.0,
        admin_key: str | None = None,
        retry: RetryPolicy | None = DEFAULT_RETRY,
        **kwargs: Any,
    ):
        super().__init__(
            chunk_size=chunk_tokens or 1 << 30, chunk_overlap=chunk_overlap or 0, **kwargs
        )
        self.model = model
        self.chunk_tokens, self.chunk_tokens_overlap = chunk_tokens, chunk_overlap
        self.prompt_name = prompt_name
        self._connection = ThreadClient(url, protocol, timeout_s, admin_key, retry)

    def split_text(self, text: str) -> list[str]:
        """The pieces of ``text``, in order."""
        (pieces,) = served_pieces(
            self._connection,
            self.model,
            [text],
            self.chunk_tokens,
            self.chunk_tokens_overlap,
            self.prompt_name,
        )
        return pieces

    def close(self) -> None:
        """Close the connection (a later call opens a new one)."""
        self._connection.close()


class TritonNodeParser(LlamaTextSplitter):
    """A LlamaIndex node parser (a ``TextSplitter``) whose nodes are the served chunks."""

    model_name: str = Field(description="the text model of the server")
    url: str | None = Field(default=None, description="host:port of the server")
    protocol: str = Field(default="http", description="http or grpc")
    chunk_tokens: int | None = Field(default=None, description="tokens a chunk (None: window)")
    chunk_overlap: int | None = Field(default=None, description="tokens shared by neighbours")
    prompt_name: str | None = Field(default=None, description="the model's prompt, if any")
    timeout_s: float = Field(default=60.0, description="deadline of each call")
    admin_key: str | None = Field(default=None, exclude=True, repr=False)
    retry: RetryPolicy | None = Field(default=DEFAULT_RETRY, exclude=True)
    _connection: ThreadClient | None = PrivateAttr(default=None)

    @classmethod
    def class_name(cls) -> str:
        """LlamaIndex's name of the class."""
        return "TritonNodeParser"

    def _conn(self) -> ThreadClient:
        if self._connection is None:
            self._connection = ThreadClient(
                self.url, self.protocol, self.timeout_s, self.admin_key, self.retry
            )
        return self._connection

    def split_text(self, text: str) -> list[str]:
        """The pieces of ``text``, in order."""
        return self.split_texts([text])[0]

    def split_texts(self, texts: list[str]) -> list[list[str]]:
        """The pieces of each text, in one call to the server."""
        return served_pieces(
            self._conn(),
            self.model_name,
            list(texts),
            self.chunk_tokens,
            self.chunk_overlap,
            self.prompt_name,
        )
