"""Load, unload, delete and list models at runtime, behind the ``model_manager`` model.

A request is a JSON object, e.g.::

    {"action": "load", "family": "sentence-transformers", "source": "/models/my-st",
     "name": "my-st", "options": {"max_batch_size": 32}}
    {"action": "load", "family": "open-clip", "arch": "ViT-B-32", "pretrained": "laion2b_s34b_b79k"}
    {"action": "unload", "name": "my-st"}     # until the next restart
    {"action": "delete", "name": "my-st"}     # unload, remove files and the runtime record
    {"action": "list"}

A load appends the entry to ``<repo>/runtime-models.toml`` (so a restart serves the same
set), builds it in a separate worker process (export, validate, render; model dirs are
swapped in atomically) and then loads its ensembles through Triton. This module holds
the logic; Triton is reached through the small :class:`TritonControl` interface so it
is tested without a server.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol

from .build import RepositoryWriter, remove_entry
from .manifest import (
    FAMILIES,
    RUNTIME_MANIFEST,
    ManifestError,
    ModelEntry,
    load_manifest,
    load_serving_manifest,
)
from .manifest_edit import append_entry, remove_entry_text
from .runtime.errors import InvalidInputError, RequestError, UnavailableError
from .shared_models import SHARED_MODELS

ACTIONS = ("load", "unload", "delete", "list")
IDENTITY_KEYS = ("name", "family", "source", "arch", "pretrained", "checkpoint")
OPTION_KEYS = tuple(f.name for f in fields(ModelEntry) if f.name not in IDENTITY_KEYS)


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
    build_timeout_s: float = 1800.0

    @classmethod
    def from_parameters(cls, params: dict[str, str], repo: Path) -> ManagerParams:
        """Parse string config parameters; fail loudly on a missing key."""
        try:
            return cls(
                manifest=Path(params["manifest"]),
                repo=repo,
                worker_python=params["worker_python"],
                build_timeout_s=float(params.get("build_timeout_s", "1800")),
            )
        except KeyError as exc:
            raise ValueError(f"model_manager parameter {exc.args[0]!r} is missing") from exc


def _default_name(request: dict[str, Any]) -> str:
    if request["family"] == "open-clip":
        base = "-".join(p for p in (request.get("arch"), request.get("pretrained")) if p)
    else:
        base = str(request.get("source", "")).rstrip("/").split("/")[-1]
    return re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip("-.") or "model"


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
    request.setdefault("name", _default_name(request))
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

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        """Run one parsed request; return the JSON-able answer."""
        action = request["action"]
        if action == "list":
            return self.list_models()
        if action == "load":
            return self.load(request)
        return self.remove(request["name"], delete=action == "delete")

    def _serving(self):
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

    def _entry_fields(self, request: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"name": request["name"], "family": request["family"]}
        for key in ("source", "arch", "pretrained", "checkpoint"):
            value = request.get(key)
            if value is None:
                continue
            path = Path(str(value)).expanduser()
            local = key == "checkpoint" or str(value).startswith(("/", ".", "~"))
            if local and not path.exists():
                raise InvalidInputError(f"{key} {str(value)!r} does not exist on the server")
            out[key] = str(path.resolve()) if local or path.exists() else value
        out.update(request.get("options", {}))
        return out

    def load(self, request: dict[str, Any]) -> dict[str, Any]:
        """Build (if needed) and load one model; a no-op if it is already loaded."""
        name = request["name"]
        main = load_manifest(self.params.manifest)
        taken = {n for e in main.models for n in {e.name, *e.ensembles}} | set(SHARED_MODELS)
        if name in taken:
            raise InvalidInputError(f"name {name!r} collides with a model served from the manifest")
        current = self._serving()
        if name in current.runtime:
            entry = current.get(name)
            if all(self.triton.is_ready(n) for n in entry.ensembles):
                return {
                    "status": "already_loaded",
                    "name": name,
                    "ensembles": list(entry.ensembles),
                }
        else:
            try:
                append_entry(self.runtime_manifest, self._entry_fields(request))
            except (ManifestError, ValueError) as exc:
                raise InvalidInputError(str(exc)) from None
        start = time.monotonic()
        try:
            self._build(name)
            entry = self._serving().get(name)
            for ensemble in entry.ensembles:
                self.triton.load(ensemble)
        except Exception:
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
        """Undo a failed load: unload what did load, drop files and the record."""
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
        if delete and name not in manifest.runtime:
            raise InvalidInputError(
                f"{name!r} is served from the manifest; remove it there (generator remove)"
            )
        entry = manifest.get(name)
        dirs = RepositoryWriter(self.params.repo).load_state().get(name, {}).get("dirs", [])
        ensembles = list(entry.ensembles)
        steps = [d for d in dirs if d not in ensembles and d not in SHARED_MODELS]
        for model in ensembles + steps:
            if self.triton.is_ready(model):
                self.triton.unload(model)
        if delete:
            remove_entry(self.params.repo, name)
            remove_entry_text(self.runtime_manifest, name)
        return {
            "status": "deleted" if delete else "unloaded",
            "name": name,
            "models": ensembles + steps,
        }
