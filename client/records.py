"""Typed summaries of Triton's repository index and statistics responses.

The parsers take the HTTP JSON (plain numbers) and the gRPC protobuf rendered with
``as_json=True`` (``MessageToJson``: 64-bit integers as strings, zero fields omitted)
and give the same result for both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

NS_PER_MS = 1_000_000


@dataclass(frozen=True)
class ModelInfo:
    """One entry of the model repository index."""

    name: str
    version: str
    state: str
    reason: str


@dataclass(frozen=True)
class ModelStats:
    """Cumulative statistics of one model version since the server started.

    ``inference_count`` counts inputs (rows), ``execution_count`` model executions,
    ``success_count`` / ``fail_count`` requests. Averages are per request (``queue``,
    ``request``: whole server-side time of a successful request) or per execution
    (``compute_*``), in milliseconds. ``batch_sizes`` maps an executed batch size to how
    many executions ran with it (for an ensemble: the batch sizes of its requests).
    """

    name: str
    version: str
    inference_count: int
    execution_count: int
    success_count: int
    fail_count: int
    avg_request_ms: float
    avg_queue_ms: float
    avg_compute_input_ms: float
    avg_compute_infer_ms: float
    avg_compute_output_ms: float
    batch_sizes: dict[int, int] = field(default_factory=dict)
    avg_fail_ms: float = 0.0  # server-side time of a failed request (a refusal, say)

    @property
    def avg_batch_size(self) -> float:
        """Inputs per execution (0.0 before the first execution)."""
        return self.inference_count / self.execution_count if self.execution_count else 0.0


def _int(value: Any) -> int:
    return int(value) if value not in (None, "") else 0


def _duration(stats: Mapping[str, Any], key: str) -> tuple[int, int]:
    entry = stats.get(key) or {}
    return _int(entry.get("count")), _int(entry.get("ns"))


def _avg_ms(stats: Mapping[str, Any], key: str) -> float:
    count, ns = _duration(stats, key)
    return ns / count / NS_PER_MS if count else 0.0


def summarize_model_stat(stat: Mapping[str, Any]) -> ModelStats:
    """Summarise one ``$model_stat`` object of the statistics extension."""
    infer = stat.get("inference_stats") or {}
    batches: dict[int, int] = {}
    for batch in stat.get("batch_stats") or []:
        executions = _duration(batch, "compute_infer")[0]
        batches[_int(batch.get("batch_size"))] = executions
    return ModelStats(
        name=str(stat.get("name", "")),
        version=str(stat.get("version", "")),
        inference_count=_int(stat.get("inference_count")),
        execution_count=_int(stat.get("execution_count")),
        success_count=_duration(infer, "success")[0],
        fail_count=_duration(infer, "fail")[0],
        avg_request_ms=_avg_ms(infer, "success"),
        avg_queue_ms=_avg_ms(infer, "queue"),
        avg_compute_input_ms=_avg_ms(infer, "compute_input"),
        avg_compute_infer_ms=_avg_ms(infer, "compute_infer"),
        avg_compute_output_ms=_avg_ms(infer, "compute_output"),
        batch_sizes=dict(sorted(batches.items())),
        avg_fail_ms=_avg_ms(infer, "fail"),
    )


def summarize_statistics(response: Mapping[str, Any]) -> list[ModelStats]:
    """Summarise a statistics response (``{"model_stats": [...]}``)."""
    return [summarize_model_stat(stat) for stat in response.get("model_stats") or []]


def parse_repository_index(response: Any) -> list[ModelInfo]:
    """Parse a repository index: HTTP gives a list, gRPC JSON ``{"models": [...]}``."""
    entries = (response.get("models") or []) if isinstance(response, Mapping) else response
    return [
        ModelInfo(
            name=str(entry.get("name", "")),
            version=str(entry.get("version", "")),
            state=str(entry.get("state", "")),
            reason=str(entry.get("reason", "")),
        )
        for entry in entries
    ]


def unwrap_model_config(response: Mapping[str, Any]) -> dict[str, Any]:
    """Return the model config itself; gRPC JSON wraps it as ``{"config": {...}}``."""
    config = response.get("config")
    if isinstance(config, Mapping) and "name" in config:
        return dict(config)
    return dict(response)
