"""open_clip's ``HFTokenizer`` (SigLIP, SigLIP2, XLM-R CLIP, ...) as one ``tokenizer.json``.

``HFTokenizer.__call__`` cleans each text in Python (``clean``: ``'whitespace'``, the
default, ``'lower'`` or ``'canonicalize'``, each built on ftfy + ``html.unescape``), then
runs the Hugging Face fast tokenizer with ``padding='max_length'`` and truncation to
``context_length``. The tokenize step does the same: the same clean in Python
(:mod:`embed_runtime.text.clip_clean`, named by the step's ``text_clean`` parameter),
then the fast tokenizer's own pipeline, unchanged, with its added tokens (so they are
split out of the cleaned text, as in open_clip), padded with the tokenizer's
``pad_token_id`` and cut on the side the tokenizer cuts. Nothing is refused at serve time.

``strip_sep_token`` (CLIPA's ``bert-base-uncased``): open_clip replaces every id of the
separator token with 0 after tokenizing. Served in the file (:func:`_strip_sep`): the
post-processor's separator is given id 0; where the clean leaves a typed separator (an
added token), it and the pad token (id 0) are no longer split out as added tokens but
rewritten by the normalizer, after the clean, into a marker word (:data:`SEP_MARKERS`),
and the vocabulary's pad entry is renamed to the marker (one string per id). A marker
typed by the user is doubled first, which WordPiece (no entry starting with it) turns into
``[UNK]``, as open_clip does for any word with a character it does not know. WordPiece
models whose id 0 is the pad token only (BERT); others are refused naming the part.

Also refused with a message naming the part: ``tokenizer_mode='clips'``,
slow (Python) tokenizers, left padding or left truncation. Every build checks the served
ids (the clean, then the file) against ``HFTokenizer`` on :data:`CHECK_TEXTS` (and their
upper case), ``assets.HARD_TEXTS`` (entities of every form, mojibake, bidi) and each
added token in context, and refuses a tokenizer that differs on any of them.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

from tokenizers import Tokenizer

from embed_runtime.text.clip_clean import CLEANS, TextClean
from embed_runtime.text.tokenizer import TokenizerParams

from ...declared_kind import UnsupportedModelError
from .assets import HARD_TEXTS, VALIDATION_TEXTS

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
# Marker words for a typed separator under strip_sep_token: symbols (Unicode 1.1, So) that
# no step of a BERT normalizer or pre-tokenizer removes, splits, lower-cases or decomposes.
SEP_MARKERS = tuple("\u2307\u2324\u2325\u2326\u2327\u2328\u237e\u23bf")


def is_hf_tokenizer(tokenizer) -> bool:
    """Whether ``tokenizer`` is open_clip's ``HFTokenizer``."""
    from open_clip.tokenizer import HFTokenizer  # noqa: PLC0415

    return isinstance(tokenizer, HFTokenizer)


def _survives(content: str, clean: str) -> bool:
    """Whether cleaned text can still contain ``content`` (else the token can never match)."""
    if clean == "_clean_canonicalize" and any(c in string.punctuation for c in content):
        return False
    return content == content.strip() and not any(c.isspace() and c != " " for c in content)


def _marker(vocab: dict[str, int], prefix: str) -> str | None:
    """A marker word for the separator: no vocabulary entry starts with it (``##`` or not)."""
    for marker in SEP_MARKERS:
        if not any(t.startswith((marker, prefix + marker)) for t in vocab):
            return marker
    return None


def _strip_sep(data: dict, hf, kept: list[str], name: str) -> list:
    """Edit ``data`` (a tokenizer.json) so every separator id comes out as 0, as open_clip's.

    Returns the normalizer steps to run after the clean (see the module doc); drops the
    tokens they handle from ``kept``. Raises :class:`UnsupportedModelError` where that
    cannot be done exactly.
    """
    from tokenizers import normalizers  # noqa: PLC0415

    sep, sep_id = str(hf.sep_token), int(hf.sep_token_id)
    post, model = data.get("post_processor") or {}, data["model"]
    vocab = model.get("vocab") or {}
    zero = next((t for t, i in vocab.items() if i == 0), None) if isinstance(vocab, dict) else None
    problems = []
    if model.get("type") != "WordPiece":
        problems.append(f"a {model.get('type')} model (WordPiece only)")
    if post.get("type") != "TemplateProcessing":
        problems.append(f"a {post.get('type')} post-processor (TemplateProcessing only)")
    if zero != str(hf.pad_token):
        problems.append(f"id 0 is {zero!r}, not the pad token")
    marker = _marker(vocab, model.get("continuing_subword_prefix") or "##") if vocab else None
    if marker is None:
        problems.append(f"every marker of {SEP_MARKERS} is in its vocabulary")
    if problems:
        raise UnsupportedModelError(
            f"open_clip HFTokenizer {name!r}: strip_sep_token=True cannot be served exactly "
            f"with {'; '.join(problems)}"
        )
    for special in post["special_tokens"].values():
        special["ids"] = [0 if i == sep_id else i for i in special["ids"]]
    typed = [t for t in (sep, zero) if t in kept]  # tokens the clean leaves in a text
    if sep not in typed:
        return []
    # One vocabulary string per id: the pad token's entry becomes the marker's.
    model["vocab"] = {(marker if t == zero else t): i for t, i in vocab.items()}
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] not in typed]
    for token in typed:
        kept.remove(token)
    return [
        normalizers.Replace(marker, marker * 2),
        *(normalizers.Replace(t, f" {marker} ") for t in typed),
    ]


def _refuse_unsupported(tok) -> None:
    hf = tok.tokenizer
    name = getattr(hf, "name_or_path", "?")
    problems = []
    if tok.tokenizer_mode:
        problems.append(f"tokenizer_mode={tok.tokenizer_mode!r}")
    if tok.strip_sep_token and hf.sep_token_id is None:
        problems.append("strip_sep_token=True without a separator token")
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
            "'lower' or 'canonicalize', no tokenizer_mode)"
        )


def served_tokenizer(tok, context_length: int):
    """``(tokenizers.Tokenizer, TokenizerParams, added tokens)`` serving ``tok``, unchecked."""
    from tokenizers import normalizers  # noqa: PLC0415

    _refuse_unsupported(tok)
    hf = tok.tokenizer
    clean = tok.clean_fn.__name__
    data = json.loads(hf.backend_tokenizer.to_str())
    data["truncation"] = None
    data["padding"] = None
    name = getattr(hf, "name_or_path", "?")
    marking = []
    if tok.strip_sep_token:  # only the separators a cleaned text can hold need the markers
        typed = [t["content"] for t in data["added_tokens"] if _survives(t["content"], clean)]
        marking = _strip_sep(data, hf, typed, name)
    added = [t["content"] for t in data.get("added_tokens", [])]
    tokenizer = Tokenizer.from_str(json.dumps(data))
    own = tokenizer.normalizer
    if marking:
        tokenizer.normalizer = normalizers.Sequence([*marking, *([own] if own else [])])
    pad_id = int(hf.pad_token_id)
    tokenizer.enable_truncation(max_length=context_length)
    tokenizer.enable_padding(length=context_length, pad_id=pad_id, pad_token=str(hf.pad_token))
    params = TokenizerParams(context_length, True, ("input_ids",), pad_id, text_clean=clean)
    return tokenizer, params, added


def check_served(
    tok, tokenizer, params: TokenizerParams, kept: list[str], context_length: int
) -> None:
    """Refuse ``tokenizer`` unless the served ids equal ``tok``'s on every check text.

    The served ids are the serve-time path's: ``params``' clean, then ``tokenizer``.
    """
    texts = [*CHECK_TEXTS, *(t.upper() for t in CHECK_TEXTS), *HARD_TEXTS]
    texts += [*(f"a {t} b" for t in kept), *kept]
    if tok.strip_sep_token:
        sep, pad = str(tok.tokenizer.sep_token), str(tok.tokenizer.pad_token)
        texts += [f"{m} a{m}b {sep}{m}{pad} x{sep}y {m}{m} {pad}{sep}" for m in SEP_MARKERS]
        texts += [sep, f"a {sep} b", f"{sep} " * context_length]
    want = tok(texts, context_length=context_length).numpy()
    got = [e.ids for e in tokenizer.encode_batch(TextClean(params.text_clean)(texts))]
    wrong = [text for text, w, g in zip(texts, want, got, strict=True) if list(w) != g]
    if not wrong:
        return
    name = getattr(tok.tokenizer, "name_or_path", "?")
    raise UnsupportedModelError(
        f"open_clip HFTokenizer {name!r}: the served tokenizer gives other ids than "
        f"open_clip's on {len(wrong)} check texts, e.g. {wrong[0][:60]!r}; refused rather "
        "than served with another tokenization"
    )


def write_hf_tokenizer_json(tok, path: Path, context_length: int) -> TokenizerParams:
    """Write the served ``tokenizer.json`` of an open_clip ``HFTokenizer``; returns its params.

    Raises :class:`UnsupportedModelError` naming what cannot be served exactly, or when
    the served ids differ from ``tok``'s on any check text (see the module doc).
    """
    tokenizer, params, kept = served_tokenizer(tok, context_length)
    check_served(tok, tokenizer, params, kept, context_length)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(tokenizer.to_str(pretty=True), encoding="utf-8")
    tmp.replace(path)
    return params
