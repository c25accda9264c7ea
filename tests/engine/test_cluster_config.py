"""The cluster's own topic configs, read from ``__cluster_metadata-0``, govern a clean."""

from __future__ import annotations

import uuid
from pathlib import Path

from engine_helpers import NOW, TP, LogWriter, all_batches
from metadata_logs import config_record, topic_record, write_metadata_log

from cleaner import cleaning
from cleaner.clock import MockTime
from cleaner.config import parse_policy
from cleaner.records.builder import build_batch
from cleaner.records.record import Record
from cleaner.storage.checkpoint import OffsetCheckpointFile
from cleaner.storage.log import Log, LogConfig

HOUR = 3_600_000
POLICY = parse_policy(
    {
        "mode": "compact",
        "topics": [
            {"match": "topic", "cleanupPolicy": "compact", "deleteRetentionMs": 0, "minCleanableDirtyRatio": 0.01}
        ],
        "cleaner": {"dedupeBufferSize": 1 << 20, "backoffMs": 0},
    }
)


def _more_dirty_data(root: Path) -> None:
    """A new rolled segment after the active one, so that the next clean has work to do."""
    the_log = Log.open(root / TP.dir_name, LogConfig())
    offset = the_log.log_end_offset
    the_log.append(build_batch([Record(offset, NOW, b"j", b"v", ())]))
    the_log.roll(offset + 1)
    the_log.append(build_batch([Record(offset + 1, NOW, b"y", b"v", ())]))
    the_log.close()
    OffsetCheckpointFile(root / "replication-offset-checkpoint").write({TP: offset + 2})


def _log_with_a_tombstone(root: Path) -> None:
    w = LogWriter(root / TP.dir_name)
    w.data([b"k", b"j"])
    w.data([b"k"], [None])  # the tombstone
    w.roll()
    w.data([b"j"])
    w.roll()
    w.data([b"z"])  # active
    w.close()
    OffsetCheckpointFile(root / "replication-offset-checkpoint").write({TP: w.next_offset})


def _metadata(root: Path, delete_retention_ms: int) -> None:
    d = root / "__cluster_metadata-0"
    d.mkdir()
    write_metadata_log(
        d / "00000000000000000000.log",
        [
            topic_record(TP.topic, uuid.uuid4()),
            config_record(2, TP.topic, "cleanup.policy", "compact"),
            config_record(2, TP.topic, "delete.retention.ms", str(delete_retention_ms)),
        ],
    )


def _tombstones(root: Path) -> int:
    return sum(1 for b in all_batches(root / TP.dir_name) for r in b.records if r.value is None)


def test_the_cluster_s_longer_delete_retention_keeps_tombstones(tmp_path: Path) -> None:
    policy_only, with_cluster = tmp_path / "a", tmp_path / "b"
    for root in (policy_only, with_cluster):
        root.mkdir()
        _log_with_a_tombstone(root)
    _metadata(with_cluster, delete_retention_ms=24 * HOUR)
    for root in (policy_only, with_cluster):
        cleaning.clean([root], POLICY, MockTime(NOW))  # sets the delete horizon (KIP-534)
        _more_dirty_data(root)
        cleaning.clean([root], POLICY, MockTime(NOW + HOUR))
    assert _tombstones(policy_only) == 0  # the policy's 0 ms horizon has passed
    assert _tombstones(with_cluster) == 1  # the cluster promised consumers 24 h
    (status,) = cleaning.status([with_cluster], POLICY, MockTime(NOW + HOUR))
    view = status.as_dict()
    assert view["clusterConfig"] is True
    assert view["configSources"]["delete.retention.ms"] == "cluster"
    assert view["configSources"]["min.cleanable.dirty.ratio"] == "policy"
    assert any("delete.retention.ms" in note for note in view["configNotes"])
    (plain,) = cleaning.status([policy_only], POLICY, MockTime(NOW + HOUR))
    assert plain.as_dict()["clusterConfig"] is False
    assert plain.as_dict()["configSources"]["delete.retention.ms"] == "policy"


def test_a_topic_the_cluster_does_not_compact_is_not_compacted(tmp_path: Path) -> None:
    _log_with_a_tombstone(tmp_path)
    d = tmp_path / "__cluster_metadata-0"
    d.mkdir()
    write_metadata_log(
        d / "00000000000000000000.log",
        [topic_record(TP.topic, uuid.uuid4()), config_record(2, TP.topic, "cleanup.policy", "delete")],
    )
    before = {p.name: p.read_bytes() for p in (tmp_path / TP.dir_name).iterdir()}
    outcome = cleaning.clean([tmp_path], POLICY, MockTime(NOW))
    assert outcome.results == []
    assert {p.name: p.read_bytes() for p in (tmp_path / TP.dir_name).iterdir()} == before
    (status,) = [s for s in cleaning.status([tmp_path], POLICY, MockTime(NOW)) if s.report.topic_partition == TP]
    assert status.report.reason == "notCompacted"
    assert status.as_dict()["configSources"]["cleanup.policy"] == "cluster"


def test_unreadable_metadata_leaves_the_policy_standing(tmp_path: Path) -> None:
    _log_with_a_tombstone(tmp_path)
    d = tmp_path / "__cluster_metadata-0"
    d.mkdir()
    write_metadata_log(d / "00000000000000000000.log", [b"\x01\x04\x00\x02\xff"])
    statuses = cleaning.status([tmp_path], POLICY, MockTime(NOW))
    (status,) = [s for s in statuses if s.report.topic_partition == TP]
    assert status.as_dict()["clusterConfig"] is False


def test_the_metadata_log_is_never_cleaned_nor_listed_whatever_the_policy_matches(tmp_path: Path) -> None:
    """Issue 9, defect 3: ``__cluster_metadata`` is the controller's log, not a topic's;
    Kafka's LogManager never loads it, and a ``.*`` rule does not make it one."""
    _log_with_a_tombstone(tmp_path)
    _metadata(tmp_path, delete_retention_ms=0)
    metadata = tmp_path / "__cluster_metadata-0"
    before = {p.name: p.read_bytes() for p in metadata.iterdir()}
    everything = parse_policy(
        {"mode": "compact", "topics": [{"match": ".*", "cleanupPolicy": "compact", "minCleanableDirtyRatio": 0.01}]}
    )
    assert everything.rule_for("__cluster_metadata") is None
    cleaning.clean([tmp_path], everything, MockTime(NOW))
    assert {p.name: p.read_bytes() for p in metadata.iterdir()} == before
    listed = [s.as_dict()["topic"] for s in cleaning.status([tmp_path], everything, MockTime(NOW))]
    assert listed == [TP.topic]
