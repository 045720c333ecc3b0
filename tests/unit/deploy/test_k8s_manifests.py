"""What deploy/k8s promises, read from the rendered objects (docs/kubernetes.md).

Security settings, probes on Triton's health endpoints, /dev/shm, the read-only
repository built by the Job, the admin key from a Secret, the names that tie Services,
ServiceMonitor, PDB, HPA, ScaledObject and KServe objects together, and the Docker
translation that `make test-docker` runs the containers with.
"""

from __future__ import annotations

import pytest

from generator.tracing import TraceSettings
from tests.docker import k8s_docker
from tests.docker import k8s_manifests as k8s

HEALTH_CHECK = ["python3", "/app/deploy/healthcheck.py"]


@pytest.fixture(scope="module", params=["overlays/cpu", "overlays/gpu"])
def overlay(request) -> tuple[str, list[dict]]:
    return request.param, k8s.render(request.param)


def _pod(objects, kind, name="triton-embeddings"):
    return k8s.find(objects, kind, name)["spec"]["template"]["spec"]


def _env(ctr) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in ctr["env"]}


def _mounts(ctr) -> dict[str, dict]:
    return {m["mountPath"]: m for m in ctr["volumeMounts"]}


def test_server_runs_non_root_read_only_without_privileges(overlay) -> None:
    _, objects = overlay
    pod = _pod(objects, "Deployment")
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["automountServiceAccountToken"] is False
    ctr = k8s.container(pod, "triton")
    sc = ctr["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]


def test_probes_use_the_health_check_with_a_startup_budget_for_loading(overlay) -> None:
    """Readiness and liveness run deploy/healthcheck.py (stub watch, drain), start-up
    asks Triton; the grace period covers the drain the environment configures."""
    _, objects = overlay
    pod = _pod(objects, "Deployment")
    ctr = k8s.container(pod, "triton")
    assert k8s_docker.probe_target(ctr, "startupProbe") == (8000, "/v2/health/ready")
    assert k8s_docker.probe_command(ctr, "readinessProbe") == HEALTH_CHECK
    assert k8s_docker.probe_command(ctr, "livenessProbe") == [*HEALTH_CHECK, "--live"]
    assert ctr["readinessProbe"]["failureThreshold"] == 1
    assert k8s_docker.probe_budget_s(ctr, "startupProbe") >= 600
    env = _env(ctr)
    assert env["TRITON_HTTP_PORT"] == "8000"
    drain_s = float(env["EMBED_DRAIN_DELAY_S"]) + float(env["EMBED_DRAIN_TIMEOUT_S"]) + 3
    assert pod["terminationGracePeriodSeconds"] >= drain_s + 5


def test_dev_shm_is_memory_backed_and_within_the_memory_limit(overlay) -> None:
    _, objects = overlay
    pod = _pod(objects, "Deployment")
    ctr = k8s.container(pod, "triton")
    shm = k8s.volume_for(pod, _mounts(ctr)["/dev/shm"])["emptyDir"]
    assert shm["medium"] == "Memory"
    limit = k8s_docker.quantity(ctr["resources"]["limits"]["memory"])
    assert 1 << 30 <= k8s_docker.quantity(shm["sizeLimit"]) <= limit / 2
    assert ctr["resources"]["requests"]["memory"]


def test_gpu_only_in_the_gpu_overlay(overlay) -> None:
    directory, objects = overlay
    ctr = k8s.container(_pod(objects, "Deployment"), "triton")
    gpus = ctr["resources"]["limits"].get("nvidia.com/gpu")
    assert (gpus == 1) if directory.endswith("gpu") else gpus is None
    image = ctr["image"].split(":")[0]
    assert image == ("triton-embeddings-serving" + ("" if gpus else "-cpu"))


def test_pods_only_load_the_repository_the_job_builds(overlay) -> None:
    _, objects = overlay
    pod, job = _pod(objects, "Deployment"), _pod(objects, "Job", "triton-embeddings-build")
    ctr, build = k8s.container(pod, "triton"), k8s.container(job, "build")
    assert ctr["args"] == ["serve", "--no-build"] and build["args"] == ["build"]
    repo = _env(ctr)["EMBED_MODEL_REPOSITORY"]
    assert _env(build)["EMBED_MODEL_REPOSITORY"] == repo
    served, written = _mounts(ctr)[repo], _mounts(build)[repo]
    assert served.get("readOnly") is True and not written.get("readOnly")
    pvc = k8s.find(objects, "PersistentVolumeClaim")
    for spec, mount in ((pod, served), (job, written)):
        claim = k8s.volume_for(spec, mount)["persistentVolumeClaim"]["claimName"]
        assert claim == pvc["metadata"]["name"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert k8s.volume_for(pod, served)["persistentVolumeClaim"]["readOnly"] is True


def test_manifest_comes_from_the_generated_configmap(overlay) -> None:
    directory, objects = overlay
    config = k8s.find(objects, "ConfigMap")
    name = config["metadata"]["name"]
    assert name.startswith("triton-embeddings-manifest-")  # content hash: a change rolls out
    shipped = "models.cpu.toml" if directory.endswith("cpu") else "models.toml"
    assert config["data"]["models.toml"] == (k8s.ROOT / "deploy" / shipped).read_text()
    for kind, name_, ctr in (
        ("Deployment", "triton-embeddings", "triton"),
        ("Job", "triton-embeddings-build", "build"),
    ):
        pod = _pod(objects, kind, name_)
        c = k8s.container(pod, ctr)
        manifest = _env(c)["EMBED_MANIFEST"]
        mount = _mounts(c)[manifest.rsplit("/", 1)[0]]
        assert k8s.volume_for(pod, mount)["configMap"]["name"] == name


def test_admin_key_is_a_file_from_the_secret(overlay) -> None:
    _, objects = overlay
    pod = _pod(objects, "Deployment")
    ctr = k8s.container(pod, "triton")
    key_file = _env(ctr)["EMBED_ADMIN_KEY_FILE"]
    folder, key = key_file.rsplit("/", 1)
    secret = k8s.volume_for(pod, _mounts(ctr)[folder])["secret"]
    assert secret["secretName"] == "triton-embeddings-admin-key" and key == "admin-key"
    assert secret["defaultMode"] & 0o007 == 0  # not world-readable
    assert "EMBED_ADMIN_KEY" not in _env(ctr)


def test_services_pdb_and_monitor_select_the_server_pods(overlay) -> None:
    _, objects = overlay
    deployment = k8s.find(objects, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    service = k8s.find(objects, "Service", "triton-embeddings")
    headless = k8s.find(objects, "Service", "triton-embeddings-headless")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {
        "http": 8000,
        "grpc": 8001,
        "metrics": 8002,
    }
    assert headless["spec"]["clusterIP"] == "None"
    pdb = k8s.find(objects, "PodDisruptionBudget")
    for selector in (
        service["spec"]["selector"],
        headless["spec"]["selector"],
        pdb["spec"]["selector"]["matchLabels"],
    ):
        assert selector.items() <= labels.items()
    monitor = k8s.find(k8s.render("monitoring"), "ServiceMonitor")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert (
        not headless["metadata"]["labels"].items()
        >= monitor["spec"]["selector"]["matchLabels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"


def test_autoscalers_target_the_deployment() -> None:
    hpa = k8s.find(k8s.render("autoscaling/hpa"), "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "triton-embeddings"
    (metric,) = hpa["spec"]["metrics"]
    (rule,) = k8s.adapter_rules()
    assert metric["pods"]["metric"]["name"] == rule["name"]["as"]
    scaled = k8s.find(k8s.render("autoscaling/keda"), "ScaledObject")
    assert scaled["spec"]["scaleTargetRef"]["name"] == "triton-embeddings"
    assert scaled["spec"]["minReplicaCount"] == hpa["spec"]["minReplicas"] >= 2


def test_kserve_serves_the_same_repository_over_v2() -> None:
    objects = k8s.render("kserve")
    runtime, isvc = k8s.find(objects, "ServingRuntime"), k8s.find(objects, "InferenceService")
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert (
        model["storageUri"]
        == "pvc://" + k8s.find(objects, "PersistentVolumeClaim")["metadata"]["name"]
    )
    assert "v2" in runtime["spec"]["protocolVersions"] and model["protocolVersion"] == "v2"
    (ctr,) = runtime["spec"]["containers"]
    assert ctr["args"] == ["serve", "--no-build"]
    assert _env(ctr)["EMBED_MODEL_REPOSITORY"] == "/mnt/models"
    assert ctr["securityContext"]["readOnlyRootFilesystem"] is True
    config = k8s.find(objects, "ConfigMap")["metadata"]["name"]
    assert any(v.get("configMap", {}).get("name") == config for v in runtime["spec"]["volumes"])
    assert k8s_docker.probe_command(ctr, "readinessProbe") == HEALTH_CHECK
    assert k8s_docker.probe_command(ctr, "livenessProbe") == [*HEALTH_CHECK, "--live"]
    env = _env(ctr)
    drain_s = float(env["EMBED_DRAIN_DELAY_S"]) + float(env["EMBED_DRAIN_TIMEOUT_S"]) + 3
    assert isvc["spec"]["predictor"]["terminationGracePeriodSeconds"] >= drain_s + 5


def test_docker_translation_keeps_the_container_spec() -> None:
    objects = k8s.render("overlays/cpu")
    pod = _pod(objects, "Deployment")
    ctr = k8s.container(pod, "triton")
    bindings = k8s_docker.HostBindings(
        images={ctr["image"]: "serving:local"},
        volumes={"manifest": "/h/config", "model-repository": "repo", "admin-key": "/h/key"},
        ports={8000: 18100, 8001: 18101, 8002: 18102},
    )
    argv = k8s_docker.docker_run(pod, ctr, bindings, "t")
    joined = " ".join(argv)
    for expected in (
        "--user 10001:10001",
        "--group-add 10001",
        "--read-only",
        "no-new-privileges:true",
        "--cap-drop ALL",
        f"--shm-size={2 << 30}",
        "-v repo:/models:ro",
        "-v /h/config:/config:ro",
        "-p 127.0.0.1:18100:8000",
        "--cpus 2",
        "--entrypoint /app/deploy/entrypoint.sh",
    ):
        assert expected in joined
    assert argv[-3:] == ["serving:local", "serve", "--no-build"]
    with pytest.raises(KeyError):
        k8s_docker.docker_run(pod, ctr, bindings.__class__(images={}, volumes={}), "t")
    gpu = k8s.container(_pod(k8s.render("overlays/gpu"), "Deployment"), "triton")
    with pytest.raises(ValueError, match="nvidia.com/gpu"):
        k8s_docker.docker_run(pod, gpu, bindings, "t")


def test_traces_are_off_by_default_and_their_resource_names_the_pod(overlay) -> None:
    _, objects = overlay
    pod = _pod(objects, "Deployment")
    ctr = k8s.container(pod, "triton")
    assert TraceSettings.resolve(env=_env(ctr)) is None
    fields = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in ctr["env"]
              if "valueFrom" in e}
    assert fields == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    # As the kubelet expands $(VAR) (the Docker translation does the same), with an endpoint:
    url = "http://otel-collector.observability:4318/v1/traces"
    traced = {**ctr, "env": [
        {"name": e["name"], "value": url} if e["name"] == "EMBED_TRACE_ENDPOINT" else e
        for e in ctr["env"]
    ]}
    env = k8s_docker.container_env(traced, "pod-7")
    assert TraceSettings.resolve(env=env) == TraceSettings(url, 1000, (
        ("service.name", "triton-embeddings"),
        ("k8s.pod.name", "pod-7"),
        ("k8s.namespace.name", "default"),
    ))


def test_kserve_runtime_traces_as_the_deployment_does() -> None:
    runtime = k8s.find(k8s.render("kserve"), "ServingRuntime")
    (ctr,) = runtime["spec"]["containers"]
    deployment = k8s.container(_pod(k8s.render("overlays/cpu"), "Deployment"), "triton")
    trace_env = [e for e in deployment["env"] if e["name"].startswith(("EMBED_TRACE", "POD_"))]
    assert [e for e in ctr["env"] if e in trace_env] == trace_env


def _cache_volume(pod: dict, ctr: dict) -> tuple[str, dict]:
    """The weight-cache folder and the volume under it (deepest mount containing it)."""
    folder = _env(ctr)["EMBED_ORT_CACHE_DIR"]
    mounts = [m for m in ctr["volumeMounts"] if folder.startswith(m["mountPath"] + "/")]
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    return folder, k8s.volume_for(pod, mount)


def test_weight_cache_is_a_writable_subfolder_without_the_tmp_size_limit(overlay) -> None:
    # Hundreds of MiB per model (ViT-B-32: 660 MiB) would push /tmp (sizeLimit 1Gi) over
    # and get the pod evicted; the server itself creates the subfolder 0700.
    _, objects = overlay
    pod = _pod(objects, "Deployment")
    runtime = k8s.find(k8s.render("kserve"), "ServingRuntime")["spec"]
    for spec, ctr in ((pod, k8s.container(pod, "triton")), (runtime, runtime["containers"][0])):
        folder, volume = _cache_volume(spec, ctr)
        assert not folder.startswith("/tmp/")
        assert volume["emptyDir"] == {}, "no size limit, not memory-backed"
        mount = next(m for m in ctr["volumeMounts"] if m["name"] == volume["name"])
        assert folder != mount["mountPath"] and not mount.get("readOnly")


def test_gateway_overlay_reads_the_servers_manifest_and_needs_its_key_secret() -> None:
    """overlays/cpu-gateway: the CPU install unchanged plus the gateway, whose config is
    written at pod start from the same manifest ConfigMap, whose key is a Secret file, and
    whose pods run as locked down as the server's."""
    objects = k8s.render("overlays/cpu-gateway")
    server = _pod(objects, "Deployment")
    assert server == _pod(k8s.render("overlays/cpu"), "Deployment")
    pod = _pod(objects, "Deployment", "triton-embeddings-gateway")
    manifest = {v["name"]: v for v in pod["volumes"]}["manifest"]
    assert manifest == {v["name"]: v for v in server["volumes"]}["manifest"]
    init = k8s.container({"containers": pod["initContainers"]}, "gateway-config")
    assert init["image"] == "triton-embeddings-generator-cpu:0.1.0"
    assert init["args"][-2:] == ["gateway-config", "/gateway/config.yaml"]
    gateway = k8s.container(pod, "gateway")
    assert gateway["args"] == ["/gateway/config.yaml"]
    env = _env(gateway)
    assert env["TRITON_HTTP_URL"] == "http://triton-embeddings:8000"
    assert "LITELLM_MASTER_KEY" not in env
    key = _mounts(gateway)["/run/secrets/triton-embeddings-gateway"]
    assert env["LITELLM_MASTER_KEY_FILE"].startswith(key["mountPath"] + "/")
    assert k8s.volume_for(pod, key)["secret"]["secretName"] == "triton-embeddings-gateway-key"
    assert _mounts(gateway)["/gateway"]["readOnly"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    for ctr in (init, gateway):
        assert ctr["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }
    # It scales on its own CPU: one worker per pod, one core requested, an HPA on that.
    assert env["GATEWAY_WORKERS"] == "1"
    assert gateway["resources"]["requests"]["cpu"] == "1"
    hpa = k8s.find(objects, "HorizontalPodAutoscaler", "triton-embeddings-gateway")["spec"]
    assert hpa["scaleTargetRef"]["name"] == "triton-embeddings-gateway"
    assert hpa["metrics"][0]["resource"]["name"] == "cpu"
    service = k8s.find(objects, "Service", "triton-embeddings-gateway")["spec"]
    assert service["type"] == "ClusterIP"
    assert service["selector"] == pod_labels(objects, "triton-embeddings-gateway")


def pod_labels(objects, name: str) -> dict:
    """The labels of the pods of Deployment ``name``."""
    return k8s.find(objects, "Deployment", name)["spec"]["template"]["metadata"]["labels"]
