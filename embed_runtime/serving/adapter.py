"""Helpers shared by the ``model.py`` adapters; ``pb_utils`` is passed in, never imported."""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import INVALID_ARG, UNAVAILABLE, RequestError
from ..text.request_options import request_parameters
from ..text.tokenizer import split_rows
from .admission import (
    ISSUED_TICKET,
    AdmissionGate,
    gone_reason,
    request_deadline_us,
    row_bytes,
)


def config_parameters(model_config: str | dict[str, Any]) -> dict[str, str]:
    """The ``parameters`` of a model config as a plain ``{key: string_value}`` dict."""
    config = json.loads(model_config) if isinstance(model_config, str) else model_config
    return {k: v["string_value"] for k, v in config.get("parameters", {}).items()}


def error_response(pb_utils: Any, exc: Exception, log: Callable[[str], None] | None = None):
    """An ``InferenceResponse`` carrying ``exc`` with the matching Triton error code.

    Request errors keep their message; anything else becomes a short ``INTERNAL``
    message, its details going to ``log`` only.
    """
    codes = {
        INVALID_ARG: pb_utils.TritonError.INVALID_ARG,
        UNAVAILABLE: pb_utils.TritonError.UNAVAILABLE,
    }
    if isinstance(exc, RequestError):
        code = codes.get(exc.code, pb_utils.TritonError.INTERNAL)
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(exc.message, code))
    if log is not None:
        log(f"internal error: {type(exc).__name__}: {exc}")
    message = f"internal error ({type(exc).__name__}); see the server log"
    return pb_utils.InferenceResponse(
        error=pb_utils.TritonError(message, pb_utils.TritonError.INTERNAL)
    )


def input_array(pb_utils: Any, request: Any, name: str):
    """The numpy array of input ``name`` of ``request``."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        raise RequestError(f"input {name} is missing")
    return tensor.as_numpy()


@dataclass
class Gathered:
    """Rows of every valid request of one ``execute``, ready for one vectorised call.

    ``responses`` already holds the error response of each invalid request; ``valid``
    lists the indices of the others, ``counts`` their row counts, ``items`` all their
    rows in order.
    """

    responses: list
    valid: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    items: list = field(default_factory=list)
    # Each valid request's deadline (µs since the epoch) or None, the estimate of its
    # wait (µs) it was admitted on and its text's bytes, where a gate read them.
    deadlines: list[int | None] = field(default_factory=list)
    estimates: list[int] = field(default_factory=list)
    text_bytes: list[int] = field(default_factory=list)

    def slices(self) -> Iterator[tuple[int, int, int]]:
        """``(request index, start, stop)`` of each valid request's rows in ``items``."""
        start = 0
        for i, count in zip(self.valid, self.counts, strict=True):
            yield i, start, start + count
            start += count

    def fail_valid(self, pb_utils: Any, exc: Exception, log: Callable[[str], None]) -> list:
        """Give every valid request the error ``exc``; returns the responses."""
        for i in self.valid:
            self.responses[i] = error_response(pb_utils, exc, log)
        return self.responses


def _parameters(request: Any) -> dict[str, Any]:
    try:
        return request_parameters(request.parameters())
    except RequestError:
        return {}


def gather_rows(
    pb_utils: Any,
    requests: Sequence[Any],
    read: Callable[[Any], Sequence],
    gate: AdmissionGate | None = None,
):
    """Read each request's rows with ``read``; a :class:`RequestError` fails that one alone.

    A request whose client has gone or whose deadline has passed is answered at once,
    unread (:mod:`.admission`): no step works for an answer nobody can use. So is one
    the ``gate`` refuses because the encoder after this step cannot answer it in time,
    weighed by its rows (:meth:`AdmissionGate.weigh`) before any work of this step's own.
    """
    gathered = Gathered(responses=[None] * len(requests))
    if gate is not None:
        gate.begin()
    for i, request in enumerate(requests):
        gone = gone_reason(request, _parameters)
        deadline, estimate, weights, sizes = None, 0, [], []
        if gone is None and gate is not None:
            parameters = _parameters(request)
            deadline = request_deadline_us(request, parameters)
            sizes = row_bytes(request)
            weights = gate.price(sizes)
            gone = gate.admit(weights, deadline, gate.granted(parameters))
            estimate = gate.estimate_us
        if gone is not None:
            gathered.responses[i] = error_response(pb_utils, gone)
            continue
        try:
            rows = read(request)
        except RequestError as exc:
            if gate is not None:
                gate.withdraw(weights)
            gathered.responses[i] = error_response(pb_utils, exc)
            continue
        gathered.valid.append(i)
        gathered.counts.append(len(rows))
        gathered.items.extend(rows)
        gathered.deadlines.append(deadline)
        gathered.estimates.append(estimate)
        gathered.text_bytes.append(sum(sizes))
    return gathered


def with_tickets(
    pb_utils: Any,
    gate: AdmissionGate | None,
    batch: Gathered,
    outputs: dict[int, list],
    lengths: dict[int, list[int]] | None = None,
) -> dict[int, list]:
    """``outputs`` (tensors by request index) with the :data:`ISSUED_TICKET` of each.

    The requests of ``batch`` that have outputs are passed on to the encoder the ``gate``
    admits to, their rows and work numbered now; ``lengths``: each one's rows' token
    counts as tokenized (none: as they were weighed, 0s for images). Without a gate,
    ``outputs`` as they are.
    """
    if gate is None or not outputs:
        return outputs
    lengths = lengths or {}
    admitted = zip(batch.valid, batch.counts, batch.deadlines, batch.estimates, strict=True)
    passed = [(i, c, d, e) for i, c, d, e in admitted if i in outputs]
    rows = [lengths.get(i, [0] * c) for i, c, _, _ in passed]
    deadlines, estimates = [d for *_, d, _ in passed], [e for *_, e in passed]
    tickets = gate.tickets(rows, deadlines, estimates)
    for (i, *_), ticket in zip(passed, tickets, strict=True):
        outputs[i] = [*outputs[i], pb_utils.Tensor(ISSUED_TICKET, ticket)]
    return outputs


def token_lengths(arrays: dict[str, Any]) -> list[int]:
    """Each row's token count: the sums of its ``attention_mask`` (none: 0 a row)."""
    mask = arrays.get("attention_mask")
    if mask is None or getattr(mask, "ndim", 0) != 2:
        first = next(iter(arrays.values()), None)
        return [0] * (0 if first is None else len(first))
    return [int(v) for v in mask.sum(axis=1)]


def learn_tokens(gate: AdmissionGate, batch: Gathered, lengths: dict[int, list[int]]) -> None:
    """Teach ``gate`` the tokens a byte of text makes, from the requests just tokenized."""
    tokens = sum(sum(rows) for rows in lengths.values())
    text_bytes = sum(b for i, b in zip(batch.valid, batch.text_bytes, strict=True) if i in lengths)
    gate.learn(text_bytes, tokens)


def run_or_isolate(
    run: Callable[[list], list], groups: Sequence[Any], log: Callable[[str], None]
) -> list:
    """``run(groups)`` (one result per group), isolating a failure to its own group.

    When the vectorised call raises, each group runs alone; a group that still fails gets
    its exception as its result, so one bad request cannot fail the others of a batch.
    """
    try:
        return run(list(groups))
    except Exception:  # noqa: BLE001 - retried per group below
        log(f"batched run failed, retrying request by request:\n{traceback.format_exc()}")
    results: list = []
    for group in groups:
        try:
            results.append(run([group])[0])
        except Exception as exc:  # noqa: BLE001 - becomes this group's error response
            log(traceback.format_exc())
            results.append(exc)
    return results


def tokenize_requests(
    pb_utils: Any,
    requests: Sequence[Any],
    read: Callable[[Any], Sequence],
    encode: Callable[[list], dict],
    output_names: Sequence[str],
    log: Callable[[str], None],
    gate: AdmissionGate | None = None,
) -> list:
    """One response per request: ``read`` each, ``encode`` all valid rows at once, slice back.

    ``read(request)`` returns the request's rows (texts or pairs) or raises
    :class:`RequestError`; ``encode(rows)`` returns ``{name: [rows, width]}`` arrays. A
    failing encode is retried request by request (:func:`run_or_isolate`). ``gate``
    admits requests against the encoder's backlog and counts those answered.
    """

    def tokenize(groups: list) -> list:
        rows = [row for group in groups for row in group]
        return split_rows(encode(rows), [len(g) for g in groups])

    batch = gather_rows(pb_utils, requests, read, gate)
    if not batch.items:
        return batch.responses
    groups = [batch.items[start:stop] for _, start, stop in batch.slices()]
    outputs, lengths = {}, {}
    for i, arrays in zip(batch.valid, run_or_isolate(tokenize, groups, log), strict=True):
        if isinstance(arrays, Exception):
            batch.responses[i] = error_response(pb_utils, arrays, log)
            continue
        outputs[i] = [pb_utils.Tensor(n, arrays[n]) for n in output_names]
        lengths[i] = token_lengths(arrays)
    if gate is not None:
        learn_tokens(gate, batch, lengths)
    for i, tensors in with_tickets(pb_utils, gate, batch, outputs, lengths).items():
        batch.responses[i] = pb_utils.InferenceResponse(output_tensors=tensors)
    return batch.responses


def read_requests(
    pb_utils: Any, requests: Sequence[Any], read: Callable[[Any], Any]
) -> tuple[list, dict[int, Any]]:
    """``(responses, items)``: what ``read`` returns of each request, by its index.

    A request whose client has gone or whose deadline has passed (:mod:`.admission`), or
    that ``read`` refuses with a :class:`RequestError`, has its error response in
    ``responses`` instead; every other slot there is None.
    """
    responses: list = [None] * len(requests)
    items: dict[int, Any] = {}
    for i, request in enumerate(requests):
        gone = gone_reason(request, _parameters)
        if gone is not None:
            responses[i] = error_response(pb_utils, gone)
            continue
        try:
            items[i] = read(request)
        except RequestError as exc:
            responses[i] = error_response(pb_utils, exc)
    return responses, items


def embed_requests(
    pb_utils: Any,
    requests: Sequence[Any],
    read: Callable[[Any], Any],
    run: Callable[[list], list],
    output_name: str | Sequence[str],
    log: Callable[[str], None],
) -> list:
    """One response per request: ``read`` each, ``run`` all valid ones at once.

    ``read(request)`` returns what ``run`` needs of that request or raises
    :class:`RequestError` (that request alone fails); ``run(items)`` returns one output
    array per item, or with several ``output_name``s a tuple of arrays in that order, or
    a ``{name: array}`` dict (outputs that differ per request). A failing run is retried
    request by request (:func:`run_or_isolate`).
    """
    names = [output_name] if isinstance(output_name, str) else list(output_name)
    responses, read_items = read_requests(pb_utils, requests, read)
    if not read_items:
        return responses
    items = list(read_items.values())
    for i, out in zip(read_items, run_or_isolate(run, items, log), strict=True):
        if isinstance(out, Exception):
            responses[i] = error_response(pb_utils, out, log)
            continue
        if isinstance(out, dict):
            tensors = [pb_utils.Tensor(n, a) for n, a in out.items()]
        else:
            arrays = (out,) if len(names) == 1 else out
            tensors = [pb_utils.Tensor(n, a) for n, a in zip(names, arrays, strict=True)]
        responses[i] = pb_utils.InferenceResponse(output_tensors=tensors)
    return responses
