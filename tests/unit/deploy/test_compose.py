"""The docker-compose files and the containers' security defaults, without a Docker engine.

check-jsonschema validates docker-compose.yml, its overrides, each combination of them
merged and docker-compose.cpu.yml against the Compose specification it ships (offline);
where Debian's docker-compose 1.29 is installed, its merge is compared with these tests'.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from generator.families.common import TRT_ENGINE_CACHE_DIR
from generator.tracing import TraceSettings
from tests.unit.deploy.deploy_files import (
    BIN,
    COMPOSE,
    ROOT,
    dockerfile_instructions,
    dockerignored,
)

ADMIN_KEY_OVERRIDE = ROOT / "docker-compose.admin-key.yml"
RUNTIME_OVERRIDE = ROOT / "docker-compose.runtime-loads.yml"
CPU_COMPOSE = ROOT / "docker-compose.cpu.yml"


# --- docker-compose.yml -------------------------------------------------------------------


def check_compose(path: Path) -> subprocess.CompletedProcess[str]:
    cmd = [str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def interpolate(value: object, env: dict[str, str] | None = None) -> object:
    """Compose's substitution of ``${VAR}``, ``${VAR:-default}`` and ``$$`` in a parsed file.

    Values come from ``env`` (default: nothing set); like Compose, after YAML parsing, so
    ``KEY: ${UNSET:-}`` is an empty string, not null.
    """
    env = env or {}
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        return env.get(match.group(1)) or match.group(3) or ""

    return re.sub(r"(?<!\$)\$\{(\w+)(:-([^}]*))?\}", substitute, value).replace("$$", "$")


def mount_target(volume: str) -> str:
    return volume.split(":")[1]


# How Compose merges an override into a file, for the keys these files use: mappings key
# by key, `volumes` by container path, `secrets` by name, `command`-like lists replaced,
# other lists (ports, tmpfs, cap_drop, security_opt) concatenated without duplicates.
MERGE_KEYS = {
    "volumes": mount_target,
    "secrets": lambda s: s if isinstance(s, str) else s["source"],
}


REPLACED_LISTS = {"command", "entrypoint", "test"}


def merge(base: object, override: object, key: str = "") -> object:
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for k, v in override.items():
            out[k] = merge(base[k], v, k) if k in base else v
        return out
    if isinstance(base, list) and isinstance(override, list) and key not in REPLACED_LISTS:
        by = MERGE_KEYS.get(key, lambda item: json.dumps(item, sort_keys=True))
        merged = {by(item): item for item in base}
        merged.update({by(item): item for item in override})
        return list(merged.values())
    return override


def compose_model(*overrides: Path, env: dict[str, str] | None = None) -> dict:
    """docker-compose.yml with ``overrides`` merged in, variables substituted from ``env``."""
    model = interpolate(yaml.safe_load(COMPOSE.read_text()), env)
    for path in overrides:
        model = merge(model, interpolate(yaml.safe_load(path.read_text()), env))
    return model


COMBINATIONS = {
    "default": (),
    "admin-key": (ADMIN_KEY_OVERRIDE,),
    "runtime-loads": (RUNTIME_OVERRIDE,),
    "admin-key+runtime-loads": (ADMIN_KEY_OVERRIDE, RUNTIME_OVERRIDE),
}


def test_compose_file_validates_against_the_compose_specification() -> None:
    for path in (COMPOSE, ADMIN_KEY_OVERRIDE, RUNTIME_OVERRIDE):
        done = check_compose(path)
        assert done.returncode == 0, path.name + done.stdout + done.stderr


@pytest.mark.parametrize("combination", sorted(COMBINATIONS))
def test_compose_file_with_its_overrides_merged_validates(combination, tmp_path) -> None:
    merged = tmp_path / "docker-compose.yml"
    merged.write_text(yaml.safe_dump(compose_model(*COMBINATIONS[combination])))
    done = check_compose(merged)
    assert done.returncode == 0, done.stdout + done.stderr


def test_compose_schema_check_rejects_a_broken_file(tmp_path) -> None:
    broken = COMPOSE.read_text().replace("shm_size: 4gb", "shm_size: [4]")
    broken = broken.replace("capabilities: [gpu]", "capabilities: gpu")
    (tmp_path / "docker-compose.yml").write_text(broken)
    done = check_compose(tmp_path / "docker-compose.yml")
    assert done.returncode != 0
    assert "shm_size" in done.stdout and "capabilities" in done.stdout


def test_compose_files_have_no_top_level_name_for_docker_compose_1_29() -> None:
    for path in (COMPOSE, ADMIN_KEY_OVERRIDE, RUNTIME_OVERRIDE):
        data = yaml.safe_load(path.read_text())
        assert "name" not in data and "version" not in data, path.name
    volumes = yaml.safe_load(COMPOSE.read_text())["volumes"]
    assert {n: v["name"] for n, v in volumes.items()} == {
        n: f"triton-embeddings_{n}" for n in volumes
    }


@pytest.mark.skipif(not shutil.which("docker-compose"), reason="docker-compose 1.x not installed")
@pytest.mark.parametrize("combination", sorted(COMBINATIONS))
def test_docker_compose_1_29_merges_every_combination_like_these_tests(
    combination, tmp_path
) -> None:
    files = [COMPOSE, *COMBINATIONS[combination]]
    cmd = ["docker-compose", *(a for f in files for a in ("-f", str(f)))]
    cmd += ["--profile", "perf", "--profile", "monitoring", "config"]
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    theirs = yaml.safe_load(done.stdout)["services"]
    ours = compose_model(*COMBINATIONS[combination])["services"]
    assert set(theirs) == set(ours)
    for name, service in ours.items():
        assert theirs[name].get("command") == service.get("command"), name
        assert theirs[name]["read_only"] is service["read_only"], name
        for key in ("cap_drop", "security_opt", "tmpfs"):
            assert set(theirs[name][key]) == set(service[key]), (name, key)
        secrets = [s["source"] for s in theirs[name].get("secrets", [])]
        assert secrets == service.get("secrets", []), name
        modes = {mount_target(v): v.split(":")[2] for v in theirs[name].get("volumes", [])}
        want = {mount_target(v): (v.split(":") + ["rw"])[2] for v in service.get("volumes", [])}
        assert modes == want, name
        assert set(theirs[name].get("environment", {})) == set(service.get("environment", {}))


def test_triton_service_reserves_gpus_shared_memory_volumes_and_health(compose) -> None:
    triton = compose["services"]["triton"]
    (device,) = triton["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert device["count"] == 1
    assert triton["shm_size"] == "4gb"
    assert triton["restart"] == "unless-stopped"
    assert triton["healthcheck"]["test"] == ["CMD", "python3", "/app/deploy/healthcheck.py"]
    assert triton["command"] == ["serve", "--no-build"]
    mounts = {
        mount_target(v): v.split(":")[0] for v in compose_model()["services"]["triton"]["volumes"]
    }
    assert mounts["/models"] == "model-repository"
    assert mounts[TRT_ENGINE_CACHE_DIR] == "trt-cache"
    assert {"model-repository", "hf-cache", "trt-cache"} <= set(compose["volumes"])
    assert triton["environment"]["EMBED_MODEL_REPOSITORY"] == "/models"
    assert triton["depends_on"]["generator"]["condition"] == "service_completed_successfully"


@pytest.mark.parametrize("path", [COMPOSE, CPU_COMPOSE], ids=["gpu", "cpu"])
def test_traces_are_off_by_default_and_turned_on_from_the_shell(path: Path) -> None:
    data = yaml.safe_load(path.read_text())
    services = interpolate(data, None)["services"]
    assert TraceSettings.resolve(env=services["triton"]["environment"]) is None
    url = "http://otel-collector:4318/v1/traces"
    shell = {"EMBED_TRACE_ENDPOINT": url, "EMBED_TRACE_RATE": "10"}
    traced = interpolate(data, shell)["services"]["triton"]["environment"]
    assert TraceSettings.resolve(env=traced) == TraceSettings(
        url, 10, (("service.name", "triton-embeddings"),)
    )
    for name, service in services.items():
        if name != "triton":
            assert not [k for k in service.get("environment", {}) if k.startswith("EMBED_TRACE")]


def test_generator_service_builds_into_the_same_volumes() -> None:
    generator = compose_model()["services"]["generator"]
    assert generator["command"] == ["build"]
    assert generator["build"]["target"] == "generator"
    assert generator["restart"] == "no"
    triton = compose_model()["services"]["triton"]
    mounts = {mount_target(v): v for v in generator["volumes"]}
    assert mounts["/models"] == "model-repository:/models"
    assert mounts["/cache/huggingface"] == "hf-cache:/cache/huggingface"
    assert mounts["/config/models.toml"] in triton["volumes"]
    shared = {
        k: v for k, v in triton["environment"].items()
        if not k.startswith(("TRITON_", "EMBED_TRACE_"))  # serve-only settings
    }
    assert generator["environment"] == {**shared, "HF_TOKEN": None}


def test_compose_targets_exist_and_third_party_images_are_pinned(compose) -> None:
    stages = {s for s, i, _ in dockerfile_instructions() if i == "FROM"}
    for name, service in compose["services"].items():
        if name == "gateway":  # its own image: test_gateway_service_... below
            assert service["build"]["dockerfile"] == "deploy/gateway/Dockerfile"
        elif "build" in service:
            assert service["build"]["target"] in stages, name
            assert service["build"]["dockerfile"] == "Dockerfile.triton"
            assert service["image"] == f"triton-embeddings-{service['build']['target']}:local"
        else:
            image = service["image"]
            assert re.fullmatch(r"[\w./-]+:v?\d+\.\d+\.\d+", image), image
    profiles = {n: s.get("profiles") for n, s in compose["services"].items()}
    assert profiles == {
        "generator": None,
        "triton": None,
        "gateway-config": ["gateway"],
        "gateway": ["gateway"],
        "perf": ["perf"],
        "prometheus": ["monitoring"],
        "grafana": ["monitoring"],
    }
    for name in ("prometheus", "grafana"):
        assert compose["services"][name]["restart"] == "unless-stopped"
        assert "healthcheck" in compose["services"][name]


def test_gateway_service_reads_the_generated_config_and_needs_a_key(compose) -> None:
    """The gateway profile: config written by `generator gateway-config` from the same
    manifest into a volume the gateway mounts read-only; key from the shell, no default;
    published on loopback; its image lints clean and installs only the gateway lock."""
    config, gateway = compose["services"]["gateway-config"], compose["services"]["gateway"]
    triton = compose["services"]["triton"]
    assert config["command"] == ["gateway-config", "/models/config.yaml"]
    assert config["build"]["target"] == "generator"
    assert "gateway-config:/models" in config["volumes"]
    assert [v for v in config["volumes"] if v.endswith("/config/models.toml:ro")] == [
        v for v in triton["volumes"] if v.endswith("/config/models.toml:ro")
    ]
    assert gateway["volumes"] == ["gateway-config:/gateway:ro"]
    assert gateway["depends_on"]["gateway-config"]["condition"] == "service_completed_successfully"
    assert gateway["depends_on"]["triton"]["condition"] == "service_healthy"
    assert gateway["environment"] == {
        "TRITON_HTTP_URL": "http://triton:8000",
        "LITELLM_MASTER_KEY": "${GATEWAY_API_KEY:-}",
        "GATEWAY_WORKERS": "${GATEWAY_WORKERS:-1}",
    }
    assert gateway["ports"] == ["${GATEWAY_PUBLISH_ADDRESS:-127.0.0.1}:4000:4000"]
    dockerfile = ROOT / "deploy" / "gateway" / "Dockerfile"
    done = subprocess.run([str(BIN / "hadolint"), str(dockerfile)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    text = dockerfile.read_text()
    assert "pip install --no-cache-dir -q --no-deps -r /tmp/gateway.txt" in text
    assert 'CMD ["/gateway/config.yaml"]' in text and "USER 10001:10001" in text
    assert not dockerignored("requirements/gateway.txt")
    assert not dockerignored("deploy/gateway/openai_gateway.py")


def test_perf_service_writes_to_a_mounted_folder(compose) -> None:
    perf = compose["services"]["perf"]
    assert perf["volumes"] == ["./perf-results:/results"]
    assert perf["environment"]["PERF_RESULTS"] == "/results"
    assert perf["environment"]["TRITON_GRPC_URL"] == "triton:8001"
    assert perf["depends_on"]["triton"]["condition"] == "service_healthy"


# --- the containers' security defaults ----------------------------------------------------


@pytest.mark.parametrize("combination", sorted(COMBINATIONS))
def test_every_service_drops_all_capabilities_and_privileges_on_a_read_only_root(
    combination,
) -> None:
    for name, service in compose_model(*COMBINATIONS[combination])["services"].items():
        assert service["cap_drop"] == ["ALL"], name
        assert "cap_add" not in service and "privileged" not in service, name
        assert service["security_opt"] == ["no-new-privileges:true"], name
        assert service["read_only"] is True, name
        assert "/tmp" in service["tmpfs"], name
        assert "network_mode" not in service and "pid" not in service, name


def test_triton_can_write_only_scratch_space_and_the_tensorrt_cache_by_default() -> None:
    triton = compose_model()["services"]["triton"]
    writable = {mount_target(v) for v in triton["volumes"] if not v.endswith(":ro")}
    assert writable == {TRT_ENGINE_CACHE_DIR}
    assert "model-repository:/models:ro" in triton["volumes"]
    assert not any(mount_target(v) == "/cache/huggingface" for v in triton["volumes"])
    assert triton["tmpfs"] == ["/tmp"]
    env = " ".join(a for s, i, a in dockerfile_instructions() if s == "runtime" and i == "ENV")
    (pid_file,) = re.findall(r"EMBED_PID_FILE=(\S+)", env)
    assert pid_file.startswith("/tmp/")
    assert "PYTHONDONTWRITEBYTECODE=1" in env


@pytest.mark.parametrize("combination", ["runtime-loads", "admin-key+runtime-loads"])
def test_runtime_loads_override_serves_a_writable_repository_from_the_generator_image(
    combination,
) -> None:
    triton = compose_model(*COMBINATIONS[combination])["services"]["triton"]
    mounts = {mount_target(v): v for v in triton["volumes"]}
    assert mounts["/models"] == "model-repository:/models"
    assert mounts["/cache/huggingface"] == "hf-cache:/cache/huggingface"
    assert mounts["/config/models.toml"].endswith(":ro")
    assert triton["build"]["target"] == "generator"
    assert triton["image"] == "triton-embeddings-generator:local"
    assert triton["command"] == ["serve", "--no-build"]
    assert triton["environment"]["HF_HUB_OFFLINE"] == "0"
    assert triton["environment"]["TRANSFORMERS_OFFLINE"] == "0"
    assert "/home/embed/.cache" in triton["tmpfs"]


@pytest.mark.parametrize("combination", sorted(COMBINATIONS))
def test_hf_token_reaches_only_the_services_that_export(combination) -> None:
    services = compose_model(*COMBINATIONS[combination])["services"]
    exporting = {"generator"} | ({"triton"} if "runtime-loads" in combination else set())
    with_token = {n for n, s in services.items() if "HF_TOKEN" in s.get("environment", {})}
    assert with_token == exporting
    for name in exporting:
        assert services[name]["environment"]["HF_TOKEN"] is None  # from the shell, not a file
    assert not any("env_file" in s for s in services.values())
    for path in (COMPOSE, ADMIN_KEY_OVERRIDE, RUNTIME_OVERRIDE):
        assert "HF_TOKEN=" not in path.read_text() and "hf_" not in path.read_text(), path.name


@pytest.mark.parametrize("combination", sorted(COMBINATIONS))
def test_admin_key_comes_only_from_the_secret_of_an_override(combination) -> None:
    model = compose_model(*COMBINATIONS[combination])
    keyed = {n for n, s in model["services"].items() if "secrets" in s}
    for service in model["services"].values():
        assert "EMBED_ADMIN_KEY" not in service.get("environment", {})
    if combination == "default":
        assert not keyed and "secrets" not in model
        assert "EMBED_ADMIN_KEY_FILE" not in model["services"]["triton"]["environment"]
        return
    assert keyed == {"triton", "perf"}
    perf = model["services"]["perf"]
    assert perf["environment"]["EMBED_ADMIN_KEY_FILE"] == "/run/secrets/admin-key"
    triton = model["services"]["triton"]
    assert triton["secrets"] == ["admin-key"]
    assert triton["environment"]["EMBED_ADMIN_KEY_FILE"] == "/run/secrets/admin-key"
    assert model["secrets"] == {"admin-key": {"file": "./secrets/admin-key"}}
    custom = compose_model(*COMBINATIONS[combination], env={"EMBED_ADMIN_KEY_SECRET_FILE": "/k"})
    assert custom["secrets"]["admin-key"]["file"] == "/k"
    if combination == "admin-key":
        assert "model-repository:/models:ro" in triton["volumes"]
        assert triton["image"] == "triton-embeddings-serving:local"


def test_admin_key_file_stays_out_of_the_build_context() -> None:
    assert dockerignored("secrets/admin-key")
    for path in (ADMIN_KEY_OVERRIDE, RUNTIME_OVERRIDE):
        assert "./secrets/admin-key" in path.read_text()


def test_triton_publishes_on_loopback_unless_an_address_is_given() -> None:
    ports = compose_model()["services"]["triton"]["ports"]
    assert ports == ["127.0.0.1:8000:8000", "127.0.0.1:8001:8001", "127.0.0.1:8002:8002"]
    opened = compose_model(env={"TRITON_PUBLISH_ADDRESS": "0.0.0.0"})["services"]["triton"]
    assert opened["ports"] == ["0.0.0.0:8000:8000", "0.0.0.0:8001:8001", "0.0.0.0:8002:8002"]
    for name in ("prometheus", "grafana"):
        for port in compose_model()["services"][name]["ports"]:
            assert port.startswith("127.0.0.1:"), (name, port)


def test_image_listens_on_every_interface_inside_the_container() -> None:
    env = " ".join(a for s, i, a in dockerfile_instructions() if s == "runtime" and i == "ENV")
    assert "TRITON_HOST=0.0.0.0" in env.split()
    for service in compose_model(RUNTIME_OVERRIDE, ADMIN_KEY_OVERRIDE)["services"].values():
        assert "TRITON_HOST" not in service.get("environment", {})


@pytest.mark.parametrize(
    ("password", "starts"), [(None, False), ("", False), ("admin", False), ("s3cret-Pa55", True)]
)
def test_grafana_refuses_to_start_with_the_default_admin_password(password, starts) -> None:
    env = {} if password is None else {"GRAFANA_ADMIN_PASSWORD": password}
    grafana = compose_model(env=env)["services"]["grafana"]
    shell, flag, script = grafana["entrypoint"]
    assert (shell, flag) == ("/bin/sh", "-c") and script.endswith("; exec /run.sh")
    script = script.removesuffix("exec /run.sh") + "exit 0"
    run_env = {"PATH": "/usr/bin:/bin"}
    run_env["GF_SECURITY_ADMIN_PASSWORD"] = grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"]
    done = subprocess.run([shell, flag, script], env=run_env, capture_output=True, text=True)
    assert (done.returncode == 0) == starts, done.stderr
    if not starts:
        assert "GRAFANA_ADMIN_PASSWORD" in done.stderr


# --- docker-compose.cpu.yml ---------------------------------------------------------------


def test_cpu_compose_file_validates_and_keeps_every_security_default() -> None:
    done = check_compose(CPU_COMPOSE)
    assert done.returncode == 0, done.stdout + done.stderr
    data = yaml.safe_load(CPU_COMPOSE.read_text())
    assert "name" not in data and "version" not in data
    cpu = interpolate(data, None)["services"]
    gpu = compose_model()["services"]
    for name, service in cpu.items():
        for key in ("cap_drop", "security_opt", "read_only", "command", "user", "depends_on"):
            assert service.get(key) == gpu[name].get(key), (name, key)
        assert set(service["tmpfs"]) == set(gpu[name]["tmpfs"]), name
        if "target" in gpu[name]["build"]:
            assert service["build"]["target"] == gpu[name]["build"]["target"] + "-cpu", name
        else:  # the gateway's own image, built from the CPU base
            assert service["build"]["dockerfile"] == gpu[name]["build"]["dockerfile"], name
            assert service["build"]["args"] == {"GATEWAY_BASE": "debian:bookworm-slim"}
        assert "deploy" not in service, name
    for key in ("shm_size", "init", "healthcheck", "restart"):
        assert cpu["triton"][key] == gpu["triton"][key], key
    # Locked memory (memlock) is for CUDA's pinned buffers: not raised on CPU.
    assert cpu["triton"]["ulimits"] == {"stack": gpu["triton"]["ulimits"]["stack"]}
    mounts = {mount_target(v): v for v in cpu["triton"]["volumes"]}
    assert mounts["/models"].endswith(":ro") and mounts["/config/models.toml"].endswith(":ro")
    assert all(
        p.startswith("${TRITON_PUBLISH_ADDRESS:-127.0.0.1}:")
        for p in data["services"]["triton"]["ports"]
    )
    merged = compose_model(ADMIN_KEY_OVERRIDE)["services"]["triton"]
    assert "secrets" in merged  # the admin-key override applies to the CPU file as well
