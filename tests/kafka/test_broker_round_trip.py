"""A real Apache Kafka broker judges ``kafka-cleaner clean`` (issue 9): round trips per
Kafka line (4.3.1 and 3.9.2).

A workload is produced through the broker with kafka-python: a compacted topic of three
partitions with 1 MiB segments (Kafka 4's smallest) and keys with many versions,
tombstones, every codec (none, gzip, snappy, lz4, zstd), headers, an idempotent producer,
and transactions both committed and aborted. Then, with the broker stopped each time:

1. ``kafka-cleaner clean`` (the console script, as a user runs it) on its log dir; the
   broker starts again and serves, read_committed and read_uncommitted, every record the
   clean kept at its offset, every key's latest committed value (tombstones before their
   horizon included), the same earliest and latest offsets, and logs no ERROR or WARN
   about the topic;
2. more data, then a clean past the delete horizon (``--now-ms`` two days on): the first
   round's tombstones go, nothing else changes for a consumer;
3. the broker's own cleaner, switched on, compacts the partition further from the
   ``cleaner-offset-checkpoint`` kafka-cleaner left, without an error.

The metadata log shares the data log dir here, so kafka-cleaner reads the topic's real
configs (``cleanup.policy``, ``delete.retention.ms``, ...) from ``__cluster_metadata-0``.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from broker_workload import CLI, DAY_MS, PARTITIONS, POLICY, TOPIC, Rec, latest, live, produce_workload, read_all
from kafka_broker import EACH_KAFKA_LINE, RealBroker

from cleaner.storage.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleaner.storage.topic_partition import TopicPartition

pytestmark = [
    pytest.mark.slow,
    EACH_KAFKA_LINE,
]


def clean(broker: RealBroker, policy: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(CLI), "clean", str(broker.log_dir), "--policy", str(policy), *extra],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def assert_served_as_kept(
    broker: RealBroker, before: dict[str, list[Rec]], offsets: dict[int, tuple[int, int]]
) -> dict[str, list[Rec]]:
    """What the restarted broker serves: a subset of what it served before, record for record
    at the same offsets, with the same latest committed values and offsets."""
    after = {isolation: read_all(broker, isolation) for isolation in ("read_committed", "read_uncommitted")}
    for isolation, records in after.items():
        served_before = {(r.partition, r.offset): r for r in before[isolation]}
        moved = [r for r in records if served_before.get((r.partition, r.offset)) != r]
        assert moved == [], f"{isolation}: records not served before at that offset: {moved[:3]}"
    assert latest(after["read_committed"]) == latest(before["read_committed"])
    assert broker.offsets(TOPIC, PARTITIONS) == offsets
    assert broker.problems([TOPIC]) == [], broker.problems([TOPIC])
    return after


def test_round_trip_then_past_the_horizon_then_the_brokers_own_cleaner(tmp_path: Path, line: str) -> None:
    broker = RealBroker(tmp_path / "broker", line, separate_metadata=False).start()
    try:
        broker.create_topic(TOPIC, PARTITIONS, {"cleanup.policy": "compact", "segment.bytes": str(1 << 20)})
        produce_workload(broker, seed=int(line.replace(".", "")))
        before = {isolation: read_all(broker, isolation) for isolation in ("read_committed", "read_uncommitted")}
        aborted = len(before["read_uncommitted"]) - len(before["read_committed"])
        assert aborted > 0 and any(r.value is None for r in before["read_committed"])
        offsets = broker.offsets(TOPIC, PARTITIONS)
        policy = tmp_path / "policy.yaml"
        policy.write_text(POLICY)

        # 1. A clean now: duplicates and aborted data go, tombstones get their horizon.
        broker.stop()
        clean(broker, policy)
        cleaned_to = OffsetCheckpointFile(broker.log_dir / CLEANER_OFFSET_CHECKPOINT).read()
        assert all(cleaned_to.get(TopicPartition(TOPIC, p), 0) > 0 for p in range(PARTITIONS)), cleaned_to
        broker.start()
        after = assert_served_as_kept(broker, before, offsets)
        assert len(after["read_uncommitted"]) < len(before["read_uncommitted"]), "the clean removed nothing"

        # 2. More versions of the same keys (a segment rolls, so the log is cleanable again),
        # then a clean past the first tombstones' horizon (delete.retention.ms: the cluster's
        # default, one day): they go, and a consumer sees nothing else change.
        produce_workload(broker, seed=7)
        middle = read_all(broker, "read_committed")
        offsets = broker.offsets(TOPIC, PARTITIONS)
        broker.stop()
        clean(broker, policy, "--now-ms", str(int(time.time() * 1000) + 2 * DAY_MS))
        broker.start()
        final = read_all(broker, "read_committed")
        first_round = {r.partition: r.offset for r in before["read_uncommitted"]}
        expired = [r for r in final if r.value is None and r.offset <= first_round[r.partition]]
        assert expired == [], f"tombstones outlived their horizon: {expired[:3]}"
        assert live(final) == live(middle)
        assert broker.offsets(TOPIC, PARTITIONS) == offsets
        assert broker.problems([TOPIC]) == [], broker.problems([TOPIC])

        # 3. The broker's own cleaner takes over from kafka-cleaner's checkpoint.
        broker.stop()
        ours = OffsetCheckpointFile(broker.log_dir / CLEANER_OFFSET_CHECKPOINT).read()
        broker.reconfigure(log_cleaner_enable="true")
        broker.start()
        produce_workload(broker, seed=99)
        expected = live(read_all(broker, "read_committed"))
        deadline = time.monotonic() + 120
        while True:
            theirs = OffsetCheckpointFile(broker.log_dir / CLEANER_OFFSET_CHECKPOINT).read()
            if all(theirs.get(tp, 0) > ours[tp] for tp in ours if tp.topic == TOPIC):
                break
            assert time.monotonic() < deadline, f"the broker's cleaner did not move on from {ours}: {theirs}"
            time.sleep(0.5)
        assert live(read_all(broker, "read_committed")) == expected
        cleaner_errors = [
            line for line in broker.log_since_start().splitlines() if "ERROR" in line and "Cleaner" in line
        ]
        assert cleaner_errors == [] and broker.problems([TOPIC]) == [], cleaner_errors + broker.problems([TOPIC])
    finally:
        broker.stop()
