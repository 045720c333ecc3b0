"""Fixtures of the adapter tests: the fake backend and the tokenize / encode adapters."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.unit.embed_runtime.models import helpers
from tests.unit.embed_runtime.models.helpers import (
    TOKENIZE_PARAMS,
    _args,
    _encode_model,
    load_adapter,
)

backend = helpers.backend
tokenizer_json = helpers.tokenizer_json
token_onnx = helpers.token_onnx


@pytest.fixture
def tokenize_model(backend, tmp_path: Path, tokenizer_json: Path):
    (tmp_path / "1").mkdir()
    shutil.copy(tokenizer_json, tmp_path / "1" / "tokenizer.json")
    model = load_adapter("tokenize").TritonPythonModel()
    model.initialize(_args(tmp_path, TOKENIZE_PARAMS))
    yield model
    model.finalize()


@pytest.fixture
def encode_model(backend, tmp_path: Path, token_onnx: Path):
    model = _encode_model(tmp_path, token_onnx)
    yield model
    model.finalize()
