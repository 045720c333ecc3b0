"""Pooling variants of open_clip: the reproduced ones export exactly, the rest are refused.

Tiny random-init variants of the tiny ViT CLIP (and a timm ResNet tower) created with
open_clip, saved and loaded as a user loads a checkpoint; exported through the build's
``export_towers`` (parity vs PyTorch) or refused by ``load_open_clip`` naming the part.
The variants the shipped tiny models already cover (argmax, last, CoCa's attentional
pool, timm token / map / avg pools) are tested in their own files.
"""

from __future__ import annotations

import copy
import json

import pytest

torch = pytest.importorskip("torch")
open_clip = pytest.importorskip("open_clip")

from generator.declared_kind import UnsupportedModelError  # noqa: E402
from generator.families.open_clip.assets import (  # noqa: E402
    export_towers,
    load_open_clip,
    preprocess_params_from_model,
)
from generator.fixtures.tiny_clip import tiny_model_config  # noqa: E402

pytestmark = pytest.mark.slow
EXPORT_MAX_ABS = 1e-5  # measured 1.0e-7 .. 3.4e-7


def _variant(text: dict | None = None, vision: dict | None = None) -> dict:
    cfg = copy.deepcopy(tiny_model_config())
    cfg["text_cfg"].update(text or {})
    if vision and "timm_model_name" in vision:
        cfg["vision_cfg"] = dict(vision)
    else:
        cfg["vision_cfg"].update(vision or {})
    return cfg


_TIMM = dict(timm_model_name="resnet18", timm_model_pretrained=False, image_size=64)
REPRODUCED = {
    "text-first": _variant(text={"pool_type": "first"}),
    "text-eos": _variant(text={"pool_type": "eos"}),
    "text-final-ln": _variant(text={"final_ln_after_pool": True}),
    "vision-avg-final-ln": _variant(vision={"pool_type": "avg", "final_ln_after_pool": True}),
    "timm-unpooled-mlp": _variant(vision={**_TIMM, "timm_pool": "", "timm_proj": "mlp"}),
}
REFUSED = {
    "text-none": (_variant(text={"pool_type": "none"}), "text pool_type 'none'"),
    "vision-none": (_variant(vision={"pool_type": "none"}), "vision pool_type 'none'"),
    "vision-parallel": (
        _variant(vision={"attentional_pool": "parallel", "attn_pooler_heads": 2}),
        "vision attentional_pool 'parallel'",
    ),
    "timm-abs-attn": (
        _variant(vision={**_TIMM, "timm_pool": "abs_attn", "timm_proj": "linear"}),
        "timm_pool 'abs_attn'",
    ),
    "timm-rot-attn": (
        _variant(vision={**_TIMM, "timm_pool": "rot_attn", "timm_proj": "linear"}),
        "timm_pool 'rot_attn'",
    ),
}


def _save(name: str, cfg: dict, directory) -> tuple[str, str]:
    arch = directory / f"variant-{name}.json"
    arch.write_text(json.dumps(cfg))
    open_clip.add_model_config(arch)
    torch.manual_seed(0)
    model = open_clip.create_model(arch.stem, pretrained=None)
    torch.save(model.state_dict(), directory / "weights.pt")
    return str(arch), str(directory / "weights.pt")


@pytest.mark.parametrize("name", sorted(REPRODUCED))
def test_reproduced_pooling_exports_exactly(name, tmp_path):
    arch, ckpt = _save(name, REPRODUCED[name], tmp_path)
    model, _, tokenizer = load_open_clip(arch, checkpoint=ckpt)
    size = preprocess_params_from_model(model).size
    reports = export_towers(model, tmp_path, tokenizer.context_length, size, tokenizer)
    worst = {k: r.max_abs_diff for k, r in reports.items()}
    print(f"\n{name}: {worst}")
    assert all(v <= EXPORT_MAX_ABS for v in worst.values())


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_unreproducible_pooling_is_refused_by_name(name, tmp_path):
    cfg, part = REFUSED[name]
    arch, ckpt = _save(name, cfg, tmp_path)
    with pytest.raises(UnsupportedModelError, match="cannot be served exactly") as exc:
        load_open_clip(arch, checkpoint=ckpt)
    assert part in str(exc.value)
