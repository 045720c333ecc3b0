"""Inference-free sparse encoders: queries by static token weights, documents by SPLADE.

A sentence-transformers ``SparseEncoder`` whose ``Router`` sends queries to a
``SparseStaticEmbedding`` (each token of the query, counted once, weighs a fixed amount,
e.g. its IDF) and documents to an MLM transformer with ``SpladePooling``. The request
parameter ``task`` picks the route as ``encode_query`` / ``encode_document`` do
(``document`` by default, the Router's default route). Query rows need no graph at all:
the tokens present in a row select their weights. Document rows go through the SPLADE
graph like any sparse encoder's. Either way each request answers the active dimensions of
its rows (``embed_runtime.engines.sparse``), at most ``max_active_dims`` per row.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from ..config_params import ConfigParams, param
from ..text.request_options import resolve_dimensions, resolve_task
from ..text.tokenizer import (
    BatchTokenizer,
    TokenizerParams,
    decode_texts,
    keeps_end,
    prompted_texts,
)
from .contract import TEXT_INPUT, text_rows
from .sparse import INDICES, VALUES, request_max_active_dims, sparse_rows
from .text_encoder import TextEncoder, TextRequest

QUERY = "query"
# The query route's files, by their name in the model folder.
QUERY_TOKENIZER_FILE = "query_tokenizer.json"
QUERY_WEIGHTS_FILE = "query_weights.npy"


@dataclass(frozen=True)
class QueryRouteParams(ConfigParams):
    """The query route's config parameters, beside the document route's.

    Its tokenizer and static weights (files of the model folder), the tokenizer's
    truncation length (its ``model_max_length``), pad id and lowercasing.
    """

    params_name: ClassVar[str] = "query route"

    tokenizer_file: str = param(QUERY_TOKENIZER_FILE, key="query_tokenizer_file", required=True)
    weights_file: str = param(QUERY_WEIGHTS_FILE, key="query_weights_file", always=True)
    max_length: int = param(0, key="query_max_length", required=True)
    pad_id: int = param(0, key="query_pad_id", always=True)
    lowercase: bool = param(False, key="query_lowercase", always=True)


def query_tokenizer(parameters: Mapping[str, str], model_dir: str) -> BatchTokenizer:
    """The query route's tokenizer: its own file and length, no special tokens, no prompts.

    ``SparseStaticEmbedding`` tokenizes without special tokens and cuts at its tokenizer's
    ``model_max_length`` (:class:`QueryRouteParams`); the byte caps are the document route's.
    """
    route = QueryRouteParams.from_parameters(parameters)
    params = replace(
        TokenizerParams.from_parameters(dict(parameters)),
        max_length=route.max_length,
        pad_id=route.pad_id,
        lowercase=route.lowercase,
        output_names=("input_ids", "attention_mask"),
        add_special_tokens=False,
        max_dimensions=0,
    )
    return BatchTokenizer(os.path.join(model_dir, route.tokenizer_file), params)


@dataclass(frozen=True)
class RoutedRequest:
    """One valid request: its route, its texts and its cap on active dimensions."""

    task: str
    text: TextRequest
    max_active_dims: int


def static_rows(
    input_ids: np.ndarray, attention_mask: np.ndarray, weights: np.ndarray
) -> np.ndarray:
    """``[rows, V]``: each row's weight at every token it holds (once), zero elsewhere.

    As ``SparseStaticEmbedding.forward``: presence of each unmasked token (a token twice
    counts once) times the static weight of that token.
    """
    rows = np.zeros((len(input_ids), weights.shape[0]), dtype=np.float32)
    for row, (ids, mask) in enumerate(zip(input_ids, attention_mask, strict=True)):
        present = ids[mask.astype(bool)]
        rows[row, present] = weights[present]
    return rows


class SparseRouter:
    """The query route (a tokenizer and static weights) beside the document route.

    An engine (``embed_runtime.engines.contract.Engine``): ``TEXT`` in, ``SPARSE_*`` out.
    """

    input_names = (TEXT_INPUT,)
    output_names = (INDICES, VALUES)

    def __init__(
        self,
        document: TextEncoder,
        query: BatchTokenizer,
        weights: np.ndarray,
        max_active_dims: int = 0,
    ):
        self.document = document
        self.query = query
        self.weights = np.asarray(weights, dtype=np.float32)
        self.max_active_dims = max_active_dims

    def read(
        self, inputs: Mapping[str, np.ndarray] | np.ndarray, parameters: Mapping[str, Any]
    ) -> RoutedRequest:
        """Validate one request's ``TEXT`` and options; raises ``InvalidInputError``."""
        rows = text_rows(inputs)
        task = resolve_task(parameters)
        k = request_max_active_dims(parameters, self.max_active_dims)
        if task != QUERY:
            return RoutedRequest(task, self.document.read(rows, parameters), k)
        tok = self.query.params
        texts = decode_texts(rows, "TEXT", tok.max_text_bytes, tok.max_request_bytes)
        texts = prompted_texts(texts, dict(parameters), tok)
        resolve_dimensions(parameters, 0)  # no width to cut: any dimensions is refused
        self.query.refuse_overlong(texts, parameters)
        return RoutedRequest(task, TextRequest(texts, 0, keeps_end(parameters)), k)

    def embed(self, requests: Sequence[RoutedRequest]) -> list[tuple[np.ndarray, np.ndarray]]:
        """``(SPARSE_INDICES, SPARSE_VALUES)`` per request; each route in one batched pass."""
        dense: list[np.ndarray | None] = [None] * len(requests)
        documents = [i for i, r in enumerate(requests) if r.task != QUERY]
        if documents:
            done = self.document.embed([requests[i].text for i in documents])
            for i, answer in zip(documents, done, strict=True):
                dense[i] = answer[0]
        queries = [i for i, r in enumerate(requests) if r.task == QUERY]
        if queries:
            texts = [t for i in queries for t in requests[i].text.texts]
            keep_end = [requests[i].text.keep_end for i in queries for _ in requests[i].text.texts]
            tokens = self.query.encode(texts, keep_end)
            rows = static_rows(tokens["input_ids"], tokens["attention_mask"], self.weights)
            start = 0
            for i in queries:
                count = len(requests[i].text.texts)
                dense[i] = rows[start : start + count]
                start += count
        return [
            sparse_rows(rows, r.max_active_dims) for rows, r in zip(dense, requests, strict=True)
        ]
