"""Multilingual CLIP with a Hugging Face text model (``text_cfg.hf_model_name``) offline.

Tiny random-init CLIPs with a Hugging Face text tower
(:mod:`generator.fixtures.tiny_clip_hf_text`): open_clip's ``xlm-roberta-base-ViT-B-32``
shape (mean pooler, MLP projection), XLM-R with its own CLS pooler, an NLLB-CLIP-like
M2M100 encoder (CLS, linear projection) and an mT5 encoder (mean, T5 tokenizer), each as a
``local-dir:`` folder that also holds the text model's ``config.json`` and its tokenizer
files: the family builds it without the hub, and the served path (tokenizer.json, ONNX
text tower; runtime preprocessing, ONNX image tower) equals open_clip's ``HFTokenizer``,
``encode_text`` and ``encode_image``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from generator.declared_kind import UnsupportedModelError
from generator.families.open_clip.assets import (
    embedding_dim,
    load_open_clip,
    preprocess_params_from_model,
)
from generator.families.open_clip.export import _vocab_size
from generator.families.open_clip.hf_tokenizer import (
    CHECK_TEXTS,
    is_hf_tokenizer,
    write_hf_tokenizer_json,
)
from generator.fixtures.tiny_clip_hf_text import (
    CONTEXT_LENGTH,
    MODEL_CFG,
    VARIANTS,
    VOCAB_SIZE,
    create_tiny_xlmr_clip,
)
from generator.fixtures.tiny_tokenizers import TOKENIZER_CORPUS
from tests.unit.generator.families import open_clip_served as served
from tests.unit.generator.families.open_clip_served import torch

MAX_ABS = 1e-5  # measured on the 2-core machine: text 1.6e-7, images 1.5e-7 (see below)
TEXTS = [
    *TOKENIZER_CORPUS,
    "A DIAGRAM, with “quotes” &amp; entities",
    "Ein Hund läuft über die Wiese",
    "x" * 300,
]


def _label(model) -> str:
    return f"{model.text.config.model_type} {type(model.text.pooler).__name__}"


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def built(request, tmp_path_factory):
    """(model, open_clip transform, tokenizer, folder with the exported graphs, reports)."""
    out = tmp_path_factory.mktemp(request.param)
    fields = create_tiny_xlmr_clip(out / "model", seed=0, variant=request.param)
    model, preprocess_val, tokenizer, reports = served.export_tiny(fields, out)
    return model, preprocess_val, tokenizer, out, reports


def test_the_hub_name_in_the_config_is_read_from_the_folder(built):
    model, _, tokenizer, _, _ = built
    assert MODEL_CFG["text_cfg"]["hf_model_name"] == "xlm-roberta-base"  # not a local path
    assert type(model.text).__name__ == "HFTextEncoder"
    assert model.text.config.model_type in {kind for _, kind in VARIANTS.values()}
    assert is_hf_tokenizer(tokenizer) and tokenizer.context_length == CONTEXT_LENGTH
    size = preprocess_params_from_model(model).size
    assert embedding_dim(model, CONTEXT_LENGTH, size) == MODEL_CFG["embed_dim"]
    assert _vocab_size(model) == VOCAB_SIZE


def test_towers_export_within_tolerance(built):
    *_, reports = built
    for name, report in reports.items():
        print(f"\n{_label(built[0])} {name}: max abs {report.max_abs_diff:.1e}")
        assert report.max_abs_diff <= MAX_ABS, name


def test_served_text_path_matches_open_clip(built, tmp_path):
    model, _, tokenizer, out, _ = built
    path = tmp_path / "tokenizer.json"
    params = write_hf_tokenizer_json(tokenizer, path, CONTEXT_LENGTH)
    assert params.pad_id == model.text.config.pad_token_id  # what the text tower masks
    texts = [*TEXTS, *CHECK_TEXTS]
    ids = served.served_ids(path, texts, params)
    assert np.array_equal(ids, tokenizer(texts).numpy())
    got = served.onnx_embedding(out / "text_encoder.onnx", "input_ids", ids.astype(np.int64))
    with torch.no_grad():
        want = model.encode_text(tokenizer(texts), normalize=True).numpy()
    max_abs = float(np.abs(got - want).max())
    print(f"\n{_label(model)} served text path: max abs {max_abs:.1e}")
    assert max_abs <= MAX_ABS
    # the tiny towers tell texts apart (the random tanh CLS pooler least: 3.4e-4)
    assert float((1 - want @ want.T).max()) >= 1e-4


def test_served_image_path_matches_open_clip(built):
    model, preprocess_val, _, out, _ = built
    blobs = served.smooth_pngs(1, served.IMAGE_SIZES[:3])
    pixels, want_pixels = served.pixels_both_ways(model, preprocess_val, blobs)
    got = served.onnx_embedding(out / "image_encoder.onnx", "pixel_values", pixels)
    with torch.no_grad():
        want = model.encode_image(want_pixels, normalize=True).numpy()
    max_abs = float(np.abs(got - want).max())
    print(f"\n{_label(model)} served images: max abs {max_abs:.1e}")
    assert float(np.abs(pixels - want_pixels.numpy()).max()) <= MAX_ABS
    assert max_abs <= MAX_ABS


def test_without_the_text_models_config_the_build_refuses_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fields = create_tiny_xlmr_clip(tmp_path / "model", seed=0)
    (tmp_path / "model" / "config.json").unlink()
    with pytest.raises(UnsupportedModelError, match="text model's config.json"):
        load_open_clip(fields["arch"])


def test_max_pooler_is_refused_naming_it(tmp_path):
    """open_clip 3.3's own MaxPooler cannot run (a long mask to masked_fill): no reference."""
    fields = create_tiny_xlmr_clip(tmp_path / "model", seed=0)
    config_path = tmp_path / "model" / "open_clip_config.json"
    local = json.loads(config_path.read_text())
    local["model_cfg"]["text_cfg"]["hf_pooler_type"] = "max_pooler"
    config_path.write_text(json.dumps(local))
    with pytest.raises(UnsupportedModelError, match="hf_pooler_type 'max_pooler'"):
        load_open_clip(fields["arch"])
