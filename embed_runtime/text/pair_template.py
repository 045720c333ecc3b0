"""(``QUERY``, ``TEXT``) pairs rendered into an LLM reranker's prompt template, tokenized.

A causal-LM reranker (sentence-transformers ``CrossEncoder`` with ``LogitScore``) does not
tokenize a pair as two segments: the library renders the pair with the model's chat
template (query and document as messages with the roles ``query`` and ``document``, the
prompt, if any, as a ``system`` message), tokenizes the rendered string without added
special tokens, cuts it to ``max_length`` from the tokenizer's truncation side, and then
writes the template's tail (the tokens after the document, e.g. the assistant prefill the
model reads its yes/no logits after) back over the last tokens of every row that reached
``max_length``. The build splits the template into the fixed text around the query, the
document and the prompt (checked, on many probes, to place them verbatim), so no Jinja
runs here; this module repeats the rest exactly. Rows are padded on the right.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from ..errors import InvalidInputError
from .request_options import resolve_prompt
from .tokenizer import TokenizerParams, encodings_to_arrays, keeps_end, truncation_allowed

# The fillers sentence-transformers renders a conversation's skeleton with to find the
# template's tail (``Transformer._chat_template_suffix_ids``).
SKELETON_FILLERS = ("0", "1 2 3 4")


@dataclass(frozen=True)
class PairTemplate:
    """The fixed text of a rendered pair; it writes and reads its config parameter.

    ``plain`` (3 parts) renders a pair without a prompt: ``plain[0] + query + plain[1] +
    document + plain[2]``. ``prompted`` (4 parts, empty when the template does not place
    a prompt verbatim) renders one with a prompt: ``prompted[0] + prompt + prompted[1] +
    query + prompted[2] + document + prompted[3]``. ``truncation_side`` is the side the
    tokenizer cuts (``right`` or ``left``); ``restore_tail`` says whether the template's
    tail is written back over rows that reached ``max_length``.
    """

    plain: tuple[str, str, str]
    prompted: tuple[str, ...] = ()
    truncation_side: str = "right"
    restore_tail: bool = True

    def render(self, query: str, document: str, prompt: str = "") -> str:
        """The rendered pair, as the model's chat template renders it."""
        if not prompt:
            a, b, c = self.plain
            return f"{a}{query}{b}{document}{c}"
        if not self.prompted:
            raise InvalidInputError("this reranker's template takes no prompt")
        a, b, c, d = self.prompted
        return f"{a}{prompt}{b}{query}{c}{document}{d}"

    def to_parameter(self) -> str:
        """The config parameter ``pair_template`` (JSON)."""
        return json.dumps(
            {
                "plain": list(self.plain),
                "prompted": list(self.prompted),
                "truncation_side": self.truncation_side,
                "restore_tail": self.restore_tail,
            },
            ensure_ascii=False,
            sort_keys=True,
        )

    @classmethod
    def from_parameter(cls, text: str) -> PairTemplate:
        """Parse :meth:`to_parameter`; fails loudly on a malformed value."""
        raw = json.loads(text)
        plain, prompted = tuple(raw["plain"]), tuple(raw["prompted"])
        if len(plain) != 3 or len(prompted) not in (0, 4):
            raise ValueError("pair_template needs 3 plain parts and 0 or 4 prompted parts")
        if not all(isinstance(p, str) for p in (*plain, *prompted)):
            raise ValueError("pair_template parts must be strings")
        side = raw["truncation_side"]
        if side not in ("right", "left"):
            raise ValueError(f"pair_template truncation_side must be right or left, got {side!r}")
        return cls(plain, prompted, side, bool(raw["restore_tail"]))


@dataclass(frozen=True)
class RenderedPair:
    """One pair rendered for its request's prompt (the tail depends on the prompt)."""

    text: str
    prompt: str


class TemplatePairTokenizer:
    """Renders pairs into the template and tokenizes them as ``CrossEncoder`` does."""

    def __init__(self, tokenizer_path: str, params: TokenizerParams, template: PairTemplate):
        from tokenizers import Tokenizer  # noqa: PLC0415 - serve-time dependency

        self.params = params
        self.template = template
        self.counting = Tokenizer.from_file(tokenizer_path)
        self.counting.no_truncation()
        self.counting.no_padding()
        self.tokenizer = Tokenizer.from_file(tokenizer_path)
        self.tokenizer.enable_truncation(
            max_length=params.max_length, strategy="longest_first",
            direction=template.truncation_side,
        )
        self.tokenizer.enable_padding(pad_id=params.pad_id)
        self._tail = lru_cache(maxsize=256)(self._tail_ids)

    def prepare(
        self, pairs: Sequence[tuple[str, str]], parameters: Mapping[str, Any]
    ) -> list[RenderedPair]:
        """One request's pairs rendered with its prompt; checks ``truncate`` first.

        The prompt is the request's ``prompt_name`` (one of the model's prompts), else
        the model's default prompt, else none, as ``CrossEncoder.predict`` picks it.
        ``truncation_direction=left`` is refused: the rendered pair is cut as the library
        cuts it. ``truncate=false`` refuses the first pair over ``max_length`` tokens.
        """
        if keeps_end(parameters):
            raise InvalidInputError(
                "truncation_direction=left is not available for rerankers: a rendered pair "
                "is cut as CrossEncoder.predict cuts it"
            )
        prompt = resolve_prompt(parameters, dict(self.params.prompts),
                                self.params.default_prompt_name)
        rows = [RenderedPair(self.template.render(q, t, prompt), prompt) for q, t in pairs]
        if not truncation_allowed(parameters):
            limit = self.params.max_length
            counts = self.counting.encode_batch([r.text for r in rows], add_special_tokens=False)
            for row, encoding in enumerate(counts):
                if len(encoding.ids) > limit:
                    raise InvalidInputError(
                        f"pair row {row} has {len(encoding.ids)} tokens, over the model's "
                        f"limit of {limit} (truncate=false; the query, the text and the "
                        "reranker's prompt template count)"
                    )
        return rows

    def encode(self, rows: Sequence[RenderedPair]) -> dict[str, np.ndarray]:
        """Tokenize all rendered pairs in one call; arrays are [len(rows), longest] int64."""
        encodings = self.tokenizer.encode_batch([r.text for r in rows], add_special_tokens=False)
        arrays = encodings_to_arrays(encodings, self.params.output_names)
        if self.template.restore_tail:
            self._restore_tails(arrays, rows)
        return arrays

    def _restore_tails(self, arrays: dict[str, np.ndarray], rows: Sequence[RenderedPair]) -> None:
        """Write the template's tail over the last tokens of rows at ``max_length``."""
        ids = arrays["input_ids"]
        lengths = arrays["attention_mask"].sum(axis=1)
        for i, row in enumerate(rows):
            length = int(lengths[i])
            if length < self.params.max_length:
                continue
            tail = self._tail(row.prompt)
            keep = min(len(tail), length)
            if keep:
                ids[i, length - keep : length] = tail[len(tail) - keep :]

    def _tail_ids(self, prompt: str) -> tuple[int, ...]:
        """The template's tail for ``prompt``: the common token suffix of two skeletons."""
        first, second = (
            self.counting.encode(
                self.template.render(f, f, prompt), add_special_tokens=False
            ).ids
            for f in SKELETON_FILLERS
        )
        count = 0
        for left, right in zip(reversed(first), reversed(second), strict=False):
            if left != right:
                break
            count += 1
        if 0 < count < min(len(first), len(second)):
            return tuple(first[len(first) - count :])
        return ()
