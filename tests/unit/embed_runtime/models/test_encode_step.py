"""The encode step picks its engine once, from the config, and every engine keeps the contract."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from embed_runtime.engines.contract import Engine
from embed_runtime.engines.tensor import FixedEngine, SparseEngine, TokenEngine
from embed_runtime.engines.text_encoder import TextEncoder
from embed_runtime.ops.step_times import ENV
from tests.unit.embed_runtime.models.helpers import (
    TOKENIZE_PARAMS,
    _encode_model,
    _error,
    _text_request,
    _token_request,
)
from tests.unit.embed_runtime.ops.test_step_times import step_lines

CASES = {
    "ragged tokens": ({}, TokenEngine, ("EMBEDDING",)),
    "fixed shape": ({"ragged": "false"}, FixedEngine, ("EMBEDDING",)),
    "sparse": ({"sparse": "true"}, SparseEngine, ("SPARSE_INDICES", "SPARSE_VALUES")),
    "fused text": (
        {
            **TOKENIZE_PARAMS,
            "output_names": "input_ids,attention_mask",
            "ragged": "false",
            "fused_tokenize": "true",
        },
        TextEncoder,
        ("EMBEDDING",),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_encode_step_picks_the_engine_its_config_names(
    backend, tmp_path: Path, token_onnx: Path, tokenizer_json: Path, case: str
) -> None:
    params, kind, outputs = CASES[case]
    (tmp_path / "1").mkdir()
    shutil.copy(tokenizer_json, tmp_path / "1" / "tokenizer.json")
    model = _encode_model(tmp_path, token_onnx, **params)
    assert type(model.engine) is kind
    assert isinstance(model.engine, Engine)
    assert model.engine.output_names == outputs
    model.finalize()
    assert model.engine is None and model.encoder is None


def test_encode_step_writes_a_line_per_execution_with_real_runs(
    backend, monkeypatch, tmp_path: Path, token_onnx: Path
) -> None:
    monkeypatch.setenv(ENV, str(tmp_path / "times"))
    model = _encode_model(tmp_path, token_onnx)
    ids = np.array([[1, 5, 7, 2], [1, 4, 2, 0]], np.int64)
    good = _token_request({"input_ids": ids, "attention_mask": (ids > 0).astype(np.int64)})
    bad = _text_request("not tokens")  # lacks the graph's inputs: fails alone
    responses = model.execute([good, bad])
    assert not responses[0].has_error() and _error(responses[1])
    model.execute([good])
    path = next((tmp_path / "times").glob("*.tsv"))
    first, second = step_lines(path)
    assert (first["requests"], first["rows"]) == (2, 2)
    assert (second["requests"], second["rows"]) == (1, 2)
    for line in (first, second):
        assert line["ort_us"] > 0 and line["read_us"] > 0
        parts = line["read_us"] + line["ort_us"] + line["embed_other_us"] + line["respond_us"]
        assert parts == pytest.approx(line["total_us"], abs=0.5)
        assert line["embed_other_us"] >= 0 and line["respond_us"] >= 0
    model.finalize()
