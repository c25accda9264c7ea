"""A corrupt partition is reported (errors, uncleanable) and the others go on; a log dir
that disappears (or a pattern that matches nothing yet) is reported, never fatal, and
picked up again when it comes back."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from kafka_logs import consumer_view, snapshot_dir
from sidecar_helpers import ALWAYS, finish_pass, new_sidecar, next_scan, partition_entry, status_of, write_policy

from cleaner.records.scan import scan_batches
from cleaner.storage.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile


def _corrupt(pdir: Path) -> str:
    """Flip the magic byte of the third batch of the partition's second segment (what a bad
    disk sector or a stray write does); returns the segment's name."""
    segment = sorted(pdir.glob("*.log"))[1]
    data = bytearray(segment.read_bytes())
    position = int(scan_batches(bytes(data)).batches.positions[2])
    data[position + 16] ^= 0x7F  # magic: 2 -> 125
    segment.write_bytes(bytes(data))
    return segment.name


def _uncleanable_metric(sc, log_dir: Path) -> float:
    return sc.metrics.registry.get_sample_value("kafka_cleaner_uncleanable_partitions", {"log_dir": str(log_dir)})


@pytest.mark.parametrize("mode", ["observe", "compact"])
def test_a_corrupt_partition_is_reported_and_the_others_go_on(tmp_path: Path, make_log_dir, mode: str) -> None:
    data = make_log_dir(topics=2, partitions=2)
    bad = data / "topic-1-0"
    segment = _corrupt(bad)
    bad_files = snapshot_dir(bad)
    views = {p.name: consumer_view(p).live for p in data.iterdir() if p.is_dir() and p != bad}
    sc = new_sidecar(write_policy(tmp_path / "policy.yaml", mode=mode), [data], scan_ms=1_000)
    sc.tick()
    if mode == "compact":
        finish_pass(sc)
    doc = next_scan(sc, 2_000)
    if mode == "compact":
        finish_pass(sc)
        doc = next_scan(sc, 2_000)

    errors = [e for e in doc["errors"] if e["partition"] == "topic-1-0"]
    assert errors and all(segment in e["message"] for e in errors), doc["errors"]
    assert all(e["logDir"] == str(data) for e in errors)
    entry = partition_entry(doc, "topic-1-0")
    assert entry is not None and entry["reason"] == "uncleanable" and entry["eligible"] is False
    assert segment in entry["uncleanableReason"]
    assert doc["logDirs"][0]["uncleanablePartitions"] == 1 == _uncleanable_metric(sc, data)
    assert not [e for e in doc["errors"] if e["partition"] != "topic-1-0"]
    others = [partition_entry(doc, tp) for tp in ("topic-0-0", "topic-0-1", "topic-1-1")]
    assert all(p is not None and p["reason"] != "uncleanable" for p in others)
    assert snapshot_dir(bad) == bad_files, "the corrupt partition was touched"

    if mode == "compact":  # the others are cleaned, the corrupt one is not retried
        # (Kafka's doneCleaning checkpoints a failed partition at its unchanged first dirty offset.)
        cleaned = {str(tp): o for tp, o in OffsetCheckpointFile(data / CLEANER_OFFSET_CHECKPOINT).read().items()}
        assert cleaned.pop("topic-1-0", 0) == 0
        assert set(cleaned) == {"topic-0-0", "topic-0-1", "topic-1-1"} and all(o > 0 for o in cleaned.values())
        for name, live in views.items():
            assert consumer_view(data / name).live == live
        failures = sc.metrics.registry.get_sample_value("kafka_cleaner_cleanings_total", {"result": "failure"})
        for _ in range(3):
            doc = next_scan(sc, 2_000)
            finish_pass(sc)
        assert sc.metrics.registry.get_sample_value("kafka_cleaner_cleanings_total", {"result": "failure"}) == failures
        assert len([e for e in status_of(sc)["errors"] if e["partition"] == "topic-1-0"]) == len(errors)

    # Repaired: the partition is deleted (seen by a scan), then re-replicated from the leader.
    shutil.rmtree(bad)
    next_scan(sc, 2_000)
    if mode == "compact":
        finish_pass(sc)
    shutil.copytree(tmp_path / "kafka-logs" / "topic-1-1", bad)
    (bad / "partition.metadata").unlink(missing_ok=True)
    for _ in range(2):
        doc = next_scan(sc, 2_000)
        if mode == "compact":
            finish_pass(sc)
    doc = status_of(sc)
    entry = partition_entry(doc, "topic-1-0")
    assert entry is None or entry["reason"] != "uncleanable", entry["uncleanableReason"]
    assert doc["logDirs"][0]["uncleanablePartitions"] == 0


def test_a_deleted_partition_does_not_stop_the_scans(tmp_path: Path, make_log_dir) -> None:
    """Topic deletion or a reassignment removes a partition dir under a running sidecar."""
    data = make_log_dir(topics=2, partitions=2)
    sc = new_sidecar(write_policy(tmp_path / "policy.yaml"), [data])
    sc.tick()
    shutil.rmtree(data / "topic-1-1")
    for _ in range(2):
        doc = next_scan(sc)
        assert {f"{p['topic']}-{p['partition']}" for p in doc["partitions"]} == {"topic-0-0", "topic-0-1", "topic-1-0"}
        assert doc["errors"] == [] and doc["logDirs"][0]["partitions"] == 3


@pytest.mark.parametrize("mode", ["observe", "compact"])
def test_a_log_dir_that_disappears_and_comes_back(tmp_path: Path, make_log_dir, mode: str) -> None:
    one = make_log_dir("one", topics=1, partitions=2)
    two = make_log_dir("two", topics=1, partitions=2, topic_prefix="orders")
    backup = tmp_path / "backup"
    shutil.copytree(two, backup)
    policy = write_policy(
        tmp_path / "policy.yaml",
        mode=mode,
        topics=[{"match": ".*", "cleanupPolicy": "compact"}],
        compact=ALWAYS if mode == "compact" else None,
    )
    sc = new_sidecar(policy, [one, two], scan_ms=1_000)
    sc.tick()
    if mode == "compact":
        finish_pass(sc)
    assert [d["path"] for d in status_of(sc)["logDirs"]] == [str(one), str(two)]

    shutil.rmtree(two)  # the volume is gone (rm -r while running)
    for _ in range(3):
        doc = next_scan(sc, 2_000)
        if mode == "compact":
            finish_pass(sc)
    doc = status_of(sc)
    assert doc["cleaner"]["state"] != "error"
    assert [d["path"] for d in doc["logDirs"]] == [str(one)]
    assert any(str(two) in e["message"] for e in doc["errors"])
    assert {p["topic"] for p in doc["partitions"]} == {"topic-0"}

    shutil.copytree(backup, two)  # back
    for _ in range(2):
        doc = next_scan(sc, 2_000)
        if mode == "compact":
            finish_pass(sc)
    doc = status_of(sc)
    assert [d["path"] for d in doc["logDirs"]] == [str(one), str(two)]
    assert {p["topic"] for p in doc["partitions"]} == {"topic-0", "orders-0"}
    assert not any(p["reason"] == "uncleanable" for p in doc["partitions"])
    if mode == "compact":
        assert {str(tp) for tp in OffsetCheckpointFile(two / CLEANER_OFFSET_CHECKPOINT).read()} == {
            "orders-0-0",
            "orders-0-1",
        }


def test_a_pattern_that_matches_nothing_yet(tmp_path: Path, make_log_dir, caplog: pytest.LogCaptureFixture) -> None:
    """Strimzi's ``kafka-log<id>``: the operator passes ``kafka-log*`` and the broker creates
    the directory after the sidecar started. Until then the sidecar is not ready, and says
    why in /status and in its log; a directory the broker has not initialised yet (no
    meta.properties) is no log dir."""
    pattern = str(tmp_path / "kafka-log*")
    (tmp_path / "kafka-log0").mkdir()  # created, not yet initialised by the broker
    sc = new_sidecar(write_policy(tmp_path / "policy.yaml"), [pattern])
    with caplog.at_level(logging.WARNING, logger="cleaner.sidecar"):
        sc.tick()
    doc = status_of(sc)
    assert doc["logDirs"] == [] and doc["scannedAt"] is not None and not sc.ready
    assert any(pattern in e["message"] and "matches no Kafka log dir" in e["message"] for e in doc["errors"])
    assert any(pattern in r.getMessage() and "matches no Kafka log dir" in r.getMessage() for r in caplog.records)
    assert list((tmp_path / "kafka-log0").iterdir()) == [], "something was written into a directory that is no log dir"
    (tmp_path / "kafka-log0").rmdir()
    created = make_log_dir("kafka-log0", topics=1, partitions=1)
    doc = next_scan(sc)
    assert sc.ready
    assert [d["path"] for d in doc["logDirs"]] == [str(created)] and doc["logDirs"][0]["partitions"] == 1
    assert len(doc["partitions"]) == 1


def test_a_wildcard_matches_only_kafka_log_dirs(tmp_path: Path, make_log_dir) -> None:
    """``kafka-log*`` next to a backup and a non-Kafka tree of ``name-N`` directories: only
    the log dir is scanned, and nothing is written anywhere else."""
    log_dir = make_log_dir("kafka-log0", topics=1, partitions=1)
    lookalike = tmp_path / "kafka-logs-not-kafka"
    (lookalike / "dbus-1").mkdir(parents=True)
    (lookalike / "polkit-1").mkdir()
    before = snapshot_dir(lookalike)
    sc = new_sidecar(write_policy(tmp_path / "policy.yaml"), [str(tmp_path / "kafka-log*")])
    sc.tick()
    doc = status_of(sc)
    assert [d["path"] for d in doc["logDirs"]] == [str(log_dir)]
    assert snapshot_dir(lookalike) == before and sorted(p.name for p in lookalike.iterdir()) == ["dbus-1", "polkit-1"]
