"""The deletion deadline next to a real Apache Kafka broker, on both Kafka lines (issue 25.2).

A key is written and overwritten through a real broker whose topic has a long ``segment.ms``
(a day) and Kafka's 1 GiB ``segment.bytes``: the overwrite stays in the active segment, which no
cleaner touches. The observe-mode sidecar next to the running broker reports the partition past
its one-minute deletion deadline, held back by the active segment (the alert's metric is 1 with
``held_back_by="activeSegment"``). Once ``segment.ms`` is lowered, the next append rolls the
segment; with the broker stopped ``kafka-cleaner clean`` compacts it, and the breach clears.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from kafka_broker import EACH_KAFKA_LINE, RealBroker
from prometheus_client import generate_latest
from sidecar_helpers import KAFKA_CLEANER, new_sidecar, next_scan, partition_entry, write_policy

from cleaner.clock import MockTime

pytestmark = [pytest.mark.slow, EACH_KAFKA_LINE]

TOPIC = "users"
DEADLINE_MS = 60_000
RULE = {"match": TOPIC, "cleanupPolicy": "compact", "minCleanableDirtyRatio": 0.01, "deletionDeadlineMs": DEADLINE_MS}
CLI_POLICY = (
    f"mode: compact\ntopics:\n  - match: {TOPIC}\n    cleanupPolicy: compact\n    minCleanableDirtyRatio: 0.01\n"
)
BREACHED = "kafka_cleaner_partition_deletion_deadline_breached"


def _alter_topic(broker: RealBroker, configs: dict[str, str]) -> None:
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=30_000)
    try:
        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, TOPIC, configs=configs)])
    finally:
        admin.close()


def _segments(broker: RealBroker) -> list[Path]:
    return sorted((broker.log_dir / f"{TOPIC}-0").glob("*.log"))


def test_a_long_segment_ms_breaches_the_deadline_until_the_roll_and_the_clean(tmp_path: Path, line: str) -> None:
    broker = RealBroker(tmp_path / "broker", line).start()
    policy = write_policy(tmp_path / "policy.yaml", topics=[RULE])
    try:
        long_roll = {"cleanup.policy": "compact", "segment.ms": str(86_400_000)}
        broker.create_topic(TOPIC, 1, long_roll)
        broker.produce(TOPIC, [(0, b"user-42", b"v1")] + [(0, b"other-%03d" % i, b"x" * 100) for i in range(200)])
        broker.produce(TOPIC, [(0, b"user-42", b"v2")])  # the overwrite: v1 is superseded
        written_ms = int(time.time() * 1000)
        assert len(_segments(broker)) == 1

        clock = MockTime(written_ms + 2 * DEADLINE_MS)  # two deadlines later
        sc = new_sidecar(policy, [broker.log_dir], clock)
        entry = partition_entry(next_scan(sc, 0), f"{TOPIC}-0")
        assert entry is not None, "the partition is not in /status"
        deletion = entry["deletion"]
        assert deletion["breached"] is True and deletion["heldBackBy"] == "activeSegment", deletion
        assert deletion["oldestSupersededAgeSeconds"] >= 2 * DEADLINE_MS / 1000 - 5, deletion
        assert deletion["supersededRecords"] == 1, deletion
        metrics = generate_latest(sc.metrics.registry).decode()
        assert f'{BREACHED}{{held_back_by="activeSegment",partition="0",topic="{TOPIC}"}} 1.0' in metrics

        # Kafka rolls at the next append once the active segment is older than segment.ms.
        _alter_topic(broker, {"cleanup.policy": "compact", "segment.ms": "1000"})
        deadline = time.monotonic() + 60
        while len(_segments(broker)) < 2:
            assert time.monotonic() < deadline, "the broker never rolled the segment"
            broker.produce(TOPIC, [(0, b"roll-%f" % time.monotonic(), b"r")])
            time.sleep(0.5)
        broker.stop()

        cli_policy = tmp_path / "cli-policy.yaml"
        cli_policy.write_text(CLI_POLICY)
        done = subprocess.run(
            [str(KAFKA_CLEANER), "clean", str(broker.log_dir), "--policy", str(cli_policy)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr

        # The segments changed; the next read once reporting.deletionIntervalSeconds (300 s) passed.
        entry = partition_entry(next_scan(sc, 300_000), f"{TOPIC}-0")
        assert entry is not None
        deletion = entry["deletion"]
        assert deletion["breached"] is False and deletion["oldestSupersededAgeSeconds"] is None, deletion
        metrics = generate_latest(sc.metrics.registry).decode()
        assert f'{BREACHED}{{held_back_by="",partition="0",topic="{TOPIC}"}} 0.0' in metrics
        assert "kafka_cleaner_deletion_deadline_breached_partitions 0.0" in metrics

        broker.start()
        assert broker.consume(TOPIC, 1)[0][b"user-42"] == b"v2"
        assert broker.problems([TOPIC]) == [], broker.problems([TOPIC])
    finally:
        broker.stop()
