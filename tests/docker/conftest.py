"""The CPU Docker stack checks: run by `make test-docker` (deploy/docker/test_docker.sh).

They need the stack that script brings up, so they are collected only when it sets
EMBED_DOCKER_STACK=1; `make test` (`pytest tests`) never collects them.
"""

from __future__ import annotations

import os

if os.environ.get("EMBED_DOCKER_STACK") != "1":
    collect_ignore_glob = ["test_*.py"]

# The Kubernetes container run (test_k8s_*.py) starts containers of its own: collected only
# in its own step of test_docker.sh (EMBED_DOCKER_K8S=1), not with the compose checks.
if os.environ.get("EMBED_DOCKER_K8S") != "1":
    collect_ignore_glob = [*globals().get("collect_ignore_glob", []), "test_k8s_*.py"]
