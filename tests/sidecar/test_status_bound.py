"""/status stays under 64 KiB whatever the broker holds, and still validates."""

from __future__ import annotations

import json
import random
from pathlib import Path

from sidecar_helpers import new_sidecar, status_of, validate_status, write_policy

from cleaner.cleaning import PartitionStatus
from cleaner.engine.manager import PartitionReport
from cleaner.segment_facts import SegmentFacts
from cleaner.sidecar.report import MAX_STATUS_BYTES, LogDirInfo, ScanSnapshot, build_status
from cleaner.storage.topic_partition import TopicPartition

NOW = 1_700_000_000_000
LOG_DIR = "/var/lib/kafka/data/" + "kafka-log" * 20


def _snapshot(topics: int, partitions: int, uncleanable_every: int, name_length: int) -> ScanSnapshot:
    rng = random.Random(1)
    statuses = []
    for t in range(topics):
        topic = f"t{t:05d}-" + "x" * (name_length - 7)
        for p in range(partitions):
            ratio = rng.random()
            report = PartitionReport(
                LOG_DIR,
                TopicPartition(topic, p),
                compacted=True,
                size_bytes=10**9,
                clean_bytes=int(10**9 * (1 - ratio)),
                cleanable_bytes=int(10**9 * ratio),
                cleanable_ratio=ratio,
                eligible=ratio > 0.5,
                reason=None if ratio > 0.5 else "ratio",
                earliest_dirty_timestamp_ms=NOW - 3_600_000,
            )
            if (t * partitions + p) % uncleanable_every == 0:
                report.reason, report.eligible = "uncleanable", False
                report.uncleanable_reason = "CorruptRecordError: " + "bad bytes at position 123456 " * 8
            statuses.append(PartitionStatus(report, SegmentFacts(10**9, 1000, 10**6, 100, NOW - 7_200_000), NOW))
    return ScanSnapshot(NOW, statuses, [LogDirInfo(LOG_DIR, len(statuses), True, 10**12, 2 * 10**12, 0)])


def _document(snapshot: ScanSnapshot, errors: int = 20, error_dir: str = LOG_DIR) -> dict:
    doc = build_status(
        broker="kafka-0",
        mode="observe",
        policy_generation=9,
        snapshot=snapshot,
        cleaner={
            "threads": 1,
            "deadThreads": 0,
            "lastRunAt": None,
            "maxDirtyRatio": snapshot.max_dirty_ratio,
            "maxCompactionDelaySeconds": 0.0,
            "bytesReclaimedTotal": 0,
            "stagedBytes": 0,
            "state": "observing",
        },
        errors=[
            {"at": "2023-11-14T22:13:20.000Z", "logDir": error_dir, "partition": f"t-{i}", "message": "m" * 3000}
            for i in range(errors)
        ],
        top_partitions=20,
        last_cleaned_at={},
    )
    body = json.dumps(doc, separators=(",", ":")).encode()
    assert len(body) <= MAX_STATUS_BYTES, len(body)
    return validate_status(json.loads(body))


def test_ten_thousand_partitions_many_uncleanable() -> None:
    snapshot = _snapshot(topics=1_000, partitions=10, uncleanable_every=3, name_length=120)
    doc = _document(snapshot)
    ranked = sorted((s.report for s in snapshot.statuses), key=lambda r: -r.cleanable_ratio)
    top = [(p["topic"], p["partition"]) for p in doc["partitions"][:20]]
    assert top == [(r.topic_partition.topic, r.topic_partition.partition) for r in ranked[:20]]
    assert doc["truncated"]["topics"] > 0 and doc["truncated"]["partitions"] > 0
    assert len(doc["partitions"]) + doc["truncated"]["partitions"] == 20 + sum(
        1 for r in ranked[20:] if r.reason == "uncleanable"
    )
    assert all(p["reason"] == "uncleanable" for p in doc["partitions"][20:])
    assert doc["errors"] and all(len(e["message"]) <= 1024 for e in doc["errors"])
    assert doc["errors"][-1]["partition"] == "t-19", "the newest error must stay"


def test_ten_thousand_topics_with_the_longest_names() -> None:
    doc = _document(_snapshot(topics=10_000, partitions=1, uncleanable_every=1, name_length=249))
    assert len(doc["partitions"]) >= 20 and doc["errors"]


def test_the_top_partitions_outrank_old_errors() -> None:
    """Errors about log dirs with the longest paths (4 KiB): the older ones go before the
    top partitions do; the newest stays."""
    snapshot = _snapshot(topics=1_000, partitions=10, uncleanable_every=3, name_length=249)
    doc = _document(snapshot, error_dir="/" + "d" * 4000)
    assert len(doc["partitions"]) >= 20
    assert 1 <= len(doc["errors"]) < 20 and doc["errors"][-1]["partition"] == "t-19"


def test_a_small_broker_is_not_cut() -> None:
    doc = _document(_snapshot(topics=5, partitions=4, uncleanable_every=7, name_length=20), errors=3)
    assert "truncated" not in doc and len(doc["topics"]) == 5
    assert len(doc["partitions"]) == 20 and len(doc["errors"]) == 3


def test_ten_thousand_partition_dirs_through_the_sidecar(tmp_path: Path) -> None:
    """10,000 partition directories as a broker creates them (an empty first segment; a
    ``name-N`` directory without a segment file is not a partition) scanned by the sidecar."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "meta.properties").write_text("version=1\nnode.id=1\ncluster.id=test\n")
    for t in range(100):
        for p in range(100):
            partition = data / f"topic-{t:03d}-{'y' * 150}-{p}"
            partition.mkdir()
            (partition / "00000000000000000000.log").touch()
    sc = new_sidecar(write_policy(tmp_path / "policy.yaml"), [data])
    sc.tick()
    doc = status_of(sc)
    assert len(json.dumps(doc, separators=(",", ":"))) <= MAX_STATUS_BYTES
    assert doc["logDirs"][0]["partitions"] == 10_000
