"""A bare entry takes its device's profile; a key the entry sets wins; every family parses."""

from __future__ import annotations

from pathlib import Path

import pytest

from generator.families import FAMILIES
from generator.manifest import ENTRY_BOUNDS, ModelEntry, load_manifest, parse_manifest
from generator.profiles import PROFILES, profile_defaults

REPO_ROOT = Path(__file__).resolve().parents[3]
ST = {"name": "mini", "family": "sentence-transformers", "source": "some/model"}


def _entry(**fields: object) -> ModelEntry:
    return parse_manifest({"models": [{**ST, **fields}]}, Path("/base")).models[0]


def _bare(family: str, device: str) -> dict:
    required = {"open-clip": {"arch": "ViT-B-32"}}.get(family, {"source": "some/model"})
    return {"name": "m", "family": family, "device": device, **required}


def test_a_bare_cpu_text_entry_gets_the_measured_cpu_settings() -> None:
    entry = _entry()
    assert (entry.max_queue_delay_us, entry.max_rows_per_run, entry.max_padding_share) == (
        0,
        64,
        0.1,
    )
    assert (entry.encoder_instances, entry.fused_tokenize, entry.ort_spin_us) == (2, False, 20)
    assert (entry.max_queue_size, entry.queue_timeout_us) == (1024, 0)
    assert (entry.max_batch_size, entry.ort_threads_shared) == (64, -1)
    # Plain requests queue up to 30 s of work and 8,192 rows; deadlines steer the rest.
    assert (entry.admission_wait_us, entry.admission_max_rows) == (30_000_000, 8192)
    interactive = _entry(admission_wait_us=250_000)  # the opt-in interactive bound
    assert (interactive.admission_wait_us, interactive.admission_max_rows) == (250_000, 8192)
    # The dataclass's own defaults are not what a bare entry is served with any more.
    assert ModelEntry(**ST).max_queue_delay_us == 2000


def test_a_key_the_entry_sets_wins_over_its_profile() -> None:
    entry = _entry(max_queue_delay_us=3000, encoder_instances=1, fused_tokenize=True)
    assert (entry.max_queue_delay_us, entry.encoder_instances, entry.fused_tokenize) == (
        3000,
        1,
        True,
    )
    assert entry.max_rows_per_run == 64  # the keys it left out still come from the profile


def test_gpu_entries_take_the_gpu_profile_by_input_kind() -> None:
    text = _entry(device="gpu")
    assert (text.max_batch_size, text.encoder_instances, text.preprocess_instances) == (512, 8, 8)
    assert text.fused_tokenize is False  # separate tokenizers measured faster on the GPU host
    clip = parse_manifest({"models": [_bare("open-clip", "gpu")]}, Path("/b")).models[0]
    assert (clip.max_batch_size, clip.encoder_instances, clip.preprocess_instances) == (256, 4, 12)
    assert clip.max_batch_pixels == 536_870_912


def test_options_an_entry_cannot_take_are_left_out_of_its_defaults() -> None:
    assert "fused_tokenize" not in profile_defaults("cpu", "sentence-transformers", "onnxruntime")
    assert _entry(encoder_backend="onnxruntime").fused_tokenize is False
    for family in ("open-clip", "sparse-encoder", "multi-vector", "cross-encoder"):
        assert "fused_tokenize" not in profile_defaults("cpu", family, "python-ort")
    assert profile_defaults("tpu", "sentence-transformers", "python-ort") == {}


@pytest.mark.parametrize("device", sorted(PROFILES))
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_bare_entry_of_every_family_parses_on_every_device(family: str, device: str) -> None:
    entry = parse_manifest({"models": [_bare(family, device)]}, Path("/b")).models[0]
    for key, value in profile_defaults(device, family, entry.encoder_backend).items():
        assert getattr(entry, key) == value
        if key in ENTRY_BOUNDS:
            low, high = ENTRY_BOUNDS[key]
            assert low <= value <= high


@pytest.mark.parametrize("path", ["models.toml", "deploy/models.cpu.toml", "deploy/models.toml"])
def test_shipped_text_models_are_served_as_a_bare_entry_would_be(path: str) -> None:
    """The shipped manifests do not copy the profile by hand: their text model resolves to
    exactly what a bare entry of the same source and device gets."""
    shipped = load_manifest(REPO_ROOT / path).get("all-MiniLM-L6-v2")
    bare = _entry(source=shipped.source, device=shipped.device, name=shipped.name)
    for key in profile_defaults(shipped.device, shipped.family, shipped.encoder_backend):
        assert getattr(shipped, key) == getattr(bare, key), key
