"""The ``model_manager`` model's config parameters, written by the build, read by its stub."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from embed_runtime.config_params import param
from embed_runtime.ops.stub_watch import WatchParams


@dataclass(frozen=True)
class ManagerConfig(WatchParams):
    """Where ``model_manager`` finds its manifest and worker Python; its build timeout.

    With the stub watch's and the ensemble probe's intervals (:class:`WatchParams`), so
    one object writes and reads every parameter of the model. ``manifest`` and
    ``worker_python`` must be in a config; Python code names them.
    """

    missing_message: ClassVar[str] = "{name} parameter {key!r} is missing"

    manifest: str = param("", required=True)
    worker_python: str = param("", required=True)
    build_timeout_s: float = param(1800.0, always=True, encode="{:g}".format)
