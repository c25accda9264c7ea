"""Removal held while a replica is out of sync (issue 24, item 3): a clean keeps every tombstone
and transaction marker, past its delete horizon or not, while any replica of the partition is
out of the ISR or offline as ``__cluster_metadata`` on these disks says; the race
(docs/replica-divergence.md) needs a replica that never receives what was removed above its log
end, and in-sync replicas hold everything below the high watermark, where cleaning runs."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from engine_helpers import ABORT, DAY, NOW, TP, LogWriter, all_batches, clean_round
from metadata_logs import fence, isr_change, partition_record, register_broker, topic_record, write_metadata

from cleaner.clock import MockTime
from cleaner.config import parse_policy_text
from cleaner.engine.manager import LogCleanerManager
from cleaner.storage.log_dir import LogDirectory
from cleaner.storage.topic_partition import TopicPartition

T0 = NOW - DAY
TOPIC_ID = uuid.UUID(int=7)


def _records(directory: Path) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) for b in all_batches(directory) for r in b.records]


def _log(partition_dir: Path) -> None:
    """A tombstone for k1 and an aborted transaction of producer 1 in the clean section."""
    w = LogWriter(partition_dir)
    w.data([b"k1"])  # 0
    w.data([b"k1"], [None])  # 1: the tombstone
    w.data([b"t"], pid=1, txn=True)  # 2
    w.marker(ABORT, 1)  # 3
    for key in (b"w", b"x", b"y", b"z"):  # 4..7, a segment each
        w.roll()
        w.data([key])
    w.close()


def test_a_held_clean_keeps_tombstones_and_markers_past_their_horizon(partition_dir: Path) -> None:
    _log(partition_dir)
    # Kafka's lifecycle: the tombstone is stamped in the first round, the ABORT marker in the
    # first round that sees none of its transaction's data (the second).
    clean_round(partition_dir, first_dirty=0, first_uncleanable=4, now=NOW)
    clean_round(partition_dir, first_dirty=4, first_uncleanable=5, now=NOW)
    stamped = _records(partition_dir)
    assert (1, b"k1", None) in stamped and any(o == 3 for o, _, _ in stamped)
    # Past both horizons, a replica out: neither goes (the dirty segment is cleaned all the same).
    later = NOW + 2 * DAY
    clean_round(partition_dir, first_dirty=5, first_uncleanable=6, now=later, hold_removals="replica 2 is offline")
    held = _records(partition_dir)
    assert (1, b"k1", None) in held, "the tombstone went while a replica was out"
    assert any(o == 3 for o, _, _ in held), "the ABORT marker went while a replica was out"
    # Every replica back in sync: the next clean removes both, as Kafka's would.
    clean_round(partition_dir, first_dirty=6, first_uncleanable=7, now=later)
    after = _records(partition_dir)
    assert (1, b"k1", None) not in after and not any(o == 3 for o, _, _ in after), after


def _manager(log_dir: Path, *later: tuple[int, list[bytes]]) -> LogCleanerManager:
    (log_dir / "meta.properties").write_text("version=1\nnode.id=1\ncluster.id=test\n")
    write_metadata(
        log_dir,
        [
            (T0, [register_broker(b, fenced=False) for b in (1, 2)]),
            (T0, [topic_record(TP.topic, TOPIC_ID), partition_record(0, [1, 2], [1, 2], 1, TOPIC_ID)]),
            *later,
        ],
    )
    policy = parse_policy_text("mode: compact\ntopics:\n  - match: '.*'\n    cleanupPolicy: compact\n")
    manager = LogCleanerManager([LogDirectory(log_dir)], policy, MockTime(NOW))
    manager.logs()
    return manager


def test_the_manager_holds_removal_while_the_metadata_shows_a_replica_out(tmp_path: Path) -> None:
    in_sync = tmp_path / "a"
    _log(in_sync / f"{TP.topic}-{TP.partition}")
    assert _manager(in_sync).removal_hold(TP) is None

    out = tmp_path / "b"
    _log(out / f"{TP.topic}-{TP.partition}")
    manager = _manager(out, (T0 + 1_000, [fence(2), isr_change(0, [1], topic_id=TOPIC_ID)]))
    why = manager.removal_hold(TP)
    assert why is not None and why.startswith("replica 2 is offline since ")
    logs = manager.logs()
    ltc, _, _ = manager.log_to_clean(logs[TP], None, NOW)
    assert ltc.hold_removals == why
    # This broker itself offline (a clean in the start-up gate, or the CLI on a stopped
    # broker's disk: its metadata shows it fenced): its own replica is the one being cleaned.
    own = tmp_path / "d"
    _log(own / f"{TP.topic}-{TP.partition}")
    assert _manager(own, (T0 + 1_000, [fence(1), isr_change(0, [2], topic_id=TOPIC_ID)])).removal_hold(TP) is None

    # A partition the metadata does not know (an offline copy, a foreign metadata log: a live
    # broker creates its partitions from it): nothing known of other replicas, nothing held.
    assert manager.removal_hold(TopicPartition(TP.topic, 5)) is None

    # No metadata log on the disks (a ZooKeeper-mode broker, an offline copy): nothing known, nothing held.
    bare = tmp_path / "c"
    _log(bare / f"{TP.topic}-{TP.partition}")
    policy = parse_policy_text("mode: compact\ntopics:\n  - match: '.*'\n    cleanupPolicy: compact\n")
    plain = LogCleanerManager([LogDirectory(bare)], policy, MockTime(NOW))
    plain.logs()
    assert plain.removal_hold(TP) is None
    assert not os.path.exists(bare / "__cluster_metadata-0")
