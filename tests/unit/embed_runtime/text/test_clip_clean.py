"""open_clip's text clean as the tokenize step runs it, and its refusals."""

from __future__ import annotations

import random

import pytest

from embed_runtime.errors import InvalidInputError
from embed_runtime.text import clip_clean
from embed_runtime.text.clip_clean import CLEANS, TextClean, clean_function
from embed_runtime.text.tokenizer import TokenizerParams
from generator.fixtures.caption_corpus import caption_corpus, fuzz_strings

SPECIALS = ("<start_of_text>", "<end_of_text>")
ASCII = [chr(c) for c in range(128)] + list("   aeiou&;#x")  # controls and entities too


@pytest.mark.parametrize("name", CLEANS)
def test_clean_functions_equal_open_clips_own(name):
    tokenizer = pytest.importorskip("open_clip.tokenizer")
    rng = random.Random(3)
    ascii_texts = ["".join(rng.choices(ASCII, k=rng.randint(1, 60))) for _ in range(2000)]
    texts = caption_corpus(seed=3, per_kind=40) + fuzz_strings(seed=3, count=300) + ascii_texts
    ours, theirs = clean_function(name), getattr(tokenizer, name)
    assert [t for t in texts if ours(t) != theirs(t)] == []


def test_clean_decodes_entities_and_repairs_mojibake_as_open_clip_does():
    clean = clean_function("_clean_lower")
    assert clean("&#233;t&#xe9; &#8212; &#X2014; &EACUTE;") == "été — — é"
    assert clean("  cafÃ©  &amp;amp;  &hearts;\u200b ") == "café & ♥\u200b"
    assert clean_function("_clean_canonicalize")("A_B, c!!! &lt;d&gt;") == "a b c d"
    assert clean_function("_clean_whitespace")("A\u3000\tB") == "A B"


def test_no_clean_is_the_identity_and_an_unknown_one_fails_the_load():
    assert clean_function("") is None
    assert TextClean("")(["&amp; X"]) == ["&amp; X"]
    with pytest.raises(ValueError, match="text_clean 'upper' is not one of"):
        clean_function("upper")


@pytest.mark.parametrize(
    "text",
    [
        "<start_of_text> a",
        "a <end_of_text>",
        "abc<start_of_text>def",
        "7<end_of_text>",
        "it's<end_of_text>",
        "<end_of_text><start_of_text>x",
        "a <start_of_text><end_of_text><start_of_text>",
        "<end_of_text>" * 1500,
    ],
)
def test_special_tokens_where_open_clip_reads_them_whole_are_served(text):
    assert TextClean("_clean_lower", SPECIALS)([text]) == [text]


@pytest.mark.parametrize(
    ("text", "after"),
    [
        ("!!<start_of_text>", "'!'"),
        ("x.<end_of_text> y", "'.'"),
        ("<<end_of_text>", "'<'"),
        ("'<start_of_text>", '"\'"'),
        ("a !<end_of_text><start_of_text>", "'!'"),
        ("<end_of_text> x!<end_of_text>", "'!'"),
    ],
)
def test_special_tokens_joined_to_punctuation_are_refused(text, after):
    with pytest.raises(InvalidInputError, match=f"TEXT row 1 holds '<.*>' right after {after}"):
        TextClean("_clean_lower", SPECIALS)(["fine", text])


def test_code_points_of_the_refused_ranges_are_refused_by_name():
    clean = TextClean("_clean_whitespace", (), ("558", "58b-58c"))
    assert clean(["Ս a\u0557b \u058a"]) == ["Ս a\u0557b \u058a"]
    for char in "\u0558\u058b\u058c":
        with pytest.raises(InvalidInputError, match=f"U\\+{ord(char):04X}, a character of"):
            clean([f"a{char}b"])
    assert clean.served("a\u0558b") is None and clean.served("ab") == "ab"
    assert set(clip_clean._code_points(("a", "c-e"))) == {10, 12, 13, 14}


def test_a_model_without_clean_writes_no_clean_parameters():
    plain = TokenizerParams(256, False, ("input_ids",)).to_parameters()
    assert not {"text_clean", "piece_start_tokens", "refused_code_points"} & set(plain)
    clip = TokenizerParams(
        77,
        True,
        ("input_ids",),
        text_clean="_clean_lower",
        piece_start_tokens=SPECIALS,
        refused_code_points=("558", "58b-58c"),
    )
    written = clip.to_parameters()
    assert written["piece_start_tokens"] == "<start_of_text>,<end_of_text>"
    assert TokenizerParams.from_parameters(written) == clip
