#!/usr/bin/env bash
# `make test-gateway-image`: the gateway's image (deploy/gateway/Dockerfile) built and run
# in front of a real local Triton (tests/docker/test_gateway_image.py). Needs root and
# Docker: starts dockerd when none answers (and stops it after), builds the Debian base
# locally with deploy/docker/make_base_image.sh where no registry answers, builds
# triton-embeddings-gateway:local (--network host), runs the tests, removes the image
# unless GATEWAY_TEST_KEEP_IMAGE=1. Not part of `make test` or `make test-docker`.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
python=${PYTHON:-.venv/bin/python}
base=${GATEWAY_BASE:-debian:bookworm-slim}
image=triton-embeddings-gateway:local
work=$(mktemp -d /tmp/test-gateway-image.XXXXXX)
started_dockerd=""

cleanup() {
    if [[ ${GATEWAY_TEST_KEEP_IMAGE:-0} != 1 ]]; then
        docker image rm -f "$image" >/dev/null 2>&1 || true
    fi
    if [[ -n $started_dockerd ]]; then
        kill "$started_dockerd" 2>/dev/null || true
        wait "$started_dockerd" 2>/dev/null || true
    fi
}
trap cleanup EXIT

if ! docker info >/dev/null 2>&1; then
    echo "== starting dockerd (log: $work/dockerd.log)"
    dockerd >"$work/dockerd.log" 2>&1 &
    started_dockerd=$!
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { tail -20 "$work/dockerd.log" >&2; exit 1; }
fi
if ! docker image inspect "$base" >/dev/null 2>&1 && ! docker pull "$base" >/dev/null 2>&1; then
    echo "== no registry answers for $base: building a local stand-in (debootstrap)"
    deploy/docker/make_base_image.sh "$base"
fi
echo "== building $image (log: $work/build.log)"
start=$(date +%s)
docker build --network host -f deploy/gateway/Dockerfile --build-arg GATEWAY_BASE="$base" \
    -t "$image" . >"$work/build.log" 2>&1 || { tail -30 "$work/build.log" >&2; exit 1; }
echo "built in $(($(date +%s) - start)) s, $(docker image inspect -f '{{.Size}}' "$image") bytes"
EMBED_DOCKER_GATEWAY=1 "$python" -m pytest tests/docker/test_gateway_image.py -q -p no:cacheprovider
