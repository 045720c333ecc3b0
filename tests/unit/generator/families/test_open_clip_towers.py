"""OpenCLIP models beyond classic CLIP export and serve like open_clip in PyTorch.

Tiny random-init models shaped like MobileCLIP-S1, EVA02-B-16 and PE-Core-B-16
(``CustomTextCLIP`` with timm image towers), coca_ViT-B-32 (``CoCa``) and
ViT-B-16-SigLIP (timm ``map`` pool, Hugging Face tokenizer)
(:mod:`generator.fixtures.tiny_clip_towers`): the served path (tokenizer.json, runtime
preprocessing, ONNX) against open_clip's tokenizer,
transform and ``encode_text`` / ``encode_image``. The served tokenizer of an
``HFTokenizer`` is checked in ``test_open_clip_hf_tokenizer.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from generator.families.open_clip.assets import (
    embedding_dim,
    load_open_clip,
    preprocess_params_from_model,
    write_tokenizer_json,
)
from generator.families.open_clip.export import _vocab_size
from generator.families.open_clip.hf_tokenizer import is_hf_tokenizer, write_hf_tokenizer_json
from generator.fixtures.tiny_clip_towers import CONFIGS, create_tiny_tower_model
from tests.unit.generator.families import open_clip_served as served
from tests.unit.generator.families.open_clip_served import open_clip, torch

# Gates: measured on the 2-core machine, export max abs 1.5e-7 .. 4.7e-7 (every arch);
# the served path (tokenizer.json + runtime preprocessing + ONNX vs open_clip) below.
EXPORT_MAX_ABS = 1e-5
SERVING_MAX_ABS = 1e-5
PIXEL_MAX_ABS = 1e-5
TEXTS = ["a photo of a cat", "A DIAGRAM, with “quotes” &amp; entities", "東京の夜景 🌃", "x" * 300]
KINDS = {
    "tiny-coca": "CoCa",
    "tiny-eva": "CustomTextCLIP",
    "tiny-mobileclip": "CustomTextCLIP",
    "tiny-pe-core": "CustomTextCLIP",
    "tiny-siglip": "CustomTextCLIP",
}
# tiny-siglip-mid is tiny-siglip with another logit scale and bias (the scores test's)
ARCHS = sorted(KINDS)
assert set(CONFIGS) == {*KINDS, "tiny-siglip-mid"}


@pytest.fixture(scope="module", params=ARCHS)
def built(request, tmp_path_factory):
    """(arch, model, open_clip transform, tokenizer, folder with the exported graphs)."""
    arch = request.param
    out = tmp_path_factory.mktemp(arch)
    fields = create_tiny_tower_model(arch, out / "model", seed=0)
    model, preprocess_val, tokenizer, reports = served.export_tiny(fields, out)
    return arch, model, preprocess_val, tokenizer, out, reports


def test_model_is_the_kind_it_stands_for(built):
    arch, model, _, tokenizer, _, _ = built
    assert type(model).__name__ == KINDS[arch]
    assert not hasattr(model, "text_projection")  # what the build used to read
    assert is_hf_tokenizer(tokenizer) == (arch == "tiny-siglip")


def test_width_and_vocabulary_are_read_through_open_clip(built):
    arch, model, _, tokenizer, _, _ = built
    size = preprocess_params_from_model(model).size
    with torch.no_grad():
        width = model.encode_image(torch.zeros(2, 3, *size)).shape[-1]
    assert (
        embedding_dim(model, tokenizer.context_length, size) == width == CONFIGS[arch]["embed_dim"]
    )
    assert _vocab_size(model) == CONFIGS[arch]["text_cfg"]["vocab_size"]


def test_towers_export_within_tolerance(built):
    arch, _, _, _, out, reports = built
    assert set(reports) == {"text_encoder", "image_encoder"}
    for name, report in reports.items():
        print(f"\n{arch} {name}: max abs {report.max_abs_diff:.1e}")
        assert report.cases >= 3
        assert report.max_abs_diff <= EXPORT_MAX_ABS, name
        assert (out / f"{name}.onnx").is_file()


def test_served_text_path_matches_open_clip(built, tmp_path):
    arch, model, _, tokenizer, out, _ = built
    path = tmp_path / "tokenizer.json"
    context = tokenizer.context_length
    if is_hf_tokenizer(tokenizer):
        params = write_hf_tokenizer_json(tokenizer, path, context)
    else:
        params = write_tokenizer_json(tokenizer, path, context)
    ids = served.served_ids(path, TEXTS, params)
    want_ids = tokenizer(TEXTS).numpy()
    assert np.array_equal(ids, want_ids)
    got = served.onnx_embedding(out / "text_encoder.onnx", "input_ids", ids.astype(np.int64))
    with torch.no_grad():
        want = model.encode_text(tokenizer(TEXTS), normalize=True).numpy()
    max_abs = float(np.abs(got - want).max())
    print(f"\n{arch} served text path: max abs {max_abs:.1e}")
    assert got.shape == (len(TEXTS), CONFIGS[arch]["embed_dim"])
    assert max_abs <= SERVING_MAX_ABS


def test_served_image_path_matches_open_clip(built):
    """Runtime pixels equal open_clip's transform; the ONNX tower on each equals PyTorch."""
    arch, model, preprocess_val, _, out, _ = built
    pixels, want_pixels = served.pixels_both_ways(model, preprocess_val, served.smooth_pngs(0))
    pixel_abs = float(np.abs(pixels - want_pixels.numpy()).max())
    graph = out / "image_encoder.onnx"
    got = served.onnx_embedding(graph, "pixel_values", pixels)
    got_on_reference = served.onnx_embedding(graph, "pixel_values", want_pixels.numpy())
    with torch.no_grad():
        want = model.encode_image(want_pixels, normalize=True).numpy()
    served_abs = float(np.abs(got - want).max())
    graph_abs = float(np.abs(got_on_reference - want).max())
    spread = float((1 - want @ want.T).max())
    print(
        f"\n{arch} image: pixels max abs {pixel_abs:.1e}, served {served_abs:.1e}, "
        f"graph on open_clip's pixels {graph_abs:.1e}, 1-cos between images {spread:.1e}"
    )
    assert pixel_abs <= PIXEL_MAX_ABS
    assert served_abs <= SERVING_MAX_ABS
    assert graph_abs <= SERVING_MAX_ABS
    assert spread >= 1e-3  # the tiny towers tell these images apart


def test_siglip_preprocessing_comes_from_the_local_dir(tmp_path):
    fields = create_tiny_tower_model("tiny-siglip", tmp_path / "siglip", seed=0)
    model, _, _ = load_open_clip(fields["arch"])
    params = preprocess_params_from_model(model)
    assert params.resize_mode == "squash" and params.size == (32, 32)
    assert params.mean == (0.5, 0.5, 0.5) and params.std == (0.5, 0.5, 0.5)


@pytest.mark.slow
@pytest.mark.parametrize(
    "arch", ["MobileCLIP-S1", "EVA02-B-16", "coca_ViT-B-32", "ViT-B-16-SigLIP", "PE-Core-B-16"]
)
def test_real_architectures_give_width_and_vocabulary(arch):
    """open_clip 3.3's own configs (random init, about 10-15 s each): what used to crash."""
    torch.manual_seed(0)
    model = open_clip.create_model(arch, pretrained=None).eval()
    cfg = open_clip.get_model_config(arch)
    size = preprocess_params_from_model(model).size
    assert embedding_dim(model, cfg["text_cfg"]["context_length"], size) == cfg["embed_dim"]
    assert _vocab_size(model) == cfg["text_cfg"]["vocab_size"]
