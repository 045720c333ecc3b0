"""The generated CLIP ``tokenizer.json`` gives open_clip's SimpleTokenizer ids."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from open_clip.tokenizer import SimpleTokenizer
from tokenizers import Tokenizer

from embed_runtime.errors import InvalidInputError
from embed_runtime.text.clip_clean import _code_points
from embed_runtime.text.tokenizer import BatchTokenizer, TokenizerParams
from generator.families.open_clip.assets import write_tokenizer_json

SUBJECTS = ["a dog", "Two cats", "an old man", "the Eiffel Tower", "a red car", "my friend's bike"]
SCENES = ["on the beach", "at night.", "in the rain!", "near a river, at sunset", "(blurry)"]
ASCII = [f"A photo of {s} {p}" for s, p in itertools.product(SUBJECTS, SCENES)]
PUNCTUATION = [
    "Hello, World!!",
    "what?!?",
    "e-mail: x@y.z",
    "C++ / C# / F#",
    "a_b-c.d",
    "#hashtag @user",
    "...",
    "!!!",
    "(parens) [brackets] {braces}",
    "50% off -- now $9.99",
    "it's, we're, I'd, they'll",
    "Don't STOP",
    "path/to/file.txt",
    "https://example.com/a?b=c&d=e",
    "a--b__c~~d",
    "'quoted'",
    '"double"',
    "semi;colon:colon",
    "x^2 + y^2 = z^2",
    "<b>bold</b>",
    "1/2 = 0.5",
    "~`|\\",
]
NUMBERS = [
    "3.14159",
    "1,000,000 people",
    "2024-01-31",
    "room 101",
    "+49 30 1234567",
    "1e-10",
    "007",
    "12:30 pm",
    "v1.2.3",
    "100km/h",
    "0x1F",
    "٣ arabic-indic digit",
    "Ⅻ roman",
    "²³ superscripts",
]
EMOJI = [
    "emoji 🙂🚀",
    "👍🏽 thumbs",
    "family 👨‍👩‍👧‍👦",
    "flag 🇩🇪 and 🏴󠁧󠁢󠁷󠁬󠁳󠁿",
    "❤️ love",
    "🎉🎉🎉",
    "a😀b",
    "keycap 1️⃣",
    "✨sparkles✨",
    "☕ coffee",
]
CJK = [
    "東京は日本の首都です。",
    "一只猫坐在桌子上",
    "고양이가 테이블 위에 앉아 있다",
    "中文，标点！符号？",
    "（括号）：冒号；",
    "カタカナとひらがな",
    "ﾊﾝｶｸｶﾀｶﾅ",
    "ｶﾞｷﾞｸﾞ",
    "ＦＵＬＬＷＩＤＴＨ　ｔｅｘｔ１２３",
    "半角と全角：ＡＢＣ",
    "漢字　全角スペース",
    "조선말",
    "汉字 mixed with English words",
]
ACCENTED = [
    "café naïve résumé",
    "Ünïcödé façade",
    "Ñandú",
    "Straße groß",
    "ØÆÅ øæå",
    "İstanbul",
    "Ελληνικά γράμματα",
    "ΣΑΣ ΟΔΥΣΣΕΥΣ σοφός",
    "Привет, мир",
    "עברית",
    "العربية",
    "हिन्दी",
    "ไทย",
    "Tiếng Việt",
    "e\u0301 decomposed",
    "A\u030a ring",
    "ﬁne ﬂour ﬀ",
    "Œuvre œil",
    "“curly” ‘quotes’",
    "«guillemets»",
    "em—dash en–dash",
    "ellipsis…",
    "bullet • point",
    "™ © ®",
    "µ micro",
    "½ ¼",
    "Ǆ dz digraph",
    "ǅungla",
    "ß ẞ",
    "ﬃ ligature",
]
ENTITIES = [
    "fish &amp; chips",
    "&lt;tag&gt;",
    "&quot;quoted&quot;",
    "it&#39;s",
    "it&#039;s",
    "it&#x27;s",
    "caf&eacute;",
    "&copy; 2024",
    "a&nbsp;b",
    "&amp;amp; double",
    "&amp;lt;double&amp;gt;",
    "AT&T",
    "R&D",
    "&ndash; &mdash; &hellip;",
    "&lsquo;x&rsquo; &ldquo;y&rdquo;",
    "&apos;",
    "&euro;5",
    "&trade;",
    "Tom &amp Jerry",
    "&ltnot closed",
    "&#8217;s",
    "&#x2019;",
    "x &#38; y",
    "&Uuml;ber",
    "&szlig;",
    "&frac12;",
]
WHITESPACE = [
    "  leading",
    "trailing   ",
    "  many    spaces  ",
    "tab\tseparated",
    "new\nline",
    "crlf\r\nx",
    "\u00a0nbsp\u00a0",
    "\u2003em space",
    "\u3000ideographic",
    "a\u2028b",
    "\t\n ",
    " ",
    "zero\u200bwidth",
    "a\u200db",
    "\ufeffbom",
    "x\x0cform feed",
]
CONTROL = [
    "a\x01b",
    "bell\x07",
    "\x1b[31mred\x1b[0m",
    "nul\x00x",
    "del\x7f",
    "a\x85b",
    "c1 \x93q\x94",
]
SPECIAL = ["<start_of_text> a <end_of_text>", "<START_OF_TEXT> upper", "x <end_of_text>"]
LONG = [
    "The quick brown fox jumps over the lazy dog. " * 12,
    " ".join(f"word{i}" for i in range(100)),
    "supercalifragilisticexpialidocious " * 20,
    "東京" * 200,
    "a" * 1000,
    "🙂" * 80,
]
EMPTY = ["", "x", "a"]
CASES = (
    ASCII
    + PUNCTUATION
    + NUMBERS
    + EMOJI
    + CJK
    + ACCENTED
    + ENTITIES
    + WHITESPACE
    + CONTROL
    + SPECIAL
    + LONG
    + EMPTY
)
CORPUS = (
    CASES
    + [c.upper() for c in CASES[:120]]
    + [f"{a} {b}" for a, b in zip(CJK, EMOJI, strict=False)]
)
CORPUS += [f"{a}, {b}" for a, b in zip(ENTITIES, ACCENTED, strict=False)] + [
    f"{a}{b}" for a, b in zip(NUMBERS, PUNCTUATION, strict=False)
]

# What the served path cannot match, refused (module docstring of open_clip/assets.py).
REFUSED = ["!!<start_of_text>", "x.<end_of_text> y", "a\u0558b unicode 16"]
# Once different (the clean replayed as normalizers), now open_clip's ids.
ONCE_DIFFERENT = [
    "cafÃ© mojibake",
    "&hearts; &#8364; &EACUTE; outside the entity set",
    "&#233;t&#xe9; &#8212; &#x2014;",
    "&amp;amp;amp;lt; escaped three times",
    "ＦＵＬＬ＆ａｍｐ；width entity",
    "<b> &ldquo;quoted&rdquo;</b>",
    "ᶯΣ",
    "<start_of_text> a <end_of_text><start_of_text>b",
]


@pytest.fixture(scope="module")
def simple():
    return SimpleTokenizer()


@pytest.fixture(scope="module")
def served(tmp_path_factory, simple):
    path = tmp_path_factory.mktemp("clip_tok") / "tokenizer.json"
    params = write_tokenizer_json(simple, path, context_length=77)
    return path, params


def _served(served, texts):
    path, params = served
    tokenizer = BatchTokenizer(str(path), params)
    return tokenizer.encode(tokenizer.clean(list(texts)))["input_ids"]


def _mismatches(simple, served, texts, context_length=77):
    expected = simple(texts, context_length=context_length).numpy()
    got = _served(served, texts)
    assert got.shape == expected.shape
    return [t for t, e, g in zip(texts, expected, got, strict=True) if not np.array_equal(e, g)]


def test_corpus_is_varied_and_large():
    assert len(CORPUS) >= 300
    assert any(len(t) > 400 for t in CORPUS) and "" in CORPUS


def test_ids_equal_open_clip_on_corpus(simple, served):
    assert _mismatches(simple, served, CORPUS) == []


def test_strings_the_replayed_clean_missed_now_equal_open_clip(simple, served):
    assert _mismatches(simple, served, ONCE_DIFFERENT) == []


@pytest.mark.parametrize("text", REFUSED)
def test_unmatchable_strings_are_refused_with_a_reason(served, text):
    path, params = served
    with pytest.raises(InvalidInputError, match=r"TEXT row 0 holds .*so it is refused"):
        BatchTokenizer(str(path), params).clean([text])


def test_served_params_name_the_clean_and_the_refusals(served):
    _, params = served
    assert params.text_clean == "_clean_lower"
    refused = set(_code_points(params.refused_code_points))
    assert 0x558 in refused and not refused & {0x1FACA, 0x1F8CD, *range(0x110000 - 2, 0x110000)}
    assert params.piece_start_tokens == ("<start_of_text>", "<end_of_text>")
    assert TokenizerParams.from_parameters(params.to_parameters()) == params


def test_tokenizer_json_is_deterministic(simple, served, tmp_path):
    write_tokenizer_json(simple, tmp_path / "again.json", context_length=77)
    assert (tmp_path / "again.json").read_bytes() == served[0].read_bytes()


def test_truncation_keeps_end_of_text_last(simple, served):
    ids = Tokenizer.from_file(str(served[0])).encode(LONG[0].lower()).ids
    assert len(ids) == 77 and ids[0] == simple.sot_token_id and ids[-1] == simple.eot_token_id


def test_other_context_length(simple, tmp_path):
    path = tmp_path / "tokenizer.json"
    params = write_tokenizer_json(simple, path, context_length=32)
    assert _mismatches(simple, (path, params), CASES, context_length=32) == []


def test_decode_round_trips_plain_text(served):
    tokenizer = Tokenizer.from_file(str(served[0]))
    tokenizer.no_padding()
    ids = tokenizer.encode("a photo of a café!").ids
    assert tokenizer.decode(ids).strip() == "a photo of a café !"


def test_non_simple_tokenizers_are_refused(tmp_path):
    with pytest.raises(NotImplementedError, match="SimpleTokenizer"):
        write_tokenizer_json(object(), tmp_path / "tokenizer.json", 77)
    with pytest.raises(NotImplementedError, match="clean='lower'"):
        write_tokenizer_json(SimpleTokenizer(clean="whitespace"), tmp_path / "t.json", 77)
