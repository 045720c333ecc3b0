"""``generator serve``'s own process: runs ``tritonserver`` and drains it on SIGTERM.

Measured on Triton 2.51 under load (6 gRPC and 2 HTTP clients, one text model): a plain
SIGTERM to ``tritonserver`` closes the gRPC endpoint, keeps serving new requests on open
HTTP keep-alive connections for the whole ``--exit-timeout-secs`` (30 s by default), then
exits "immediately" with requests still in flight (8 there), answering none of them, and
crashes (signal 11) on the way out, leaving an encoder stub spinning behind it. Requests
it had accepted after the signal were cut ("Stream removed", "connection closed").

A rollout needs the opposite: finish what was accepted, refuse what comes next. So
``generator serve`` keeps ``tritonserver`` as its child and, on SIGTERM or SIGINT:

1. marks the server as draining (``<health file>.draining``): ``deploy/healthcheck.py``
   fails from then on, so Docker and the Kubernetes readiness probe take the replica out
   of rotation;
2. keeps serving for ``EMBED_DRAIN_DELAY_S`` seconds (SIGTERM only; default 0), the time
   load balancers need to notice, so requests still routed here are answered;
3. unloads every ensemble through the repository API (admin key): Triton refuses new
   requests to an unloading model at once (gRPC ``NOT_FOUND``, HTTP 404 "... has no
   available versions") and finishes the ones it holds, queued ones included, before the
   unload completes; then every other model (no step is unloaded under a running
   ensemble request);
4. stops ``tritonserver`` (SIGTERM, then SIGKILL of its process group after
   ``STOP_WAIT_S``: nothing is loaded any more, so nothing can be lost; Triton would
   otherwise wait its exit timeout for idle HTTP connections).

A second signal during the drain skips to the stop. The drain as a whole is bounded by
``EMBED_DRAIN_TIMEOUT_S`` (default 20 s); past it the stop proceeds with whatever is left
(Triton's own exit timeout then applies). The exit status is ``tritonserver``'s (0 after a
clean stop). Whatever way the server ended, what it leaves behind goes: the stubs of its
process group that still run (after an abort, measured: an encoder stub still running
9 s later, holding its model), then its shared memory:
its Python-backend regions (``/dev/shm/<shm_prefix>*``, hundreds of MiB for an image
instance that held a large batch) and its busy boards; a crash leaves them all.

A server that dies by itself after it had been serving is started again. Measured here:
Triton 2.51 aborts as a whole ("terminate called after throwing an instance of
'boost::interprocess::lock_exception'", then death by SIGABRT) when a
Python-backend stub is killed at the moment it holds a lock in the shared memory it
shares with the server, as the OOM killer may do; upstream reports the same abort under
load in later releases too. Without a restart one such kill ends the replica. So, once
``/v2/health/live`` has answered, a server that exits with a non-zero status or a signal
other than ours is started again after ``RESTART_DELAY_S``, at most
``EMBED_MAX_RESTARTS`` times (default 3) within ``RESTART_WINDOW_S``; past that, or if it
never came up (a bad model or config: a restart would fail the same way), this process
exits with its status so that Docker or Kubernetes sees a crash loop. ``0`` turns the
restarts off. The health check fails while the new server loads (it probes readiness).

A start can also hang: about one pod start in twelve under load never listened, every
model but one loaded, ``tritonserver`` and two encoder stubs asleep in futex waits. A
loading server burns CPU (exporting nothing, it still reads, maps and initialises every
model), a hung one none. So until the server first answers ``/v2/health/live``, the
CPU time of its whole process group (server and stubs) is watched: a start whose
processes used less than 1 % of a core over ``EMBED_START_STALL_S`` seconds (default
120; 0: no watch) is killed, with the reason in the log, and started again within the
same restart budget as a crash. Docker and Kubernetes run ``generator serve`` as the
container's main process, so they get the same watch.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass

from embed_runtime.ops.stub_watch import RepositoryApi

from .triton_local import kill_group, remove_server_shm

DRAIN_SUFFIX = ".draining"
DELAY_ENV = "EMBED_DRAIN_DELAY_S"
TIMEOUT_ENV = "EMBED_DRAIN_TIMEOUT_S"
DEFAULT_DELAY_S = 0.0
DEFAULT_TIMEOUT_S = 20.0
RESTARTS_ENV = "EMBED_MAX_RESTARTS"
DEFAULT_MAX_RESTARTS = 3
RESTART_WINDOW_S = 600.0
RESTART_DELAY_S = 1.0
STALL_ENV = "EMBED_START_STALL_S"
DEFAULT_STALL_S = 120.0
STALL_CPU_SHARE = 0.01  # of one core: less over the whole window is no progress
STOP_WAIT_S = 3.0
MANAGER_MODEL = "model_manager"
PR_SET_PDEATHSIG = 1


def drain_marker(health_file: str) -> str:
    """The file that says the server on ``health_file``'s port is draining."""
    return health_file + DRAIN_SUFFIX


def _seconds(env: dict[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        raise ValueError(f"{name}={raw!r}: expected seconds between 0 and 3600")
    return value


def max_restarts(env: dict[str, str] | None = None) -> int:
    """``EMBED_MAX_RESTARTS``: crashes restarted within ``RESTART_WINDOW_S`` (0 to 100)."""
    env = os.environ if env is None else env
    raw = env.get(RESTARTS_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_RESTARTS
    if not raw.isdigit() or int(raw) > 100:
        raise ValueError(f"{RESTARTS_ENV}={raw!r}: expected a whole number from 0 to 100")
    return int(raw)


def start_stall_s(env: dict[str, str] | None = None) -> float:
    """``EMBED_START_STALL_S``: seconds without progress before a start is cut (0: never)."""
    env = os.environ if env is None else env
    return _seconds(env, STALL_ENV, DEFAULT_STALL_S)


def group_cpu_seconds(pgid: int, proc: str = "/proc") -> float:
    """CPU seconds (user + system) used so far by the live processes of group ``pgid``."""
    ticks = 0
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            with open(os.path.join(entry.path, "stat"), encoding="ascii") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError, UnicodeDecodeError):
            continue  # gone meanwhile
        # After "pid (comm)": state, ppid, pgrp, ..., utime (12th), stime (13th).
        if int(fields[2]) == pgid:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


class StartWatch:
    """Whether a starting server still makes progress: its processes keep using CPU.

    ``cpu()`` gives the CPU seconds used so far; ``clock()`` the time. Progress is at
    least ``STALL_CPU_SHARE`` of a core since the last progress; :meth:`stalled` says
    why once ``window_s`` seconds have passed without it.
    """

    def __init__(self, window_s: float, cpu: Callable[[], float],
                 clock: Callable[[], float] = time.monotonic):
        self.window_s = window_s
        self.cpu = cpu
        self.clock = clock
        self.since, self.used = clock(), cpu()

    def stalled(self) -> str | None:
        """None while the start progresses; else what was seen, for the log."""
        now, used = self.clock(), self.cpu()
        if used - self.used >= STALL_CPU_SHARE * self.window_s:
            self.since, self.used = now, used
            return None
        if now - self.since < self.window_s:
            return None
        return (f"no progress for {now - self.since:.0f} s ({used - self.used:.2f} s of CPU "
                f"used by the server and its stubs; {STALL_ENV}={self.window_s:g})")


def describe_status(status: int) -> str:
    """``exit status 1`` or ``signal SIGABRT``, for a ``Popen.returncode``."""
    if status >= 0:
        return f"exit status {status}"
    try:
        return f"signal {signal.Signals(-status).name}"
    except ValueError:
        return f"signal {-status}"


@dataclass(frozen=True)
class DrainSettings:
    """How long to keep serving after SIGTERM, and the bound on the whole drain."""

    delay_s: float = DEFAULT_DELAY_S
    timeout_s: float = DEFAULT_TIMEOUT_S

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> DrainSettings:
        """From ``EMBED_DRAIN_DELAY_S`` and ``EMBED_DRAIN_TIMEOUT_S`` (seconds)."""
        env = os.environ if env is None else env
        return cls(_seconds(env, DELAY_ENV, DEFAULT_DELAY_S),
                   _seconds(env, TIMEOUT_ENV, DEFAULT_TIMEOUT_S))


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """The server gets SIGKILL if this process is killed outright (no orphan server)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class Drainer:
    """Unloads a running server's models, ensembles first, and waits until they are gone."""

    def __init__(self, api: RepositoryApi, log: Callable[[str], None]):
        self.api = api
        self.log = log

    def loaded(self) -> list[str]:
        """Models the server has ready (or still loading), per its repository index."""
        index = json.loads(self.api.call("/v2/repository/index", {"ready": False}))
        return sorted(m["name"] for m in index if m.get("state") in ("READY", "LOADING"))

    def is_ensemble(self, model: str) -> bool:
        """Whether ``model``'s config is an ensemble's."""
        config = json.loads(self.api.call(f"/v2/models/{model}/config"))
        return config.get("platform") == "ensemble"

    def unload_all(self, deadline: float) -> bool:
        """Ensembles, then the other models, the manager last; whether all are gone."""
        models = self.loaded()
        ensembles = [m for m in models if self.is_ensemble(m)]
        steps = [m for m in models if m not in ensembles and m != MANAGER_MODEL]
        for stage in (ensembles, steps, [m for m in models if m == MANAGER_MODEL]):
            if not stage:
                continue
            for model in stage:  # Triton unloads in the background; the call returns
                self.api.call(f"/v2/repository/models/{model}/unload", {})
            if not self._wait_gone(set(stage), deadline):
                return False
            self.log(f"drain: unloaded {', '.join(stage)}")
        return True

    def _wait_gone(self, models: set[str], deadline: float) -> bool:
        while time.monotonic() < deadline:
            index = json.loads(self.api.call("/v2/repository/index", {"ready": False}))
            busy = {m["name"] for m in index if m["name"] in models
                    and m.get("state") in ("READY", "LOADING", "UNLOADING")}
            if not busy:
                return True
            time.sleep(0.05)
        return False


class Supervisor:
    """Runs ``cmd`` (``tritonserver``) as a child; SIGTERM/SIGINT drain it (module doc)."""

    def __init__(self, cmd: list[str], env: dict[str, str], http_url: str, admin_key: str,
                 health_file: str, settings: DrainSettings,
                 log: Callable[[str], None] = lambda m: print(m, flush=True),
                 restarts: int = DEFAULT_MAX_RESTARTS,
                 is_live: Callable[[], bool] | None = None, shm_prefix: str = "",
                 shm_dir: str = "/dev/shm",  # noqa: S108 - where shm_open puts regions
                 stall_s: float = DEFAULT_STALL_S):
        self.cmd = cmd
        self.env = env
        api = RepositoryApi(http_url, admin_key, timeout_s=10.0)
        self.drainer = Drainer(api, log)
        self.marker = drain_marker(health_file)
        self.settings = settings
        self.log = log
        self.max_restarts = restarts
        self.is_live = is_live or (lambda: api.answers("/v2/health/live"))
        self.child: subprocess.Popen[bytes] | None = None
        self.drained = False
        self.signals: list[int] = []
        self.wake = threading.Event()
        self.restarts: list[float] = []  # when each crash was restarted (monotonic)
        self.shm_prefix = shm_prefix
        self.shm_dir = shm_dir
        self.stall_s = stall_s
        self.stalled: str | None = None  # why the last start was cut, if it was

    def _on_signal(self, signum: int, _frame) -> None:
        self.signals.append(signum)
        self.wake.set()
        if len(self.signals) == 2 and self.child is not None:  # impatient: stop now
            self._kill(signal.SIGTERM)
        elif len(self.signals) >= 3:
            self._kill(signal.SIGKILL)

    def _kill(self, sig: int) -> None:
        if self.child is None or self.child.poll() is not None:
            return
        try:  # SIGKILL takes the stubs too; SIGTERM lets tritonserver stop them
            if sig == signal.SIGKILL:
                os.killpg(self.child.pid, sig)
            else:
                self.child.send_signal(sig)
        except ProcessLookupError:
            pass

    def run(self) -> int:
        """Start the server; returns its exit status once it has stopped for good."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        self._clear_marker()
        while True:
            status, served = self._serve_once()
            if self.signals or status == 0 or not (served or self.stalled):
                break
            if not self._restart(status):
                break
        self._clear_marker()
        if self.drained and status in (0, -signal.SIGTERM, -signal.SIGKILL):
            return 0  # every model unloaded: the kill of an idle server loses nothing
        return status if status >= 0 else 128 - status

    def _serve_once(self) -> tuple[int, bool]:
        """Run one ``tritonserver`` until it exits; (its status, whether it came up)."""
        self.child = subprocess.Popen(  # noqa: S603 - fixed binary, no shell
            self.cmd, env=self.env, start_new_session=True, preexec_fn=_die_with_parent,
        )
        served = False
        self.stalled = None
        pgid = self.child.pid
        watch = StartWatch(self.stall_s, lambda: group_cpu_seconds(pgid)) if self.stall_s else None
        while self.child.poll() is None and not self.signals:
            self.wake.wait(0.5)
            served = served or (self.child.poll() is None and self.is_live())
            if not served and watch is not None and (why := watch.stalled()) is not None:
                self.stalled = why
                self.log(f"tritonserver start stalled: {why}; killing it")
                self._kill(signal.SIGKILL)
                break
        if self.signals and self.child.poll() is None:
            self.drain(self.signals[0])
        status = self.child.wait()
        kill_group(self.child.pid)  # stubs it left running (measured: an encoder stub, 9 s on)
        self.remove_leftovers(self.child.pid)
        return status, served

    def remove_leftovers(self, server_pid: int) -> list[str]:
        """Unlink the shared memory of the stopped server ``server_pid``; the paths removed."""
        removed, size = remove_server_shm(server_pid, self.shm_prefix, self.shm_dir)
        if removed:
            self.log(f"removed {len(removed)} shared-memory files the server left behind "
                     f"({size / 2**20:.1f} MiB)")
        return removed

    def _restart(self, status: int) -> bool:
        """Whether a server that died with ``status`` is started again (module doc)."""
        now = time.monotonic()
        self.restarts = [t for t in self.restarts if now - t < RESTART_WINDOW_S]
        died = ("tritonserver start stalled" if self.stalled
                else f"tritonserver died ({describe_status(status)})")
        if len(self.restarts) >= self.max_restarts:
            self.log(f"{died}; not restarted: {len(self.restarts)} restarts within the last "
                     f"{RESTART_WINDOW_S:g} s ({RESTARTS_ENV}={self.max_restarts})")
            return False
        self.restarts.append(now)
        self.log(f"{died}; starting it again in {RESTART_DELAY_S:g} s (restart "
                 f"{len(self.restarts)} of at most {self.max_restarts} within "
                 f"{RESTART_WINDOW_S:g} s)")
        self.wake.wait(RESTART_DELAY_S)
        return not self.signals

    def drain(self, signum: int) -> None:
        """Steps 1-4 of the module doc."""
        start = time.monotonic()
        deadline = start + self.settings.timeout_s
        self._write_marker(signum)
        delay = self.settings.delay_s if signum == signal.SIGTERM else 0.0
        self.log(f"drain: {signal.Signals(signum).name}: health check failing"
                 f"{f', serving {delay:g} s more' if delay else ''}")
        self.wake.clear()
        if delay and len(self.signals) == 1:
            self.wake.wait(min(delay, self.settings.timeout_s))
        complete = False
        if len(self.signals) == 1 and self.child.poll() is None:
            try:
                complete = self.drainer.unload_all(deadline)
            except (urllib.error.URLError, OSError, ValueError) as exc:
                self.log(f"drain: the repository API failed ({exc}); stopping the server")
            if not complete:
                self.log("drain: models still loaded at the deadline; Triton's exit "
                         "timeout applies to what is in flight")
        self.drained = complete
        self.log(f"drain: stopping tritonserver after {time.monotonic() - start:.2f} s")
        self._kill(signal.SIGTERM)
        try:
            self.child.wait(STOP_WAIT_S if complete else None)
        except subprocess.TimeoutExpired:  # idle HTTP connections; nothing is loaded
            self._kill(signal.SIGKILL)

    def _write_marker(self, signum: int) -> None:
        partial = f"{self.marker}.{os.getpid()}.tmp"
        with open(partial, "w", encoding="utf-8") as handle:
            json.dump({"pid": os.getpid(), "since": time.time(),
                       "signal": signal.Signals(signum).name}, handle)
        os.replace(partial, self.marker)

    def _clear_marker(self) -> None:
        try:
            os.unlink(self.marker)
        except FileNotFoundError:
            pass
