"""A checkpoint file's preprocessing set in the manifest equals open_clip's for that config.

``preprocess_of`` names the pretrained tag a file was trained with; the ``image_*`` keys
set the fields. The reference is open_clip itself: for a tag, its own tag path
(``create_model_and_transforms(arch, pretrained=<tag>)`` with the download pointed at
the same file); for fields, ``create_model_and_transforms``'s ``image_*`` /
``force_image_size`` arguments or ``image_transform_v2`` of the same ``PreprocessCfg``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embed_runtime.image.preprocess import PreprocessParams
from generator.families.open_clip.assets import load_open_clip, preprocess_params_from_model
from generator.families.open_clip.preprocess_cfg import PreprocessChoice, PreprocessConfigError
from generator.fixtures.tiny_clip import TINY_ARCH, create_tiny_checkpoint
from generator.fixtures.tiny_clip_towers import create_tiny_tower_model
from generator.manifest import ManifestError, parse_manifest
from tests.unit.generator.families import open_clip_served as served
from tests.unit.generator.families.open_clip_served import open_clip, torch

# Pixels: runtime preprocessing vs open_clip's transform (measured 0.0 .. 1.2e-7).
PIXEL_MAX_ABS = 1e-5
TAG = "MobileCLIP-S1/datacompdr"  # mean 0 / std 1, bilinear, shortest side
IMAGES = served.smooth_pngs(1)


def _served_pixels(params: PreprocessParams) -> np.ndarray:
    return served.served_pixels(IMAGES, params)


def _open_clip_pixels(transform) -> np.ndarray:
    return served.open_clip_pixels(transform, IMAGES).numpy()


@pytest.fixture(scope="module")
def mobileclip(tmp_path_factory) -> dict:
    return create_tiny_tower_model("tiny-mobileclip", tmp_path_factory.mktemp("mc"), seed=0)


@pytest.fixture(scope="module")
def tiny_vit(tmp_path_factory) -> tuple[str, str]:
    ckpt = tmp_path_factory.mktemp("vit") / "tiny.pt"
    create_tiny_checkpoint(ckpt, seed=0)
    return str(ckpt.parent / f"{TINY_ARCH}.json"), str(ckpt)


def test_tag_gives_open_clips_own_tag_preprocessing_for_a_checkpoint_file(mobileclip, monkeypatch):
    arch_json, ckpt = mobileclip["arch"], mobileclip["checkpoint"]
    model, transform, _ = load_open_clip(
        arch_json, checkpoint=ckpt, preprocess=PreprocessChoice(TAG)
    )
    params = preprocess_params_from_model(model)

    # open_clip's own tag path: the same tag config registered for this arch, the
    # "download" answering the same file
    arch_name = Path(arch_json).stem
    tag_cfg = open_clip.get_pretrained_cfg(*TAG.split("/"))
    monkeypatch.setitem(open_clip.pretrained._PRETRAINED, arch_name, {"datacompdr": tag_cfg})
    monkeypatch.setattr(open_clip.factory, "download_pretrained", lambda cfg, cache_dir=None: ckpt)
    ref_model, _, ref_transform = open_clip.create_model_and_transforms(
        arch_name, pretrained="datacompdr"
    )
    assert model.visual.preprocess_cfg == ref_model.visual.preprocess_cfg
    assert (params.mean, params.std, params.interpolation) == ((0.0,) * 3, (1.0,) * 3, "bilinear")
    want = _open_clip_pixels(ref_transform)
    gap = np.abs(_served_pixels(params) - want).max()
    print(f"\ntag {TAG}: served pixels vs open_clip's tag path max abs {gap:.1e}")
    assert gap <= PIXEL_MAX_ABS
    assert np.abs(_open_clip_pixels(transform) - want).max() <= PIXEL_MAX_ABS

    # negative control: the file alone gets open_clip's defaults, far from the tag's pixels
    default_model, _, _ = load_open_clip(arch_json, checkpoint=ckpt)
    default_pixels = _served_pixels(preprocess_params_from_model(default_model))
    assert np.abs(default_pixels - want).max() > 0.5


def test_tag_of_the_entrys_own_arch_resolves_without_arch_prefix():
    cfg = PreprocessChoice("datacompdr").force_preprocess_cfg("MobileCLIP-S1")
    assert cfg == {
        "mean": (0.0, 0.0, 0.0),
        "std": (1.0, 1.0, 1.0),
        "interpolation": "bilinear",
        "resize_mode": "shortest",
    }


@pytest.mark.parametrize(
    "fields",
    [
        # SigLIP's: squash, mean / std 0.5
        {"mean": (0.5,) * 3, "std": (0.5,) * 3, "resize_mode": "squash"},
        {"interpolation": "bilinear", "resize_mode": "longest", "fill_color": 200},
        {"interpolation": "bicubic", "resize_mode": "shortest", "mean": (0.1, 0.2, 0.3)},
    ],
)
def test_explicit_fields_give_open_clips_transform_of_the_same_cfg(tiny_vit, fields):
    arch_json, ckpt = tiny_vit
    model, _, _ = load_open_clip(
        arch_json, checkpoint=ckpt, preprocess=PreprocessChoice(overrides=fields)
    )
    cfg = open_clip.transform.PreprocessCfg(size=64, **fields)
    want = _open_clip_pixels(open_clip.transform.image_transform_v2(cfg, is_train=False))
    gap = np.abs(_served_pixels(preprocess_params_from_model(model)) - want).max()
    assert gap <= PIXEL_MAX_ABS
    if "fill_color" not in fields:  # create_model_and_transforms has no fill argument
        _, _, ref = open_clip.create_model_and_transforms(
            Path(arch_json).stem, pretrained=ckpt, **{f"image_{k}": v for k, v in fields.items()}
        )
        assert np.abs(_open_clip_pixels(ref) - want).max() == 0.0


def test_image_size_is_open_clips_force_image_size(tiny_vit):
    arch_json, ckpt = tiny_vit
    model, transform, _ = load_open_clip(
        arch_json, checkpoint=ckpt, preprocess=PreprocessChoice(image_size=48)
    )
    ref_model, _, ref_transform = open_clip.create_model_and_transforms(
        Path(arch_json).stem, pretrained=ckpt, force_image_size=48
    )
    params = preprocess_params_from_model(model)
    assert params.size == (48, 48)
    want = _open_clip_pixels(ref_transform)
    assert np.abs(_served_pixels(params) - want).max() <= PIXEL_MAX_ABS
    with torch.no_grad():
        got = model.encode_image(torch.from_numpy(want), normalize=True)
        ref = ref_model.encode_image(torch.from_numpy(want), normalize=True)
    assert (got - ref).abs().max().item() <= 1e-6  # same weights, same pos-embed resize


def test_tag_and_a_disagreeing_field_are_refused_naming_both(tiny_vit):
    choice = PreprocessChoice(TAG, overrides={"mean": (0.5, 0.5, 0.5), "interpolation": "bilinear"})
    with pytest.raises(PreprocessConfigError, match=r"mean \(0.5, 0.5, 0.5\) \(the tag's"):
        choice.force_preprocess_cfg("tiny-clip")
    agreeing = PreprocessChoice(TAG, overrides={"interpolation": "bilinear"})
    assert agreeing.force_preprocess_cfg("tiny-clip")["std"] == (1.0, 1.0, 1.0)


def test_unknown_tag_is_refused_naming_the_known_ones():
    with pytest.raises(PreprocessConfigError, match="datacompdr"):
        PreprocessChoice("MobileCLIP-S1/nope").force_preprocess_cfg("x")
    with pytest.raises(PreprocessConfigError, match="not an architecture"):
        PreprocessChoice("webli").force_preprocess_cfg("tiny-clip")


def test_fill_color_that_the_resolved_transform_ignores_is_refused(tiny_vit):
    arch_json, ckpt = tiny_vit
    with pytest.raises(PreprocessConfigError, match="image_fill_color 9 has no effect"):
        load_open_clip(
            arch_json, checkpoint=ckpt, preprocess=PreprocessChoice(overrides={"fill_color": 9})
        )


def _entry(**fields) -> dict:
    return {"name": "m", "family": "open-clip", "arch": "ViT-B-32", "checkpoint": "w.pt", **fields}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"image_size": 4}, "image_size must be within [8, 4096]"),
        ({"image_mean": [0.5, 0.5]}, "image_mean must be 3 numbers"),
        ({"image_std": [0.5, 0.0, 0.5]}, "image_std values must be within"),
        ({"image_mean": [0.5, "a", 0.5]}, "image_mean must be 3 numbers"),
        ({"image_mean": 0.5}, "image_mean must be tuple"),
        ({"image_interpolation": "random"}, "image_interpolation must be one of"),
        ({"image_resize_mode": "crop"}, "image_resize_mode must be one of"),
        ({"image_fill_color": 300}, "image_fill_color must be within"),
        ({"image_fill_color": 1, "image_resize_mode": "squash"}, "pads only with"),
        ({"preprocess_of": "a/b/c"}, "preprocess_of must be '<tag>' or '<arch>/<tag>'"),
        (
            {"preprocess_of": "openai", "checkpoint": None, "pretrained": "openai"},
            "preprocess_of is for a checkpoint file",
        ),
    ],
)
def test_manifest_refuses_bad_preprocess_keys(fields, message):
    raw = {k: v for k, v in _entry(**fields).items() if v is not None}
    with pytest.raises(ManifestError) as exc:
        parse_manifest({"models": [raw]}, Path("."))
    assert any(message in e for e in exc.value.errors), exc.value.errors


def test_manifest_refuses_preprocess_keys_on_a_text_model():
    raw = {"name": "t", "family": "sentence-transformers", "source": "x", "image_size": 224}
    with pytest.raises(ManifestError, match="image_size needs family 'open-clip'"):
        parse_manifest({"models": [raw]}, Path("."))


def test_manifest_takes_valid_preprocess_keys():
    fields = dict(
        preprocess_of="MobileCLIP-S1/datacompdr",
        image_size=256,
        image_mean=[0.0, 0.0, 0.0],
        image_resize_mode="longest",
        image_fill_color=128,
    )
    (entry,) = parse_manifest({"models": [_entry(**fields)]}, Path(".")).models
    choice = PreprocessChoice.from_entry(entry)
    assert choice.tag == "MobileCLIP-S1/datacompdr" and choice.image_size == 256
    assert choice.overrides == {
        "mean": (0.0, 0.0, 0.0),
        "resize_mode": "longest",
        "fill_color": 128,
    }


def test_family_build_serves_the_tags_preprocessing(tiny_vit, tmp_path):
    """The build's preprocess_image step carries the tag's mean / std / interpolation."""
    from generator.families.open_clip.export import build

    arch_json, ckpt = tiny_vit
    raw = {"name": "m", "family": "open-clip", "arch": arch_json, "checkpoint": ckpt}
    manifest = parse_manifest({"models": [{**raw, "preprocess_of": TAG}]}, tmp_path)
    dirs = {d.name: d for d in build(manifest.models[0], manifest, tmp_path)}
    config = dirs["m_preprocess_image"].config
    for key, value in (
        ("mean", "0.0,0.0,0.0"),
        ("std", "1.0,1.0,1.0"),
        ("interpolation", "bilinear"),
    ):
        assert f'key: "{key}"\n  value {{ string_value: "{value}" }}' in config, config
