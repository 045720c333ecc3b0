#!/usr/bin/env bash
# Start the OpenAI-compatible gateway (LiteLLM's proxy, requirements/gateway.txt) in front
# of Triton: POST /v1/embeddings for every text model of the config that
# `python -m generator gateway-config` wrote. Closed by default:
#   - it needs an API key (LITELLM_MASTER_KEY, or LITELLM_MASTER_KEY_FILE naming a file
#     that holds it; at least 16 characters, LiteLLM wants the "sk-" prefix): no key, no start;
#   - it listens on 127.0.0.1 unless GATEWAY_HOST says otherwise (containers: 0.0.0.0);
#   - it sends nothing out: local model cost map, telemetry off, no database.
# Usage: run_gateway.sh CONFIG   (env: TRITON_HTTP_URL, GATEWAY_HOST, GATEWAY_PORT,
#        GATEWAY_WORKERS, LITELLM_BIN)
set -euo pipefail

config=${1:?usage: run_gateway.sh CONFIG}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if [[ -n ${LITELLM_MASTER_KEY_FILE:-} ]]; then
    if [[ -n ${LITELLM_MASTER_KEY:-} ]]; then
        echo "run_gateway: set LITELLM_MASTER_KEY or LITELLM_MASTER_KEY_FILE, not both" >&2
        exit 2
    fi
    LITELLM_MASTER_KEY=$(tr -d '\n' < "$LITELLM_MASTER_KEY_FILE")
fi
key=${LITELLM_MASTER_KEY:-}
if [[ ${#key} -lt 16 || $key != sk-* ]]; then
    echo "run_gateway: refusing to start without an API key: set LITELLM_MASTER_KEY" \
        "(or LITELLM_MASTER_KEY_FILE) to 'sk-' and at least 13 more characters" >&2
    exit 2
fi
export LITELLM_MASTER_KEY=$key
export TRITON_HTTP_URL=${TRITON_HTTP_URL:-http://127.0.0.1:8000}

# Offline: the model cost map shipped in the package, no telemetry, no update checks.
export LITELLM_LOCAL_MODEL_COST_MAP=True
export LITELLM_TELEMETRY=False
export LITELLM_DONT_SHOW_FEEDBACK_BOX=True
export DISABLE_ADMIN_UI=True
export NO_DOCS=True
export NO_REDOC=True
export HF_HUB_OFFLINE=1
# The provider module (triton_embeddings.py) sits beside this script.
export PYTHONPATH=$here${PYTHONPATH:+:$PYTHONPATH}

exec "${LITELLM_BIN:-litellm}" --config "$config" \
    --host "${GATEWAY_HOST:-127.0.0.1}" --port "${GATEWAY_PORT:-4000}" \
    --num_workers "${GATEWAY_WORKERS:-1}" --telemetry False
