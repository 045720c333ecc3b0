"""LLM rerankers in the cross-encoder family: template tokenizer, export parity, refusals.

A tiny random Qwen3 reranker (``generator/fixtures/tiny_llm_rerank.py``: chat template in
Qwen3-Reranker's layout, two prompts, the default one set) is exported by the family's
``build``. The served tokenizer (built from the rendered config parameters) is compared
with ``CrossEncoder.preprocess``, and the scores of the serving encoder (ragged requests,
length-sorted right-padded chunks) with ``CrossEncoder.predict`` of an independent load.
Variants of the folder check that what is not reproduced is refused by name.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from embed_runtime.errors import InvalidInputError
from embed_runtime.text.pair_template import PairTemplate, TemplatePairTokenizer
from generator.declared_kind import UnsupportedModelError
from generator.families.cross_encoder import llm
from generator.fixtures.tiny_llm_rerank import (
    PROMPTS,
    TINY_LLM_MAX_LENGTH,
    create_tiny_llm_reranker,
)
from tests.rerank_data import QUERY, llm_rerank_pairs
from tests.unit.generator.families.built import (
    ExportedReranker,
    build_reranker,
    config_parameters,
    export_reranker,
)

# The served path pads on the right, the library on the left: equal up to float rounding.
MAX_ABS_DIFF = 1e-4


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> ExportedReranker:
    root = tmp_path_factory.mktemp("llm-rerank")
    folder = create_tiny_llm_reranker(
        root / "tiny-llm", seed=1, prompts=PROMPTS, default_prompt_name="web"
    )
    exported = export_reranker(folder, root / "work", "llm")
    params = exported.tokenize_params
    assert params.max_length == TINY_LLM_MAX_LENGTH and not params.add_special_tokens
    assert isinstance(exported.tokenizer, TemplatePairTokenizer)
    return exported


def _served_ids(exported, pairs, parameters) -> list[list[int]]:
    arrays = exported.tokenizer.encode(exported.tokenizer.prepare(pairs, parameters))
    lengths = arrays["attention_mask"].sum(axis=1)
    assert (arrays["attention_mask"][:, 0] == 1).all()  # right padding
    return [row[:n].tolist() for row, n in zip(arrays["input_ids"], lengths, strict=True)]


@pytest.mark.parametrize("prompt_name", [None, "web", "code"])
def test_template_tokenizer_matches_cross_encoder_preprocess(exported, prompt_name):
    pairs = llm_rerank_pairs()
    model = exported.reference
    prompt = model.prompts["web" if prompt_name is None else prompt_name]
    want = model.preprocess([list(p) for p in pairs], prompt=prompt)
    assert want["attention_mask"][:, -1].all()  # the library pads on the left
    mask = want["attention_mask"].numpy().astype(bool)
    want_ids = [row[keep].tolist() for row, keep in zip(want["input_ids"].numpy(), mask,
                                                        strict=True)]
    parameters = {} if prompt_name is None else {"prompt_name": prompt_name}
    assert _served_ids(exported, pairs, parameters) == want_ids
    assert max(len(r) for r in want_ids) == TINY_LLM_MAX_LENGTH  # some pairs were cut


def test_cut_rows_end_with_the_template_tail(exported):
    rows = _served_ids(exported, [("q", "word " * 400), ("q", "d")], {})
    assert len(rows[0]) == TINY_LLM_MAX_LENGTH
    tail = exported.tokenizer._tail_ids(PROMPTS["web"])
    assert len(tail) > 5 and tuple(rows[0][-len(tail):]) == tail
    assert tuple(rows[1][-len(tail):]) == tail  # uncut rows end with it anyway


def _served_scores(exported, groups, parameters=None) -> np.ndarray:
    tokens = [exported.tokenizer.encode(exported.tokenizer.prepare(g, parameters or {}))
              for g in groups]
    return np.concatenate(exported.encoder.encode_tokens(tokens))


def test_served_scores_match_cross_encoder_predict(exported):
    pairs = llm_rerank_pairs()
    groups = [pairs[:1], pairs[1:7], pairs[7:]]
    scores = _served_scores(exported, groups)
    want = exported.reference.predict([list(p) for p in pairs], batch_size=len(pairs))
    assert scores.shape == (len(pairs), 1) and scores.dtype == np.float32
    diff = float(np.max(np.abs(scores[:, 0] - want)))
    print(f"LLM rerank parity max|diff| = {diff:.2e}")
    assert diff <= MAX_ABS_DIFF
    assert ((scores > 0) & (scores < 1)).all() and np.ptp(want) > 0.1
    shifted = float(np.max(np.abs(scores[:, 0] - np.roll(want, 1))))
    assert shifted > 100 * MAX_ABS_DIFF  # negative control: pairing matters
    code = _served_scores(exported, groups, {"prompt_name": "code"})[:, 0]
    want_code = exported.reference.predict([list(p) for p in pairs], prompt_name="code")
    assert float(np.max(np.abs(code - want_code))) <= MAX_ABS_DIFF
    assert float(np.max(np.abs(code - want))) > 100 * MAX_ABS_DIFF  # the prompt matters
    alone = _served_scores(exported, [[(QUERY, "x")]])
    assert abs(float(alone[0, 0]) - float(exported.reference.predict([(QUERY, "x")])[0])) <= 1e-4


def test_request_options_of_an_llm_reranker(exported):
    tokenizer = exported.tokenizer
    template, limit = tokenizer.template, TINY_LLM_MAX_LENGTH

    def count(pair):
        text = template.render(*pair, PROMPTS["web"])
        return len(tokenizer.counting.encode(text, add_special_tokens=False).ids)

    words = next(n for n in range(1, 200) if count(("q", "a" + " a" * n)) == limit)
    at_limit, over = ("q", "a" + " a" * words), ("q", "a" + " a" * (words + 1))
    assert count(over) == limit + 1
    tokenizer.prepare([at_limit], {"truncate": False})
    tokenizer.prepare([over], {"truncate": True})
    with pytest.raises(InvalidInputError, match=f"pair row 1 has {limit + 1} tokens, over the "
                                                f"model's limit of {limit}"):
        tokenizer.prepare([at_limit, over], {"truncate": "false"})
    with pytest.raises(InvalidInputError, match="not available for rerankers"):
        tokenizer.prepare([("q", "t")], {"truncation_direction": "left"})
    with pytest.raises(InvalidInputError, match="unknown prompt_name 'nope'"):
        tokenizer.prepare([("q", "t")], {"prompt_name": "nope"})


def _variant(exported, tmp_path: Path, edit) -> Path:
    folder = shutil.copytree(exported.folder, tmp_path / "tiny-llm")
    edit(folder)
    return folder


def _edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _set_template(text: str):
    def edit(folder: Path) -> None:
        (folder / "chat_template.jinja").write_text(text)
    return edit


def _no_prompts(folder: Path) -> None:
    def change(config: dict) -> None:
        config.update(prompts={}, default_prompt_name=None)
    _edit_json(folder / "config_sentence_transformers.json", change)


def _plain_pairs(folder: Path) -> None:
    """No template and no message modality: the library tokenizes plain text pairs."""
    (folder / "chat_template.jinja").unlink()
    _edit_json(folder / "sentence_bert_config.json",
               lambda c: c["modality_config"].pop("message"))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda f: (f / "chat_template.jinja").unlink(), "it has no chat template"),
        (_plain_pairs, "it has no chat template"),
        (_set_template(
            "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}"
            "<|im_end|>\n{% endfor %}<|im_start|>assistant\n"),
         "changes the query or the document"),
        (_set_template(
            "{% for m in messages | reverse %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
            "<|im_end|>\n{% endfor %}"),
         "query and the document once each, query first"),
        (lambda f: _edit_json(f / "sentence_bert_config.json", lambda c: c.update(
            processing_kwargs={"text": {"padding_side": "right"}})),
         "processing_kwargs\\['text'\\]"),
        (lambda f: _edit_json(f / "sentence_bert_config.json", lambda c: c.update(
            processing_kwargs={"chat_template": {"sanitize_control_tokens": True}})),
         "chat-template options \\['sanitize_control_tokens'\\]"),
        (_set_template(
            "{% for m in messages if m['role'] != 'system' %}<|im_start|>{{ m['role'] }}\n"
            "{{ m['content'] }}<|im_end|>\n{% endfor %}"),
         "does not place a system prompt verbatim"),
    ],
)
def test_llm_rerankers_the_server_cannot_reproduce_are_refused(exported, tmp_path, edit,
                                                               message):
    folder = _variant(exported, tmp_path, edit)
    with pytest.raises(UnsupportedModelError, match=message):
        build_reranker(folder, tmp_path / "work", "llm")
    assert not (tmp_path / "work" / "model.onnx").exists()


def test_a_template_without_prompts_serves_a_model_without_prompts(exported, tmp_path):
    def edit(folder: Path) -> None:
        _set_template("{% for m in messages if m['role'] != 'system' %}<|im_start|>"
                      "{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                      "<|im_start|>assistant\n")(folder)
        _no_prompts(folder)

    dirs = build_reranker(_variant(exported, tmp_path, edit), tmp_path / "work", "llm")
    raw = config_parameters(dirs["llm_tokenize"].config)
    assert PairTemplate.from_parameter(raw["pair_template"]).prompted == ()
    assert "prompts" not in raw


@pytest.mark.parametrize(
    ("modules", "task", "message"),
    [
        (["Transformer", "LogitScore"], "sequence-classification",
         "LogitScore \\(scores from a causal LM's token logits \\(LLM rerankers\\)\\) needs "
         "the Transformer task text-generation"),
        (["Transformer"], "text-generation",
         "task 'text-generation' is served by family 'cross-encoder' only followed by "
         "LogitScore"),
        (["Transformer", "LogitScore", "Dense"], "text-generation",
         "module 'sentence_transformers.base.modules.dense.Dense' is not supported"),
        (["Transformer", "LogitScore", "LogitScore"], "text-generation",
         "serves LogitScore .* only as the whole pipeline \\[Transformer, LogitScore\\]"),
    ],
)
def test_declared_logit_score_pipelines_outside_the_served_one_are_refused(
    tmp_path, modules, task, message
):
    from generator.declared_kind import check_source
    from generator.families.cross_encoder import FAMILY

    paths = {
        "Transformer": "sentence_transformers.base.modules.transformer.Transformer",
        "LogitScore": "sentence_transformers.cross_encoder.modules.logit_score.LogitScore",
        "Dense": "sentence_transformers.base.modules.dense.Dense",
    }
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "modules.json").write_text(json.dumps(
        [{"idx": i, "name": str(i), "path": "" if i == 0 else f"{i}_{m}",
          "type": paths[m]} for i, m in enumerate(modules)]))
    (folder / "config_sentence_transformers.json").write_text(
        json.dumps({"model_type": "CrossEncoder"}))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"transformer_task": task}))
    with pytest.raises(UnsupportedModelError, match=message):
        check_source(FAMILY.name, FAMILY.served, str(folder), "m")
    if modules == ["Transformer", "LogitScore"]:
        (folder / "sentence_bert_config.json").write_text(
            json.dumps({"transformer_task": "text-generation"}))
        check_source(FAMILY.name, FAMILY.served, str(folder), "m")


@pytest.mark.parametrize(
    "change",
    [{"restore_tail": False}, {"truncation_side": "left"},
     {"prompted": ("", "\n", "\n", "")}],
)
def test_the_tokenizer_gate_catches_a_template_that_differs(exported, change):
    params = exported.tokenizer.params
    template = dataclasses.replace(exported.tokenizer.template, **change)
    path = exported.folder.parent / "work" / "tokenizer.json"
    failures = llm.check_template_tokenizer(
        exported.reference, TemplatePairTokenizer(str(path), params, template)
    )
    assert failures and all("differ from CrossEncoder.preprocess" in f for f in failures)


def test_runtime_load_checks_pass_an_llm_reranker_folder(exported):
    from generator.declared_kind import check_source
    from generator.families.cross_encoder import FAMILY, check_cross_encoder_folder

    check_cross_encoder_folder(exported.folder)
    check_source(FAMILY.name, FAMILY.served, str(exported.folder), "llm")
