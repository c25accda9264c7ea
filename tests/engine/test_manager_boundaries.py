"""The boundaries of Kafka's ``LogCleanerManager`` rules, each at the exact value where the
rule flips (issue 16: mutants of these comparisons survived every other test).

- ``cleanableOffsets``: a segment is uncleanable under ``min.compaction.lag.ms`` only if its
  largest timestamp is *after* ``now - minCompactionLagMs``; the first uncleanable offset is
  never below the first dirty offset; the LSO never passes the high watermark, even with a
  transaction open above it.
- ``grabFilthiestCompactedLog``: a log overdue for compaction (KIP-354) is picked only if it
  has cleanable bytes, or it would be picked every round for nothing.
- The cleaner's ``tombstones_removed`` counts what it removes.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from engine_helpers import BASE_TS, NOW, TP, LogWriter, clean_round

from cleaner.clock import MockTime
from cleaner.config import parse_policy
from cleaner.engine.manager import LogCleanerManager
from cleaner.errors import FileVanishedError
from cleaner.storage.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleaner.storage.log_dir import LogDirectory

MINUTE = 60_000


def _manager(root: Path, **rule: object) -> LogCleanerManager:
    topic = {"match": ".*", "cleanupPolicy": "compact", "minCleanableDirtyRatio": 0.01, **rule}
    policy = parse_policy({"mode": "compact", "topics": [topic], "cleaner": {"dedupeBufferSize": 1 << 20}})
    return LogCleanerManager([LogDirectory(root, read_only=True)], policy, MockTime(NOW), write_checkpoints=False)


def _high_watermark(root: Path, offset: int) -> None:
    OffsetCheckpointFile(root / "replication-offset-checkpoint").write({TP: offset})


def _three_segments(root: Path, last_timestamp: int) -> LogWriter:
    """Segments [0, 2) and [2, 4) rolled, the active one from 4; the second one's largest
    timestamp is ``last_timestamp``."""
    w = LogWriter(root / TP.dir_name)
    w.data([b"a", b"b"], timestamps=[BASE_TS, BASE_TS])
    w.roll()
    w.data([b"a", b"b"], timestamps=[BASE_TS, last_timestamp])
    w.roll()
    w.data([b"a"], timestamps=[NOW])
    w.close()
    _high_watermark(root, w.next_offset)
    return w


def _offsets(root: Path, **rule: object):
    manager = _manager(root, **rule)
    managed = manager.logs()[TP]
    checkpoint = OffsetCheckpointFile(root / CLEANER_OFFSET_CHECKPOINT).read().get(TP)
    return manager.cleanable_offsets(managed, checkpoint, NOW)


def test_min_compaction_lag_holds_back_only_a_segment_newer_than_now_minus_the_lag(tmp_path: Path) -> None:
    lag = 10 * MINUTE
    at_boundary, newer = tmp_path / "at", tmp_path / "newer"
    for root, ts in ((at_boundary, NOW - lag), (newer, NOW - lag + 1)):
        root.mkdir()
        _three_segments(root, ts)
    # largestTimestamp == now - lag: old enough (Kafka: uncleanable iff largestTimestamp > now - lag).
    assert _offsets(at_boundary, minCompactionLagMs=lag).first_uncleanable_dirty_offset == 4
    held = _offsets(newer, minCompactionLagMs=lag)
    assert (held.first_uncleanable_dirty_offset, held.binding) == (2, "lag")


def test_the_first_uncleanable_offset_is_never_below_the_first_dirty_offset(tmp_path: Path) -> None:
    _three_segments(tmp_path, BASE_TS)
    OffsetCheckpointFile(tmp_path / CLEANER_OFFSET_CHECKPOINT).write({TP: 4})
    _high_watermark(tmp_path, 2)  # the LSO (2) is below the checkpoint (4)
    offsets = _offsets(tmp_path)
    assert (offsets.first_dirty_offset, offsets.first_uncleanable_dirty_offset) == (4, 4)


def test_a_transaction_open_above_the_high_watermark_does_not_move_the_lso_past_it(tmp_path: Path) -> None:
    w = LogWriter(tmp_path / TP.dir_name)
    w.data([b"a", b"b"])  # 0, 1
    w.roll()
    w.data([b"a", b"b"])  # 2, 3
    w.roll()
    w.data([b"c"])  # 4
    w.data([b"d"], pid=7, epoch=1, txn=True)  # 5: the transaction opens above the high watermark (3)
    w.roll()
    w.data([b"e"])
    w.close()
    _high_watermark(tmp_path, 3)
    manager = _manager(tmp_path)
    lso, high_watermark = manager.last_stable_offset(manager.logs()[TP], NOW)
    assert (lso, high_watermark) == (3, 3)
    assert _offsets(tmp_path).first_uncleanable_dirty_offset == 3


def test_an_overdue_log_without_cleanable_bytes_is_not_picked(tmp_path: Path) -> None:
    """KIP-354 makes a log whose oldest dirty data is past ``max.compaction.lag.ms`` need
    compaction now; with nothing cleanable (here the high watermark is at the first dirty
    offset, after a clean section) picking it would clean nothing, every round."""
    _three_segments(tmp_path, BASE_TS)
    OffsetCheckpointFile(tmp_path / CLEANER_OFFSET_CHECKPOINT).write({TP: 2})
    _high_watermark(tmp_path, 2)
    manager = _manager(tmp_path, maxCompactionLagMs=MINUTE)
    ltc, _, delay = manager.log_to_clean(manager.logs()[TP], 2, NOW)
    assert delay > 0 and ltc.needs_compaction_now and ltc.cleanable_bytes == 0 < ltc.clean_bytes
    assert manager.grab_filthiest_compacted_log(NOW) is None
    _high_watermark(tmp_path, 4)  # now there is something to clean: the overdue log goes first
    assert _manager(tmp_path, maxCompactionLagMs=MINUTE).grab_filthiest_compacted_log(NOW) is not None


def test_tombstones_removed_counts_the_tombstones_a_clean_removes(tmp_path: Path) -> None:
    w = LogWriter(tmp_path / TP.dir_name)
    w.data([b"a", b"b", b"c"])  # 0..2
    w.data([b"a", b"b"], [None, None])  # 3, 4: tombstones
    w.roll()
    w.data([b"z"])
    w.close()
    _, first = clean_round(tmp_path / TP.dir_name, first_dirty=0, delete_retention_ms=0)
    assert first.tombstones_removed == 0  # a tombstone first gets its delete horizon (KIP-534)
    _, second = clean_round(tmp_path / TP.dir_name, first_dirty=0, now=NOW + 1, delete_retention_ms=0)
    assert second.tombstones_removed == 2


def test_a_checkpoint_newer_than_the_look_at_a_live_log_is_not_taken_for_a_truncation(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Next to a running broker the log is looked at first and the cleaner checkpoint read
    after; in between the broker can append, roll and have its own cleaner checkpoint the
    new active segment's base. That checkpoint is above the log end offset seen, which is
    Kafka's sign of a truncation (reset to the log start, clean everything again): a soak
    beside a busy broker met it. The cleaner looks at the log again before believing it."""
    w = LogWriter(tmp_path / TP.dir_name)
    w.data([b"a", b"b"])  # 0, 1
    w.roll()
    w.data([b"a", b"b"])  # 2, 3: active segment
    _high_watermark(tmp_path, 4)
    manager = _manager(tmp_path)
    managed = manager.logs()[TP]
    assert managed.log.log_end_offset == 4  # the look
    w.data([b"c", b"d"])  # 4, 5: the broker appends,
    w.roll()  # rolls at 6,
    w.close()
    _high_watermark(tmp_path, 6)
    OffsetCheckpointFile(tmp_path / CLEANER_OFFSET_CHECKPOINT).write({TP: 6})  # and its cleaner cleans to 6
    with caplog.at_level(logging.WARNING):
        (report,) = manager.report(NOW)
        _, offsets, _ = manager.log_to_clean(managed, 6, NOW)
    assert "larger than the log end offset" not in caplog.text
    assert (report.first_dirty_offset, report.log_end_offset) == (6, 6)
    assert (offsets.first_dirty_offset, offsets.force_update_checkpoint) == (6, False)


def test_a_checkpoint_above_the_log_end_after_a_second_look_is_a_truncation(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The other side: the broker truncated below the checkpoint (a follower's truncation,
    an unclean leader election). Kafka resets the first dirty offset to the log start and
    says so; so does the cleaner, after looking again."""
    _three_segments(tmp_path, BASE_TS)
    OffsetCheckpointFile(tmp_path / CLEANER_OFFSET_CHECKPOINT).write({TP: 9})
    with caplog.at_level(logging.WARNING):
        offsets = _offsets(tmp_path)
    assert (offsets.first_dirty_offset, offsets.force_update_checkpoint) == (0, True)
    assert "The last checkpoint dirty offset for partition topic-0 is 9, which is larger than the log end offset 5" in (
        caplog.text
    )


@pytest.mark.parametrize("looked_between", [True, False], ids=["seen-gone", "between-two-looks"])
def test_a_partition_deleted_and_created_again_forgets_the_stage_modes_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, looked_between: bool
) -> None:
    """Stage mode keeps its cleaner checkpoint in memory (the file is the live broker's). A
    topic deleted and created again is a new partition of the same name: Kafka drops a deleted
    partition's checkpoint, so the new one is cleaned from its start. Kept, the old offset
    (above the new log's end) was warned about on every scan (a soak finding, 3.9.2)."""
    _three_segments(tmp_path, BASE_TS)
    manager = _manager(tmp_path)
    log_dir = manager.log_dirs[0]
    assert TP in manager.logs()
    manager.update_checkpoints(log_dir, update=(TP, 4))  # what a staged clean records
    partition = tmp_path / TP.dir_name
    partition.rename(tmp_path / f"{TP.dir_name}.abc-delete")  # Kafka's topic deletion
    if looked_between:
        assert TP not in manager.logs()
    w = LogWriter(partition)  # the topic created again: two records, then the active segment
    w.data([b"x", b"y"], timestamps=[BASE_TS, BASE_TS])
    w.roll()
    w.data([b"x"], timestamps=[NOW])
    w.close()
    _high_watermark(tmp_path, w.next_offset)
    managed = manager.logs()[TP]
    with caplog.at_level(logging.WARNING, logger="cleaner.engine.manager"):
        checkpoint = manager.all_cleaner_checkpoints().get(TP)
        offsets = manager.cleanable_offsets(managed, checkpoint, NOW)
    assert checkpoint is None and offsets.first_dirty_offset == 0
    assert not [r for r in caplog.records if "larger than the log end offset" in r.getMessage()]


def test_a_partition_replaced_between_the_listing_and_the_look_is_looked_at_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The same story raced the other way (the soak, a fresh-clone run beside another, 4.3.1):
    the scan listed the partitions, then the broker deleted the topic and created it again,
    then the scan looked at the partition. The old log object, asked to look again, took the
    new directory's segments under the old log start offset and judged the stage mode's
    checkpoint against them: "larger than the log end offset", reset. A log is one
    directory: one that was replaced is the next scan's to open afresh."""
    _three_segments(tmp_path, BASE_TS)
    manager = _manager(tmp_path)
    log_dir = manager.log_dirs[0]
    managed = manager.logs()[TP]  # the scan's listing
    manager.update_checkpoints(log_dir, update=(TP, 4))  # what a staged clean records
    partition = tmp_path / TP.dir_name
    partition.rename(tmp_path / f"{TP.dir_name}.abc-delete")  # Kafka's topic deletion,
    w = LogWriter(partition)  # then the topic created again: offsets 0 to 2, the active segment
    w.data([b"x", b"y"], timestamps=[BASE_TS, BASE_TS])
    w.roll()
    w.data([b"x"], timestamps=[NOW])
    w.close()
    _high_watermark(tmp_path, w.next_offset)
    with caplog.at_level(logging.WARNING, logger="cleaner.engine.manager"), pytest.raises(
        FileVanishedError, match="replaced"
    ):
        manager.report_partition(managed, NOW)
    assert not [r for r in caplog.records if "larger than the log end offset" in r.getMessage()]
    assert [s.base_offset for s in managed.log.segments] == [0, 2, 4]  # still the old directory's
    fresh = manager.logs()[TP]  # the next scan
    assert fresh is not managed and manager.all_cleaner_checkpoints().get(TP) is None
    assert manager.report_partition(fresh, NOW).log_end_offset == 3


def test_a_partition_replaced_while_the_filthiest_log_is_chosen_is_not_marked_uncleanable(tmp_path: Path) -> None:
    """The choice of the round's log races the broker the same way: a partition deleted and
    created again after the listing is not a verdict on either directory. Marked, the new
    partition (same name, same log dir) would have stayed uncleanable for good."""
    _three_segments(tmp_path, BASE_TS)
    manager = _manager(tmp_path)
    listing = manager.logs

    def listed_then_replaced() -> dict:
        logs = listing()
        partition = tmp_path / TP.dir_name
        if partition.exists():
            partition.rename(tmp_path / f"{TP.dir_name}.abc-delete")
            w = LogWriter(partition)
            w.data([b"x"], timestamps=[NOW])
            w.close()
        return logs

    manager.logs = listed_then_replaced  # type: ignore[method-assign]
    manager.grab_filthiest_compacted_log(NOW)
    assert manager.uncleanable_partitions() == {}
