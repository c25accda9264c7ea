"""Kafka's variable-length integers: ZigZag, then unsigned LEB128 (7 bits a byte, least
significant group first, high bit = "more bytes follow").

Two forms: scalar functions for building single records, and numpy functions that decode
one varint field of many records at once. The vectorised decoder is what makes record
decoding fast in Python: it works on whole columns and only loops over the (rare)
multi-byte varints, never over records.
"""

from __future__ import annotations

import numpy as np

from cleaner.errors import CorruptRecordError

MAX_VARINT_BYTES = 5
MAX_VARLONG_BYTES = 10


def zigzag_encode(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def zigzag_decode(u: int) -> int:
    return (u >> 1) ^ -(u & 1)


def encode_varint(n: int) -> bytes:
    """Encode a signed int32/int64 (Kafka's writeVarint/writeVarlong give the same bytes
    for values that fit an int32)."""
    u = ((n << 1) ^ (n >> 63)) & 0xFFFFFFFFFFFFFFFF
    if u < 0x80:
        return bytes((u,))
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


def size_of_varint(n: int) -> int:
    u = ((n << 1) ^ (n >> 63)) & 0xFFFFFFFFFFFFFFFF
    size = 1
    while u >= 0x80:
        u >>= 7
        size += 1
    return size


def decode_unsigned_varint(
    buf: bytes | bytearray | memoryview, position: int, max_bytes: int = MAX_VARINT_BYTES
) -> tuple[int, int]:
    """Decode one unsigned varint at ``position`` (Kafka's ``ByteUtils.readUnsignedVarint``,
    used by the flexible message versions: compact lengths, metadata record headers);
    returns (value, position after it)."""
    u = 0
    shift = 0
    end = len(buf)
    for i in range(max_bytes):
        p = position + i
        if p >= end:
            raise CorruptRecordError("varint runs past the end of the buffer", position=position)
        b = buf[p]
        u |= (b & 0x7F) << shift
        if b < 0x80:
            return u, p + 1
        shift += 7
    raise CorruptRecordError(f"varint is longer than {max_bytes} bytes", position=position)


def decode_varint(
    buf: bytes | bytearray | memoryview, position: int, max_bytes: int = MAX_VARINT_BYTES
) -> tuple[int, int]:
    """Decode one (zigzag) varint at ``position``; returns (value, position after it)."""
    u, after = decode_unsigned_varint(buf, position, max_bytes)
    return (u >> 1) ^ -(u & 1), after


def decode_varints(
    raw: np.ndarray, positions: np.ndarray, max_bytes: int = MAX_VARINT_BYTES
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decode the varint that starts at each of ``positions`` in the uint8 array ``raw``.

    Returns (values int64, sizes int64, bad bool). ``bad`` marks varints longer than
    ``max_bytes``; positions past the end read the last byte (``take(mode="clip")``), so
    callers check that every field ends inside its record and report the first bad one.
    All multi-byte groups are handled by looping over the *byte index* (at most
    ``max_bytes`` passes over a shrinking subset), never over records.
    """
    first = raw.take(positions, mode="clip").astype(np.int64)
    values = first & 0x7F
    sizes = np.ones(positions.shape, dtype=np.int64)
    bad = np.zeros(positions.shape, dtype=bool)
    more = np.flatnonzero(first >= 0x80)
    shift = 7
    while more.size:
        if shift >= 7 * max_bytes:
            bad[more] = True
            break
        b = raw.take(positions[more] + sizes[more], mode="clip").astype(np.int64)
        if shift >= 63:
            # The tenth byte of a varlong only contributes its lowest bit.
            values[more] |= (b & 0x01) << 63
        else:
            values[more] |= (b & 0x7F) << shift
        sizes[more] += 1
        more = more[b >= 0x80]
        shift += 7
    # ZigZag on the 64-bit pattern; the arithmetic shift of a signed int would smear the
    # top bit, so shift the unsigned view.
    u = values.view(np.uint64)
    decoded = (u >> np.uint64(1)).view(np.int64) ^ -(values & 1)
    return decoded, sizes, bad


def encode_varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised ZigZag+LEB128 encoding: returns (bytes as an (n, 10) uint8 matrix,
    sizes). Row i's first sizes[i] bytes are the encoding of values[i]."""
    v = np.asarray(values, dtype=np.int64)
    u = ((v << 1) ^ (v >> 63)).view(np.uint64)
    n = v.shape[0]
    out = np.zeros((n, MAX_VARLONG_BYTES), dtype=np.uint8)
    sizes = np.ones(n, dtype=np.int64)
    for i in range(MAX_VARLONG_BYTES):
        group = (u & np.uint64(0x7F)).astype(np.uint8)
        u = u >> np.uint64(7)
        more = u != 0
        out[:, i] = group | (more.astype(np.uint8) << 7)
        sizes += more
        if not more.any():
            break
    return out, sizes
