#!/bin/sh
# Entrypoint of the serving and generator images: `python3 -m generator "$@"` (CMD: serve,
# the command `make serve` runs). NGC's own entrypoint runs first where the base image has
# it: its driver checks and CUDA forward-compatibility set-up, then it execs the command.
# Every step execs, so `generator serve` is the container's main process: it runs
# tritonserver as its child and drains it on SIGTERM (generator/supervisor.py).
set -eu
if [ -x /opt/nvidia/nvidia_entrypoint.sh ]; then
    exec /opt/nvidia/nvidia_entrypoint.sh python3 -m generator "$@"
fi
exec python3 -m generator "$@"
