"""The cluster's topic configs read from ``__cluster_metadata-0``, and their merge with a policy."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest
from metadata_logs import ABORT, BEGIN, END, config_record, remove_topic_record, topic_record, write_metadata_log

from cleaner.config import CleanupPolicy, TopicRule
from cleaner.effective_config import CLUSTER, DEFAULT, POLICY, effective_rule
from cleaner.errors import CorruptRecordError
from cleaner.storage.cluster_metadata import (
    ClusterMetadataReader,
    ConfigValue,
    find_metadata_dir,
    read_cluster_metadata,
)


def test_topic_and_broker_configs_replay_in_order(tmp_path: Path) -> None:
    d = tmp_path / "__cluster_metadata-0"
    d.mkdir()
    orders, gone = uuid.uuid4(), uuid.uuid4()
    write_metadata_log(
        d / "00000000000000000000.log",
        [
            topic_record("orders", orders),
            config_record(2, "orders", "cleanup.policy", "compact"),
            config_record(2, "orders", "delete.retention.ms", "1000"),
            config_record(2, "orders", "delete.retention.ms", "5000"),  # a later value wins
            config_record(4, "", "log.cleaner.min.compaction.lag.ms", "60000"),
            config_record(4, "1", "log.retention.hours", "2"),
            topic_record("gone", gone),
            config_record(2, "gone", "cleanup.policy", "compact"),
            remove_topic_record(gone),
            config_record(2, "orders", "segment.bytes", "1048576"),
            config_record(2, "orders", "segment.bytes", None),  # a null value deletes the key
        ],
    )
    meta = read_cluster_metadata(d)
    assert meta.end_offset == 11
    assert set(meta.topics) == {"orders"}
    assert meta.topic_configs["orders"] == {"cleanup.policy": "compact", "delete.retention.ms": "5000"}
    configs = meta.topic("orders", broker_id=1)
    assert configs["cleanup.policy"] == ConfigValue("compact", "topic")
    assert configs["delete.retention.ms"] == ConfigValue("5000", "topic")
    assert configs["min.compaction.lag.ms"] == ConfigValue("60000", "cluster-default")
    # log.retention.hours is a synonym of retention.ms, converted to milliseconds.
    assert configs["retention.ms"] == ConfigValue("7200000", "broker-default")
    assert "segment.bytes" not in configs
    assert "retention.ms" not in meta.topic("orders", broker_id=2)
    assert meta.topic("gone") == meta.topic("never-existed")


def test_metadata_transactions_apply_on_end_and_vanish_on_abort(tmp_path: Path) -> None:
    d = tmp_path / "__cluster_metadata-0"
    d.mkdir()
    t = uuid.uuid4()
    write_metadata_log(
        d / "00000000000000000000.log",
        [
            topic_record("t", t),
            BEGIN,
            config_record(2, "t", "cleanup.policy", "compact"),
            ABORT,
            BEGIN,
            config_record(2, "t", "delete.retention.ms", "42"),
            END,
            BEGIN,
            config_record(2, "t", "min.compaction.lag.ms", "7"),  # still open at the end: not applied
        ],
    )
    assert read_cluster_metadata(d).topic_configs["t"] == {"delete.retention.ms": "42"}


def test_snapshot_then_the_log_after_it(tmp_path: Path) -> None:
    d = tmp_path / "__cluster_metadata-0"
    d.mkdir()
    t = uuid.uuid4()
    # The log still holds the records the snapshot covers; they must not be applied twice
    # (the second value below is only in the log, after the snapshot's end offset).
    log_values = [
        topic_record("t", t),
        config_record(2, "t", "retention.ms", "1"),
        config_record(2, "t", "retention.ms", "2"),
    ]
    write_metadata_log(d / "00000000000000000000.log", log_values, per_batch=1)
    write_metadata_log(
        d / "00000000000000000002-0000000001.checkpoint",
        [
            topic_record("t", t),
            config_record(2, "t", "retention.ms", "99"),
            config_record(2, "t", "segment.bytes", "5"),
        ],
    )
    meta = read_cluster_metadata(d)
    assert meta.snapshot == "00000000000000000002-0000000001.checkpoint"
    assert meta.topic_configs["t"] == {"retention.ms": "2", "segment.bytes": "5"}


def test_a_truncated_tail_ends_the_replay_but_garbage_is_named(tmp_path: Path) -> None:
    d = tmp_path / "__cluster_metadata-0"
    d.mkdir()
    log = d / "00000000000000000000.log"
    write_metadata_log(log, [topic_record("t", uuid.uuid4()), config_record(2, "t", "retention.ms", "5")], per_batch=1)
    whole = log.read_bytes()
    log.write_bytes(whole[:-10])  # a broker killed mid-append
    assert read_cluster_metadata(d).topic_configs == {}
    write_metadata_log(log, [b"\x01\x04\x00\x02\xff"])  # a ConfigRecord cut short
    with pytest.raises(CorruptRecordError, match=r"00000000000000000000\.log.*offset 0.*API key 4"):
        read_cluster_metadata(d)


def test_metadata_dir_is_found_among_log_dirs(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b" / "__cluster_metadata-0").mkdir(parents=True)
    assert find_metadata_dir([tmp_path / "a", tmp_path / "b"]) == tmp_path / "b" / "__cluster_metadata-0"
    assert find_metadata_dir([tmp_path / "a"]) is None


@pytest.mark.fixtures
def test_real_kraft_metadata_logs(real_kafka_root: Path, tmp_path: Path) -> None:
    flink = real_kafka_root / "flink-on-prem" / "data" / "__cluster_metadata-0"
    ldi = real_kafka_root / "LDI-POC" / "__cluster_metadata-0"
    meta = read_cluster_metadata(flink)  # Confluent Platform 7.6 (Kafka 3.6) in KRaft mode
    assert meta.end_offset == 17027
    assert meta.topic("_schemas")["cleanup.policy"] == ConfigValue("compact", "topic")
    offsets = meta.topic("__consumer_offsets")
    assert offsets["cleanup.policy"].value == "compact"
    assert offsets["segment.bytes"].value == "104857600"
    assert meta.topic("loyalty_levels") == {}  # created without overrides
    assert "loyalty_levels" in meta.topics
    ldi_meta = read_cluster_metadata(ldi)  # Kafka 3.7.0
    assert set(ldi_meta.topics) >= {"__consumer_offsets", "TestTopicPatient"}
    # Reading changes nothing: the fixtures are read-only and still byte-identical to a copy.
    copy = tmp_path / "copy"
    shutil.copytree(flink, copy)
    assert read_cluster_metadata(copy).topic_configs == meta.topic_configs


def _cluster(**values: str) -> dict[str, ConfigValue]:
    return {k.replace("_", "."): ConfigValue(v, "topic") for k, v in values.items()}


def test_merge_keeps_every_promise_of_the_cluster() -> None:
    rule = TopicRule(
        match=".*",
        cleanup_policy=CleanupPolicy.COMPACT,
        delete_retention_ms=1_000,
        min_compaction_lag_ms=10,
        min_cleanable_dirty_ratio=0.1,
        segment_bytes=1 << 20,
        retention_ms=5,
    )
    cluster = _cluster(
        cleanup_policy="compact,delete",
        delete_retention_ms="86400000",
        min_compaction_lag_ms="5",
        min_cleanable_dirty_ratio="0.9",
        segment_bytes="104857600",
        retention_ms="-1",
    )
    eff = effective_rule(rule, cluster)
    assert eff.rule.cleanup_policy is CleanupPolicy.COMPACT_DELETE  # the cluster decides what a topic is
    assert eff.rule.delete_retention_ms == 86_400_000  # never shorter than promised
    assert eff.rule.min_compaction_lag_ms == 10  # the policy may wait longer
    assert eff.rule.min_cleanable_dirty_ratio == 0.1  # scheduling: the policy's
    assert eff.rule.segment_bytes == 104_857_600  # the broker's segment shape
    assert eff.rule.retention_ms == -1  # unlimited beats 5 ms
    assert eff.sources["cleanup.policy"] == CLUSTER
    assert eff.sources["delete.retention.ms"] == CLUSTER
    assert eff.sources["min.compaction.lag.ms"] == POLICY
    assert eff.sources["max.compaction.lag.ms"] == DEFAULT
    assert any("delete.retention.ms" in note for note in eff.notes)


def test_merge_without_a_metadata_log_is_the_policy() -> None:
    rule = TopicRule(match="x", cleanup_policy=CleanupPolicy.COMPACT, delete_retention_ms=5)
    eff = effective_rule(rule, None)
    assert eff.rule == rule
    assert not eff.cluster_known
    assert eff.sources["delete.retention.ms"] == POLICY
    assert eff.sources["segment.bytes"] == DEFAULT


def test_a_cluster_that_sets_nothing_promises_kafkas_defaults() -> None:
    """A metadata log that sets no ``delete.retention.ms`` for the topic (nor as a dynamic
    default): the cluster's brokers keep tombstones Kafka's 24 hours, so a policy's hour gives
    way to that; a longer policy value stands (issue 27 item 7)."""
    rule = TopicRule(match=".*", cleanup_policy=CleanupPolicy.COMPACT, delete_retention_ms=3_600_000,
                     min_compaction_lag_ms=10)
    eff = effective_rule(rule, {})
    assert eff.rule.delete_retention_ms == 86_400_000
    assert eff.sources["delete.retention.ms"] == DEFAULT
    assert "delete.retention.ms: the policy's 3600000 gave way to Kafka's default 86400000" in eff.notes
    assert eff.rule.min_compaction_lag_ms == 10  # longer than Kafka's 0: the policy's
    assert eff.sources["min.compaction.lag.ms"] == POLICY
    longer = effective_rule(TopicRule(match=".*", delete_retention_ms=7 * 86_400_000), {})
    assert longer.rule.delete_retention_ms == 7 * 86_400_000 and not longer.notes


def test_merged_lags_stay_ordered_and_tiered_logs_are_flagged() -> None:
    rule = TopicRule(match=".*", cleanup_policy=CleanupPolicy.COMPACT, max_compaction_lag_ms=1_000)
    eff = effective_rule(rule, _cluster(min_compaction_lag_ms="5000", remote_storage_enable="true"))
    assert eff.rule.min_compaction_lag_ms == 5_000
    assert eff.rule.max_compaction_lag_ms >= eff.rule.min_compaction_lag_ms
    assert eff.remote_storage


def test_a_value_the_cluster_wrote_badly_leaves_the_policy_standing() -> None:
    rule = TopicRule(match=".*", delete_retention_ms=7)
    eff = effective_rule(rule, _cluster(delete_retention_ms="soon"))
    assert eff.rule.delete_retention_ms == 7
    assert "does not parse" in eff.notes[0]


def test_a_reader_follows_appends_and_starts_over_on_truncation(tmp_path: Path) -> None:
    d = tmp_path / "__cluster_metadata-0"
    d.mkdir()
    log = d / "00000000000000000000.log"
    t = uuid.uuid4()
    end = write_metadata_log(log, [topic_record("t", t), config_record(2, "t", "retention.ms", "1")])
    reader = ClusterMetadataReader(d)
    assert reader.refresh().topic_configs["t"] == {"retention.ms": "1"}
    first = log.read_bytes()
    more = d / "more.log"
    write_metadata_log(more, [config_record(2, "t", "retention.ms", "2")], base_offset=end)
    with log.open("ab") as f:
        f.write(more.read_bytes())
    more.unlink()
    state = reader.refresh()
    assert state.topic_configs["t"] == {"retention.ms": "2"}
    assert state.end_offset == end + 1
    # A truncation back to the first batches (a diverged leader's log) replays from scratch.
    log.write_bytes(first[: len(first) // 2])
    assert reader.refresh().topic_configs == {}
