"""Decode the records of many v2 batches at once, as columns.

A v2 record is a run of varints (``length, attributes, timestampDelta, offsetDelta,
keyLength, key, valueLength, value, headerCount, headers``), so record *i+1* starts where
record *i* ends: a sequential walk, done by the compiled core (``native/src/records.rs``)
in one pass over every record of every batch of a chunk, with Kafka's structural checks
(``DefaultRecord.readFrom``). The compiled core also decompresses a chunk's lz4 and zstd
sections, all into one buffer (``native/src/codecs.rs``); gzip and snappy sections are
decompressed here, through ``cleaner.records.compression``. The checks on whole batches
stay here.

The result never copies keys or values: it holds spans into one buffer (the log bytes
for uncompressed batches, the decompressed sections otherwise). The cleaner needs only
key spans, offsets, value nullness and timestamps; a rebuilt batch copies each kept
record's body (``offsetDelta`` onwards) unchanged.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from cleaner import _native
from cleaner.errors import CorruptRecordError
from cleaner.records.batch import RECORD_BATCH_OVERHEAD
from cleaner.records.compression import NATIVE_CODECS, codec_threads, decompress
from cleaner.records.record import Header, Record
from cleaner.records.scan import Batches
from cleaner.records.varint import decode_varint

MIN_RECORD_SIZE = 7  # length, attributes, timestampDelta, offsetDelta, keyLength, valueLength, headerCount



class RecordColumns:
    """The records of a set of v2 batches. Row order is batch order, then record order.

    ``batch`` indexes into ``batches`` (the v2 batches that were decoded, in order);
    positions (``start``, ``key_start``, ...) index into ``data``.
    """

    def __init__(self, batches: Batches, data: bytes | bytearray | memoryview, columns: dict[str, np.ndarray]) -> None:
        self.batches = batches
        self.data = data
        self.batch: np.ndarray = columns["batch"]
        self.start: np.ndarray = columns["start"]
        self.end: np.ndarray = columns["end"]
        self.timestamp_delta: np.ndarray = columns["timestamp_delta"]
        self.body_start: np.ndarray = columns["body_start"]
        self.offset_delta: np.ndarray = columns["offset_delta"]
        self.key_start: np.ndarray = columns["key_start"]
        self.key_length: np.ndarray = columns["key_length"]
        self.value_start: np.ndarray = columns["value_start"]
        self.value_length: np.ndarray = columns["value_length"]
        self.headers_count: np.ndarray = columns["headers_count"]
        self.headers_start: np.ndarray = columns["headers_start"]

    def __len__(self) -> int:
        return int(self.start.shape[0])

    @cached_property
    def offsets(self) -> np.ndarray:
        return self.batches.base_offsets[self.batch] + self.offset_delta

    @cached_property
    def timestamps(self) -> np.ndarray:
        """Record timestamps as readers see them: ``baseTimestamp + delta``, except in
        LogAppendTime batches where every record has the batch's maxTimestamp."""
        base = self.batches.headers["base_timestamp"][self.batch]
        ts = base + self.timestamp_delta
        log_append = self.batches.is_log_append_time[self.batch]
        if log_append.any():
            ts = np.where(log_append, self.batches.max_timestamps[self.batch], ts)
        return ts

    @cached_property
    def has_key(self) -> np.ndarray:
        return self.key_length >= 0

    @cached_property
    def is_tombstone(self) -> np.ndarray:
        return (self.value_length < 0) & self.has_key

    @cached_property
    def batch_record_starts(self) -> np.ndarray:
        """Row of each decoded batch's first record (len(batches) + 1 entries)."""
        counts = np.bincount(self.batch, minlength=len(self.batches))
        return np.concatenate(([0], np.cumsum(counts)))

    def key(self, i: int) -> bytes | None:
        n = int(self.key_length[i])
        if n < 0:
            return None
        s = int(self.key_start[i])
        return bytes(self.data[s : s + n])

    def value(self, i: int) -> bytes | None:
        n = int(self.value_length[i])
        if n < 0:
            return None
        s = int(self.value_start[i])
        return bytes(self.data[s : s + n])

    def headers(self, i: int) -> tuple[Header, ...]:
        out = []
        p = int(self.headers_start[i])
        for _ in range(int(self.headers_count[i])):
            klen, p = decode_varint(self.data, p)
            key = bytes(self.data[p : p + klen]).decode("utf-8", errors="replace")
            p += klen
            vlen, p = decode_varint(self.data, p)
            if vlen < 0:
                value = None
            else:
                value = bytes(self.data[p : p + vlen])
                p += vlen
            out.append((key, value))
        return tuple(out)

    def record(self, i: int) -> Record:
        return Record(int(self.offsets[i]), int(self.timestamps[i]), self.key(i), self.value(i), self.headers(i))

    def records(self) -> list[Record]:
        return [self.record(i) for i in range(len(self))]

    def key_spans(self, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(starts, ends) of the keys of ``rows`` (default: every keyed record), in ``data``."""
        if rows is None:
            rows = np.flatnonzero(self.has_key)
        starts = self.key_start[rows]
        return starts, starts + self.key_length[rows]


def decode_records(
    batches: Batches,
    *,
    max_decompressed_bytes: int | None = None,
) -> RecordColumns:
    """Decode every record of the v2 batches in ``batches`` (legacy entries are skipped;
    ``cleaner.records.legacy`` decodes those).

    Raises ``CorruptRecordError`` naming the file, the batch's position and the record's
    offset for the first structural violation (Kafka's ``DefaultRecord.readFrom`` and
    ``DefaultRecordBatch`` iterator checks).
    """
    if not batches.is_v2.all():
        batches = batches.select(batches.is_v2)
    counts = batches.records_counts
    # Kafka reads no records of a batch whose count is 0 and never looks at its section.
    compressed = (batches.compression != 0) & (counts > 0)
    if not compressed.any():
        data = batches.buffer
        sec_start = batches.positions + RECORD_BATCH_OVERHEAD
        sec_end = np.where(counts > 0, batches.positions + batches.sizes, sec_start)
    else:
        data, sec_start, sec_end = _decompress_sections(batches, compressed, max_decompressed_bytes)
    _check_counts(batches, counts, sec_start, sec_end, compressed)
    columns = _decode_columns(batches, data, sec_start, sec_end, counts, compressed)
    return RecordColumns(batches, data, columns)


def _decompress_sections(
    batches: Batches, compressed: np.ndarray, max_bytes: int | None
) -> tuple[bytes, np.ndarray, np.ndarray]:
    """Every batch's records section, decompressed where ``compressed``, in one buffer;
    each batch's (start, end) in it (empty for a batch of zero records, which Kafka never
    reads). lz4 and zstd: the compiled core, GIL released, possibly on several threads."""
    codecs = batches.compression.astype(np.int64)
    if not np.isin(codecs[compressed], tuple(NATIVE_CODECS)).all():
        return _decompress_sections_in_python(batches, compressed, max_bytes)
    positions = batches.positions.astype(np.int64)
    starts = positions + RECORD_BATCH_OVERHEAD
    ends = np.where(batches.records_counts != 0, np.maximum(positions + batches.sizes, starts), starts)
    data, sec_start, sec_end, problem = _native.decompress_sections(
        batches.buffer,
        starts,
        ends,
        np.where(compressed, codecs, 0),
        batches.magic.astype(np.int64),
        max_bytes,
        codec_threads(),
    )
    if problem is not None:
        b, reason, _ = problem
        raise _decompress_error(batches, b, reason)
    return data, sec_start, sec_end


def _decompress_sections_in_python(
    batches: Batches, compressed: np.ndarray, max_bytes: int | None
) -> tuple[bytes, np.ndarray, np.ndarray]:
    """``_decompress_sections`` for a chunk with gzip or snappy batches: one section at a
    time through ``compression.decompress`` (which calls the compiled core for lz4 and
    zstd), then joined."""
    view = memoryview(batches.buffer)
    pieces = []
    for i, (p, size, codec, magic) in enumerate(
        zip(
            batches.positions.tolist(),
            batches.sizes.tolist(),
            batches.compression.tolist(),
            batches.magic.tolist(),
            strict=True,
        )
    ):
        section = view[p + RECORD_BATCH_OVERHEAD : p + size]
        if batches.records_counts[i] == 0:
            pieces.append(b"")
            continue
        if not compressed[i]:
            pieces.append(section)
            continue
        try:
            pieces.append(decompress(codec, section, max_size=max_bytes, magic=magic))
        except CorruptRecordError as e:
            raise _decompress_error(batches, i, e.reason) from None
    lengths = np.fromiter((len(x) for x in pieces), dtype=np.int64, count=len(pieces))
    ends = np.cumsum(lengths)
    return b"".join(pieces), ends - lengths, ends


def _decompress_error(batches: Batches, b: int, reason: str) -> CorruptRecordError:
    """A section that cannot be decompressed: located at its batch."""
    return CorruptRecordError(
        f"cannot decompress batch: {reason}",
        path=batches.path,
        position=batches.base_position + int(batches.positions[b]),
        offset=int(batches.base_offsets[b]),
    )


def _error(
    batches: Batches, b: int, reason: str, compressed: np.ndarray, position: int | None, offset: int | None = None
) -> CorruptRecordError:
    """An error located at the record for uncompressed batches, at the batch otherwise."""
    batch_position = batches.base_position + int(batches.positions[b])
    if compressed[b] or position is None:
        where = batch_position
        if compressed[b]:
            reason = f"{reason} (in the decompressed records of the batch)"
    else:
        where = batches.base_position + position
    return CorruptRecordError(
        reason,
        path=batches.path,
        position=where,
        offset=int(batches.base_offsets[b]) if offset is None else offset,
    )


def _check_counts(
    batches: Batches, counts: np.ndarray, sec_start: np.ndarray, sec_end: np.ndarray, compressed: np.ndarray
) -> None:
    """A record takes at least 7 bytes, so the declared count bounds the work; a corrupt
    count must fail here, not drive a loop of two billion steps."""
    bad = (counts < 0) | (counts * MIN_RECORD_SIZE > sec_end - sec_start)
    if bad.any():
        b = int(np.flatnonzero(bad)[0])
        raise _error(
            batches,
            b,
            f"invalid record count {int(counts[b])} for {int(sec_end[b] - sec_start[b])} bytes of records",
            compressed,
            None,
        )


def _decode_columns(
    batches: Batches,
    data: bytes | bytearray | memoryview,
    sec_start: np.ndarray,
    sec_end: np.ndarray,
    counts: np.ndarray,
    compressed: np.ndarray,
) -> dict[str, np.ndarray]:
    """Every record field as a column, from the compiled core; its first structural
    problem becomes a ``CorruptRecordError`` at the record (uncompressed) or the batch."""
    if not isinstance(data, bytes):
        data = bytes(data)
    columns, problem = _native.decode_records(data, sec_start, sec_end, counts.astype(np.int64))
    if problem is not None:
        b, position, offset_delta, reason = problem
        offset = None if offset_delta is None else int(batches.base_offsets[b]) + offset_delta
        raise _error(batches, b, reason, compressed, position, offset)
    return columns
