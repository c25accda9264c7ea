"""The compiled core (``cleaner._native``) against the tests' reference implementations:
the numpy record decoder it replaced, the ``xxhash`` package's xxh3-128 and the ``crc32c``
package's CRC-32C (peers kept for the tests only)."""

from __future__ import annotations

import crc32c
import numpy as np
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference_columns import reference_columns
from test_bulk import batch_specs

from cleaner import _native
from cleaner.errors import CorruptRecordError
from cleaner.records.batch import RECORD_BATCH_OVERHEAD
from cleaner.records.builder import build_batch
from cleaner.records.columns import _check_counts, _decompress_sections, decode_records
from cleaner.records.compression import CompressionType
from cleaner.records.record import Record
from cleaner.records.scan import scan_batches

headers = st.lists(
    st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=30))).map(tuple), max_size=3
)


def _sections(buf: bytes):
    batches = scan_batches(buf).batches
    counts = batches.records_counts
    compressed = (batches.compression != 0) & (counts > 0)
    data, sec_start, sec_end = _decompress_sections(batches, compressed, None)
    return batches, data, sec_start, sec_end, counts, compressed


def _both(buf: bytes):
    batches, data, sec_start, sec_end, counts, compressed = _sections(buf)
    native, problem = _native.decode_records(data, sec_start, sec_end, counts.astype(np.int64))
    try:
        _check_counts(batches, counts, sec_start, sec_end, compressed)
        reference = reference_columns(batches, data, sec_start, sec_end, counts, compressed)
    except CorruptRecordError:
        reference = None
    return native, problem, reference


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=batch_specs(), codec=st.sampled_from(list(CompressionType)))
def test_decoded_columns_equal_the_reference(specs: list[dict], codec: CompressionType) -> None:
    buf = b"".join(build_batch(compression=codec, **spec) for spec in specs)
    native, problem, reference = _both(buf)
    assert problem is None and reference is not None
    assert native.keys() == reference.keys()
    for name, column in reference.items():
        assert np.array_equal(native[name], column), name


@settings(max_examples=100, deadline=None)
@given(
    records=st.lists(
        st.tuples(st.one_of(st.none(), st.binary(max_size=40)), st.one_of(st.none(), st.binary(max_size=300)), headers),
        min_size=1,
        max_size=20,
    ),
    codec=st.sampled_from(list(CompressionType)),
)
def test_headers_null_keys_and_values(records, codec: CompressionType) -> None:
    batch = build_batch(
        [Record(1000 + i, 1_700_000_000_000 + i, k, v, h) for i, (k, v, h) in enumerate(records)], compression=codec
    )
    native, problem, reference = _both(batch)
    assert problem is None
    for name, column in reference.items():
        assert np.array_equal(native[name], column), name
    decoded = decode_records(scan_batches(batch).batches).records()
    assert [(r.key, r.value, r.headers) for r in decoded] == [
        (k, v, tuple((hk, hv) for hk, hv in h)) for k, v, h in records
    ]


def test_records_close_to_max_message_bytes() -> None:
    big = b"x" * (1_048_588 - 200)
    batch = build_batch([Record(0, 1, b"k", big), Record(1, 2, b"k2", b"v")])
    native, problem, reference = _both(batch)
    assert problem is None
    assert int(native["value_length"][0]) == len(big)
    for name, column in reference.items():
        assert np.array_equal(native[name], column), name


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=batch_specs(), data=st.data())
def test_corrupt_records_are_refused_where_the_reference_refuses_them(specs: list[dict], data) -> None:
    """Flip a byte of an uncompressed records section: both implementations accept it
    (and then agree) or both refuse it; the core never crashes and never reads past a
    section."""
    buf = bytearray(b"".join(build_batch(**spec) for spec in specs))
    batches = scan_batches(bytes(buf)).batches
    with_records = [i for i in range(len(batches)) if batches.records_counts[i] > 0]
    if not with_records:
        return
    b = data.draw(st.sampled_from(with_records))
    start = int(batches.positions[b]) + RECORD_BATCH_OVERHEAD
    end = int(batches.positions[b] + batches.sizes[b])
    at = data.draw(st.integers(start, end - 1))
    buf[at] ^= data.draw(st.integers(1, 255))
    native, problem, reference = _both(bytes(buf))
    assert (problem is None) == (reference is not None)
    if reference is not None:
        for name, column in reference.items():
            assert np.array_equal(native[name], column), name
    else:
        batch, _, _, reason = problem
        assert 0 <= batch < len(batches) and reason


def _joined(parts: list[bytes]) -> tuple[bytes, np.ndarray, np.ndarray]:
    """The parts one after another, and each one's span in them."""
    lengths = np.array([len(p) for p in parts], dtype=np.int64)
    ends = np.cumsum(lengths, dtype=np.int64)
    return b"".join(parts), ends - lengths, ends


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.binary(max_size=200), max_size=50))
def test_key_digests_are_xxh3_128(keys: list[bytes]) -> None:
    got = _native.digest_keys(*_joined(keys)).tobytes()
    assert got == b"".join(xxhash.xxh3_128_digest(k) for k in keys)


def test_key_spans_outside_the_buffer_are_refused() -> None:
    with pytest.raises(ValueError, match="outside the buffer"):
        _native.digest_keys(b"abc", np.array([1], dtype=np.int64), np.array([9], dtype=np.int64))


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=3000), cut=st.integers(min_value=0, max_value=3000))
def test_crc32c_is_castagnoli_and_continues_from_a_prefix(data: bytes, cut: int) -> None:
    cut = min(cut, len(data))
    assert _native.crc32c(data) == crc32c.crc32c(data)
    assert _native.crc32c(data[cut:], _native.crc32c(data[:cut])) == crc32c.crc32c(data)
    assert _native.crc32c(bytearray(data)) == _native.crc32c(memoryview(data)) == crc32c.crc32c(data)


@settings(max_examples=100, deadline=None)
@given(spans=st.lists(st.binary(max_size=300), max_size=20))
def test_crc32c_spans_are_each_spans_crc(spans: list[bytes]) -> None:
    got = _native.crc32c_spans(*_joined(spans))
    assert got.dtype == np.uint32 and got.tolist() == [crc32c.crc32c(s) for s in spans]


def test_crc32c_spans_outside_the_buffer_or_a_strided_buffer_are_refused() -> None:
    with pytest.raises(ValueError, match="outside the buffer"):
        _native.crc32c_spans(b"abc", np.array([2], dtype=np.int64), np.array([4], dtype=np.int64))
    with pytest.raises(ValueError, match="not contiguous"):
        _native.crc32c(memoryview(b"abcdef")[::2])


@settings(max_examples=50, deadline=None)
@given(keys=st.integers(min_value=0, max_value=400), seed=st.integers(min_value=0, max_value=2**16))
def test_offset_map_values_are_the_occupied_slots_offsets(keys: int, seed: int) -> None:
    from cleaner.engine.offset_map import OffsetMap

    m = OffsetMap(64 * 1024)
    digests = np.random.default_rng(seed).integers(0, 256, (keys, 16), dtype=np.uint8)
    m.put_many(digests, np.arange(keys, dtype=np.int64) * 3)
    reference = m._offsets[m._offsets != 0]  # the numpy form the kernel replaced, slot order
    assert _native.offset_map_values(m._rows, m.bytes_per_entry).tolist() == reference.tolist()
    assert len(reference) == m.size


def test_offset_map_values_refuses_rows_of_another_size() -> None:
    with pytest.raises(ValueError, match="whole number of rows"):
        _native.offset_map_values(np.zeros(40, dtype=np.uint8), 19)
