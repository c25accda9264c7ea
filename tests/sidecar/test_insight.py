"""What the sidecar tells a person beyond Kafka's metrics (issue 14): who holds the last
stable offset, and what the next clean would meet, in ``/status`` and ``/metrics``."""

from __future__ import annotations

from pathlib import Path

from kafka_logs import batch_of, write_high_watermarks, write_log
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sidecar_helpers import NOW_MS, new_sidecar, next_scan, partition_entry, topic_entry, write_policy

from cleaner.storage.log import LogConfig
from cleaner.storage.topic_partition import TopicPartition

TOPICS = [{"match": "orders", "cleanupPolicy": "compact", "minCleanableDirtyRatio": 0.01}]
STARTED_MS = NOW_MS - 3_600_000  # the open transaction began an hour before the scan


def _log_dir(root: Path) -> Path:
    """orders-0: 40 duplicated keys over several segments, then producer 4001 opens a
    transaction it never ends; orders-1: the same without the transaction."""
    for partition, hanging in ((0, True), (1, False)):
        batches = [batch_of([o], [b"k%d" % (o % 10)], timestamp=STARTED_MS - 10_000) for o in range(40)]
        if hanging:
            batches.append(
                batch_of([40], [b"k1"], timestamp=STARTED_MS - 40, producer_id=4001, producer_epoch=2,
                         base_sequence=0, is_transactional=True)
            )
        batches += [batch_of([o], [b"k%d" % (o % 10)], timestamp=STARTED_MS) for o in range(41, 50)]
        write_log(root / f"orders-{partition}", batches, config=LogConfig(segment_bytes=1024)).close()
    write_high_watermarks(root, {TopicPartition("orders", p): 50 for p in (0, 1)})
    return root


def test_status_and_metrics_name_the_hanging_transaction_and_the_next_clean(tmp_path: Path) -> None:
    data = _log_dir(tmp_path / "kafka-logs")
    sc = new_sidecar(write_policy(tmp_path / "p.yaml", mode="observe", topics=TOPICS), [data])
    doc = next_scan(sc)

    pinned = partition_entry(doc, "orders-0")
    assert pinned is not None
    holder = pinned["lsoHolder"]
    assert (holder["producerId"], holder["producerEpoch"], holder["firstOffset"]) == (4001, 2, 40)
    assert holder["ageSeconds"] >= 3600
    free = partition_entry(doc, "orders-1")
    assert free is not None and free["lsoHolder"] is None
    # 10 keys over 50 records: the next clean frees most of orders-1, and of orders-0 only
    # what lies below the open transaction (the first uncleanable offset is at most 40).
    assert pinned["nextClean"]["dirtyRecords"] < free["nextClean"]["dirtyRecords"]
    assert free["nextClean"]["dirtyDistinctKeys"] == 10
    assert free["nextClean"]["bytesFreed"] > 0 and free["nextClean"]["kafkaPasses"] == 1
    topic = topic_entry(doc, "orders")
    assert topic["nextCleanFreedBytes"] == sum(
        p["nextClean"]["bytesFreed"] for p in (pinned, free) if p["nextClean"] is not None
    )

    families = {f.name: f for f in text_string_to_metric_families(generate_latest(sc.metrics.registry).decode())}
    [sample] = families["kafka_cleaner_lso_holder_age_seconds"].samples
    assert sample.labels == {"topic": "orders", "partition": "0", "producer_id": "4001", "producer_epoch": "2"}
    assert sample.value == holder["ageSeconds"]
    [freed] = families["kafka_cleaner_topic_next_clean_freed_bytes"].samples
    assert freed.value == topic["nextCleanFreedBytes"]


def test_status_says_whether_a_topics_config_is_the_clusters_and_what_is_the_policys(tmp_path: Path) -> None:
    """With the KRaft metadata log on the same disk the topic's ``cleanup.policy`` is the
    cluster's (``compact,delete`` here, the policy says ``compact``), while
    ``min.cleanable.dirty.ratio`` (when to clean) is the policy's; without it, the policy's
    values stand and /status says so."""
    import uuid

    from metadata_logs import config_record, topic_record, write_metadata_log

    with_metadata = _log_dir(tmp_path / "a")
    metadata = with_metadata / "__cluster_metadata-0"
    metadata.mkdir()
    write_metadata_log(metadata / "00000000000000000000.log", [
        topic_record("orders", uuid.uuid4()),
        config_record(2, "orders", "cleanup.policy", "compact,delete"),
        config_record(2, "orders", "min.cleanable.dirty.ratio", "0.5"),
    ])  # fmt: skip
    without = _log_dir(tmp_path / "b")
    expected = {
        with_metadata: (True, ["min.cleanable.dirty.ratio"]),  # cleanup.policy: the cluster's
        without: (False, ["cleanup.policy", "min.cleanable.dirty.ratio"]),  # the rule's own keys
    }
    for root, (cluster, overrides) in expected.items():
        sc = new_sidecar(write_policy(root.parent / f"{root.name}.yaml", topics=TOPICS), [root])
        orders = topic_entry(next_scan(sc), "orders")
        assert (orders["clusterConfig"], orders["fromPolicy"]) == (cluster, overrides), orders
