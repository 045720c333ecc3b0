"""Dead Python-backend stubs, found from ``/proc`` and replaced by reloading their model.

Triton 2.51's Python backend does not start a stub again once it has died (``kill -9``,
the OOM killer, which picks the largest process: an encoder stub): every request routed
to that instance fails with "Stub process ... is not healthy" while the model, the
server and every health probe stay ready. Nor does loading the model again through the
repository API help: Triton skips the load of a model whose files and config have not
changed (measured on this Triton). A load whose config override differs does reload it:
new instances with new stubs, swapped in once they are ready, while the old ones keep
serving. So :class:`StubWatch` polls the server's stub processes (their command line
names the instance, ``<model>_<group>_<index>``, and the model's ``model.py``), and when
an instance that was running is gone while its model is still loaded, it reloads that
model through the repository API with the model's own config plus a new
``stub_generation`` parameter. A model unloaded on purpose is not ready, so it is left
alone. The model that runs the watch never watches itself.

Triton does not remove the shared-memory region of a stub that died (measured: one
region left in /dev/shm per killed stub, 25 after 25 kills; an image instance's region
grows to hundreds of MiB), so once the model is reloaded the watch unlinks it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple

from ..config_params import ConfigParams, param
from .probe import PROBE_INTERVAL_S

STUB_BINARY = "triton_python_backend_stub"
INSTANCE_RE = re.compile(r"\d+_\d+")  # <model>_<group>_<index>
GENERATION_PARAMETER = "stub_generation"


def _seconds(value: float) -> str:
    return f"{value:g}"


@dataclass(frozen=True)
class WatchParams(ConfigParams):
    """How often ``model_manager`` lists the stubs and probes each ensemble (0: never).

    The build writes them into ``model_manager``'s config (the manifest's
    ``[model_manager] health_probe_interval_s``); its stub reads them back.
    """

    params_name: ClassVar[str] = "model_manager"

    health_probe_interval_s: float = param(PROBE_INTERVAL_S, always=True, encode=_seconds)
    stub_watch_interval_s: float = param(1.0, encode=_seconds)


class Stub(NamedTuple):
    """One running stub process: its model, its pid and its shared-memory region's name."""

    model: str
    pid: int
    region: str


def live_stubs(server_pid: int, proc: str = "/proc") -> dict[str, str]:
    """Instance name -> model name of every running stub of the server ``server_pid``."""
    return {instance: stub.model for instance, stub in stub_processes(server_pid, proc).items()}


def stub_processes(server_pid: int, proc: str = "/proc") -> dict[str, Stub]:
    """Instance name -> :class:`Stub` of every running stub of the server ``server_pid``.

    A stub's command line is ``<stub> <repo>/<model>/<version>/model.py <shm region> ...
    <parent pid> <backend dir> <ipc handle> <instance name> ...``; zombies (killed stubs
    not yet reaped), stubs of other servers and the short-lived stub a model load starts
    to complete the model's config (named after the model, not an instance) are left out.
    """
    stubs: dict[str, Stub] = {}
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc, entry, "cmdline"), "rb") as handle:
                args = handle.read().split(b"\0")
            with open(os.path.join(proc, entry, "stat"), encoding="utf-8") as handle:
                state = handle.read().rsplit(")", 1)[-1].split()[0]
        except (OSError, IndexError):
            continue
        if len(args) < 9 or not args[0].endswith(STUB_BINARY.encode()) or state == "Z":
            continue
        if args[5] != str(server_pid).encode():
            continue
        model = os.path.basename(os.path.dirname(os.path.dirname(args[1].decode())))
        instance = args[8].decode()
        if INSTANCE_RE.fullmatch(instance.removeprefix(model + "_")) and instance != model:
            # not the short-lived stub of a load
            stubs[instance] = Stub(model, int(entry), args[2].decode())
    return stubs


@dataclass
class StubWatch:
    """Remembers every stub it has seen running; reloads the model of one that vanished.

    ``is_ready(model)`` tells a model unloaded on purpose (not ready) from one whose stub
    died (still ready); ``reload(model)`` starts its instances again. ``events`` records
    each reload: (model, the instances found dead, seconds the reload took, error or "").
    """

    server_pid: int
    is_ready: Callable[[str], bool]
    reload: Callable[[str], None]
    own_model: str = ""
    proc: str = "/proc"
    health_file: str = ""
    seen: dict[str, str] = field(default_factory=dict)
    events: list[tuple[str, tuple[str, ...], float, str]] = field(default_factory=list)
    degraded: dict[str, list[str]] = field(default_factory=dict)
    failures_in_a_row: int = 0
    failing_probes: dict[str, str] = field(default_factory=dict)  # runtime/probe.py
    regions: dict[str, str] = field(default_factory=dict)  # instance -> its shm region
    shm_dir: str = "/dev/shm"  # noqa: S108 - where shm_open puts the regions

    def poll(self) -> list[str]:
        """One look at the stubs; returns the models reloaded."""
        stubs = stub_processes(self.server_pid, self.proc)
        live = {instance: stub.model for instance, stub in stubs.items()}
        self.seen.update({i: m for i, m in live.items() if m != self.own_model})
        self.regions.update({i: s.region for i, s in stubs.items() if i in self.seen})
        dead: dict[str, list[str]] = {}
        for instance, model in self.seen.items():
            if instance not in live:
                dead.setdefault(model, []).append(instance)
        self.degraded = {m: sorted(i) for m, i in dead.items() if self.is_ready(m)}
        self.write_health()  # degraded until the reloads below are done
        reloaded = []
        for model, instances in sorted(dead.items()):
            if model in self.degraded:  # else unloaded (or being unloaded) on purpose
                start, error = time.monotonic(), ""
                try:
                    self.reload(model)
                    reloaded.append(model)
                    del self.degraded[model]
                except Exception as exc:  # noqa: BLE001 - recorded; the next poll retries
                    error = f"{type(exc).__name__}: {exc}"
                self.failures_in_a_row = self.failures_in_a_row + 1 if error else 0
                self.events.append((model, tuple(sorted(instances)),
                                    round(time.monotonic() - start, 3), error))
                if error:
                    continue
            for instance in instances:  # seen again once the new stubs are up
                del self.seen[instance]
                self._remove_region(self.regions.pop(instance, ""))
        self.write_health()
        return reloaded

    def _remove_region(self, region: str) -> None:
        """Unlink a dead stub's region (the server unmaps it with the old instance)."""
        if not region or os.sep in region or region in (".", ".."):
            return
        try:
            os.unlink(os.path.join(self.shm_dir, region))
        except OSError:
            pass  # already gone (a server that does clean up), or never there

    def end_hung(self, instances: set[str]) -> list[str]:
        """SIGKILL the stubs of ``instances`` that still run; the next poll replaces them.

        For stubs Triton reports "not healthy" (it stopped using them: they hang) while
        their process is still there, which the process list alone never shows. Returns
        the instances killed.
        """
        killed = []
        for instance, stub in stub_processes(self.server_pid, self.proc).items():
            if instance in instances:
                try:
                    os.kill(stub.pid, signal.SIGKILL)
                    killed.append(instance)
                except ProcessLookupError:
                    pass
        return sorted(killed)

    def write_health(self) -> None:
        """The watch's state for the health check (``deploy/healthcheck.py``), atomically."""
        if not self.health_file:
            return
        state = {
            "server_pid": self.server_pid,
            "updated": time.time(),
            "degraded": self.degraded,
            "failures_in_a_row": self.failures_in_a_row,
            "reloads": sum(1 for e in self.events if not e[3]),
            "failing_probes": self.failing_probes,
        }
        partial = f"{self.health_file}.{os.getpid()}.tmp"
        with open(partial, "w", encoding="utf-8") as handle:
            json.dump(state, handle)
        os.replace(partial, self.health_file)


class RepositoryApi:
    """The server's own HTTP endpoint: model readiness, config and (re)load with the admin key."""

    def __init__(self, http_url: str, admin_key: str, timeout_s: float = 120.0):
        self.base = f"http://{http_url}"
        self.headers = {"X-Admin-Key": admin_key, "Content-Type": "application/json"}
        self.timeout_s = timeout_s
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self.generation = int(time.time())

    def call(self, path: str, body: dict | None = None) -> bytes:
        """GET ``path`` (``body`` None) or POST ``body`` as JSON; the reply's bytes."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(  # noqa: S310 - the server's own loopback URL
            self.base + path, data=data, headers=self.headers,
            method="GET" if body is None else "POST",
        )
        with self.opener.open(request, timeout=self.timeout_s) as response:
            return response.read()

    def answers(self, path: str) -> bool:
        """A GET of ``path`` answered 200 (``/v2/health/live``, a model's ``/ready``)."""
        try:
            self.call(path)
            return True
        except (urllib.error.URLError, OSError):
            return False

    def is_ready(self, model: str) -> bool:
        """``/v2/models/<model>/ready`` answered 200."""
        return self.answers(f"/v2/models/{model}/ready")

    def reload(self, model: str) -> None:
        """Load ``model`` with its own config and a new ``stub_generation``: fresh stubs."""
        config = json.loads(self.call(f"/v2/models/{model}/config"))
        self.generation += 1
        parameters = config.setdefault("parameters", {})
        parameters[GENERATION_PARAMETER] = {"string_value": str(self.generation)}
        body = {"parameters": {"config": json.dumps(config)}}
        self.call(f"/v2/repository/models/{model}/load", body)


def health_path(http_port: int | str, env: dict[str, str] | None = None) -> str:
    """Where the watch of the server on ``http_port`` writes its state.

    ``$EMBED_HEALTH_FILE``, else ``<temp dir>/embed-health-<uid>-<port>.json``: the health
    check of a container (same user, same temp dir, the port it probes) finds it there.
    """
    env = os.environ if env is None else env
    default = os.path.join(tempfile.gettempdir(), f"embed-health-{os.getuid()}-{http_port}.json")
    return env.get("EMBED_HEALTH_FILE") or default


def server_http_url(server_pid: int, proc: str = "/proc") -> str:
    """``host:port`` of the server's HTTP endpoint, read from its command line."""
    with open(os.path.join(proc, str(server_pid), "cmdline"), "rb") as handle:
        args = [a.decode() for a in handle.read().split(b"\0") if a]
    values = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
    host = loopback_for(values.get("http-address", ""))
    port = values.get("http-port", "8000")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# Wildcard listen addresses, and the loopback address that reaches each from the same host.
_WILDCARDS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}  # noqa: S104 - a lookup


def loopback_for(host: str) -> str:
    """The address that reaches a server listening on ``host`` from the same machine."""
    return _WILDCARDS.get(host, host)
