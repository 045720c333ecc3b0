#!/usr/bin/env bash
# Start the OpenAI-compatible gateway (deploy/gateway/openai_gateway.py on uvicorn,
# requirements/gateway.txt) in front of Triton: POST /v1/embeddings for every text model of
# the config that `python -m generator gateway-config` wrote. Closed by default:
#   - it needs an API key (LITELLM_MASTER_KEY, or LITELLM_MASTER_KEY_FILE naming a file
#     that holds it; at least 16 characters, LiteLLM wants the "sk-" prefix): no key, no start;
#   - it listens on 127.0.0.1 unless GATEWAY_HOST says otherwise (containers: 0.0.0.0);
#   - it sends nothing out but its requests to Triton; no access log of request bodies.
# (The key variable keeps the name of the LiteLLM proxy this gateway replaced, so existing
# deployments and secrets carry over.)
# Usage: run_gateway.sh CONFIG   (env: TRITON_HTTP_URL, GATEWAY_HOST, GATEWAY_PORT,
#        GATEWAY_WORKERS: processes, one core each; GATEWAY_MAX_IN_FLIGHT: requests in
#        progress per process before it refuses with 503; GATEWAY_PYTHON)
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

export GATEWAY_CONFIG=$config
# The app module (openai_gateway.py) sits beside this script.
export PYTHONPATH=$here${PYTHONPATH:+:$PYTHONPATH}

exec "${GATEWAY_PYTHON:-python3}" -m uvicorn openai_gateway:app --factory \
    --host "${GATEWAY_HOST:-127.0.0.1}" --port "${GATEWAY_PORT:-4000}" \
    --workers "${GATEWAY_WORKERS:-1}" --loop uvloop --http httptools \
    --no-access-log --no-server-header --no-date-header --log-level warning \
    --backlog 2048 --timeout-keep-alive 30
