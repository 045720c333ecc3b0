"""Parts of an open_clip model the served graphs cannot reproduce, refused by name.

Checked on the created model, so architecture names, JSON files and ``local-dir:`` folders
are treated alike. Reproduced exactly (export parity on tiny models,
``tests/unit/generator/families/test_open_clip_support.py`` and the tower tests): text
``pool_type`` first / last / argmax / eos (and CoCa's ``embed_cls``), ``final_ln_after_pool``,
bidirectional text; vision ``pool_type`` tok / avg, ``attentional_pool = true`` (CoCa),
``final_ln_after_pool``; timm ``timm_pool`` '' / avg / token / map, ``timm_proj`` linear /
mlp / none; Hugging Face text towers with the mean, CLS and last-hidden-state CLS poolers.
Refused:

- text or vision ``pool_type = "none"``: ``encode_*`` returns every token's vector, not
  one embedding per input;
- vision ``attentional_pool = "parallel"`` / ``"cascade"`` (open_clip's own "untested, WIP"
  contrastive pooler): ``encode_image`` returns ``[N, 1, D]``;
- timm ``timm_pool = "abs_attn"`` / ``"rot_attn"``: the first resamples its position
  embedding with antialiased bicubic, which ONNX cannot export; the second's export
  fails on batches of another size than the traced one;
- ``hf_pooler_type = "max_pooler"``: open_clip 3.3's ``MaxPooler`` fails in PyTorch itself
  (``masked_fill`` with a long mask), so there is no reference.

No architecture of open_clip 3.3's registry uses any of them.
"""

from __future__ import annotations

from ...declared_kind import UnsupportedModelError

_TIMM_ATTENTION_POOLS = {"AttentionPool2d": "abs_attn", "RotAttentionPool2d": "rot_attn"}


def _problems(model) -> list[str]:
    problems = []
    text = getattr(model, "text", None)
    text_pool = getattr(model, "text_pool_type", None) or getattr(text, "pool_type", None)
    if text_pool == "none" and getattr(text, "cls_emb", None) is None:
        problems.append(
            "text pool_type 'none' (encode_text gives every token's vector, not one embedding)"
        )
    pooler = getattr(text, "pooler", None)
    if type(pooler).__name__ == "MaxPooler":
        problems.append(
            "hf_pooler_type 'max_pooler' (open_clip 3.3's MaxPooler calls masked_fill with a "
            "long mask and fails itself, so there is no reference encode_text; use mean_pooler "
            "or cls_pooler)"
        )
    visual = getattr(model, "visual", None)
    attn_pool_type = getattr(visual, "attn_pool_type", "")
    if attn_pool_type in ("parallel", "cascade"):
        problems.append(
            f"vision attentional_pool {attn_pool_type!r} (open_clip's WIP contrastive pooler: "
            "encode_image gives [N, 1, D])"
        )
    elif getattr(visual, "pool_type", None) == "none" and getattr(visual, "attn_pool", 1) is None:
        problems.append(
            "vision pool_type 'none' (encode_image gives every patch's vector, not one embedding)"
        )
    if type(visual).__name__ == "TimmModel":
        for module in visual.modules():
            pool = _TIMM_ATTENTION_POOLS.get(type(module).__name__)
            if pool and type(module).__module__.startswith("timm."):
                problems.append(
                    f"timm_pool {pool!r} (its ONNX export does not reproduce encode_image)"
                )
                break
    return problems


def check_reproducible(model, arch: str) -> None:
    """Raise :class:`UnsupportedModelError` naming every part of ``model`` not served exactly."""
    problems = _problems(model)
    if problems:
        raise UnsupportedModelError(
            f"arch {arch!r} cannot be served exactly: " + "; ".join(problems)
        )
