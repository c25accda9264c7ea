"""The numpy decoder of v2 records that the compiled core replaced, kept as the tests'
reference: an independent implementation (lock-step varint decoding over columns) that
the property tests compare ``cleaner._native.decode_records`` with, column by column.
"""

from __future__ import annotations

import numpy as np

from cleaner.errors import CorruptRecordError
from cleaner.records.columns import _error
from cleaner.records.scan import Batches
from cleaner.records.varint import MAX_VARLONG_BYTES, decode_varint, decode_varints

MIN_HEADER_SIZE = 2  # keyLength, valueLength

_LOCKSTEP_MIN_WIDTH = 48


def reference_columns(
    batches: Batches,
    data: bytes,
    sec_start: np.ndarray,
    sec_end: np.ndarray,
    counts: np.ndarray,
    compressed: np.ndarray,
) -> dict[str, np.ndarray]:
    raw = np.frombuffer(data, dtype=np.uint8)
    starts = _record_starts(batches, data, raw, sec_start, sec_end, counts, compressed)
    batch = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    return _decode_fields(batches, raw, starts, batch, sec_end, compressed)


def _record_starts(
    batches: Batches,
    data: bytes | bytearray | memoryview,
    raw: np.ndarray,
    sec_start: np.ndarray,
    sec_end: np.ndarray,
    counts: np.ndarray,
    compressed: np.ndarray,
) -> np.ndarray:
    total = int(counts.sum())
    out = np.empty(total, dtype=np.int64)
    first_row = np.cumsum(counts) - counts
    cur = sec_start.copy()
    active = np.flatnonzero(counts > 0)
    j = 0
    while active.size >= _LOCKSTEP_MIN_WIDTH:
        c = cur[active]
        out[first_row[active] + j] = c
        length, size, bad = decode_varints(raw, c)
        nxt = c + size + length
        bad |= (length < 0) | (nxt > sec_end[active])
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            raise _error(batches, int(active[k]), _length_problem(int(length[k])), compressed, int(c[k]))
        cur[active] = nxt
        j += 1
        active = active[counts[active] > j]
    for b in active.tolist():
        row = int(first_row[b])
        p = int(cur[b])
        limit = int(sec_end[b])
        for r in range(row + j, row + int(counts[b])):
            out[r] = p
            try:
                length, q = decode_varint(data, p)
            except CorruptRecordError as e:
                raise _error(batches, b, e.reason, compressed, p) from None
            if length < 0 or q + length > limit:
                raise _error(batches, b, _length_problem(length), compressed, p)
            p = q + length
        cur[b] = p
    leftover = np.flatnonzero(cur != sec_end)
    if leftover.size:
        b = int(leftover[0])
        raise _error(
            batches,
            b,
            f"incorrect declared batch size, {int(sec_end[b] - cur[b])} bytes remain after {int(counts[b])} records",
            compressed,
            int(cur[b]),
        )
    return out


def _length_problem(length: int) -> str:
    if length < 0:
        return f"invalid negative record length {length}"
    return f"record of {length} bytes extends beyond its batch"


def _decode_fields(
    batches: Batches,
    raw: np.ndarray,
    start: np.ndarray,
    batch: np.ndarray,
    sec_end: np.ndarray,
    compressed: np.ndarray,
) -> dict[str, np.ndarray]:
    length, size, _ = decode_varints(raw, start)
    end = start + size + length
    p = start + size + 1  # attributes: one byte, no bits defined, ignored like Kafka does
    ts_delta, size, bad = decode_varints(raw, p, MAX_VARLONG_BYTES)
    problems = [(bad, "timestamp delta varlong is too long")]
    p = p + size
    body_start = p
    offset_delta, size, bad = decode_varints(raw, p)
    problems.append((bad, "offset delta varint is too long"))
    p = p + size
    key_length, size, bad = decode_varints(raw, p)
    problems.append((bad | (key_length < -1), "invalid key length"))
    p = p + size
    key_start = p
    p = p + np.maximum(key_length, 0)
    problems.append((p > end, "key extends beyond the record"))
    value_length, size, bad = decode_varints(raw, p)
    problems.append((bad | (value_length < -1), "invalid value length"))
    p = p + size
    value_start = p
    p = p + np.maximum(value_length, 0)
    problems.append((p > end, "value extends beyond the record"))
    headers_count, size, bad = decode_varints(raw, p)
    p = p + size
    problems.append((bad | (headers_count < 0) | (headers_count * MIN_HEADER_SIZE > end - p), "invalid header count"))
    _raise_first(batches, batch, start, offset_delta, problems, compressed)
    headers_start = p
    p = _skip_headers(raw, p, headers_count, end)
    problems = [(p != end, "invalid record size: the fields do not add up to the declared length")]
    _raise_first(batches, batch, start, offset_delta, problems, compressed)
    return {
        "batch": batch,
        "start": start,
        "end": end,
        "timestamp_delta": ts_delta,
        "body_start": body_start,
        "offset_delta": offset_delta,
        "key_start": key_start,
        "key_length": key_length,
        "value_start": value_start,
        "value_length": value_length,
        "headers_count": headers_count,
        "headers_start": headers_start,
    }


def _skip_headers(raw: np.ndarray, p: np.ndarray, count: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Position after each record's headers (a record's headers are walked in step with
    every other record's; a bad length sends the position past ``end``, which the caller
    reports). Most records have no headers, so this is usually one comparison."""
    p = p.copy()
    active = np.flatnonzero(count > 0)
    j = 0
    while active.size:
        q = p[active]
        klen, size, bad = decode_varints(raw, q)
        q = q + size + np.maximum(klen, 0)
        vlen, size, bad2 = decode_varints(raw, q)
        q = q + size + np.maximum(vlen, 0)
        broken = bad | bad2 | (klen < 0) | (vlen < -1) | (q > end[active])
        q[broken] = end[active][broken] + 1  # mark: cannot add up any more
        p[active] = q
        j += 1
        active = active[(count[active] > j) & ~broken]
    return p


def _raise_first(
    batches: Batches,
    batch: np.ndarray,
    start: np.ndarray,
    offset_delta: np.ndarray,
    problems: list[tuple[np.ndarray, str]],
    compressed: np.ndarray,
) -> None:
    """Raise for the earliest record with any problem (the first reason that applies to it)."""
    any_bad = np.zeros(start.shape, dtype=bool)
    for mask, _ in problems:
        any_bad |= mask
    if not any_bad.any():
        return
    r = int(np.flatnonzero(any_bad)[0])
    reason = next(text for mask, text in problems if mask[r])
    b = int(batch[r])
    offset = int(batches.base_offsets[b] + offset_delta[r])
    raise _error(batches, b, reason, compressed, int(start[r]), offset)
