"""Container health check: exit 0 when Triton answers ``/v2/health/ready`` with 200.

Used by ``HEALTHCHECK`` in Dockerfile.triton and by docker-compose.yml. Standard library
only; the port is ``$TRITON_HTTP_PORT`` (default 8000), the one ``generator serve`` uses,
and the address the server's own: ``$TRITON_HOST`` when it names one, else loopback. The
probe ignores ``http_proxy`` / ``HTTP_PROXY`` and the like: a proxy set in the container
for hub downloads must not receive (or answer) the server's health check.
"""

from __future__ import annotations

import http.client
import os
import sys
import urllib.request

# Wildcard listen addresses, and the loopback address that reaches each from inside.
WILDCARDS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}


def probe_host(triton_host: str) -> str:
    """Where to reach a server listening on ``triton_host`` from inside its container."""
    host = triton_host.strip()
    return WILDCARDS.get(host, host)


def ready(port: int, host: str = "127.0.0.1", timeout_s: float = 3.0) -> bool:
    """Whether the server on ``host:port`` is ready (every startup model loaded)."""
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://{netloc}/v2/health/ready", timeout=timeout_s) as resp:
            return resp.status == 200
    except (OSError, http.client.HTTPException):  # URLError, refused, timeout, bad reply
        return False


def main() -> int:
    """Exit status for Docker: 0 healthy, 1 not."""
    port = int(os.environ.get("TRITON_HTTP_PORT", "8000"))
    return 0 if ready(port, probe_host(os.environ.get("TRITON_HOST", ""))) else 1


if __name__ == "__main__":
    sys.exit(main())
