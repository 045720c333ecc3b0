#!/usr/bin/env bash
# perf_analyzer against every ready ensemble of a running Triton: this project's generated
# input data (texts, photos, data: URIs), a concurrency sweep, one CSV and log per run, a
# summary.csv and run.env (settings and machine), all under $PERF_RESULTS/<UTC timestamp>/.
# deploy/perf/perf_table.py turns such a folder into the table of docs/benchmarks.md.
#
#   make perf                                           # the real binary, against make serve
#   docker compose --profile perf run --rm perf        # in the Triton SDK image
#   TRITON_HTTP_URL=localhost:8000 TRITON_GRPC_URL=localhost:8001 PERF_RESULTS=perf-results \
#       deploy/perf/run_perf.sh                         # anywhere perf_analyzer is installed
#
# Environment (default):
#   TRITON_HTTP_URL     (triton:8000)  model discovery
#   TRITON_GRPC_URL     (triton:8001)  what perf_analyzer loads
#   TRITON_METRICS_URL  (empty)        set: perf_analyzer also records GPU metrics
#   PERF_MODELS         (all ready)    space-separated ensembles
#   PERF_CONCURRENCY    (1 2 4 8 16 32 64 128 256 512) the sweep: concurrent requests in
#                       flight, past the 512 plain clients the defaults must answer
#   PERF_BATCH          (1)            rows per request (-b)
#   PERF_MEASUREMENT_MS (5000)         measurement window
#   PERF_STABILITY      (10)           % spread of the last 3 windows that counts as stable (-s)
#   PERF_MAX_TRIALS     (10)           windows before perf_analyzer gives up as unstable (-r)
#   PERF_REQUEST_COUNT  (empty)        set: one measurement of this many requests, no windows
#   PERF_RESULTS        (/results)     output folder
#   PERF_ANALYZER       (perf_analyzer), PYTHON (python3)
#   PERF_COMMAND        (this script)  how the run was started, recorded in run.env
#   EMBED_ADMIN_KEY / EMBED_ADMIN_KEY_FILE  the server's admin key (required): perf_analyzer
#                       reads each model's config, an admin-only API (docs/security.md)
#   PERF_LOCAL_KEY      (empty)        `make perf`: the local key file of `make serve`, read
#                       when neither of the above is set and the server is on this machine
set -euo pipefail

http_url=${TRITON_HTTP_URL:-triton:8000}
grpc_url=${TRITON_GRPC_URL:-triton:8001}
metrics_url=${TRITON_METRICS_URL:-}
models=${PERF_MODELS:-}
concurrency=${PERF_CONCURRENCY:-1 2 4 8 16 32 64 128 256 512}
batch=${PERF_BATCH:-1}
interval_ms=${PERF_MEASUREMENT_MS:-5000}
stability=${PERF_STABILITY:-10}
max_trials=${PERF_MAX_TRIALS:-10}
request_count=${PERF_REQUEST_COUNT:-}
results=${PERF_RESULTS:-/results}
perf_analyzer=${PERF_ANALYZER:-perf_analyzer}
python=${PYTHON:-python3}
command=${PERF_COMMAND:-deploy/perf/run_perf.sh}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

admin_key=${EMBED_ADMIN_KEY:-}
if [[ -z $admin_key && -n ${EMBED_ADMIN_KEY_FILE:-} ]]; then
    admin_key=$(<"$EMBED_ADMIN_KEY_FILE")
fi
local_key=${PERF_LOCAL_KEY:-}
if [[ -z $admin_key && -n $local_key && -r $local_key ]]; then
    case ${grpc_url%:*} in
    127.0.0.1 | localhost | "[::1]")
        admin_key=$(<"$local_key")
        echo "admin key: the local key of make serve ($local_key)"
        ;;
    esac
fi
if [[ -z $admin_key ]]; then
    echo "error: set EMBED_ADMIN_KEY or EMBED_ADMIN_KEY_FILE to the server's admin key:" \
        "perf_analyzer reads each model's config, which the server keeps to that key" >&2
    exit 2
fi
# gRPC metadata under the name Triton's restricted-protocol check reads. perf_analyzer
# 2.51's --help says -H is ignored for gRPC, yet it sends the header as metadata on every
# call: without it (or with x-admin-key) the config read fails with "This protocol is
# restricted, expecting header 'triton-grpc-protocol-x-admin-key'".
key_args=(-H "triton-grpc-protocol-x-admin-key:$admin_key")

mkdir -p "$results" 2>/dev/null || true
if [[ ! -w $results ]]; then
    echo "error: $results is not writable by uid $(id -u) (mkdir -p perf-results first," \
        "or set PERF_UID/PERF_GID to its owner)" >&2
    exit 2
fi
run_dir="$results/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$run_dir"

if [[ -n $request_count ]]; then
    window_args=(--request-count "$request_count")
    window="$request_count requests"
else
    window_args=(--measurement-interval "$interval_ms" -s "$stability" -r "$max_trials")
    window="${interval_ms} ms windows, stable within ${stability}%"
fi
{
    echo "started=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "command=$command"
    echo "perf_analyzer=$("$perf_analyzer" --version 2>&1 | head -n 1 || true)"
    echo "protocol=grpc"
    echo "concurrency=$concurrency"
    echo "batch=$batch"
    echo "window=$window"
    echo "args=-u $grpc_url -i grpc -b $batch ${window_args[*]} --percentile 95"
    echo "cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)"
    echo "cores=$(nproc)"
    echo "memory_kib=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo 2>/dev/null)"
    echo "load=$(cut -d ' ' -f 1-3 /proc/loadavg 2>/dev/null)"
    echo "gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || true)"
} >"$run_dir/run.env"

plan=$("$python" "$here/perf_plan.py" --url "$http_url" --out "$run_dir/input-data" \
    --models "$models")
summary="$run_dir/summary.csv"
failed=()
while IFS=$'\t' read -r model data; do
    for c in $concurrency; do
        name="$model.c$c"
        args=(-m "$model" -u "$grpc_url" -i grpc --input-data "$data" -b "$batch"
            --concurrency-range "$c" "${window_args[@]}" --percentile 95
            -f "$run_dir/$name.csv" "${key_args[@]}")
        if [[ -n $metrics_url ]]; then
            args+=(--collect-metrics --verbose-csv --metrics-url "$metrics_url")
        fi
        echo "== $model, concurrency $c"
        if ! "$perf_analyzer" "${args[@]}" >"$run_dir/$name.log" 2>&1; then
            tail -n 20 "$run_dir/$name.log" >&2
            failed+=("$name")
            continue
        fi
        grep -E "Throughput|latency" "$run_dir/$name.log" || true
        if [[ ! -f $summary ]]; then
            printf 'Model,%s\n' "$(head -n 1 "$run_dir/$name.csv")" >"$summary"
        fi
        sed -n '2p' "$run_dir/$name.csv" | sed "s/^/$model,/" >>"$summary"
    done
done <<<"$plan"

echo "results: $run_dir (summary.csv, run.env, <ensemble>.c<concurrency>.csv and .log)"
if ((${#failed[@]})); then
    echo "error: perf_analyzer failed for: ${failed[*]}" >&2
    exit 1
fi
