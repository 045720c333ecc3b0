"""Per-request options of text models: ``prompt_name`` and Matryoshka ``dimensions``.

Both arrive as Triton request parameters (an ensemble forwards its request's parameters
to every step) and fail only their own request when wrong.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import InvalidInputError


def request_parameters(raw: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """The parameters of one request (``request.parameters()`` is a JSON object string)."""
    if not raw:
        return {}
    if isinstance(raw, Mapping):
        return dict(raw)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        raise InvalidInputError("request parameters are not a JSON object") from None
    if not isinstance(value, dict):
        raise InvalidInputError("request parameters are not a JSON object")
    return value


TASKS = ("query", "document")
DEFAULT_TASK = "document"


def resolve_task(parameters: Mapping[str, Any]) -> str:
    """The request parameter ``task``: ``query`` or ``document`` (the default).

    As sentence-transformers' ``encode_query`` / ``encode_document`` (``encode(task=...)``)
    choose between a model's query and document routes.
    """
    task = parameters.get("task", DEFAULT_TASK)
    if task not in TASKS:
        raise InvalidInputError(f"task must be one of {list(TASKS)}, got {task!r}")
    return task


def parse_prompts(text: str) -> dict[str, str]:
    """The ``prompts`` config parameter (a JSON object of name -> prompt text)."""
    prompts = json.loads(text or "{}")
    if not isinstance(prompts, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()
    ):
        raise ValueError("prompts must be a JSON object of strings")
    return prompts


def resolve_prompt(
    parameters: Mapping[str, Any], prompts: Mapping[str, str], default_name: str = ""
) -> str:
    """The prompt text for a request: its ``prompt_name``, else the default, else ``""``."""
    name = parameters.get("prompt_name")
    if name is None:
        return prompts.get(default_name, "") if default_name else ""
    if not isinstance(name, str):
        raise InvalidInputError(f"prompt_name must be a string, got {name!r}")
    if name not in prompts:
        known = sorted(prompts) or "none"
        raise InvalidInputError(f"unknown prompt_name {name!r}; this model's prompts: {known}")
    return prompts[name]


def apply_prompt(prompt: str, texts: list[str]) -> list[str]:
    """Prepend ``prompt`` to every text, as ``SentenceTransformer.encode(prompt=...)`` does."""
    return [prompt + t for t in texts] if prompt else texts


def resolve_dimensions(parameters: Mapping[str, Any], full: int, default: int = 0) -> int:
    """The request's ``dimensions`` k (1 <= k <= ``full``), else ``default`` or ``full``.

    ``full`` 0 means the model cannot truncate: any ``dimensions`` is refused.
    """
    value = parameters.get("dimensions")
    if value is None:
        return default or full
    if not full:
        raise InvalidInputError("this model does not support dimensions")
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"dimensions must be an integer, got {value!r}")
    if not 1 <= value <= full:
        raise InvalidInputError(f"dimensions must be within [1, {full}], got {value}")
    return value


def truncate(embeddings: np.ndarray, k: int, normalize: bool) -> np.ndarray:
    """The first ``k`` values of each row, L2-normalised again when the model normalises.

    Equals sentence-transformers' ``encode(truncate_dim=k, normalize_embeddings=...)``:
    it truncates the pipeline's output, then normalises.
    """
    if k >= embeddings.shape[-1]:
        return embeddings
    out = embeddings[..., :k]
    if normalize:
        norms = np.linalg.norm(out.astype(np.float64), axis=-1, keepdims=True)
        out = (out / np.maximum(norms, 1e-12)).astype(embeddings.dtype)
    return np.ascontiguousarray(out)
