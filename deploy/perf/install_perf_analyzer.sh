#!/usr/bin/env bash
# Install the real perf_analyzer outside Docker: the binary of Triton 2.51 (the release of
# the local tritonserver) from the pinned tritonclient wheel, and the libraries it links.
#
#   PYTHON=.venv/bin/python deploy/perf/install_perf_analyzer.sh [DIR]   (make perf-analyzer)
#
# DIR (default .build/tools/perf_analyzer) then holds
#   bin/perf_analyzer          from tritonclient-2.51.0.data/data/bin/ (PyPI, hash-pinned)
#   lib/libcudart.so.12        from nvidia-cuda-runtime-cu12 (PyPI, hash-pinned)
#   perf_analyzer              the command to run: puts lib/ on LD_LIBRARY_PATH, no GPU needed
# and libb64.so.0d comes from the Debian package libb64-0d, installed with apt-get when it
# is missing and this runs as root (otherwise: an error saying what to install).
# The venv's own tritonclient (requirements/constraints.txt) is left alone. A second run
# with the same pins downloads nothing: it only checks that the binary starts.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dest=${1:-.build/tools/perf_analyzer}
python=${PYTHON:-python3}
requirements="$here/perf-analyzer-requirements.txt"
version=2.51.0
debian_package=libb64-0d

fail() {
    echo "error: $*" >&2
    exit 1
}

[[ $(uname -s) == Linux && $(uname -m) == x86_64 ]] ||
    fail "the pinned perf_analyzer wheel is for Linux x86_64, not $(uname -s) $(uname -m)"

pins=$(cat "$requirements" "${BASH_SOURCE[0]}" | sha256sum | cut -d ' ' -f 1)
stamp="$dest/.installed"

unpack() {
    local work
    work=$(mktemp -d)
    # shellcheck disable=SC2064 # expand now: $work is local
    trap "rm -rf '$work'" EXIT
    echo "perf_analyzer: downloading the pinned wheels ($requirements)"
    "$python" -m pip download --quiet --no-deps --only-binary=:all: \
        --platform manylinux1_x86_64 --platform manylinux2014_x86_64 \
        --require-hashes -r "$requirements" -d "$work/wheels"
    "$python" - "$work/wheels" "$work/out" <<'EOF'
import stat
import sys
import zipfile
from pathlib import Path

wheels, out = Path(sys.argv[1]), Path(sys.argv[2])
wanted = {
    "tritonclient-*.whl": {
        "tritonclient-2.51.0.data/data/bin/perf_analyzer": "bin/perf_analyzer",
        "tritonclient-2.51.0.data/data/LICENSE.txt": "licenses/tritonclient.txt",
    },
    "nvidia_cuda_runtime_cu12-*.whl": {
        "nvidia/cuda_runtime/lib/libcudart.so.12": "lib/libcudart.so.12",
        "nvidia_cuda_runtime_cu12-12.6.77.dist-info/License.txt": "licenses/cuda-runtime.txt",
    },
}
for pattern, members in wanted.items():
    (wheel,) = wheels.glob(pattern)
    with zipfile.ZipFile(wheel) as archive:
        for member, target in members.items():
            path = out / target
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(archive.read(member))
            if target.startswith(("bin/", "lib/")):
                path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
EOF
    cat >"$work/out/perf_analyzer" <<'EOF'
#!/bin/sh
# perf_analyzer 2.51.0 (tritonclient wheel) with its libcudart.so.12; see
# deploy/perf/install_perf_analyzer.sh. No GPU is needed.
here=$(cd "$(dirname "$0")" && pwd)
LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/bin/perf_analyzer" "$@"
EOF
    chmod 755 "$work/out/perf_analyzer"
    rm -rf "$dest"
    mkdir -p "$(dirname "$dest")"
    mv "$work/out" "$dest"
}

missing_libraries() {
    LD_LIBRARY_PATH="$dest/lib" ldd "$dest/bin/perf_analyzer" | awk '/not found/ {print $1}'
}

ensure_libb64() {
    if ! missing_libraries | grep -F libb64.so.0d >/dev/null; then
        return 0
    fi
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
        fail "perf_analyzer needs libb64.so.0d: install the Debian/Ubuntu package" \
            "$debian_package (sudo apt-get install $debian_package), then run this again"
    fi
    echo "perf_analyzer: apt-get install $debian_package (libb64.so.0d)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends "$debian_package" >/dev/null
}

if [[ ! -f $stamp || $(<"$stamp") != "$pins" ]]; then
    unpack
fi
ensure_libb64
missing=$(missing_libraries)
[[ -z $missing ]] || fail "perf_analyzer still misses: $missing"
found=$("$dest/perf_analyzer" --version 2>&1 || true)
[[ $found == *"Version $version"* ]] || fail "$dest/perf_analyzer --version said: $found"
echo "$pins" >"$stamp"
echo "perf_analyzer: $found at $dest/perf_analyzer"
