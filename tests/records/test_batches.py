"""Record batch v2: building, scanning and columnar decoding agree with each other, with
KAFKA_NOTES §1.6's byte-exact test vectors, and with Kafka's structural checks."""

from __future__ import annotations

import struct

import crc32c
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cleaner.errors import CorruptRecordError
from cleaner.records.batch import BatchHeader, TimestampType
from cleaner.records.builder import build_batch, build_control_batch, build_empty_batch, rebuild_batch
from cleaner.records.columns import decode_records
from cleaner.records.compression import CompressionType
from cleaner.records.control import ControlRecordType
from cleaner.records.record import Record
from cleaner.records.scan import scan_batches

# KAFKA_NOTES §1.6, CRCs cross-checked with java.util.zip.CRC32C
VECTOR_A = bytes.fromhex(
    "00000000000000000000003a0000000002716a618900000000000000000000000003e800000000000003e8"
    "ffffffffffffffffffffffffffff0000000110000000026b027600"
)
VECTOR_B = bytes.fromhex(
    "0000000000000005000000420000000002410cebf300300000000000000000000007d000000000000007d0"
    "00000000000000070001ffffffff000000012000000008000000010c00000000000300"
)
VECTOR_C = bytes.fromhex(
    "000000000000000a000000310000000002bfc4580f000000000002ffffffffffffffff0000000000000bb8"
    "000000000000000700010000000400000000"
)
VECTOR_D = bytes.fromhex(
    "00000000000000000000003c0000000002d9af37140040000000000000000005265fe800000000000003e8"
    "ffffffffffffffffffffffffffff000000011400ffefb25200026b0100"
)


def test_vector_a_single_record() -> None:
    batch = build_batch([Record(0, 1000, b"k", b"v")], partition_leader_epoch=0)
    assert batch == VECTOR_A


def test_vector_b_commit_marker() -> None:
    batch = build_control_batch(
        ControlRecordType.COMMIT, offset=5, producer_id=7, producer_epoch=1, coordinator_epoch=3, timestamp=2000,
        partition_leader_epoch=0,
    )
    assert batch == VECTOR_B
    assert len(batch) == 78


def test_vector_c_retain_empty_header() -> None:
    original = build_batch(
        [Record(10, 1000, b"a", b"1"), Record(11, 3000, b"b", b"2"), Record(12, 2000, b"c", b"3")],
        producer_id=7, producer_epoch=1, base_sequence=4, partition_leader_epoch=0,
    )
    header = BatchHeader.parse(original)
    assert build_empty_batch(header) == VECTOR_C


def test_vector_d_tombstone_with_delete_horizon() -> None:
    source = build_batch([Record(0, 1000, b"k", None)], partition_leader_epoch=0)
    columns = decode_records(scan_batches(source).batches)
    rebuilt = rebuild_batch(columns, 0, np.array([0]), delete_horizon_ms=1000 + 86_400_000)
    assert rebuilt == VECTOR_D
    again = decode_records(scan_batches(rebuilt).batches)
    assert again.record(0) == Record(0, 1000, b"k", None)
    assert again.batches.header(0).delete_horizon_ms == 86_401_000
    assert again.batches.header(0).max_timestamp == 1000


keys = st.one_of(st.none(), st.binary(max_size=20))
values = st.one_of(st.none(), st.binary(max_size=300))
headers = st.lists(
    st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=8))), max_size=3
).map(tuple)
timestamps = st.one_of(st.just(-1), st.integers(0, 2**45))


@st.composite
def record_lists(draw, max_size: int = 30) -> list[Record]:
    n = draw(st.integers(1, max_size))
    gaps = draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    base = draw(st.integers(0, 2**40))
    out, offset = [], base
    for gap in gaps:
        out.append(Record(offset, draw(timestamps), draw(keys), draw(values), draw(headers)))
        offset += gap
    return out


codecs = st.sampled_from(list(CompressionType))


@given(record_lists(), codecs, st.booleans())
def test_build_scan_decode_round_trip(records: list[Record], codec: CompressionType, log_append: bool) -> None:
    ts_type = TimestampType.LOG_APPEND_TIME if log_append else TimestampType.CREATE_TIME
    batch = build_batch(records, compression=codec, timestamp_type=ts_type, producer_id=5, producer_epoch=2,
                        base_sequence=9, max_timestamp=123456 if log_append else None)
    result = scan_batches(batch)
    assert result.end == len(batch) and result.next_entry_size is None
    batches = result.batches
    assert len(batches) == 1 and not batches.verify_checksums()
    header = batches.header(0)
    assert (header.base_offset, header.last_offset) == (records[0].offset, records[-1].offset)
    assert header.compression == codec and header.records_count == len(records)
    columns = decode_records(batches)
    decoded = columns.records()
    if log_append:
        records = [Record(r.offset, 123456, r.key, r.value, r.headers) for r in records]
    assert decoded == records
    if not log_append:  # (LogAppendTime records read as the batch's time, not what was written)
        # Encoding is deterministic: decoding and building again gives the same bytes.
        again = build_batch(decoded, compression=codec, producer_id=5, producer_epoch=2, base_sequence=9)
        assert again == batch


@given(st.lists(record_lists(max_size=8), min_size=1, max_size=12), codecs)
def test_many_batches_decode_in_one_pass(groups: list[list[Record]], codec: CompressionType) -> None:
    """Enough batches to exercise lock-step boundary scanning and the per-record tail."""
    blob, expected, offset = b"", [], 0
    for group in groups:
        shifted = [Record(offset + i, r.timestamp, r.key, r.value, r.headers) for i, r in enumerate(group)]
        offset += len(group)
        blob += build_batch(shifted, compression=codec)
        expected += shifted
    columns = decode_records(scan_batches(blob).batches)
    assert columns.records() == expected
    assert columns.offsets.tolist() == [r.offset for r in expected]
    assert columns.is_tombstone.tolist() == [r.is_tombstone for r in expected]


def test_long_batch_next_to_short_ones() -> None:
    """One batch far longer than the others is finished by the per-record loop."""
    blob, expected, offset = b"", [], 0
    for size in [1] * 20 + [5000] + [2] * 10:
        recs = [Record(offset + i, 1000 + i, b"k%d" % (offset + i), b"v" * (i % 300)) for i in range(size)]
        offset += size
        blob += build_batch(recs)
        expected += recs
    assert decode_records(scan_batches(blob).batches).records() == expected


@given(record_lists(), st.data())
def test_rebuild_keeps_offsets_and_bodies(records: list[Record], data: st.DataObject) -> None:
    batch = build_batch(records, producer_id=3, producer_epoch=0, base_sequence=0)
    columns = decode_records(scan_batches(batch).batches)
    keep = sorted(data.draw(st.sets(st.integers(0, len(records) - 1))))
    horizon = data.draw(st.one_of(st.none(), st.integers(0, 2**44)))
    rebuilt = rebuild_batch(columns, 0, np.array(keep, dtype=np.int64), delete_horizon_ms=horizon)
    out = scan_batches(rebuilt).batches
    assert not out.verify_checksums()
    header = out.header(0)
    assert header.base_offset == records[0].offset
    assert header.last_offset == records[-1].offset  # lastOffsetDelta is kept
    assert (header.producer_id, header.base_sequence) == (3, 0)
    assert header.delete_horizon_ms == horizon
    kept = [records[i] for i in keep]
    assert decode_records(out).records() == kept
    if kept and horizon is None:
        assert header.max_timestamp == max(r.timestamp for r in kept)


def test_rebuild_of_unchanged_batch_is_verbatim() -> None:
    records = [Record(100 + i, 5000 + i, b"k%d" % i, b"v%d" % i) for i in range(10)]
    batch = build_batch(records, partition_leader_epoch=4)
    columns = decode_records(scan_batches(batch).batches)
    assert rebuild_batch(columns, 0, np.arange(10), delete_horizon_ms=None) == batch


def _corrupt(batch: bytes, position: int, value: bytes) -> bytes:
    return batch[:position] + value + batch[position + len(value):]


def _recrc(batch: bytes) -> bytes:
    return batch[:17] + struct.pack(">I", crc32c.crc32c(batch[21:])) + batch[21:]


def test_structural_errors_name_position_and_offset() -> None:
    batch = build_batch([Record(40, 1, b"k", b"v"), Record(41, 2, b"k2", b"v2")])
    too_short = _corrupt(batch, 8, struct.pack(">i", 10))
    with pytest.raises(CorruptRecordError, match="minimum record overhead") as e:
        scan_batches(b"x" * 7 + too_short, 7, base_position=1000, path="/d/0.log")
    assert (e.value.path, e.value.position, e.value.offset) == ("/d/0.log", 1007, 40)
    with pytest.raises(CorruptRecordError, match="invalid magic byte 7"):
        scan_batches(_corrupt(batch, 16, b"\x07"))
    with pytest.raises(CorruptRecordError, match="smaller than the minimum allowed overhead"):
        scan_batches(_corrupt(batch, 8, struct.pack(">i", 30)))
    # A record count that the bytes cannot hold.
    with pytest.raises(CorruptRecordError, match="invalid record count"):
        decode_records(scan_batches(_recrc(_corrupt(batch, 57, struct.pack(">i", 10**6)))).batches)
    # One record fewer than the bytes hold: Kafka's "records still remaining".
    with pytest.raises(CorruptRecordError, match="incorrect declared batch size"):
        decode_records(scan_batches(_recrc(_corrupt(batch, 57, struct.pack(">i", 1)))).batches)
    # A key length that runs past the record.
    with pytest.raises(CorruptRecordError, match=r"key extends beyond|do not add up") as e:
        decode_records(scan_batches(_recrc(_corrupt(batch, 61 + 4, b"\x40")), base_position=0).batches)
    assert e.value.offset == 40 and e.value.position == 61


def test_truncated_tail_is_incomplete_not_corrupt() -> None:
    one = build_batch([Record(0, 1, b"k", b"v")])
    two = build_batch([Record(1, 1, b"k", b"v")])
    blob = one + two
    for cut in range(len(one), len(blob)):
        result = scan_batches(blob[:cut])
        assert len(result.batches) == 1 and result.end == len(one)
        assert result.next_entry_size in (None, len(two))


def test_crc_mismatch_is_reported_not_raised_by_scan() -> None:
    batch = bytearray(build_batch([Record(0, 1, b"k", b"v")]))
    batch[-1] ^= 0xFF
    batches = scan_batches(bytes(batch), path="x.log").batches
    (problem,) = batches.verify_checksums()
    assert "crc" in problem.reason and problem.path == "x.log" and problem.position == 0


@given(st.binary(min_size=0, max_size=400))
def test_garbage_never_escapes_as_a_bare_exception(blob: bytes) -> None:
    try:
        batches = scan_batches(blob).batches
        decode_records(batches)
    except CorruptRecordError:
        pass


@given(record_lists(max_size=10), st.data())
def test_bit_flips_give_typed_errors(records: list[Record], data: st.DataObject) -> None:
    """One flipped bit is reported as a typed error, and is *detected* wherever Kafka's format
    can detect it: in the length (the batch no longer frames), the magic byte, the CRC field
    and everything the CRC-32C covers (from the attributes on; CRC-32C catches every
    single-bit error). Only the base offset and the partition leader epoch, which the CRC
    leaves out so that brokers can rewrite them, may change unseen."""
    batch = bytearray(build_batch(records))
    i = data.draw(st.integers(0, len(batch) - 1))
    batch[i] ^= 1 << data.draw(st.integers(0, 7))
    detected = False
    try:
        result = scan_batches(bytes(batch))
        batches = result.batches
        if len(batches) != 1 or result.end != len(batch):
            detected = True  # the flip changed the framing
        elif batches.verify_checksums():
            detected = True
        else:
            decode_records(batches)
    except CorruptRecordError:
        detected = True
    if 8 <= i < 12 or i >= 16:  # length, magic, CRC and what the CRC covers
        assert detected, f"a flipped bit at byte {i} went unnoticed"
