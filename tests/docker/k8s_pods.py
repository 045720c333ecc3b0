"""Pods of the rendered CPU overlay run as Docker containers (`make test-docker`).

Shared by the container checks (test_k8s_container.py) and the rolling update behind a
load balancer (test_k8s_rollout.py): where the run's files go, the container names, the
`docker run` of a pod's container (k8s_docker.py) and what the kubelet does around it:
wait for the startup probe, run an exec probe, collect the logs when the pod goes.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.docker import k8s_docker

TAG = os.environ.get("EMBED_K8S_IMAGE_TAG", "local")
PREFIX = "triton-embeddings-k8s-test"
VOLUME = f"{PREFIX}_repository"
NAMESPACE = "triton-embeddings"
TEXT_MODEL = "all-MiniLM-L6-v2"


def work_dir() -> Path:
    """Where this run's logs and timings go ($EMBED_DOCKER_WORK of test_docker.sh)."""
    return Path(os.environ["EMBED_DOCKER_WORK"])


def record(line: str) -> None:
    """Append a timing or figure to k8s.txt (test_docker.sh prints it with its timings)."""
    with (work_dir() / "k8s.txt").open("a") as out:
        out.write(line + "\n")
    print(f"\n{line}")


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port nothing listens on now, below the kernel's ephemeral range, not handed out.

    A port from the ephemeral range (what binding to port 0 gives) can be taken by any
    outgoing connection before docker binds it: the rollout test once failed on "Bind for
    127.0.0.1:49625 failed: port is already allocated" while its load ran.
    """
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(500):
        port = random.randrange(max(1024, low - 12000), low)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError("no free port below the ephemeral range")


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run the docker CLI; its output as text."""
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check)


def local_image(image: str) -> str:
    """The locally built tag of a rendered image name."""
    return image.rsplit(":", 1)[0] + ":" + TAG


def bindings(ctr: dict, host_files: dict, ports: dict[int, int]) -> k8s_docker.HostBindings:
    """What this host supplies to a pod's container: image, volumes, published ports."""
    return k8s_docker.HostBindings(
        images={ctr["image"]: local_image(ctr["image"])},
        volumes={**host_files, "model-repository": VOLUME},
        ports=ports,
        max_cpus=float(os.cpu_count() or 2),
    )


def http_status(url: str) -> int:
    """The status of a GET, 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return resp.status
    except OSError:
        return 0


@dataclass
class Pod:
    """One pod's container, started by :func:`start`."""

    ctr: dict
    ports: dict[int, int]
    name: str
    ready_s: float
    restarts: int = 0


def start(
    pod: dict,
    ctr: dict,
    host_files: dict,
    name: str,
    env: dict | None = None,
    ports: dict[int, int] | None = None,
    restart_after_s: float | None = None,
) -> Pod:
    """Run ``ctr`` detached; return it once its startup probe passes.

    ``env`` adds variables to the container's own, as a changed pod template would;
    ``ports`` maps container ports to host ports (default: free ones). With
    ``restart_after_s``, a container whose startup probe has not passed by then is
    restarted, as the kubelet restarts one that exhausts its startup probe (the spec's
    budget, 900 s, is shortened for a test): at most twice, each restart counted.
    """
    if env:
        extra = [{"name": k, "value": v} for k, v in env.items()]
        ctr = {**ctr, "env": [*ctr.get("env", []), *extra]}
    ports = ports or {p["containerPort"]: free_port() for p in ctr["ports"]}
    docker("rm", "-f", name, check=False)
    argv = k8s_docker.docker_run(pod, ctr, bindings(ctr, host_files, ports), name)
    port, path = k8s_docker.probe_target(ctr, "startupProbe")
    budget = k8s_docker.probe_budget_s(ctr, "startupProbe")
    began = attempt = time.monotonic()
    restarts = 0
    subprocess.run([*argv[:2], "-d", *argv[2:]], capture_output=True, text=True, check=True)
    while time.monotonic() - began < budget:
        if http_status(f"http://127.0.0.1:{ports[port]}{path}") == 200:
            return Pod(ctr, ports, name, time.monotonic() - began, restarts)
        running = docker("inspect", "-f", "{{.State.Running}}", name).stdout.strip()
        assert running == "true", docker("logs", "--tail", "60", name).stderr
        if restart_after_s and restarts < 2 and time.monotonic() - attempt > restart_after_s:
            (work_dir() / f"{name}-start-{restarts}.log").write_text(logs(name))
            record(f"{name}: not ready {restart_after_s:.0f} s after start, restarted")
            docker("restart", "-t", "5", name)
            restarts += 1
            attempt = time.monotonic()
        time.sleep(0.25)
    raise AssertionError(f"{name}: not ready within the startup budget of {budget} s")


def logs(name: str) -> str:
    """The container's output so far (stdout and stderr)."""
    out = docker("logs", name, check=False)
    return out.stdout + out.stderr


def remove(name: str) -> None:
    """Keep the container's logs under the work dir, then remove it."""
    (work_dir() / f"{name}.log").write_text(logs(name))
    docker("rm", "-f", name, check=False)


def exec_probe(name: str, ctr: dict, probe: str) -> int:
    """Run an exec probe inside the container as the kubelet does; its exit status."""
    command = k8s_docker.probe_command(ctr, probe)
    return docker("exec", name, *command, check=False).returncode
