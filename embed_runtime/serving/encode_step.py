"""The body of every ``<name>_encode`` model: one engine, picked once, run per execution.

Each encode adapter (``embed_runtime/models/encode*.py``) is a :class:`EncodeStep` that
names how its engine is opened (:data:`OPENERS`). ``initialize`` opens the graph and the
engine once; ``execute`` reads every request with the engine, embeds all valid ones in
one call and answers each with the engine's outputs, plus the quantized forms
(``EMBEDDING_FP16`` / ``_INT8`` / ...) the request asks for where the config declares
them. ``pb_utils`` is the adapter's, never imported here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..engines.contract import COUNT_OUTPUT, Engine
from ..engines.multivector import MultiVectorParams, MultiVectorTextEncoder
from ..engines.ort_encoder import OpenedEncoder, open_encoder
from ..engines.output_precision import OutputForms
from ..engines.sparse_router import QueryRouteParams, SparseRouter, query_tokenizer
from ..engines.tensor import FixedEngine, SparseEngine, TokenEngine
from ..engines.text_encoder import TextEncoder
from ..ops.backlog_board import EncoderSlot
from ..ops.backlog_board import board_path as backlog_path
from ..ops.priority import lower_priority
from ..ops.server_exit import exit_with_server, is_stub
from ..ops.step_times import EstimateLog, StepTimes
from ..text.request_options import request_parameters
from ..text.tokenizer import TokenizerParams
from .adapter import config_parameters, embed_requests, input_array
from .admission import Taken, late_refusals, wall_clock_us

# The input whose rows' sums are their token counts: what an execution is priced by.
MASK = "attention_mask"


class NoForms:
    """For engines without quantized forms: a request's ``precision`` is not read."""

    def select(self, parameters: Mapping[str, Any], requested: Collection[str] | None) -> tuple:
        """No forms, whatever the request says."""
        return ()

    def outputs(self, embeddings: np.ndarray, forms: Collection[str]) -> dict[str, np.ndarray]:
        """Nothing beyond the engine's outputs."""
        return {}


@dataclass(frozen=True)
class OpenedEngine:
    """An encode step's engine, its ONNX Runtime encoder, its forms and a line for the log."""

    engine: Engine
    opened: OpenedEncoder
    forms: OutputForms | NoForms
    note: str = ""


def _instances(config: Mapping[str, Any]) -> int:
    return sum(int(g.get("count", 1)) for g in config.get("instance_group", []))


def open_graph_engine(args: Mapping[str, str], config: Mapping[str, Any]) -> OpenedEngine:
    """The engine of ``encode``, by the config: fused text, sparse, tokens or fixed-shape.

    ``fused_tokenize``: ``TEXT`` tokenized in this step (:class:`TextEncoder`). Otherwise
    the graph's own inputs, ragged tokens or one fixed-shape tensor, answered as
    embeddings, or with ``sparse`` as their active dimensions. ``TOKEN_COUNT`` is
    answered when the config declares it; so are the quantized forms.
    """
    raw = config_parameters(config)
    opened = open_encoder(args, raw, _instances(config))
    declared = [o["name"] for o in config.get("output", [])]
    counted = COUNT_OUTPUT in declared
    engine: Engine
    if opened.params.fused_tokenize:
        engine = TextEncoder.from_parameters(raw, opened.model_dir, opened.encoder, counted)
    else:
        params, encoder = opened.params, opened.encoder
        engine = TokenEngine(encoder, counted) if params.ragged else FixedEngine(encoder)
        if params.sparse:
            engine = SparseEngine(engine, params.max_active_dims)
    forms = OutputForms.from_config(declared, opened.model_dir, opened.params.normalize)
    return OpenedEngine(engine, opened, forms)


def open_multivector_engine(args: Mapping[str, str], config: Mapping[str, Any]) -> OpenedEngine:
    """The engine of ``encode_multivector``: per-request task tokenizers, per-token vectors."""
    raw = config_parameters(config)
    opened = open_encoder(args, raw)
    engine = MultiVectorTextEncoder(
        os.path.join(opened.model_dir, raw["tokenizer_file"]),
        TokenizerParams.from_parameters(raw),
        MultiVectorParams.from_parameters(raw),
        opened.encoder,
    )
    return OpenedEngine(engine, opened, NoForms())


def open_sparse_router_engine(args: Mapping[str, str], config: Mapping[str, Any]) -> OpenedEngine:
    """The engine of ``encode_sparse_router``: queries by static weights, documents by SPLADE."""
    raw = config_parameters(config)
    opened = open_encoder(args, raw)
    model_dir = opened.model_dir
    route = QueryRouteParams.from_parameters(raw)
    engine = SparseRouter(
        TextEncoder.from_parameters(raw, model_dir, opened.encoder),
        query_tokenizer(raw, model_dir),
        np.load(os.path.join(model_dir, route.weights_file)),
        opened.params.max_active_dims,
    )
    return OpenedEngine(engine, opened, NoForms(), "queries by static weights")


class EncodeStep:
    """A Triton Python model that runs one engine; subclasses name ``pb_utils`` and ``opener``."""

    pb_utils: ClassVar[Any]
    opener: ClassVar[Callable[[Mapping[str, str], Mapping[str, Any]], OpenedEngine]]

    def initialize(self, args: Mapping[str, str]) -> None:
        """Open the graph and the engine once; log where the session runs."""
        exit_with_server()
        lower_priority()  # before ONNX Runtime starts its threads (embed_runtime.ops.priority)
        self.logger = self.pb_utils.Logger
        opened = type(self).opener(args, json.loads(args["model_config"]))
        self.engine, self.forms = opened.engine, opened.forms
        self.encoder = opened.opened.encoder
        params = opened.opened.params
        threads = params.intra_op_threads or "default"
        if self.encoder.shared_session is not None:
            threads = f"{threads} alone, {params.shared_intra_op_threads} beside another"
        note = f"; {opened.note}" if opened.note else ""
        name = args["model_name"]
        self.logger.log_info(
            f"{name}: ONNX Runtime on {self.encoder.session.get_providers()}, intra-op threads "
            f"{threads}, graph {self.encoder.model_path}{note}"
        )
        for repair in self.encoder.cache_repairs:
            self.logger.log_warn(f"{name}: {repair}")
        if self.encoder.cache_error:  # served all the same, each session with its own weights
            self.logger.log_warn(f"{name}: weight cache not used: {self.encoder.cache_error}")
        self.times = StepTimes.from_env(name)
        self.estimates = EstimateLog.from_env(name)
        self._late: dict[int, Exception] = {}
        self._groups: list[list[int]] | None = None
        # What the step in front reads to admit requests (embed_runtime.ops.backlog_board);
        # only inside Triton, whose server the board is named by.
        self.backlog = (
            EncoderSlot(backlog_path(name, args["model_version"])) if is_stub() else None
        )
        if self.times is not None:
            self.logger.log_info(f"{name}: timing each execution into {self.times.path}")

    def _read(self, request: Any) -> tuple[Any, tuple[str, ...]]:
        late = self._late.get(id(request))
        if late is not None:
            raise late
        inputs = {n: input_array(self.pb_utils, request, n) for n in self.engine.input_names}
        parameters = request_parameters(request.parameters())
        item = self.engine.read(inputs, parameters)
        return item, self.forms.select(parameters, request.requested_output_names())

    def _run(self, items: list) -> list[dict[str, np.ndarray]]:
        answers = self.engine.embed([item for item, _ in items])
        if self.times is not None:
            self.times.rows += sum(len(arrays[0]) for arrays in answers)
        out = []
        for arrays, (_, forms) in zip(answers, items, strict=True):
            named = dict(zip(self.engine.output_names, arrays, strict=True))
            out.append({**named, **self.forms.outputs(arrays[0], forms)})
        return out

    def execute(self, requests: list) -> list:
        """Embed all valid requests in one call; each bad one fails alone."""
        if self.backlog is None:
            return self._timed_execute(requests)
        names = self.engine.input_names
        mask = MASK if MASK in names else ""
        taken = Taken.read(self.pb_utils, requests, names[0], mask)
        late = late_refusals(taken, self.backlog.cost)
        self._late = {id(r): e for r, e in zip(requests, late, strict=True) if e is not None}
        self._groups = _length_groups(taken.lengths)
        try:
            with self.backlog.executing(taken.features(), taken.ticket, taken.work_ticket):
                responses = self._timed_execute(requests)
            now = wall_clock_us()
            if self.estimates is not None:
                self.estimates.write(_estimate_lines(taken, now, *self.backlog.expectation))
            self.backlog.observe(taken.ratios(now))
            self.backlog.observe_fixed(taken.residuals(now))
            return responses
        finally:
            self._late, self._groups = {}, None

    def _timed_execute(self, requests: list) -> list:
        if self.times is None:
            return self._execute(requests, self._read, self._run)
        start, ort_before = self.times.clock(), self.encoder.run_ns
        read, run = self.times.timed("read", self._read), self.times.timed("embed", self._run)
        responses = self._execute(requests, read, run)
        total = self.times.clock() - start
        self.times.write(len(requests), self.encoder.run_ns - ort_before, total)
        return responses

    def _execute(self, requests: list, read: Callable, run: Callable) -> list:
        """Embed the requests; with groups, the shortest first, each answered when done.

        A one-sentence query batched with rows of hundreds of tokens is answered once its
        own group has run, not when the whole execution ends; ``execute`` returns when
        every request is answered (one left open would be nobody's if the stub died).
        """
        names, log = self.engine.output_names, self.logger.log_error
        groups = getattr(self, "_groups", None)
        if not groups or len(groups) < 2:
            return embed_requests(self.pb_utils, requests, read, run, names, log)
        pb = self.pb_utils
        for group in groups:
            mine = [requests[i] for i in group]
            for request, response in zip(
                mine, embed_requests(pb, mine, read, run, names, log), strict=True
            ):
                request.get_response_sender().send(
                    response, flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                )
        return [None] * len(requests)

    def finalize(self) -> None:
        """Release the engine, its session(s) and this instance's board slots."""
        if self.encoder is not None and self.encoder.board is not None:
            self.encoder.board.close()
        if self.backlog is not None:
            self.backlog.close()
        self.engine = self.encoder = None


# Requests whose longest row has at most this many tokens run, and are answered, before
# the next class: short queries first, then passages, then long rows.
LENGTH_CLASSES = (32, 128)


def _length_groups(lengths: tuple[tuple[int, ...], ...]) -> list[list[int]]:
    """Request indices by the length class of their longest row, shortest class first."""
    groups: dict[int, list[int]] = {}
    for i, rows in enumerate(lengths):
        longest = max(rows, default=0)
        key = next((k for k, bound in enumerate(LENGTH_CLASSES) if longest <= bound), 99)
        groups.setdefault(key, []).append(i)
    return [groups[k] for k in sorted(groups)]


def _estimate_lines(
    taken: Taken, now_us: int, bias: float, fixed_us: float
) -> list[tuple[int, int, int, int]]:
    """(rows, tokens, expected µs, actual µs) of each request that came with a ticket.

    Expected: the admission's estimate as it weighs it against a deadline (the bias and
    the fixed part of this instance applied).
    """
    return [
        (len(rows), sum(rows), int(estimate * bias + fixed_us), now_us - admitted)
        for rows, (admitted, estimate) in zip(taken.lengths, taken.admitted, strict=True)
        if admitted > 0
    ]
