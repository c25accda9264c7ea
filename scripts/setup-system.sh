#!/usr/bin/env bash
# Debian packages, installed only when missing, for what the caller sets up:
#   core   cargo and gcc (the compiled core, native/): all `make demo` needs
#   kafka  java and maven (Apache Kafka's jars and broker): `make demo-kafka`
#   all    (default) the above, lua5.4 (Argo CD health check tests), prometheus (real
#          scrape tests) and prometheus-alertmanager (the inhibit rule's test): `make test`;
#          java also runs PySpark
# Needs root for apt-get; without root it says what is missing and carries on, so
# `make demo` still works on a developer laptop.
#   scripts/setup-system.sh [core|kafka|all]...
set -euo pipefail
want=" ${*:-all} "
has() { [[ "$want" == *" $1 "* || "$want" == *" all "* ]]; }
missing=()
# The compiled core needs a Rust toolchain (the machine's rustup, or Debian's) and a C compiler:
# it links with one, and its lz4-sys and zstd-sys crates compile liblz4 and libzstd.
command -v cargo >/dev/null 2>&1 || missing+=(cargo)
command -v cc >/dev/null 2>&1 || missing+=(gcc)
if has kafka; then
    command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
    command -v mvn >/dev/null 2>&1 || missing+=(maven)
fi
if has all; then
    command -v lua5.4 >/dev/null 2>&1 || missing+=(lua5.4)
    command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
    command -v prometheus-alertmanager >/dev/null 2>&1 || missing+=(prometheus-alertmanager)
fi
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
# The Debian prometheus packages start a system service on install; the tests run their
# own servers on free loopback ports and need none. Only a service this install started is
# stopped, through the service manager: never one the machine already ran.
for service in prometheus prometheus-alertmanager; do
    if [[ " ${missing[*]} " == *" $service "* ]]; then
        if command -v systemctl >/dev/null 2>&1 && systemctl stop "$service" >/dev/null 2>&1; then :
        elif command -v service >/dev/null 2>&1; then service "$service" stop >/dev/null 2>&1 || true
        fi
    fi
done
