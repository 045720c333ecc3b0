"""Batched tokenization of the ``TEXT`` rows of many requests in one call."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..config_params import ConfigParams, json_text, param
from ..errors import InvalidInputError
from .chunking import flag_parameter, refuse_chunk_options
from .clip_clean import TextClean
from .request_options import apply_prompt, parse_prompts, resolve_dimensions, resolve_prompt


@dataclass(frozen=True)
class TokenizerParams(ConfigParams):
    """How ``tokenizer.json`` is applied at serve time (the tokenizer's config parameters).

    ``max_length`` 0 sets no truncation: the file's own, if it has one, applies (as a
    sentence-transformers ``StaticEmbedding`` keeps it); the byte caps then bound a row.
    ``add_special_tokens`` false leaves out the post-processor's ``[CLS]`` / ``[SEP]``.
    ``float32_only``: the encoder after this tokenizer step answers ``EMBEDDING`` alone
    (Triton's native backend), so the step refuses a request ``precision`` other than
    float32 itself. ``text_clean``: open_clip's clean run on each text before the
    tokenizer (``_clean_lower``, ``_clean_whitespace``, ``_clean_canonicalize``; empty:
    none), with the refusals ``piece_start_tokens`` and ``refused_code_points`` of
    :class:`~.clip_clean.TextClean`. The build writes them with :meth:`to_parameters`, the
    stub reads them back with :meth:`from_parameters`.
    """

    params_name: ClassVar[str] = "tokenizer"

    max_length: int
    pad_to_max_length: bool
    output_names: tuple[str, ...]
    pad_id: int = param(0, always=True)
    lowercase: bool = param(False, always=True)
    max_text_bytes: int = param(16384, required=True)
    max_request_bytes: int = param(262144, key="max_request_text_bytes", required=True)
    prompts: tuple[tuple[str, str], ...] = param(
        (), encode=json_text, decode=lambda text: tuple(parse_prompts(text).items())
    )
    default_prompt_name: str = ""
    max_dimensions: int = 0
    add_special_tokens: bool = True
    float32_only: bool = False
    text_clean: str = ""
    piece_start_tokens: tuple[str, ...] = ()
    refused_code_points: tuple[str, ...] = ()
    # Where this model's long texts are cut into chunks (``<name>_chunks``); empty where
    # its kind cannot be. Chunk options sent here are refused naming it.
    chunks_model: str = ""


def prompted_texts(texts: list[str], parameters: dict, params: TokenizerParams) -> list[str]:
    """``texts`` with the request's prompt prepended; also checks its ``dimensions``.

    The byte caps apply to the user's texts before this; the prompt counts against
    ``max_length`` like any other text, as in sentence-transformers. Chunk options
    (``chunk_tokens``, ...) are refused: they belong to ``<name>_chunks``.
    """
    refuse_chunk_options(parameters, params.chunks_model)
    resolve_dimensions(parameters, params.max_dimensions)
    prompt = resolve_prompt(parameters, dict(params.prompts), params.default_prompt_name)
    return apply_prompt(prompt, texts)


def decode_texts(
    rows: np.ndarray, name: str = "TEXT", max_row_bytes: int = 0, max_total_bytes: int = 0
) -> list[str]:
    """UTF-8 decode one request's ``TEXT`` tensor ([N, 1] or [N] of bytes).

    Raises :class:`InvalidInputError` for zero rows, a row over ``max_row_bytes`` or rows
    over ``max_total_bytes`` together (0: no cap; checked on the raw bytes before any
    decoding, so an oversized request costs nothing), non-UTF-8 bytes and rows that are
    empty or only whitespace (an embedding of nothing is almost always a client bug).
    """
    flat = rows.reshape(-1)
    if flat.size == 0:
        raise InvalidInputError(f"{name} has zero rows")
    if max_row_bytes or max_total_bytes:
        sizes = [len(item) if isinstance(item, bytes) else len(str(item)) for item in flat]
        for i, size in enumerate(sizes):
            if max_row_bytes and size > max_row_bytes:
                raise InvalidInputError(
                    f"{name} row {i} is {size} bytes, over this model's max_text_bytes="
                    f"{max_row_bytes}"
                )
        if max_total_bytes and sum(sizes) > max_total_bytes:
            raise InvalidInputError(
                f"{name} rows total {sum(sizes)} bytes, over this model's "
                f"max_request_text_bytes={max_total_bytes}"
            )
    texts = []
    for i, item in enumerate(flat):
        if isinstance(item, bytes):
            try:
                text = item.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InvalidInputError(
                    f"{name} row {i} is not valid UTF-8 ({exc.reason})"
                ) from None
        else:
            text = str(item)
        if not text.strip():
            raise InvalidInputError(f"{name} row {i} is empty or whitespace only")
        texts.append(text)
    return texts


class BatchTokenizer:
    """A ``tokenizers.Tokenizer`` set up once for truncation and padding.

    ``clean`` (a :class:`~.clip_clean.TextClean`) is for a step to run over a request's
    texts while it reads them (a refused text fails its request alone); :meth:`encode`
    takes texts already cleaned.
    """

    def __init__(self, tokenizer_path: str, params: TokenizerParams):
        from tokenizers import Tokenizer  # noqa: PLC0415 - serve-time dependency

        self.params = params
        self.clean = TextClean(
            params.text_clean, params.piece_start_tokens, params.refused_code_points
        )
        self.tokenizer = Tokenizer.from_file(tokenizer_path)
        self._counting = None  # the same tokenizer without truncation, made on first use
        self._left = None  # the same tokenizer cutting on the left, made on first use
        if params.max_length:
            self.tokenizer.enable_truncation(max_length=params.max_length)
        elif params.pad_to_max_length:
            raise ValueError("pad_to_max_length needs a max_length")
        pad_kwargs = {"pad_id": params.pad_id}
        if params.pad_to_max_length:
            pad_kwargs["length"] = params.max_length
        self.tokenizer.enable_padding(**pad_kwargs)

    def encode(
        self, texts: Sequence[str], keep_end: Sequence[bool] | None = None
    ) -> dict[str, np.ndarray]:
        """Tokenize all texts in one call; arrays are [len(texts), longest] int64.

        ``keep_end[i]`` true cuts an over-long row ``i`` from the left (the request
        parameter ``truncation_direction=left``), keeping its special tokens, as the
        library's tokenizer does with ``truncation_side="left"``.

        Raises :class:`InvalidInputError` for a text that yields no token at all (only
        possible without special tokens: every character dropped by the normaliser,
        e.g. a NUL character or a lone combining accent), naming its row in ``texts``.
        """
        if self.params.lowercase:
            texts = [t.lower() for t in texts]
        special = self.params.add_special_tokens
        if keep_end is not None and any(keep_end):
            encodings = self._encode_both_ways(list(texts), keep_end, special)
        else:
            encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=special)
        if not special:
            empty = [i for i, e in enumerate(encodings) if not any(e.attention_mask)]
            if empty:
                raise InvalidInputError(
                    f"TEXT row {empty[0]} has no tokens (the tokenizer drops all of its "
                    "characters); its embedding would be all zeros"
                )
        return encodings_to_arrays(encodings, self.params.output_names)

    def _encode_both_ways(self, texts: list[str], keep_end: Sequence[bool], special: bool) -> list:
        """Rows cut on the right or the left as ``keep_end`` says, padded to one width."""
        if self._left is None:
            self._left = cutting_left(self.tokenizer)
        encodings: list = [None] * len(texts)
        for tokenizer, end in ((self.tokenizer, False), (self._left, True)):
            rows = [i for i, k in enumerate(keep_end) if bool(k) == end]
            if rows:
                batch = [texts[i] for i in rows]
                done = tokenizer.encode_batch(batch, add_special_tokens=special)
                for i, encoding in zip(rows, done, strict=True):
                    encodings[i] = encoding
        width = max(len(e.ids) for e in encodings)
        for encoding in encodings:  # each half was padded to its own longest row
            encoding.pad(width, pad_id=self.params.pad_id)
        return encodings

    def token_counts(self, texts: Sequence[str]) -> list[int]:
        """Tokens of each text before truncation, special tokens included."""
        if self._counting is None:
            self._counting = untruncated(self.tokenizer)
        if self.params.lowercase:
            texts = [t.lower() for t in texts]
        special = self.params.add_special_tokens
        encodings = self._counting.encode_batch(list(texts), add_special_tokens=special)
        return [len(e.ids) for e in encodings]

    def refuse_overlong(self, texts: Sequence[str], parameters: Mapping[str, Any]) -> None:
        """With the request parameter ``truncate`` false, a text over the limit is refused.

        Raises :class:`InvalidInputError` naming the first such row, its token count and
        the limit; with ``truncate`` true or absent the texts are cut as
        sentence-transformers cuts them.
        """
        if truncation_allowed(parameters):
            return
        # Ours, else the tokenizer file's own (static models); none: the byte caps alone.
        limit = self.params.max_length or (self.tokenizer.truncation or {}).get("max_length", 0)
        if not limit:
            return
        for row, count in enumerate(self.token_counts(texts)):
            if count > limit:
                raise InvalidInputError(
                    f"TEXT row {row} has {count} tokens, over the model's limit of {limit} "
                    "(truncate=false; a prompt and special tokens count)"
                )


def untruncated(tokenizer):
    """A copy of ``tokenizer`` without truncation or padding."""
    from tokenizers import Tokenizer  # noqa: PLC0415 - serve-time dependency

    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.no_truncation()
    copy.no_padding()
    return copy


def cutting_left(tokenizer):
    """A copy of ``tokenizer`` whose truncation (if any) keeps a row's end."""
    from tokenizers import Tokenizer  # noqa: PLC0415 - serve-time dependency

    copy = Tokenizer.from_str(tokenizer.to_str())
    truncation = tokenizer.truncation
    if truncation:
        copy.enable_truncation(
            max_length=truncation["max_length"],
            stride=truncation["stride"],
            strategy=truncation["strategy"],
            direction="left",
        )
    return copy


DIRECTIONS = ("right", "left")


def keeps_end(parameters: Mapping[str, Any]) -> bool:
    """The request parameter ``truncation_direction``: ``right`` (default) or ``left``.

    ``left`` cuts an over-long text at its start, so its end is kept; the case of the
    value is ignored (``Left`` as other servers spell it). Anything else is refused.
    """
    value = parameters.get("truncation_direction", "right")
    if not isinstance(value, str) or value.lower() not in DIRECTIONS:
        raise InvalidInputError(
            f"parameter truncation_direction must be 'right' or 'left', got {value!r}"
        )
    return value.lower() == "left"


def truncation_allowed(parameters: Mapping[str, Any]) -> bool:
    """The request parameter ``truncate`` (default true); anything but a bool is refused."""
    return flag_parameter(parameters, "truncate", True)


_FIELDS = {
    "input_ids": lambda e: e.ids,
    "attention_mask": lambda e: e.attention_mask,
    "token_type_ids": lambda e: e.type_ids,
}


def encodings_to_arrays(encodings: Sequence, names: Sequence[str]) -> dict[str, np.ndarray]:
    """``tokenizers`` encodings (padded to one width) as ``{name: [rows, width] int64}``."""
    return {
        name: np.asarray([_FIELDS[name](e) for e in encodings], dtype=np.int64) for name in names
    }


def split_rows(arrays: dict[str, np.ndarray], counts: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """Slice a batch back into per-request arrays, trimming padding each request lacks.

    Each request's arrays are cut to the longest true length among its own rows, so a
    short request is not padded to the longest row of the whole batch.
    """
    mask = arrays.get("attention_mask")
    out = []
    start = 0
    for count in counts:
        rows = slice(start, start + count)
        width = None
        if mask is not None and count:
            width = max(int(mask[rows].sum(axis=1).max()), 1)
        out.append({k: v[rows, :width] if width else v[rows] for k, v in arrays.items()})
        start += count
    return out
