"""The mapper: what the served model is, and rows in, vectors (or each row's failure) out.

:func:`resolve_model` reads the model's metadata (and config, with the admin key) once
and says how to call it (:class:`ModelPlan`): dense text, CLIP text or images, sparse or
multi-vector, with its batch size, instance count and config digest. It fails at once on
an unknown model or one that makes no vectors.

:meth:`Mapper.embed` embeds one batch. A per-row failure (the server's answer to a bad
image, an empty or over-long text) is isolated by halving the batch until the bad rows
stand alone: the other rows keep their vectors. A refused or unreachable server (after
the client's own retries, :mod:`client.retry`) is retried here with backoff a bounded
number of times, then ends the run: rows are never recorded as failed for the server's
sake, and a later run resumes.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import DeadlineExceededError, EmbeddingClientError, ServerOverloadedError
from ..payload import is_url
from .sources import Row

TEXT_KINDS = ("dense", "sparse", "multivector", "chunks")
# Options that make a dense model's run one of chunks (``<model>_chunks``).
CHUNK_OPTIONS = ("chunk_tokens", "chunk_overlap", "late_chunking")
KINDS = (*TEXT_KINDS, "image")
SERVER_FAULTS = (ServerOverloadedError, DeadlineExceededError)
FATAL_MARKERS = ("unknown model", "is not found", "not ready")


class ModelKindError(ValueError):
    """The model is unknown, or makes no vectors of the kind asked for."""


class IndexAbortedError(RuntimeError):
    """The server stayed unavailable past the retries: the run stops (resumable)."""


@dataclass(frozen=True)
class ModelPlan:
    """How to call the served model (see the module)."""

    name: str
    kind: str
    target: str
    max_batch: int
    instances: int
    config_digest: str
    options: dict[str, Any] = field(default_factory=dict)


def _metadata(client: Any, model: str) -> dict[str, Any] | None:
    """The model's metadata (inputs, outputs), or None when the server has no such model."""
    try:
        with client._errors(model):
            return dict(client._client.get_model_metadata(model, **client._json))
    except EmbeddingClientError as exc:
        if isinstance(exc, SERVER_FAULTS) or "unknown model" in exc.message.lower():
            return None
        raise


def _names(meta: dict[str, Any], key: str) -> set[str]:
    return {t["name"] for t in meta.get(key, [])}


def _config(client: Any, model: str) -> dict[str, Any] | None:
    """The model's config, or None when it needs the admin key this client lacks."""
    try:
        return client.model_config(model)
    except EmbeddingClientError:
        return None


def _instances(client: Any, config: dict[str, Any] | None) -> int:
    """The most instances any step of the ensemble runs (1 when unknown)."""
    if not config:
        return 1
    steps = config.get("ensemble_scheduling", {}).get("step", [])
    counts = [1]
    for step in steps:
        step_config = _config(client, step["model_name"]) or {}
        groups = step_config.get("instance_group", [])
        counts.append(sum(int(g.get("count", 1)) for g in groups) or 1)
    return max(counts)


def _digest(config: dict[str, Any] | None, meta: dict[str, Any]) -> str:
    """sha256 of the served config (of the metadata when the config needs the admin key)."""
    source = {"config": config} if config else {"metadata": meta}
    text = json.dumps(source, sort_keys=True, default=str)
    return ("config:" if config else "metadata:") + hashlib.sha256(text.encode()).hexdigest()


def _unknown(client: Any, model: str) -> ModelKindError:
    try:
        served = sorted(m.name for m in client.list_models())
        hint = f"; served: {', '.join(served)}" if served else ""
    except EmbeddingClientError:
        hint = ""
    return ModelKindError(f"unknown model {model!r} on {client.url}{hint}")


def resolve_model(
    client: Any, model: str, media: str, options: dict[str, Any] | None = None
) -> ModelPlan:
    """The plan for ``model`` given inputs of ``media`` (``text`` or ``image``).

    Text: the ensemble ``model`` (or ``<model>_text``, a CLIP model's text tower), dense,
    sparse or multi-vector by its outputs. Images: ``<model>_image`` (and
    ``<model>_image_url`` for URLs). Raises :class:`ModelKindError`.
    """
    options = {k: v for k, v in (options or {}).items() if v is not None}
    if media == "image":
        base = model.removesuffix("_image_url").removesuffix("_image")
        target = f"{base}_image"
        meta = _metadata(client, target)
        if meta is None:
            if _metadata(client, model) is not None:
                raise ModelKindError(f"model {model!r} takes no images (no {target} ensemble)")
            raise _unknown(client, model)
        kind = "image"
        if options:
            raise ModelKindError(f"options {sorted(options)} apply to texts, not images")
    else:
        target = model
        meta = _metadata(client, model)
        if meta is None and _metadata(client, f"{model}_text") is not None:
            target = f"{model}_text"
            meta = _metadata(client, target)
        if meta is None:
            raise _unknown(client, model)
        if "TEXT" not in _names(meta, "inputs"):
            raise ModelKindError(
                f"model {target!r} takes {sorted(_names(meta, 'inputs'))}, not TEXT"
            )
        outputs = _names(meta, "outputs")
        if "SPARSE_INDICES" in outputs:
            kind = "sparse"
        elif "EMBEDDINGS" in outputs:
            kind = "multivector"
        elif "EMBEDDING" in outputs:
            kind = "dense"
        else:
            raise ModelKindError(
                f"model {target!r} makes no vectors (outputs {sorted(outputs)}): "
                "index takes dense, CLIP, sparse or multi-vector models"
            )
        if kind == "dense" and set(CHUNK_OPTIONS) & set(options):
            kind, target = "chunks", f"{target}_chunks"
            meta = _metadata(client, target)
            if meta is None:
                raise ModelKindError(
                    f"model {model!r} cuts no texts into chunks (no {target} on the server)"
                )
        _check_text_options(kind, options)
    config = _config(client, target)
    max_batch = int((config or {}).get("max_batch_size", 0)) or 16
    return ModelPlan(
        model, kind, target, max_batch, _instances(client, config), _digest(config, meta), options
    )


def _check_text_options(kind: str, options: dict[str, Any]) -> None:
    allowed = {
        "dense": {"prompt_name", "dimensions", "precision", "truncate"},
        "sparse": {"prompt_name", "truncate", "task", "max_active_dims"},
        "multivector": {"task"},
        "chunks": {"prompt_name", "dimensions", *CHUNK_OPTIONS},
    }[kind]
    extra = sorted(set(options) - allowed)
    if extra:
        raise ModelKindError(f"options {extra} do not apply to a {kind} model")


@dataclass(frozen=True)
class RowFailure:
    """Why one row has no vector."""

    reason: str


def _fatal(exc: EmbeddingClientError) -> bool:
    """An answer about the model, not the rows (it went away mid-run)."""
    message = exc.message.lower()
    return any(marker in message for marker in FATAL_MARKERS)


class Mapper:
    """Rows in, each row's vector (or :class:`RowFailure`) out, for one :class:`ModelPlan`.

    ``max_image_bytes``: a local image larger than this fails alone without being sent.
    ``server_retries`` / ``backoff_s``: a batch the server refused or could not take is
    sent again after a jittered, doubling wait, that many times, then the run stops.
    """

    def __init__(
        self,
        plan: ModelPlan,
        max_image_bytes: int = 32 * 1024 * 1024,
        server_retries: int = 6,
        backoff_s: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.plan = plan
        self.max_image_bytes = max_image_bytes
        self.server_retries = server_retries
        self.backoff_s = backoff_s
        self.sleep = sleep
        self.server_faults = 0

    def _call(self, client: Any, items: list[Any]) -> Sequence[Any]:
        plan, opts = self.plan, self.plan.options
        if plan.kind == "image":
            return client.embed_images(plan.target.removesuffix("_image"), items)
        if plan.kind == "dense":
            return client.embed_texts(plan.target, items, **opts)
        if plan.kind == "sparse":
            return client.embed_sparse(plan.target, items, **opts)
        if plan.kind == "chunks":  # each row: the list of its chunks
            per_row: list[list] = [[] for _ in items]
            for chunk in client.embed_chunks(plan.target, items, **opts):
                per_row[chunk.row].append(chunk)
            return per_row
        return client.embed_multivector(plan.target, items, is_query=opts.get("task") == "query")

    def load(self, row: Row) -> Any:
        """The payload of ``row`` (text, image bytes or URL), or a :class:`RowFailure`."""
        if row.error is not None:
            return RowFailure(row.error)
        if self.plan.kind != "image":
            if not row.item or not row.item.strip():
                return RowFailure("empty text")
            return row.item
        if not row.item:
            return RowFailure("no image path or URL")
        if isinstance(row.item, bytes):
            if len(row.item) > self.max_image_bytes:
                return RowFailure(f"image of {len(row.item)} bytes exceeds {self.max_image_bytes}")
            return row.item
        if is_url(row.item):
            return row.item
        path = Path(row.item)
        try:
            size = path.stat().st_size
            if size > self.max_image_bytes:
                return RowFailure(f"image of {size} bytes exceeds {self.max_image_bytes}")
            if size == 0:
                return RowFailure("empty image file")
            return path.read_bytes()
        except OSError as exc:
            return RowFailure(f"cannot read {path}: {exc.strerror or exc}")

    def embed(self, client: Any, rows: Sequence[Row]) -> list[Any]:
        """Each row's vector (the kind's value) or :class:`RowFailure`, in order."""
        results: list[Any] = [self.load(row) for row in rows]
        pending = [i for i, r in enumerate(results) if not isinstance(r, RowFailure)]
        if pending:
            values = self._with_retries(client, [results[i] for i in pending])
            for i, value in zip(pending, values, strict=True):
                results[i] = value
        return results

    def _with_retries(self, client: Any, items: list[Any]) -> list[Any]:
        attempt = 0
        while True:
            try:
                return self._isolated(client, items)
            except SERVER_FAULTS as exc:
                attempt += 1
                self.server_faults += 1
                if attempt > self.server_retries:
                    raise IndexAbortedError(
                        f"server did not take a batch after {attempt} tries: {exc}"
                    ) from exc
                self.sleep(self.backoff_s * 2 ** (attempt - 1) * (0.5 + random.random() / 2))  # noqa: S311

    def _isolated(self, client: Any, items: list[Any]) -> list[Any]:
        try:
            return list(self._call(client, items))
        except SERVER_FAULTS:
            raise
        except EmbeddingClientError as exc:
            if _fatal(exc):
                raise IndexAbortedError(f"the model failed: {exc}") from exc
            if len(items) == 1:
                return [RowFailure(exc.message)]
            middle = len(items) // 2
            return self._isolated(client, items[:middle]) + self._isolated(client, items[middle:])
