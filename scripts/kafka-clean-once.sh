#!/usr/bin/env bash
# Kafka's own cleaner, run once on a log dir (tests/kafka/harness): the oracle of the
# differential tests and the peer of bench/vs_kafka.py.
#   scripts/kafka-clean-once.sh VERSION --log-dir DIR --now-ms MS [--config name=value]... [...]
# VERSION is a line of scripts/get-kafka.sh (4.3.1, 3.9.2). The harness is compiled with the
# machine's javac against .tools/kafka/VERSION/libs into .tools/kafka/VERSION/harness, again
# only when a source changed (under a lock: parallel tests share it). The JVM's flags come from
# KAFKA_HARNESS_JVM_OPTS (default: quick start for tests; the benchmark asks for the full JIT).
# Prints Kafka's CleanerStats per round as one JSON object on stdout.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
version="$1"
shift
case "$version" in
    3.*) line=kafka3 ;;
    4.*) line=kafka4 ;;
    *) echo "kafka-clean-once: no harness for Kafka $version" >&2; exit 2 ;;
esac
libs="$repo/.tools/kafka/$version/libs"
[ -f "$repo/.tools/kafka/$version/.complete" ] || KAFKA_LINES="$version" "$repo/scripts/get-kafka.sh" >&2
src="$repo/tests/kafka/harness"
out="$repo/.tools/kafka/$version/harness"
mkdir -p "$out"
(
    flock 9
    if [ ! -f "$out/.built" ] || [ -n "$(find "$src/common" "$src/$line" -newer "$out/.built" -name '*.java')" ]; then
        rm -rf "$out/classes"
        javac -nowarn -encoding UTF-8 -d "$out/classes" -cp "$libs/*" \
            $(find "$src/common" "$src/$line" -name '*.java')
        touch "$out/.built"
    fi
) 9>"$out/.lock"
# shellcheck disable=SC2086
exec java ${KAFKA_HARNESS_JVM_OPTS:--XX:+UseSerialGC -XX:TieredStopAtLevel=1} \
    -Dlog4j2.configurationFile="$src/log4j2.properties" -Dlog4j.configuration="file:$src/log4j.properties" \
    -cp "$out/classes:$libs/*" io.kafkacleaner.harness.CleanOnce "$@"
