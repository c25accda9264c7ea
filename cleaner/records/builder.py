"""Write v2 record batches (Kafka's ``MemoryRecordsBuilder`` and the cleaner's re-encoding).

Three ways a batch is produced:

- ``build_batch``: from ``Record`` objects (the data generator, tests, markers);
- ``rebuild_batch``: from the decoded columns of an existing batch and the rows to keep,
  following the cleaner's exact re-encoding rules (KAFKA_NOTES §9.8): original base offset
  and lastOffsetDelta, original codec, producer fields and leader epoch, each kept
  record's body copied byte for byte, timestamps re-based on the delete horizon;
- ``build_empty_batch``: the 61-byte header Kafka keeps for RETAIN_EMPTY batches.

Output is deterministic (same input, same bytes), which the Spark jobs rely on to produce
results byte-identical to the single-node engine.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence

import numpy as np

from cleaner import _native
from cleaner.records.batch import (
    ATTRIBUTES_OFFSET,
    CURRENT_MAGIC,
    HEADER,
    INT32_MAX,
    LOG_OVERHEAD,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    NO_TIMESTAMP,
    RECORD_BATCH_OVERHEAD,
    Attributes,
    BatchHeader,
    TimestampType,
)
from cleaner.records.columns import RecordColumns
from cleaner.records.compression import NATIVE_CODECS, CompressionType, codec_threads, compress
from cleaner.records.control import ControlRecordType, EndTxnMarker
from cleaner.records.record import Header, Record
from cleaner.records.varint import encode_varint

_CRC = struct.Struct(">I")
_NATIVE_OR_NONE = np.array([0, *sorted(NATIVE_CODECS)], dtype=np.int64)


def encode_record(
    offset_delta: int, timestamp_delta: int, key: bytes | None, value: bytes | None, headers: Sequence[Header] = ()
) -> bytes:
    """One record (``DefaultRecord.writeTo``): length varint, then the body."""
    body = bytearray(b"\x00")  # attributes: no bits defined
    body += encode_varint(timestamp_delta)
    body += encode_varint(offset_delta)
    if key is None:
        body += b"\x01"  # varint -1
    else:
        body += encode_varint(len(key))
        body += key
    if value is None:
        body += b"\x01"
    else:
        body += encode_varint(len(value))
        body += value
    body += encode_varint(len(headers))
    for hkey, hvalue in headers:
        hk = hkey.encode("utf-8")
        body += encode_varint(len(hk))
        body += hk
        if hvalue is None:
            body += b"\x01"
        else:
            body += encode_varint(len(hvalue))
            body += hvalue
    return encode_varint(len(body)) + bytes(body)


def assemble_batch(
    *,
    base_offset: int,
    last_offset_delta: int,
    attributes: int,
    base_timestamp: int,
    max_timestamp: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    records_count: int,
    records: bytes | bytearray | memoryview,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
) -> bytes:
    """Header + (compressed) records section, with the CRC-32C over attributes..end."""
    codec = attributes & Attributes.COMPRESSION_MASK
    if records_count == 0:
        # A batch without records has nothing to compress; like Kafka's empty headers it
        # says so (some readers decompress before they count, and would choke).
        attributes &= ~Attributes.COMPRESSION_MASK
        codec = CompressionType.NONE
    section = compress(codec, records) if codec != CompressionType.NONE else bytes(records)
    length = RECORD_BATCH_OVERHEAD - LOG_OVERHEAD + len(section)
    header = bytearray(
        HEADER.pack(
            base_offset,
            length,
            partition_leader_epoch,
            CURRENT_MAGIC,
            0,
            attributes,
            last_offset_delta,
            base_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            records_count,
        )
    )
    crc = _native.crc32c(section, _native.crc32c(header[ATTRIBUTES_OFFSET:]))
    _CRC.pack_into(header, 17, crc)
    return bytes(header) + section


def _attributes(
    compression: int, timestamp_type: TimestampType, is_transactional: bool, is_control: bool, has_horizon: bool
) -> int:
    attributes = int(compression) & Attributes.COMPRESSION_MASK
    if timestamp_type == TimestampType.LOG_APPEND_TIME:
        attributes |= Attributes.LOG_APPEND_TIME
    if is_transactional:
        attributes |= Attributes.TRANSACTIONAL
    if is_control:
        attributes |= Attributes.CONTROL
    if has_horizon:
        attributes |= Attributes.DELETE_HORIZON
    return attributes


def build_batch(
    records: Sequence[Record],
    *,
    base_offset: int | None = None,
    compression: int = CompressionType.NONE,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    is_transactional: bool = False,
    is_control: bool = False,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    delete_horizon_ms: int | None = None,
    last_offset_delta: int | None = None,
    max_timestamp: int | None = None,
) -> bytes:
    """A v2 batch holding ``records`` (with their absolute offsets and timestamps).

    ``base_offset`` defaults to the first record's offset; ``last_offset_delta`` to the
    last record's; ``max_timestamp`` to the largest record timestamp (pass the broker's
    append time for LogAppendTime batches). The same checks as Kafka's builder apply:
    offsets strictly increasing, deltas within int32, timestamps >= 0 or -1.
    """
    if base_offset is None:
        if not records:
            raise ValueError("an empty batch needs an explicit base_offset")
        base_offset = records[0].offset
    previous = base_offset - 1
    for r in records:
        if r.offset <= previous:
            raise ValueError(f"offsets must be strictly increasing (got {r.offset} after {previous})")
        if r.offset - base_offset > INT32_MAX:
            raise ValueError(f"offset {r.offset} is too far from base offset {base_offset}")
        if r.timestamp < 0 and r.timestamp != NO_TIMESTAMP:
            raise ValueError(f"invalid negative timestamp {r.timestamp}")
        previous = r.offset
    if last_offset_delta is None:
        last_offset_delta = records[-1].offset - base_offset if records else 0
    if records and records[-1].offset - base_offset > last_offset_delta:
        raise ValueError("last_offset_delta is below the last record's offset")
    if delete_horizon_ms is not None:
        base_timestamp = delete_horizon_ms
    else:
        base_timestamp = records[0].timestamp if records else NO_TIMESTAMP
    if max_timestamp is None:
        max_timestamp = max((r.timestamp for r in records), default=NO_TIMESTAMP)
    body = b"".join(
        encode_record(r.offset - base_offset, r.timestamp - base_timestamp, r.key, r.value, r.headers) for r in records
    )
    return assemble_batch(
        base_offset=base_offset,
        last_offset_delta=last_offset_delta,
        attributes=_attributes(
            compression, timestamp_type, is_transactional, is_control, delete_horizon_ms is not None
        ),
        base_timestamp=base_timestamp,
        max_timestamp=max_timestamp,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        records_count=len(records),
        records=body,
        partition_leader_epoch=partition_leader_epoch,
    )


def build_control_batch(
    marker: ControlRecordType,
    *,
    offset: int,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
    timestamp: int,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
) -> bytes:
    """A transaction marker batch as a partition leader writes it (78 bytes)."""
    if marker not in (ControlRecordType.ABORT, ControlRecordType.COMMIT):
        raise ValueError(f"not an end-transaction marker: {marker!r}")
    record = Record(offset, timestamp, marker.key_bytes(), EndTxnMarker(marker, coordinator_epoch).value_bytes())
    return build_batch(
        [record],
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        is_transactional=True,
        is_control=True,
        partition_leader_epoch=partition_leader_epoch,
    )


def build_empty_batch(header: BatchHeader) -> bytes:
    """The header Kafka keeps when a batch must stay but none of its records do
    (RETAIN_EMPTY, ``DefaultRecordBatch.writeEmptyHeader``): original offsets, producer
    fields, leader epoch and maxTimestamp; no compression, no delete horizon, base
    timestamp -1, zero records."""
    timestamp_type = (
        TimestampType.LOG_APPEND_TIME if header.attributes & Attributes.LOG_APPEND_TIME else TimestampType.CREATE_TIME
    )
    attributes = _attributes(CompressionType.NONE, timestamp_type, header.is_transactional, header.is_control, False)
    return assemble_batch(
        base_offset=header.base_offset,
        last_offset_delta=header.last_offset_delta,
        attributes=attributes,
        base_timestamp=NO_TIMESTAMP,
        max_timestamp=header.max_timestamp,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        records_count=0,
        records=b"",
        partition_leader_epoch=header.partition_leader_epoch,
    )


def rebuild_batch(columns: RecordColumns, batch: int, rows: np.ndarray, *, delete_horizon_ms: int | None) -> bytes:
    """Re-encode v2 batch ``batch`` of ``columns`` keeping only ``rows`` (see ``rebuild_batches``)."""
    horizon = -1 if delete_horizon_ms is None else delete_horizon_ms
    return rebuild_batches(columns, np.array([batch]), np.asarray(rows, dtype=np.int64), np.array([horizon]))[0]


def rebuild_batches(
    columns: RecordColumns, batches: np.ndarray, rows: np.ndarray, delete_horizons_ms: np.ndarray
) -> list[bytes]:
    """Re-encode several v2 batches of ``columns`` at once, each keeping only its rows
    among ``rows`` (ascending record rows of those batches). KAFKA_NOTES §9.8:

    - base offset and lastOffsetDelta stay (a consumer steps past removed tail records by
      the batch's last offset), as do codec, timestamp type, transactional and control
      flags, producer id/epoch/base sequence and partition leader epoch;
    - base timestamp = the delete horizon if any (``delete_horizons_ms`` >= 0), else the
      first kept record's timestamp; every record's timestampDelta is re-based on it so
      readers see unchanged timestamps; maxTimestamp = max of the kept timestamps
      (CreateTime) or the original (LogAppendTime, where records read as the batch's
      maxTimestamp);
    - each kept record's body (offsetDelta .. headers) is copied byte for byte.

    All records of all the batches are re-encoded in one vectorised pass; only the
    headers, compression and CRCs are per batch.
    """
    headers = columns.batches
    batches = np.asarray(batches, dtype=np.int64)
    rows = np.asarray(rows, dtype=np.int64)
    horizons = np.asarray(delete_horizons_ms, dtype=np.int64)
    row_batch = columns.batch[rows]
    # Where each batch's kept rows start in ``rows`` (rows are grouped by batch, ascending).
    first = np.searchsorted(row_batch, batches, side="left")
    last = np.searchsorted(row_batch, batches, side="right")
    counts = last - first
    timestamps = columns.timestamps[rows]
    has_rows = counts > 0
    first_ts = np.full(batches.size, NO_TIMESTAMP, dtype=np.int64)
    first_ts[has_rows] = timestamps[first[has_rows]]
    base_ts = np.where(horizons >= 0, horizons, first_ts)
    deltas = timestamps - np.repeat(base_ts, counts)
    section, record_ends = _reencode_records(columns, rows, deltas)
    section_bounds = np.concatenate(([0], record_ends))
    head = headers.headers[batches]
    attrs = head["attributes"].astype(np.int64)
    log_append = (attrs & Attributes.LOG_APPEND_TIME) != 0
    max_ts = np.full(batches.size, NO_TIMESTAMP, dtype=np.int64)
    if rows.size:
        starts = first[has_rows]
        max_ts[has_rows] = np.maximum.reduceat(timestamps, starts)
    max_ts = np.where(log_append, headers.max_timestamps[batches], max_ts)
    # Codec, timestamp type, transactional and control flags stay; the horizon flag follows
    # the horizon. A batch left without records is written without a codec (nothing to
    # compress; like Kafka's empty headers it says so).
    kept_bits = Attributes.COMPRESSION_MASK | Attributes.LOG_APPEND_TIME | Attributes.TRANSACTIONAL | Attributes.CONTROL
    attrs = (attrs & kept_bits) | np.where(horizons >= 0, Attributes.DELETE_HORIZON, 0)
    attrs = np.where(counts == 0, attrs & ~Attributes.COMPRESSION_MASK, attrs)
    lo, hi = section_bounds[first], section_bounds[last]
    codecs = attrs & Attributes.COMPRESSION_MASK
    if not ((codecs != 0).any() or (batches.size and (lo[1:] != hi[:-1]).any())):
        bounds = np.concatenate((lo, hi[-1:])) if batches.size else np.zeros(1, dtype=np.int64)
    elif np.isin(codecs, _NATIVE_OR_NONE).all():
        # lz4, zstd and stored sections: the compiled core, into one buffer, GIL released.
        magics = np.full(batches.size, CURRENT_MAGIC, dtype=np.int64)
        section, bounds = _native.compress_sections(section, lo, hi, codecs.astype(np.int64), magics, codec_threads())
    else:
        view = memoryview(section)
        pieces = [
            compress(int(codec), view[a:b]) if codec else view[a:b]
            for codec, a, b in zip(codecs.tolist(), lo.tolist(), hi.tolist(), strict=True)
        ]
        lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
        section = b"".join(pieces)
        bounds = np.concatenate(([0], np.cumsum(lengths)))
    out, ends = _native.assemble_batches(
        head["base_offset"].astype(np.int64),
        head["last_offset_delta"].astype(np.int32),
        head["partition_leader_epoch"].astype(np.int32),
        attrs.astype(np.int16),
        base_ts.astype(np.int64),
        max_ts.astype(np.int64),
        head["producer_id"].astype(np.int64),
        head["producer_epoch"].astype(np.int16),
        head["base_sequence"].astype(np.int32),
        counts.astype(np.int32),
        section,
        bounds.astype(np.int64),
    )
    view = memoryview(out)
    return [bytes(view[a:b]) for a, b in itertools.pairwise([0, *ends.tolist()])]


def ragged_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + n)`` for each (s, n), without a Python loop."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    shift = np.repeat(np.asarray(starts, dtype=np.int64) - (ends - lengths), lengths)
    return np.arange(total, dtype=np.int64) + shift


def _reencode_records(columns: RecordColumns, rows: np.ndarray, deltas: np.ndarray) -> tuple[bytes, np.ndarray]:
    """The ``rows``, each as ``length | attributes 0 | timestampDelta | body`` (the body
    copied byte for byte), concatenated; and where each record ends in the result."""
    data = columns.data if isinstance(columns.data, bytes) else bytes(columns.data)
    return _native.reencode_records(
        data, columns.body_start[rows], columns.end[rows], np.asarray(deltas, dtype=np.int64)
    )
