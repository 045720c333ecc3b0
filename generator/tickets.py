"""The ticket wire between an admitting step and the step it admits to.

An admitting step (tokenize, ``<name>_admit_image``, image preprocessing) numbers the rows
it passes on and sends each request's ticket to the step after it, which records the
highest ticket it takes (``embed_runtime/ops/backlog_board.py``): so the backlog counts only
rows still on their way, never a request that some step dropped. This pass adds the wire to
the model dirs one entry builds, wherever a step's config names the step it admits to
(``admission_encoder``) and counts what it passes on (no ``admission_peek``):

- the admitting step's output ``issued_ticket`` and the admitted step's optional input
  ``admitted_ticket``, both ``[TICKET_WIDTH]`` INT64 a row (a direct call of the admitted step
  sends none);
- in each ensemble that runs both, the tensor ``<admitted step>_ticket`` joining them.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from embed_runtime.serving.admission import (
    ADMISSION_ENCODER,
    ADMISSION_PEEK,
    ADMITTED_TICKET,
    ISSUED_TICKET,
    TICKET_WIDTH,
)

from .model_dir import ModelDir
from .render import parse_config

_OUTPUT = (
    f'output {{\n  name: "{ISSUED_TICKET}"\n  data_type: TYPE_INT64\n'
    f"  dims: [ {TICKET_WIDTH} ]\n}}\n"
)
_INPUT = (
    f'input {{\n  name: "{ADMITTED_TICKET}"\n  data_type: TYPE_INT64\n'
    f"  dims: [ {TICKET_WIDTH} ]\n"
    "  optional: true\n}\n"
)


def admitted_steps(dirs: Sequence[ModelDir]) -> dict[str, str]:
    """``{admitting step: the step it admits to}`` among ``dirs``, counting steps only."""
    names = {d.name for d in dirs}
    pairs = {}
    for model_dir in dirs:
        params = parse_config(model_dir.config).parameters
        target = params[ADMISSION_ENCODER].string_value if ADMISSION_ENCODER in params else ""
        peek = ADMISSION_PEEK in params and params[ADMISSION_PEEK].string_value == "true"
        if target in names and not peek:
            pairs[model_dir.name] = target
    return pairs


def _step_line(model: str) -> re.Pattern[str]:
    return re.compile(rf'^(\s*)model_name: "{re.escape(model)}"\n\s*model_version: -?\d+\n', re.M)


def _insert_after(pattern: re.Pattern[str], line: str, text: str) -> str:
    """``text`` with ``line`` added, at the step's own indent, after each step ``pattern``."""
    return pattern.sub(lambda m: f"{m.group(0)}{m.group(1)}{line}\n", text)


def _map_in_ensemble(text: str, pairs: dict[str, str]) -> str:
    """``text`` (an ensemble config) with each admitting step joined to its admitted one."""
    for admitter, admitted in pairs.items():
        source, target = _step_line(admitter), _step_line(admitted)
        if not (source.search(text) and target.search(text)):
            continue
        tensor = f"{admitted}_ticket"
        issued = f'output_map {{ key: "{ISSUED_TICKET}" value: "{tensor}" }}'
        text = _insert_after(source, issued, text)
        taken = f'input_map {{ key: "{ADMITTED_TICKET}" value: "{tensor}" }}'
        text = _insert_after(target, taken, text)
    return text


def wire_tickets(dirs: Sequence[ModelDir]) -> list[ModelDir]:
    """``dirs`` with the ticket wire added wherever a step admits to another (see above)."""
    pairs = admitted_steps(dirs)
    if not pairs:
        return list(dirs)
    wired = []
    for model_dir in dirs:
        text = model_dir.config
        if model_dir.name in pairs:
            text += _OUTPUT
        if model_dir.name in pairs.values():
            text += _INPUT
        if parse_config(text).platform == "ensemble":
            text = _map_in_ensemble(text, pairs)
        if text != model_dir.config:
            parse_config(text)
            model_dir = dataclasses.replace(model_dir, config=text)
        wired.append(model_dir)
    return wired
