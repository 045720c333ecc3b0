"""The client side of multi-vector models: MaxSim, the empty case and the CLI flag."""

from __future__ import annotations

import numpy as np
import pytest

from client import EmbeddingClient
from client.cli import parse_args
from client.multivector import maxsim
from tests.unit.client.test_api import _closed_port


def _ragged(rng, lengths, dim=8) -> list[np.ndarray]:
    rows = [rng.standard_normal((n, dim)).astype(np.float32) for n in lengths]
    return [r / np.linalg.norm(r, axis=1, keepdims=True) for r in rows]


@pytest.mark.parametrize("length_normalize", [False, True])
def test_maxsim_equals_the_library_scoring(length_normalize) -> None:
    from sentence_transformers.util import maxsim as library_maxsim

    rng = np.random.default_rng(0)
    queries, documents = _ragged(rng, [3, 16, 1]), _ragged(rng, [5, 1, 40, 12])
    got = maxsim(queries, documents, length_normalize=length_normalize)
    want = library_maxsim(queries, documents, length_normalize=length_normalize).numpy()
    assert got.shape == (3, 4) and got.dtype == np.float32
    assert np.abs(got - want).max() <= 1e-5


def test_maxsim_of_nothing_is_empty() -> None:
    assert maxsim([], _ragged(np.random.default_rng(1), [2])).shape == (0, 1)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_no_texts_return_no_rows_without_a_server(protocol) -> None:
    with EmbeddingClient(f"127.0.0.1:{_closed_port()}", protocol, timeout_s=2) as client:
        assert client.embed_multivector("cb", []) == []


def test_cli_takes_the_task_of_a_multi_vector_model() -> None:
    args = parse_args(["embed", "--model", "cb", "--multivector", "query", "a cat"])
    assert (args.multivector, args.texts) == ("query", ["a cat"])
    with pytest.raises(SystemExit):
        parse_args(["embed", "--model", "cb", "--multivector", "passage", "a cat"])
