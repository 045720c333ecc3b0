#!/usr/bin/env bash
# The Kustomize renderer the tests use: kubectl 1.20.2 (embedded Kustomize v2.0.3) from
# Debian 12's package kubernetes-client, pinned by version and SHA-256, unpacked into DIR
# without installing it (a kubectl already on PATH is left alone).
#
#   deploy/k8s/install_kustomize.sh [DIR]      (make k8s-tools; DIR: .build/tools/kubectl)
#
# DIR/kubectl is then the binary. `apt-get download` needs no root but current package
# lists: as root, `apt-get update` runs once when the download fails. A second run with
# the same pin downloads nothing: it only checks that the binary starts.
set -euo pipefail

dest=${1:-.build/tools/kubectl}
package=kubernetes-client
version=1.20.5+really1.20.2-1.1+deb12u1
sha256=087c42dc26c847740043cdaa8b16db666be5591a1da957f822922aa1b677494e
stamp="$dest/.installed-$version"

fail() {
    echo "error: $*" >&2
    exit 1
}

[[ $(uname -m) == x86_64 ]] || fail "the pinned $package is the amd64 build"

if [[ ! -f $stamp ]]; then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    download() { (cd "$work" && apt-get download -q "$package=$version" >/dev/null 2>&1); }
    if ! download; then
        [[ $(id -u) -eq 0 ]] || fail "apt-get download $package=$version failed (run apt-get update)"
        apt-get update -q >/dev/null
        download || fail "apt-get download $package=$version failed"
    fi
    deb=$(echo "$work"/*.deb)
    echo "$sha256  $deb" | sha256sum --check --quiet || fail "$deb: SHA-256 mismatch"
    dpkg-deb -x "$deb" "$work/root"
    mkdir -p "$dest"
    install -m 755 "$work/root/usr/bin/kubectl" "$dest/kubectl"
    touch "$stamp"
fi
"$dest/kubectl" version --client >/dev/null || fail "$dest/kubectl does not start"
echo "kustomize renderer: $dest/kubectl ($package $version)"
