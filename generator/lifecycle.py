"""Load, unload, delete and list models at runtime, behind the ``model_manager`` model.

A request is a JSON object, e.g.::

    {"action": "load", "family": "sentence-transformers", "source": "/models/my-st",
     "name": "my-st", "options": {"max_batch_size": 32}}
    {"action": "load", "family": "open-clip", "arch": "ViT-B-32", "pretrained": "laion2b_s34b_b79k"}
    {"action": "load", "family": "cross-encoder", "source": "/models/my-reranker"}
    {"action": "unload", "name": "my-st"}     # until the next restart
    {"action": "delete", "name": "my-st"}     # unload, remove files and the runtime record
    {"action": "list"}

A load appends the entry to ``<repo>/runtime-models.toml`` (so a restart serves the same
set), builds it in a separate worker process (export, validate, render; model dirs are
swapped in atomically) and then loads its ensembles through Triton. This module holds
the logic; Triton is reached through the small :class:`TritonControl` interface so it
is tested without a server.

Every action needs the server's admin key (:meth:`ModelManager.authorize`). A load may
read only folders under the manifest's ``[model_manager] allowed_roots`` and download
from the hub only with ``allow_hub``; sentence-transformers folders whose modules are
not sentence-transformers' own classes (custom code) are refused. Models of the manifest
are never unloaded or deleted through it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from embed_runtime.errors import InvalidInputError, RequestError, UnavailableError

from .admin import ADMIN_HEADER, KEY_ENV, KEY_FILE_ENV, key_matches, presented_keys
from .build import RepositoryWriter, remove_entry
from .declared_kind import UnsupportedModelError, check_served, declared_kind
from .families import FAMILIES, family
from .manager_config import ManagerConfig
from .manifest import (
    RUNTIME_MANIFEST,
    ManagerSettings,
    Manifest,
    ManifestError,
    ModelEntry,
    load_manifest,
    load_serving_manifest,
)
from .manifest_edit import append_entry, remove_entry_text
from .repo_lock import repository_lock
from .shared_models import SHARED_MODELS

ACTIONS = ("load", "unload", "delete", "list")
IDENTITY_KEYS = ("name", "family", "source", "arch", "pretrained", "checkpoint")
OPTION_KEYS = tuple(f.name for f in fields(ModelEntry) if f.name not in IDENTITY_KEYS)
HUB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$")
TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class TritonControl(Protocol):
    """What the manager needs from Triton (``pb_utils`` in the server)."""

    def load(self, name: str) -> None:
        """Load (or reload) model ``name`` from the repository."""

    def unload(self, name: str) -> None:
        """Unload model ``name``."""

    def is_ready(self, name: str) -> bool:
        """Whether ``name`` is loaded and ready."""


class BuildFailedError(RequestError):
    """The worker could not export or validate the model."""


@dataclass(frozen=True)
class ManagerParams:
    """Where the manager works; read from the ``model_manager`` config parameters."""

    manifest: Path
    repo: Path
    worker_python: str
    build_timeout_s: float = ManagerConfig.build_timeout_s
    admin_key: str | None = field(default=None, repr=False)

    @classmethod
    def from_parameters(
        cls, params: dict[str, str], repo: Path, admin_key: str | None = None
    ) -> ManagerParams:
        """Parse string config parameters (:class:`ManagerConfig`); fail loudly on a missing key."""
        config = ManagerConfig.from_parameters(params)
        return cls(
            manifest=Path(config.manifest),
            repo=repo,
            worker_python=config.worker_python,
            build_timeout_s=config.build_timeout_s,
            admin_key=admin_key,
        )


def parse_request(raw: str | bytes) -> dict[str, Any]:
    """Validate a manager request; :class:`InvalidInputError` says what is wrong."""
    try:
        request = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"REQUEST is not valid JSON: {exc}") from None
    if not isinstance(request, dict):
        raise InvalidInputError("REQUEST must be a JSON object")
    action = request.get("action")
    if action not in ACTIONS:
        raise InvalidInputError(f"action must be one of {list(ACTIONS)}, got {action!r}")
    if action in ("unload", "delete") and not isinstance(request.get("name"), str):
        raise InvalidInputError(f"{action} needs a model 'name'")
    if action != "load":
        return request
    for key in IDENTITY_KEYS:
        if key in request and not isinstance(request[key], str):
            raise InvalidInputError(f"{key} must be a string")
    if request.get("family") not in FAMILIES:
        raise InvalidInputError(
            f"unknown family {request.get('family')!r}; expected one of {list(FAMILIES)}"
        )
    options = request.get("options", {})
    if not isinstance(options, dict):
        raise InvalidInputError("options must be a JSON object")
    unknown = sorted(set(options) - set(OPTION_KEYS))
    if unknown:
        raise InvalidInputError(f"unknown options {unknown}; allowed: {list(OPTION_KEYS)}")
    request.setdefault("name", family(request["family"]).default_name(request))
    return request


def _worker_error(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for line in reversed(lines):
        if line.startswith("error:"):
            return line.removeprefix("error:").strip()
    for line in reversed(lines):
        if re.match(r"^[A-Za-z_.]+(Error|Exception)\b", line):
            return line[:800]
    return lines[-1][:800] if lines else "no output"


class ModelManager:
    """Serialises lifecycle actions on one repository."""

    def __init__(self, params: ManagerParams, triton: TritonControl):
        self.params = params
        self.triton = triton
        self.runtime_manifest = params.repo / RUNTIME_MANIFEST

    def authorize(self, parameters: dict[str, Any]) -> None:
        """Refuse a request that does not carry the server's admin key.

        ``parameters`` are the request's parameters (Triton forwards ``X-Admin-Key``
        there). Without a configured key every request is refused.
        """
        if not self.params.admin_key:
            raise UnavailableError(
                f"model_manager is disabled: the server has no admin key (set {KEY_ENV} or "
                f"{KEY_FILE_ENV} and restart; docs/security.md)"
            )
        if not any(key_matches(k, self.params.admin_key) for k in presented_keys(parameters)):
            raise InvalidInputError(
                f"model_manager needs the server's admin key in the {ADMIN_HEADER} header"
            )

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        """Run one parsed request; return the JSON-able answer."""
        action = request["action"]
        if action == "list":
            return self.list_models()
        if action in ("load", "delete") and not os.access(self.params.repo, os.W_OK):
            raise UnavailableError(
                f"{action} needs a writable model repository, and this server's is read-only "
                "(Docker: the runtime-loads override, docs/deployment.md)"
            )
        if action == "load":
            return self.load(request)
        return self.remove(request["name"], delete=action == "delete")

    def _serving(self) -> Manifest:
        try:
            return load_serving_manifest(self.params.manifest, self.params.repo)
        except ManifestError as exc:
            raise RequestError(str(exc)) from None

    def list_models(self) -> dict[str, Any]:
        """Every model of the manifest and the runtime record, with readiness."""
        manifest = self._serving()
        models = []
        for entry in manifest.models:
            ready = {name: self.triton.is_ready(name) for name in entry.ensembles}
            models.append(
                {
                    "name": entry.name,
                    "family": entry.family,
                    "origin": "runtime" if entry.name in manifest.runtime else "manifest",
                    "ensembles": list(entry.ensembles),
                    "ready": all(ready.values()),
                }
            )
        return {"models": models}

    @staticmethod
    def _allowed_path(value: str, key: str, settings: ManagerSettings, want_dir: bool) -> str:
        """``value`` resolved, if it lies under an allowed root and exists."""
        path = Path(value).expanduser()
        if not path.is_absolute():
            raise InvalidInputError(f"{key} must be an absolute path on the server")
        resolved = path.resolve()
        roots = [Path(r).resolve() for r in settings.allowed_roots]
        if not any(resolved == root or resolved.is_relative_to(root) for root in roots):
            raise InvalidInputError(
                f"{key} {value!r} is outside the folders runtime loads may read "
                "([model_manager] allowed_roots in the manifest)"
            )
        if not (resolved.is_dir() if want_dir else resolved.is_file()):
            kind = "folder" if want_dir else "file"
            raise InvalidInputError(f"{key} {value!r} is not a {kind} on the server")
        return str(resolved)

    @staticmethod
    def _hub(value: str, key: str, settings: ManagerSettings, pattern: re.Pattern) -> str:
        if not pattern.match(value) or ".." in value:
            raise InvalidInputError(f"{key} {value!r} is not a valid name")
        if not settings.allow_hub:
            raise InvalidInputError(
                f"{key} {value!r} needs a download, and hub downloads are off "
                "([model_manager] allow_hub in the manifest)"
            )
        return value

    def _source_fields(self, request: dict[str, Any], settings: ManagerSettings) -> dict:
        """The identity fields of a load, each checked against what the server may read."""
        out: dict[str, Any] = {"name": request["name"], "family": request["family"]}
        source = request.get("source")
        if source is not None:
            if source.startswith("package:"):
                raise InvalidInputError("package: sources are only allowed in the manifest")
            if source.startswith("."):
                raise InvalidInputError("source must be an absolute path on the server or a hub id")
            if source.startswith(("/", "~")):
                out["source"] = self._allowed_path(source, "source", settings, want_dir=True)
                declared = family(request["family"])
                if declared.check_folder is None:
                    raise InvalidInputError(f"family {declared.name!r} takes no source folder")
                declared.check_folder(Path(out["source"]))  # no custom code
                if declared.served is not None:  # the kind the folder declares
                    try:
                        kind = declared_kind(Path(out["source"]))
                        check_served(declared.name, declared.served, kind, request["name"])
                    except UnsupportedModelError as exc:
                        raise InvalidInputError(str(exc)) from None
            else:
                out["source"] = self._hub(source, "source", settings, HUB_ID_RE)
        arch = request.get("arch")
        if arch is not None:
            if arch.startswith("hf-hub:"):
                self._hub(arch.removeprefix("hf-hub:"), "arch", settings, HUB_ID_RE)
                out["arch"] = arch
            elif arch.startswith("local-dir:"):
                folder = self._allowed_path(arch.removeprefix("local-dir:"), "arch", settings, True)
                out["arch"] = f"local-dir:{folder}"
            elif arch.endswith(".json") or "/" in arch:
                out["arch"] = self._allowed_path(arch, "arch", settings, want_dir=False)
            elif TAG_RE.match(arch):
                out["arch"] = arch
            else:
                raise InvalidInputError(f"arch {arch!r} is not a valid open_clip name")
        if request.get("pretrained") is not None:
            out["pretrained"] = self._hub(request["pretrained"], "pretrained", settings, TAG_RE)
        if request.get("checkpoint") is not None:
            out["checkpoint"] = self._allowed_path(
                request["checkpoint"], "checkpoint", settings, want_dir=False
            )
        return out

    def _check_new_name(self, name: str, family: str, current: Manifest) -> None:
        """Refuse a new name any of whose model dirs (steps included) is taken or exists."""
        dirs = set(ModelEntry(name=name, family=family).model_dirs)
        taken = set(SHARED_MODELS)
        for entry in current.models:
            taken |= {entry.name, *entry.model_dirs}
        state = RepositoryWriter(self.params.repo).load_state()
        for key, record in state.items():
            taken |= {key.removeprefix("shared:"), *record.get("dirs", [])}
        clash = sorted(d for d in dirs | {name} if d in taken or (self.params.repo / d).exists())
        if clash:
            raise InvalidInputError(
                f"name {name!r} collides with existing models {clash}: choose another name"
            )

    def load(self, request: dict[str, Any]) -> dict[str, Any]:
        """Build (if needed) and load one model; a no-op if it is already loaded."""
        name = request["name"]
        main = load_manifest(self.params.manifest)
        settings = main.model_manager
        taken = {n for e in main.models for n in (e.name, *e.model_dirs)} | set(SHARED_MODELS)
        if name in taken:
            raise InvalidInputError(f"name {name!r} collides with a model served from the manifest")
        with repository_lock(self.params.repo):
            current = self._serving()
            new = name not in current.runtime
            if not new:
                entry = current.get(name)
                if all(self.triton.is_ready(n) for n in entry.ensembles):
                    return {
                        "status": "already_loaded",
                        "name": name,
                        "ensembles": list(entry.ensembles),
                    }
            else:
                if len(current.runtime) >= settings.max_runtime_models:
                    raise InvalidInputError(
                        f"the server already holds {len(current.runtime)} runtime models, its "
                        f"quota ([model_manager] max_runtime_models = "
                        f"{settings.max_runtime_models}); delete one first"
                    )
                fields_ = self._source_fields(request, settings)
                self._check_new_name(name, request["family"], current)
                try:
                    append_entry(self.runtime_manifest, {**fields_, **request.get("options", {})})
                except (ManifestError, ValueError) as exc:
                    raise InvalidInputError(str(exc)) from None
        start = time.monotonic()
        try:
            self._build(name)
            entry = self._serving().get(name)
            for ensemble in entry.ensembles:
                self.triton.load(ensemble)
        except Exception:
            if new:
                self._forget(name)
            raise
        return {
            "status": "loaded",
            "name": name,
            "ensembles": list(entry.ensembles),
            "seconds": round(time.monotonic() - start, 1),
        }

    def _build(self, name: str) -> None:
        cmd = [
            self.params.worker_python,
            "-m",
            "generator",
            "--manifest",
            str(self.params.manifest),
            "--repo",
            str(self.params.repo),
            "build",
            "--only",
            name,
        ]
        try:
            done = subprocess.run(  # noqa: S603 - fixed interpreter and arguments
                cmd,
                capture_output=True,
                encoding="utf-8",
                errors="replace",
                timeout=self.params.build_timeout_s,
                cwd=self.params.manifest.parent,
            )
        except subprocess.TimeoutExpired:
            raise BuildFailedError(
                f"building {name!r} took longer than {self.params.build_timeout_s:.0f} s"
            ) from None
        if done.returncode != 0:
            reason = _worker_error(done.stderr)
            if "offline" in reason.lower() or "couldn't connect" in reason.lower():
                raise UnavailableError(f"cannot fetch {name!r}: {reason}")
            raise BuildFailedError(f"building {name!r} failed: {reason}")

    def _forget(self, name: str) -> None:
        """Undo a failed first load: unload what did load, drop files and the record."""
        with repository_lock(self.params.repo):
            writer = RepositoryWriter(self.params.repo)
            for model in writer.load_state().get(name, {}).get("dirs", []):
                if model not in SHARED_MODELS and self.triton.is_ready(model):
                    self.triton.unload(model)
            remove_entry(self.params.repo, name)
            try:
                remove_entry_text(self.runtime_manifest, name)
            except (KeyError, FileNotFoundError):
                pass

    def remove(self, name: str, delete: bool) -> dict[str, Any]:
        """Unload a runtime model (and with ``delete``, remove its files and record)."""
        manifest = self._serving()
        if name not in {e.name for e in manifest.models}:
            raise InvalidInputError(f"unknown model {name!r}")
        if name not in manifest.runtime:
            action = "deleted" if delete else "unloaded"
            raise InvalidInputError(
                f"{name!r} is served from the manifest and cannot be {action} at runtime; "
                "change the manifest instead (generator remove) and restart"
            )
        entry = manifest.get(name)
        dirs = RepositoryWriter(self.params.repo).load_state().get(name, {}).get("dirs", [])
        ensembles = list(entry.ensembles)
        steps = [d for d in dirs if d not in ensembles and d not in SHARED_MODELS]
        for model in ensembles + steps:
            if self.triton.is_ready(model):
                self.triton.unload(model)
        if delete:
            with repository_lock(self.params.repo):
                remove_entry(self.params.repo, name)
                remove_entry_text(self.runtime_manifest, name)
        return {
            "status": "deleted" if delete else "unloaded",
            "name": name,
            "models": ensembles + steps,
        }
