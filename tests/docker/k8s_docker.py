"""Turn a rendered pod spec into the `docker run` that reproduces its container.

What travels: image (mapped to a locally built tag), command and args, env, user and
fsGroup, the container securityContext (read-only root, no privilege escalation,
dropped capabilities), memory / CPU limits, ports, and every volume mount: memory-backed
emptyDirs as tmpfs (/dev/shm as --shm-size of its sizeLimit), disk emptyDirs as tmpfs,
ConfigMap / Secret / PVC volumes from host paths or Docker volumes the caller provides.
Anything the translation does not know fails loudly instead of being dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]
_SUFFIXES = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def quantity(value: str | int) -> float:
    """A Kubernetes resource quantity ("2Gi", "500m", "4") as a number."""
    match = re.fullmatch(r"([0-9.]+)(m|[kMGT]i?|)", str(value))
    if not match:
        raise ValueError(f"unsupported quantity {value!r}")
    number, suffix = float(match.group(1)), match.group(2)
    return number / 1000 if suffix == "m" else number * _SUFFIXES[suffix]


@dataclass(frozen=True)
class HostBindings:
    """What the host supplies for the parts of a pod a single Docker engine lacks."""

    images: dict[str, str]
    volumes: dict[str, str]
    ports: dict[int, int] = field(default_factory=dict)
    max_cpus: float = 2.0
    publish_address: str = "127.0.0.1"


def _security_args(pod_spec: Obj, ctr: Obj) -> list[str]:
    pod_sc = pod_spec.get("securityContext", {})
    sc = {**pod_sc, **ctr.get("securityContext", {})}
    uid, gid = sc.get("runAsUser"), sc.get("runAsGroup")
    if uid is None or gid is None:
        raise ValueError("the spec must name runAsUser and runAsGroup")
    if sc.get("runAsNonRoot") and uid == 0:
        raise ValueError("runAsNonRoot with runAsUser 0")
    args = ["--user", f"{uid}:{gid}"]
    if "fsGroup" in pod_sc:
        args += ["--group-add", str(pod_sc["fsGroup"])]
    if sc.get("readOnlyRootFilesystem"):
        args.append("--read-only")
    if sc.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges:true"]
    for cap in sc.get("capabilities", {}).get("drop", []):
        args += ["--cap-drop", cap]
    for cap in sc.get("capabilities", {}).get("add", []):
        args += ["--cap-add", cap]
    return args


# The downward API fields a container may read, as this translation answers them.
_POD_FIELDS = {"metadata.name": lambda name: name, "metadata.namespace": lambda _name: "default"}
_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def container_env(ctr: Obj, name: str) -> dict[str, str]:
    """The container's environment as the kubelet sets it, for a pod called ``name``.

    Values with Kubernetes' ``$(VAR)`` expansion of earlier variables, the pod's name and
    namespace (``default``) from the downward API; optional Secrets this run does not
    create are left out.
    """
    env: dict[str, str] = {}
    for var in ctr.get("env", []):
        field_path = var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        if "value" in var:
            value = _VAR_REF.sub(lambda m: env.get(m.group(1), m.group(0)), str(var["value"]))
        elif field_path in _POD_FIELDS:
            value = _POD_FIELDS[field_path](name)
        elif var.get("valueFrom", {}).get("secretKeyRef", {}).get("optional"):
            continue
        else:
            raise ValueError(
                f"env {var['name']}: only values, pod name / namespace and optional Secrets map"
            )
        env[var["name"]] = value
    return env


def _env_args(ctr: Obj, name: str) -> list[str]:
    env = container_env(ctr, name)
    return [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]


def _volume_args(pod_spec: Obj, ctr: Obj, bindings: HostBindings) -> list[str]:
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    args = []
    for mount in ctr.get("volumeMounts", []):
        volume, path = volumes[mount["name"]], mount["mountPath"]
        if "emptyDir" in volume:
            limit = volume["emptyDir"].get("sizeLimit")
            size = f",size={int(quantity(limit))}" if limit else ""
            if path == "/dev/shm":
                args.append(f"--shm-size={int(quantity(limit))}" if limit else "--shm-size=64m")
            else:
                args += ["--tmpfs", f"{path}:rw,mode=1777{size}"]
            continue
        if not {"configMap", "secret", "persistentVolumeClaim"} & volume.keys():
            raise ValueError(f"volume {mount['name']}: unsupported source")
        read_only = mount.get("readOnly", False) or volume.get("persistentVolumeClaim", {}).get(
            "readOnly", False
        )
        source = bindings.volumes[mount["name"]]
        args += ["-v", f"{source}:{path}{':ro' if read_only else ''}"]
    return args


def _resource_args(ctr: Obj, bindings: HostBindings) -> list[str]:
    limits = ctr.get("resources", {}).get("limits", {})
    args = []
    if "memory" in limits:
        args += ["--memory", str(int(quantity(limits["memory"])))]
    if "cpu" in limits:
        args += ["--cpus", f"{min(quantity(limits['cpu']), bindings.max_cpus):g}"]
    if set(limits) - {"memory", "cpu"}:
        raise ValueError(
            f"limits Docker cannot give here: {sorted(set(limits) - {'memory', 'cpu'})}"
        )
    return args


def docker_run(pod_spec: Obj, ctr: Obj, bindings: HostBindings, name: str) -> list[str]:
    """The `docker run` argv (without `-d` / `--rm`) for container ``ctr`` of ``pod_spec``."""
    args = ["docker", "run", "--name", name]
    args += _security_args(pod_spec, ctr)
    args += _env_args(ctr, name)
    args += _volume_args(pod_spec, ctr, bindings)
    args += _resource_args(ctr, bindings)
    for port in ctr.get("ports", []):
        host = bindings.ports[port["containerPort"]]
        args += ["-p", f"{bindings.publish_address}:{host}:{port['containerPort']}"]
    command = ctr.get("command", [])
    if command:
        args += ["--entrypoint", command[0]]
    args.append(bindings.images[ctr["image"]])
    return args + command[1:] + ctr.get("args", [])


def probe_target(ctr: Obj, probe: str) -> tuple[int, str]:
    """(containerPort, path) of an httpGet probe; a named port resolves to its number."""
    get = ctr[probe]["httpGet"]
    port = get["port"]
    if isinstance(port, str):
        port = next(p["containerPort"] for p in ctr["ports"] if p.get("name") == port)
    return int(port), get["path"]


def probe_command(ctr: Obj, probe: str) -> list[str]:
    """The command of an exec probe (run inside the container; exit 0 passes)."""
    return list(ctr[probe]["exec"]["command"])


def probe_budget_s(ctr: Obj, probe: str) -> float:
    """How long a probe may keep failing before the kubelet gives up (period x threshold)."""
    spec = ctr[probe]
    return spec.get("periodSeconds", 10) * spec.get("failureThreshold", 3) + spec.get(
        "initialDelaySeconds", 0
    )
