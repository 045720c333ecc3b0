"""Prometheus and Grafana provisioning and the dashboard, checked without a Docker engine.

The Prometheus configuration is validated against a schema, the provisioning against the
compose file, and every dashboard query is parsed as PromQL.
"""

from __future__ import annotations

import json

import promql_parser
import yaml

from tests.unit.deploy.deploy_files import DEPLOY

DASHBOARD = DEPLOY / "grafana" / "dashboards" / "triton-embeddings.json"


PROMETHEUS_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["scrape_configs"],
    "properties": {
        "global": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                k: {"type": "string", "pattern": r"^\d+[smh]$"}
                for k in ("scrape_interval", "scrape_timeout", "evaluation_interval")
            },
        },
        "scrape_configs": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["job_name", "static_configs"],
                "properties": {
                    "job_name": {"type": "string"},
                    "metrics_path": {"type": "string", "pattern": "^/"},
                    "scheme": {"enum": ["http", "https"]},
                    "static_configs": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["targets"],
                            "properties": {
                                "targets": {
                                    "type": "array",
                                    "items": {"type": "string", "pattern": r"^[\w.-]+:\d+$"},
                                },
                                "labels": {"type": "object"},
                            },
                        },
                    },
                },
            },
        },
    },
}


def test_prometheus_scrapes_the_triton_service_metrics_port(compose) -> None:
    import jsonschema

    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jsonschema.validate(config, PROMETHEUS_SCHEMA)
    (job,) = config["scrape_configs"]
    port = compose["services"]["triton"]["environment"]["TRITON_METRICS_PORT"]
    assert job["static_configs"][0]["targets"] == [f"triton:{port}"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    interval = int(config["global"]["scrape_interval"].rstrip("s"))
    assert int(config["global"]["scrape_timeout"].rstrip("s")) < interval
    mounts = compose["services"]["prometheus"]["volumes"]
    assert "./deploy/prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in mounts


def test_grafana_provisioning_points_at_prometheus_and_the_dashboard_folder(compose) -> None:
    provisioning = DEPLOY / "grafana" / "provisioning"
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    assert (source["type"], source["uid"]) == ("prometheus", "prometheus")
    assert source["url"] == "http://prometheus:9090"
    (provider,) = yaml.safe_load(
        (provisioning / "dashboards" / "triton-embeddings.yml").read_text()
    )["providers"]
    mounts = dict(v.split(":")[:2] for v in compose["services"]["grafana"]["volumes"])
    assert mounts["./deploy/grafana/dashboards"] == provider["options"]["path"]
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    home = compose["services"]["grafana"]["environment"][
        "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"
    ]
    assert home == f"{provider['options']['path']}/{DASHBOARD.name}"


def test_dashboard_json_is_well_formed_and_every_query_parses_as_promql() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "triton-embeddings" and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    cells = set()
    queries = 0
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24
        for dx in range(pos["w"]):
            for dy in range(pos["h"]):
                cell = (pos["x"] + dx, pos["y"] + dy)
                assert cell not in cells, f"{panel['title']} overlaps another panel"
                cells.add(cell)
        if panel["type"] == "row":
            continue
        assert panel["type"] == "timeseries" and panel["description"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "prometheus"}
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)) and refs
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", "1m")
            promql_parser.parse(expr)
            queries += 1
    assert queries >= 12
    (variable,) = dashboard["templating"]["list"]
    assert variable["name"] == "model" and variable["allValue"] == ".*"


def test_dashboard_panels_cover_the_issue_list() -> None:
    titles = {p["title"] for p in json.loads(DASHBOARD.read_text())["panels"]}
    assert {
        "Queue time",
        "Compute time",
        "Request rate",
        "Failed requests",
        "Average batch size",
        "GPU utilisation",
        "GPU time per model",
    } <= titles
