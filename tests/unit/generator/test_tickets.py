"""The ticket wire: each admitting step joined to the step it admits to, in every ensemble
that runs both, so the encoder's board counts only rows still on their way."""

from __future__ import annotations

from embed_runtime.serving.admission import TICKET_WIDTH
from generator.model_dir import ModelDir
from generator.render import Batching, Instances, IOSpec, Step, ensemble, parse_config, python_model
from generator.tickets import admitted_steps, wire_tickets

TEXT = IOSpec("TEXT", "TYPE_STRING", (1,))
IDS = IOSpec("input_ids", "TYPE_INT64", (-1,), ragged=True)
EMBEDDING = IOSpec("EMBEDDING", "TYPE_FP32", (4,))


def _step(name: str, inputs, outputs, parameters=None) -> ModelDir:
    config = python_model(name, 8, inputs, outputs, parameters or {}, Batching(), Instances())
    return ModelDir(name, config, None)


def _dirs(admission: dict[str, str]) -> list[ModelDir]:
    chain = [
        Step("m_tokenize", (("TEXT", "TEXT"),), (("input_ids", "input_ids"),)),
        Step("m_encode", (("input_ids", "input_ids"),), (("EMBEDDING", "EMBEDDING"),)),
    ]
    return [
        _step("m_tokenize", [TEXT], [IDS], admission),
        _step("m_encode", [IDS], [EMBEDDING]),
        ModelDir("m", ensemble("m", 8, [TEXT], [EMBEDDING], chain), None),
        ModelDir("m_alone", ensemble("m_alone", 8, [IDS], [EMBEDDING], chain[1:]), None),
    ]


def test_an_admitting_step_sends_its_tickets_to_the_step_it_admits_to() -> None:
    admission = {"admission_encoder": "m_encode", "admission_wait_us": "1000"}
    wired = {d.name: parse_config(d.config) for d in wire_tickets(_dirs(admission))}
    issued = [o for o in wired["m_tokenize"].output if o.name == "issued_ticket"]
    taken = [i for i in wired["m_encode"].input if i.name == "admitted_ticket"]
    assert len(issued) == 1 and list(issued[0].dims) == [TICKET_WIDTH] == [5]
    assert len(taken) == 1 and taken[0].optional  # a direct call sends none
    tokenize, encode = wired["m"].ensemble_scheduling.step
    assert tokenize.output_map["issued_ticket"] == "m_encode_ticket"
    assert encode.input_map["admitted_ticket"] == "m_encode_ticket"
    # An ensemble without the admitting step leaves the optional input unmapped.
    (alone,) = wired["m_alone"].ensemble_scheduling.step
    assert "admitted_ticket" not in alone.input_map


def test_no_wire_without_admission_or_for_a_step_that_only_peeks() -> None:
    assert wire_tickets(_dirs({})) == _dirs({})
    peek = {"admission_encoder": "m_encode", "admission_wait_us": "1", "admission_peek": "true"}
    assert admitted_steps(_dirs(peek)) == {}
