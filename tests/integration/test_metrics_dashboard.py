"""The monitoring and profiling files against a real Triton.

- Every metric (and label) the Grafana dashboard queries is one this Triton exports: the
  per-model and CPU metrics from a live scrape of the session server's metrics port, the
  GPU ones (``nv_gpu_*``, absent on a CPU host) from ``tests/data/triton-gpu-metrics.prom``,
  a scrape of the same Triton binary recorded on an H100 host.
- ``deploy/perf/run_perf.sh`` finds every ready ensemble, writes the input data and runs
  the sweep; a stand-in for ``perf_analyzer`` sends the first entry of each data file to
  the server, so the generated data is shown to be accepted by each ensemble.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import urllib.request
from pathlib import Path

import promql_parser
import pytest

from tests.integration.conftest import TEXT_MODEL

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "triton-embeddings.json"
GPU_SCRAPE = ROOT / "tests" / "data" / "triton-gpu-metrics.prom"
RUN_PERF = ROOT / "deploy" / "perf" / "run_perf.sh"
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


@pytest.fixture(scope="module")
def live_metrics(server) -> dict[str, set[str]]:
    with server.client("http") as client:
        client.embed_texts(TEXT_MODEL, ["warm the per-model counters"])
    url = f"http://127.0.0.1:{server.ports.metrics}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - local server
        return parse_exposition(resp.read().decode())


def test_live_scrape_has_per_model_metrics_for_every_served_step(server, live_metrics) -> None:
    url = f"http://127.0.0.1:{server.ports.metrics}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - local server
        text = resp.read().decode()
    labelled = set(re.findall(r'^nv_inference_request_success\{model="([^"]+)"', text, re.M))
    assert set(server.manifest.get(TEXT_MODEL).model_dirs) <= labelled
    assert {"model", "version"} <= live_metrics["nv_inference_request_success"]
    assert "reason" in live_metrics["nv_inference_request_failure"]


def test_dashboard_queries_name_metrics_and_labels_triton_exports(live_metrics) -> None:
    gpu = parse_exposition(GPU_SCRAPE.read_text())
    exported = {**gpu, **live_metrics}
    problems = []
    for panel, metric, labels in dashboard_selectors():
        if metric not in exported:
            problems.append(f"{panel}: {metric} is not exported")
        elif not labels <= exported[metric] | {"__name__"}:
            problems.append(f"{panel}: {metric} has no label {sorted(labels - exported[metric])}")
        elif metric not in live_metrics and not metric.startswith("nv_gpu_"):
            problems.append(f"{panel}: {metric} only in the GPU recording, yet not a GPU metric")
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


FAKE_PERF_ANALYZER = """\
#!{python}
# Stands in for perf_analyzer: checks the arguments, sends the first entry of the input
# data to the server over HTTP, and writes a CSV the way perf_analyzer's -f does.
import argparse, base64, json, os, struct, sys
import numpy as np
import tritonclient.http as http

p = argparse.ArgumentParser()
for flag in ("-m", "-u", "-i", "--input-data", "-b", "--concurrency-range",
             "--measurement-interval", "--percentile", "-f", "--metrics-url"):
    p.add_argument(flag, required=flag != "--metrics-url")
p.add_argument("--collect-metrics", action="store_true")
a = p.parse_args()
assert a.i == "grpc" and a.u == os.environ["EXPECT_GRPC_URL"], (a.i, a.u)
entries = json.load(open(a.input_data))["data"]
assert len(entries) >= 4, len(entries)
(name, spec), = entries[0].items()
content = spec["content"]
if isinstance(content, dict):
    raw = base64.b64decode(content["b64"])
    items = [raw[4:4 + struct.unpack("<I", raw[:4])[0]]]
else:
    items = [c.encode() for c in content]
rows = np.array([items] * int(a.b), dtype=object).reshape(int(a.b), 1)
tensor = http.InferInput(name, list(rows.shape), "BYTES")
tensor.set_data_from_numpy(rows)
client = http.InferenceServerClient(os.environ["FAKE_PA_HTTP_URL"])
out = client.infer(a.m, [tensor]).as_numpy("EMBEDDING")
record = {{"model": a.m, "input": name, "c": a.concurrency_range,
          "shape": list(out.shape), "norm": float(np.linalg.norm(out[0]))}}
with open(os.environ["FAKE_PA_LOG"], "a") as log:
    log.write(json.dumps(record) + "\\n")
with open(a.f, "w") as csv:
    csv.write("Concurrency,Inferences/Second,p95 latency\\n" + a.concurrency_range + ",1.0,10\\n")
print("  Throughput: 1.0 infer/sec")
"""


def test_run_perf_sends_generated_data_to_every_ready_ensemble(server, tmp_path) -> None:
    fake = tmp_path / "perf_analyzer"
    fake.write_text(FAKE_PERF_ANALYZER.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "calls.jsonl"
    env = {
        **os.environ,
        "TRITON_HTTP_URL": server.http_url,
        "TRITON_GRPC_URL": server.grpc_url,
        "EXPECT_GRPC_URL": server.grpc_url,
        "FAKE_PA_HTTP_URL": server.http_url,
        "FAKE_PA_LOG": str(log),
        "PERF_ANALYZER": str(fake),
        "PERF_CONCURRENCY": "1 4",
        "PERF_RESULTS": str(tmp_path / "results"),
        "PYTHON": sys.executable,
    }
    done = subprocess.run(
        ["bash", str(RUN_PERF)], env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stdout + done.stderr
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    by_model = {c["model"]: c for c in calls}
    clip = next(e for e in server.manifest.models if e.family == "open-clip").name
    expected = {
        TEXT_MODEL: "TEXT",
        f"{clip}_text": "TEXT",
        f"{clip}_image": "IMAGE",
        f"{clip}_image_url": "IMAGE_URL",
    }
    assert {m: by_model[m]["input"] for m in expected} == expected
    assert "model_manager" not in by_model
    assert sorted(c["c"] for c in calls if c["model"] == TEXT_MODEL) == ["1", "4"]
    assert all(c["shape"][0] == 1 and abs(c["norm"] - 1) < 1e-3 for c in calls)
    (run_dir,) = (tmp_path / "results").iterdir()
    summary = (run_dir / "summary.csv").read_text().splitlines()
    assert summary[0] == "Model,Concurrency,Inferences/Second,p95 latency"
    assert len(summary) == 1 + len(calls)
    assert f"{TEXT_MODEL},4,1.0,10" in summary


def test_gpu_recording_is_a_triton_scrape_with_gpu_labels() -> None:
    gpu = parse_exposition(GPU_SCRAPE.read_text())
    for name in ("nv_gpu_utilization", "nv_gpu_memory_used_bytes", "nv_gpu_memory_total_bytes"):
        assert gpu[name] == {"gpu_uuid"}, name
    assert "nv_cpu_utilization" in gpu
