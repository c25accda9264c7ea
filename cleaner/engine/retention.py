"""Time and size retention for compacted logs (``cleanup.policy=compact,delete``), which
Kafka runs in the cleaner threads, not the log manager (KAFKA_NOTES §10).

``deleteOldSegments``: segments wholly below the log start offset always go; with
``delete`` in the policy also those breaching ``retention.bytes`` and ``retention.ms``.
A segment goes only if the high watermark is at or past its end, and the walk stops at
the first segment that may not go.
"""

from __future__ import annotations

from collections.abc import Callable

from cleaner.storage.segment import LogSegment

from .manager import ManagedLog

Predicate = Callable[[LogSegment, LogSegment | None], bool]


def deletable_segments(managed: ManagedLog, high_watermark: int | None, predicate: Predicate) -> list[LogSegment]:
    the_log = managed.log
    if high_watermark is None:
        return []
    segments = the_log.segments
    out: list[LogSegment] = []
    for i, segment in enumerate(segments):
        nxt = segments[i + 1] if i + 1 < len(segments) else None
        upper = nxt.base_offset if nxt is not None else the_log.log_end_offset
        last_and_empty = nxt is None and segment.size == 0
        if predicate(segment, nxt) and not last_and_empty and high_watermark >= upper:
            out.append(segment)
        else:
            break
    return out


def delete_old_segments(managed: ManagedLog, now: int) -> list[LogSegment]:
    """Apply retention to one compacted log; returns the deleted segments."""
    rule = managed.rule
    the_log = managed.log
    high_watermark = managed.log_dir.high_watermarks().get(managed.topic_partition)
    deleted: list[LogSegment] = []

    def run(predicate: Predicate) -> None:
        gone = deletable_segments(managed, high_watermark, predicate)
        if gone:
            the_log.delete_segments(gone)
            deleted.extend(gone)

    run(lambda seg, nxt: nxt is not None and nxt.base_offset <= the_log.log_start_offset)
    if rule.delete:
        if rule.retention_bytes >= 0:
            excess = [the_log.size_in_bytes - rule.retention_bytes]

            def over_size(seg: LogSegment, nxt: LogSegment | None) -> bool:
                if excess[0] - seg.size >= 0:
                    excess[0] -= seg.size
                    return True
                return False

            run(over_size)
        if rule.retention_ms >= 0:
            run(lambda seg, nxt: now - seg.largest_timestamp > rule.retention_ms)
    return deleted
