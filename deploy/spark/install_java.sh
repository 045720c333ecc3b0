#!/usr/bin/env bash
# The Java runtime PySpark needs (client/index/spark.py, tests/integration/test_index_spark.py):
# a `java` of version 17 or newer on PATH (or under $JAVA_HOME), else Debian's
# openjdk-17-jre-headless, installed with apt-get when this runs as root (Spark 4.1 runs on
# Java 17 and 21). Idempotent: with a usable java it only checks.
set -euo pipefail

package=openjdk-17-jre-headless

java_major() {
    local java=${JAVA_HOME:+$JAVA_HOME/bin/}java
    command -v "$java" >/dev/null 2>&1 || return 1
    # `java -version` prints e.g.: openjdk version "17.0.15" 2025-04-15
    "$java" -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print v[1]; exit}'
}

major=$(java_major || true)
if [[ -n $major && $major -ge 17 ]]; then
    exit 0
fi
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
    echo "error: PySpark needs Java 17 or newer (found: ${major:-none}): install the" \
        "Debian/Ubuntu package $package (sudo apt-get install $package), then run this again" >&2
    exit 1
fi
echo "spark: apt-get install $package (Java ${major:-none} found, 17 needed)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends "$package" >/dev/null
major=$(java_major || true)
if [[ -z $major || $major -lt 17 ]]; then
    echo "error: $package installed, yet java reports version ${major:-none}" >&2
    exit 1
fi
