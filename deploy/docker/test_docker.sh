#!/usr/bin/env bash
# `make test-docker`: the CPU Docker deployment end to end on this machine.
#
#   1. installs what is missing (Debian packages docker.io, docker-compose, debootstrap,
#      prometheus for promtool, haproxy for the rollout; no service is started) and starts
#      dockerd if none answers (log: $WORK/dockerd.log);
#   2. base image: pulls CPU_BASE (debian:bookworm-slim), or where no registry answers
#      builds a stand-in with deploy/docker/make_base_image.sh (debootstrap) and says so;
#   3. builds serving-cpu, generator-cpu and perf-cpu (timed; --network host), and the
#      gateway's image (deploy/gateway/Dockerfile); the NGC targets are tried only when
#      nvcr.io answers;
#   4. brings docker-compose.cpu.yml + docker-compose.admin-key.yml up from nothing (a
#      generated key under $WORK), waits for the health check, runs tests/docker (parity
#      with sentence-transformers / open_clip over HTTP and gRPC through the published
#      ports, bad input, security settings, metrics vs the dashboard), the perf profile
#      (real perf_analyzer 2.51), promtool on the Prometheus config;
#   4b. brings the `gateway` profile up beside the stack (a generated key) and calls OpenAI's
#      /v1/embeddings through it with the openai SDK and LangChain
#      (tests/docker/test_gateway_stack.py), then removes the gateway's containers;
#   5. restarts the stack: nothing exported again, the same answers;
#   5b. runs the rendered Kubernetes CPU Job and Deployment container specs with docker
#      (tests/docker/test_k8s_container.py, docs/kubernetes.md), then a rolling update of
#      two such pods behind HAProxy under HTTP and gRPC load (tests/docker/test_k8s_rollout.py);
#   6. tears everything down: containers, networks, volumes, the images it tagged (unless
#      DOCKER_TEST_KEEP_IMAGES=1), and dockerd if it started it.
#
# Environment: DOCKER_TEST_PORT_BASE (18000: HTTP, +1 gRPC, +2 metrics, +3 the gateway, on
# 127.0.0.1),
# DOCKER_TEST_KEEP_IMAGES (0), DOCKER_TEST_WORK (a fresh temp dir), PYTHON (.venv/bin/python),
# CPU_BASE, TORCH_INDEX_URL (empty: PyPI's torch), PERF_CONCURRENCY ("1 4"),
# PERF_REQUEST_COUNT (200 requests per point), PERF_MEASUREMENT_MS (2000).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
python=${PYTHON:-.venv/bin/python}
work=${DOCKER_TEST_WORK:-$(mktemp -d /tmp/test-docker.XXXXXX)}
mkdir -p "$work"
port_base=${DOCKER_TEST_PORT_BASE:-18000}
keep_images=${DOCKER_TEST_KEEP_IMAGES:-0}
export CPU_BASE=${CPU_BASE:-debian:bookworm-slim}
export TORCH_INDEX_URL=${TORCH_INDEX_URL:-}
project=triton-embeddings-test
images=(triton-embeddings-serving-cpu:local triton-embeddings-generator-cpu:local
    triton-embeddings-perf-cpu:local triton-embeddings-gateway:local)
started_dockerd=""
tagged=()
timings="$work/timings.txt"
: >"$timings"

log() { printf '\n== %s  %s\n' "$(date -u +%H:%M:%S)" "$*"; }
now() { date +%s; }

export TRITON_HTTP_PUBLISH_PORT=$port_base
export TRITON_GRPC_PUBLISH_PORT=$((port_base + 1))
export TRITON_METRICS_PUBLISH_PORT=$((port_base + 2))
export TRITON_PUBLISH_ADDRESS=127.0.0.1
export GATEWAY_PUBLISH_ADDRESS=127.0.0.1
export GATEWAY_PUBLISH_PORT=$((port_base + 3))
export EMBED_ADMIN_KEY_SECRET_FILE="$work/secrets/admin-key"
export PERF_RESULTS_DIR="$work/perf-results"
export PERF_UID=10001 PERF_GID=10001
export PERF_CONCURRENCY=${PERF_CONCURRENCY:-1 4}
export PERF_MEASUREMENT_MS=${PERF_MEASUREMENT_MS:-2000}
# One measurement of a fixed number of requests per point: stable-window searches can fail
# on a busy 2-core machine (`make perf` is the place for the full sweep).
export PERF_REQUEST_COUNT=${PERF_REQUEST_COUNT:-200}
compose_files=(-f docker-compose.cpu.yml -f docker-compose.admin-key.yml)

compose() { docker-compose -p "$project" "${compose_files[@]}" "$@"; }

# --- 1. tools and engine --------------------------------------------------------------
need_packages=()
command -v dockerd >/dev/null || need_packages+=(docker.io)
command -v docker-compose >/dev/null || need_packages+=(docker-compose)
command -v debootstrap >/dev/null || need_packages+=(debootstrap)
command -v promtool >/dev/null || need_packages+=(prometheus)
command -v haproxy >/dev/null || need_packages+=(haproxy)
if ((${#need_packages[@]})); then
    [[ $(id -u) -eq 0 ]] || { echo "error: install ${need_packages[*]} (needs root)" >&2; exit 1; }
    log "apt-get install ${need_packages[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # No package may start its service here (haproxy, nginx...): policy-rc.d answers 101.
    policy=""
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        policy=/usr/sbin/policy-rc.d
    fi
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends "${need_packages[@]}" >/dev/null
    [[ -z $policy ]] || rm -f "$policy"
fi

cleanup() {
    local rc=$?
    set +e
    log "teardown"
    compose --profile perf --profile gateway down -v --remove-orphans >/dev/null 2>&1
    docker volume rm triton-embeddings-cpu_model-repository triton-embeddings-cpu_hf-cache \
        triton-embeddings-cpu_trt-cache triton-embeddings-cpu_gateway-config >/dev/null 2>&1
    if [[ $keep_images != 1 ]]; then
        for image in "${images[@]}" "${tagged[@]}"; do
            docker image rm "$image" >/dev/null 2>&1
        done
        docker image prune -f >/dev/null 2>&1
    fi
    if [[ -n $started_dockerd ]]; then
        kill "$started_dockerd" 2>/dev/null
        for _ in $(seq 30); do kill -0 "$started_dockerd" 2>/dev/null || break; sleep 1; done
        echo "stopped the dockerd this script started (pid $started_dockerd)"
    fi
    echo "timings:"; cat "$timings"
    echo "work dir (logs, perf results): $work"
    exit "$rc"
}
trap cleanup EXIT

if ! docker info >/dev/null 2>&1; then
    log "starting dockerd (log: $work/dockerd.log)"
    for driver in overlay2 vfs; do
        dockerd --storage-driver="$driver" >"$work/dockerd.log" 2>&1 &
        started_dockerd=$!
        for _ in $(seq 30); do docker info >/dev/null 2>&1 && break; sleep 1; done
        if docker info >/dev/null 2>&1; then echo "dockerd up, storage $driver"; break; fi
        kill "$started_dockerd" 2>/dev/null; wait "$started_dockerd" 2>/dev/null || true
        started_dockerd=""
    done
    [[ -n $started_dockerd ]] || { echo "error: dockerd did not start" >&2; exit 1; }
fi

# --- 2. base image --------------------------------------------------------------------
if ! docker image inspect "$CPU_BASE" >/dev/null 2>&1; then
    if timeout 60 docker pull "$CPU_BASE" >/dev/null 2>&1; then
        echo "pulled $CPU_BASE"
    else
        log "no registry answers for $CPU_BASE: building a local stand-in (debootstrap)"
        t=$(now)
        deploy/docker/make_base_image.sh "$CPU_BASE"
        tagged+=("$CPU_BASE")
        echo "base $CPU_BASE (debootstrap + import) $(($(now) - t)) s" >>"$timings"
    fi
fi

# --- 3. images ------------------------------------------------------------------------
build() {
    local target=$1 tag=$2 label=$3 t
    t=$(now)
    docker build --network host -f Dockerfile.triton --target "$target" \
        --build-arg CPU_BASE="$CPU_BASE" --build-arg TORCH_INDEX_URL="$TORCH_INDEX_URL" \
        -t "$tag" . >"$work/build-$target-$label.log" 2>&1 || {
        tail -30 "$work/build-$target-$label.log" >&2
        return 1
    }
    echo "build $target ($label) $(($(now) - t)) s, $(docker image inspect -f '{{.Size}}' "$tag" |
        awk '{printf "%.0f MB", $1 / 1e6}')" | tee -a "$timings"
}
log "building the CPU images (logs: $work/build-*.log)"
build serving-cpu triton-embeddings-serving-cpu:local first
build generator-cpu triton-embeddings-generator-cpu:local first
build perf-cpu triton-embeddings-perf-cpu:local first
log "rebuilding with the cache (warm)"
build serving-cpu triton-embeddings-serving-cpu:local warm
build generator-cpu triton-embeddings-generator-cpu:local warm
build perf-cpu triton-embeddings-perf-cpu:local warm
t=$(now)
docker build --network host -f deploy/gateway/Dockerfile --build-arg GATEWAY_BASE="$CPU_BASE" \
    -t triton-embeddings-gateway:local . >"$work/build-gateway.log" 2>&1 || {
    tail -30 "$work/build-gateway.log" >&2
    exit 1
}
echo "build gateway $(($(now) - t)) s, $(docker image inspect -f '{{.Size}}' \
    triton-embeddings-gateway:local | awk '{printf "%.0f MB", $1 / 1e6}')" | tee -a "$timings"
if timeout 20 docker pull nvcr.io/nvidia/tritonserver:26.05-py3-sdk >/dev/null 2>&1; then
    build serving triton-embeddings-serving:local ngc && images+=(triton-embeddings-serving:local)
    build generator triton-embeddings-generator:local ngc && images+=(triton-embeddings-generator:local)
    build perf triton-embeddings-perf:local ngc && images+=(triton-embeddings-perf:local)
else
    echo "nvcr.io does not answer: the NGC targets (serving, generator, perf) are not built" \
        "here; tests/unit/deploy/test_dockerfile.py checks them statically" | tee -a "$timings"
fi

# --- 4. the stack from nothing --------------------------------------------------------
install -d -m 700 "$work/secrets"
"$python" -c 'import secrets; print(secrets.token_urlsafe(32))' >"$EMBED_ADMIN_KEY_SECRET_FILE"
chmod 644 "$EMBED_ADMIN_KEY_SECRET_FILE"
install -d -m 777 "$PERF_RESULTS_DIR"
# The reference tiny CLIP checkpoint: the very file the generator image exported.
cid=$(docker create triton-embeddings-generator-cpu:local)
docker cp "$cid:/opt/tiny-clip" "$work/tiny-clip" >/dev/null
docker rm "$cid" >/dev/null

wait_healthy() {
    local cid status
    cid=$(compose ps -q triton)
    for _ in $(seq 300); do
        status=$(docker inspect -f '{{.State.Health.Status}}' "$cid" 2>/dev/null || echo gone)
        [[ $status == healthy ]] && return 0
        [[ $status == gone || $(docker inspect -f '{{.State.Running}}' "$cid") != true ]] && break
        sleep 2
    done
    compose logs --no-color --tail 60 triton >&2
    echo "error: triton did not turn healthy ($status)" >&2
    return 1
}

up() {
    local phase=$1 t
    t=$(now)
    compose up -d --no-build >"$work/up-$phase.log" 2>&1 || { cat "$work/up-$phase.log" >&2; return 1; }
    wait_healthy
    echo "stack up + healthy ($phase) $(($(now) - t)) s" | tee -a "$timings"
    compose logs --no-color generator >"$work/generator-$phase.log" 2>&1
    compose logs --no-color triton >"$work/triton-$phase.log" 2>&1
}

run_tests() {
    local phase=$1
    EMBED_DOCKER_STACK=1 EMBED_DOCKER_PHASE=$phase EMBED_DOCKER_WORK=$work \
        EMBED_DOCKER_PROJECT=$project EMBED_DOCKER_HTTP_PORT=$TRITON_HTTP_PUBLISH_PORT \
        EMBED_DOCKER_GRPC_PORT=$TRITON_GRPC_PUBLISH_PORT \
        EMBED_DOCKER_METRICS_PORT=$TRITON_METRICS_PUBLISH_PORT \
        EMBED_ADMIN_KEY_FILE=$EMBED_ADMIN_KEY_SECRET_FILE \
        "$python" -m pytest tests/docker -q -p no:cacheprovider -k "$2"
}

log "stack up from nothing (ports $port_base-$((port_base + 2)) on 127.0.0.1)"
compose --profile perf down -v --remove-orphans >/dev/null 2>&1 || true
up first
run_tests first "not perf"

log "perf profile: the real perf_analyzer against the running stack"
t=$(now)
compose --profile perf run --rm perf >"$work/perf.log" 2>&1 || { tail -40 "$work/perf.log" >&2; exit 1; }
echo "perf profile $(($(now) - t)) s" | tee -a "$timings"
"$python" deploy/perf/perf_table.py "$PERF_RESULTS_DIR" --doc - >"$work/perf-table.md"
run_tests first "perf"

log "promtool on the Prometheus config"
promtool check config deploy/prometheus/prometheus.yml

log "gateway profile: OpenAI /v1/embeddings through the compose gateway (port $GATEWAY_PUBLISH_PORT)"
t=$(now)
gateway_key="sk-$("$python" -c 'import secrets; print(secrets.token_hex(24))')"
GATEWAY_API_KEY=$gateway_key compose --profile gateway up -d --no-build gateway \
    >"$work/up-gateway.log" 2>&1 || { cat "$work/up-gateway.log" >&2; exit 1; }
gateway_rc=0
EMBED_DOCKER_STACK=1 EMBED_DOCKER_WORK=$work \
    EMBED_DOCKER_GATEWAY_URL="http://127.0.0.1:$GATEWAY_PUBLISH_PORT" \
    EMBED_DOCKER_GATEWAY_KEY=$gateway_key \
    "$python" -m pytest tests/docker/test_gateway_stack.py -q -s -p no:cacheprovider || gateway_rc=$?
compose --profile gateway logs --no-color gateway-config gateway >"$work/gateway.log" 2>&1
compose --profile gateway rm -fsv gateway gateway-config >/dev/null 2>&1
echo "gateway profile up + tests $(($(now) - t)) s" | tee -a "$timings"
((gateway_rc == 0)) || { tail -40 "$work/gateway.log" >&2; exit "$gateway_rc"; }

log "restart: nothing is exported again, the same answers"
compose down >/dev/null 2>&1   # containers and network; the volumes stay
up restart
run_tests restart "not perf"
log "Kubernetes: the rendered CPU Job and Deployment containers run with docker (deploy/k8s)"
compose down >/dev/null 2>&1   # the compose stack is done: its CPU for these containers
PY=$python deploy/k8s/install_kustomize.sh .build/tools/kubectl
t=$(now)
k8s_rc=0
EMBED_DOCKER_STACK=1 EMBED_DOCKER_K8S=1 EMBED_DOCKER_WORK=$work \
    EMBED_ADMIN_KEY_FILE=$EMBED_ADMIN_KEY_SECRET_FILE \
    "$python" -m pytest tests/docker/test_k8s_container.py tests/docker/test_k8s_rollout.py \
    -q -s -p no:cacheprovider || k8s_rc=$?
docker rm -f triton-embeddings-k8s-test-build triton-embeddings-k8s-test-server \
    triton-embeddings-k8s-test-kserve triton-embeddings-k8s-test-rollout-{a,b,c,d} \
    >/dev/null 2>&1 || true
docker volume rm -f triton-embeddings-k8s-test_repository >/dev/null 2>&1 || true
cat "$work/k8s.txt" >>"$timings" 2>/dev/null || true
echo "k8s container checks $(($(now) - t)) s" | tee -a "$timings"
((k8s_rc == 0)) || exit "$k8s_rc"
log "all Docker checks passed"
