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
from dataclasses import dataclass

from cleaner.records.columns import decode_records
from cleaner.storage.segment import LogSegment

NO_TIMESTAMP = -1


@dataclass(frozen=True)
class SegmentFacts:
    bytes_scanned: int = 0
    batches: int = 0
    records: int = 0
    """Data records: transaction markers are not counted (as ``generate`` and consumers count)."""
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


@dataclass(frozen=True)
class ScanEnd:
    """Where a scan stopped, and a fingerprint of the last batch it read: enough to tell,
    with one small read, whether the bytes before ``position`` are still those scanned."""

    position: int = 0
    last_batch_position: int = -1
    last_batch_mark: bytes = b""


def _mark(segment: LogSegment, position: int) -> bytes:
    """The first 21 bytes of the batch at ``position``: base offset, length, leader epoch,
    magic and CRC (any rewrite of the batch changes them)."""
    return segment.read(position, 21) if position >= 0 else b""


def scan_segment(
    segment: LogSegment, start_position: int = 0, *, throttle: Callable[[int], None] | None = None
) -> tuple[SegmentFacts, ScanEnd]:
    """Facts of the segment's batches from ``start_position``; returns them and where the
    scan stopped (after the last complete batch: a batch being written is left for later)."""
    facts = SegmentFacts()
    position = start_position
    last = -1
    for chunk in segment.iter_batches(start_position, allow_truncated_tail=True):
        if throttle is not None:
            throttle(int(chunk.sizes.sum()))
        records = tombstones = 0
        oldest = None
        v2 = chunk.select(chunk.is_v2)
        if len(v2):
            columns = decode_records(v2)
            data = ~v2.is_control[columns.batch]  # transaction markers are not counted as records
            records += int(data.sum())
            mask = columns.is_tombstone & data
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
        last = int(chunk.file_positions[-1])
        facts = facts + SegmentFacts(
            end - position, len(chunk), records, tombstones, oldest, int(chunk.max_timestamps.max())
        )
        position = end
    return facts, ScanEnd(position, last, _mark(segment, last))


@dataclass
class _Entry:
    identity: tuple[int, int]  # inode, device
    end: ScanEnd
    facts: SegmentFacts
    active: bool


class FactsCache:
    """Facts per segment file, read again only when the segment changed (module doc).

    A segment is known by its inode. A closed segment only ever changes by shrinking (a
    truncation) or being replaced (a new inode), so a ``stat`` tells. A segment that was
    active at its last scan may also have been truncated and written again past the
    old size; one small read of the last scanned batch's header proves its bytes are the
    ones scanned before only the new ones are read."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self.bytes_read = 0

    def facts(
        self, segment: LogSegment, *, active: bool, throttle: Callable[[int], None] | None = None
    ) -> SegmentFacts:
        path = str(segment.log_path)
        st = os.stat(path)
        identity = (st.st_ino, st.st_dev)
        with self._lock:
            entry = self._entries.get(path)
        if entry is not None and entry.identity == identity and st.st_size >= entry.end.position:
            unchanged = not entry.active or _mark(segment, entry.end.last_batch_position) == entry.end.last_batch_mark
            if unchanged:
                if st.st_size == entry.end.position or (not active and not entry.active):
                    facts = entry.facts
                    new = _Entry(identity, entry.end, facts, active)
                else:
                    more, end = scan_segment(segment, entry.end.position, throttle=throttle)
                    self.bytes_read += more.bytes_scanned
                    if end.last_batch_position < 0:
                        end = entry.end
                    new = _Entry(identity, end, entry.facts + more, active)
                with self._lock:
                    self._entries[path] = new
                return new.facts
        facts, end = scan_segment(segment, 0, throttle=throttle)
        self.bytes_read += facts.bytes_scanned
        with self._lock:
            self._entries[path] = _Entry(identity, end, facts, active)
        return facts

    def forget_missing(self) -> None:
        with self._lock:
            for path in [p for p in self._entries if not os.path.exists(p)]:
                del self._entries[path]
