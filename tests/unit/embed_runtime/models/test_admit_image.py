"""The admit_image adapter (``embed_runtime/models/admit_image.py``): image bytes passed on
unchanged, or refused before the preprocessing step while its queue is full; and the
preprocessing step counting, on that board, the requests it takes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embed_runtime.ops.backlog_board import Admission, EncoderSlot
from embed_runtime.ops.cost_model import features
from embed_runtime.serving.admission import AdmissionGate
from tests.unit import fake_pb_utils as pb
from tests.unit.embed_runtime.models.helpers import _args, _error, load_adapter
from tests.unit.embed_runtime.ops.test_backlog_board import MS, Clock


def _request(*blobs: bytes) -> pb.InferenceRequest:
    rows = np.empty((len(blobs), 1), dtype=object)
    rows[:, 0] = blobs
    return pb.InferenceRequest([pb.Tensor("IMAGE", rows)])


@pytest.fixture
def admit(backend, tmp_path: Path):
    """The adapter with a gate on a board of its own (100 ms bound) and the clock."""
    clock = Clock()
    model = load_adapter("admit_image").TritonPythonModel()
    model.initialize(_args(tmp_path / "m_admit_image", {}))
    assert model.gate is None  # no admission parameters: everything passes
    board = str(tmp_path / "board")
    model.gate = AdmissionGate(Admission(board, clock), "m_preprocess_image", 100_000)
    yield model, board, clock
    model.finalize()


def test_admitted_images_pass_on_unchanged_and_are_counted(admit) -> None:
    model, board, clock = admit
    requests = [_request(b"\xff\xd8jpeg", b"\x89PNG"), _request(b"GIF89a")]
    responses = model.execute(requests)
    for request, response in zip(requests, responses, strict=True):
        got, ticket = response.output_tensors()
        assert got.name() == "ADMITTED" and got.as_numpy().shape[1] == 1
        want = request.inputs()[0].as_numpy()
        assert got.as_numpy().tolist() == want.tolist()
        assert ticket.name() == "issued_ticket" and len(ticket.as_numpy()) == len(want)
    tickets = [r.output_tensors()[1].as_numpy()[0, 0] for r in responses]
    assert tickets == [2, 3]  # the images numbered in order
    assert Admission(board, clock).read().queued == 3


def test_a_zero_row_request_fails_alone(admit) -> None:
    model, _, _ = admit
    empty = pb.InferenceRequest([pb.Tensor("IMAGE", np.empty((0, 1), dtype=object))])
    responses = model.execute([empty, _request(b"x")])
    assert "zero rows" in _error(responses[0])[1]
    assert not responses[1].has_error()


def test_requests_past_the_preprocessing_queues_bound_are_refused_unread(admit) -> None:
    model, board, clock = admit
    preprocess = EncoderSlot(board, clock)
    for n in (1, 4, 2, 8):  # 20 ms an image and 5 ms an execution, learned
        with preprocess.executing(features([[0]] * n)):
            clock.ns += (5 + 20 * n) * MS
    model.gate.board.issue([4, 2], [80 * MS, 40 * MS])  # 120 ms of work wait: over 100 ms
    with preprocess.executing(features([[0]])):  # running: not idle
        responses = model.execute([_request(b"a") for _ in range(3)])
    assert [r.has_error() for r in responses] == [True, True, True]
    assert len(responses[0].output_tensors()) == 0
    code, message = _error(responses[2])
    assert code == pb.TritonError.UNAVAILABLE
    assert "server overloaded" in message and "m_preprocess_image" in message


def test_the_step_in_front_of_the_fetch_refuses_while_full_and_counts_nothing(
    backend, tmp_path: Path
) -> None:
    """``<name>_admit_url`` (admission_peek): URLs passed on or refused, the board untouched."""
    clock = Clock()
    model = load_adapter("admit_image").TritonPythonModel()
    model.initialize(_args(tmp_path / "m_admit_url", {"admission_peek": "true"}))
    board = str(tmp_path / "board")
    model.gate = AdmissionGate(Admission(board, clock), "m_preprocess_image", 100_000)
    preprocess = EncoderSlot(board, clock)
    try:
        for n in (1, 4, 2, 8):  # 20 ms an image and 5 ms an execution, learned
            with preprocess.executing(features([[0]] * n)):
                clock.ns += (5 + 20 * n) * MS
        urls = [_request(b"http://127.0.0.1/a.jpg", b"http://127.0.0.1/b.jpg")]
        responses = model.execute(urls)  # room: passed on, as it came
        assert not responses[0].has_error()
        assert [t.name() for t in responses[0].output_tensors()] == ["ADMITTED"]  # no ticket
        assert responses[0].output_tensors()[0].as_numpy().tolist() == (
            urls[0].inputs()[0].as_numpy().tolist()
        )
        assert Admission(board, clock).read().queued == 0  # counted after the fetch only
        model.gate.board.issue([1] * 6, [20 * MS] * 6)  # 120 ms wait after their fetch
        with preprocess.executing(features([[0]])):
            responses = model.execute([_request(b"http://127.0.0.1/c.jpg")])
        code, message = _error(responses[0])
        assert code == pb.TritonError.UNAVAILABLE and "server overloaded" in message
        assert Admission(board, clock).read().queued == 6
    finally:
        model.finalize()
        preprocess.close()


def test_the_preprocessing_step_counts_what_it_takes_on_its_own_board(
    backend, tmp_path, monkeypatch
) -> None:
    """With ``admission_backlog`` set, preprocess_image takes a slot (inside a stub)."""
    from tests.unit.embed_runtime.models.test_preprocess_image import IMAGE_PARAMS, _png

    module = load_adapter("preprocess_image")
    monkeypatch.setitem(module.TritonPythonModel.initialize.__globals__, "is_stub", lambda: True)
    boards = {}
    monkeypatch.setitem(
        module.TritonPythonModel.initialize.__globals__,
        "board_path",
        lambda name, version: boards.setdefault(name, str(tmp_path / f"board-{name}")),
    )
    model = module.TritonPythonModel()
    params = {**IMAGE_PARAMS.to_parameters(), "decode_threads": "1", "admission_backlog": "true"}
    model.initialize(_args(tmp_path / "m_preprocess_image", params))
    try:
        reader = Admission(boards["m_preprocess_image"])
        first, second, _ = reader.issue([1, 1, 1], [MS, MS, MS])
        image = _png(8, 8)
        tickets = [
            pb.Tensor("admitted_ticket", np.array([[t, 0, 0, 0, w]])) for t, w in (first, second)
        ]
        requests = [_request(image), _request(image)]
        for request, ticket in zip(requests, tickets, strict=True):
            request._inputs.append(ticket)
        responses = model.execute(requests)
        assert not any(r.has_error() for r in responses)
        backlog = reader.read()
        assert backlog.queued == 1 and backlog.work_ns == MS and backlog.encoders == 1
        assert backlog.cost.known
        reader.close()
    finally:
        model.finalize()
