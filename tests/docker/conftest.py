"""The CPU Docker stack checks: run by `make test-docker` (deploy/docker/test_docker.sh).

They need the stack that script brings up, so they are collected only when it sets
EMBED_DOCKER_STACK=1; `make test` (`pytest tests`) never collects them.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

if os.environ.get("EMBED_DOCKER_STACK") != "1":
    collect_ignore_glob = ["test_*.py"]

# The Kubernetes container run (test_k8s_*.py) starts containers of its own: collected only
# in its own step of test_docker.sh (EMBED_DOCKER_K8S=1), not with the compose checks.
if os.environ.get("EMBED_DOCKER_K8S") != "1":
    collect_ignore_glob = [*globals().get("collect_ignore_glob", []), "test_k8s_*.py"]


# The compose gateway (test_gateway_stack.py): its own step of test_docker.sh, which brings
# the `gateway` profile up and names its URL; not with the stack's other checks.
if "EMBED_DOCKER_GATEWAY_URL" not in os.environ:
    collect_ignore_glob = [*globals().get("collect_ignore_glob", []), "test_gateway_stack.py"]


# The gateway's image (test_gateway_image.py) runs in its own step, `make test-gateway-image`
# (deploy/gateway/test_image.sh, EMBED_DOCKER_GATEWAY=1), which builds that image.
if os.environ.get("EMBED_DOCKER_GATEWAY") != "1":
    collect_ignore_glob = [*globals().get("collect_ignore_glob", []), "test_gateway_image.py"]
elif os.environ.get("EMBED_DOCKER_STACK") != "1":
    collect_ignore_glob = [g for g in globals().get("collect_ignore_glob", []) if g != "test_*.py"]
    collect_ignore_glob += ["test_stack.py", "test_k8s_*.py"]


# --- the Kubernetes pods (test_k8s_*.py): one rendered overlay, one built repository ------


@pytest.fixture(scope="session")
def objects() -> list[dict]:
    """The rendered CPU overlay (`kubectl kustomize deploy/k8s/overlays/cpu`)."""
    from tests.docker import k8s_manifests as k8s

    return k8s.render("overlays/cpu")


@pytest.fixture(scope="session")
def host_files(objects):
    """The ConfigMap's files and the Secret's key, as the kubelet would project them."""
    from tests.docker import k8s_manifests as k8s

    with tempfile.TemporaryDirectory(prefix="k8s-") as tmp:
        root = Path(tmp)
        config = k8s.find(objects, "ConfigMap")
        (root / "config").mkdir()
        for name, text in config["data"].items():
            (root / "config" / name).write_text(text)
        os.chmod(root, 0o755)
        os.chmod(root / "config", 0o755)
        pod = k8s.find(objects, "Deployment")["spec"]["template"]["spec"]
        secret = next(v["secret"] for v in pod["volumes"] if "secret" in v)
        key_dir = root / "secret"
        key_dir.mkdir(mode=0o755)
        key = key_dir / "admin-key"
        key.write_text(Path(os.environ["EMBED_ADMIN_KEY_FILE"]).read_text())
        os.chown(key, 0, pod["securityContext"]["fsGroup"])
        os.chmod(key, secret["defaultMode"])
        yield {"manifest": str(root / "config"), "admin-key": str(key_dir)}


@pytest.fixture(scope="session")
def repository(objects, host_files):
    """The build Job's container run once: exports the manifest into the PVC volume."""
    from tests.docker import k8s_docker, k8s_pods
    from tests.docker import k8s_manifests as k8s

    name = f"{k8s_pods.PREFIX}-build"
    k8s_pods.docker("rm", "-f", name, check=False)
    k8s_pods.docker("volume", "rm", "-f", k8s_pods.VOLUME, check=False)
    k8s_pods.docker("volume", "create", k8s_pods.VOLUME)
    pod = k8s.find(objects, "Job", "triton-embeddings-build")["spec"]["template"]["spec"]
    ctr = k8s.container(pod, "build")
    argv = k8s_docker.docker_run(pod, ctr, k8s_pods.bindings(ctr, host_files, {}), name)
    start = time.monotonic()
    out = subprocess.run(argv, capture_output=True, text=True)
    (k8s_pods.work_dir() / "k8s-build.log").write_text(out.stdout + out.stderr)
    assert out.returncode == 0, out.stderr[-3000:]
    k8s_pods.record(
        f"k8s build Job container (export into the volume) {time.monotonic() - start:.0f} s"
    )
    k8s_pods.docker("rm", "-f", name, check=False)
    yield k8s_pods.VOLUME
    k8s_pods.docker("volume", "rm", "-f", k8s_pods.VOLUME, check=False)
