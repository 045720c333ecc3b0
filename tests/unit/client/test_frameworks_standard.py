"""LangChain's standard unit suite (``langchain-tests``) over ``TritonEmbeddings``.

Offline like LangChain's own unit runs: pytest-socket refuses every socket, so building
the object must not reach the server (the connection opens on the first call).
"""

from __future__ import annotations

import pytest
from langchain_tests.unit_tests import EmbeddingsUnitTests

from client.langchain import TritonEmbeddings


@pytest.mark.disable_socket
class TestTritonEmbeddingsStandardUnit(EmbeddingsUnitTests):
    @property
    def embeddings_class(self) -> type[TritonEmbeddings]:
        return TritonEmbeddings

    @property
    def embedding_model_params(self) -> dict:
        return {"model": "all-MiniLM-L6-v2", "url": "127.0.0.1:8001", "protocol": "grpc"}


@pytest.mark.disable_socket
@pytest.mark.filterwarnings("ignore:A test tried to use socket.socket")
def test_the_unit_suite_really_runs_without_sockets() -> None:
    import socket

    from pytest_socket import SocketBlockedError

    with pytest.raises(SocketBlockedError):
        socket.socket()
