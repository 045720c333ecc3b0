"""Container health check: exit 0 when Triton answers ``/v2/health/ready`` with 200.

Used by ``HEALTHCHECK`` in Dockerfile.triton and by docker-compose.yml. Standard library
only; the port is ``$TRITON_HTTP_PORT`` (default 8000), the one ``generator serve`` uses.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request


def ready(port: int, timeout_s: float = 3.0) -> bool:
    """Whether the server on ``127.0.0.1:port`` is ready (every startup model loaded)."""
    url = f"http://127.0.0.1:{port}/v2/health/ready"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - local
            return resp.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def main() -> int:
    """Exit status for Docker: 0 healthy, 1 not."""
    return 0 if ready(int(os.environ.get("TRITON_HTTP_PORT", "8000"))) else 1


if __name__ == "__main__":
    sys.exit(main())
