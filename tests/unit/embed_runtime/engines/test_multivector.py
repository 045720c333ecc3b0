"""``embed_runtime.engines.multivector``: query expansion, skiplist, prefix, padding, settings."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from embed_runtime.engines import multivector
from embed_runtime.engines.multivector import TaskParams, expand_and_score, pad_rows, unpad


def test_query_expansion_pads_with_the_expansion_token_and_scores_it() -> None:
    arrays = {"input_ids": np.array([[101, 7, 102, 0], [101, 7, 8, 102]]),
              "attention_mask": np.array([[1, 1, 1, 0], [1, 1, 1, 1]])}
    task = TaskParams(max_length=6, expansion_length=6, expansion_id=103)
    tokens = expand_and_score(arrays, task, skip_scoring=False)
    assert tokens.arrays["input_ids"].tolist() == [[101, 7, 102, 103, 103, 103],
                                                   [101, 7, 8, 102, 103, 103]]
    assert tokens.arrays["attention_mask"].tolist() == [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0]]
    assert tokens.scored.all() and tokens.widths.tolist() == [6, 6]
    attended = expand_and_score(arrays, TaskParams(6, 6, 103, expansion_attend=True), False)
    assert attended.arrays["attention_mask"].all()


def test_skiplist_drops_tokens_from_the_output_only() -> None:
    arrays = {"input_ids": np.array([[101, 7, 1010, 102]]),
              "attention_mask": np.array([[1, 1, 1, 1]])}
    tokens = expand_and_score(arrays, TaskParams(8, skip_ids=(1010,)), skip_scoring=True)
    assert tokens.scored.tolist() == [[True, True, False, True]]
    assert tokens.widths.tolist() == [4]  # still fed to the encoder
    embeddings, counts = pad_rows([np.ones((3, 2)), np.ones((1, 2))], 2)
    assert embeddings.shape == (2, 3, 2) and counts.tolist() == [[3], [1]]
    assert not embeddings[1, 1:].any()
    assert [len(r) for r in unpad(embeddings, counts)] == [3, 1]


def test_a_prefix_token_goes_after_the_first_token_and_the_text_is_cut_one_shorter() -> None:
    from embed_runtime.engines.multivector import MultiVectorParams, insert_prefix

    arrays = {"input_ids": np.array([[101, 7, 8, 102], [101, 9, 102, 0]]),
              "attention_mask": np.array([[1, 1, 1, 1], [1, 1, 1, 0]]),
              "token_type_ids": np.zeros((2, 4), dtype=np.int64)}
    got = insert_prefix(arrays, 1)
    assert got["input_ids"].tolist() == [[101, 1, 7, 8, 102], [101, 1, 9, 102, 0]]
    assert got["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert not got["token_type_ids"].any()
    task = TaskParams(max_length=16, expansion_length=16, expansion_id=103, prefix_id=1)
    assert task.text_length == 15 and TaskParams(max_length=16).text_length == 16
    params = MultiVectorParams(task, TaskParams(max_length=48, skip_ids=(5,)))
    raw = json.loads(params.parameters()["multi_vector"])
    assert raw["query"]["prefix_id"] == 1 and "prefix_id" not in raw["document"]
    assert MultiVectorParams.from_parameters(params.parameters()) == params



def test_expansion_fills_only_up_to_its_length_in_a_wider_batch() -> None:
    arrays = {"input_ids": np.array([[101, 7, 102, 0, 0, 0], [101, 7, 8, 9, 10, 102]]),
              "attention_mask": np.array([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]])}
    tokens = expand_and_score(arrays, TaskParams(8, expansion_length=4, expansion_id=103), False)
    assert tokens.arrays["input_ids"].tolist() == [[101, 7, 102, 103, 0, 0],
                                                   [101, 7, 8, 9, 10, 102]]
    assert tokens.scored.tolist() == [[True, True, True, True, False, False], [True] * 6]
    assert tokens.widths.tolist() == [4, 6]
    assert arrays["input_ids"][0, 3] == 0  # the caller's arrays are left as they were


def test_without_expansion_or_skiplist_the_real_tokens_are_scored() -> None:
    arrays = {"input_ids": np.array([[101, 1010, 102, 0]]),
              "attention_mask": np.array([[1, 1, 1, 0]])}
    task = TaskParams(8, skip_ids=(1010,))
    tokens = expand_and_score(arrays, task, skip_scoring=False)  # a query keeps its skip ids
    assert tokens.scored.tolist() == [[True, True, True, False]]
    assert tokens.widths.tolist() == [3]
    np.testing.assert_array_equal(tokens.arrays["input_ids"], arrays["input_ids"])


def test_pad_rows_of_no_vectors_keeps_one_zero_column() -> None:
    embeddings, counts = pad_rows([np.zeros((0, 3))], 3)
    assert embeddings.shape == (1, 1, 3) and embeddings.dtype == np.float32
    assert counts.dtype == np.int32 and counts.tolist() == [[0]]
    assert unpad(embeddings, counts)[0].shape == (0, 3)


def test_multi_vector_params_pick_the_task_and_keep_prompts() -> None:
    params = multivector.MultiVectorParams(
        TaskParams(32, expansion_length=32, expansion_id=103),
        TaskParams(180, skip_ids=(1010, 1012)),
        prompts=(("query", "query: "), ("document", "doc: ")),
        default_prompt_name="query",
    )
    back = multivector.MultiVectorParams.from_parameters(params.parameters())
    assert back.prompts == (("document", "doc: "), ("query", "query: "))  # sorted by name
    assert back == dataclasses.replace(params, prompts=back.prompts)
    assert back.task("query").max_length == 32 and back.task("document").skip_ids == (1010, 1012)
    assert back.task("anything else") == back.document
    assert json.loads(params.parameters()["multi_vector"])["prompts"] == {
        "document": "doc: ", "query": "query: "
    }


def test_multi_vector_params_missing_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="config parameter 'multi_vector' is missing"):
        multivector.MultiVectorParams.from_parameters({"max_length": "32"})
