"""Tokenize and encode in one stub: ``TEXT`` rows straight to embeddings (``fused_tokenize``).

The split pipeline crosses two Python models per request (ensemble scheduling, shared
memory both ways, a second stub). With ``fused_tokenize`` the encoder reads ``TEXT``
and does the tokenizer step's work itself, with the same code: byte caps, UTF-8 and
empty-row checks, prompts and ``dimensions`` per request; then one batched tokenizer
call over every valid row of the execution and the usual length-sorted chunked run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..text.request_options import resolve_dimensions, truncate
from ..text.tokenizer import (
    BatchTokenizer,
    TokenizerParams,
    decode_texts,
    keeps_end,
    prompted_texts,
)
from .contract import COUNT_OUTPUT, TEXT_INPUT, text_rows, token_counts
from .ort_encoder import EncoderParams, OrtEncoder
from .ragged import split_counts


@dataclass(frozen=True)
class TextRequest:
    """One valid request: its texts, width and truncation side.

    The texts have their prompt applied; ``dimensions`` 0 means all; ``keep_end`` cuts an
    over-long text on the left (``truncation_direction=left``).
    """

    texts: list[str]
    dimensions: int
    keep_end: bool = False


class TextEncoder:
    """A tokenizer in front of an :class:`OrtEncoder`, both built once per instance.

    An engine (``embed_runtime.engines.contract.Engine``): ``TEXT`` in, each request answered as
    its embeddings and, unless ``counted`` is off, its rows' token counts.
    """

    input_names = (TEXT_INPUT,)

    def __init__(
        self,
        tokenizer: BatchTokenizer,
        encoder: OrtEncoder,
        params: EncoderParams,
        counted: bool = True,
    ):
        self.tokenizer = tokenizer
        self.encoder = encoder
        self.params = params
        self.output_names = (params.output_name, *((COUNT_OUTPUT,) if counted else ()))

    @classmethod
    def from_parameters(
        cls,
        parameters: Mapping[str, str],
        model_dir: str,
        encoder: OrtEncoder,
        counted: bool = True,
    ) -> TextEncoder:
        """Read the tokenizer's config parameters (they sit beside the encoder's)."""
        tok_params = TokenizerParams.from_parameters(dict(parameters))
        path = os.path.join(model_dir, parameters["tokenizer_file"])
        return cls(BatchTokenizer(path, tok_params), encoder, encoder.params, counted)

    def read(
        self, inputs: Mapping[str, np.ndarray] | np.ndarray, parameters: Mapping[str, Any]
    ) -> TextRequest:
        """Validate one request's ``TEXT`` and options; raises ``InvalidInputError``."""
        tok = self.tokenizer.params
        rows = text_rows(inputs)
        texts = decode_texts(rows, "TEXT", tok.max_text_bytes, tok.max_request_bytes)
        texts = self.tokenizer.clean(prompted_texts(texts, dict(parameters), tok))
        self.tokenizer.refuse_overlong(texts, parameters)
        full, default = self.params.max_dimensions, self.params.default_dimensions
        dimensions = resolve_dimensions(parameters, full, default)
        return TextRequest(texts, dimensions, keeps_end(parameters))

    def embed(self, requests: Sequence[TextRequest]) -> list[tuple[np.ndarray, ...]]:
        """Tokenize every row at once, run them sorted by length.

        One ``(embeddings, token counts)`` pair per request (embeddings alone when not
        ``counted``).
        """
        texts = [t for r in requests for t in r.texts]
        keep_end = [r.keep_end for r in requests for _ in r.texts]
        tokens = self.tokenizer.encode(texts, keep_end)
        (merged,) = self.encoder.encode_tokens([tokens])
        rows_per_request = [len(r.texts) for r in requests]
        tokens_per_row = split_counts(token_counts(tokens["attention_mask"]), rows_per_request)
        out = []
        parts = zip(requests, split_counts(merged, rows_per_request), tokens_per_row, strict=True)
        for request, rows, counts in parts:
            if request.dimensions:
                rows = truncate(rows, request.dimensions, self.params.normalize)
            out.append((np.ascontiguousarray(rows), counts)[: len(self.output_names)])
        return out
