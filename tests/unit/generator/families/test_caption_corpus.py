"""Served CLIP text tokenization equals open_clip's on a caption corpus and a fuzz.

For every tokenizer kind an open_clip model can have (the CLIP ``SimpleTokenizer``; Hugging
Face tokenizers of the SigLIP, SigLIP2, XLM-R and CLIPA kinds, made offline, with each of
open_clip's clean functions) the served path, as the tokenize step runs it (the
step's clean, then the written ``tokenizer.json``, through ``BatchTokenizer``), gives
open_clip's ids for every string of :func:`caption_corpus` and :func:`fuzz_strings`, or
refuses the string (only the CLIP kind has strings it refuses).
"""

from __future__ import annotations

import random

import numpy as np
import pytest

pytest.importorskip("open_clip")
pytest.importorskip("transformers")
from open_clip.tokenizer import HFTokenizer, SimpleTokenizer

from embed_runtime.text.clip_clean import clean_function
from embed_runtime.text.tokenizer import BatchTokenizer
from generator.families.open_clip.assets import write_tokenizer_json
from generator.families.open_clip.hf_tokenizer import write_hf_tokenizer_json
from generator.fixtures import tiny_tokenizers
from generator.fixtures.caption_corpus import KINDS, caption_corpus, fuzz_strings

CORPUS = caption_corpus(seed=0)
FUZZ = fuzz_strings(seed=49)
TEXTS = CORPUS + FUZZ
HF_KINDS = {  # kind: (writer, vocabulary size, open_clip HFTokenizer options)
    "siglip-unigram": (tiny_tokenizers.write_tiny_hf_tokenizer, 600, {}),
    "siglip2-gemma-bpe": (tiny_tokenizers.write_tiny_gemma_like_tokenizer, 600, {}),
    "xlm-r-unigram": (tiny_tokenizers.write_tiny_xlmr_tokenizer, 600, {}),
    "clipa-wordpiece": (
        tiny_tokenizers.write_tiny_wordpiece_tokenizer,
        500,
        {"strip_sep_token": True},
    ),
}


def _compare(reference, path, params, texts):
    """``(mismatched texts, refused texts)`` of the served path against ``reference``."""
    served = BatchTokenizer(str(path), params)
    cleaned = {t: c for t in texts if (c := served.clean.served(t)) is not None}
    kept = list(cleaned)
    want = reference(kept, context_length=params.max_length).numpy()
    got = served.encode([cleaned[t] for t in kept])["input_ids"]
    assert got.shape == want.shape
    wrong = [t for t, w, g in zip(kept, want, got, strict=True) if not np.array_equal(w, g)]
    return wrong, [t for t in texts if t not in cleaned]


def test_corpus_holds_thousands_of_varied_captions():
    assert len(CORPUS) == 250 * len(KINDS) and len(FUZZ) == 1000
    assert caption_corpus(seed=0) == CORPUS and caption_corpus(seed=1) != CORPUS
    joined = "".join(TEXTS)
    for piece in ("&#x", "&#X", "&amp;amp;", "Ã©", "\u200b", "\u202e", "\u200d", "<b>", "https://"):
        assert piece in joined, piece
    assert any(len(t) > 2000 for t in CORPUS)
    assert any(clean_function("_clean_canonicalize")(t) == "" for t in CORPUS)  # empty after


def test_clip_bpe_ids_equal_open_clip_on_corpus_and_fuzz(tmp_path):
    simple = SimpleTokenizer()
    path = tmp_path / "tokenizer.json"
    params = write_tokenizer_json(simple, path, 77)
    wrong, refused = _compare(simple, path, params, TEXTS)
    assert wrong == []
    assert len(refused) < len(TEXTS) // 50  # letters of Unicode 15+, specials after punctuation


@pytest.fixture(scope="module", params=sorted(HF_KINDS))
def hf_folder(request, tmp_path_factory):
    writer, vocab_size, options = HF_KINDS[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    writer(folder, vocab_size=vocab_size)
    return folder, options


@pytest.mark.parametrize("clean", ["whitespace", "lower", "canonicalize"])
def test_hf_tokenizer_ids_equal_open_clip_on_corpus_and_fuzz(hf_folder, clean, tmp_path):
    folder, options = hf_folder
    tok = HFTokenizer(str(folder), context_length=64, clean=clean, **options)
    path = tmp_path / "tokenizer.json"
    params = write_hf_tokenizer_json(tok, path, 64)
    assert params.text_clean == f"_clean_{clean}"
    assert _compare(tok, path, params, TEXTS) == ([], [])


def test_clip_bpe_refuses_exactly_the_special_tokens_open_clip_reads_as_characters(tmp_path):
    """A fuzz of typed ``<start_of_text>`` / ``<end_of_text>`` among letters, digits,
    spaces and punctuation: served ids equal open_clip's, and every refused string would
    indeed have been served with other ids."""
    simple = SimpleTokenizer()
    path = tmp_path / "tokenizer.json"
    params = write_tokenizer_json(simple, path, 77)
    rng = random.Random(49)
    parts = ["<start_of_text>", "<end_of_text>", "<END_OF_TEXT>", "a", "1", " ", "!", "'s", "<"]
    texts = ["".join(rng.choices(parts, k=rng.randint(1, 8))) for _ in range(2000)]
    wrong, refused = _compare(simple, path, params, texts)
    assert wrong == [] and len(refused) > 100
    unrefused = BatchTokenizer(str(path), params)
    got = unrefused.encode([unrefused.clean.function(t) for t in refused])["input_ids"]
    assert not (got == simple(refused).numpy()).all(axis=1).any()
