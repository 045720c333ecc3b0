"""open_clip's ``HFTokenizer`` (SigLIP, SigLIP2, XLM-R CLIP, ...) as one ``tokenizer.json``.

``HFTokenizer.__call__`` cleans each text in Python (``clean``: ``'whitespace'``, the
default, ``'lower'`` or ``'canonicalize'``, each built on ftfy + ``html.unescape``), then
runs the Hugging Face fast tokenizer with ``padding='max_length'`` and truncation to
``context_length``. The served file is that fast tokenizer's own pipeline with the clean
replayed in front of its normalizer (:func:`clean_normalizer`, the same replica of ftfy
as the CLIP tokenizer's, with its documented differences), padded with the tokenizer's
``pad_token_id`` and cut on the side the tokenizer cuts.

The Python clean runs before the tokenizer splits out its added (special) tokens;
inside ``tokenizers`` it runs after, on each piece between them. Added tokens that the
clean can never leave in a text (with ``'canonicalize'``: every one containing ASCII
punctuation, as T5's ``</s>`` / ``<pad>`` and Gemma's ``<bos>`` do) are dropped from the
served file's added vocabulary, so such text tokenizes as the reference does (SigLIP,
SigLIP2). Where one can survive (``'whitespace'`` / ``'lower'`` with ``[SEP]``,
``<pad>``) it stays, and the pieces around it are cleaned (stripped) one by one: exact
where the tokenizer's pre-tokenizer drops those spaces anyway (BERT WordPiece, the CLIPA
configs' ``bert-base-uncased``; XLM-R, which transformers 5.23 loads with a
``WhitespaceSplit`` before its ``Metaspace``); where it does not (a bare SentencePiece
``Metaspace``, T5-like), the check below fails and the build refuses the tokenizer, naming
those tokens.

Also refused with a message naming the part: ``tokenizer_mode='clips'``,
``strip_sep_token``, slow (Python) tokenizers, left padding or left truncation. Every
build checks served ids against ``HFTokenizer`` on :data:`CHECK_TEXTS` (and their
upper case) plus each kept added token in context, and refuses a tokenizer that differs
on any of them. The clean replica has the CLIP tokenizer's documented differences
(``assets``), and also misses upper-case entities (``&EURO;``, ``&#X27;``).
"""

from __future__ import annotations

import json
import string
from pathlib import Path

from tokenizers import Tokenizer

from ...declared_kind import UnsupportedModelError
from .assets import VALIDATION_TEXTS
from .clean import basic_clean_steps, lower_steps, whitespace_steps

CLEANS = ("_clean_whitespace", "_clean_lower", "_clean_canonicalize")
CHECK_TEXTS = (
    *VALIDATION_TEXTS,
    "A DIAGRAM, with “quotes” &amp; entities &lt;b&gt;",
    "snake_case_words and kebab-case, (parens) [brackets] {braces}",
    "  many    spaces\tand\nnew lines  ",
    "ΟΔΥΣΣΕΥΣ Straße İstanbul ﬁne ＦＵＬＬＷＩＤＴＨ",
    "caf\u00e9 cafe\u0301 e\u0301",
    "!!!",
    "</s> <pad> <unk> [SEP] [CLS] <s>",
    "word " * 200,
)


def is_hf_tokenizer(tokenizer) -> bool:
    """Whether ``tokenizer`` is open_clip's ``HFTokenizer``."""
    from open_clip.tokenizer import HFTokenizer  # noqa: PLC0415

    return isinstance(tokenizer, HFTokenizer)


def clean_normalizer(clean: str):
    """``normalizers`` replaying one of open_clip's clean functions (its ``__name__``)."""
    from tokenizers import Regex, normalizers  # noqa: PLC0415

    if clean not in CLEANS:
        raise UnsupportedModelError(f"open_clip clean function {clean!r} is not supported")
    steps = basic_clean_steps()
    if clean == "_clean_canonicalize":  # open_clip's canonicalize_text, default arguments
        punctuation = "[" + "".join(f"\\x{{{ord(c):x}}}" for c in string.punctuation) + "]"
        steps += [normalizers.Replace("_", " "), normalizers.Replace(Regex(punctuation), "")]
    steps += whitespace_steps()
    if clean != "_clean_whitespace":
        steps += lower_steps()
    return normalizers.Sequence(steps)


def _survives(content: str, clean: str) -> bool:
    """Whether cleaned text can still contain ``content`` (else the token can never match)."""
    if clean == "_clean_canonicalize" and any(c in string.punctuation for c in content):
        return False
    return content == content.strip() and not any(c.isspace() and c != " " for c in content)


def _refuse_unsupported(tok) -> None:
    hf = tok.tokenizer
    name = getattr(hf, "name_or_path", "?")
    problems = []
    if tok.tokenizer_mode:
        problems.append(f"tokenizer_mode={tok.tokenizer_mode!r}")
    if tok.strip_sep_token:
        problems.append("strip_sep_token=True")
    if not getattr(hf, "is_fast", False):
        problems.append(f"a slow tokenizer ({type(hf).__name__}, no tokenizer.json)")
    if getattr(hf, "padding_side", "right") != "right":
        problems.append(f"padding_side={hf.padding_side!r}")
    if getattr(hf, "truncation_side", "right") != "right":
        problems.append(f"truncation_side={hf.truncation_side!r}")
    if hf.pad_token_id is None:
        problems.append("no pad token")
    clean = getattr(tok.clean_fn, "__name__", "?")
    if clean not in CLEANS:
        problems.append(f"clean function {clean!r}")
    if problems:
        raise UnsupportedModelError(
            f"open_clip HFTokenizer {name!r}: {', '.join(problems)} cannot be served exactly "
            "(supported: a fast tokenizer, right padding and truncation, clean 'whitespace', "
            "'lower' or 'canonicalize', no tokenizer_mode, no strip_sep_token)"
        )


def served_tokenizer(tok, context_length: int):
    """``(tokenizers.Tokenizer, pad id, kept added tokens)`` serving ``tok``, unchecked."""
    from tokenizers import normalizers  # noqa: PLC0415

    _refuse_unsupported(tok)
    hf = tok.tokenizer
    clean = tok.clean_fn.__name__
    data = json.loads(hf.backend_tokenizer.to_str())
    kept = [t["content"] for t in data.get("added_tokens", []) if _survives(t["content"], clean)]
    data["added_tokens"] = [t for t in data.get("added_tokens", []) if t["content"] in kept]
    data["truncation"] = None
    data["padding"] = None
    tokenizer = Tokenizer.from_str(json.dumps(data))
    own = tokenizer.normalizer
    cleaning = clean_normalizer(clean)
    tokenizer.normalizer = normalizers.Sequence([cleaning, own]) if own else cleaning
    pad_id = int(hf.pad_token_id)
    tokenizer.enable_truncation(max_length=context_length)
    tokenizer.enable_padding(length=context_length, pad_id=pad_id, pad_token=str(hf.pad_token))
    return tokenizer, pad_id, kept


def check_served(tok, tokenizer, kept: list[str], context_length: int) -> None:
    """Refuse ``tokenizer`` unless its ids equal ``tok``'s on every check text."""
    texts = [*CHECK_TEXTS, *(t.upper() for t in CHECK_TEXTS)]
    texts += [*(f"a {t} b" for t in kept), *kept]
    want = tok(texts, context_length=context_length).numpy()
    got = [e.ids for e in tokenizer.encode_batch(texts)]
    wrong = [text for text, w, g in zip(texts, want, got, strict=True) if list(w) != g]
    if not wrong:
        return
    name = getattr(tok.tokenizer, "name_or_path", "?")
    typed = sorted({t for t in kept for text in wrong if t in text})
    part = (
        f"its added tokens {typed} typed in a text (open_clip cleans the text before the "
        "tokenizer splits them out; a served tokenizer cannot)"
        if typed
        else f"{len(wrong)} check texts, e.g. {wrong[0][:60]!r}"
    )
    raise UnsupportedModelError(
        f"open_clip HFTokenizer {name!r}: the served tokenizer gives other ids than "
        f"open_clip's on {part}; refused rather than served with another tokenization"
    )


def write_hf_tokenizer_json(tok, path: Path, context_length: int) -> int:
    """Write the served ``tokenizer.json`` of an open_clip ``HFTokenizer``; returns its pad id.

    Raises :class:`UnsupportedModelError` naming what cannot be served exactly, or when
    the written file's ids differ from ``tok``'s on any check text (see the module doc).
    """
    tokenizer, pad_id, kept = served_tokenizer(tok, context_length)
    check_served(tok, tokenizer, kept, context_length)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(tokenizer.to_str(pretty=True), encoding="utf-8")
    tmp.replace(path)
    return pad_id
