"""Multi-vector (ColBERT) text embeddings: one vector per scored token of each text.

Reproduces sentence-transformers' ``MultiVectorEncoder.encode_query`` /
``encode_document`` around an exported graph that returns the pipeline's token
embeddings ``[B, T, D]`` (projection and normalisation inside):

- the request's ``task`` (``query`` or ``document``, default ``document``) picks the
  prompt (the model's prompt of that name, e.g. a ``[Q] `` marker), the truncation
  length (``query_length`` / ``document_length``) and what follows;
- queries with query expansion are padded to the expansion length with the expansion
  token (``[MASK]``), attended to or not as the model says, and every expansion
  position is scored (``Transformer.preprocess`` and ``MultiVectorMask``);
- a PyLate ColBERT's marker is a token id put right after the first token (``[CLS]``),
  the text cut one token shorter to make room (``ColBERT.tokenize``);
- tokens of the skiplist (punctuation, for documents) are dropped from the output;
- each row is answered as its scored vectors, padded with zeros to the longest row of
  the request: ``EMBEDDINGS`` ``[N, T, D]`` and ``TOKEN_COUNT`` (rows of ``[N, 1]``).

Rows of every request of an execution run together, sorted by fed width and chunked as
the dense encoders' rows are (``embed_runtime.engines.ragged``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..errors import InvalidInputError
from ..text.chunking import refuse_chunk_options
from ..text.request_options import (
    TASKS,
    apply_prompt,
    resolve_dimensions,
    resolve_prompt,
    resolve_task,
)
from ..text.tokenizer import BatchTokenizer, TokenizerParams, decode_texts, keeps_end
from .contract import TEXT_INPUT, text_rows
from .ragged import Chunk

EMBEDDINGS, TOKEN_COUNT = "EMBEDDINGS", "TOKEN_COUNT"


@dataclass(frozen=True)
class TaskParams:
    """How one task's texts are tokenized and which of their tokens are scored.

    ``max_length`` is the truncation length (special tokens, prompt and prefix
    included). ``prefix_id`` >= 0 is inserted after each row's first token, the text cut
    at ``max_length - 1`` tokens first. ``expansion_length`` > 0 pads shorter rows to
    that many tokens with ``expansion_id`` (all of them scored; attended to by the
    encoder when ``expansion_attend``); ``skip_ids`` are dropped from the output.
    """

    max_length: int
    expansion_length: int = 0
    expansion_id: int = 0
    expansion_attend: bool = False
    skip_ids: tuple[int, ...] = ()
    prefix_id: int = -1

    @property
    def text_length(self) -> int:
        """Tokens the tokenizer keeps: ``max_length`` less the room for the prefix."""
        return self.max_length - (1 if self.prefix_id >= 0 else 0)


@dataclass(frozen=True)
class MultiVectorParams:
    """The model's multi-vector settings; written to and read from one config parameter."""

    query: TaskParams
    document: TaskParams
    prompts: tuple[tuple[str, str], ...] = ()
    default_prompt_name: str = ""

    PARAMETER = "multi_vector"

    def task(self, name: str) -> TaskParams:
        """The settings of task ``name`` (``query`` or ``document``)."""
        return self.query if name == "query" else self.document

    def parameters(self) -> dict[str, str]:
        """The config parameter that :meth:`from_parameters` reads back."""
        value = {
            "query": _task_dict(self.query),
            "document": _task_dict(self.document),
            "prompts": dict(self.prompts),
            "default_prompt_name": self.default_prompt_name,
        }
        return {self.PARAMETER: json.dumps(value, sort_keys=True, ensure_ascii=False)}

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, str]) -> MultiVectorParams:
        """Parse the config parameter; fail loudly when it is missing or malformed."""
        if cls.PARAMETER not in parameters:
            raise ValueError(f"config parameter {cls.PARAMETER!r} is missing")
        raw = json.loads(parameters[cls.PARAMETER])

        def task(value: dict) -> TaskParams:
            value = dict(value)
            value["skip_ids"] = tuple(int(i) for i in value.get("skip_ids", ()))
            return TaskParams(**value)

        return cls(
            query=task(raw["query"]),
            document=task(raw["document"]),
            prompts=tuple(sorted(raw.get("prompts", {}).items())),
            default_prompt_name=raw.get("default_prompt_name", ""),
        )


def _task_dict(task: TaskParams) -> dict:
    value = asdict(task)
    if task.prefix_id < 0:  # no prefix: written as before prefixes existed
        del value["prefix_id"]
    return value


def insert_prefix(arrays: dict[str, np.ndarray], prefix_id: int) -> dict[str, np.ndarray]:
    """Put ``prefix_id`` after each row's first token (mask 1, token type 0)."""
    fill = {"input_ids": prefix_id, "attention_mask": 1}
    return {
        name: np.insert(array, 1, fill.get(name, 0), axis=1) for name, array in arrays.items()
    }


@dataclass(frozen=True)
class MultiVectorRequest:
    """One valid request: its texts, prompt applied, and its task."""

    texts: list[str]
    task: str


@dataclass(frozen=True)
class TaskTokens:
    """Tokenized rows of one task: graph inputs, the scored positions, each row's fed width."""

    arrays: dict[str, np.ndarray]
    scored: np.ndarray
    widths: np.ndarray


def expand_and_score(
    arrays: dict[str, np.ndarray], task: TaskParams, skip_scoring: bool
) -> TaskTokens:
    """Apply query expansion and the skiplist to one task's right-padded token arrays.

    Rows shorter than ``task.expansion_length`` get the expansion token up to that
    length (attention 1 only with ``expansion_attend``), and those positions are scored
    with the real tokens, as ``Transformer.preprocess`` and ``MultiVectorMask`` do.
    """
    mask = arrays["attention_mask"]
    lengths = mask.sum(axis=1)
    floor = task.expansion_length
    if floor and mask.shape[1] < floor:
        extra = floor - mask.shape[1]
        arrays = {n: np.pad(a, ((0, 0), (0, extra))) for n, a in arrays.items()}
        mask = arrays["attention_mask"]
    arrays = dict(arrays)
    scored = mask.astype(bool)
    widths = lengths.astype(np.int64)
    if floor:
        expansion = (mask == 0) & (np.arange(mask.shape[1]) < floor)
        arrays["input_ids"] = np.where(expansion, task.expansion_id, arrays["input_ids"])
        if task.expansion_attend:
            arrays["attention_mask"] = np.where(expansion, 1, mask)
        scored = scored | expansion
        widths = np.maximum(widths, floor)
    if skip_scoring and task.skip_ids:
        scored = scored & ~np.isin(arrays["input_ids"], task.skip_ids)
    return TaskTokens(arrays, scored, widths)


def pad_rows(rows: Sequence[np.ndarray], dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-row ``[t_i, D]`` vectors as ``EMBEDDINGS`` and ``TOKEN_COUNT``.

    ``EMBEDDINGS`` is ``[N, max t_i, D]``, zeros after each row's own vectors;
    ``TOKEN_COUNT`` is ``[N, 1]`` int32, each row's ``t_i``.
    """
    width = max([1, *(len(r) for r in rows)])
    out = np.zeros((len(rows), width, dim), dtype=np.float32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    counts = np.asarray([len(r) for r in rows], dtype=np.int32).reshape(-1, 1)
    return out, counts


def unpad(embeddings: np.ndarray, counts: np.ndarray) -> list[np.ndarray]:
    """The per-row vectors of :func:`pad_rows`'s output (clients, tests)."""
    return [embeddings[i, : int(n)] for i, n in enumerate(np.asarray(counts).reshape(-1))]


class MultiVectorTextEncoder:
    """``TEXT`` -> per-token vectors: the tokenizers of both tasks and an ORT encoder.

    ``encoder`` is an :class:`~embed_runtime.engines.ort_encoder.OrtEncoder` (its
    ``run_chunks`` runs the graph), built once per instance by the caller. An engine
    (``embed_runtime.engines.contract.Engine``).
    """

    input_names = (TEXT_INPUT,)
    output_names = (EMBEDDINGS, TOKEN_COUNT)

    def __init__(
        self,
        tokenizer_path: str,
        tok_params: TokenizerParams,
        params: MultiVectorParams,
        encoder,
    ):
        self.params = params
        self.tok_params = tok_params
        self.encoder = encoder
        self.tokenizers = {
            name: BatchTokenizer(
                tokenizer_path, _task_tokenizer(tok_params, params.task(name).text_length)
            )
            for name in TASKS
        }
        self.skip_tasks = frozenset(
            name for name in TASKS if params.task(name).skip_ids
        )

    def read(
        self, inputs: Mapping[str, np.ndarray] | np.ndarray, parameters: Mapping[str, Any]
    ) -> MultiVectorRequest:
        """Validate one request's ``TEXT`` and parameters; raises ``InvalidInputError``."""
        tok = self.tok_params
        texts = decode_texts(text_rows(inputs), "TEXT", tok.max_text_bytes, tok.max_request_bytes)
        refuse_chunk_options(parameters, "")  # not built for token vectors
        task = resolve_task(parameters)
        resolve_dimensions(parameters, 0)  # no Matryoshka truncation of token vectors
        prompts = dict(self.params.prompts)
        default = task if task in prompts else self.params.default_prompt_name
        texts = apply_prompt(resolve_prompt(parameters, prompts, default), texts)
        self.tokenizers[task].refuse_overlong(texts, parameters)
        if keeps_end(parameters):  # a query's expansion fills its end: not reproduced
            raise InvalidInputError(
                "truncation_direction=left is not available for multi-vector models"
            )
        return MultiVectorRequest(texts, task)

    def tokenize(self, texts: Sequence[str], task: str) -> TaskTokens:
        """Tokenize ``texts`` as ``task``: expansion, skiplist, fed widths."""
        arrays = self.tokenizers[task].encode(list(texts))
        params = self.params.task(task)
        if params.prefix_id >= 0:
            arrays = insert_prefix(arrays, params.prefix_id)
        return expand_and_score(arrays, params, task in self.skip_tasks)

    def embed(self, requests: Sequence[MultiVectorRequest]) -> list[tuple[np.ndarray, np.ndarray]]:
        """One ``(EMBEDDINGS, TOKEN_COUNT)`` pair per request; all rows in one sorted run."""
        order, parts = [], []
        for task in TASKS:
            rows = [(i, t) for i, r in enumerate(requests) if r.task == task for t in r.texts]
            if rows:
                order.extend(i for i, _ in rows)
                parts.append(self.tokenize([t for _, t in rows], task))
        merged, scored, widths = _merge(parts, self.tok_params.pad_id)
        vectors: list[np.ndarray | None] = [None] * len(widths)
        for chunk, out in self.encoder.run_chunks(merged, widths):
            _take_scored(chunk, out, scored, vectors)
        by_request: list[list[np.ndarray]] = [[] for _ in requests]
        for request, row in zip(order, vectors, strict=True):
            by_request[request].append(row)
        dim = next(v.shape[1] for v in vectors)
        return [pad_rows(rows, dim) for rows in by_request]


def _task_tokenizer(params: TokenizerParams, max_length: int) -> TokenizerParams:
    return TokenizerParams(
        max_length=max_length,
        pad_to_max_length=False,
        output_names=params.output_names,
        pad_id=params.pad_id,
        lowercase=params.lowercase,
        max_text_bytes=params.max_text_bytes,
        max_request_bytes=params.max_request_bytes,
    )


def _merge(
    parts: Sequence[TaskTokens], pad_id: int
) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Stack the tasks' rows (each task its own width) into one right-padded batch."""
    width = max(p.scored.shape[1] for p in parts)
    rows = sum(len(p.widths) for p in parts)
    merged = {
        name: np.full((rows, width), pad_id if name == "input_ids" else 0, dtype=np.int64)
        for name in parts[0].arrays
    }
    scored = np.zeros((rows, width), dtype=bool)
    start = 0
    for part in parts:
        n, w = part.scored.shape
        for name, array in part.arrays.items():
            merged[name][start : start + n, :w] = array
        scored[start : start + n, :w] = part.scored
        start += n
    widths = np.concatenate([p.widths for p in parts])
    return merged, scored, widths


def _take_scored(
    chunk: Chunk, out: np.ndarray, scored: np.ndarray, vectors: list
) -> None:
    """Each row's scored vectors from one chunk's ``[rows, width, D]`` output."""
    for j, row in enumerate(chunk.rows):
        keep = scored[row, : chunk.width]
        vectors[row] = np.ascontiguousarray(out[j][keep], dtype=np.float32)
