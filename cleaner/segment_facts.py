"""Record-level facts about segments (records, tombstones, the oldest tombstone), read
without changing anything, and cached so that a segment is read again only when it
changed.

``status`` and the sidecar's observe mode use this. A closed segment is identified by
its path and :class:`FileStamp` (device, inode, ctime, size): while those stay the same
its facts are reused; the active segment is read only from where the previous scan
stopped.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

from cleaner.records.columns import decode_records
from cleaner.storage.segment import LogSegment, iter_fd_batches, open_for_read, read_fd

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


def _mark(segment: LogSegment, position: int, fd: int | None = None) -> bytes:
    """The first 21 bytes of the batch at ``position``: base offset, length, leader epoch,
    magic and CRC (any rewrite of the batch changes them)."""
    if position < 0:
        return b""
    return read_fd(fd, position, 21) if fd is not None else segment.read(position, 21)


def scan_segment(
    segment: LogSegment,
    start_position: int = 0,
    *,
    throttle: Callable[[int], None] | None = None,
    fd: int | None = None,
) -> tuple[SegmentFacts, ScanEnd]:
    """Facts of the segment's batches from ``start_position``; returns them and where the
    scan stopped (after the last complete batch: a batch being written is left for later).
    With ``fd`` (the segment's ``.log`` opened by the caller), that very file is read to
    its size now, whatever the segment object last knew of the name."""
    facts = SegmentFacts()
    position = start_position
    last = -1
    chunks = (
        iter_fd_batches(fd, str(segment.log_path), start_position, allow_truncated_tail=True)
        if fd is not None
        else segment.iter_batches(start_position, allow_truncated_tail=True)
    )
    for chunk in chunks:
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
    return facts, ScanEnd(position, last, _mark(segment, last, fd))


@dataclass(frozen=True)
class FileStamp:
    """What a segment file is, from one ``fstat``: its device and inode, and its ctime and
    size. The inode alone does not name a file over time: Kafka's cleaner and retention
    delete segment files and create new ones all the time, and a freed inode number goes to
    the next new file at once (a new ``00000000000000000000.log`` cleaned again can have
    the inode of the one scanned before, even its mtime, the cleaner copying the last
    source segment's). A new file is created, written and renamed into place after the old
    one was unlinked, so its ctime is later than any the old file had; a closed segment
    is otherwise never changed in place, so the same ctime and size mean the same bytes."""

    device: int
    inode: int
    ctime_ns: int
    size: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileStamp:
        return cls(st.st_dev, st.st_ino, st.st_ctime_ns, st.st_size)

    @property
    def file(self) -> tuple[int, int]:
        return self.device, self.inode


@dataclass
class _Entry:
    stamp: FileStamp  # the file when it was scanned
    end: ScanEnd
    facts: SegmentFacts
    active: bool


class FactsCache:
    """Facts per segment file, read again only when the segment changed (module doc).

    Each look opens the ``.log`` once and reads only that file (its size from ``fstat``),
    so what is read is what was stat-ed, whatever the broker renames or creates under the
    name meanwhile; a segment not there any more is a :class:`FileVanishedError`.

    A segment that was closed at its last scan is known by its :class:`FileStamp`: the
    same device, inode, ctime and size are the same file, anything else is another file
    (or a rewrite: a truncation), read afresh. A segment that was active at its last scan
    (the broker appends to it: its ctime moves on every write) is the same file while its
    device and inode are and one small read of the last scanned batch's header proves its
    bytes are the ones scanned before: only the new ones are read."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self.bytes_read = 0

    def facts(
        self, segment: LogSegment, *, active: bool, throttle: Callable[[int], None] | None = None
    ) -> SegmentFacts:
        path = str(segment.log_path)
        with open_for_read(path) as f:
            fd = f.fileno()
            stamp = FileStamp.of(os.fstat(fd))
            return self._facts(segment, path, fd, stamp, active, throttle)

    def stamp_of(self, segment: LogSegment) -> FileStamp | None:
        """The stamp of the file the last look at ``segment``'s name read, if any."""
        with self._lock:
            entry = self._entries.get(str(segment.log_path))
        return entry.stamp if entry is not None else None

    def _facts(
        self,
        segment: LogSegment,
        path: str,
        fd: int,
        stamp: FileStamp,
        active: bool,
        throttle: Callable[[int], None] | None,
    ) -> SegmentFacts:
        with self._lock:
            entry = self._entries.get(path)
        if entry is not None and entry.stamp.file == stamp.file and stamp.size >= entry.end.position:
            if entry.active:
                unchanged = _mark(segment, entry.end.last_batch_position, fd) == entry.end.last_batch_mark
            else:
                unchanged = entry.stamp == stamp
            if unchanged:
                if stamp.size == entry.end.position or (not active and not entry.active):
                    new = _Entry(stamp, entry.end, entry.facts, active)
                else:
                    more, end = scan_segment(segment, entry.end.position, throttle=throttle, fd=fd)
                    self.bytes_read += more.bytes_scanned
                    if end.last_batch_position < 0:
                        end = entry.end
                    new = _Entry(stamp, end, entry.facts + more, active)
                with self._lock:
                    self._entries[path] = new
                return new.facts
        facts, end = scan_segment(segment, 0, throttle=throttle, fd=fd)
        self.bytes_read += facts.bytes_scanned
        with self._lock:
            self._entries[path] = _Entry(stamp, end, facts, active)
        return facts

    def forget_missing(self) -> None:
        with self._lock:
            for path in [p for p in self._entries if not os.path.exists(p)]:
                del self._entries[path]
