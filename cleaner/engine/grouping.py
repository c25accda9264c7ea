"""Which segments a round merges into one cleaned segment (Kafka's
``groupSegmentsBySize``, KAFKA_NOTES §9.3)."""

from __future__ import annotations

from collections.abc import Sequence

from cleaner.records.batch import INT32_MAX
from cleaner.storage.segment import LogSegment


def group_segments_by_size(
    segments: Sequence[LogSegment], max_size: int, max_index_size: int, first_uncleanable_offset: int
) -> list[list[LogSegment]]:
    """Walk the segments in order; a group takes the next segment while the summed
    ``.log`` sizes stay <= ``segment.bytes``, the summed offset- and time-index sizes
    (entries, not file lengths) stay <= ``segment.index.bytes``, and the group's offset
    span, estimated from the next segment's base offset, fits a 32-bit relative offset.
    Empty segments are merged whatever their span (KAFKA-12889)."""
    groups: list[list[LogSegment]] = []
    i = 0
    n = len(segments)
    while i < n:
        first = segments[i]
        group = [first]
        log_size = first.size
        index_size = first.index_bytes()
        time_index_size = first.time_index_bytes()
        i += 1
        while i < n:
            candidate = segments[i]
            last_offset_estimate = segments[i + 1].base_offset - 1 if i + 1 < n else first_uncleanable_offset - 1
            if not (
                log_size + candidate.size <= max_size
                and index_size + candidate.index_bytes() <= max_index_size
                and time_index_size + candidate.time_index_bytes() <= max_index_size
                and (candidate.size == 0 or last_offset_estimate - first.base_offset <= INT32_MAX)
            ):
                break
            group.append(candidate)
            log_size += candidate.size
            index_size += candidate.index_bytes()
            time_index_size += candidate.time_index_bytes()
            i += 1
        groups.append(group)
    return groups
