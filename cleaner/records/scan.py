"""Find the batches in a buffer of log bytes and read all their headers at once.

This is Kafka's ``ByteBufferLogInputStream``/``FileLogInputStream`` in columnar form:
entry boundaries come from a short loop over entries (each costs one 12-byte read), then
every 61-byte header is gathered into one numpy array and decoded a field at a time.
Nothing here decodes records; a header-only scan (plus CRC) is all that segment loading,
index rebuilding, ``status`` and the observe mode need.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from cleaner import _native
from cleaner.errors import CorruptRecordError
from cleaner.records.batch import (
    ATTRIBUTES_OFFSET,
    HEADER_DTYPE,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    MIN_LEGACY_ENTRY_LENGTH,
    RECORD_BATCH_OVERHEAD,
    Attributes,
    BatchHeader,
)

_ENTRY_HEAD = struct.Struct(">qiib")  # offset, length, 4 bytes (v2: leader epoch, legacy: CRC), magic
_ENTRY_HEAD_GAP = struct.Struct(">qi")
NATIVE_HEADER_DTYPE = HEADER_DTYPE.newbyteorder("=")
_HEADER_SPAN = np.arange(RECORD_BATCH_OVERHEAD, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class ScanResult:
    batches: Batches
    end: int
    """Buffer position after the last complete entry."""
    next_entry_size: int | None
    """Size of the incomplete entry at ``end`` if its header was readable, else None.
    The cleaner grows its read buffer to this (``growBuffersOrFail``)."""


class Batches:
    """The complete entries of a buffer as columns.

    ``positions`` are buffer-relative; add ``base_position`` for positions in the file.
    Legacy (magic 0/1) entries have their header row filled from the decoded message
    (``cleaner.records.legacy``): base offset = first inner offset, timestamps, codec.
    """

    __slots__ = ("__dict__", "base_position", "buffer", "headers", "legacy", "path", "positions")

    def __init__(
        self,
        buffer: bytes | bytearray | memoryview,
        positions: np.ndarray,
        headers: np.ndarray,
        *,
        base_position: int = 0,
        path: str | None = None,
        legacy: dict[int, object] | None = None,
    ) -> None:
        self.buffer = buffer
        self.positions = positions
        self.headers = headers
        self.base_position = base_position
        self.path = path
        self.legacy = legacy or {}

    def __len__(self) -> int:
        return int(self.positions.shape[0])

    def header(self, i: int) -> BatchHeader:
        p = int(self.positions[i])
        if i in self.legacy:  # the row was filled from the decoded legacy message
            row = self.headers[i]
            return BatchHeader(*(int(row[name]) for name in HEADER_DTYPE.names), position=p + self.base_position)
        return BatchHeader.parse(self.buffer, p, file_position=p + self.base_position)

    def __iter__(self):
        for i in range(len(self)):
            yield self.header(i)

    def entry_bytes(self, i: int) -> memoryview:
        p = int(self.positions[i])
        return memoryview(self.buffer)[p : p + int(self.sizes[i])]

    def select(self, index: np.ndarray | slice) -> Batches:
        """A subset (boolean mask, index array or slice), sharing the buffer."""
        positions = self.positions[index]
        if self.legacy:
            kept = np.arange(len(self))[index]
            legacy = {j: self.legacy[int(i)] for j, i in enumerate(kept) if int(i) in self.legacy}
        else:
            legacy = None
        return Batches(
            self.buffer, positions, self.headers[index], base_position=self.base_position, path=self.path, legacy=legacy
        )

    # Columns, named after RecordBatch's accessors.
    @cached_property
    def file_positions(self) -> np.ndarray:
        return self.positions + self.base_position

    @cached_property
    def base_offsets(self) -> np.ndarray:
        return self.headers["base_offset"]

    @cached_property
    def sizes(self) -> np.ndarray:
        return self.headers["length"].astype(np.int64) + LOG_OVERHEAD

    @cached_property
    def last_offsets(self) -> np.ndarray:
        return self.headers["base_offset"] + self.headers["last_offset_delta"]

    @cached_property
    def next_offsets(self) -> np.ndarray:
        return self.last_offsets + 1

    @cached_property
    def magic(self) -> np.ndarray:
        return self.headers["magic"]

    @cached_property
    def attributes(self) -> np.ndarray:
        return self.headers["attributes"].astype(np.int64) & 0xFF

    @cached_property
    def compression(self) -> np.ndarray:
        return self.attributes & Attributes.COMPRESSION_MASK

    @cached_property
    def is_v2(self) -> np.ndarray:
        return self.magic >= 2

    @cached_property
    def is_control(self) -> np.ndarray:
        return self.is_v2 & ((self.attributes & Attributes.CONTROL) != 0)

    @cached_property
    def is_transactional(self) -> np.ndarray:
        return self.is_v2 & ((self.attributes & Attributes.TRANSACTIONAL) != 0)

    @cached_property
    def has_delete_horizon(self) -> np.ndarray:
        return self.is_v2 & ((self.attributes & Attributes.DELETE_HORIZON) != 0)

    @cached_property
    def is_log_append_time(self) -> np.ndarray:
        return (self.magic >= 1) & ((self.attributes & Attributes.LOG_APPEND_TIME) != 0)

    @cached_property
    def max_timestamps(self) -> np.ndarray:
        return self.headers["max_timestamp"]

    @cached_property
    def records_counts(self) -> np.ndarray:
        return self.headers["records_count"].astype(np.int64)

    @cached_property
    def producer_ids(self) -> np.ndarray:
        return self.headers["producer_id"]

    @property
    def total_bytes(self) -> int:
        return int(self.sizes.sum())

    def verify_checksums(self) -> list[CorruptRecordError]:
        """CRC-32C of every v2 batch (CRC-32 of every legacy message); one error per bad entry.

        The cleaner itself never verifies CRCs (neither does Kafka's); segment recovery,
        ``dump --verify`` and the checks after writing a cleaned segment do.
        """
        problems = []
        v2 = np.flatnonzero(self.magic >= 2)
        computed_v2 = _native.crc32c_spans(
            self.buffer, self.positions[v2] + ATTRIBUTES_OFFSET, self.positions[v2] + self.sizes[v2]
        )
        computed_by_entry = dict(zip(v2.tolist(), computed_v2.tolist(), strict=True))
        view = memoryview(self.buffer)
        for i, (p, size, stored) in enumerate(
            zip(self.positions.tolist(), self.sizes.tolist(), self.headers["crc"].tolist(), strict=True)
        ):
            computed = computed_by_entry.get(i)
            if computed is None:  # a legacy message: CRC-32 from its magic byte on
                stored = struct.unpack_from(">I", view, p + LOG_OVERHEAD)[0]
                computed = zlib.crc32(view[p + MAGIC_OFFSET : p + size])
            if computed != stored:
                problems.append(
                    CorruptRecordError(
                        f"record is corrupt (stored crc = {stored}, computed crc = {computed})",
                        path=self.path,
                        position=self.base_position + p,
                        offset=int(self.base_offsets[i]),
                    )
                )
        return problems


def _gather_headers(raw: np.ndarray, positions: np.ndarray) -> np.ndarray:
    if positions.shape[0] == 0:
        return np.zeros(0, dtype=NATIVE_HEADER_DTYPE)
    rows = raw.take(positions[:, None] + _HEADER_SPAN, mode="clip")
    return rows.view(HEADER_DTYPE).reshape(-1).astype(NATIVE_HEADER_DTYPE)


def batches_at(
    buffer: bytes | bytearray | memoryview, positions: np.ndarray, *, path: str | None = None
) -> Batches:
    """v2 batches at known ``positions`` of ``buffer`` whose headers are there, though their
    records need not be (a header-only read): what the header columns and ``header`` need."""
    return Batches(buffer, positions, _gather_headers(np.frombuffer(buffer, dtype=np.uint8), positions), path=path)


def scan_batches(
    buffer: bytes | bytearray | memoryview,
    start: int = 0,
    end: int | None = None,
    *,
    base_position: int = 0,
    path: str | os.PathLike[str] | None = None,
    max_batches: int | None = None,
) -> ScanResult:
    """Find the complete entries in ``buffer[start:end]``.

    The structural checks are Kafka's (``FileLogInputStream.nextBatch``): an entry whose
    length is below the legacy minimum (14) or whose magic is not 0..2 is corrupt, and so
    is a v2 batch shorter than its 61-byte header. A truncated entry at the end is not an
    error here: the caller decides (a segment's tail after a crash, or a read buffer that
    must grow).
    """
    path_str = os.fspath(path) if path is not None else None
    end = len(buffer) if end is None else end
    positions: list[int] = []
    legacy_rows: list[int] = []
    p = start
    next_entry_size = None
    unpack_head = _ENTRY_HEAD.unpack_from
    remaining_batches = max_batches if max_batches is not None else -1
    while end - p >= LOG_OVERHEAD and remaining_batches != 0:
        if end - p < MAGIC_OFFSET + 1:
            base_offset, length = _ENTRY_HEAD_GAP.unpack_from(buffer, p)
            magic = None
        else:
            base_offset, length, _, magic = unpack_head(buffer, p)
        if length < MIN_LEGACY_ENTRY_LENGTH:
            raise CorruptRecordError(
                f"record size {length} is smaller than the minimum record overhead ({MIN_LEGACY_ENTRY_LENGTH})",
                path=path_str,
                position=base_position + p,
                offset=base_offset,
            )
        size = length + LOG_OVERHEAD
        if magic is None:
            next_entry_size = size
            break
        if not 0 <= magic <= 2:
            raise CorruptRecordError(
                f"invalid magic byte {magic}", path=path_str, position=base_position + p, offset=base_offset
            )
        if magic >= 2 and size < RECORD_BATCH_OVERHEAD:
            raise CorruptRecordError(
                f"record batch is corrupt (the size {size} is smaller than the minimum allowed overhead "
                f"{RECORD_BATCH_OVERHEAD})",
                path=path_str,
                position=base_position + p,
                offset=base_offset,
            )
        if end - p < size:
            next_entry_size = size
            break
        if magic < 2:
            legacy_rows.append(len(positions))
        positions.append(p)
        p += size
        remaining_batches -= 1
    pos = np.fromiter(positions, dtype=np.int64, count=len(positions))
    raw = np.frombuffer(buffer, dtype=np.uint8)
    headers = _gather_headers(raw, pos)
    legacy = _fill_legacy_rows(buffer, pos, headers, legacy_rows, base_position, path_str) if legacy_rows else None
    return ScanResult(
        Batches(buffer, pos, headers, base_position=base_position, path=path_str, legacy=legacy), p, next_entry_size
    )


def _fill_legacy_rows(
    buffer: bytes | bytearray | memoryview,
    positions: np.ndarray,
    headers: np.ndarray,
    rows: list[int],
    base_position: int,
    path: str | None,
) -> dict[int, object]:
    """Legacy entries share only offset, length and magic with the v2 header layout;
    decode them and fill their rows so the columns mean the same for every entry."""
    from cleaner.records.legacy import decode_legacy_entry

    decoded = {}
    for i in rows:
        p = int(positions[i])
        try:
            entry = decode_legacy_entry(buffer, p)
            records = entry.records()
        except CorruptRecordError as e:
            raise e.located(path=path, base_position=base_position) from None
        first = records[0].offset if records else entry.offset
        row = headers[i]
        row["base_offset"] = first
        row["last_offset_delta"] = entry.offset - first
        row["partition_leader_epoch"] = -1
        row["crc"] = entry.crc
        row["attributes"] = entry.attributes
        row["base_timestamp"] = records[0].timestamp if records else entry.timestamp
        row["max_timestamp"] = max((r.timestamp for r in records), default=entry.timestamp)
        if entry.magic >= 1 and entry.attributes & Attributes.LOG_APPEND_TIME:
            row["max_timestamp"] = entry.timestamp
        row["producer_id"] = -1
        row["producer_epoch"] = -1
        row["base_sequence"] = -1
        row["records_count"] = len(records)
        decoded[i] = entry
    return decoded
