"""One log segment: ``<base>.log`` and its ``.index``, ``.timeindex`` and ``.txnindex``
(Kafka's ``LogSegment``).

Indexes are loaded lazily and kept in memory: a partition can have thousands of segments
and most operations (grouping, eligibility, status) need only sizes and timestamps.
Files are opened per read, never kept open, except the ``.log`` of a segment being
appended to.

Index entries follow Kafka 4.1's per-batch rule (KAFKA-806, KAFKA_NOTES §2.2), which is
also what ``LogSegment.recover`` has always done: before each batch, if more than
``index.interval.bytes`` were appended since the last entry, add ``(batch.lastOffset,
batch position)`` to the offset index and ``(max timestamp so far, its offset)`` to the
time index.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from cleaner.errors import (
    CorruptDataError,
    CorruptIndexError,
    CorruptRecordError,
    FileChangedError,
    FileVanishedError,
    LogSegmentOffsetOverflowError,
)
from cleaner.records.batch import (
    ATTRIBUTES_OFFSET,
    INT32_MAX,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    MIN_LEGACY_ENTRY_LENGTH,
    NO_TIMESTAMP,
    RECORD_BATCH_OVERHEAD,
    Attributes,
)
from cleaner.records.scan import Batches, ScanResult, batches_at, scan_batches
from cleaner.storage import files, page_cache
from cleaner.storage.index import DEFAULT_MAX_INDEX_SIZE, AbortedTxn, OffsetIndex, TimeIndex, TransactionIndex

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
DELETED_SUFFIX = ".deleted"
SEGMENT_FILE_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)
DEFAULT_INDEX_INTERVAL_BYTES = 4096
DEFAULT_READ_CHUNK = 1 << 20


def file_name(base_offset: int, suffix: str) -> str:
    """``00000000000000012345.log``: the base offset as 20 zero-padded digits."""
    return f"{base_offset:020d}{suffix}"


def offset_from_file_name(name: str) -> int:
    """Kafka's ``Long.parseLong(name.substring(0, name.indexOf('.')))``."""
    return int(name[: name.index(".")])


class _Indexer:
    """Kafka's rule for index entries over a stream of appended batches (KAFKA_NOTES §2.2):
    before each batch, if more than ``interval`` bytes went by since the last entry, add
    ``(batch.lastOffset, position)`` and ``(max timestamp so far, its offset)``."""

    def __init__(
        self, offset_index: OffsetIndex, time_index: TimeIndex, interval: int, max_ts: tuple[int, int]
    ) -> None:
        self.offset_index = offset_index
        self.time_index = time_index
        self.interval = interval
        self.max_timestamp, self.offset_of_max_timestamp = max_ts
        self.bytes_since_last_entry = 0

    def add(self, batches: Batches) -> None:
        max_ts, max_ts_offset = self.max_timestamp, self.offset_of_max_timestamp
        since = self.bytes_since_last_entry
        interval = self.interval
        index_offsets: list[int] = []
        index_positions: list[int] = []
        time_entries: list[tuple[int, int]] = []
        for position, size, last, ts in zip(
            batches.file_positions.tolist(),
            batches.sizes.tolist(),
            batches.last_offsets.tolist(),
            batches.max_timestamps.tolist(),
            strict=True,
        ):
            if ts > max_ts:
                max_ts, max_ts_offset = ts, last
            if since > interval:
                index_offsets.append(last)
                index_positions.append(position)
                time_entries.append((max_ts, max_ts_offset))
                since = 0
            since += size
        if index_offsets:
            self.offset_index.append_many(index_offsets, index_positions)
            for ts, off in time_entries:
                self.time_index.maybe_append(ts, off)
        self.bytes_since_last_entry = since
        self.max_timestamp, self.offset_of_max_timestamp = max_ts, max_ts_offset


def _file_entries(path: Path, entry_size: int) -> int:
    try:
        return path.stat().st_size // entry_size
    except FileNotFoundError:
        return 0


def _tail_entry(path: Path, entry_size: int, dtype: str) -> np.void | None:
    """The last whole entry of an index file, read alone; None if there is none."""
    try:
        with open(path, "rb") as f:
            entries = os.fstat(f.fileno()).st_size // entry_size
            if entries == 0:
                return None
            data = os.pread(f.fileno(), entry_size, (entries - 1) * entry_size)
    except FileNotFoundError:
        return None
    if len(data) < entry_size:  # trimmed since the fstat (a live broker's roll)
        raise FileChangedError(path, f"{entries * entry_size} bytes at first, {len(data)} of the last entry later")
    return np.frombuffer(data, dtype=np.dtype(dtype))[0]


def iter_file_batches(
    path: str | os.PathLike[str],
    position: int = 0,
    end: int | None = None,
    chunk_size: int = DEFAULT_READ_CHUNK,
    *,
    allow_truncated_tail: bool = False,
) -> Iterator[Batches]:
    """The batches of any file of framed batches (a segment's ``.log``, a KRaft snapshot's
    ``.checkpoint``) in ``[position, end)``, a chunk at a time: one bounded buffer, and a
    single batch larger than ``chunk_size`` gets a buffer of its own size (Kafka's
    ``FileRecords.batchesFrom``). A truncated batch at the end raises, unless
    ``allow_truncated_tail`` (recovery)."""
    path = os.fspath(path)
    with open_for_read(path) as f:
        yield from iter_fd_batches(
            f.fileno(), path, position, end, chunk_size, allow_truncated_tail=allow_truncated_tail
        )


def iter_fd_batches(
    fd: int,
    path: str,
    position: int = 0,
    end: int | None = None,
    chunk_size: int = DEFAULT_READ_CHUNK,
    *,
    allow_truncated_tail: bool = False,
) -> Iterator[Batches]:
    """``iter_file_batches`` over a file already open (``path`` names it in errors): a
    reader that sizes the file with ``fstat`` reads the very file it sized, whatever the broker
    renames, deletes or creates under that name meanwhile."""
    if end is None:
        end = os.fstat(fd).st_size
    with page_cache.cold_read(fd, end):
        yield from _file_batches(fd, path, position, end, chunk_size, allow_truncated_tail)


_ENTRY = struct.Struct(">qi")  # an entry's base offset and length


def open_for_read(path: str | os.PathLike[str]) -> BinaryIO:
    """Open a file of a live broker's partition for reading; not there (renamed away or
    deleted since the listing) is a :class:`FileVanishedError`, a file that changed."""
    try:
        return open(path, "rb")
    except FileNotFoundError as e:
        raise FileVanishedError(path) from e


def read_fd(fd: int, position: int, size: int) -> bytes:
    """``size`` bytes at ``position`` of an open file (fewer at its end), page-cache neutral."""
    with page_cache.cold_read(fd, os.fstat(fd).st_size):
        return os.pread(fd, size, position)


def _file_batches(
    fd: int, path: str, position: int, end: int, chunk_size: int, allow_truncated_tail: bool
) -> Iterator[Batches]:
    while position < end:
        want = min(chunk_size, end - position)
        buf = os.pread(fd, want, position)
        result = scan_batches(buf, base_position=position, path=path)
        if len(result.batches) == 0:
            need = result.next_entry_size
            if need is not None and need > want and position + need <= end:
                buf = os.pread(fd, need, position)
                result = scan_batches(buf, base_position=position, path=path)
            if len(result.batches) == 0:
                if allow_truncated_tail:
                    return
                raise CorruptRecordError(
                    f"truncated batch: {end - position} bytes left at the end of the file"
                    + (f", the entry there declares {need}" if need is not None else ""),
                    path=path,
                    position=position,
                )
        yield result.batches
        position += result.end


class LogSegment:
    """A segment's files in ``directory``, all named ``<base><kind><suffix>``, where
    ``suffix`` is "" for a live segment, ".cleaned" or ".swap" during a replace."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        base_offset: int,
        *,
        suffix: str = "",
        index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES,
        max_index_size: int = DEFAULT_MAX_INDEX_SIZE,
        offset_index: OffsetIndex | None = None,
        time_index: TimeIndex | None = None,
        txn_index: TransactionIndex | None = None,
        size: int | None = None,
    ) -> None:
        self.dir = Path(directory)
        self.base_offset = base_offset
        self.suffix = suffix
        self.index_interval_bytes = index_interval_bytes
        self.max_index_size = max_index_size
        self._offset_index = offset_index
        self._time_index = time_index
        self._txn_index = txn_index
        self._size = size
        self._indexer: _Indexer | None = None
        self._append_file = None
        self._writeback: page_cache.Writeback | None = None
        self._tail: tuple[int, int] | None = None  # (position scanned to, next offset there)
        # next offset -> (position, last batch's position, its first 21 bytes), of the last scans
        self._tail_history: dict[int, tuple[int, int, bytes]] = {}
        self._identity: tuple[int, int] | None = None  # device, inode
        self._stamp: tuple[int, int] = (0, 0)  # ctime_ns, size at the last look
        self._max_ts_cache: tuple[int, int] | None = None
        self._first_batch_timestamp: int | None = None
        # A segment a writable log rolled: Kafka's time index is lazy (``LazyIndex``), its
        # file made on first use, which for an empty segment is retention reading its
        # largest timestamp. ``largest_timestamp`` makes it then, as the broker would.
        self.lazy_time_index = False

    # -- files --------------------------------------------------------------------------
    def path(self, kind: str) -> Path:
        return self.dir / file_name(self.base_offset, kind + self.suffix)

    @property
    def log_path(self) -> Path:
        return self.path(LOG_SUFFIX)

    @property
    def index_path(self) -> Path:
        return self.path(INDEX_SUFFIX)

    @property
    def time_index_path(self) -> Path:
        return self.path(TIME_INDEX_SUFFIX)

    @property
    def txn_index_path(self) -> Path:
        return self.path(TXN_INDEX_SUFFIX)

    @classmethod
    def create(
        cls,
        directory: str | os.PathLike[str],
        base_offset: int,
        *,
        suffix: str = "",
        index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES,
        max_index_size: int = DEFAULT_MAX_INDEX_SIZE,
    ) -> LogSegment:
        """A new empty segment; its ``.log`` exists at once (an empty file), its indexes are
        written by ``flush``. Stale files of the same name are replaced (Kafka deletes
        leftover ``.cleaned`` files before creating a cleaned segment)."""
        seg = cls(
            directory,
            base_offset,
            suffix=suffix,
            index_interval_bytes=index_interval_bytes,
            max_index_size=max_index_size,
            offset_index=None,
            time_index=None,
            txn_index=None,
            size=0,
        )
        for kind in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
            files.remove(seg.path(kind))
        files.write_file(seg.log_path, b"", fsync=False)
        seg._offset_index = OffsetIndex(base_offset, max_index_size, path=seg.index_path)
        seg._time_index = TimeIndex(base_offset, max_index_size, path=seg.time_index_path)
        seg._txn_index = TransactionIndex(base_offset, path=seg.txn_index_path)
        return seg

    def same_file(self, *, growing: bool = False) -> bool:
        """Whether the ``.log`` is still the file this object first looked at (not
        replaced by a swap, not deleted, not rewritten).

        The device and inode alone do not tell: Kafka's cleaner and retention delete
        segment files and create new ones all the time, and file systems hand a freed inode
        number to the next new file at once, so a new segment of the same name can have
        the old one's inode (and, the cleaner copying the last source segment's mtime onto
        its output, its mtime too). A file is created, written and renamed into place after
        the old one was unlinked, so its ctime is later than anything the old file had: a
        closed segment is the same file only while its ctime and size are. A ``growing``
        segment (the active one, which the broker appends to, so its ctime moves on every
        write) is the same file while it has not shrunk; a shrink is a truncation, or
        another file."""
        try:
            st = self.log_path.stat()
        except FileNotFoundError:
            return False
        identity = (st.st_dev, st.st_ino)
        stamp = (st.st_ctime_ns, st.st_size)
        if self._identity is None:
            self._identity, self._stamp = identity, stamp
            return True
        if identity != self._identity:
            return False
        if growing:
            if st.st_size < self._stamp[1]:
                return False
        elif stamp != self._stamp:
            return False
        self._stamp = stamp
        return True

    @property
    def size(self) -> int:
        """Bytes in the ``.log``."""
        if self._size is None:
            try:
                self._size = self.log_path.stat().st_size
            except FileNotFoundError as e:
                raise FileVanishedError(self.log_path) from e
        return self._size

    def refresh_size(self) -> int:
        self._size = None
        return self.size

    @property
    def last_modified_ms(self) -> int:
        try:
            return self.log_path.stat().st_mtime_ns // 1_000_000
        except FileNotFoundError as e:
            raise FileVanishedError(self.log_path) from e

    def set_last_modified(self, ms: int) -> None:
        """The cleaner copies the last source segment's mtime onto its output: mtime is the
        legacy tombstone clock and the retention clock of segments without timestamps.
        Kafka sets it on the log, offset index and time index (not the txn index)."""
        for path in (self.log_path, self.index_path, self.time_index_path):
            if path.exists():
                files.set_mtime_ms(path, ms)

    # -- indexes ------------------------------------------------------------------------
    # A log can have thousands of segments, so a closed segment keeps no index in memory:
    # sizes come from the file length, the last entry from the file's tail, and a lookup
    # loads the index for that call only. ``offset_index``/``time_index`` load and keep
    # the index: for the segment being appended to (and for tools and tests).
    @property
    def offset_index(self) -> OffsetIndex:
        if self._offset_index is None:
            self._offset_index = self._load_or_rebuild(OffsetIndex, self.index_path)
        return self._offset_index

    @property
    def time_index(self) -> TimeIndex:
        if self._time_index is None:
            self._time_index = self._load_or_rebuild(TimeIndex, self.time_index_path)
        return self._time_index

    @property
    def txn_index(self) -> TransactionIndex:
        if self._txn_index is None:
            self._txn_index = TransactionIndex.read(self.txn_index_path, self.base_offset, missing_ok=True)
        return self._txn_index

    def _load_or_rebuild(self, cls: type, path: Path):
        """Read an index; a missing ``.timeindex`` is empty (Kafka creates it empty and does
        not rebuild it, §2.3); a missing ``.index`` or any unreadable one (e.g. untrimmed
        zeros after an unclean shutdown) is rebuilt from the log in memory."""
        try:
            return cls.read(path, self.base_offset, max_index_size=self.max_index_size)
        except FileNotFoundError:
            if cls is TimeIndex:
                return TimeIndex(self.base_offset, self.max_index_size, path=path)
        except CorruptIndexError:
            pass
        indexer, _ = self.build_indexes()
        return indexer.offset_index if cls is OffsetIndex else indexer.time_index

    def index_bytes(self) -> int:
        """``offsetIndex.sizeInBytes`` (entries * 8), without loading the index."""
        if self._offset_index is not None:
            return self._offset_index.size_in_bytes
        return _file_entries(self.index_path, 8) * 8

    def time_index_bytes(self) -> int:
        """``timeIndex.sizeInBytes`` (entries * 12), without loading the index."""
        if self._time_index is not None:
            return self._time_index.size_in_bytes
        return _file_entries(self.time_index_path, 12) * 12

    def lookup_position(self, offset: int) -> int:
        """Where to start reading for ``offset`` (the offset index's lookup)."""
        index = self._offset_index or self._load_or_rebuild(OffsetIndex, self.index_path)
        return index.lookup(offset)[1]

    def _last_offset_entry(self) -> tuple[int, int] | None:
        if self._offset_index is not None:
            return self._offset_index.last_entry if self._offset_index.entries else None
        tail = _tail_entry(self.index_path, 8, ">i4,>i4")
        if tail is not None:
            rel, position = int(tail[0]), int(tail[1])
            if rel >= 0 and 0 <= position <= self.size and (rel, position) != (0, 0):
                return self.base_offset + rel, position
        index = self._load_or_rebuild(OffsetIndex, self.index_path)
        return index.last_entry if index.entries else None

    def _last_time_entry(self) -> tuple[int, int] | None:
        if self._time_index is not None:
            return self._time_index.last_entry if self._time_index.entries else None
        tail = _tail_entry(self.time_index_path, 12, ">i8,>i4")
        if tail is None:
            return None
        ts, rel = int(tail[0]), int(tail[1])
        if ts > 0 and rel >= 0:
            return ts, self.base_offset + rel
        index = self._load_or_rebuild(TimeIndex, self.time_index_path)
        return index.last_entry if index.entries else None

    def has_valid_index_files(self) -> bool:
        """Whether both index files exist and read without error (what a loader checks
        before trusting a segment below the recovery point)."""
        try:
            OffsetIndex.read(self.index_path, self.base_offset, max_index_size=self.max_index_size)
            TimeIndex.read(self.time_index_path, self.base_offset, max_index_size=self.max_index_size)
        except (FileNotFoundError, CorruptIndexError):
            return False
        return True

    @property
    def indexer(self) -> _Indexer:
        if self._indexer is None:
            # A segment opened from disk takes its running maximum from the last time-index
            # entry (Kafka reads it lazily there) and starts counting index bytes at 0.
            self._indexer = _Indexer(self.offset_index, self.time_index, self.index_interval_bytes, self._max_ts())
        return self._indexer

    def _max_ts(self) -> tuple[int, int]:
        if self._indexer is not None:
            return self._indexer.max_timestamp, self._indexer.offset_of_max_timestamp
        if self._max_ts_cache is None:
            self._max_ts_cache = self._last_time_entry() or (NO_TIMESTAMP, self.base_offset)
        return self._max_ts_cache

    @property
    def max_timestamp_so_far(self) -> int:
        return self._max_ts()[0]

    @property
    def offset_of_max_timestamp_so_far(self) -> int:
        return self._max_ts()[1]

    @property
    def largest_timestamp(self) -> int:
        """Drives retention.ms and the compaction lags; falls back to the file's mtime."""
        if self.lazy_time_index:
            self.lazy_time_index = False
            if not self.time_index_path.exists():
                self.time_index.write_to(self.time_index_path)
        ts = self.max_timestamp_so_far
        return ts if ts >= 0 else self.last_modified_ms

    # -- reading ------------------------------------------------------------------------
    def read(self, position: int, size: int) -> bytes:
        with open_for_read(self.log_path) as f:
            fd = f.fileno()
            with page_cache.cold_read(fd, os.fstat(fd).st_size):
                return os.pread(fd, size, position)

    def iter_batches(
        self, position: int = 0, chunk_size: int = DEFAULT_READ_CHUNK, *, allow_truncated_tail: bool = False
    ) -> Iterator[Batches]:
        """The segment's batches from ``position``, a chunk at a time (one bounded buffer;
        a single batch larger than ``chunk_size`` gets a buffer of its own size).

        A truncated batch at the end raises, unless ``allow_truncated_tail`` (recovery).
        """
        return iter_file_batches(
            self.log_path, position, self.size, chunk_size, allow_truncated_tail=allow_truncated_tail
        )

    def read_next_offset(self) -> int:
        """Offset after the last batch, or the base offset when empty (``readNextOffset``).

        The first call scans from the last offset-index entry; later calls continue from
        where the previous one stopped, so a segment another process keeps appending to
        (a live broker's active segment) is read only once. A shrunk file or bytes that do
        not parse from there (truncated and rewritten) start the scan over."""
        size = self.size
        if self._tail is not None and self._tail[0] <= size:
            try:
                return self._scan_tail(*self._tail)
            except CorruptDataError:
                pass
        self._tail = None
        last = self._last_offset_entry()
        return self._scan_tail(last[1] if last else 0, self.base_offset)

    def _scan_tail(self, position: int, next_offset: int) -> int:
        last = -1
        for chunk in self.iter_batches(position, allow_truncated_tail=True):
            next_offset = int(chunk.next_offsets[-1])
            position = int(chunk.file_positions[-1] + chunk.sizes[-1])
            last = int(chunk.file_positions[-1])
        self._tail = (position, next_offset)
        if last >= 0:
            self._tail_history[next_offset] = (position, last, self.read(last, 21))
            while len(self._tail_history) > 8:
                del self._tail_history[next(iter(self._tail_history))]
        return next_offset

    def position_hint(self, offset: int) -> int | None:
        """The file position where ``offset`` starts, if one of the last end-offset scans
        stopped exactly there and the batch before it is still the same (a truncation and
        new appends may have put other batches there: then None). A replay of what a live
        broker appended since continues from there, without an index lookup."""
        known = self._tail_history.get(offset)
        if known is None or known[0] > self.size:
            return None
        position, last, mark = known
        if self.read(last, 21) != mark:
            self._tail_history = {}
            self._tail = None
            return None
        return position

    def first_batch(self) -> Batches | None:
        if self.size == 0:
            return None
        # The first entry alone (its length first): a read of a whole chunk here was a whole
        # small segment read for one timestamp, on every segment of every scan.
        head = self.read(0, min(self.size, LOG_OVERHEAD))
        length = int.from_bytes(head[8:12], "big", signed=True) if len(head) == LOG_OVERHEAD else 0
        head = self.read(0, min(self.size, LOG_OVERHEAD + max(length, 0), DEFAULT_READ_CHUNK))
        result = scan_batches(head, base_position=0, path=str(self.log_path), max_batches=1)
        if len(result.batches):
            return result.batches
        return next(self.iter_batches(0), None)

    def transaction_batches(self, position: int = 0, throttle: Callable[[int], None] | None = None,
                            chunk_batches: int = 4096) -> Iterator[Batches]:
        """The segment's transactional and control v2 batches from ``position``, found header by
        header as Kafka's ``FileLogInputStream`` does (it reads each batch's header and loads the
        rest on demand): the data batches' headers only, the control batches whole (their one
        record says COMMIT or ABORT). What replaying the transaction state needs, for a few bytes
        per batch instead of the whole log. ``throttle`` sees the bytes read."""
        path = str(self.log_path)
        with open_for_read(self.log_path) as f:
            fd = f.fileno()
            end = os.fstat(fd).st_size
            with page_cache.cold_read(fd, end):
                parts: list[bytes] = []
                positions: list[int] = []
                held = 0
                while end - position >= LOG_OVERHEAD:
                    head = os.pread(fd, RECORD_BATCH_OVERHEAD, position)
                    base_offset, length = _ENTRY.unpack_from(head)
                    size = LOG_OVERHEAD + length
                    if length < MIN_LEGACY_ENTRY_LENGTH or size > end - position:
                        raise CorruptRecordError(
                            f"record size {length} at position {position} of {path}: "
                            + ("below the minimum record overhead" if length < MIN_LEGACY_ENTRY_LENGTH
                               else f"past the end of the segment ({end} bytes)"),
                            path=path, position=position, offset=base_offset)  # fmt: skip
                    magic = head[MAGIC_OFFSET] if len(head) > MAGIC_OFFSET else -1
                    if magic >= 2:
                        if size < RECORD_BATCH_OVERHEAD:
                            raise CorruptRecordError(f"record batch of {size} bytes, shorter than its header",
                                                     path=path, position=position, offset=base_offset)
                        attributes = int.from_bytes(head[ATTRIBUTES_OFFSET:ATTRIBUTES_OFFSET + 2], "big")
                        if attributes & Attributes.CONTROL:
                            whole = os.pread(fd, size, position)
                            parts.append(whole)
                            positions.append(held)
                            held += len(whole)
                        elif attributes & Attributes.TRANSACTIONAL:
                            parts.append(head)
                            positions.append(held)
                            held += len(head)
                    elif not 0 <= magic <= 1:
                        raise CorruptRecordError(f"invalid magic byte {magic}", path=path, position=position,
                                                 offset=base_offset)
                    if throttle is not None:
                        throttle(len(head))
                    position += size
                    if len(positions) >= chunk_batches:
                        yield batches_at(b"".join(parts), np.array(positions, dtype=np.int64), path=path)
                        parts, positions, held = [], [], 0
                if positions:
                    yield batches_at(b"".join(parts), np.array(positions, dtype=np.int64), path=path)

    def first_batch_timestamp(self) -> int:
        """maxTimestamp of the first batch (``getFirstBatchTimestamp``), Long.MAX if empty
        (remembered once known: the first batch of a segment never changes)."""
        if self._first_batch_timestamp is None:
            # A v2 batch's max timestamp is in its header, which is all Kafka loads for it
            # (``FileChannelRecordBatch.maxTimestamp``); the whole first batch (up to 1 MB) was
            # read for it, on every dirty segment a plan or a scan looks at.
            head = self.read(0, min(self.size, RECORD_BATCH_OVERHEAD)) if self.size else b""
            if len(head) == RECORD_BATCH_OVERHEAD and head[MAGIC_OFFSET] == 2:
                length = _ENTRY.unpack_from(head)[1]
                if RECORD_BATCH_OVERHEAD <= LOG_OVERHEAD + length <= self.size:
                    first = batches_at(head, np.zeros(1, dtype=np.int64), path=str(self.log_path))
                    self._first_batch_timestamp = int(first.max_timestamps[0])
                    return self._first_batch_timestamp
            first = self.first_batch()  # a legacy entry, or one the reader must judge (truncated, corrupt)
            if first is None or len(first) == 0:
                return 2**63 - 1
            self._first_batch_timestamp = int(first.max_timestamps[0])
        return self._first_batch_timestamp

    # -- writing ------------------------------------------------------------------------
    def append(self, data: bytes | bytearray | memoryview, batches: Batches | None = None) -> None:
        """Append whole batches (their offsets already assigned) and index them.

        Raises ``LogSegmentOffsetOverflowError`` if an offset does not fit this segment's
        32-bit relative range (nothing is written then).
        """
        if batches is None:
            result: ScanResult = scan_batches(data)
            if result.end != len(data):
                raise CorruptRecordError("append of a partial batch", position=result.end)
            batches = result.batches
        if len(batches) == 0:
            return
        largest = int(batches.last_offsets.max())
        if largest - self.base_offset > INT32_MAX or int(batches.base_offsets.min()) < self.base_offset:
            bad = largest if largest - self.base_offset > INT32_MAX else int(batches.base_offsets.min())
            raise LogSegmentOffsetOverflowError(self.base_offset, bad)
        position = self.size
        if batches.base_position != position or int(batches.positions[0]) != 0:
            batches = Batches(
                batches.buffer, batches.positions - int(batches.positions[0]), batches.headers, base_position=position
            )
        self.indexer.add(batches)
        if self._append_file is None:
            self._append_file = open(self.log_path, "ab")  # noqa: SIM115 - held until close()
            self._writeback = page_cache.Writeback(self._append_file.fileno(), position)
        self._append_file.write(data)
        self._append_file.flush()
        self._size = position + len(data)
        if self._writeback is not None:
            self._writeback.written(self._size)

    def append_aborted_txn(self, txn: AbortedTxn) -> None:
        self.txn_index.append(txn)

    def build_indexes(self) -> tuple[_Indexer, int]:
        """Offset and time index rebuilt from the log as ``LogSegment.recover`` builds them
        (nothing on disk changes), and the number of valid bytes: a truncated tail stops
        the scan."""
        indexer = self._new_indexer()
        valid = 0
        for chunk in self.iter_batches(0, allow_truncated_tail=True):
            indexer.add(chunk)
            valid = int(chunk.file_positions[-1] + chunk.sizes[-1])
        return indexer, valid

    def _new_indexer(self) -> _Indexer:
        return _Indexer(
            OffsetIndex(self.base_offset, self.max_index_size, path=self.index_path),
            TimeIndex(self.base_offset, self.max_index_size, path=self.time_index_path),
            self.index_interval_bytes,
            (NO_TIMESTAMP, self.base_offset),
        )

    def recover(self) -> int:
        """Kafka's ``LogSegment.recover`` for the offset and time index: check every batch
        (framing, CRC, offsets increasing and inside the segment's range), rebuild both
        indexes, and cut the log after the last valid batch. Returns the bytes truncated.

        The transaction index is not rebuilt here: that needs the producer state of the
        log before this segment, which only the ``Log`` has.
        """
        indexer = self._new_indexer()
        valid = 0
        previous_last = self.base_offset - 1
        try:
            for chunk in self.iter_batches(0, allow_truncated_tail=True):
                bad = chunk.verify_checksums()
                keep = len(chunk) if not bad else int(np.searchsorted(chunk.file_positions, bad[0].position))
                for i, (base, last) in enumerate(
                    zip(chunk.base_offsets.tolist(), chunk.last_offsets.tolist(), strict=True)
                ):
                    if i >= keep:
                        break
                    if base <= previous_last or base < self.base_offset or last - self.base_offset > INT32_MAX:
                        keep = i
                        break
                    previous_last = last
                if keep:
                    good = chunk.select(slice(0, keep))
                    indexer.add(good)
                    valid = int(good.file_positions[-1] + good.sizes[-1])
                if keep < len(chunk):
                    break
        except CorruptDataError:
            pass  # the framing itself is broken: everything from the last valid batch on is cut
        self._offset_index, self._time_index, self._indexer = indexer.offset_index, indexer.time_index, indexer
        truncated = self.size - valid
        if truncated:
            self.truncate_log_file(valid)
        self._tail = None
        self._tail_history = {}
        return truncated

    def truncate_log_file(self, size: int) -> None:
        self.close_appender()
        files.truncate(self.log_path, size)
        self._size = size

    def truncate_to(self, offset: int) -> int:
        """Remove every batch whose last offset is >= ``offset`` (Kafka's ``truncateTo``:
        a batch holding ``offset`` goes entirely). Returns the bytes removed."""
        position = self.size
        for chunk in self.iter_batches(self.lookup_position(offset)):
            hits = np.flatnonzero(chunk.last_offsets >= offset)
            if hits.size:
                position = int(chunk.file_positions[hits[0]])
                break
        removed = self.size - position
        self.offset_index.truncate_to(offset)
        self.time_index.truncate_to(offset)
        self.txn_index.truncate_to(offset)
        if removed:
            self.truncate_log_file(position)
        # The index files on disk must follow at once (Kafka truncates its mmapped files):
        # a stale .txnindex entry above the new end would make a later clean pair a new
        # ABORT marker with a transaction that no longer exists.
        self.offset_index.write_to(self.index_path)
        self.time_index.write_to(self.time_index_path)
        if self.txn_index.entries or self.txn_index_path.exists():
            self.txn_index.write_to(self.txn_index_path)
        self._indexer = None  # the running maximum is read again from the time index
        self._max_ts_cache = None
        self._tail = None
        self._tail_history = {}
        return removed

    def on_become_inactive(self) -> None:
        """The segment stops being appended to: write the final time-index entry
        ``(max timestamp, its offset)`` even if the index is full (KAFKA_NOTES §2.3)."""
        indexer = self.indexer
        self.time_index.maybe_append(indexer.max_timestamp, indexer.offset_of_max_timestamp, skip_full_check=True)

    def flush(self) -> None:
        """Make the segment durable: ``.log`` fsynced, indexes written trimmed and fsynced,
        ``.txnindex`` only if it has entries (or existed)."""
        if self._append_file is not None:
            self._append_file.flush()
            files.fsync_file(self._append_file.fileno())
            page_cache.drop(self._append_file.fileno())  # written and durable: not the broker's hot pages
        else:
            files.fsync_file(str(self.log_path))
        self.offset_index.write_to(self.index_path)
        self.time_index.write_to(self.time_index_path)
        if self.txn_index.entries or self.txn_index_path.exists():
            self.txn_index.write_to(self.txn_index_path)

    def close_appender(self) -> None:
        if self._append_file is not None:
            self._append_file.close()
            self._append_file = None

    def close(self) -> None:
        self.close_appender()

    def change_suffix(self, new_suffix: str) -> None:
        """Rename every file of the segment (``.log`` first, then the indexes, as Kafka's
        ``changeFileSuffixes`` does). The ``.log`` must exist: renaming a segment that is
        not there would let a swap go on without its data. Index files may be absent
        (Kafka tolerates a missing ``.timeindex`` and ``.txnindex``)."""
        self.close_appender()
        for kind in SEGMENT_FILE_SUFFIXES:
            old = self.path(kind)
            new = self.dir / file_name(self.base_offset, kind + new_suffix)
            if kind == LOG_SUFFIX or old.exists():
                files.rename(old, new)
        self.suffix = new_suffix
        for index, kind in (
            (self._offset_index, INDEX_SUFFIX),
            (self._time_index, TIME_INDEX_SUFFIX),
            (self._txn_index, TXN_INDEX_SUFFIX),
        ):
            if index is not None:
                index.path = str(self.path(kind))

    def discard_uncommitted(self) -> None:
        """Remove a new segment that was not committed: its ``.swap`` files first (each
        renamed back to ``.cleaned`` where possible), then the ``.cleaned`` ones, so that
        at every moment some ``.cleaned`` file of the set remains for as long as any
        ``.swap`` does (what makes a broker's start-up discard the set)."""
        self.close_appender()
        for kind in SEGMENT_FILE_SUFFIXES:
            swap = self.dir / file_name(self.base_offset, kind + SWAP_SUFFIX)
            if swap.exists():
                try:
                    files.rename(swap, self.dir / file_name(self.base_offset, kind + CLEANED_SUFFIX))
                except OSError:
                    files.remove(swap)
        for kind in SEGMENT_FILE_SUFFIXES:
            files.remove(self.dir / file_name(self.base_offset, kind + CLEANED_SUFFIX))
        self.suffix = CLEANED_SUFFIX

    def delete_files(self) -> None:
        self.close_appender()
        for kind in SEGMENT_FILE_SUFFIXES:
            files.remove(self.path(kind))

    def __repr__(self) -> str:
        return (
            f"LogSegment(baseOffset={self.base_offset}, size={self._size}, dir={self.dir.name}, suffix={self.suffix!r})"
        )
