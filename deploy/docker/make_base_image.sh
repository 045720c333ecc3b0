#!/usr/bin/env bash
# Build a local stand-in for the Docker Hub image the CPU targets start from
# (CPU_BASE in Dockerfile.triton, default debian:bookworm-slim) where no registry is
# reachable: debootstrap --variant=minbase from Debian's archive, the apt sources the
# official image has (bookworm, bookworm-updates, bookworm-security, deb822 format),
# apt's list and cache files removed, then `docker import`. The host's CA bundle
# (HOST_CA_BUNDLE, default /etc/ssl/certs/ca-certificates.crt; empty: none) goes into
# /usr/local/share/ca-certificates/, so the image trusts what this host trusts (e.g. a
# TLS-inspecting proxy in front of PyPI) once the ca-certificates package is installed.
#
#   deploy/docker/make_base_image.sh [TAG]      (default debian:bookworm-slim)
#
# Needs root and debootstrap (apt-get install debootstrap). Does nothing when TAG exists.
set -euo pipefail

tag=${1:-debian:bookworm-slim}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
host_ca=${HOST_CA_BUNDLE-/etc/ssl/certs/ca-certificates.crt}
docker=${DOCKER:-docker}

if "$docker" image inspect "$tag" >/dev/null 2>&1; then
    echo "base image $tag exists"
    exit 0
fi
command -v debootstrap >/dev/null || {
    echo "error: debootstrap is missing (apt-get install debootstrap)" >&2
    exit 1
}
work=$(mktemp -d)
# shellcheck disable=SC2064 # expand now
trap "rm -rf '$work'" EXIT
echo "base image $tag: no registry here, building it with debootstrap from $mirror"
debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || {
    tail -20 "$work/debootstrap.log" >&2
    exit 1
}
rm -f "$work/rootfs/etc/apt/sources.list"
cat >"$work/rootfs/etc/apt/sources.list.d/debian.sources" <<'SOURCES'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
if [[ -n $host_ca && -f $host_ca ]]; then
    install -D -m 644 "$host_ca" "$work/rootfs/usr/local/share/ca-certificates/host-ca-bundle.crt"
fi
rm -rf "$work/rootfs/var/lib/apt/lists/"* "$work/rootfs/var/cache/apt/"*.bin \
    "$work/rootfs/var/cache/apt/archives/"*.deb
tar -C "$work/rootfs" -c . | "$docker" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' - "$tag" >/dev/null
echo "base image $tag: built locally ($(du -sh "$work/rootfs" | cut -f1)), a stand-in for Docker Hub's"
