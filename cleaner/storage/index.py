"""Segment indexes: ``.index`` (OffsetIndex), ``.timeindex`` (TimeIndex), ``.txnindex`` (TransactionIndex).

Semantics follow Kafka's ``storage/.../internals/log/{AbstractIndex,OffsetIndex,TimeIndex,
TransactionIndex,AbortedTxn}.java`` (KAFKA_NOTES §2.1-§2.4):

- entries are kept in numpy columns (absolute int64 offsets, positions / timestamps), so
  lookups, truncation and bulk appends are vectorised. Kafka mmaps a preallocated file and
  writes through it; we keep the index in memory and persist it explicitly with
  ``write_to``, which always writes the **trimmed** file (``entries * entry_size`` bytes).
  A broker opening an index sets ``entries = fileLength / entrySize``, so preallocated
  zeros would be read back as entries (all pointing at the base offset / timestamp 0):
  never write them. ``max_index_size`` only bounds the number of entries (``is_full``),
  as Kafka's mmap limit does;
- appends that Kafka refuses raise ``IndexAppendError`` subclasses (bugs in the writer),
  while bad bytes on disk raise ``cleaner.errors.CorruptIndexError`` naming the file, the
  byte position and the offending offset;
- ``read(..., strict=True)`` (the default) goes further than Kafka's ``sanityCheck`` and
  also checks the ordering every Kafka-written index has. That rejects zero-filled or
  garbage files, including the untrimmed index of an active segment after an unclean
  shutdown, which the broker itself would rebuild (segment recovery, §4).
  ``strict=False`` reads the way a broker opens a file (floor the length, no checks).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

import numpy as np

from cleaner.errors import CorruptIndexError
from cleaner.storage import files

PathLike = str | os.PathLike[str]
ArrayLike = Sequence[int] | np.ndarray

DEFAULT_MAX_INDEX_SIZE = 10 * 1024 * 1024  # segment.index.bytes default
NO_TIMESTAMP = -1  # RecordBatch.NO_TIMESTAMP
INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)

OFFSET_INDEX_DTYPE = np.dtype([("relative_offset", ">i4"), ("position", ">i4")])
TIME_INDEX_DTYPE = np.dtype([("timestamp", ">i8"), ("relative_offset", ">i4")])
TXN_INDEX_DTYPE = np.dtype(
    [
        ("version", ">i2"),
        ("producer_id", ">i8"),
        ("first_offset", ">i8"),
        ("last_offset", ">i8"),
        ("last_stable_offset", ">i8"),
    ]
)
assert OFFSET_INDEX_DTYPE.itemsize == 8
assert TIME_INDEX_DTYPE.itemsize == 12
assert TXN_INDEX_DTYPE.itemsize == 34


class IndexAppendError(ValueError):
    """An append Kafka's index would refuse: a bug in whoever builds the index, not bad data."""


class IndexFullError(IndexAppendError):
    """``Attempt to append to a full index`` (Kafka: IllegalArgumentException)."""


class InvalidOffsetError(IndexAppendError):
    """An offset not larger than the last one (Kafka: InvalidOffsetException)."""


class InvalidTimestampError(IndexAppendError):
    """A timestamp smaller than the last one in a time index (Kafka: IllegalStateException)."""


class IndexOffsetOverflowError(IndexAppendError):
    """``offset - baseOffset`` outside ``[0, Int.MAX]`` (Kafka: IndexOffsetOverflowException)."""


def _where(path: str | None) -> str:
    return f" to {path}" if path else ""


def _fspath(path: PathLike | None) -> str | None:
    return os.fspath(path) if path is not None else None


def _beyond_the_log(beyond: np.ndarray, offsets: np.ndarray, log_last: int | None, suffix: str = "") -> list[str]:
    """One problem for every entry whose offset lies past the log's last offset: they share
    one cause (a log cut short, an index not truncated with it), so a truncation shows as
    one finding, not as one line per lost entry."""
    where = np.flatnonzero(beyond)
    if not len(where):
        return []
    first, last = int(where[0]), int(where[-1])
    if len(where) == 1:
        return [f"entry {first}: offset {int(offsets[first])} is beyond the log (last offset {log_last}){suffix}"]
    return [
        f"entries {first} to {last} ({len(where)} entries): offsets {int(offsets[first])} to {int(offsets[last])} "
        f"are beyond the log (last offset {log_last}){suffix}"
    ]


class _Columns:
    """Two growable int64 columns; the shared storage of the offset and time index."""

    def __init__(self) -> None:
        self._a = np.empty(16, dtype=np.int64)
        self._b = np.empty(16, dtype=np.int64)
        self._n = 0

    def extend(self, a: np.ndarray, b: np.ndarray) -> None:
        need = self._n + len(a)
        if need > len(self._a):
            cap = max(need, 2 * len(self._a))
            grown_a, grown_b = np.empty(cap, dtype=np.int64), np.empty(cap, dtype=np.int64)
            grown_a[: self._n] = self._a[: self._n]
            grown_b[: self._n] = self._b[: self._n]
            self._a, self._b = grown_a, grown_b
        self._a[self._n : need] = a
        self._b[self._n : need] = b
        self._n = need

    def truncate(self, n: int) -> None:
        self._n = n

    @property
    def a(self) -> np.ndarray:
        view = self._a[: self._n]
        view.flags.writeable = False
        return view

    @property
    def b(self) -> np.ndarray:
        view = self._b[: self._n]
        view.flags.writeable = False
        return view


class _FixedSizeIndex:
    """What OffsetIndex and TimeIndex share (Kafka's AbstractIndex)."""

    ENTRY_SIZE = 0
    DTYPE: np.dtype = OFFSET_INDEX_DTYPE

    def __init__(
        self, base_offset: int, max_index_size: int = DEFAULT_MAX_INDEX_SIZE, *, path: PathLike | None = None
    ) -> None:
        if max_index_size < self.ENTRY_SIZE:
            # AbstractIndex.createAndAssignMmap: "Invalid max index size"
            raise ValueError(f"Invalid max index size: {max_index_size}")
        self.base_offset = int(base_offset)
        self.path = _fspath(path)
        self._max_entries = max_index_size // self.ENTRY_SIZE
        self._cols = _Columns()
        self._file_length: int | None = None  # length of the file it was read from

    @classmethod
    def from_bytes(
        cls,
        data: bytes | bytearray | memoryview,
        base_offset: int,
        *,
        max_index_size: int | None = None,
        path: PathLike | None = None,
        strict: bool = True,
    ) -> Self:
        """Decode an index file's bytes (entries are ``DTYPE`` rows).

        ``entries = len // ENTRY_SIZE`` as Kafka does; with ``strict`` a length that is not a multiple
        of ``ENTRY_SIZE``, Kafka's ``sanityCheck`` and the ordering checks (``check_order``) raise
        CorruptIndexError. ``max_index_size=None`` gives ``max_entries = entries`` (what a
        broker has for a loaded, non-active segment's index).
        """
        length = len(data)
        n = length // cls.ENTRY_SIZE
        idx = cls(base_offset, max(max_index_size or 0, n * cls.ENTRY_SIZE, cls.ENTRY_SIZE), path=path)
        if max_index_size is None:
            idx._max_entries = n
        idx._file_length = length
        rows = np.frombuffer(data, dtype=cls.DTYPE, count=n)
        idx._cols.extend(*idx._columns_from_rows(rows))
        if strict:
            idx._length_check()
            idx.sanity_check()
            idx.check_order()
        return idx

    @classmethod
    def read(
        cls, path: PathLike, base_offset: int, *, max_index_size: int | None = None, strict: bool = True
    ) -> Self:
        with open(path, "rb") as f:
            data = f.read()
        return cls.from_bytes(data, base_offset, max_index_size=max_index_size, path=path, strict=strict)

    def _columns_from_rows(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The two in-memory columns (absolute offsets, never relative ones) of decoded rows."""
        raise NotImplementedError

    # -- size -------------------------------------------------------------------------
    @property
    def entries(self) -> int:
        return self._cols._n

    def __len__(self) -> int:
        return self._cols._n

    @property
    def max_entries(self) -> int:
        return self._max_entries

    @property
    def is_full(self) -> bool:
        return self.entries >= self._max_entries

    @property
    def size_in_bytes(self) -> int:
        """Bytes actually used (``AbstractIndex.sizeInBytes``), what segment grouping adds up (§9.3)."""
        return self.entries * self.ENTRY_SIZE

    @property
    def length(self) -> int:
        """Length of the file this index was read from, else of the trimmed file it writes."""
        return self._file_length if self._file_length is not None else self.size_in_bytes

    def resize(self, max_index_size: int) -> None:
        """Change the entry limit (Kafka ``resize``: a loaded index is resized to
        ``segment.index.bytes`` when its segment becomes the active one)."""
        new_max = max_index_size // self.ENTRY_SIZE
        if new_max < self.entries:
            raise ValueError(f"cannot resize index with {self.entries} entries to {new_max} entries")
        self._max_entries = new_max

    def _relative(self, offset: int) -> int:
        rel = offset - self.base_offset
        if rel < 0 or rel > INT32_MAX:
            raise IndexOffsetOverflowError(f"Integer overflow for offset: {offset} ({self.path})")
        return rel

    def _check_relative(self, offsets: np.ndarray) -> None:
        rel = offsets - self.base_offset
        bad = np.nonzero((rel < 0) | (rel > INT32_MAX))[0]
        if len(bad):
            raise IndexOffsetOverflowError(f"Integer overflow for offset: {int(offsets[bad[0]])} ({self.path})")

    def _corrupt(self, reason: str, *, slot: int | None = None, offset: int | None = None) -> CorruptIndexError:
        return CorruptIndexError(
            reason, path=self.path, position=None if slot is None else slot * self.ENTRY_SIZE, offset=offset
        )

    def _check_first_offset(self, offsets: np.ndarray) -> None:
        if offsets[0] < self.base_offset:
            raise self._corrupt(
                f"entry 0 has offset {int(offsets[0])} below the base offset {self.base_offset}",
                slot=0,
                offset=int(offsets[0]),
            )

    def _check_increasing(
        self, values: np.ndarray, offsets: np.ndarray, name: str, *, strict: bool, hint: str = ""
    ) -> None:
        """CorruptIndexError naming the first entry whose ``name`` column goes back (or, with
        ``strict``, does not go forward)."""
        steps = np.diff(values)
        bad = np.nonzero(steps <= 0 if strict else steps < 0)[0]
        if len(bad):
            i = int(bad[0]) + 1
            relation = "not greater than" if strict else "below"
            raise self._corrupt(
                f"entry {i} has {name} {int(values[i])} {relation} the previous entry's {int(values[i - 1])}{hint}",
                slot=i,
                offset=int(offsets[i]),
            )

    def _length_check(self) -> None:
        if self.length % self.ENTRY_SIZE != 0:
            raise self._corrupt(
                f"index file is corrupt, found {self.length} bytes which is not a multiple of {self.ENTRY_SIZE}"
            )

    # -- persistence ----------------------------------------------------------------
    def to_bytes(self) -> bytes:
        raise NotImplementedError

    def write_to(self, path: PathLike | None = None, *, fsync: bool = True) -> None:
        """Write the trimmed file (``entries * entry_size`` bytes, never preallocated zeros).

        Goes through ``files.write_file`` (create/truncate + fsync): index files are written
        in place, as the broker does, and are only made visible by the segment swap.
        """
        target = _fspath(path) if path is not None else self.path
        if target is None:
            raise ValueError("no path to write the index to")
        files.write_file(target, self.to_bytes(), fsync=fsync)
        self._file_length = None

    def flush(self) -> None:
        """Persist to the file the index was created for (Kafka ``flush`` + ``trimToValidSize``)."""
        self.write_to(None)


# ---------------------------------------------------------------------------------------
class OffsetIndex(_FixedSizeIndex):
    """``.index``: sparse (offset -> byte position in ``.log``), 8-byte entries
    ``relativeOffset int32, position int32`` (KAFKA_NOTES §2.1; Kafka ``OffsetIndex.java``)."""

    ENTRY_SIZE = 8
    DTYPE = OFFSET_INDEX_DTYPE

    def _columns_from_rows(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return rows["relative_offset"].astype(np.int64) + self.base_offset, rows["position"].astype(np.int64)

    # -- columns --------------------------------------------------------------------
    @property
    def offsets(self) -> np.ndarray:
        """Absolute offsets of the entries (read-only int64 view)."""
        return self._cols.a

    @property
    def positions(self) -> np.ndarray:
        return self._cols.b

    @property
    def last_offset(self) -> int:
        """Offset of the last entry, or the base offset when empty (Kafka ``lastOffset``)."""
        return int(self._cols.a[-1]) if self.entries else self.base_offset

    @property
    def last_entry(self) -> tuple[int, int]:
        """(offset, position) of the last entry, or ``(base_offset, 0)`` when empty."""
        if not self.entries:
            return (self.base_offset, 0)
        return (int(self._cols.a[-1]), int(self._cols.b[-1]))

    def entry(self, n: int) -> tuple[int, int]:
        if n < 0 or n >= self.entries:
            raise IndexError(f"Attempt to fetch the {n}th entry from index {self.path}, which has size {self.entries}")
        return (int(self._cols.a[n]), int(self._cols.b[n]))

    # -- append ---------------------------------------------------------------------
    def append(self, offset: int, position: int) -> None:
        """``OffsetIndex.append``: full check, then ``offset > lastOffset`` (unless empty), then
        the relative-offset range. Positions are not checked by Kafka (beyond fitting int32)."""
        if self.is_full:
            raise IndexFullError(f"Attempt to append to a full index (size = {self.entries}).")
        if self.entries and offset <= self.last_offset:
            raise InvalidOffsetError(
                f"Attempt to append an offset {offset} to position {self.entries} no larger than the last "
                f"offset appended ({self.last_offset}){_where(self.path)}"
            )
        self._relative(offset)
        if not INT32_MIN <= position <= INT32_MAX:
            raise ValueError(f"position {position} does not fit an int32")
        self._cols.extend(np.array([offset], np.int64), np.array([position], np.int64))

    def append_many(self, offsets: ArrayLike, positions: ArrayLike) -> None:
        """Append many entries at once, all or nothing: the same rules as ``append`` for each
        entry in turn, checked before anything is added (Kafka would have appended the
        entries before the bad one)."""
        offs = np.asarray(offsets, dtype=np.int64)
        pos = np.asarray(positions, dtype=np.int64)
        if offs.shape != pos.shape or offs.ndim != 1:
            raise ValueError("offsets and positions must be 1-d arrays of the same length")
        if len(offs) == 0:
            return
        room = self._max_entries - self.entries
        prev = np.concatenate(([self.last_offset], offs[:-1])) if self.entries else offs[:-1]
        cur = offs if self.entries else offs[1:]
        bad = np.nonzero(cur <= prev)[0]
        first_bad = (int(bad[0]) + (0 if self.entries else 1)) if len(bad) else len(offs)
        if room < len(offs) and room <= first_bad:
            raise IndexFullError(f"Attempt to append to a full index (size = {self.entries + room}).")
        if first_bad < len(offs):
            last = int(prev[first_bad - (0 if self.entries else 1)])
            raise InvalidOffsetError(
                f"Attempt to append an offset {int(offs[first_bad])} to position {self.entries + first_bad} no "
                f"larger than the last offset appended ({last}){_where(self.path)}"
            )
        self._check_relative(offs)
        if len(pos) and (pos.min() < INT32_MIN or pos.max() > INT32_MAX):
            raise ValueError("positions must fit int32")
        self._cols.extend(offs, pos)

    # -- lookup ---------------------------------------------------------------------
    def lookup(self, target_offset: int) -> tuple[int, int]:
        """Largest entry with offset <= ``target_offset`` as (offset, position), else
        ``(base_offset, 0)`` (Kafka ``lookup``: the caller then scans ``.log`` from there)."""
        slot = int(np.searchsorted(self._cols.a, target_offset, side="right")) - 1
        if slot < 0:
            return (self.base_offset, 0)
        return (int(self._cols.a[slot]), int(self._cols.b[slot]))

    def lookup_many(self, target_offsets: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        """``lookup`` for many targets at once: (offsets, positions) arrays."""
        targets = np.asarray(target_offsets, dtype=np.int64)
        slots = np.searchsorted(self._cols.a, targets, side="right") - 1
        found = slots >= 0
        safe = np.where(found, slots, 0)
        if self.entries:
            offs = np.where(found, self._cols.a[safe], self.base_offset)
            pos = np.where(found, self._cols.b[safe], 0)
        else:
            offs = np.full(len(targets), self.base_offset, dtype=np.int64)
            pos = np.zeros(len(targets), dtype=np.int64)
        return offs, pos

    # -- truncation -----------------------------------------------------------------
    def truncate_to(self, offset: int) -> None:
        """Remove every entry with offset >= ``offset`` (Kafka ``truncateTo``; truncating to an
        offset above the last entry changes nothing)."""
        self._cols.truncate(int(np.searchsorted(self._cols.a, offset, side="left")))

    def truncate(self) -> None:
        self._cols.truncate(0)

    # -- checks ---------------------------------------------------------------------
    def sanity_check(self) -> None:
        """Kafka's ``OffsetIndex.sanityCheck``: last offset >= base offset, length a multiple of 8.

        (Not run by a broker at startup, §2.1; ``read`` runs it.)
        """
        if self.entries and self.last_offset < self.base_offset:
            raise self._corrupt(
                f"Corrupt index found, index file has non-zero size but the last offset is {self.last_offset} "
                f"which is less than the base offset {self.base_offset}",
                slot=self.entries - 1,
                offset=self.last_offset,
            )
        self._length_check()

    def check_order(self) -> None:
        """What every index Kafka writes satisfies: offsets >= base and strictly increasing,
        positions >= 0 and non-decreasing (§2.1). Zero-filled or garbage files fail here."""
        offs, pos = self._cols.a, self._cols.b
        if not len(offs):
            return
        self._check_first_offset(offs)
        self._check_increasing(offs, offs, "offset", strict=True, hint=" (zero-filled or garbage index?)")
        if pos[0] < 0:
            raise self._corrupt(f"entry 0 has negative position {int(pos[0])}", slot=0, offset=int(offs[0]))
        self._check_increasing(pos, offs, "position", strict=False)

    def verify_against(
        self, batch_positions: ArrayLike, batch_last_offsets: ArrayLike, *, exact: bool = False
    ) -> list[str]:
        """Problems that would make broker lookups wrong, checked against the segment's batches.

        ``batch_positions`` are the start positions of every batch (or legacy entry) of the
        ``.log`` in file order, ``batch_last_offsets`` their last offsets.

        Errors (returned):
        - entries out of order (offsets not strictly increasing, positions decreasing, offset
          below the base offset);
        - a position that is not the start of a batch, or at/after the end of the log;
        - an offset above the log's last offset ("index beyond the log");
        - the lookup invariant of §2.1 broken: a batch with ``lastOffset >= O`` starts before
          ``P``, so a lookup landing on this entry would skip it.

        Kafka-legal, hence accepted: an entry whose offset is not the lastOffset of the batch
        at ``P`` (brokers <= 4.0 write ``(largest offset of the appended chunk, chunk start)``,
        §2.2), an entry at position 0, sparse entries. ``exact=True`` also demands the 4.1+
        per-batch form ``O == lastOffset(batch at P)``, which is what this project writes.
        """
        starts = np.asarray(batch_positions, dtype=np.int64)
        lasts = np.asarray(batch_last_offsets, dtype=np.int64)
        if starts.shape != lasts.shape:
            raise ValueError("batch_positions and batch_last_offsets differ in length")
        problems: list[str] = []
        offs, pos = self._cols.a, self._cols.b
        n = len(offs)
        if n == 0:
            return problems
        for i in np.nonzero(offs < self.base_offset)[0]:
            problems.append(f"entry {i}: offset {offs[i]} is below the base offset {self.base_offset}")
        for i in np.nonzero(np.diff(offs) <= 0)[0] + 1:
            problems.append(f"entry {i}: offset {offs[i]} is not greater than the previous entry's {offs[i - 1]}")
        for i in np.nonzero(np.diff(pos) < 0)[0] + 1:
            problems.append(f"entry {i}: position {pos[i]} is below the previous entry's {pos[i - 1]}")
        log_last = int(lasts[-1]) if len(lasts) else None
        k = np.searchsorted(starts, pos, side="left")
        kk = np.minimum(k, max(len(starts) - 1, 0))
        is_start = (k < len(starts)) & (starts[kk] == pos) if len(starts) else np.zeros(n, dtype=bool)
        beyond = offs > (log_last if log_last is not None else self.base_offset - 1)
        problems += _beyond_the_log(beyond, offs, log_last, ": index beyond the log")
        # Vectorised screening; only suspicious entries are looked at one by one.
        suspect = ~is_start
        if len(starts):
            prev_last = np.where(kk > 0, lasts[np.maximum(kk - 1, 0)], np.iinfo(np.int64).min)
            suspect |= prev_last >= offs
            if exact:
                suspect |= lasts[kk] != offs
        for i in np.nonzero(suspect & ~beyond)[0]:
            o, p = int(offs[i]), int(pos[i])
            if not is_start[i]:
                if not len(starts) or p > starts[-1]:
                    problems.append(f"entry {i}: position {p} is at or past the last batch of the log")
                else:
                    problems.append(f"entry {i}: position {p} is not the start of a batch")
                continue
            b = int(k[i])
            if b > 0 and lasts[b - 1] >= o:
                problems.append(
                    f"entry {i}: ({o}, {p}) skips the batch at position {starts[b - 1]} whose lastOffset "
                    f"{lasts[b - 1]} >= {o}: a lookup would miss it"
                )
            if exact and lasts[b] != o:
                problems.append(f"entry {i}: offset {o} is not the lastOffset {lasts[b]} of the batch at position {p}")
        return problems

    def to_bytes(self) -> bytes:
        rows = np.empty(self.entries, dtype=self.DTYPE)
        rows["relative_offset"] = self._cols.a - self.base_offset
        rows["position"] = self._cols.b
        return rows.tobytes()

    def __repr__(self) -> str:
        return f"OffsetIndex(base_offset={self.base_offset}, entries={self.entries}, path={self.path!r})"


# ---------------------------------------------------------------------------------------
class TimeIndex(_FixedSizeIndex):
    """``.timeindex``: (max timestamp so far -> offset), 12-byte entries ``timestamp int64,
    relativeOffset int32`` (KAFKA_NOTES §2.3; Kafka ``TimeIndex.java``).

    The last slot is reserved: ``is_full`` is ``entries >= max_entries - 1`` and only the final
    entry written when a segment becomes inactive (``skip_full_check=True``) may use it.
    """

    ENTRY_SIZE = 12
    DTYPE = TIME_INDEX_DTYPE

    def _columns_from_rows(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return rows["timestamp"].astype(np.int64), rows["relative_offset"].astype(np.int64) + self.base_offset

    @property
    def timestamps(self) -> np.ndarray:
        return self._cols.a

    @property
    def offsets(self) -> np.ndarray:
        return self._cols.b

    @property
    def is_full(self) -> bool:
        # TimeIndex.isFull: the last slot is kept for the entry written on roll / close.
        return self.entries >= self._max_entries - 1

    @property
    def last_entry(self) -> tuple[int, int]:
        """(timestamp, offset) of the last entry, or ``(NO_TIMESTAMP, base_offset)`` when empty.

        A loaded segment's ``maxTimestampSoFar`` is this timestamp (§2.3)."""
        if not self.entries:
            return (NO_TIMESTAMP, self.base_offset)
        return (int(self._cols.a[-1]), int(self._cols.b[-1]))

    def entry(self, n: int) -> tuple[int, int]:
        if n < 0 or n >= self.entries:
            raise IndexError(
                f"Attempt to fetch the {n}th entry from time index {self.path} which has size {self.entries}"
            )
        return (int(self._cols.a[n]), int(self._cols.b[n]))

    def maybe_append(self, timestamp: int, offset: int, skip_full_check: bool = False) -> bool:
        """``TimeIndex.maybeAppend``; returns whether an entry was added.

        In Kafka's order: full check (unless ``skip_full_check``); with entries present, an
        offset below the last entry's offset raises InvalidOffsetError and a timestamp below
        the last timestamp raises InvalidTimestampError; the entry is added only when
        ``timestamp > last timestamp`` (``NO_TIMESTAMP`` = -1 when empty, so -1 timestamps
        are never indexed). An equal offset with a larger timestamp is added.
        """
        if not skip_full_check and self.is_full:
            raise IndexFullError(f"Attempt to append to a full time index (size = {self.entries}).")
        last_ts, last_off = self.last_entry
        if self.entries and offset < last_off:
            raise InvalidOffsetError(
                f"Attempt to append an offset ({offset}) to slot {self.entries} no larger than the last offset "
                f"appended ({last_off}){_where(self.path)}"
            )
        if self.entries and timestamp < last_ts:
            raise InvalidTimestampError(
                f"Attempt to append a timestamp ({timestamp}) to slot {self.entries} no larger than the last "
                f"timestamp appended ({last_ts}){_where(self.path)}"
            )
        if timestamp <= last_ts:
            return False
        if self.entries >= self._max_entries:
            # Kafka would hit the end of its mmap (BufferOverflowException).
            raise IndexFullError(f"Attempt to append to a full time index (size = {self.entries}).")
        self._relative(offset)
        self._cols.extend(np.array([timestamp], np.int64), np.array([offset], np.int64))
        return True

    def append_many(self, timestamps: ArrayLike, offsets: ArrayLike) -> int:
        """``maybe_append`` for each (timestamp, offset) in turn (no ``skip_full_check``), all or
        nothing; returns the number of entries added."""
        ts = np.asarray(timestamps, dtype=np.int64)
        offs = np.asarray(offsets, dtype=np.int64)
        if ts.shape != offs.shape or ts.ndim != 1:
            raise ValueError("timestamps and offsets must be 1-d arrays of the same length")
        m = len(ts)
        if m == 0:
            return 0
        n0 = self.entries
        last_ts, last_off = self.last_entry
        # Running "last entry" before each candidate: its timestamp is the running maximum
        # (an entry is added exactly when its timestamp beats it), its offset the offset of
        # the most recent added candidate.
        prev_max = np.maximum.accumulate(np.concatenate(([last_ts], ts)))[:-1]
        added = ts > prev_max
        idx = np.where(added, np.arange(m), -1)
        last_added = np.concatenate(([-1], np.maximum.accumulate(idx)))[:-1]
        prev_off = np.where(last_added >= 0, offs[np.maximum(last_added, 0)], last_off)
        count_before = n0 + np.concatenate(([0], np.cumsum(added)))[:-1]
        has_entries = count_before > 0
        full = count_before >= self._max_entries - 1
        bad_off = has_entries & (offs < prev_off)
        bad_ts = has_entries & (ts < prev_max)
        bad = full | bad_off | bad_ts
        if bad.any():
            i = int(np.argmax(bad))
            if full[i]:
                raise IndexFullError(f"Attempt to append to a full time index (size = {int(count_before[i])}).")
            if bad_off[i]:
                raise InvalidOffsetError(
                    f"Attempt to append an offset ({int(offs[i])}) to slot {int(count_before[i])} no larger than "
                    f"the last offset appended ({int(prev_off[i])}){_where(self.path)}"
                )
            raise InvalidTimestampError(
                f"Attempt to append a timestamp ({int(ts[i])}) to slot {int(count_before[i])} no larger than the "
                f"last timestamp appended ({int(prev_max[i])}){_where(self.path)}"
            )
        self._check_relative(offs[added])
        self._cols.extend(ts[added], offs[added])
        return int(added.sum())

    def lookup(self, target_timestamp: int) -> tuple[int, int]:
        """Largest entry with timestamp <= target as (timestamp, offset), else
        ``(NO_TIMESTAMP, base_offset)`` (Kafka ``TimeIndex.lookup``)."""
        slot = int(np.searchsorted(self._cols.a, target_timestamp, side="right")) - 1
        if slot < 0:
            return (NO_TIMESTAMP, self.base_offset)
        return (int(self._cols.a[slot]), int(self._cols.b[slot]))

    def truncate_to(self, offset: int) -> None:
        """Remove every entry with offset >= ``offset``.

        Kafka binary-searches by offset; with several entries at the same offset (allowed:
        equal offset, larger timestamp) its search may land on any of them. We remove all of
        them, which is what ``truncateTo``'s contract says.
        """
        self._cols.truncate(int(np.searchsorted(self._cols.b, offset, side="left")))

    def truncate(self) -> None:
        self._cols.truncate(0)

    def sanity_check(self) -> None:
        """Kafka's ``TimeIndex.sanityCheck``: last timestamp >= first, last offset >= base,
        length a multiple of 12."""
        if self.entries:
            first_ts = int(self._cols.a[0])
            last_ts, last_off = self.last_entry
            if last_ts < first_ts:
                raise self._corrupt(
                    f"Corrupt time index found, the last timestamp is {last_ts} which is less than the first "
                    f"timestamp {first_ts}",
                    slot=self.entries - 1,
                    offset=last_off,
                )
            if last_off < self.base_offset:
                raise self._corrupt(
                    f"Corrupt time index found, the last offset is {last_off} which is less than the first offset "
                    f"{self.base_offset}",
                    slot=self.entries - 1,
                    offset=last_off,
                )
        self._length_check()

    def check_order(self) -> None:
        """Timestamps strictly increasing, offsets >= base and non-decreasing (what
        ``maybeAppend`` guarantees, §2.3)."""
        ts, offs = self._cols.a, self._cols.b
        if not len(ts):
            return
        self._check_first_offset(offs)
        self._check_increasing(ts, offs, "timestamp", strict=True, hint=" (zero-filled or garbage time index?)")
        self._check_increasing(offs, offs, "offset", strict=False)

    def verify_against(
        self, batch_last_offsets: ArrayLike, batch_max_timestamps: ArrayLike, *, closed: bool = True
    ) -> list[str]:
        """Problems of this time index against its segment's batches (file order).

        Every entry (T, O) means "the largest timestamp up to and including the batch holding
        O is T" (§2.3), so: timestamps strictly increasing, offsets non-decreasing and within
        ``[base_offset, last offset of the log]``, and T equals the running maximum of the
        batches' maxTimestamp up to the batch holding O. The offset need not be a batch's
        lastOffset (some 3.x brokers index the record offset of the max timestamp).

        ``closed`` (the segment is not being appended to; also true for every segment after
        a clean shutdown): the last entry must carry the segment's max timestamp, or the
        index must be empty when no batch has a timestamp >= 0. Otherwise the broker's
        ``largestTimestamp`` (retention, compaction lag) would be wrong.
        """
        lasts = np.asarray(batch_last_offsets, dtype=np.int64)
        maxts = np.asarray(batch_max_timestamps, dtype=np.int64)
        if lasts.shape != maxts.shape:
            raise ValueError("batch_last_offsets and batch_max_timestamps differ in length")
        problems: list[str] = []
        ts, offs = self._cols.a, self._cols.b
        n = len(ts)
        running = np.maximum.accumulate(maxts) if len(maxts) else maxts
        for i in np.nonzero(np.diff(ts) <= 0)[0] + 1:
            problems.append(f"entry {i}: timestamp {ts[i]} is not greater than the previous entry's {ts[i - 1]}")
        for i in np.nonzero(np.diff(offs) < 0)[0] + 1:
            problems.append(f"entry {i}: offset {offs[i]} is below the previous entry's {offs[i - 1]}")
        log_last = int(lasts[-1]) if len(lasts) else None
        beyond = np.zeros(n, dtype=bool)
        if n:
            k = np.searchsorted(lasts, offs, side="left")
            expected_ts = running[np.minimum(k, len(running) - 1)] if len(running) else np.zeros(n, np.int64)
            beyond = (offs >= self.base_offset) & (k >= len(lasts))
            problems += _beyond_the_log(beyond, offs, log_last)
            suspect = (offs < self.base_offset) | ((ts != expected_ts) & ~beyond)
            for i in np.nonzero(suspect)[0]:
                t, o = int(ts[i]), int(offs[i])
                if o < self.base_offset:
                    problems.append(f"entry {i}: offset {o} is below the base offset {self.base_offset}")
                    continue
                expected = int(running[int(k[i])])
                if t != expected:
                    problems.append(
                        f"entry {i}: timestamp {t} differs from the largest batch timestamp {expected} up to the "
                        f"batch holding offset {o}"
                    )
        if closed:
            seg_max = int(running[-1]) if len(running) else NO_TIMESTAMP
            if seg_max > NO_TIMESTAMP:
                if n == 0:
                    problems.append(
                        f"time index is empty but the segment's max timestamp is {seg_max} "
                        f"(the broker would fall back to the file's mtime)"
                    )
                elif int(ts[-1]) != seg_max and not beyond[-1]:  # else: already said, beyond the log
                    problems.append(
                        f"last entry has timestamp {int(ts[-1])}, not the segment's max timestamp {seg_max}"
                    )
        return problems

    def to_bytes(self) -> bytes:
        rows = np.empty(self.entries, dtype=self.DTYPE)
        rows["timestamp"] = self._cols.a
        rows["relative_offset"] = self._cols.b - self.base_offset
        return rows.tobytes()

    def __repr__(self) -> str:
        return f"TimeIndex(base_offset={self.base_offset}, entries={self.entries}, path={self.path!r})"


# ---------------------------------------------------------------------------------------
_ABORTED_TXN = struct.Struct(">hqqqq")


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    """One ``.txnindex`` entry (34 bytes): an aborted transaction whose ABORT marker is at
    ``last_offset`` (Kafka ``AbortedTxn.java``)."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int
    version: int = 0

    SIZE = 34

    def to_bytes(self) -> bytes:
        return _ABORTED_TXN.pack(
            self.version, self.producer_id, self.first_offset, self.last_offset, self.last_stable_offset
        )


class TransactionIndex:
    """``.txnindex``: aborted transactions of a segment, in strictly increasing ``last_offset``
    order (KAFKA_NOTES §2.4; Kafka ``TransactionIndex.java``).

    Not preallocated; the file may be missing (no aborted transactions). Reading takes
    whole 34-byte entries up to the file length and ignores a trailing partial entry.
    """

    ENTRY_SIZE = 34

    def __init__(self, base_offset: int, *, path: PathLike | None = None) -> None:
        self.base_offset = int(base_offset)
        self.path = _fspath(path)
        self._rows = np.empty(0, dtype=TXN_INDEX_DTYPE)
        self._n = 0
        self._file_length: int | None = None

    @classmethod
    def from_bytes(
        cls,
        data: bytes | bytearray | memoryview,
        base_offset: int,
        *,
        path: PathLike | None = None,
        strict: bool = True,
    ) -> TransactionIndex:
        """Decode a txn index. The version is checked the way Kafka's reader does it: only the
        *first byte* of the int16, as a signed byte, must not be > 0 (``AbortedTxn.version()``
        is ``buffer.get(0)``), so ``00 xx`` and ``80..ff xx`` are accepted. ``strict`` also runs
        ``sanity_check`` (each lastOffset >= base offset, the check a broker runs at load)."""
        idx = cls(base_offset, path=path)
        n = len(data) // cls.ENTRY_SIZE
        rows = np.frombuffer(data, dtype=TXN_INDEX_DTYPE, count=n).copy()
        first_byte = np.frombuffer(data, dtype=np.int8, count=n * cls.ENTRY_SIZE)[:: cls.ENTRY_SIZE] if n else []
        bad = np.nonzero(np.asarray(first_byte) > 0)[0]
        if len(bad):
            i = int(bad[0])
            raise CorruptIndexError(
                f"Unexpected aborted transaction version {int(first_byte[i])} in transaction index, "
                f"current version is 0",
                path=idx.path,
                position=i * cls.ENTRY_SIZE,
            )
        idx._rows, idx._n = rows, n
        idx._file_length = len(data)
        if strict:
            idx.sanity_check()
        return idx

    @classmethod
    def read(
        cls, path: PathLike, base_offset: int, *, missing_ok: bool = True, strict: bool = True
    ) -> TransactionIndex:
        """Read ``path``; a missing file is an empty index (Kafka creates it lazily)."""
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            if not missing_ok:
                raise
            return cls(base_offset, path=path)
        return cls.from_bytes(data, base_offset, path=path, strict=strict)

    @property
    def entries(self) -> int:
        return self._n

    def __len__(self) -> int:
        return self._n

    @property
    def size_in_bytes(self) -> int:
        return self._n * self.ENTRY_SIZE

    @property
    def last_offsets(self) -> np.ndarray:
        return self._rows["last_offset"][: self._n].astype(np.int64)

    @property
    def last_offset(self) -> int | None:
        return int(self._rows["last_offset"][self._n - 1]) if self._n else None

    def _txn(self, i: int) -> AbortedTxn:
        r = self._rows[i]
        return AbortedTxn(
            int(r["producer_id"]),
            int(r["first_offset"]),
            int(r["last_offset"]),
            int(r["last_stable_offset"]),
            int(r["version"]),
        )

    def all_aborted_txns(self) -> list[AbortedTxn]:
        return [self._txn(i) for i in range(self._n)]

    def append(self, txn: AbortedTxn) -> None:
        """Append in strictly increasing ``last_offset`` order (else ValueError, Kafka's
        IllegalArgumentException). Kafka only compares with what was appended since the
        index was opened; we compare with every entry, which is stricter and never wrong."""
        last = self.last_offset
        if last is not None and last >= txn.last_offset:
            raise ValueError(
                f"The last offset of appended transactions must increase sequentially, but {txn.last_offset} is not "
                f"greater than current last offset {last} of index {self.path}"
            )
        if self._n == len(self._rows):
            grown = np.zeros(max(8, 2 * len(self._rows)), dtype=TXN_INDEX_DTYPE)
            grown[: self._n] = self._rows[: self._n]
            self._rows = grown
        self._rows[self._n] = (txn.version, txn.producer_id, txn.first_offset, txn.last_offset, txn.last_stable_offset)
        self._n += 1

    def truncate_to(self, offset: int) -> None:
        """Remove the first entry with ``last_offset >= offset`` and everything after it."""
        hits = np.nonzero(self._rows["last_offset"][: self._n] >= offset)[0]
        if len(hits):
            self._n = int(hits[0])

    def reset(self) -> None:
        self._n = 0

    def collect_aborted_txns(self, fetch_offset: int, upper_bound_offset: int) -> tuple[list[AbortedTxn], bool]:
        """Aborted transactions overlapping ``[fetch_offset, upper_bound_offset)`` and whether the
        search is complete (Kafka ``collectAbortedTxns``).

        In file order: an entry is collected when ``last_offset >= fetch_offset`` and
        ``first_offset < upper_bound_offset``; the scan stops, complete, right after the first
        entry with ``last_stable_offset >= upper_bound_offset`` (that entry itself is collected
        if it qualifies). Otherwise the caller continues with the next segment's index.
        """
        rows = self._rows[: self._n]
        stop = np.nonzero(rows["last_stable_offset"] >= upper_bound_offset)[0]
        complete = bool(len(stop))
        end = int(stop[0]) + 1 if complete else self._n
        scope = rows[:end]
        hit = np.nonzero((scope["last_offset"] >= fetch_offset) & (scope["first_offset"] < upper_bound_offset))[0]
        return [self._txn(int(i)) for i in hit], complete

    def sanity_check(self) -> None:
        """Each entry's ``last_offset >= base_offset`` (``TransactionIndex.sanityCheck``, run when a
        broker loads a segment; a failure makes it recover the segment, §4)."""
        lasts = self._rows["last_offset"][: self._n]
        bad = np.nonzero(lasts < self.base_offset)[0]
        if len(bad):
            i = int(bad[0])
            raise CorruptIndexError(
                f"Last offset of aborted transaction {self._txn(i)} in index is less than start offset "
                f"{self.base_offset}",
                path=self.path,
                position=i * self.ENTRY_SIZE,
                offset=int(lasts[i]),
            )

    def to_bytes(self) -> bytes:
        return self._rows[: self._n].tobytes()

    def write_to(self, path: PathLike | None = None, *, fsync: bool = True) -> None:
        """Write the entries (a file only makes sense with entries; an empty one is legal, §4)."""
        target = _fspath(path) if path is not None else self.path
        if target is None:
            raise ValueError("no path to write the index to")
        files.write_file(target, self.to_bytes(), fsync=fsync)

    def __repr__(self) -> str:
        return f"TransactionIndex(base_offset={self.base_offset}, entries={self._n}, path={self.path!r})"
