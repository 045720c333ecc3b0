"""``litellm = true``: the ``<name>_litellm`` ensemble LiteLLM's triton/ provider calls.

The golden lives beside test_render's (``tests/unit/generator/golden``); regenerate with
``UPDATE_GOLDEN=1`` after an intended change and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2

from generator.families.common import litellm_dir
from generator.manifest import ManifestError, ModelEntry, parse_manifest
from generator.render import parse_config

GOLDEN = Path(__file__).parent / "golden" / "st_ensemble_litellm.pbtxt"
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
    assert manifest.get("a").ensembles == ("a", "a_litellm")
    assert "a_litellm" in manifest.get("a").model_dirs
    assert manifest.get("b").ensembles == ("b",)


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
