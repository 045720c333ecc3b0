"""The monitoring files against a real Triton.

Every metric (and label) the Grafana dashboard queries is one this Triton exports: the
per-model and CPU metrics from a live scrape of the session server's metrics port, the GPU
ones (``nv_gpu_*``, absent on a CPU host) from ``tests/data/triton-gpu-metrics.prom``, a
scrape of the same Triton binary recorded on an H100 host. The perf_analyzer sweep
(``deploy/perf/run_perf.sh``) runs the real binary against the same server in
``test_perf_analyzer.py``.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import promql_parser
import pytest

from tests.integration.conftest import TEXT_MODEL

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "triton-embeddings.json"
GPU_SCRAPE = ROOT / "tests" / "data" / "triton-gpu-metrics.prom"
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="')
GRAFANA_MACROS = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}


def parse_exposition(text: str) -> dict[str, set[str]]:
    """``{metric: label names}`` of a Prometheus text exposition."""
    metrics: dict[str, set[str]] = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match and not line.startswith("#"):
            metrics.setdefault(match[1], set()).update(LABEL.findall(match[2] or ""))
    return metrics


def dashboard_selectors() -> list[tuple[str, str, set[str]]]:
    """``(panel, metric, labels used)`` for every selector in the dashboard's queries."""
    dashboard = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for macro, value in GRAFANA_MACROS.items():
                expr = expr.replace(macro, value)
            found: list[tuple[str, set[str]]] = []
            grouping: set[str] = set()

            def visit(node, found=found, grouping=grouping):
                if isinstance(node, promql_parser.VectorSelector):
                    found.append((node.name, {m.name for m in node.matchers.matchers}))
                if isinstance(node, promql_parser.AggregateExpr) and node.modifier:
                    grouping.update(node.modifier.labels)
                return True

            promql_parser.walk(promql_parser.parse(expr), visit)
            out += [(panel["title"], name, labels | grouping) for name, labels in found]
    for variable in dashboard["templating"]["list"]:
        match = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", variable["definition"])
        assert match, f"unexpected variable query {variable['definition']!r}"
        out.append((f"variable {variable['name']}", match[1], {match[2]}))
    return out


def dashboard_problems(live: dict[str, set[str]]) -> list[str]:
    """What each dashboard query names that Triton does not export, with its panel.

    ``live`` is a live scrape (:func:`parse_exposition`); GPU metrics may come from the
    recorded GPU scrape instead, every other metric must be live.
    """
    exported = {**parse_exposition(GPU_SCRAPE.read_text()), **live}
    problems = []
    for panel, metric, labels in dashboard_selectors():
        if metric not in exported:
            problems.append(f"{panel}: {metric} is not exported")
        elif not labels <= exported[metric] | {"__name__"}:
            problems.append(f"{panel}: {metric} has no label {sorted(labels - exported[metric])}")
        elif metric not in live and not metric.startswith("nv_gpu_"):
            problems.append(f"{panel}: {metric} only in the GPU recording, yet not a GPU metric")
    return problems


@pytest.fixture(scope="module")
def live_metrics(server) -> dict[str, set[str]]:
    with server.client("http") as client:
        client.embed_texts(TEXT_MODEL, ["warm the per-model counters"])
    url = f"http://127.0.0.1:{server.ports.metrics}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return parse_exposition(resp.read().decode())


def test_live_scrape_has_per_model_metrics_for_every_served_step(server, live_metrics) -> None:
    url = f"http://127.0.0.1:{server.ports.metrics}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    labelled = set(re.findall(r'^nv_inference_request_success\{model="([^"]+)"', text, re.M))
    assert set(server.manifest.get(TEXT_MODEL).model_dirs) <= labelled
    assert {"model", "version"} <= live_metrics["nv_inference_request_success"]
    assert "reason" in live_metrics["nv_inference_request_failure"]


def test_dashboard_queries_name_metrics_and_labels_triton_exports(live_metrics) -> None:
    problems = dashboard_problems(live_metrics)
    assert not problems, "\n".join(problems)


def test_dashboard_covers_queue_compute_rate_failures_batch_and_gpu() -> None:
    metrics = {metric for _, metric, _ in dashboard_selectors()}
    assert {
        "nv_inference_queue_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_request_success",
        "nv_inference_request_failure",
        "nv_inference_count",
        "nv_inference_exec_count",
        "nv_gpu_utilization",
    } <= metrics


def test_gpu_recording_is_a_triton_scrape_with_gpu_labels() -> None:
    gpu = parse_exposition(GPU_SCRAPE.read_text())
    for name in ("nv_gpu_utilization", "nv_gpu_memory_used_bytes", "nv_gpu_memory_total_bytes"):
        assert gpu[name] == {"gpu_uuid"}, name
    assert "nv_cpu_utilization" in gpu
