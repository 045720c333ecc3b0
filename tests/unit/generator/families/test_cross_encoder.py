"""The cross-encoder family: pair decoding, pair tokenization and export parity.

A tiny random-initialised cross-encoder (``generator/fixtures/tiny_rerank.py``) is
exported by the family's ``build``; its pair tokenizer is compared with
``CrossEncoder.preprocess`` and its scores, run through the serving encoder (ragged
requests, length-sorted chunks), with ``CrossEncoder.predict`` of an independent load.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from embed_runtime.errors import InvalidInputError
from embed_runtime.text.pair_tokenizer import PairTokenizer, decode_pairs
from embed_runtime.text.tokenizer import TokenizerParams, split_rows
from generator.families.cross_encoder import check_cross_encoder_folder
from generator.families.cross_encoder import export as family
from generator.fixtures.tiny_rerank import TINY_MAX_LENGTH, create_tiny_cross_encoder
from generator.lifecycle import parse_request
from generator.manifest import RUNTIME_MANIFEST, Manifest, ModelEntry
from tests.rerank_data import QUERY, rerank_pairs
from tests.unit.generator.families.built import ExportedReranker, export_reranker

MAX_ABS_DIFF = 1e-5
PARAMS = TokenizerParams(64, False, ("input_ids", "attention_mask"), 0, False, 100, 300)


def _rows(*texts: str) -> np.ndarray:
    return np.array([[t.encode()] for t in texts], dtype=object)


def test_decode_pairs_pairs_rows_in_order():
    pairs = decode_pairs(_rows("q1", "q2"), _rows("t1", "t2"), PARAMS)
    assert pairs == [("q1", "t1"), ("q2", "t2")]


@pytest.mark.parametrize(
    ("queries", "texts", "message"),
    [
        (("q",), ("a", "b"), "QUERY has 1 rows and TEXT 2"),
        (("q", " "), ("a", "b"), "QUERY row 1 is empty"),
        (("q",), ("",), "TEXT row 0 is empty"),
        (("q" * 101,), ("a",), "QUERY row 0 is 101 bytes, over this model's max_text_bytes=100"),
        (("q",), ("a" * 101,), "TEXT row 0 is 101 bytes, over this model's max_text_bytes=100"),
        (("q" * 90,) * 2, ("a" * 90,) * 2, "QUERY and TEXT rows total 360 bytes, over"),
        (("q" * 100,) * 3, ("a",) * 3, "QUERY and TEXT rows total 303 bytes, over"),
    ],
)
def test_decode_pairs_rejects_bad_requests(queries, texts, message):
    with pytest.raises(InvalidInputError, match=message):
        decode_pairs(_rows(*queries), _rows(*texts), PARAMS)


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> ExportedReranker:
    root = tmp_path_factory.mktemp("rerank")
    folder = create_tiny_cross_encoder(root / "tiny-rerank", seed=3)
    exported = export_reranker(folder, root / "work", "rr")
    assert exported.tokenize_params.max_length == TINY_MAX_LENGTH
    assert type(exported.tokenizer) is PairTokenizer
    return exported


def test_pair_tokenizer_matches_cross_encoder_including_truncation(exported):
    pairs = rerank_pairs()
    want = exported.reference.preprocess([list(p) for p in pairs])
    got = exported.tokenizer.encode(pairs)
    assert got["input_ids"].shape == tuple(want["input_ids"].shape)
    assert int(want["attention_mask"].sum(axis=1).max()) == TINY_MAX_LENGTH
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        np.testing.assert_array_equal(got[name], want[name].numpy())


def _pair_tokens(exported, pair) -> int:
    """A pair's tokens uncut, as the library's tokenizer counts them."""
    return len(exported.reference.tokenizer(*pair, truncation=False)["input_ids"])


def test_truncate_false_refuses_a_pair_over_the_limit_and_passes_one_at_it(exported):
    tokenizer, limit = exported.tokenizer, TINY_MAX_LENGTH
    words = next(n for n in range(1, 200) if _pair_tokens(exported, ("q", "a " * n)) == limit)
    at_limit, over = ("q", "a " * words), ("q", "a " * (words + 1))
    assert _pair_tokens(exported, over) == limit + 1
    tokenizer.refuse_overlong([at_limit], {"truncate": False})
    for parameters in ({}, {"truncate": True}):
        tokenizer.refuse_overlong([over], parameters)  # cut longest-first, as CrossEncoder
    with pytest.raises(InvalidInputError) as refused:
        tokenizer.refuse_overlong([at_limit, over], {"truncate": "false"})
    assert refused.value.message.startswith(
        f"pair row 1 has {limit + 1} tokens, over the model's limit of {limit}"
    )


@pytest.mark.parametrize("value", ["left", "Left"])
def test_pairs_refuse_truncation_direction_left(exported, value):
    with pytest.raises(InvalidInputError, match="not available for rerankers"):
        exported.tokenizer.refuse_overlong([("q", "t")], {"truncation_direction": value})
    exported.tokenizer.refuse_overlong([("q", "t")], {"truncation_direction": "right"})


def test_served_scores_match_cross_encoder_predict(exported):
    pairs = rerank_pairs()
    groups = [pairs[:1], pairs[1:7], pairs[7:]]
    tokens = split_rows(exported.tokenizer.encode(pairs), [len(g) for g in groups])
    scores = np.concatenate(exported.encoder.encode_tokens(tokens))
    want = exported.reference.predict([list(p) for p in pairs], batch_size=len(pairs))
    assert scores.shape == (len(pairs), 1) and scores.dtype == np.float32
    diff = float(np.max(np.abs(scores[:, 0] - want)))
    print(f"rerank parity max|diff| = {diff:.2e}")
    assert diff <= MAX_ABS_DIFF
    assert ((scores > 0) & (scores < 1)).all()
    alone = exported.encoder.encode_tokens([exported.tokenizer.encode([(QUERY, "x")])])[0]
    assert abs(float(alone[0, 0]) - float(exported.reference.predict([(QUERY, "x")])[0])) <= 1e-5


def test_build_refuses_a_folder_that_is_not_a_cross_encoder(tmp_path):
    entry = ModelEntry(name="rr", family="cross-encoder", source=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="not a sentence-transformers folder"):
        family.build(entry, Manifest(models=(entry,)), tmp_path / "work")


def test_runtime_loads_refuse_reranker_folders_with_custom_code(exported, tmp_path):
    import shutil

    folder = shutil.copytree(exported.folder, tmp_path / "rr")
    check_cross_encoder_folder(folder)
    config = folder / "config_sentence_transformers.json"
    settings = json.loads(config.read_text())
    config.write_text(json.dumps(settings | {"activation_fn": "my_pkg.Activation"}))
    with pytest.raises(InvalidInputError, match="not a torch class"):
        check_cross_encoder_folder(folder)
    config.write_text(json.dumps(settings))
    model_config = folder / "config.json"
    model_config.write_text(json.dumps({"auto_map": {"AutoModel": "x.Y"}}))
    with pytest.raises(InvalidInputError, match="auto_map"):
        check_cross_encoder_folder(folder)


def test_model_manager_loads_a_cross_encoder_folder(exported, tmp_path, monkeypatch):
    from tests.unit.generator.test_lifecycle import _manager

    manager = _manager(tmp_path, roots=[exported.folder.parent])
    built: list[str] = []
    monkeypatch.setattr(manager, "_build", built.append)
    raw = {"action": "load", "family": "cross-encoder", "source": str(exported.folder)}
    manager.load(parse_request(json.dumps(raw)))
    assert built == ["tiny-rerank"]
    record = (manager.params.repo / RUNTIME_MANIFEST).read_text()
    assert 'family = "cross-encoder"' in record
    bad = {"action": "load", "family": "cross-encoder", "source": "cross-encoder/ms-marco"}
    with pytest.raises(InvalidInputError, match="hub downloads are off"):
        manager.load(parse_request(json.dumps(bad)))


def test_top_k_sorts_best_first_and_keeps_input_order_on_ties():
    from client.rerank import top_k

    ranked = top_k(np.array([0.2, 0.9, 0.2, 0.5], dtype=np.float32), ["a", "b", "c", "d"], 3)
    assert [(r.index, r.text) for r in ranked] == [(1, "b"), (3, "d"), (0, "a")]
    assert ranked[0].score == pytest.approx(0.9)


def test_cli_parses_rerank():
    from client.cli import parse_args

    args = parse_args(["rerank", "--model", "rr", "--query", "q", "t1", "t2", "--top-k", "1"])
    assert (args.command, args.model, args.query, args.texts, args.top_k) == (
        "rerank",
        "rr",
        "q",
        ["t1", "t2"],
        1,
    )
    with pytest.raises(SystemExit):
        parse_args(["rerank", "--model", "rr", "--query", "q"])
