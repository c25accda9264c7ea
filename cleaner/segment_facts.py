"""Record-level facts about segments (records, tombstones, the oldest tombstone), read
without changing anything, and cached so that a segment is read again only when it
changed.

``status`` and the sidecar's observe mode use this. A closed segment is identified by
(path, inode, size, mtime): while those stay the same its facts are reused; the active
segment is read only from where the previous scan stopped.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from cleaner.records.columns import decode_records
from cleaner.storage.segment import LogSegment

NO_TIMESTAMP = -1


@dataclass(frozen=True)
class SegmentFacts:
    bytes_scanned: int = 0
    batches: int = 0
    records: int = 0
    tombstones: int = 0
    oldest_tombstone_timestamp: int | None = None
    max_timestamp: int = NO_TIMESTAMP

    def __add__(self, other: SegmentFacts) -> SegmentFacts:
        stamps = [t for t in (self.oldest_tombstone_timestamp, other.oldest_tombstone_timestamp) if t is not None]
        return SegmentFacts(
            self.bytes_scanned + other.bytes_scanned,
            self.batches + other.batches,
            self.records + other.records,
            self.tombstones + other.tombstones,
            min(stamps) if stamps else None,
            max(self.max_timestamp, other.max_timestamp),
        )


def scan_segment(
    segment: LogSegment, start_position: int = 0, *, throttle: Callable[[int], None] | None = None
) -> tuple[SegmentFacts, int]:
    """Facts of the segment's batches from ``start_position``; returns them and the
    position after the last complete batch (a batch being written is left for later)."""
    facts = SegmentFacts()
    position = start_position
    for chunk in segment.iter_batches(start_position, allow_truncated_tail=True):
        if throttle is not None:
            throttle(int(chunk.sizes.sum()))
        records = tombstones = 0
        oldest = None
        v2 = chunk.select(chunk.is_v2)
        if len(v2):
            columns = decode_records(v2)
            records += len(columns)
            mask = columns.is_tombstone & ~v2.is_control[columns.batch]
            tombstones += int(mask.sum())
            if tombstones:
                oldest = int(columns.timestamps[mask].min())
        for entry in chunk.legacy.values():
            for r in entry.records():
                records += 1
                if r.is_tombstone:
                    tombstones += 1
                    oldest = r.timestamp if oldest is None else min(oldest, r.timestamp)
        end = int(chunk.file_positions[-1] + chunk.sizes[-1])
        facts = facts + SegmentFacts(
            end - position, len(chunk), records, tombstones, oldest, int(chunk.max_timestamps.max())
        )
        position = end
    return facts, position


@dataclass
class _Entry:
    identity: tuple[int, int, int]  # inode, mtime_ns, device
    size: int
    facts: SegmentFacts


class FactsCache:
    """Facts per segment file, re-read only when a segment changed (see module doc)."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self.bytes_read = 0

    def facts(
        self, segment: LogSegment, *, active: bool, throttle: Callable[[int], None] | None = None
    ) -> SegmentFacts:
        path = str(segment.log_path)
        st = os.stat(path)
        identity = (st.st_ino, 0 if active else st.st_mtime_ns, st.st_dev)
        with self._lock:
            entry = self._entries.get(path)
        if entry is not None and entry.identity == identity:
            if entry.size == st.st_size:
                return entry.facts
            if active and st.st_size > entry.size:
                # The active segment only grows: read what was appended since.
                more, end = scan_segment(segment, entry.size, throttle=throttle)
                self.bytes_read += more.bytes_scanned
                new = _Entry(identity, end, entry.facts + replace(more, bytes_scanned=0))
                with self._lock:
                    self._entries[path] = new
                return new.facts
        facts, end = scan_segment(segment, 0, throttle=throttle)
        self.bytes_read += facts.bytes_scanned
        with self._lock:
            self._entries[path] = _Entry(identity, end, facts)
        return facts

    def forget_missing(self) -> None:
        with self._lock:
            for path in [p for p in self._entries if not os.path.exists(p)]:
                del self._entries[path]
