"""open_clip's text clean functions replayed as ``tokenizers`` normalizers.

open_clip cleans each text in Python before tokenizing: ``basic_clean`` (``ftfy.fix_text``,
``html.unescape`` twice, ``strip``), then ``whitespace_clean`` and ``lower`` /
``canonicalize_text``. The steps here rebuild them inside a ``tokenizers`` pipeline (no
Python at serve time), used by the CLIP tokenizer (``assets``) and the Hugging Face one
(``hf_tokenizer``); the differences are listed in ``assets``' module docstring.
"""

from __future__ import annotations

import html.entities
import struct

_TYPOGRAPHIC = (
    "ndash mdash lsquo rsquo sbquo ldquo rdquo bdquo hellip bull trade euro dagger".split()
)
_NUMERIC = "'\"&<>" + "\xa0\u2013\u2014\u2018\u2019\u201c\u201d\u2026"


def _char_class(chars) -> str:
    return "[" + "".join(f"\\x{{{ord(c):x}}}" for c in sorted(chars)) + "]"


def _ftfy_char_fixes() -> dict[str, str]:
    """Characters ftfy rewrites on their own (``""``: removed); not NUL or whitespace-only."""
    import ftfy  # noqa: PLC0415
    from ftfy import chardata  # noqa: PLC0415

    candidates = set(chardata.LIGATURES) | set(chardata.WIDTH_MAP) | set(chardata.CONTROL_CHARS)
    candidates |= set(range(0x80, 0xA0)) | {0x2BC, *range(0x2018, 0x2020)}
    fixes = {}
    for code in sorted(candidates):
        char = chr(code)
        fixed = ftfy.fix_text(char, unescape_html=False, fix_encoding=False, normalization=None)
        if code and fixed != char and not (char.isspace() and fixed.isspace()):
            fixes[char] = fixed
    return fixes


def _html_entities() -> list[tuple[str, str]]:
    """(reference, text) for Latin-1 and typographic named entities and a few numeric ones."""
    names = html.entities.name2codepoint
    pairs = {f"&{n};": chr(c) for n, c in names.items() if 0xA0 <= c <= 0xFF or n in _TYPOGRAPHIC}
    pairs["&apos;"] = "'"
    for char in _NUMERIC:
        code = ord(char)
        for ref in (f"&#{code};", f"&#{code:03d};", f"&#x{code:x};", f"&#x{code:X};"):
            pairs[ref] = char
    return sorted(pairs.items())


def _precompiled_charsmap(mapping: dict[str, str]) -> bytes:
    """SentencePiece ``precompiled_charsmap`` bytes mapping each key to its text.

    Layout read by ``tokenizers``' ``Precompiled`` normalizer: u32 trie size, a
    darts-clone double array over the keys' UTF-8 bytes whose leaves hold offsets into
    the NUL-separated replacement strings that follow. One pass replaces every key.
    """
    strings, offsets, trie = bytearray(), {}, {}
    for key, text in sorted(mapping.items()):
        if text not in offsets:
            offsets[text] = len(strings)
            strings += text.encode() + b"\0"
        node = trie
        for byte in key.encode():
            node = node.setdefault(byte, {})
        node[-1] = offsets[text]
    units, used, bases = [0], {0}, set()
    queue = [(trie, 0)]
    while queue:
        node, pos = queue.pop()
        labels = sorted(0 if c == -1 else c for c in node)
        base = 1
        while base in bases or any(base ^ c in used for c in labels) or (pos ^ base) >= 1 << 21:
            base += 1
        bases.add(base)
        units.extend([0] * (base + 256 - len(units)))
        units[pos] |= (pos ^ base) << 10 | (1 << 8 if -1 in node else 0)
        for label in labels:
            used.add(base ^ label)
            if label == 0:
                units[base] = 1 << 31 | node[-1]
            else:
                units[base ^ label] = label
                queue.append((node[label], base ^ label))
    return struct.pack(f"<I{len(units)}I", 4 * len(units), *units) + bytes(strings)


def basic_clean_steps() -> list:
    """``normalizers`` replaying open_clip's ``basic_clean`` (ftfy, ``html.unescape`` twice).

    Through NFC; the caller adds the whitespace collapse (:func:`whitespace_steps`), which
    also does ``basic_clean``'s final ``strip()``.
    """
    from tokenizers import Regex, normalizers  # noqa: PLC0415

    amp = normalizers.Replace(Regex("&(?:amp|AMP);?"), "&")
    steps = [amp, amp]
    for name, text in (("quot", '"'), ("lt", "<"), ("gt", ">")):
        steps.append(normalizers.Replace(Regex(f"&(?:{name}|{name.upper()});?"), text))
    steps.append(normalizers.Replace(Regex("&(?:nbsp;?|NBSP;)"), "\xa0"))
    steps += [normalizers.Replace(ref, text) for ref, text in _html_entities()]
    steps.append(normalizers.Replace(Regex(r"\x{1b}\[(?:\d|;)*[a-zA-Z]|\x{0}"), ""))
    fixes = _ftfy_char_fixes()
    # Precompiled rewrites a short grapheme whole from its first character: cut a fixed
    # character off a following combining mark with \x01, which ftfy deletes anyway.
    extend = r"[\p{M}\x{200c}\x{200d}\x{ff9e}\x{ff9f}\x{e33}\x{eb3}]"
    steps.append(normalizers.Replace(Regex(f"(?<={_char_class(fixes)})(?={extend})"), "\x01"))
    steps.append(normalizers.Precompiled(_precompiled_charsmap(fixes)))
    steps.append(normalizers.NFC())
    return steps


def whitespace_steps() -> list:
    """``" ".join(text.split())``: runs of Python whitespace to one space, ends stripped."""
    from tokenizers import Regex, normalizers  # noqa: PLC0415

    spaces = [chr(c) for c in range(0x110000) if chr(c).isspace()]
    return [normalizers.Replace(Regex(_char_class(spaces) + "+"), " "), normalizers.Strip()]


def lower_steps() -> list:
    """Python's ``str.lower()``: its final-sigma rule, then lower case."""
    from tokenizers import Regex, normalizers  # noqa: PLC0415

    final_sigma = r"(?<=\p{Cased}\p{Case_Ignorable}*)\x{3a3}(?!\p{Case_Ignorable}*\p{Cased})"
    return [normalizers.Replace(Regex(final_sigma), "\u03c2"), normalizers.Lowercase()]
