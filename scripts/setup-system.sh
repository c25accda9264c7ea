#!/usr/bin/env bash
# Debian packages the test suite needs, installed only when missing:
#   java (PySpark, the real Kafka broker), maven (Kafka's jars from Maven Central), lua5.4 (Argo CD health check tests), prometheus (real scrape tests).
# Needs root for apt-get; without root it says what is missing and carries on, so
# `make demo` still works on a developer laptop.
set -euo pipefail
missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
command -v lua5.4 >/dev/null 2>&1 || missing+=(lua5.4)
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
# The compiled core (native/) needs a Rust toolchain: the machine's rustup, or Debian's.
command -v cargo >/dev/null 2>&1 || missing+=(cargo)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "setup-system: not root; please install: ${missing[*]} (apt-get install -y ...)" >&2
    exit 0
fi
echo "setup-system: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1 || {
    apt-get update -qq >/dev/null
    apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
}
# The Debian prometheus package starts a system service on install; the tests run their
# own server on a free loopback port and need none. Only the service this install started
# is stopped, through the service manager: never a Prometheus the machine already ran.
if [[ " ${missing[*]} " == *" prometheus "* ]]; then
    if command -v systemctl >/dev/null 2>&1 && systemctl stop prometheus >/dev/null 2>&1; then :
    elif command -v service >/dev/null 2>&1; then service prometheus stop >/dev/null 2>&1 || true
    fi
fi
