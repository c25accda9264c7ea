"""Encode the records of many v2 batches at once (the data generator's hot path).

``builder.build_batch`` encodes one ``Record`` at a time, which is right for markers, tests
and tools but costs a few microseconds of Python per record. Here every record field is a
numpy column over all the records of many batches:

1. the varint fields (length, timestampDelta, offsetDelta, keyLength, valueLength) are
   encoded a column at a time (``encode_varints``);
2. each record's *prefix* (``length | attributes | timestampDelta | offsetDelta | keyLength
   | key | valueLength``) is written a field and a byte column at a time: byte k of a field
   goes to ``record start + bytes of the earlier fields + k`` for every record at once, so
   the cost is a few scatters of n elements per field, never a loop over records;
3. values are gathered from their source the same way, or, on the fast path, are whatever
   a *background* pattern holds at the value's position in the output: the output starts
   as the pattern tiled (one memcpy) and only the prefixes and the trailing header count
   are written over it. That is what makes hundreds of MB/s possible in numpy: per record,
   only the ~20 prefix bytes are touched individually;
4. the records are cut into per-batch sections, and each batch gets its header,
   compression and CRC from ``builder.assemble_batch`` (one Python call per batch, never
   per record).

The bytes are exactly those ``build_batch`` writes for the same records (tests check this
for every codec). Records carry no headers (header count 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from cleaner.records.batch import (
    INT32_MAX,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    NO_TIMESTAMP,
    Attributes,
    TimestampType,
)
from cleaner.records.builder import assemble_batch, ragged_ranges
from cleaner.records.compression import CompressionType
from cleaner.records.varint import encode_varints

__all__ = ["INLINE_KEY_LIMIT", "Spans", "build_batches", "encode_records"]

INLINE_KEY_LIMIT = 64
"""Keys up to this many bytes are written a byte column at a time with the other prefix
fields (at most this many n-element scatters); when a key is longer, all keys are gathered
with one ragged copy instead, so one long key does not cost a scatter per byte of it."""

ArrayLike = np.ndarray | Sequence[int] | int


@dataclass(frozen=True, slots=True)
class Spans:
    """Byte strings (keys or values) as spans of one source buffer; length -1 = null.

    ``matrix`` optionally holds the same bytes as a fixed-width ``(n, width)`` matrix (row i
    = string i, left-aligned), which saves the gather when every string has one width.
    """

    source: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    matrix: np.ndarray | None = None

    @classmethod
    def of(cls, items: Sequence[bytes | None]) -> Spans:
        """Spans over the concatenation of ``items`` (tools and tests; one Python step per item)."""
        lengths = np.fromiter((-1 if b is None else len(b) for b in items), dtype=np.int64, count=len(items))
        sizes = np.maximum(lengths, 0)
        starts = np.cumsum(sizes) - sizes
        source = np.frombuffer(b"".join(b for b in items if b), dtype=np.uint8)
        return cls(source, starts, lengths)

    @classmethod
    def from_matrix(cls, matrix: np.ndarray, lengths: np.ndarray | None = None) -> Spans:
        """Row i of the uint8 ``matrix`` is string i (its first ``lengths[i]`` bytes; all of
        them by default; -1 = null)."""
        matrix = np.ascontiguousarray(matrix, dtype=np.uint8)
        n, width = matrix.shape
        if lengths is None:
            lengths = np.full(n, width, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        if lengths.shape != (n,) or (lengths > width).any():
            raise ValueError("lengths must give one length <= the matrix width per row")
        return cls(matrix.reshape(-1), np.arange(n, dtype=np.int64) * width, lengths, matrix)

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def max_length(self) -> int:
        return max(int(self.lengths.max()), 0) if len(self) else 0

    def as_matrix(self, width: int) -> np.ndarray:
        """``(n, width)`` uint8: row i starts with string i (bytes after it are unspecified)."""
        n = len(self)
        if self.matrix is not None and self.matrix.shape[1] >= width:
            return self.matrix[:, :width]
        if width == 0 or n == 0:
            return np.zeros((n, width), dtype=np.uint8)
        padded = np.concatenate((np.asarray(self.source, dtype=np.uint8), np.zeros(width, dtype=np.uint8)))
        starts = np.where(self.lengths > 0, self.starts, 0)
        return sliding_window_view(padded, width)[starts]

    def gather(self) -> np.ndarray:
        """The non-null strings back to back."""
        sizes = np.maximum(self.lengths, 0)
        return np.asarray(self.source, dtype=np.uint8)[ragged_ranges(self.starts, sizes)]


def _scatter_fields(out: np.ndarray, at: np.ndarray, fields: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Write, for each row i, the first ``sizes[i]`` bytes of each field's matrix row, one
    field after the other, at ``out[at[i]:]``. Returns the bytes written per row.

    Works a byte column at a time: column k of a field goes to ``position + k`` of every
    row that has more than k bytes of it (all rows, for k = 0 and for fixed-width fields),
    so a field costs a few n-element scatters, whatever the number of rows.
    """
    position = np.array(at, dtype=np.int64)
    for matrix, sizes in fields:
        if position.shape[0] == 0:
            break
        width, shortest = int(sizes.max()), int(sizes.min())
        for k in range(width):
            if k < shortest:
                out[position + k] = matrix[:, k]
            else:
                rows = np.flatnonzero(sizes > k)
                out[position[rows] + k] = matrix[rows, k]
        position += sizes
    return position - at


def encode_records(
    offset_deltas: ArrayLike,
    timestamp_deltas: ArrayLike,
    keys: Spans,
    values: Spans | ArrayLike,
    *,
    background: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Records (``DefaultRecord`` layout, no headers) back to back.

    ``values`` is either ``Spans`` or just the value lengths (-1 = null); with lengths only,
    a value's bytes are those of ``background`` (a uint8 pattern, tiled) at the value's
    position in the output, which costs nothing per byte.

    Returns ``(buffer, ends)``: the uint8 output and the end position of each record.
    """
    offset_deltas = np.asarray(offset_deltas, dtype=np.int64)
    timestamp_deltas = np.asarray(timestamp_deltas, dtype=np.int64)
    n = offset_deltas.shape[0]
    if timestamp_deltas.shape != (n,) or len(keys) != n:
        raise ValueError("every record column needs one entry per record")
    value_spans = values if isinstance(values, Spans) else None
    value_lengths = values.lengths if isinstance(values, Spans) else np.asarray(values, dtype=np.int64)
    if value_lengths.shape != (n,):
        raise ValueError("every record column needs one entry per record")
    if value_spans is None and background is None and (value_lengths > 0).any():
        raise ValueError("value lengths without value bytes need a background pattern")

    key_lengths = np.asarray(keys.lengths, dtype=np.int64)
    key_bytes = np.maximum(key_lengths, 0)
    value_bytes = np.maximum(value_lengths, 0)
    ts_v, ts_n = encode_varints(timestamp_deltas)
    off_v, off_n = encode_varints(offset_deltas)
    klen_v, klen_n = encode_varints(key_lengths)
    vlen_v, vlen_n = encode_varints(value_lengths)
    ones = np.ones(n, dtype=np.int64)
    # attributes (1) + fields + header count (1)
    body = 1 + ts_n + off_n + klen_n + key_bytes + vlen_n + value_bytes + 1
    len_v, len_n = encode_varints(body)
    sizes = len_n + body
    ends = np.cumsum(sizes)
    starts = ends - sizes
    total = int(ends[-1]) if n else 0

    if background is not None and total:
        pattern = np.asarray(background, dtype=np.uint8).reshape(-1)
        if pattern.size == 0:
            raise ValueError("the background pattern is empty")
        out = np.resize(pattern, total) if pattern.size < total else pattern[:total].copy()
    else:
        out = np.zeros(total, dtype=np.uint8)

    attributes = (np.zeros((n, 1), dtype=np.uint8), ones)
    head = [(len_v, len_n), attributes, (ts_v, ts_n), (off_v, off_n), (klen_v, klen_n)]
    key_width = keys.max_length
    if key_width <= INLINE_KEY_LIMIT:
        prefix = _scatter_fields(out, starts, [*head, (keys.as_matrix(key_width), key_bytes), (vlen_v, vlen_n)])
    else:
        head_len = _scatter_fields(out, starts, head)
        out[ragged_ranges(starts + head_len, key_bytes)] = keys.gather()
        prefix = head_len + key_bytes
        prefix += _scatter_fields(out, starts + prefix, [(vlen_v, vlen_n)])
    if value_spans is not None:
        out[ragged_ranges(starts + prefix, value_bytes)] = value_spans.gather()
    if n:
        out[ends - 1] = 0  # header count
    return out, ends


def _per_batch(value: ArrayLike, m: int, name: str) -> np.ndarray:
    arr = np.asarray(value, dtype=np.int64)
    if arr.ndim == 0:
        return np.full(m, int(arr), dtype=np.int64)
    if arr.shape != (m,):
        raise ValueError(f"{name} needs one value per batch ({m}), got shape {arr.shape}")
    return arr


def build_batches(
    counts: ArrayLike,
    offsets: ArrayLike,
    timestamps: ArrayLike,
    keys: Spans,
    values: Spans | ArrayLike,
    *,
    background: np.ndarray | None = None,
    base_offsets: ArrayLike | None = None,
    compression: ArrayLike = CompressionType.NONE,
    timestamp_type: ArrayLike = TimestampType.CREATE_TIME,
    producer_ids: ArrayLike = NO_PRODUCER_ID,
    producer_epochs: ArrayLike = NO_PRODUCER_EPOCH,
    base_sequences: ArrayLike = NO_SEQUENCE,
    is_transactional: ArrayLike = False,
    partition_leader_epoch: ArrayLike = NO_PARTITION_LEADER_EPOCH,
    max_timestamps: ArrayLike | None = None,
    last_offset_deltas: ArrayLike | None = None,
) -> list[bytes]:
    """Many data batches at once: batch b holds the next ``counts[b]`` records.

    Record columns (``offsets``, ``timestamps`` absolute; ``keys``; ``values`` as in
    ``encode_records``) run over all batches. Batch parameters are scalars or one value per
    batch and mean what ``build_batch``'s do: ``base_offsets`` default to each batch's first
    record offset, ``max_timestamps`` to the largest record timestamp (give the broker's
    append time for LogAppendTime), ``last_offset_deltas`` to the last record's delta. The
    same checks apply (offsets strictly increasing from the base offset, deltas within
    int32, timestamps >= 0 or -1). Returns one ``bytes`` per batch, equal to what
    ``build_batch`` returns for the same records and parameters.
    """
    counts = np.asarray(counts, dtype=np.int64)
    offsets = np.asarray(offsets, dtype=np.int64)
    timestamps = np.asarray(timestamps, dtype=np.int64)
    m = counts.shape[0]
    n = int(counts.sum())
    if (counts < 0).any():
        raise ValueError("record counts cannot be negative")
    if offsets.shape != (n,) or timestamps.shape != (n,):
        raise ValueError(f"offsets and timestamps need one entry per record ({n})")
    first = np.cumsum(counts) - counts
    nonempty = counts > 0
    batch_of = np.repeat(np.arange(m, dtype=np.int64), counts)

    if base_offsets is None:
        if not nonempty.all():
            raise ValueError("an empty batch needs an explicit base_offset")
        bases = offsets[first] if m else np.zeros(0, dtype=np.int64)
    else:
        bases = _per_batch(base_offsets, m, "base_offsets")
    offset_deltas = offsets - bases[batch_of]
    previous = np.where(np.arange(n) == first[batch_of], -1, np.concatenate(([0], offset_deltas[:-1])))
    bad = np.flatnonzero(offset_deltas <= previous)
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"offsets must be strictly increasing (got {int(offsets[i])} after {int(bases[batch_of[i]] + previous[i])})"
        )
    if (offset_deltas > INT32_MAX).any():
        i = int(np.flatnonzero(offset_deltas > INT32_MAX)[0])
        raise ValueError(f"offset {int(offsets[i])} is too far from base offset {int(bases[batch_of[i]])}")
    if ((timestamps < 0) & (timestamps != NO_TIMESTAMP)).any():
        i = int(np.flatnonzero((timestamps < 0) & (timestamps != NO_TIMESTAMP))[0])
        raise ValueError(f"invalid negative timestamp {int(timestamps[i])}")

    last_record = first + counts - 1
    safe_first = np.minimum(first, max(n - 1, 0))
    safe_last = np.maximum(last_record, 0)
    if n:
        base_ts = np.where(nonempty, timestamps[safe_first], NO_TIMESTAMP)
        natural_last_delta = np.where(nonempty, offset_deltas[safe_last], 0)
    else:
        base_ts = np.full(m, NO_TIMESTAMP, dtype=np.int64)
        natural_last_delta = np.zeros(m, dtype=np.int64)
    if last_offset_deltas is None:
        last_deltas = natural_last_delta
    else:
        last_deltas = _per_batch(last_offset_deltas, m, "last_offset_deltas")
        if (nonempty & (natural_last_delta > last_deltas)).any():
            raise ValueError("last_offset_delta is below the last record's offset")
    if max_timestamps is None:
        max_ts = np.full(m, NO_TIMESTAMP, dtype=np.int64)
        if n:
            max_ts[nonempty] = np.maximum.reduceat(timestamps, first[nonempty])
    else:
        max_ts = _per_batch(max_timestamps, m, "max_timestamps")

    section, ends = encode_records(offset_deltas, timestamps - base_ts[batch_of], keys, values, background=background)
    # A batch's section ends after its last record; an empty batch's, where the previous
    # batch's ended (its "last record" is the previous batch's).
    section_end = np.where(last_record >= 0, ends[safe_last], 0) if n else np.zeros(m, dtype=np.int64)
    section_start = np.concatenate(([0], section_end[:-1])).astype(np.int64) if m else section_end

    attributes = _per_batch(compression, m, "compression") & Attributes.COMPRESSION_MASK
    attributes |= np.where(
        _per_batch(timestamp_type, m, "timestamp_type") == TimestampType.LOG_APPEND_TIME,
        int(Attributes.LOG_APPEND_TIME),
        0,
    )
    attributes |= np.where(_per_batch(is_transactional, m, "is_transactional") != 0, int(Attributes.TRANSACTIONAL), 0)

    view = memoryview(section)
    columns = zip(
        bases.tolist(),
        last_deltas.tolist(),
        attributes.tolist(),
        base_ts.tolist(),
        max_ts.tolist(),
        _per_batch(producer_ids, m, "producer_ids").tolist(),
        _per_batch(producer_epochs, m, "producer_epochs").tolist(),
        _per_batch(base_sequences, m, "base_sequences").tolist(),
        counts.tolist(),
        section_start.tolist(),
        section_end.tolist(),
        _per_batch(partition_leader_epoch, m, "partition_leader_epoch").tolist(),
        strict=True,
    )
    return [
        assemble_batch(
            base_offset=base,
            last_offset_delta=last_delta,
            attributes=attrs,
            base_timestamp=base_timestamp,
            max_timestamp=max_timestamp,
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=seq,
            records_count=count,
            records=view[start:end],
            partition_leader_epoch=leader_epoch,
        )
        for (
            base,
            last_delta,
            attrs,
            base_timestamp,
            max_timestamp,
            pid,
            epoch,
            seq,
            count,
            start,
            end,
            leader_epoch,
        ) in columns
    ]
