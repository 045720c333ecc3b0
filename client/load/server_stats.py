"""Server-side times of a measurement window, from Triton's statistics extension.

Triton's statistics are cumulative since the server started. :func:`snapshot` reads
them (raw, every model) before and after a window; :func:`window_stats` subtracts the
two and summarises the difference with :func:`client.records.summarize_model_stat`, so
queue and compute times cover only the requests sent in the window.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from ..api import admin_headers, admin_key_from_env
from ..records import ModelStats, summarize_model_stat, unwrap_model_config

DURATION_KEYS = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)
Snapshot = dict[str, dict[str, Any]]


def _client(url: str, protocol: str):
    module = importlib.import_module(f"tritonclient.{protocol}")
    return module, module.InferenceServerClient(url)


def snapshot(url: str, protocol: str = "http") -> Snapshot:
    """Raw cumulative statistics of every loaded model version, keyed by ``name:version``."""
    _, client = _client(url, protocol)
    try:
        kwargs = {"as_json": True} if protocol == "grpc" else {}
        response = client.get_inference_statistics("", **kwargs)
    finally:
        client.close()
    return {
        f"{stat.get('name', '')}:{stat.get('version', '')}": stat
        for stat in response.get("model_stats") or []
    }


def ensemble_order(url: str, protocol: str, model: str) -> list[str]:
    """``model`` followed by the models of its ensemble steps (recursively), in step order.

    Model configs are admin-only: the key comes from ``$EMBED_ADMIN_KEY`` (or its file).
    """
    _, client = _client(url, protocol)
    order: list[str] = []
    try:
        pending = [model]
        while pending:
            name = pending.pop(0)
            if name in order:
                continue
            order.append(name)
            kwargs = {"as_json": True} if protocol == "grpc" else {}
            kwargs["headers"] = admin_headers(admin_key_from_env(), protocol)
            config = unwrap_model_config(client.get_model_config(name, **kwargs))
            steps = (config.get("ensemble_scheduling") or {}).get("step") or []
            pending = [str(s.get("model_name", "")) for s in steps] + pending
    finally:
        client.close()
    return order


def _int(value: Any) -> int:
    return int(value) if value not in (None, "") else 0


def _delta_duration(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, int]:
    return {
        "count": _int(after.get("count")) - _int(before.get("count")),
        "ns": _int(after.get("ns")) - _int(before.get("ns")),
    }


def delta_stat(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """One model's statistics over a window, in the ``$model_stat`` JSON layout."""
    infer_before = before.get("inference_stats") or {}
    infer_after = after.get("inference_stats") or {}
    old_batches = {_int(b.get("batch_size")): b for b in before.get("batch_stats") or []}
    batches = []
    for batch in after.get("batch_stats") or []:
        size = _int(batch.get("batch_size"))
        old = old_batches.get(size, {})
        runs = _delta_duration(old.get("compute_infer") or {}, batch.get("compute_infer") or {})
        if runs["count"] > 0:
            batches.append({"batch_size": size, "compute_infer": runs})
    return {
        "name": after.get("name", ""),
        "version": after.get("version", ""),
        "inference_count": _int(after.get("inference_count")) - _int(before.get("inference_count")),
        "execution_count": _int(after.get("execution_count")) - _int(before.get("execution_count")),
        "inference_stats": {
            key: _delta_duration(infer_before.get(key) or {}, infer_after.get(key) or {})
            for key in DURATION_KEYS
        },
        "batch_stats": batches,
    }


def window_stats(
    before: Snapshot, after: Snapshot, order: list[str] | None = None
) -> list[ModelStats]:
    """Summaries of every model that served requests between two snapshots.

    Models named in ``order`` come first, in that order; the rest follow by name.
    """
    stats = []
    for key, stat in after.items():
        delta = delta_stat(before.get(key, {}), stat)
        if (
            delta["inference_stats"]["success"]["count"]
            or delta["inference_stats"]["fail"]["count"]
        ):
            stats.append(summarize_model_stat(delta))
    rank = {name: i for i, name in enumerate(order or [])}
    return sorted(stats, key=lambda s: (rank.get(s.name, len(rank)), s.name))
