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

The instances a model should run are those of its config, not only those the watch has
seen: ``model_manager`` starts the watch while the other models still load, and its first
look comes up to a poll after the server reports ready, so a stub killed at once was never
seen, and never replaced (measured: an encoder killed as the server became ready ran one
stub of two 10 s on). So once the server is ready, the watch takes the instance names of
every ready Python-backend model from its config (``<group name>_<index>``, the names the
stubs' command lines carry) before its first look.

Triton does not remove the shared-memory region of a stub that died (measured: one
region left in /dev/shm per killed stub, 25 after 25 kills; an image instance's region
grows to hundreds of MiB), so once the model is reloaded the watch unlinks it.

Nor does Triton ever unload the version it replaced when one of its stubs had died
(measured: no "successfully unloaded" for it, 8 minutes on; a reload with no dead stub
unloads the old version within 3 s). Its other stubs run on, idle, under the very
instance names of the new ones: ``all-MiniLM-L6-v2_encode_0_1`` twice after a kill of
``_0_0``. A later kill of the new ``_0_1`` then went unseen (the old one still ran under
that name) and a third of the requests failed for as long as anyone watched. So every
stub of the model that ran before a reload of the watch's own is retired: it counts for
no instance, and it is ended :data:`RETIRE_AFTER_S` after the reload (the requests that
version had queued at the swap are done by then) and its region unlinked, so a killed
encoder no longer leaves a whole encoder process behind either.
"""

from __future__ import annotations

import contextlib
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
from .server_exit import running, stub_command_lines

INSTANCE_RE = re.compile(r"\d+_\d+")  # <model>_<group>_<index>
GENERATION_PARAMETER = "stub_generation"
# How long the stubs of a replaced model version run on after the reload returned: the
# requests queued to that version at the swap end first (admission bounds a queue to a
# quarter of a second of work), and an idle stub is the safest to kill.
RETIRE_AFTER_S = 2.0


def _sigkill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


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
    """One running stub process: its model, pid, shared-memory region and instance name."""

    model: str
    pid: int
    region: str
    instance: str = ""


def live_stubs(server_pid: int, proc: str = "/proc") -> dict[str, str]:
    """Instance name -> model name of every running stub of the server ``server_pid``."""
    return {instance: stub.model for instance, stub in stub_processes(server_pid, proc).items()}


def stub_processes(server_pid: int, proc: str = "/proc") -> dict[str, Stub]:
    """Instance name -> :class:`Stub` of every running stub of the server ``server_pid``.

    A name that a replaced model version's stub still carries (see the module doc) maps
    to either process: :func:`running_stubs` lists both.
    """
    return {stub.instance: stub for stub in running_stubs(server_pid, proc)}


def running_stubs(server_pid: int, proc: str = "/proc") -> list[Stub]:
    """Every running stub process of the server ``server_pid``, in pid order.

    A stub's command line is ``<stub> <repo>/<model>/<version>/model.py <shm region> ...
    <parent pid> <backend dir> <ipc handle> <instance name> ...``; zombies (killed stubs
    not yet reaped), stubs of other servers and the short-lived stub a model load starts
    to complete the model's config (named after the model, not an instance) are left out.
    """
    stubs: list[Stub] = []
    for pid, args in stub_command_lines(server_pid, proc):
        if len(args) < 9 or not running(pid, proc):
            continue
        model = os.path.basename(os.path.dirname(os.path.dirname(args[1].decode())))
        instance = args[8].decode()
        if INSTANCE_RE.fullmatch(instance.removeprefix(model + "_")) and instance != model:
            # not the short-lived stub of a load
            stubs.append(Stub(model, pid, args[2].decode(), instance))
    return sorted(stubs, key=lambda stub: stub.pid)


@dataclass
class StubWatch:
    """Remembers every stub it has seen running; reloads the model of one that vanished.

    ``is_ready(model)`` tells a model unloaded on purpose (not ready) from one whose stub
    died (still ready); ``reload(model)`` starts its instances again. ``events`` records
    each reload: (model, the instances found dead, seconds the reload took, error or "").
    ``seen`` maps each instance to its stub; the stubs of a version this watch replaced
    are ``retiring`` (pid -> (stub, when it is ended)): they count for no instance.
    ``configured()``: model -> the instance names its config gives, for each ready model
    (None while the server is not ready); asked until it answers, before the first look.
    A reloaded model's new stubs are in ``seen`` at once (they run once the reload has
    returned): one that dies before the next look is replaced as well.
    """

    server_pid: int
    is_ready: Callable[[str], bool]
    reload: Callable[[str], None]
    own_model: str = ""
    proc: str = "/proc"
    health_file: str = ""
    seen: dict[str, Stub] = field(default_factory=dict)
    events: list[tuple[str, tuple[str, ...], float, str]] = field(default_factory=list)
    degraded: dict[str, list[str]] = field(default_factory=dict)
    failures_in_a_row: int = 0
    failing_probes: dict[str, str] = field(default_factory=dict)  # runtime/probe.py
    retiring: dict[int, tuple[Stub, float]] = field(default_factory=dict)
    shm_dir: str = "/dev/shm"  # noqa: S108 - where shm_open puts the regions
    clock: Callable[[], float] = time.monotonic
    kill: Callable[[int], None] = _sigkill
    configured: Callable[[], dict[str, set[str]] | None] | None = None
    reloaded_at: dict[str, float] = field(default_factory=dict)  # model -> clock()

    def poll(self) -> list[str]:
        """One look at the stubs; returns the models reloaded."""
        if self.configured is not None:
            self._learn_configured()
        stubs = [s for s in running_stubs(self.server_pid, self.proc)
                 if s.model != self.own_model]
        self._end_retired({s.pid: s for s in stubs})
        live = {s.instance: s for s in stubs if s.pid not in self.retiring}
        self.seen.update(live)
        dead: dict[str, list[Stub]] = {}
        for instance, stub in self.seen.items():
            if instance not in live:
                dead.setdefault(stub.model, []).append(stub)
        self.degraded = {m: sorted(s.instance for s in gone) for m, gone in dead.items()
                         if self.is_ready(m)}
        self.write_health()  # degraded until the reloads below are done
        reloaded = []
        for model, gone in sorted(dead.items()):
            if model not in self.degraded:  # unloaded (or being unloaded) on purpose
                for stub in gone:
                    del self.seen[stub.instance]
                    self._remove_region(stub.region)
                continue
            start, error = time.monotonic(), ""
            try:
                self.reload(model)
                reloaded.append(model)
                del self.degraded[model]
            except Exception as exc:  # noqa: BLE001 - recorded; the next poll retries
                error = f"{type(exc).__name__}: {exc}"
            self.failures_in_a_row = self.failures_in_a_row + 1 if error else 0
            self.events.append((model, tuple(sorted(s.instance for s in gone)),
                                round(time.monotonic() - start, 3), error))
            if not error:
                self._replaced(model, stubs)
                for stub in gone:
                    self._remove_region(stub.region)
        self.write_health()
        return reloaded

    def _replaced(self, model: str, before: list[Stub]) -> None:
        """After a reload of ``model``: retire the stubs listed ``before`` it, see the new.

        Its instances are now those of its new stubs: a config with fewer instances than
        before is not reloaded again.
        """
        self.reloaded_at[model] = until = self.clock()
        for stub in before:
            if stub.model == model:
                self.retiring.setdefault(stub.pid, (stub, until + RETIRE_AFTER_S))
        fresh = {s.instance: s for s in running_stubs(self.server_pid, self.proc)
                 if s.model == model and s.pid not in self.retiring}
        self.seen = {i: s for i, s in self.seen.items() if s.model != model} | fresh

    def _learn_configured(self) -> None:
        """Every configured instance of the ready models into ``seen``, once (module doc)."""
        try:
            configured = self.configured()
        except (OSError, ValueError):  # no answer (yet): the next poll asks again
            return
        if configured is None:
            return
        self.configured = None
        for model, instances in configured.items():
            if model != self.own_model:
                for instance in instances:  # a stub that runs replaces it in this poll
                    self.seen.setdefault(instance, Stub(model, 0, "", instance))

    def _end_retired(self, running: dict[int, Stub]) -> None:
        """SIGKILL the replaced versions' stubs whose time is up; forget those gone."""
        now = self.clock()
        for pid, (stub, until) in list(self.retiring.items()):
            if running.get(pid) != stub:
                del self.retiring[pid]
                self._remove_region(stub.region)
            elif now >= until:
                with contextlib.suppress(ProcessLookupError):
                    self.kill(pid)

    def _remove_region(self, region: str) -> None:
        """Unlink a dead stub's region (the server unmaps it with the old instance)."""
        if not region or os.sep in region or region in (".", ".."):
            return
        try:
            os.unlink(os.path.join(self.shm_dir, region))
        except OSError:
            pass  # already gone (a server that does clean up), or never there

    def end_hung(self, instances: dict[str, float]) -> list[str]:
        """SIGKILL the stubs of ``instances`` that still run; the next poll replaces them.

        For stubs Triton reports "not healthy" (it stopped using them: they hang) while
        their process is still there, which the process list alone never shows.
        ``instances`` maps each to when Triton's report came (:attr:`clock`): a stub this
        watch started by a reload since then is not the one reported, and is spared.
        Returns the instances killed.
        """
        killed = []
        for stub in running_stubs(self.server_pid, self.proc):
            reported = instances.get(stub.instance)
            if (reported is not None and stub.pid not in self.retiring
                    and reported > self.reloaded_at.get(stub.model, float("-inf"))):
                try:
                    self.kill(stub.pid)
                    killed.append(stub.instance)
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

    def python_instances(self) -> dict[str, set[str]] | None:
        """Model -> its instance names, for each ready Python-backend model.

        None while the server is not ready (see :class:`StubWatch`'s ``configured``).
        """
        if not self.answers("/v2/health/ready"):
            return None
        found = {}
        for entry in json.loads(self.call("/v2/repository/index", {"ready": True})):
            model = entry.get("name", "")
            if entry.get("state") != "READY":
                continue
            config = json.loads(self.call(f"/v2/models/{model}/config"))
            if config.get("backend") == "python":
                found[model] = {
                    f"{group.get('name') or f'{model}_{g}'}_{index}"
                    for g, group in enumerate(config.get("instance_group", []))
                    for index in range(int(group.get("count", 1)))
                }
        return found

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
