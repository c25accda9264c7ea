"""Retention of ``compact,delete`` logs, run by the cleaner threads (Kafka's
``UnifiedLog.deleteOldSegments`` / ``deleteRetentionSizeBreachedSegments`` /
``deleteRetentionMsBreachedSegments`` / ``deleteLogStartOffsetBreachedSegments``), at each
rule's boundary."""

from __future__ import annotations

from pathlib import Path

import pytest
from kafka_logs import batch_of, write_high_watermarks, write_log

from cleaner.config import parse_policy_text
from cleaner.engine.manager import ManagedLog
from cleaner.engine.retention import delete_old_segments
from cleaner.storage.log import Log
from cleaner.storage.log_dir import LogDirectory
from cleaner.storage.topic_partition import TopicPartition

TP = TopicPartition("t", 0)
START_MS = 1_000_000
"""Record ``o`` has timestamp ``START_MS + o``: segment ``b`` (offsets b..b+9) ends at ``START_MS + b + 9``."""


def _managed(
    root: Path,
    *,
    late_first_segment: bool = False,
    policy: str = "compact,delete",
    retention_ms: int = -1,
    retention_bytes: int = -1,
    high_watermark: int | None = 50,
    log_start_offset: int | None = None,
    empty_active: bool = False,
):
    if not (root / TP.dir_name).exists():
        late = 100_000 if late_first_segment else 0
        batches = [
            batch_of(
                list(range(o, o + 5)), [b"k%d" % i for i in range(5)], timestamp=START_MS + (late if o < 10 else 0)
            )
            for o in range(0, 50, 5)
        ]
        log = write_log(root / TP.dir_name, batches, roll_every=2)
        if empty_active:
            log.roll()
            log.close()
        if high_watermark is not None:
            write_high_watermarks(root, {TP: high_watermark})
    rule = parse_policy_text(
        "mode: compact\ntopics:\n"
        f'  - match: ".*"\n    cleanupPolicy: "{policy}"\n'
        f"    retentionMs: {retention_ms}\n    retentionBytes: {retention_bytes}\n"
    ).rule_for("t")
    log = Log.open(root / TP.dir_name, log_start_offset=log_start_offset)
    return ManagedLog(LogDirectory(root), TP, log, rule)


def _bases(managed: ManagedLog) -> list[int]:
    return [s.base_offset for s in managed.log.segments]


def test_size_retention_deletes_while_the_excess_covers_a_whole_segment(tmp_path: Path) -> None:
    """``diff - segment.size >= 0``: an excess of exactly the first two segments deletes both."""
    probe = _managed(tmp_path)
    two = probe.log.segments[0].size + probe.log.segments[1].size
    managed = _managed(tmp_path, retention_bytes=probe.log.size_in_bytes - two)
    assert [s.base_offset for s in delete_old_segments(managed, START_MS)] == [0, 10]
    assert _bases(managed) == [20, 30, 40] and managed.log.log_start_offset == 20


def test_size_retention_keeps_a_segment_the_excess_does_not_cover(tmp_path: Path) -> None:
    probe = _managed(tmp_path)
    two = probe.log.segments[0].size + probe.log.segments[1].size
    managed = _managed(tmp_path, retention_bytes=probe.log.size_in_bytes - two + 1)
    assert [s.base_offset for s in delete_old_segments(managed, START_MS)] == [0]


def test_time_retention_deletes_strictly_older_segments_and_stops_at_the_first_kept(tmp_path: Path) -> None:
    """``startMs - segment.largestTimestamp > retentionMs``: the segment exactly at the
    limit stays, and so does everything after it."""
    now = START_MS + 19 + 1000  # segment 10's largest timestamp is START_MS + 19
    managed = _managed(tmp_path, retention_ms=1000)
    assert [s.base_offset for s in delete_old_segments(managed, now)] == [0]
    assert _bases(managed) == [10, 20, 30, 40]


def test_a_segment_that_must_stay_shields_every_later_one(tmp_path: Path) -> None:
    """The walk stops at the first segment that may not go, even when later ones have
    expired (here the first segment holds newer timestamps than the rest)."""
    managed = _managed(tmp_path, retention_ms=1000, late_first_segment=True)
    assert delete_old_segments(managed, START_MS + 50_000) == []
    assert _bases(managed) == [0, 10, 20, 30, 40]


def test_nothing_goes_past_the_high_watermark(tmp_path: Path) -> None:
    """A segment goes only when the high watermark is at or past its end (the next
    segment's base offset)."""
    managed = _managed(tmp_path, retention_ms=0, high_watermark=20)
    assert [s.base_offset for s in delete_old_segments(managed, START_MS + 10_000)] == [0, 10]


def test_one_offset_short_of_the_end_keeps_the_segment(tmp_path: Path) -> None:
    managed = _managed(tmp_path, retention_ms=0, high_watermark=19)
    assert [s.base_offset for s in delete_old_segments(managed, START_MS + 10_000)] == [0]


def test_without_a_high_watermark_nothing_is_deleted(tmp_path: Path) -> None:
    managed = _managed(tmp_path, retention_ms=0, high_watermark=None)
    assert delete_old_segments(managed, START_MS + 10_000) == []
    assert _bases(managed) == [0, 10, 20, 30, 40]


def test_the_empty_active_segment_is_never_deleted(tmp_path: Path) -> None:
    managed = _managed(tmp_path, retention_ms=0, empty_active=True)
    assert [s.base_offset for s in delete_old_segments(managed, START_MS + 10_000)] == [0, 10, 20, 30, 40]
    assert _bases(managed) == [50]


@pytest.mark.parametrize("policy", ["compact", "compact,delete"])
def test_segments_below_the_log_start_offset_always_go(tmp_path: Path, policy: str) -> None:
    """Even a compact-only log drops the segments wholly below the log start offset (the
    next segment's base at or below it)."""
    managed = _managed(tmp_path, policy=policy, log_start_offset=20)
    assert [s.base_offset for s in delete_old_segments(managed, START_MS)] == [0, 10]
    assert _bases(managed) == [20, 30, 40]


def test_compact_only_logs_ignore_time_and_size(tmp_path: Path) -> None:
    managed = _managed(tmp_path, policy="compact", retention_ms=0, retention_bytes=0)
    assert delete_old_segments(managed, START_MS + 10_000) == []


def test_an_expired_active_segment_goes_too_once_the_high_watermark_reaches_the_log_end(tmp_path: Path) -> None:
    """Kafka deletes the active segment when it qualifies and nothing past it is unreplicated,
    rolling a new empty one at the log end first."""
    managed = _managed(tmp_path, retention_ms=0, high_watermark=50)
    assert [s.base_offset for s in delete_old_segments(managed, START_MS + 10_000)] == [0, 10, 20, 30, 40]
    assert _bases(managed) == [50] and managed.log.segments[0].size == 0


def test_retention_bytes_zero_keeps_nothing(tmp_path: Path) -> None:
    """``retention.bytes=0`` is a limit (everything breaches it), not "no limit" (-1)."""
    managed = _managed(tmp_path, retention_bytes=0, high_watermark=50)
    assert [s.base_offset for s in delete_old_segments(managed, START_MS)] == [0, 10, 20, 30, 40]
