"""The encode step picks its engine once, from the config, and every engine keeps the contract."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from embed_runtime.engines.contract import Engine
from embed_runtime.engines.tensor import FixedEngine, SparseEngine, TokenEngine
from embed_runtime.engines.text_encoder import TextEncoder
from tests.unit.embed_runtime.models.helpers import TOKENIZE_PARAMS, _encode_model

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
