"""``litellm = true``: ``<name>_litellm`` (LiteLLM's triton/ provider) and ``<name>_openai``.

``<name>_openai`` is what the OpenAI gateway's provider calls: ``<name>``'s input and
steps, ``EMBEDDING`` and ``TOKEN_COUNT`` out, so ``usage`` counts the model's tokens.

The goldens live beside test_render's (``tests/unit/generator/golden``); regenerate with
``UPDATE_GOLDEN=1`` after an intended change and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2

from generator.families.common import litellm_dir, openai_dir
from generator.manifest import ManifestError, ModelEntry, parse_manifest
from generator.render import parse_config

GOLDEN = Path(__file__).parent / "golden" / "st_ensemble_litellm.pbtxt"
OPENAI_GOLDEN = Path(__file__).parent / "golden" / "st_ensemble_openai.pbtxt"
TOKEN_NAMES = ["input_ids", "attention_mask", "token_type_ids"]
ENTRY = ModelEntry(name="mini", family="sentence-transformers", source="x", litellm=True)
SPLIT_STEPS = [
    ("mini_tokenize", ["TEXT"], TOKEN_NAMES),
    ("mini_encode", TOKEN_NAMES, ["EMBEDDING"]),
]


def test_litellm_ensemble_matches_golden() -> None:
    text = litellm_dir(ENTRY, 384, SPLIT_STEPS).config
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), f"differs from {GOLDEN}; UPDATE_GOLDEN=1 to accept"


def test_litellm_ensemble_takes_input_text_unbatched_and_answers_embedding_alone() -> None:
    model = litellm_dir(ENTRY, -1, [("mini_encode", ["TEXT"], ["EMBEDDING"])])
    config = parse_config(model.config)
    assert model.name == config.name == "mini_litellm"
    assert config.max_batch_size == 0 and config.platform == "ensemble"
    (text,) = config.input
    assert (text.name, text.data_type, list(text.dims)) == (
        "input_text",
        model_config_pb2.TYPE_STRING,
        [-1],
    )
    assert list(text.reshape.shape) == [-1, 1]
    assert [(o.name, list(o.dims)) for o in config.output] == [("EMBEDDING", [-1, -1])]
    (step,) = config.ensemble_scheduling.step
    assert dict(step.input_map) == {"TEXT": "input_text"}
    assert dict(step.output_map) == {"EMBEDDING": "EMBEDDING"}


def test_an_entry_that_opts_in_serves_its_litellm_ensemble_too(tmp_path) -> None:
    entries = [
        {"name": "a", "family": "sentence-transformers", "source": "s", "litellm": True},
        {"name": "b", "family": "sentence-transformers", "source": "s"},
    ]
    manifest = parse_manifest({"models": entries}, tmp_path)
    assert manifest.get("a").ensembles == ("a", "a_chunks", "a_litellm", "a_openai")
    assert {"a_litellm", "a_openai"} <= set(manifest.get("a").model_dirs)
    assert manifest.get("b").ensembles == ("b", "b_chunks")


def test_openai_ensemble_matches_golden() -> None:
    steps = [SPLIT_STEPS[0], ("mini_encode", TOKEN_NAMES, ["EMBEDDING", "TOKEN_COUNT"])]
    text = openai_dir(ENTRY, -1, steps).config
    if os.environ.get("UPDATE_GOLDEN") == "1":
        OPENAI_GOLDEN.write_text(text)
    assert text == OPENAI_GOLDEN.read_text(), f"differs from {OPENAI_GOLDEN}; UPDATE_GOLDEN=1"


def test_openai_ensemble_takes_text_batched_and_answers_embedding_and_token_count() -> None:
    model = openai_dir(ENTRY, 384, [("mini_encode", ["TEXT"], ["EMBEDDING", "TOKEN_COUNT"])])
    config = parse_config(model.config)
    assert model.name == config.name == "mini_openai"
    assert config.max_batch_size == ENTRY.max_batch_size and config.platform == "ensemble"
    assert [(i.name, list(i.dims)) for i in config.input] == [("TEXT", [1])]
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [
        ("EMBEDDING", model_config_pb2.TYPE_FP32, [384]),
        ("TOKEN_COUNT", model_config_pb2.TYPE_INT32, [1]),
    ]
    (step,) = config.ensemble_scheduling.step
    assert dict(step.output_map) == {"EMBEDDING": "EMBEDDING", "TOKEN_COUNT": "TOKEN_COUNT"}


def test_the_native_backend_gets_no_openai_ensemble(tmp_path) -> None:
    """Triton's onnxruntime backend answers what the graph does: no count to serve."""
    entry = {"name": "n", "family": "sentence-transformers", "source": "s", "litellm": True,
             "encoder_backend": "onnxruntime"}
    manifest = parse_manifest({"models": [entry]}, tmp_path)
    assert manifest.get("n").ensembles == ("n", "n_chunks", "n_litellm")


@pytest.mark.parametrize(
    "entry",
    [
        {"name": "c", "family": "open-clip", "arch": "ViT-B-32", "pretrained": "x"},
        {"name": "r", "family": "cross-encoder", "source": "s"},
        {"name": "sp", "family": "sparse-encoder", "source": "s"},
    ],
)
def test_litellm_is_refused_for_other_families(tmp_path, entry) -> None:
    with pytest.raises(ManifestError, match="litellm needs family 'sentence-transformers'"):
        parse_manifest({"models": [{**entry, "litellm": True}]}, tmp_path)
