"""The replication race facts (issue 24, item 2): which replicas ``__cluster_metadata`` shows
out of the ISR or offline since when, and the earliest time any cleaner may remove a tombstone
or marker above an offset (``replica_facts.removals``)."""

from __future__ import annotations

from pathlib import Path

from engine_helpers import COMMIT, DAY, NOW, TP, LogWriter, all_batches, clean_round
from metadata_logs import (
    TOPIC_ID,
    config_record,
    fence,
    isr_change,
    partition_record,
    register_broker,
    registration_change,
    topic_record,
    write_metadata,
)

from cleaner.engine.manager import PartitionReport
from cleaner.replica_facts import Removal, _push, removals, replica_facts
from cleaner.storage.cluster_metadata import OutOfSync, read_cluster_metadata
from cleaner.storage.log import Log

T0 = NOW - 3_600_000


def test_metadata_names_the_replicas_out_of_the_isr_and_the_fenced_ones_since_when(tmp_path: Path) -> None:
    d = write_metadata(
        tmp_path,
        [
            (
                T0,
                [
                    topic_record(TP.topic, TOPIC_ID),
                    partition_record(0, [1, 2, 3], [1, 2, 3], 1),
                    partition_record(1, [2, 3, 1], [2, 3, 1], 2),
                ],
            ),
            (
                T0,
                [register_broker(1, fenced=False), register_broker(2, fenced=False), register_broker(3, fenced=False)],
            ),
            (T0 + 1000, [fence(2)]),  # broker 2 stops: fenced, then out of every ISR
            (T0 + 2000, [isr_change(0, [1, 3]), isr_change(1, [3, 1], leader=3)]),
        ],
    )
    meta = read_cluster_metadata(d)
    r0 = meta.replication(TP.topic, 0)
    assert r0 is not None and (r0.replicas, r0.isr, r0.leader) == ((1, 2, 3), (1, 3), 1)
    assert r0.out_of_sync == (OutOfSync(2, T0 + 1000, offline=True),)
    r1 = meta.replication(TP.topic, 1)
    assert r1 is not None and r1.leader == 3 and r1.out_of_sync == (OutOfSync(2, T0 + 1000, offline=True),)
    assert meta.replication(TP.topic, 5) is None and meta.replication("other", 0) is None


def test_a_replica_unfenced_but_not_caught_up_stays_out_until_the_isr_takes_it_back(tmp_path: Path) -> None:
    d = write_metadata(
        tmp_path,
        [
            (
                T0,
                [
                    topic_record(TP.topic, TOPIC_ID),
                    partition_record(0, [1, 2], [1, 2], 1),
                    register_broker(2, fenced=True),
                ],
            ),
            (T0 + 10, [registration_change(2, -1)]),  # unfenced
            (T0 + 20, [isr_change(0, [1])]),
            (T0 + 30, [registration_change(2, 1)]),  # fenced again: out since the earlier of the two
            (T0 + 40, [registration_change(2, -1)]),
        ],
    )
    meta = read_cluster_metadata(d)
    assert meta.replication(TP.topic, 0).out_of_sync == (OutOfSync(2, T0 + 20, offline=False),)  # type: ignore[union-attr]
    d2 = tmp_path / "again"
    d2.mkdir()
    write_metadata(
        d2,
        [
            (T0, [topic_record(TP.topic, TOPIC_ID), partition_record(0, [1, 2], [1], 1)]),
            (T0 + 50, [isr_change(0, [1, 2])]),
        ],
    )
    assert read_cluster_metadata(d2 / "__cluster_metadata-0").replication(TP.topic, 0).out_of_sync == ()  # type: ignore[union-attr]


def _log_with_tombstones_and_markers(partition_dir: Path) -> tuple[int, int, int]:
    """A cleaned tombstone (stored horizon NOW + DAY), then a dirty tombstone and a dirty
    transaction marker; returns their offsets."""
    w = LogWriter(partition_dir)
    w.data([b"a", b"b"])
    _, cleaned_tombstone = w.data([b"a"], [None])
    w.data([b"c", b"d"])
    w.roll()
    w.data([b"e"])
    _, dirty_tombstone = w.data([b"b"], [None])
    w.data([b"x"], pid=9, txn=True)
    marker = w.marker(COMMIT, 9)
    w.roll()
    w.data([b"z"])
    w.close()
    clean_round(partition_dir, first_dirty=0, first_uncleanable=4, now=NOW, delete_retention_ms=DAY)
    return cleaned_tombstone, dirty_tombstone, marker


def test_removals_are_the_stored_horizons_and_a_lower_bound_for_what_is_dirty(tmp_path: Path) -> None:
    partition_dir = tmp_path / f"{TP.topic}-{TP.partition}"
    cleaned, dirty, marker = _log_with_tombstones_and_markers(partition_dir)
    horizons = {b.base_offset: b.horizon for b in all_batches(partition_dir)}
    assert horizons[cleaned] == NOW + DAY  # the real cleaner stored it
    log = Log.open(partition_dir)
    read: list[int] = []
    try:
        # delete.retention.ms raised to two days since the clean: the dirty ones wait longer.
        points = removals(log, NOW + 2 * DAY, read.append)
        # Lowered to a minute: the dirty marker may go before the stored horizon, which
        # governs nothing below it any more (the earliest above offset 0 is the marker's).
        shorter = removals(log, NOW + 60_000)
    finally:
        log.close()
    # Above the cleaned tombstone, only the dirty ones: their earliest removal is the next
    # clean + delete.retention.ms (the dirty tombstone's is the marker's, which is above it).
    assert points == [Removal(cleaned, NOW + DAY), Removal(marker, NOW + 2 * DAY)]
    assert shorter == [Removal(marker, NOW + 60_000)]
    assert cleaned < dirty < marker
    assert sum(read) == sum(f.stat().st_size for f in partition_dir.glob("*.log"))  # throttled, every byte


def test_replica_facts_report_removals_only_while_a_replica_is_out_of_sync(tmp_path: Path) -> None:
    partition_dir = tmp_path / "data" / f"{TP.topic}-{TP.partition}"
    partition_dir.parent.mkdir()
    cleaned, _, marker = _log_with_tombstones_and_markers(partition_dir)
    out = write_metadata(
        tmp_path / "data",
        [
            (T0, [topic_record(TP.topic, TOPIC_ID), partition_record(0, [1, 2, 3], [1, 3], 1)]),
        ],
    )
    report = PartitionReport(
        str(tmp_path / "data"), TP, compacted=True, log_end_offset=marker + 2, high_watermark=marker + 2
    )
    log = Log.open(partition_dir)
    read: list[int] = []
    try:
        facts = replica_facts(
            log,
            report,
            cluster=read_cluster_metadata(out),
            broker_id=1,
            now_ms=NOW,
            delete_retention_ms=2 * DAY,
            throttle=read.append,
        )
        assert facts.removals == (Removal(cleaned, NOW + DAY), Removal(marker, NOW + 2 * DAY))
        entry = facts.as_status(TP.topic, TP.partition)
        assert entry["brokerId"] == 1
        assert entry["replication"] == {
            "leader": 1,
            "isr": [1, 3],
            "outOfSync": [{"broker": 2, "sinceMs": T0, "offline": False}],
        }
        assert entry["removals"] == [[cleaned, NOW + DAY], [marker, NOW + 2 * DAY]]
        assert read

        # Kafka's own cleaner uses the topic's delete.retention.ms from the metadata, shorter
        # than kafka-cleaner's effective one (never below the cluster's): the earlier counts.
        shorter = tmp_path / "shorter"
        shorter.mkdir()
        meta = write_metadata(
            shorter,
            [
                (
                    T0,
                    [
                        topic_record(TP.topic, TOPIC_ID),
                        partition_record(0, [1, 2], [1], 1),
                        config_record(2, TP.topic, "delete.retention.ms", "1000"),
                    ],
                )
            ],
        )
        facts = replica_facts(
            log, report, cluster=read_cluster_metadata(meta), broker_id=1, now_ms=NOW, delete_retention_ms=2 * DAY
        )
        assert facts.removals == (Removal(marker, NOW + 1000),)

        in_sync = tmp_path / "in-sync"
        in_sync.mkdir()
        meta = write_metadata(
            in_sync, [(T0, [topic_record(TP.topic, TOPIC_ID), partition_record(0, [1, 2], [1, 2], 1)])]
        )
        read.clear()
        quiet = replica_facts(
            log, report, cluster=read_cluster_metadata(meta), broker_id=1, now_ms=NOW, throttle=read.append
        )
        assert quiet.removals == () and read == []  # nothing read, nothing reported
        entry = quiet.as_status(TP.topic, TP.partition)
        assert "replication" not in entry and "removals" not in entry and entry["brokerId"] == 1
    finally:
        log.close()


def test_removal_points_stay_bounded_and_err_early() -> None:
    points: list[Removal] = []
    for i in range(100):
        _push(points, Removal(i * 10, 1_000 + i * i), max_removals=4)
    assert len(points) == 4
    assert points[-1].offset == 990
    truth = {i * 10: 1_000 + i * i for i in range(100)}
    for x in range(0, 991, 7):
        exact = min(t for o, t in truth.items() if o >= x)
        bounded = min(p.removable_at_ms for p in points if p.offset >= x)
        assert bounded <= exact  # never later than the truth
    _push(points, Removal(2000, 0), max_removals=4)
    assert points == [Removal(2000, 0)]  # a later point with an earlier time governs everything below it


def test_a_dirty_tombstone_is_found_inside_its_batch_and_plain_data_is_no_removal(tmp_path: Path) -> None:
    w = LogWriter(tmp_path / "topic-0")
    w.data([b"a", b"b", b"c"])
    _, last = w.data([b"d", b"a", b"e"], [b"v", None, b"v"])  # a tombstone in the middle of a batch
    w.data([b"f"], codec=1)  # gzip, no tombstone
    w.close()
    log = Log.open(tmp_path / "topic-0")
    try:
        assert removals(log, NOW + DAY) == [Removal(last, NOW + DAY)]
    finally:
        log.close()
    w = LogWriter(tmp_path / "topic-1")
    w.data([b"a", b"b"], codec=1)
    w.close()
    log = Log.open(tmp_path / "topic-1")
    try:
        assert removals(log, NOW + DAY) == []
    finally:
        log.close()
