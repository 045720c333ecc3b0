"""Refusals keep their class through the chunks step; an execution answers short work first."""

from __future__ import annotations

from embed_runtime.errors import INTERNAL, INVALID_ARG, UNAVAILABLE
from embed_runtime.serving.chunks_step import target_error


class Error:
    """What a business-logic call's failed response carries (Triton's ``TritonError``)."""

    INVALID_ARG, UNAVAILABLE, INTERNAL = 3, 14, 13

    def __init__(self, message: str, code: int):
        self._message, self._code = message, code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


def test_a_refusal_relayed_by_an_ensemble_as_internal_stays_unavailable() -> None:
    """Triton 2.51 answers a step's UNAVAILABLE through a nested ensemble as INTERNAL
    (seen: HTTP 500 "in ensemble 'm', server overloaded: ..."): the message keeps it 503."""
    for message in (
        "in ensemble 'm', server overloaded: 64 row(s) (about 80 ms of work) already wait",
        "in ensemble 'm', deadline passed 15.5 ms before this step ran",
        "request cancelled: its client closed the connection",
    ):
        assert target_error(Error(message, Error.INTERNAL)).code == UNAVAILABLE
    assert target_error(Error("anything", Error.UNAVAILABLE)).code == UNAVAILABLE


def test_other_errors_keep_their_own_class() -> None:
    assert target_error(Error("TEXT row 0 is empty", Error.INVALID_ARG)).code == INVALID_ARG
    assert target_error(Error("boom", Error.INTERNAL)).code == INTERNAL


def test_an_encoder_execution_answers_short_queries_before_passages_and_long_rows() -> None:
    from embed_runtime.serving.encode_step import _length_groups

    lengths = ((240, 200), (9,), (100,), (12, 30), (), (256,))
    assert _length_groups(lengths) == [[1, 3, 4], [2], [0, 5]]
    assert _length_groups(((0, 0), (0,))) == [[0, 1]]  # rows without tokens: one group
