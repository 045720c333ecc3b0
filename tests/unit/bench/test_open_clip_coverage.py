"""The coverage survey reduces configs without changing what is built, and classifies."""

from __future__ import annotations

from pathlib import Path

import pytest

open_clip = pytest.importorskip("open_clip")

from bench.open_clip_coverage import check_one, narrows_timm, reduce_config  # noqa: E402


def test_reduce_config_cuts_layers_and_keeps_the_served_parts():
    cfg = open_clip.get_model_config("coca_ViT-B-32")
    small = reduce_config(cfg)
    assert small["vision_cfg"]["layers"] == 2 and small["text_cfg"]["layers"] == 2
    assert small["multimodal_cfg"]["layers"] == 1
    for key in ("image_size", "patch_size", "attentional_pool", "width"):
        assert small["vision_cfg"].get(key) == cfg["vision_cfg"].get(key)
    assert cfg["vision_cfg"]["layers"] == 12  # the registry's own config is untouched
    narrow = reduce_config(cfg, narrow=True)
    assert narrow["vision_cfg"]["width"] == 128 and narrow["text_cfg"]["heads"] == 2


def test_resnet_keeps_four_stages_of_one_block():
    assert reduce_config(open_clip.get_model_config("RN50"))["vision_cfg"]["layers"] == (1,) * 4


def test_towers_whose_width_is_the_embedding_keep_it():
    siglip = open_clip.get_model_config("ViT-B-16-SigLIP")
    assert not narrows_timm(siglip)  # timm_proj none: the trunk width is the output
    assert narrows_timm(open_clip.get_model_config("convnext_base"))


def test_a_hub_text_model_is_classified_offline_without_creating_it(tmp_path: Path):
    kind, detail = check_one("xlm-roberta-base-ViT-B-32", tmp_path)
    assert kind == "offline" and "xlm-roberta-base" in detail
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_a_clipa_config_builds_exactly_with_strip_sep_token(tmp_path: Path):
    """ViT-L-14-CLIPA names ``strip_sep_token``: served in the tokenizer file, checked."""
    cfg = open_clip.get_model_config("ViT-L-14-CLIPA")
    assert cfg["text_cfg"]["tokenizer_kwargs"] == {"strip_sep_token": True}
    assert check_one("ViT-L-14-CLIPA", tmp_path, narrow=True) == ("exact-stand-in-tokenizer", "")
