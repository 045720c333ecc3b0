"""open_clip towers exported to ONNX agree with PyTorch; tiny checkpoints load like real ones.

The full-size ViT-B-32 export (and its served parity) is checked by
``tests/integration/test_clip_full_size.py``.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from generator.families.open_clip import assets as open_clip_assets
from generator.families.open_clip.assets import export_towers, load_open_clip, write_tokenizer_json
from generator.fixtures.tiny_clip import TINY_ARCH, create_tiny_checkpoint, tiny_model_config
from generator.onnx_export import ExportValidationError
from tests.unit.generator.families import open_clip_served as served
from tests.unit.generator.families.open_clip_served import open_clip, ort, torch

# Gates: about 30 x the figures measured on the 2-core CI machine. Export (tiny towers):
# text max abs 1.8e-7, 1-cos 1.5e-13; image 1.2e-7, 3.8e-14 (docs/parity.md, ONNX export
# row: <= 7.2e-7).
EXPORT_MAX_ABS = 6e-6
EXPORT_MAX_COS_GAP = 5e-12
# tokenizer.json + runtime preprocessing + ONNX vs open_clip: text 2.4e-7, image 8.9e-8.
SERVING_PATH_MAX_ABS = 7e-6
TEXTS = ["a photo of a cat", "A DIAGRAM, with “quotes” &amp; entities", "東京の夜景 🌃", "x" * 300]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny checkpoint saved under the name open_clip's ``local-dir:`` loader looks for."""
    ckpt = tmp_path_factory.mktemp("tiny") / "open_clip_pytorch_model.bin"
    cfg = create_tiny_checkpoint(ckpt, seed=0)
    model, preprocess_val, tokenizer = load_open_clip(
        str(ckpt.parent / f"{TINY_ARCH}.json"), checkpoint=str(ckpt)
    )
    return ckpt, cfg, model, preprocess_val, tokenizer


@pytest.fixture(scope="module")
def exported(tiny, tmp_path_factory):
    _, cfg, model, _, _ = tiny
    out = tmp_path_factory.mktemp("onnx")
    reports = export_towers(model, out, cfg["text_cfg"]["context_length"], 64)
    return out, reports


def test_tiny_checkpoint_loads_by_arch_name_and_file(tiny):
    ckpt, cfg, model, _, tokenizer = tiny
    assert cfg == tiny_model_config()
    saved = torch.load(ckpt, weights_only=True)
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    open_clip.add_model_config(ckpt.parent / f"{TINY_ARCH}.json")
    again, _, _ = open_clip.create_model_and_transforms(TINY_ARCH, pretrained=str(ckpt))
    assert all(torch.equal(saved[k], v) for k, v in again.state_dict().items())
    assert isinstance(tokenizer, open_clip.SimpleTokenizer)


def test_tiny_checkpoint_loads_as_local_dir(tiny):
    ckpt, _, _, _, _ = tiny
    model, _, _ = open_clip.create_model_and_transforms(f"local-dir:{ckpt.parent}")
    saved = torch.load(ckpt, weights_only=True)
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())


def test_same_seed_gives_same_weights(tmp_path):
    a = create_tiny_checkpoint(tmp_path / "a" / "w.pt", seed=3)
    create_tiny_checkpoint(tmp_path / "b" / "w.pt", seed=3)
    wa, wb = (torch.load(tmp_path / d / "w.pt", weights_only=True) for d in "ab")
    assert a == tiny_model_config() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_both_towers_export_within_tolerance(exported):
    out, reports = exported
    assert set(reports) == {"text_encoder", "image_encoder"}
    for name, report in reports.items():
        cos_gap = 1.0 - report.min_cosine
        print(f"\ntiny {name}: max abs {report.max_abs_diff:.1e}, 1-cos {cos_gap:.1e}")
        assert report.cases >= 3
        assert report.max_abs_diff <= EXPORT_MAX_ABS, name
        assert cos_gap <= EXPORT_MAX_COS_GAP, name
    for name, input_name in (("text_encoder", "input_ids"), ("image_encoder", "pixel_values")):
        session = ort.InferenceSession(str(out / f"{name}.onnx"))
        assert [i.name for i in session.get_inputs()] == [input_name]
        assert [o.name for o in session.get_outputs()] == ["EMBEDDING"]


def test_serving_path_matches_open_clip_end_to_end(tiny, exported, tmp_path):
    """tokenizer.json + runtime preprocess + ONNX == open_clip tokenizer/transform + PyTorch."""
    _, _, model, preprocess_val, tokenizer = tiny
    out, _ = exported
    params = write_tokenizer_json(tokenizer, tmp_path / "tokenizer.json", 77)
    ids = served.served_ids(tmp_path / "tokenizer.json", TEXTS, params)
    text_emb = served.onnx_embedding(out / "text_encoder.onnx", "input_ids", ids.astype(np.int64))

    rng = np.random.default_rng(0)
    blobs = []
    for size in ((640, 480), (31, 200), (64, 64)):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (*size[::-1], 3), dtype=np.uint8)).save(buf, "PNG")
        blobs.append(buf.getvalue())
    pixels, torch_pixels = served.pixels_both_ways(model, preprocess_val, blobs)
    image_emb = served.onnx_embedding(out / "image_encoder.onnx", "pixel_values", pixels)

    with torch.no_grad():
        want_text = model.encode_text(tokenizer(TEXTS), normalize=True).numpy()
        want_image = model.encode_image(torch_pixels, normalize=True).numpy()
    text_abs, image_abs = np.abs(text_emb - want_text).max(), np.abs(image_emb - want_image).max()
    print(f"\nserving path: text max abs {text_abs:.1e}, image max abs {image_abs:.1e}")
    assert text_emb.shape == (4, 64) and image_emb.shape == (3, 64)
    assert text_abs <= SERVING_PATH_MAX_ABS
    assert image_abs <= SERVING_PATH_MAX_ABS
    assert np.allclose(np.linalg.norm(image_emb, axis=1), 1.0, atol=1e-5)


def test_failures_of_both_towers_are_reported_together(tiny, tmp_path, monkeypatch):
    _, _, model, _, _ = tiny

    def reject(path, spec, module, cases, *args, **kwargs):
        raise ExportValidationError(path, [f"{len(cases)} cases rejected"])

    monkeypatch.setattr(open_clip_assets, "validate_graph", reject)
    with pytest.raises(ExportValidationError) as info:
        export_towers(model, tmp_path, 77, 64)
    assert [f.split(":")[0] for f in info.value.failures] == ["text_encoder", "image_encoder"]


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_both_towers_derive_the_precision_within_its_floor(tiny, tmp_path, precision):
    import onnx

    from generator.precision import PARITY

    _, cfg, model, _, _ = tiny
    reports = export_towers(model, tmp_path, cfg["text_cfg"]["context_length"], 64, None, precision)
    floor = PARITY[precision][1]
    for tower in ("text_encoder", "image_encoder"):
        assert reports[tower].max_abs_diff <= EXPORT_MAX_ABS  # the fp32 export, checked first
        assert floor <= reports[f"{tower}.{precision}"].min_cosine < 1.0
        graph = onnx.load(str(tmp_path / f"{tower}.onnx")).graph
        if precision == "int8":
            assert "MatMulInteger" in {n.op_type for n in graph.node}
        else:
            big = [t for t in graph.initializer if len(t.dims) >= 2]
            assert big and all(t.data_type == onnx.TensorProto.FLOAT16 for t in big)
    assert sorted(p.name for p in tmp_path.glob("*.onnx")) == [
        "image_encoder.onnx",
        "text_encoder.onnx",
    ]
