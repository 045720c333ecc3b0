"""Container health check: exit 0 when the server is ready and no stub is dead.

Ready (the default check): Triton answers ``/v2/health/ready`` with 200, no model runs
short of a dead Python-backend stub, and the server is not draining. Live
(``--live``, the Kubernetes liveness probe): Triton answers ``/v2/health/live``, the stub
watch still runs and reloads of dead stubs have not failed three times in a row; a
degraded model waiting for its reload, or a drain, is not a reason to restart.

Used by ``HEALTHCHECK`` in Dockerfile.triton and by docker-compose.yml. Standard library
only; the port is ``$TRITON_HTTP_PORT`` (default 8000), the one ``generator serve`` uses,
and the address the server's own: ``$TRITON_HOST`` when it names one, else loopback. The
probe ignores ``http_proxy`` / ``HTTP_PROXY`` and the like: a proxy set in the container
for hub downloads must not receive (or answer) the server's health check.

Triton's readiness stays green while a model's stub is dead, so the check also reads the
state the server's stub watch writes every second (``embed_runtime/ops/stub_watch.py``,
``<temp dir>/embed-health-<uid>-<port>.json`` or ``$EMBED_HEALTH_FILE``): unhealthy while
a model waits for its reload, when an ensemble failed its last two health probes (one
tiny request through every step, ``embed_runtime/ops/probe.py``), when reloads failed
three times in a row, or when the watch of a running server stopped writing. From
SIGTERM on, ``generator serve`` drains the server (``generator/supervisor.py``) and says
so in ``<health file>.draining``: not ready from then on, so load balancers stop sending
before the models are unloaded.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import tempfile
import time
import urllib.request

DRAIN_SUFFIX = ".draining"  # as generator/supervisor.py writes it
STALE_S = 30.0  # the watch writes every second: older means it stopped
MAX_FAILED_RELOADS = 3
# Wildcard listen addresses, and the loopback address that reaches each from inside.
WILDCARDS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}  # noqa: S104 - a lookup


def probe_host(triton_host: str) -> str:
    """Where to reach a server listening on ``triton_host`` from inside its container."""
    host = triton_host.strip()
    return WILDCARDS.get(host, host)


def ready(port: int, host: str = "127.0.0.1", timeout_s: float = 3.0,
          endpoint: str = "ready") -> bool:
    """Whether the server on ``host:port`` is ready (every startup model loaded), or live."""
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://{netloc}/v2/health/{endpoint}", timeout=timeout_s) as resp:
            return resp.status == 200
    except (OSError, http.client.HTTPException):  # URLError, refused, timeout, bad reply
        return False


def health_file(port: int, env=None) -> str:
    """Where the stub watch of the server on ``port`` writes (as ``stub_watch.health_path``)."""
    env = os.environ if env is None else env
    default = os.path.join(tempfile.gettempdir(), f"embed-health-{os.getuid()}-{port}.json")
    return env.get("EMBED_HEALTH_FILE") or default


def _live_state(path: str, pid_key: str, what: str) -> tuple[dict | None, str]:
    """The JSON state at ``path`` if the process it names (``pid_key``) still runs.

    (None, "") when there is no file or its process is gone; (None, why) when unreadable.
    """
    try:
        with open(path, encoding="utf-8") as handle:
            state = json.load(handle)
    except FileNotFoundError:
        return None, ""
    except (OSError, ValueError) as exc:
        return None, f"{what} {path} unreadable: {exc}"
    pid = state.get(pid_key)
    if not isinstance(pid, int) or not os.path.exists(f"/proc/{pid}"):
        return None, ""  # left by a process that is gone
    return state, ""


def draining(path: str) -> str:
    """Why the server is not ready because it drains (``path`` + ".draining"), or ""."""
    state, problem = _live_state(path + DRAIN_SUFFIX, "pid", "drain state")
    if state is None:
        return problem
    return f"draining since {time.ctime(float(state.get('since', 0)))} ({state.get('signal')})"


def watch_problem(path: str, now: float | None = None, live: bool = False) -> str:
    """Why the stub watch's state says unhealthy, or "" (also when there is no watch).

    ``live``: only what a restart would cure (the watch stopped, reloads keep failing).
    """
    state, problem = _live_state(path, "server_pid", "stub watch state")
    if state is None:
        return problem
    age = (time.time() if now is None else now) - float(state.get("updated", 0))
    if age > STALE_S:
        return f"stub watch stopped: its state is {age:.0f} s old"
    if state.get("degraded") and not live:
        return f"models short of a dead stub, reload pending: {sorted(state['degraded'])}"
    if state.get("failing_probes") and not live:
        return f"health probes failing: {state['failing_probes']}"
    if int(state.get("failures_in_a_row", 0)) >= MAX_FAILED_RELOADS:
        return f"{state['failures_in_a_row']} reloads of dead stubs failed in a row"
    return ""


def main(argv: list[str] | None = None) -> int:
    """Exit status for Docker and Kubernetes: 0 healthy, 1 not (``--live``: liveness)."""
    args = argv or []
    live = args == ["--live"]
    if args and not live:
        print("usage: healthcheck.py [--live]", file=sys.stderr)
        return 2
    port = int(os.environ.get("TRITON_HTTP_PORT", "8000"))
    host = probe_host(os.environ.get("TRITON_HOST", ""))
    if not ready(port, host, endpoint="live" if live else "ready"):
        return 1
    path = health_file(port)
    problem = watch_problem(path, live=live) or ("" if live else draining(path))
    if problem:
        print(problem, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
