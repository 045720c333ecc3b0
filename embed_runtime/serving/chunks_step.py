"""The body of ``<name>_chunks``: long texts in, one embedding per chunk (or per text) out.

Each request's rows are cut in the served tokenizer's tokens (:mod:`..text.chunking`);
the chunks go on, as plain ``TEXT`` rows, to the model's own ensemble ``<name>`` in
requests of at most its batch size (Triton's business logic scripting, all of an
execution's requests at once), so the encoder batches them with the rest of its traffic
and its admission, prompts, ``dimensions`` and deadlines apply to them as to any row.
A chunk's vector is therefore ``SentenceTransformer.encode(text[start:end])``.

Outputs per chunk: the embedding, ``CHUNK_ROW`` (its input row), ``CHUNK_SPAN`` (start
and end, Python ``str`` indices into that row) and ``TOKEN_COUNT`` (its own tokens, no
prompt or special tokens). With ``long_text=mean`` one row per input row instead: the
token-weighted mean of its chunks' vectors, L2-normalised where the model normalises.

With ``late_chunking=true`` (a model built with it) the chunks are pooled from one
transformer pass over their whole row, here in this step
(:mod:`..engines.late_chunks`); ``join_rows=true`` takes the request's rows as
consecutive pieces of one document, one chunk each. A request that asks for the spans
alone (no ``EMBEDDING``) is answered without any encoding: the text splitters' call.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..config_params import ConfigParams
from ..engines.late_chunks import LateChunker
from ..engines.output_precision import resolve_precision
from ..errors import InvalidInputError, RequestError, UnavailableError
from ..ops.backlog_board import BulkSlots
from ..ops.integrity import verify_digests
from ..ops.server_exit import exit_with_server
from ..text.chunking import CHUNK_PARAMETERS, Chunk, Chunker, ChunkOptions, chunk_options
from ..text.request_options import (
    request_parameters,
    resolve_dimensions,
    resolve_prompt,
    truncate,
)
from ..text.tokenizer import TokenizerParams, decode_texts, untruncated
from .adapter import config_parameters, error_response, input_array, read_requests
from .admission import GRANT_PARAMETER, AdmissionGate, request_deadline_us

CHUNK_ROW, CHUNK_SPAN, TOKEN_COUNT = "CHUNK_ROW", "CHUNK_SPAN", "TOKEN_COUNT"
# How often a part waiting for a bulk slot looks again (s).
BULK_POLL_S = 0.005


@dataclass(frozen=True)
class ChunksParams(ConfigParams):
    """Where chunks go and how many a request may make: ``<name>_chunks``' parameters.

    ``target_model``: the plain ensemble the chunks are sent to, ``target_max_batch`` rows
    and ``target_max_request_bytes`` bytes a request at most. ``max_chunks``: the bound
    on one request's chunks (their token tensors are held at once). ``normalize``: the
    model L2-normalises (the mean of ``long_text=mean`` is normalised again).
    """

    params_name: ClassVar[str] = "chunks"

    target_model: str
    target_max_batch: int
    target_max_request_bytes: int
    output_name: str = "EMBEDDING"
    max_chunks: int = 4096
    normalize: bool = False
    # Late chunking's transformer window (the model's max_seq_length); 0: not built.
    late_window: int = 0
    # The encoder's instances, when bulk parts are to leave one free for interactive
    # requests (embed_runtime.ops.backlog_board.BulkSlots); 0: no bound.
    bulk_instances: int = 0


@dataclass(frozen=True)
class ChunkedRequest:
    """One valid request: its rows, its chunks and what goes on with them.

    ``late``: late chunking's arguments (chunk size, prompt, ``dimensions``) and
    ``late_tokens`` the token counts of the transformer windows it will run, where the
    request asks for it; its chunks are made with its vectors, in :meth:`ChunksStep._embed`.
    """

    texts: list[str]
    chunks: list[Chunk]
    options: ChunkOptions
    forward: dict[str, Any]
    timeout_us: int
    spans_only: bool = False
    late: tuple[int, str, int | None] | None = None
    late_tokens: tuple[int, ...] = ()


def token_weighted_mean(
    vectors: np.ndarray, rows: np.ndarray, weights: np.ndarray, n_rows: int, normalize: bool
) -> np.ndarray:
    """Per input row, the mean of its chunk ``vectors`` weighted by their tokens."""
    sums = np.zeros((n_rows, vectors.shape[1]), dtype=np.float64)
    np.add.at(sums, rows, vectors.astype(np.float64) * weights[:, None])
    totals = np.zeros(n_rows, dtype=np.float64)
    np.add.at(totals, rows, weights.astype(np.float64))
    means = sums / np.maximum(totals, 1.0)[:, None]
    if normalize:
        means /= np.maximum(np.linalg.norm(means, axis=1, keepdims=True), 1e-12)
    return means.astype(np.float32)


def pieces(texts: list[bytes], max_rows: int, max_bytes: int) -> list[slice]:
    """Consecutive slices of ``texts``, each at most ``max_rows`` rows and ``max_bytes``."""
    out, start, size = [], 0, 0
    for i, text in enumerate(texts):
        if i > start and (i - start >= max_rows or size + len(text) > max_bytes):
            out.append(slice(start, i))
            start, size = i, 0
        size += len(text)
    out.append(slice(start, len(texts)))
    return out


class ChunksStep:
    """The ``<name>_chunks`` Python model; subclasses name ``pb_utils``."""

    pb_utils: ClassVar[Any]

    def initialize(self, args: Mapping[str, str]) -> None:
        """Read the tokenizer and the target from the config, once."""
        exit_with_server()
        self.logger = self.pb_utils.Logger
        params = config_parameters(args["model_config"])
        self.params = ChunksParams.from_parameters(params)
        self.tok = TokenizerParams.from_parameters(params)
        model_dir = os.path.join(args["model_repository"], args["model_version"])
        verify_digests(model_dir)
        from tokenizers import Tokenizer  # noqa: PLC0415 - serve-time dependency

        path = os.path.join(model_dir, params["tokenizer_file"])
        tokenizer = untruncated(Tokenizer.from_file(path))
        self.chunker = Chunker(tokenizer, self.tok.max_length, self.tok.lowercase)
        self._late_args = (model_dir, tokenizer, self.tok.output_names, self.params.late_window,
                           self.tok.lowercase)
        self._late: LateChunker | None = None
        self.gate = AdmissionGate.from_parameters(
            params, args["model_version"], self.pb_utils, args["model_name"], self.tok.max_length
        )
        self.bulk = None
        if self.gate is not None:
            self.gate.interactive = False
            if self.params.bulk_instances:
                self.bulk = BulkSlots(self.gate.board.path, self.params.bulk_instances)

    @property
    def late(self) -> LateChunker | None:
        """Late chunking's graphs, opened on the first request that asks (None: not built)."""
        if self._late is None and self.params.late_window:
            self._late = LateChunker(*self._late_args)
        return self._late

    def read(self, request: Any) -> ChunkedRequest:
        """Validate one request and cut its rows; raises :class:`RequestError`."""
        parameters = request_parameters(request.parameters())
        options = chunk_options(parameters)
        resolve_precision(parameters, ())
        prompt = resolve_prompt(parameters, dict(self.tok.prompts), self.tok.default_prompt_name)
        rows = input_array(self.pb_utils, request, "TEXT")
        texts = decode_texts(rows, "TEXT", self.tok.max_text_bytes, self.tok.max_request_bytes)
        size = self.chunker.chunk_size(prompt, options)
        spans_only = self.params.output_name not in _requested(request)
        late, late_tokens, chunks = None, (), []
        if options.late and not spans_only:
            if self.late is None:
                raise InvalidInputError(
                    "late_chunking is not built for this model (manifest: late_chunking = true)"
                )
            late_tokens = self._refuse_past_bound(texts, size, options)
            late = (size, prompt, resolve_dimensions(parameters, self.tok.max_dimensions))
        else:
            chunks = self.chunker.chunks(texts, size, options.chunk_overlap, prompt)
            self._refuse_over_max(len(chunks), size)
        # What business logic scripting can carry (bool, int, str); the steps read no other.
        forward = {
            k: v
            for k, v in parameters.items()
            if k not in CHUNK_PARAMETERS
            and k != GRANT_PARAMETER
            and isinstance(v, (bool, int, str))
        }
        timeout = getattr(request, "timeout", None)
        timeout_us = timeout() if timeout is not None else 0
        return ChunkedRequest(
            texts, chunks, options, forward, int(timeout_us or 0), spans_only, late, late_tokens
        )

    def _refuse_over_max(self, count: int, size: int) -> None:
        if count > self.params.max_chunks:
            raise InvalidInputError(
                f"the request's rows make {count} chunks of at most {size} tokens, over "
                f"this model's bound of {self.params.max_chunks} chunks a request "
                "(max_chunks); send fewer rows a request or larger chunks"
            )

    def _refuse_past_bound(
        self, texts: list[str], size: int, options: ChunkOptions
    ) -> tuple[int, ...]:
        """Refuse before the transformer runs a request whose chunks would pass the bound.

        Returns the token counts of the transformer windows late chunking will run: what
        the request is admitted by.
        """
        counts = self.chunker.token_counts(texts)
        tokens = sum(counts)
        step = max(size - options.chunk_overlap, 1)
        least = len(texts) if options.join else -(-max(tokens - size, 0) // step) + len(texts)
        if least > self.params.max_chunks:
            raise InvalidInputError(
                f"the request's rows make at least {least} chunks of at most {size} tokens, "
                f"over this model's bound of {self.params.max_chunks} chunks a request "
                "(max_chunks); send fewer rows a request or larger chunks"
            )
        window = max(self.params.late_window, 1)
        texts_tokens = [tokens] if options.join else counts
        return tuple(
            min(window, n - start) for n in texts_tokens for start in range(0, max(n, 1), window)
        )

    def _late_vectors(self, job: ChunkedRequest) -> tuple[list[Chunk], np.ndarray]:
        """Late chunking's chunks and vectors of ``job`` (run on a worker thread)."""
        size, prompt, dimensions = job.late
        overlap, join = job.options.chunk_overlap, job.options.join
        chunks, vectors = self.late.chunks(job.texts, size, overlap, prompt, join)
        self._refuse_over_max(len(chunks), size)
        return chunks, truncate(vectors, dimensions, self.params.normalize)

    async def _embed(self, job: ChunkedRequest) -> list:
        """The output tensors of one request: its chunks embedded by the target model.

        Late chunking's transformer runs on a worker thread: the event loop keeps sending
        and answering the other requests' chunks meanwhile.
        """
        pb = self.pb_utils
        if job.late is not None:
            chunks, vectors = await asyncio.to_thread(self._late_vectors, job)
            return self._outputs(dataclasses.replace(job, chunks=chunks), vectors)
        if job.spans_only:
            return self._outputs(job, None)
        texts = [job.texts[c.row][c.start : c.end].encode() for c in job.chunks]
        calls = []
        bounds = self.params.target_max_batch, self.params.target_max_request_bytes
        for part in pieces(texts, *bounds):
            batch = np.array(texts[part], dtype=object).reshape(-1, 1)
            kwargs = {"timeout": job.timeout_us} if job.timeout_us > 0 else {}
            call = pb.InferenceRequest(
                model_name=self.params.target_model,
                inputs=[pb.Tensor("TEXT", batch)],
                requested_output_names=[self.params.output_name],
                parameters=job.forward,
                **kwargs,
            )
            calls.append(self._send_part(call))
        vectors = []
        for response in await asyncio.gather(*calls):
            if response.has_error():
                raise target_error(response.error())
            tensor = pb.get_output_tensor_by_name(response, self.params.output_name)
            vectors.append(tensor.as_numpy())
        return self._outputs(job, np.concatenate(vectors, axis=0))

    async def _send_part(self, call: Any) -> Any:
        """The part's response; while interactive requests come, through a bulk slot."""
        if self.bulk is None:
            return await call.async_exec()
        while (slot := self.bulk.try_take()) is None:
            await asyncio.sleep(BULK_POLL_S)
        try:
            return await call.async_exec()
        finally:
            self.bulk.give(slot)

    def _outputs(self, job: ChunkedRequest, embeddings: np.ndarray | None) -> list:
        """The request's output tensors; ``embeddings`` None: the spans alone were asked."""
        pb = self.pb_utils
        rows = np.array([c.row for c in job.chunks], dtype=np.int32)
        spans = np.array([(c.start, c.end) for c in job.chunks], dtype=np.int64).reshape(-1, 2)
        counts = np.array([c.tokens for c in job.chunks], dtype=np.int32)
        if job.options.mean and embeddings is not None:
            n = len(job.texts)
            embeddings = token_weighted_mean(embeddings, rows, counts, n, self.params.normalize)
            spans = np.array([(0, len(t)) for t in job.texts], dtype=np.int64)
            counts = np.bincount(rows, weights=counts, minlength=n).astype(np.int32)
            rows = np.arange(n, dtype=np.int32)
        tensors = [
            pb.Tensor(CHUNK_ROW, rows.reshape(-1, 1)),
            pb.Tensor(CHUNK_SPAN, spans),
            pb.Tensor(TOKEN_COUNT, counts.reshape(-1, 1)),
        ]
        if embeddings is None:
            return tensors
        return [pb.Tensor(self.params.output_name, np.ascontiguousarray(embeddings)), *tensors]

    def _admit(self, requests: list, responses: list, jobs: dict[int, ChunkedRequest]) -> None:
        """Admit each request's chunks as one unit, or refuse the request before any work.

        The wait ahead of the request is bounded, never its own chunks: they go on with
        the grant, so the tokenize step counts them without weighing each behind the
        others (a request of 300 chunks was refused for its own size before).
        """
        if self.gate is None:
            return
        self.gate.begin()
        for i, job in list(jobs.items()):
            if job.spans_only:
                continue
            parameters = request_parameters(requests[i].parameters())
            deadline = request_deadline_us(requests[i], parameters)
            lengths = list(job.late_tokens) or [c.tokens + 2 for c in job.chunks]
            refused = self.gate.admit(lengths, deadline)
            if refused is not None:
                responses[i] = error_response(self.pb_utils, refused)
                del jobs[i]
            else:
                job.forward[GRANT_PARAMETER] = self.gate.grant

    async def execute(self, requests: list) -> list:
        """Cut every request, send all their chunks on at once, answer each when it is done.

        Each request is answered through its response sender as soon as its own chunks
        are embedded, so a short request batched with a long one (late chunking, a book)
        is not held until the long one ends; ``execute`` returns once all are answered
        (a request still open after it returns would be nobody's if the stub died).
        """
        pb, log = self.pb_utils, self.logger.log_error
        responses, jobs = read_requests(pb, requests, self.read)
        self._admit(requests, responses, jobs)
        for i, response in enumerate(responses):
            if response is not None:
                _send(pb, requests[i], response)

        async def answer(i: int, job: ChunkedRequest) -> None:
            try:
                response = pb.InferenceResponse(output_tensors=await self._embed(job))
            except Exception as exc:  # noqa: BLE001 - every request gets its response
                response = error_response(pb, exc, log)
            _send(pb, requests[i], response)

        await asyncio.gather(*(answer(i, job) for i, job in jobs.items()))
        return [None] * len(requests)

    def finalize(self) -> None:
        """Drop the tokenizer; free this instance's admission slot."""
        self.chunker = None
        if self.bulk is not None:
            self.bulk.close()
        if self.gate is not None:
            self.gate.close()


def _send(pb_utils: Any, request: Any, response: Any) -> None:
    """Send ``request``'s one final response now."""
    sender = request.get_response_sender()
    sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def _requested(request: Any) -> set[str]:
    """The outputs a request asked for (all of them when it named none)."""
    names = getattr(request, "requested_output_names", None)
    return set(names()) if names is not None else set()


# What the steps answer UNAVAILABLE with (embed_runtime.serving.admission): a refusal keeps
# its class (HTTP 503, gRPC UNAVAILABLE) through this step even where the code is lost.
UNAVAILABLE_PREFIXES = ("server overloaded:", "deadline passed", "request cancelled")


def target_error(error: Any) -> RequestError:
    """The target's error as this request's, its message kept, 400 / 503 kept."""
    message = error.message()
    code = error.code() if hasattr(error, "code") else None
    if code == getattr(error, "UNAVAILABLE", object()) or any(
        p in message for p in UNAVAILABLE_PREFIXES
    ):
        return UnavailableError(message)
    if code == getattr(error, "INVALID_ARG", object()):
        return InvalidInputError(message)
    return RequestError(message)
