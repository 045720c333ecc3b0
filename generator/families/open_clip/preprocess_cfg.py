"""The image preprocessing a manifest entry asks for, resolved the way open_clip resolves it.

open_clip builds a model's eval transform from its ``PreprocessCfg``: the architecture's
defaults (a ``local-dir:`` / ``hf-hub:`` folder's ``preprocess_cfg``), then the pretrained
tag's fields when the weights come from a tag, then the explicit overrides of
``create_model_and_transforms`` (``image_mean``, ``image_std``, ``image_interpolation``,
``image_resize_mode``). A ``checkpoint`` file skips the tag step, so a downloaded
MobileCLIP or SigLIP file gets OpenAI's mean/std, bicubic, shortest side. The manifest
names the tag (``preprocess_of``, looked up in open_clip's in-package registry, nothing
downloaded) and/or sets the fields; they reach open_clip as its own ``force_image_size``
and ``force_preprocess_cfg``, so the transform is open_clip's for that configuration.

A tag only changes preprocessing in open_clip 3.3: the tokenizer comes from the
architecture (``get_tokenizer(arch)``), and a tag's ``quick_gelu`` only warns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ...manifest import ModelEntry

INTERPOLATIONS = ("bicubic", "bilinear")
RESIZE_MODES = ("shortest", "longest", "squash")
IMAGE_SIZE_BOUNDS = (8, 4096)
MEAN_BOUNDS = (0.0, 1.0)
STD_BOUNDS = (1e-6, 10.0)
FILL_COLOR_BOUNDS = (0, 255)
# manifest key -> open_clip PreprocessCfg field
FIELDS = {
    "image_mean": "mean",
    "image_std": "std",
    "image_interpolation": "interpolation",
    "image_resize_mode": "resize_mode",
    "image_fill_color": "fill_color",
}
MANIFEST_KEYS = ("preprocess_of", "image_size", *FIELDS)
_TAG_RE = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]{0,127}/)?[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class PreprocessConfigError(ValueError):
    """The entry's preprocessing cannot be resolved (unknown tag, contradiction)."""


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_entry(where: str, entry: ModelEntry, errors: list[str]) -> None:
    """Manifest checks that need no open_clip: shapes, bounds, choices, exclusions."""
    if entry.preprocess_of is not None:
        if entry.pretrained:
            errors.append(
                f"{where}: preprocess_of is for a checkpoint file; with pretrained "
                f"{entry.pretrained!r} open_clip uses that tag's preprocessing already"
            )
        if not _TAG_RE.match(entry.preprocess_of):
            errors.append(f"{where}: preprocess_of must be '<tag>' or '<arch>/<tag>'")
    if entry.image_size is not None and not (
        IMAGE_SIZE_BOUNDS[0] <= entry.image_size <= IMAGE_SIZE_BOUNDS[1]
    ):
        errors.append(f"{where}: image_size must be within {list(IMAGE_SIZE_BOUNDS)}")
    for key, (low, high) in (("image_mean", MEAN_BOUNDS), ("image_std", STD_BOUNDS)):
        value = getattr(entry, key)
        if value is None:
            continue
        if len(value) != 3 or not all(_is_number(v) for v in value):
            errors.append(f"{where}: {key} must be 3 numbers (R, G, B), got {list(value)!r}")
        elif not all(low <= v <= high for v in value):
            errors.append(f"{where}: {key} values must be within [{low:g}, {high:g}]")
    for key, allowed in (
        ("image_interpolation", INTERPOLATIONS),
        ("image_resize_mode", RESIZE_MODES),
    ):
        if getattr(entry, key) is not None and getattr(entry, key) not in allowed:
            errors.append(f"{where}: {key} must be one of {list(allowed)}")
    fill = entry.image_fill_color
    if fill is not None and not FILL_COLOR_BOUNDS[0] <= fill <= FILL_COLOR_BOUNDS[1]:
        errors.append(f"{where}: image_fill_color must be within {list(FILL_COLOR_BOUNDS)}")
    if fill is not None and entry.image_resize_mode not in (None, "longest"):
        errors.append(
            f"{where}: image_fill_color pads only with image_resize_mode 'longest', "
            f"not {entry.image_resize_mode!r}"
        )


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(float(x) == float(y) for x, y in zip(a, b, strict=True))
    return a == b


@dataclass(frozen=True)
class PreprocessChoice:
    """What the entry sets: a tag, a forced image size, PreprocessCfg fields."""

    tag: str | None = None
    image_size: int | None = None
    overrides: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_entry(cls, entry: ModelEntry) -> PreprocessChoice:
        """The entry's preprocessing keys (validated by :func:`check_entry`)."""
        overrides = {}
        for key, cfg_key in FIELDS.items():
            value = getattr(entry, key)
            if value is not None:
                overrides[cfg_key] = tuple(value) if isinstance(value, list) else value
        return cls(entry.preprocess_of, entry.image_size, overrides)

    def force_preprocess_cfg(self, arch: str) -> dict[str, Any]:
        """``force_preprocess_cfg`` for ``open_clip.create_model``: the tag's, then fields.

        ``arch`` is the architecture name the model is created from; a tag given as
        ``'<arch>/<tag>'`` is looked up under that architecture instead. Raises
        :class:`PreprocessConfigError` for an unknown tag or a field that contradicts it.
        """
        if self.tag is None:
            return dict(self.overrides)
        import open_clip  # noqa: PLC0415

        tag_arch, _, tag = self.tag.rpartition("/")
        tag_arch = tag_arch or arch
        tag_cfg = open_clip.get_pretrained_cfg(tag_arch, tag)
        if not tag_cfg:
            known = open_clip.list_pretrained_tags_by_model(tag_arch)
            hint = f"its tags: {known}" if known else "not an architecture of open_clip's registry"
            raise PreprocessConfigError(
                f"preprocess_of {self.tag!r}: open_clip has no pretrained tag {tag!r} for "
                f"architecture {tag_arch!r} ({hint}); name it as '<arch>/<tag>'"
            )
        from open_clip.transform import merge_preprocess_dict  # noqa: PLC0415

        from_tag = merge_preprocess_dict({}, tag_cfg)
        from_tag.pop("size", None)  # open_clip takes the size from the model, not the tag
        clashes = [
            f"{key} {value!r} (the tag's: {from_tag[key]!r})"
            for key, value in self.overrides.items()
            if key in from_tag and not _same(value, from_tag[key])
        ]
        if clashes:
            raise PreprocessConfigError(
                f"preprocess_of {self.tag!r} and the entry's image_* keys disagree: "
                + ", ".join(clashes)
                + "; drop one of them"
            )
        return {**from_tag, **self.overrides}


def check_resolved(choice: PreprocessChoice, final_cfg: dict[str, Any]) -> None:
    """Refuse a set field that open_clip's final transform ignores (fill without 'longest')."""
    if "fill_color" in choice.overrides and final_cfg.get("resize_mode") != "longest":
        raise PreprocessConfigError(
            f"image_fill_color {choice.overrides['fill_color']} has no effect: the model's "
            f"resize mode is {final_cfg.get('resize_mode')!r}, and only 'longest' pads; set "
            "image_resize_mode = 'longest' or drop image_fill_color"
        )
