"""open_clip's text clean, run in Python before the served tokenizer (``text_clean``).

open_clip cleans every caption before tokenizing it: ``basic_clean`` (``ftfy.fix_text``,
``html.unescape`` twice, ``strip``), then one of ``_clean_whitespace``, ``_clean_lower``
(the CLIP ``SimpleTokenizer``'s default) or ``_clean_canonicalize`` (SigLIP's). The
functions below take the same steps in the same order as open_clip 3.3.0's, under the
same names, with the same ftfy (pinned in the runtime extra), so a served caption is
cleaned exactly as open_clip cleans it, HTML entities of every form and ftfy's mojibake
repairs included (checked against open_clip on the caption corpus and a fuzz).
The tokenize step's ``tokenizer.json`` then does only the tokenizer's own work.

:func:`clean_function` picks one by the name the build writes (the open_clip function's
``__name__``); ``""`` is no clean (sentence-transformers models), and ftfy is then never
imported.
"""

from __future__ import annotations

import html
import string
import unicodedata
from collections.abc import Callable

from ..errors import InvalidInputError

CLEANS = ("_clean_whitespace", "_clean_lower", "_clean_canonicalize")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def basic_clean(text: str) -> str:
    """``ftfy.fix_text``, ``html.unescape`` twice, ``strip``: open_clip's ``basic_clean``.

    Printable ASCII without ``&`` skips ftfy and ``html.unescape``, which leave it as it
    is (every ftfy 6.3 fix needs a non-ASCII or control character, or ``&``; ASCII text
    is never mojibake to it): most captions, at a fraction of ftfy's cost.
    """
    if text.isascii() and text.isprintable() and "&" not in text:
        return text.strip()
    import ftfy  # noqa: PLC0415 - serve-time dependency of CLIP text only

    text = ftfy.fix_text(text)
    text = html.unescape(html.unescape(text))
    return text.strip()


def whitespace_clean(text: str) -> str:
    """Runs of Python whitespace to one space, ends stripped."""
    text = " ".join(text.split())
    return text.strip()


def canonicalize_text(text: str) -> str:
    """open_clip's ``canonicalize_text`` with its default arguments.

    ``_`` to a space, ASCII punctuation removed, lower case, whitespace collapsed.
    """
    text = text.replace("_", " ")
    text = text.translate(_PUNCTUATION)
    text = text.lower()
    text = " ".join(text.split())
    return text.strip()


def _clean_canonicalize(x: str) -> str:
    return canonicalize_text(basic_clean(x))


def _clean_lower(x: str) -> str:
    return whitespace_clean(basic_clean(x)).lower()


def _clean_whitespace(x: str) -> str:
    return whitespace_clean(basic_clean(x))


_FUNCTIONS = {
    "_clean_whitespace": _clean_whitespace,
    "_clean_lower": _clean_lower,
    "_clean_canonicalize": _clean_canonicalize,
}


def clean_function(name: str) -> Callable[[str], str] | None:
    """The clean named ``name`` (one of :data:`CLEANS`), or None for ``""``.

    Raises ValueError for another name, so a config the runtime cannot honour fails the
    model's load instead of serving uncleaned text.
    """
    if not name:
        return None
    if name not in _FUNCTIONS:
        raise ValueError(f"text_clean {name!r} is not one of {', '.join(CLEANS)}")
    import ftfy  # noqa: F401, PLC0415 - a missing ftfy fails the load, not the first request

    return _FUNCTIONS[name]


class TextClean:
    """The clean of a tokenize step, and the refusals of what its tokenizer cannot match.

    ``name``: :func:`clean_function`'s. ``piece_start_tokens``: added tokens the reference
    reads as themselves only where its split starts a new piece (open_clip's
    ``SimpleTokenizer``: ``<start_of_text>`` typed right after punctuation joins that
    punctuation's piece; a served tokenizer always splits it out). ``refused_code_points``:
    hex code points or ranges (``"558"``, ``"58b-58c"``) the reference's split classes
    otherwise than the served one (letters of Unicode versions newer than the served
    tokenizer's tables). A text refused names its row and why; the other rows of its
    request are not served either, as for any bad row.
    """

    def __init__(
        self,
        name: str,
        piece_start_tokens: tuple[str, ...] = (),
        refused_code_points: tuple[str, ...] = (),
    ):
        self.function = clean_function(name)
        self.piece_start_tokens = piece_start_tokens
        self.refused = frozenset(_code_points(refused_code_points))

    def __call__(self, texts: list[str]) -> list[str]:
        """``texts`` cleaned; raises :class:`InvalidInputError` for one that cannot be matched."""
        if self.function is None:
            return texts
        cleaned = [self.function(text) for text in texts]
        for row, text in enumerate(cleaned):
            self._check(row, text)
        return cleaned

    def served(self, text: str) -> str | None:
        """``text`` cleaned, or None where :meth:`__call__` refuses it."""
        try:
            return self([text])[0]
        except InvalidInputError:
            return None

    def _check(self, row: int, text: str) -> None:
        if self.refused and not text.isascii():
            for char in text:
                if ord(char) in self.refused:
                    raise InvalidInputError(
                        f"TEXT row {row} holds U+{ord(char):04X}, a character of a Unicode "
                        "version newer than this server's tokenizer tables: the model's "
                        "tokenizer splits it otherwise, so it is refused"
                    )
        whole_until = 0  # where the last token read whole ends: a new piece starts there
        for start, token in _occurrences(text, self.piece_start_tokens):
            before = text[start - 1] if start else " "
            if (
                start != whole_until
                and before != " "
                and unicodedata.category(before)[0] not in "LN"
            ):
                raise InvalidInputError(
                    f"TEXT row {row} holds {token!r} right after {before!r}: the model's "
                    "tokenizer reads it as plain characters there, the served one as its "
                    "special token, so it is refused"
                )
            whole_until = start + len(token)


def _occurrences(text: str, tokens: tuple[str, ...]) -> list[tuple[int, str]]:
    """``(start, token)`` of every occurrence of ``tokens`` in ``text``, in text order."""
    found = []
    for token in tokens:
        start = text.find(token)
        while start >= 0:
            found.append((start, token))
            start = text.find(token, start + len(token))
    return sorted(found)


def _code_points(ranges: tuple[str, ...]):
    """The code points of hex ranges (``"558"``, ``"58b-58c"``)."""
    for item in ranges:
        first, _, last = item.partition("-")
        yield from range(int(first, 16), int(last or first, 16) + 1)
