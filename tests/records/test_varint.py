"""Varints: the scalar and the vectorised codec agree with each other and with Kafka's
bytes (ZigZag + LEB128; -1 is 0x01, 0 is 0x00)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cleaner.errors import CorruptRecordError
from cleaner.records.varint import (
    decode_varint,
    decode_varints,
    encode_varint,
    encode_varints,
    size_of_varint,
)

int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)


@pytest.mark.parametrize(
    "value, encoded",
    [(0, b"\x00"), (-1, b"\x01"), (1, b"\x02"), (63, b"\x7e"), (-64, b"\x7f"), (64, b"\x80\x01"), (300, b"\xd8\x04")],
)
def test_known_encodings(value: int, encoded: bytes) -> None:
    assert encode_varint(value) == encoded
    assert decode_varint(encoded, 0) == (value, len(encoded))


@given(int64)
def test_scalar_round_trip(value: int) -> None:
    encoded = encode_varint(value)
    assert len(encoded) == size_of_varint(value)
    assert decode_varint(encoded + b"\xff", 0, max_bytes=10) == (value, len(encoded))


@given(st.lists(int64, max_size=50))
def test_vectorised_round_trip(values: list[int]) -> None:
    matrix, sizes = encode_varints(np.array(values, dtype=np.int64))
    blob = b"".join(matrix[i, : sizes[i]].tobytes() for i in range(len(values)))
    assert blob == b"".join(encode_varint(v) for v in values)
    positions = np.cumsum(sizes) - sizes
    raw = np.frombuffer(blob, dtype=np.uint8)
    decoded, dsizes, bad = decode_varints(raw, positions.astype(np.int64), max_bytes=10)
    assert decoded.tolist() == values
    assert dsizes.tolist() == sizes.tolist()
    assert not bad.any()


@given(st.lists(int32, min_size=1, max_size=20))
def test_vectorised_matches_scalar_on_int32(values: list[int]) -> None:
    blob = b"".join(encode_varint(v) for v in values)
    positions, p = [], 0
    for v in values:
        positions.append(p)
        p += size_of_varint(v)
    decoded, _, bad = decode_varints(np.frombuffer(blob, np.uint8), np.array(positions, dtype=np.int64))
    assert decoded.tolist() == values and not bad.any()


def test_too_long_varint_is_flagged() -> None:
    blob = b"\xff" * 6 + b"\x00"
    with pytest.raises(CorruptRecordError, match="longer than 5"):
        decode_varint(blob, 0)
    _, _, bad = decode_varints(np.frombuffer(blob, np.uint8), np.array([0], dtype=np.int64))
    assert bad.tolist() == [True]


def test_truncated_varint_is_an_error() -> None:
    with pytest.raises(CorruptRecordError, match="past the end"):
        decode_varint(b"\x80\x80", 0)
