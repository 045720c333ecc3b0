"""Batched tokenization of (``QUERY``, ``TEXT``) pairs for cross-encoder rerankers.

One pair per row: row ``i`` of a request's ``QUERY`` and ``TEXT`` tensors is pair ``i``.
Pairs are tokenized together as ``[CLS] query [SEP] text [SEP]`` and truncated as
sentence-transformers' ``CrossEncoder`` does (``longest_first`` to ``max_length``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import InvalidInputError
from .pair_template import PairTemplate, TemplatePairTokenizer
from .tokenizer import (
    TokenizerParams,
    decode_texts,
    encodings_to_arrays,
    keeps_end,
    truncation_allowed,
    untruncated,
)


def decode_pairs(
    queries: np.ndarray, texts: np.ndarray, params: TokenizerParams
) -> list[tuple[str, str]]:
    """UTF-8 decode one request's ``QUERY`` and ``TEXT`` rows into pairs.

    Both tensors must hold the same number of rows; each row is checked as ``TEXT`` rows
    are (non-empty, valid UTF-8, at most ``max_text_bytes``), and both together stay
    within ``max_request_text_bytes`` (checked first, on the raw bytes). Raises
    :class:`InvalidInputError`.
    """
    n_queries, n_texts = queries.reshape(-1).size, texts.reshape(-1).size
    if n_queries != n_texts:
        raise InvalidInputError(
            f"QUERY has {n_queries} rows and TEXT {n_texts}: send one QUERY row per TEXT row"
        )
    total = params.max_request_bytes
    if total:
        used = sum(_size(item) for rows in (queries, texts) for item in rows.reshape(-1))
        if used > total:
            raise InvalidInputError(
                f"QUERY and TEXT rows total {used} bytes, over this model's "
                f"max_request_text_bytes={total}"
            )
    left = decode_texts(queries, "QUERY", params.max_text_bytes)
    right = decode_texts(texts, "TEXT", params.max_text_bytes)
    return list(zip(left, right, strict=True))


def open_pair_tokenizer(
    tokenizer_path: str, params: TokenizerParams, parameters: Mapping[str, str]
) -> PairTokenizer | TemplatePairTokenizer:
    """The pair tokenizer the config parameters describe.

    With ``pair_template`` (LLM rerankers) pairs are rendered into the model's prompt
    template (:mod:`.pair_template`); without, they are tokenized as two segments.
    """
    if parameters.get("pair_template"):
        template = PairTemplate.from_parameter(parameters["pair_template"])
        return TemplatePairTokenizer(tokenizer_path, params, template)
    return PairTokenizer(tokenizer_path, params)


def _size(item: object) -> int:
    return len(item) if isinstance(item, bytes) else len(str(item).encode("utf-8"))


class PairTokenizer:
    """A ``tokenizers.Tokenizer`` set up once for pair truncation and padding."""

    def __init__(self, tokenizer_path: str, params: TokenizerParams):
        from tokenizers import Tokenizer  # noqa: PLC0415 - serve-time dependency

        self.params = params
        self.tokenizer = Tokenizer.from_file(tokenizer_path)
        self.tokenizer.enable_truncation(max_length=params.max_length, strategy="longest_first")
        pad_kwargs = {"pad_id": params.pad_id}
        if params.pad_to_max_length:
            pad_kwargs["length"] = params.max_length
        self.tokenizer.enable_padding(**pad_kwargs)
        self._counting = None  # the same tokenizer without truncation, made on first use

    def refuse_overlong(
        self, pairs: Sequence[tuple[str, str]], parameters: Mapping[str, Any]
    ) -> None:
        """The request parameters ``truncate`` and ``truncation_direction`` for pairs.

        ``truncate=false`` refuses the first pair over ``max_length`` tokens, naming its
        row, its count and the limit. ``truncation_direction=left`` is refused: a pair is
        cut longest-first, as ``CrossEncoder`` cuts it, and has no one end to keep.
        """
        if keeps_end(parameters):
            raise InvalidInputError(
                "truncation_direction=left is not available for rerankers: a pair is cut "
                "longest-first, as CrossEncoder.predict cuts it"
            )
        if truncation_allowed(parameters):
            return
        if self._counting is None:
            self._counting = untruncated(self.tokenizer)
        if self.params.lowercase:
            pairs = [(q.lower(), t.lower()) for q, t in pairs]
        limit = self.params.max_length
        for row, encoding in enumerate(self._counting.encode_batch(list(pairs))):
            if len(encoding.ids) > limit:
                raise InvalidInputError(
                    f"pair row {row} has {len(encoding.ids)} tokens, over the model's limit "
                    f"of {limit} (truncate=false; the query, the text and special tokens count)"
                )

    def prepare(
        self, pairs: Sequence[tuple[str, str]], parameters: Mapping[str, Any]
    ) -> list[tuple[str, str]]:
        """One request's pairs, checked against its ``truncate`` and ``truncation_direction``."""
        self.refuse_overlong(pairs, parameters)
        return list(pairs)

    def encode(self, pairs: Sequence[tuple[str, str]]) -> dict[str, np.ndarray]:
        """Tokenize all pairs in one call; arrays are [len(pairs), longest] int64."""
        if self.params.lowercase:
            pairs = [(q.lower(), t.lower()) for q, t in pairs]
        return encodings_to_arrays(
            self.tokenizer.encode_batch(list(pairs)), self.params.output_names
        )
