"""Long texts cut into chunks in the served tokenizer's own tokens (``<name>_chunks``).

A row is tokenized once without special tokens; its tokens are grouped into chunks of at
most ``chunk_tokens``, each chunk ending, where it can, at a word boundary (whitespace or
punctuation) within the last tenth of its window. Each chunk is answered as the span
``text[start:end]`` (Python ``str`` indices) and embedded as that string would be by
``SentenceTransformer.encode``: its prompt and special tokens added, so the encoder's
window holds it whole. A span whose own tokenization would be longer than the window it
was cut for (a sub-word piece can tokenize differently on its own) is shortened until
it fits, so the server never cuts a chunk again.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidInputError

# Request parameters of ``<name>_chunks``; on any other model they are refused by name.
CHUNK_TOKENS = "chunk_tokens"
CHUNK_OVERLAP = "chunk_overlap"
LONG_TEXT = "long_text"
LATE_CHUNKING = "late_chunking"
JOIN_ROWS = "join_rows"
CHUNK_PARAMETERS = (CHUNK_TOKENS, CHUNK_OVERLAP, LONG_TEXT, LATE_CHUNKING, JOIN_ROWS)
LONG_TEXT_FORMS = ("chunks", "mean")
# The fewest tokens a chunk may be asked to hold: below it a chunk is mostly its prompt
# and special tokens, and a document turns into thousands of encoder rows.
MIN_CHUNK_TOKENS = 8
# A chunk ends at a word boundary when one lies within this share of its window's end.
BOUNDARY_SHARE = 0.1


@dataclass(frozen=True)
class Chunk:
    """One chunk of input row ``row``: ``text[start:end]``, ``tokens`` tokens of its own."""

    row: int
    start: int
    end: int
    tokens: int


@dataclass(frozen=True)
class ChunkOptions:
    """A request's chunk options, checked: ``chunk_tokens`` 0 means the model's window.

    ``late``: pool each chunk from one transformer pass over its whole text; ``join``:
    the request's rows are consecutive pieces of one document, each row a chunk.
    """

    chunk_tokens: int = 0
    chunk_overlap: int = 0
    mean: bool = False
    late: bool = False
    join: bool = False


def _int_parameter(parameters: Mapping[str, Any], name: str, default: int) -> int:
    value = parameters.get(name, default)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"parameter {name} must be an integer, got {value!r}")
    return value


def flag_parameter(parameters: Mapping[str, Any], name: str, default: bool = False) -> bool:
    """The request parameter ``name``: a bool or ``"true"`` / ``"false"`` (any case)."""
    value = parameters.get(name, default)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if not isinstance(value, bool):
        raise InvalidInputError(f"parameter {name} must be true or false, got {value!r}")
    return value


def chunk_options(parameters: Mapping[str, Any]) -> ChunkOptions:
    """The chunk options of one ``<name>_chunks`` request; bad values raise a 400.

    Refused: ``truncate=false`` (a chunked text is never cut, so the option has nothing to
    refuse), a ``long_text`` other than ``chunks`` (one row per chunk) or ``mean``, and
    ``join_rows`` without ``late_chunking`` (pieces embedded apart need no joining).
    """
    late, join = flag_parameter(parameters, LATE_CHUNKING), flag_parameter(parameters, JOIN_ROWS)
    if join and not late:
        raise InvalidInputError("join_rows applies to late_chunking=true only")
    if "truncate" in parameters and parameters["truncate"] in (False, "false", "False"):
        raise InvalidInputError(
            "truncate=false does not apply to chunks (no chunk is ever cut); leave it out"
        )
    tokens = _int_parameter(parameters, CHUNK_TOKENS, 0)
    overlap = _int_parameter(parameters, CHUNK_OVERLAP, 0)
    if CHUNK_TOKENS in parameters and tokens < MIN_CHUNK_TOKENS:
        raise InvalidInputError(
            f"chunk_tokens must be at least {MIN_CHUNK_TOKENS}, got {tokens}"
        )
    if overlap < 0:
        raise InvalidInputError(f"chunk_overlap must be >= 0, got {overlap}")
    form = parameters.get(LONG_TEXT, "chunks")
    if form not in LONG_TEXT_FORMS:
        raise InvalidInputError(f"long_text must be one of {list(LONG_TEXT_FORMS)}, got {form!r}")
    return ChunkOptions(tokens, overlap, form == "mean", late, join)


def refuse_chunk_options(parameters: Mapping[str, Any], chunks_model: str) -> None:
    """Refuse chunk options sent to a model that does not cut texts into chunks.

    ``chunks_model``: where this model's texts can be chunked (``<name>_chunks``), or
    ``""`` where its kind cannot be (CLIP text, rerankers, sparse, multi-vector).
    """
    sent = [name for name in CHUNK_PARAMETERS if name in parameters]
    if not sent:
        return
    if chunks_model:
        where = f"send the request to {chunks_model}, which cuts long texts into chunks"
    else:
        where = "this model kind does not cut texts into chunks"
    raise InvalidInputError(f"parameter {sent[0]} is not taken by this model: {where}")


def _is_punctuation(char: str) -> bool:
    return unicodedata.category(char).startswith("P")


def _boundary(text: str, offsets: Sequence[tuple[int, int]], k: int) -> bool:
    """Whether a chunk may end before token ``k``: whitespace or punctuation lies there."""
    before_end, start = offsets[k - 1][1], offsets[k][0]
    if start > before_end:
        return True
    return (before_end > 0 and _is_punctuation(text[before_end - 1])) or (
        start < len(text) and _is_punctuation(text[start])
    )


def plan(
    text: str, offsets: Sequence[tuple[int, int]], size: int, overlap: int
) -> list[tuple[int, int]]:
    """Token ranges ``[i, k)`` of the chunks of a row whose tokens have ``offsets``.

    Each holds at most ``size`` tokens and ends at a word boundary when one lies in the
    last :data:`BOUNDARY_SHARE` of its window, else between two characters (a character
    can be several tokens: byte-level pieces); the next starts ``overlap`` tokens back.
    """
    n = len(offsets)
    reach = max(1, int(size * BOUNDARY_SHARE))
    ranges = []
    i = 0
    while i < n:
        k = min(i + size, n)
        if k < n:
            for candidate in range(k, max(i + 1, k - reach), -1):
                if _boundary(text, offsets, candidate):
                    k = candidate
                    break
            else:  # no boundary: still never between the tokens of one character
                while k > i + 1 and offsets[k][0] < offsets[k - 1][1]:
                    k -= 1
        ranges.append((i, k))
        if k >= n:
            break
        i = max(k - overlap, i + 1)
    return ranges


def span(text: str, offsets: Sequence[tuple[int, int]], i: int, k: int) -> tuple[int, int]:
    """The span of tokens ``[i, k)`` of ``text``: the first from its start, the last to its end."""
    start = 0 if i == 0 else offsets[i][0]
    end = len(text) if k == len(offsets) else offsets[k - 1][1]
    return start, end


class Chunker:
    """Cuts texts with a ``tokenizers.Tokenizer`` (no truncation, no padding) of the model.

    ``window``: the encoder's limit in tokens, special tokens and prompt included (0:
    none). ``lowercase``: the model's tokenizer step lowers texts first.
    """

    def __init__(self, tokenizer: Any, window: int, lowercase: bool = False):
        self.tokenizer = tokenizer
        self.window = window
        self.lowercase = lowercase
        self.specials = tokenizer.num_special_tokens_to_add(False)

    def _tokens(self, texts: Sequence[str], special: bool = False) -> list:
        if self.lowercase:
            texts = [t.lower() for t in texts]
        return self.tokenizer.encode_batch(list(texts), add_special_tokens=special)

    def token_counts(self, texts: Sequence[str]) -> list[int]:
        """The tokens of each text, no special tokens."""
        return [len(e.ids) for e in self._tokens(texts)]

    def chunk_size(self, prompt: str, options: ChunkOptions) -> int:
        """The tokens a chunk may hold: ``chunk_tokens``, else the window's room.

        The room is the window less the special tokens and the prompt's tokens. Raises
        :class:`InvalidInputError` when ``chunk_tokens`` asks for more than the room, or
        the overlap is not below it.
        """
        room = 0
        if self.window:
            used = self.specials + (len(self._tokens([prompt])[0].ids) if prompt else 0)
            room = self.window - used
        size = options.chunk_tokens or room
        if not size:
            raise InvalidInputError(
                "this model has no token window; give chunk_tokens explicitly"
            )
        if room and size > room:
            raise InvalidInputError(
                f"chunk_tokens={size} is over the model's window: {self.window} tokens hold "
                f"{room} of a chunk with its special tokens"
                + (" and this request's prompt" if prompt else "")
            )
        if options.chunk_overlap >= size:
            raise InvalidInputError(
                f"chunk_overlap={options.chunk_overlap} must be below chunk_tokens={size}"
            )
        return size

    def chunks(
        self, texts: Sequence[str], size: int, overlap: int, prompt: str = ""
    ) -> list[Chunk]:
        """The chunks of every row of ``texts``, in row order, each fitting the window.

        A row whose lowered form changes length (the model lowercases it, and some
        characters lower into two) cannot map its tokens back and is refused.
        """
        if self.lowercase:
            for row, text in enumerate(texts):
                if len(text.lower()) != len(text):
                    raise InvalidInputError(
                        f"TEXT row {row} changes length when lowercased, so its chunks "
                        "cannot be given as spans of it"
                    )
        planned = []  # (row, text, offsets, i, k)
        for row, (text, encoding) in enumerate(zip(texts, self._tokens(texts), strict=True)):
            offsets = encoding.offsets  # a new list on each access: read once
            if not offsets:
                raise InvalidInputError(f"TEXT row {row} has no tokens")
            for i, k in plan(text, offsets, size, overlap):
                planned.append((row, text, offsets, i, k))
        spans = [span(text, offsets, i, k) for _, text, offsets, i, k in planned]
        pieces = [text[s:e] for (_, text, *_), (s, e) in zip(planned, spans, strict=True)]
        counts = [len(e.ids) for e in self._tokens(pieces)]
        out = []
        for plan_, (start, end), count in zip(planned, spans, counts, strict=True):
            if prompt or not 0 < count <= size:  # rare: re-cut one by one
                out.append(self._fitted(*plan_, size, prompt))
            else:
                out.append(Chunk(plan_[0], start, end, count))
        return out

    def _fitted(self, row, text, offsets, i, k, size, prompt) -> Chunk:
        """The chunk of tokens ``[i, k)``, shortened until its span tokenizes within bounds."""
        while True:
            start, end = span(text, offsets, i, k)
            piece = text[start:end]
            own, whole = self._tokens([piece, prompt + piece])
            fits = 0 < len(own.ids) <= size
            if fits and self.window:
                fits = len(whole.ids) + self.specials <= self.window
            if fits or k - i <= 1:
                return Chunk(row, start, end, len(own.ids))
            k -= 1
