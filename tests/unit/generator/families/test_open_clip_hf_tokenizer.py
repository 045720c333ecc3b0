"""The served ``tokenizer.json`` of an open_clip ``HFTokenizer`` gives open_clip's ids.

The tokenizer files are a T5-like Unigram tokenizer made offline
(:func:`generator.fixtures.tiny_tokenizers.write_tiny_hf_tokenizer`), loaded by
open_clip's ``HFTokenizer`` from a local folder as ``get_tokenizer('local-dir:...')``
does, with each of its clean functions.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("open_clip")
pytest.importorskip("transformers")
from open_clip.tokenizer import HFTokenizer

from embed_runtime.text.tokenizer import BatchTokenizer, TokenizerParams
from generator.declared_kind import UnsupportedModelError
from generator.families.open_clip import hf_tokenizer
from generator.families.open_clip.assets import load_open_clip
from generator.families.open_clip.hf_tokenizer import (
    SEP_MARKERS,
    served_tokenizer,
    write_hf_tokenizer_json,
)
from generator.fixtures.tiny_tokenizers import (
    write_tiny_gemma_like_tokenizer,
    write_tiny_hf_tokenizer,
    write_tiny_wordpiece_tokenizer,
)
from tests.unit.generator.families.test_open_clip_tokenizer import CORPUS


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf_tok")
    write_tiny_hf_tokenizer(path, vocab_size=600)
    return path


def _mismatches(tok, path, texts, context_length):
    """Texts whose served ids (the step's clean, then ``path``) differ from ``tok``'s."""
    pad_id = tok.tokenizer.pad_token_id
    params = TokenizerParams(context_length, True, ("input_ids",), pad_id, text_clean=_clean(tok))
    served = BatchTokenizer(str(path), params)
    want = tok(texts, context_length=context_length).numpy()
    got = served.encode(served.clean(list(texts)))["input_ids"]
    assert got.shape == want.shape == (len(texts), context_length)
    return [t for t, w, g in zip(texts, want, got, strict=True) if not np.array_equal(w, g)]


def _clean(tok) -> str:
    return tok.clean_fn.__name__


@pytest.mark.parametrize("context_length", [64, 16])
def test_ids_equal_open_clip_on_corpus(folder, tmp_path, context_length):
    tok = HFTokenizer(str(folder), context_length=context_length, clean="canonicalize")
    path = tmp_path / "tokenizer.json"
    params = write_hf_tokenizer_json(tok, path, context_length)
    assert params.pad_id == tok.tokenizer.pad_token_id == 1
    assert params.text_clean == "_clean_canonicalize" and not params.piece_start_tokens
    assert _mismatches(tok, path, list(CORPUS), context_length) == []


@pytest.mark.parametrize("clean", ["whitespace", "lower"])
def test_other_cleans_equal_open_clip_on_corpus(folder, tmp_path, clean):
    tok = HFTokenizer(str(folder), context_length=64, clean=clean)
    tokenizer, params, kept = served_tokenizer(tok, 64)
    assert params.pad_id == 1 and kept == ["<pad>", "</s>", "<unk>"]
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    assert _mismatches(tok, tmp_path / "tokenizer.json", list(CORPUS), 64) == []


@pytest.mark.parametrize("clean", ["whitespace", "lower"])
def test_added_tokens_typed_in_a_text_are_served_exactly(folder, tmp_path, clean):
    """The clean runs before the tokenizer splits out ``</s>``, as open_clip's does."""
    tok = HFTokenizer(str(folder), context_length=64, clean=clean)
    path = tmp_path / "tokenizer.json"
    write_hf_tokenizer_json(tok, path, 64)
    texts = ["a </s> b", "  </s>  ", "x<pad>y <unk>", "&lt;/s&gt; </S>"]
    assert _mismatches(tok, path, texts, 64) == []


def test_runtime_batch_tokenizer_pads_with_the_tokenizers_pad_id(folder, tmp_path):
    tok = HFTokenizer(str(folder), context_length=64, clean="canonicalize")
    path = tmp_path / "tokenizer.json"
    params = write_hf_tokenizer_json(tok, path, 64)
    texts = [t for t in CORPUS if t.strip()]
    served = BatchTokenizer(str(path), params)
    ids = served.encode(served.clean(texts))["input_ids"]
    assert np.array_equal(ids, tok(texts).numpy())
    assert (ids[:, -1] == 1).sum() > len(texts) // 2  # padded with </s>, not 0


def test_special_token_text_is_cleaned_like_open_clip(folder, tmp_path):
    """canonicalize strips the punctuation of ``</s>``: open_clip never sees the token."""
    tok = HFTokenizer(str(folder), context_length=32, clean="canonicalize")
    path = tmp_path / "tokenizer.json"
    write_hf_tokenizer_json(tok, path, 32)
    texts = ["a </s> b", "</s>", "<pad><unk>", "x<unk>y"]
    assert _mismatches(tok, path, texts, 32) == []


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"tokenizer_mode": "clips"}, "tokenizer_mode='clips'"),
        ({"strip_sep_token": True}, "strip_sep_token=True without a separator token"),
    ],
)
def test_unsupported_options_are_refused_by_name(folder, tmp_path, kwargs, named):
    tok = HFTokenizer(str(folder), context_length=32, **kwargs)
    with pytest.raises(UnsupportedModelError, match=named):
        write_hf_tokenizer_json(tok, tmp_path / "tokenizer.json", 32)
    assert not (tmp_path / "tokenizer.json").exists()


def test_a_tokenizer_that_differs_is_refused_not_served(folder, tmp_path, monkeypatch):
    tok = HFTokenizer(str(folder), context_length=32, clean="canonicalize")
    real = hf_tokenizer.TextClean
    monkeypatch.setattr(hf_tokenizer, "TextClean", lambda clean: real("_clean_whitespace"))
    with pytest.raises(UnsupportedModelError, match="other ids than open_clip's"):
        write_hf_tokenizer_json(tok, tmp_path / "tokenizer.json", 32)
    assert not (tmp_path / "tokenizer.json").exists()


def test_hub_tokenizer_offline_is_refused_naming_it(monkeypatch):
    """ViT-B-16-SigLIP names ``timm/ViT-B-16-SigLIP``; offline, the build says so."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UnsupportedModelError, match="timm/ViT-B-16-SigLIP.*local-dir:"):
        load_open_clip("ViT-B-16-SigLIP")


def test_wordpiece_tokenizer_with_whitespace_clean_is_served_exactly(tmp_path):
    """CLIPA-style (``bert-base-uncased``, clean 'whitespace'): ``[SEP]`` kept and exact.

    BERT's pre-tokenizer splits on whitespace, so the pieces around a typed ``[SEP]``
    give the same tokens stripped or not; the build's check passes.
    """
    write_tiny_wordpiece_tokenizer(tmp_path, vocab_size=500)
    tok = HFTokenizer(str(tmp_path), context_length=32, clean="whitespace")
    path = tmp_path / "served.json"
    assert write_hf_tokenizer_json(tok, path, 32).pad_id == tok.tokenizer.pad_token_id == 0
    texts = [*CORPUS, "a [SEP] b", "[CLS]x[SEP]", "  [MASK]  ", "A [PAD] B [UNK]"]
    assert _mismatches(tok, path, texts, 32) == []


def test_gemma_like_bpe_tokenizer_with_canonicalize_is_served_exactly(tmp_path):
    """SigLIP2-style: BPE with byte fallback, spaces as ``▁``, ``<bos> ... <eos>``, pad 0."""
    write_tiny_gemma_like_tokenizer(tmp_path, vocab_size=600)
    tok = HFTokenizer(str(tmp_path), context_length=64, clean="canonicalize")
    path = tmp_path / "served.json"
    assert write_hf_tokenizer_json(tok, path, 64).pad_id == tok.tokenizer.pad_token_id == 0
    texts = [*CORPUS, "<bos> a <eos> b <pad>", "<0x41> bytes"]
    assert _mismatches(tok, path, texts, 64) == []


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory):
    path = tmp_path_factory.mktemp("wordpiece")
    write_tiny_wordpiece_tokenizer(path, vocab_size=500)
    return path


def _clipa_texts(sep: str, pad: str) -> list[str]:
    marker = SEP_MARKERS[0]
    return [
        *CORPUS,  # unicode, long text, text empty after cleaning
        sep,
        f"a {sep} b",
        f"x{sep}y{pad}z",
        f"{pad}{sep}{pad}",
        f"[sep] {sep.lower()} [ SEP ]",
        f"{sep} " * 40,
        f"{marker} a{marker}b {marker}{marker} {marker}{sep}{marker}",
        "\t \n  ",
    ]


def test_strip_sep_token_is_served_exactly_clipa_kind(wordpiece, tmp_path):
    """CLIPA (``bert-base-uncased``, clean 'whitespace', ``strip_sep_token``): open_clip's ids.

    Every ``[SEP]`` id (appended, or typed in a text) is 0, through the served file and
    through the serve-time ``BatchTokenizer`` alike; typed ``[PAD]`` stays 0 and a typed
    marker character ``[UNK]``.
    """
    tok = HFTokenizer(str(wordpiece), context_length=32, clean="whitespace", strip_sep_token=True)
    path = tmp_path / "served.json"
    params = write_hf_tokenizer_json(tok, path, 32)
    assert params.pad_id == 0
    sep_id = tok.tokenizer.sep_token_id
    texts = _clipa_texts(str(tok.tokenizer.sep_token), str(tok.tokenizer.pad_token))
    assert "" in texts and any(len(t) > 400 for t in texts)
    assert _mismatches(tok, path, texts, 32) == []
    served = BatchTokenizer(str(path), params)
    ids = served.encode(served.clean(texts))
    want = tok(texts).numpy()
    assert np.array_equal(ids["input_ids"], want)
    assert not (want == sep_id).any()
    unstripped = HFTokenizer(str(wordpiece), context_length=32, clean="whitespace")(texts)
    assert (unstripped.numpy() == sep_id).sum() > len(texts)  # the control: [SEP] was there
    marker_row = want[texts.index(_clipa_texts("[SEP]", "[PAD]")[-2])]
    assert tok.tokenizer.unk_token_id in marker_row


def test_strip_sep_token_with_canonicalize_only_renumbers_the_appended_separator(
    wordpiece, tmp_path
):
    tok = HFTokenizer(str(wordpiece), context_length=16, clean="canonicalize", strip_sep_token=True)
    path = tmp_path / "served.json"
    write_hf_tokenizer_json(tok, path, 16)
    assert _mismatches(tok, path, _clipa_texts("[SEP]", "[PAD]"), 16) == []


def test_strip_sep_token_without_a_free_marker_is_refused_by_name(wordpiece, tmp_path, monkeypatch):
    monkeypatch.setattr(hf_tokenizer, "SEP_MARKERS", ("a", "b"))
    tok = HFTokenizer(str(wordpiece), context_length=32, clean="whitespace", strip_sep_token=True)
    with pytest.raises(UnsupportedModelError, match=r"strip_sep_token=True .*every marker"):
        write_hf_tokenizer_json(tok, tmp_path / "tokenizer.json", 32)
    assert not (tmp_path / "tokenizer.json").exists()
