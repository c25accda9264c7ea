#!/usr/bin/env bash
# Apache Kafka's own jars for the real-broker tests, `make demo-kafka` and bench/vs_kafka.py,
# resolved from Maven Central by the machine's mvn (tests/kafka/pom.xml) into
# .tools/kafka/<version>/libs. Cached: a line whose libs are complete is not resolved again.
#   KAFKA_LINES="4.3.1 3.9.2" (default): 4.3.1 for every 4.x artifact (4.4.0's tools need
#   dependencies Maven Central does not serve here), 3.9.2 for the 3.9 line.
set -euo pipefail
cd "$(dirname "$0")/.."
LINES="${KAFKA_LINES:-4.3.1 3.9.2}"
if ! command -v mvn >/dev/null 2>&1; then
    echo "get-kafka: mvn not found; install Maven (apt-get install -y maven) for the real-broker tests" >&2
    exit 1
fi
for version in $LINES; do
    dest=".tools/kafka/$version"
    [ -f "$dest/.complete" ] && continue
    case "$version" in
        3.*) logging=reload4j ;;
        *) logging=log4j2 ;;
    esac
    echo "get-kafka: resolving Apache Kafka $version from Maven Central"
    rm -rf "$dest"
    mvn -q -B -Dstyle.color=never -f tests/kafka/pom.xml -Dkafka.version="$version" -P"$logging" \
        dependency:copy-dependencies -DoutputDirectory="$PWD/$dest/libs"
    touch "$dest/.complete"
done
