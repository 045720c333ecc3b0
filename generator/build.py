"""Write the model repository for a manifest: one entry at a time, atomically.

An entry is rebuilt only when its fingerprint (manifest fields, generator code, source
files) changed, so a second start skips the export and starts in seconds. Model
directories are assembled under ``.generator/staging`` and swapped in with a rename.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import embed_runtime
from embed_runtime.ops.integrity import write_digests
from embed_runtime.steps import Adapter

from .cache_check import check_weight_cache
from .families import family
from .manifest import Manifest, ModelEntry
from .model_dir import ModelDir
from .repo_lock import repository_lock
from .shared_models import shared_model_dirs
from .tickets import wire_tickets

GENERATOR = Path(__file__).parent
RUNTIME = Path(embed_runtime.__file__).parent
RUNTIME_PACKAGE = RUNTIME.name
STATE_DIR = ".generator"
STATE_FILE = ".generator-state.json"
CODE_ROOTS = (GENERATOR, RUNTIME)
# Libraries whose upgrade can change an exported graph, a tokenizer file or a reference.
BUILD_LIBRARIES = (
    "torch",
    "transformers",
    "sentence-transformers",
    "open_clip_torch",
    "onnx",
    "onnxruntime",
    "onnxruntime-gpu",
    "tokenizers",
    "numpy",
)


@dataclass
class BuildReport:
    """What a build did, entry by entry."""

    built: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


def family_builder(name: str) -> Callable:
    """``build(entry, manifest, work)`` of family ``name`` (imported now: it pulls in torch)."""
    return family(name).builder()


def adapter_path(adapter: Adapter) -> Path:
    """The ``model.py`` source of a step: ``embed_runtime/models/<adapter>.py``.

    model_manager's is the exception: it drives the build side, so it lives in ``generator/``.
    """
    if adapter == Adapter.MODEL_MANAGER:
        return GENERATOR / "manager_model.py"
    return RUNTIME / "models" / f"{adapter.value}.py"


def code_files() -> list[Path]:
    """Every file of the code a build can run or copy: all of ``generator/`` and ``embed_runtime/``.

    The whole packages, not a list of the modules known to shape a build: a list goes stale
    (families/common.py, text_export.py, precision.py, calibration/ were once missing from it,
    so editing them left models "unchanged"). Bytecode and editor scratch files are left out.
    """
    files = []
    for root in CODE_ROOTS:
        for path in root.rglob("*"):
            rel = path.relative_to(root).parts
            if (
                path.is_file()
                and "__pycache__" not in rel
                and not any(part.startswith(".") for part in rel)
                and not path.name.endswith(("~", ".pyc", ".pyo"))
            ):
                files.append(path)
    return sorted(files)


def installed_version(distribution: str) -> str:
    """The installed version of ``distribution``, or ``"absent"``."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "absent"


def code_fingerprint() -> str:
    """Hash of the code that shapes a built model dir: our packages and the build libraries.

    One for every entry: families share modules, so each family's code is in it.
    """
    digest = hashlib.sha256()
    for path in code_files():
        root = next(r for r in CODE_ROOTS if path.is_relative_to(r))
        digest.update(str(path.relative_to(root.parent)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    for name in BUILD_LIBRARIES:
        digest.update(f"{name}=={installed_version(name)}\0".encode())
    return digest.hexdigest()


def _source_fingerprint(entry: ModelEntry, manifest: Manifest) -> str:
    """Sizes and mtimes of local source files (a changed checkpoint triggers a rebuild)."""
    parts = []
    for value in (entry.source, entry.checkpoint):
        if not value or value.startswith("package:"):
            continue
        path = Path(value).expanduser()
        path = path if path.is_absolute() else manifest.base_dir / path
        if path.is_file():
            parts.append(f"{path}:{path.stat().st_size}:{path.stat().st_mtime_ns}")
        elif path.is_dir():
            for f in sorted(p for p in path.rglob("*") if p.is_file()):
                parts.append(f"{f}:{f.stat().st_size}:{f.stat().st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def entry_fingerprint(entry: ModelEntry, manifest: Manifest) -> str:
    """Fingerprint of everything a built entry depends on."""
    payload = {
        "entry": entry.to_dict(),
        "code": code_fingerprint(),
        "source": _source_fingerprint(entry, manifest),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


class RepositoryWriter:
    """Reads and writes one model repository and its build state."""

    def __init__(self, repo: Path):
        self.repo = repo.resolve()
        self.state_dir = self.repo / STATE_DIR
        self.state_file = self.repo / STATE_FILE

    def load_state(self) -> dict[str, dict]:
        """Fingerprint and model dirs of every built entry."""
        if not self.state_file.is_file():
            return {}
        return json.loads(self.state_file.read_text(encoding="utf-8"))

    def save_state(self, state: dict[str, dict]) -> None:
        """Write the state atomically."""
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2, sort_keys=True), encoding="utf-8")
        tmp.replace(self.state_file)

    def is_current(self, name: str, fingerprint: str, state: dict[str, dict]) -> bool:
        """Whether ``name`` was built with ``fingerprint`` and its dirs are all there."""
        record = state.get(name)
        if not record or record["fingerprint"] != fingerprint:
            return False
        return all((self.repo / d / "config.pbtxt").is_file() for d in record["dirs"])

    def write(self, model: ModelDir) -> None:
        """Assemble ``model`` in staging, then swap it into the repository."""
        self.swap_in(self.stage(model), model.name)

    def stage(self, model: ModelDir) -> Path:
        """Assemble ``model`` under the scratch dir; returns where it was staged."""
        staging = self.state_dir / "staging" / model.name
        shutil.rmtree(staging, ignore_errors=True)
        version = staging / "1"
        version.mkdir(parents=True)
        (staging / "config.pbtxt").write_text(model.config, encoding="utf-8")
        if model.adapter:
            shutil.copy2(adapter_path(model.adapter), version / "model.py")
            shutil.copytree(
                RUNTIME,
                version / RUNTIME_PACKAGE,
                ignore=shutil.ignore_patterns("__pycache__", "models"),
            )
        for rel, src in model.files.items():
            shutil.copy2(src, version / rel)
        if model.files:  # checked by the model's own stub when it loads them
            write_digests(str(version), model.files)
        return staging

    def swap_in(self, staging: Path, name: str) -> None:
        """Replace the repository's ``name`` dir with a staged one (two renames)."""
        target = self.repo / name
        trash = self.state_dir / "trash" / f"{target.name}-{time.time_ns()}"
        if target.exists():
            trash.parent.mkdir(parents=True, exist_ok=True)
            target.rename(trash)
        staging.rename(target)
        shutil.rmtree(trash, ignore_errors=True)

    def clean(self) -> None:
        """Drop the scratch dir (staging, work, trash) so Triton's index does not list it."""
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def remove(self, name: str) -> None:
        """Delete one model dir (moved aside first, so the removal is atomic)."""
        target = self.repo / name
        if target.exists():
            trash = self.state_dir / "trash" / f"{name}-{time.time_ns()}"
            trash.parent.mkdir(parents=True, exist_ok=True)
            target.rename(trash)
            shutil.rmtree(trash, ignore_errors=True)


def build_repository(
    manifest: Manifest,
    repo: Path,
    only: Iterable[str] | None = None,
    force: bool = False,
    log=print,
) -> BuildReport:
    """Build every (or each ``only``) entry of ``manifest`` into ``repo`` (under its lock)."""
    with repository_lock(repo):
        return _build_locked(manifest, repo, only, force, log)


def _build_locked(manifest, repo, only, force, log) -> BuildReport:
    writer = RepositoryWriter(repo)
    writer.repo.mkdir(parents=True, exist_ok=True)
    state = writer.load_state()
    report = BuildReport()
    wanted = set(only) if only else None
    for entry in manifest.models:
        if wanted is not None and entry.name not in wanted:
            continue
        fingerprint = entry_fingerprint(entry, manifest)
        if not force and writer.is_current(entry.name, fingerprint, state):
            report.skipped.append(entry.name)
            continue
        log(f"building {entry.name} ({entry.family}) ...")
        start = time.monotonic()
        work = writer.state_dir / "work" / entry.name
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        try:
            dirs = wire_tickets(family_builder(entry.family)(entry, manifest, work))
            check_weight_cache(dirs, log)  # each graph run from its cached copy too
            staged = [(writer.stage(model), model.name) for model in dirs]
            for path, name in staged:
                writer.swap_in(path, name)
        except BaseException:
            writer.clean()
            raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
        _remove_dropped(writer, state, entry.name, [d.name for d in dirs])
        state[entry.name] = {"fingerprint": fingerprint, "dirs": [d.name for d in dirs]}
        writer.save_state(state)
        report.built.append(entry.name)
        report.seconds[entry.name] = round(time.monotonic() - start, 1)
    _build_shared(manifest, writer, state, report, force)
    if wanted is None:
        _remove_stale(manifest, writer, state, report)
    writer.save_state(state)
    writer.clean()
    return report


def _remove_dropped(writer, state, name: str, dirs: list[str]) -> None:
    """Delete dirs an entry's previous build wrote and this one no longer does.

    Turning ``fused_tokenize`` on drops ``<name>_tokenize``; left in place, a server
    started in ``none`` or ``poll`` mode would still load it.
    """
    others = {d for key, record in state.items() if key != name for d in record["dirs"]}
    for old in sorted(set(state.get(name, {}).get("dirs", [])) - set(dirs) - others):
        writer.remove(old)


def _build_shared(manifest: Manifest, writer, state, report, force: bool) -> None:
    for model, fingerprint in shared_model_dirs(manifest, code_fingerprint()):
        key = f"shared:{model.name}"
        if not force and writer.is_current(key, fingerprint, state):
            continue
        writer.write(model)
        state[key] = {"fingerprint": fingerprint, "dirs": [model.name]}
        report.built.append(model.name)


def _remove_stale(manifest: Manifest, writer, state, report) -> None:
    keep = {e.name for e in manifest.models}
    keep |= {f"shared:{m.name}" for m, _ in shared_model_dirs(manifest, "")}
    for key in sorted(set(state) - keep):
        for name in state.pop(key)["dirs"]:
            writer.remove(name)
        report.removed.append(key)


def remove_entry(repo: Path, name: str) -> list[str]:
    """Delete the model dirs built for entry ``name``; returns the dirs removed."""
    with repository_lock(repo):
        writer = RepositoryWriter(repo)
        state = writer.load_state()
        record = state.pop(name, None)
        if record is None:
            return []
        for model in record["dirs"]:
            writer.remove(model)
        writer.save_state(state)
        return record["dirs"]
