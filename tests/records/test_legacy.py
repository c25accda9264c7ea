"""Message format v0/v1: shallow entries and deep iteration as Kafka reports them.

Peer producers of legacy bytes: kafka-python 3.x ``LegacyRecordBatchBuilder`` (gzip, lz4,
including the v0 broken-HC lz4 frame) and aiokafka's (snappy, which kafka-python can only do
with python-snappy). Their readers are the peer decoders. Producers write a compressed
wrapper with offset 0 and timestamp 0; ``broker_stamp`` applies what the broker does on
append (wrapper offset = last offset, wrapper timestamp = max or append time). Invalid
shapes that no peer can produce are built by hand from KAFKA_NOTES §1.7 (``message``).
"""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cleaner.errors import CorruptRecordError, InvalidRecordError
from cleaner.records.batch import TimestampType
from cleaner.records.compression import CompressionType, compress
from cleaner.records.legacy import LegacyEntry, decode_legacy_entry
from cleaner.records.record import Record

kafka_legacy = pytest.importorskip("kafka.record.legacy_records")
aiokafka_legacy = pytest.importorskip("aiokafka.record.legacy_records")

GZIP, SNAPPY, LZ4, ZSTD = CompressionType.GZIP, CompressionType.SNAPPY, CompressionType.LZ4, CompressionType.ZSTD


# ---- building bytes ---------------------------------------------------------------------------


def _sized(data: bytes | None) -> bytes:
    return struct.pack(">i", -1) if data is None else struct.pack(">i", len(data)) + data


def message(
    offset: int,
    magic: int,
    key: bytes | None,
    value: bytes | None,
    *,
    timestamp: int = 0,
    attributes: int = 0,
    crc: int | None = None,
    trailing: bytes = b"",
    key_length: int | None = None,
) -> bytes:
    """One entry, from the spec: offset i64 | size i32 | crc u32 | magic | attributes | [ts] | key | value."""
    body = struct.pack(">bb", magic, attributes)
    if magic == 1:
        body += struct.pack(">q", timestamp)
    body += _sized(key) if key_length is None else struct.pack(">i", key_length) + (key or b"")
    body += _sized(value) + trailing
    msg = struct.pack(">I", zlib.crc32(body) if crc is None else crc) + body
    return struct.pack(">qi", offset, len(msg)) + msg


def wrapper(offset: int, magic: int, codec: int, inner: bytes, *, timestamp: int = 0, log_append_time: bool = False):
    value = compress(codec, inner, magic=magic) if codec in (GZIP, SNAPPY, LZ4, ZSTD) else inner
    attributes = codec | (0x08 if log_append_time else 0)
    return message(offset, magic, None, value, timestamp=timestamp, attributes=attributes)


def broker_stamp(entry: bytes, *, offset: int, timestamp: int | None = None, log_append_time: bool = False) -> bytes:
    """The broker's rewrite of a producer's wrapper (LogValidator, in-place assignment)."""
    buf = bytearray(entry)
    struct.pack_into(">q", buf, 0, offset)
    if buf[16] == 1:
        buf[17] = (buf[17] | 0x08) if log_append_time else (buf[17] & ~0x08)
        if timestamp is not None:
            struct.pack_into(">q", buf, 18, timestamp)
    struct.pack_into(">I", buf, 12, zlib.crc32(buf[16:]))
    return bytes(buf)


def peer_build(magic: int, codec: int, rows: list[tuple[int, int, bytes | None, bytes | None]]) -> bytes:
    """Legacy bytes from a peer producer: aiokafka for snappy and v1 plain, kafka-python otherwise."""
    module = aiokafka_legacy if codec == SNAPPY else kafka_legacy
    builder = module.LegacyRecordBatchBuilder(magic, int(codec), 1 << 30)
    for offset, timestamp, key, value in rows:
        assert builder.append(offset, timestamp, key, value) is not None
    return bytes(builder.build())


def peer_read(entry: bytes, magic: int, codec: int) -> list[Record]:
    module = aiokafka_legacy if codec == SNAPPY else kafka_legacy
    return [
        Record(r.offset, -1 if r.timestamp is None else r.timestamp, r.key, r.value)
        for r in module.LegacyRecordBatch(entry, magic)
    ]


def shallow_entries(buf: bytes, **kwargs: object) -> list[LegacyEntry]:
    entries, pos = [], 0
    while pos < len(buf):
        entry = decode_legacy_entry(buf, pos, **kwargs)
        entries.append(entry)
        pos += entry.size_in_bytes
    return entries


nullable = st.one_of(st.none(), st.binary(max_size=40))
rows_strategy = st.lists(
    st.tuples(nullable, nullable, st.integers(0, 2**41)), min_size=1, max_size=15
)  # (key, value, timestamp)


# ---- uncompressed entries ---------------------------------------------------------------------


@given(magic=st.sampled_from([0, 1]), base=st.integers(0, 2**62), rows=rows_strategy)
def test_plain_messages_match_peer(magic: int, base: int, rows: list) -> None:
    buf = peer_build(magic, 0, [(base + i, ts, k, v) for i, (k, v, ts) in enumerate(rows)])
    entries = shallow_entries(buf, verify_crc=True)
    assert len(entries) == len(rows)
    position = 0
    for i, (entry, (key, value, ts)) in enumerate(zip(entries, rows, strict=True)):
        expected_ts = ts if magic == 1 else -1
        assert (entry.offset, entry.magic, entry.attributes, entry.key, entry.value) == (base + i, magic, 0, key, value)
        assert entry.timestamp == expected_ts
        assert entry.position == position
        assert entry.size_in_bytes == 12 + (14 if magic == 0 else 22) + len(key or b"") + len(value or b"")
        assert entry.compression == 0 and not entry.is_compressed
        assert entry.is_valid_crc()
        assert entry.crc == struct.unpack_from(">I", buf, position + 12)[0]
        assert entry.records() == [Record(base + i, expected_ts, key, value)]
        assert entry.records() == peer_read(buf[position : position + entry.size_in_bytes], magic, 0)
        position += entry.size_in_bytes


def test_timestamp_type() -> None:
    v0 = decode_legacy_entry(message(5, 0, b"k", b"v", attributes=0x08))
    assert v0.timestamp_type is TimestampType.NO_TIMESTAMP_TYPE and v0.timestamp == -1
    assert decode_legacy_entry(message(5, 1, b"k", b"v", timestamp=7)).timestamp_type is TimestampType.CREATE_TIME
    lat = decode_legacy_entry(message(5, 1, b"k", b"v", timestamp=7, attributes=0x08))
    assert lat.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert lat.records() == [Record(5, 7, b"k", b"v")]  # a plain message's own field holds the append time


def test_entry_inside_a_larger_buffer_and_memoryview() -> None:
    first = message(10, 1, b"a", b"b", timestamp=1)
    second = message(11, 0, None, b"c")
    buf = bytearray(b"junk" + first + second)
    entry = decode_legacy_entry(memoryview(buf), 4 + len(first))
    assert (entry.offset, entry.position, entry.key, entry.value) == (11, 4 + len(first), None, b"c")
    assert entry.last_offset == 11


def test_bytes_after_the_value_are_ignored_but_covered_by_the_crc() -> None:
    """Kafka's LegacyRecord never checks that the value ends the message."""
    entry = decode_legacy_entry(message(3, 1, b"k", b"v", timestamp=9, trailing=b"xyz"), verify_crc=True)
    assert entry.value == b"v" and entry.trailing == b"xyz"
    assert entry.is_valid_crc()


# ---- compressed wrappers ----------------------------------------------------------------------

# (magic, codec): every combination a Kafka broker accepts for v0/v1
WRAPPER_KINDS = [(0, GZIP), (0, SNAPPY), (0, LZ4), (1, GZIP), (1, SNAPPY), (1, LZ4)]


@settings(max_examples=60)
@given(kind=st.sampled_from(WRAPPER_KINDS), base=st.integers(0, 2**40), rows=rows_strategy, lat=st.booleans())
def test_compressed_wrappers_match_peer(kind: tuple[int, int], base: int, rows: list, lat: bool) -> None:
    magic, codec = kind
    n = len(rows)
    if magic == 0:  # v0: the broker assigned absolute inner offsets
        produced = peer_build(0, codec, [(base + i, ts, k, v) for i, (k, v, ts) in enumerate(rows)])
        entry_bytes = broker_stamp(produced, offset=base + n - 1)
    else:  # v1: relative inner offsets 0..n-1, wrapper offset and timestamp set by the broker
        produced = peer_build(1, codec, [(i, ts, k, v) for i, (k, v, ts) in enumerate(rows)])
        wrapper_ts = 1_700_000_000_000 if lat else max(ts for _, _, ts in rows)
        entry_bytes = broker_stamp(produced, offset=base + n - 1, timestamp=wrapper_ts, log_append_time=lat)
    entry = decode_legacy_entry(entry_bytes, verify_crc=True)
    assert entry.compression == codec and entry.is_compressed and entry.key is None
    assert entry.offset == entry.last_offset == base + n - 1

    records = entry.records(verify_crc=True)
    if magic == 0:
        expected_ts = [-1] * n
    elif lat:
        expected_ts = [1_700_000_000_000] * n
        assert entry.timestamp_type is TimestampType.LOG_APPEND_TIME
    else:
        expected_ts = [ts for _, _, ts in rows]
    assert records == [Record(base + i, expected_ts[i], k, v) for i, (k, v, _) in enumerate(rows)]
    assert records == peer_read(entry_bytes, magic, codec)
    assert [e.offset for e in entry.inner_entries()] == ([base + i for i in range(n)] if magic == 0 else list(range(n)))


def test_v0_lz4_wrapper_uses_the_broken_header_checksum() -> None:
    produced = peer_build(0, LZ4, [(7, 0, b"k", b"v"), (8, 0, b"k2", None)])
    entry = decode_legacy_entry(broker_stamp(produced, offset=8))
    assert entry.records() == [Record(7, -1, b"k", b"v"), Record(8, -1, b"k2", None)]
    # the same frame in a v1 wrapper is rejected: HC is checked from magic 1 on
    as_v1 = wrapper(1, 1, CompressionType.NONE, entry.value or b"")
    as_v1 = as_v1[:17] + bytes([LZ4]) + as_v1[18:]
    as_v1 = as_v1[:12] + struct.pack(">I", zlib.crc32(as_v1[16:])) + as_v1[16:]
    with pytest.raises(CorruptRecordError, match="HC mismatch"):
        decode_legacy_entry(as_v1).records()


def test_v1_wrapper_with_offset_zero_keeps_relative_offsets() -> None:
    """librdkafka once produced such wrappers; Kafka's deep iterator uses base 0 for them."""
    inner = b"".join(message(i, 1, b"k%d" % i, b"v", timestamp=100 + i) for i in range(3))
    entry = decode_legacy_entry(wrapper(0, 1, GZIP, inner, timestamp=102))
    assert [r.offset for r in entry.records()] == [0, 1, 2]


def test_v1_wrapper_offset_below_last_inner_offset_is_invalid() -> None:
    inner = b"".join(message(i, 1, b"k", b"v", timestamp=1) for i in range(5))
    entry = decode_legacy_entry(wrapper(3, 1, GZIP, inner, timestamp=1))
    with pytest.raises(InvalidRecordError, match="wrapper offset '3' is less than the last inner message offset '4'"):
        entry.records()


def test_v1_wrapper_with_gapped_relative_offsets() -> None:
    inner = message(0, 1, b"a", b"1", timestamp=5) + message(4, 1, b"b", b"2", timestamp=6)
    entry = decode_legacy_entry(wrapper(104, 1, SNAPPY, inner, timestamp=6))
    assert entry.records() == [Record(100, 5, b"a", b"1"), Record(104, 6, b"b", b"2")]


def test_mixed_inner_magic_timestamps() -> None:
    """Inner v0 messages have no timestamp even under a v1 LogAppendTime wrapper; inner v1
    messages under a v0 wrapper keep theirs (Kafka's LegacyRecord.timestamp)."""
    inner = message(0, 0, b"a", b"1") + message(1, 1, b"b", b"2", timestamp=55)
    lat = decode_legacy_entry(wrapper(11, 1, GZIP, inner, timestamp=999, log_append_time=True))
    assert [(r.offset, r.timestamp) for r in lat.records()] == [(10, -1), (11, 999)]
    create = decode_legacy_entry(wrapper(11, 1, LZ4, inner, timestamp=999))
    assert [(r.offset, r.timestamp) for r in create.records()] == [(10, -1), (11, 55)]
    v0_inner = message(20, 0, b"a", b"1") + message(21, 1, b"b", b"2", timestamp=55)
    v0 = decode_legacy_entry(wrapper(21, 0, SNAPPY, v0_inner))
    assert [(r.offset, r.timestamp) for r in v0.records()] == [(20, -1), (21, 55)]


def test_truncated_last_inner_message_ends_the_set_like_kafka() -> None:
    """DataLogInputStream returns null for an incomplete entry, which ends the iteration."""
    full = message(0, 1, b"a", b"1", timestamp=1) + message(1, 1, b"b", b"2", timestamp=2)
    for cut in (1, 5, 11, 20):
        entry = decode_legacy_entry(wrapper(50, 1, GZIP, full[:-cut], timestamp=2))
        assert entry.records() == [Record(50, 1, b"a", b"1")]


# ---- invalid wrappers ---------------------------------------------------------------------


def test_zstd_is_not_allowed_in_legacy_wrappers() -> None:
    entry = decode_legacy_entry(wrapper(0, 1, ZSTD, message(0, 1, b"k", b"v", timestamp=1), timestamp=1))
    with pytest.raises(InvalidRecordError, match="zstd is not allowed in message format v1") as info:
        entry.records()
    assert (info.value.position, info.value.offset) == (0, 0)


@pytest.mark.parametrize("codec_id", [5, 6, 7])
def test_unknown_codec_in_a_wrapper(codec_id: int) -> None:
    entry = decode_legacy_entry(message(3, 0, None, b"xx", attributes=codec_id))
    with pytest.raises(CorruptRecordError, match=f"unknown compression codec id {codec_id}"):
        entry.records()


def test_nested_compression_is_invalid() -> None:
    nested = wrapper(0, 1, GZIP, message(0, 1, b"k", b"v", timestamp=1), timestamp=1)
    entry = decode_legacy_entry(wrapper(0, 1, SNAPPY, nested, timestamp=1), position=0)
    with pytest.raises(InvalidRecordError, match="nested compression"):
        entry.records()


@pytest.mark.parametrize(
    ("build", "error", "reason"),
    [
        (lambda: message(0, 1, None, None, attributes=GZIP), InvalidRecordError, "null value"),
        (lambda: wrapper(0, 1, GZIP, b""), InvalidRecordError, "no inner records"),
        (lambda: wrapper(0, 0, LZ4, b"\x00" * 5), InvalidRecordError, "no inner records"),
        (
            lambda: wrapper(9, 0, GZIP, message(9, 0, b"a", b"") + message(8, 0, b"b", b"")),
            CorruptRecordError,
            "inner offsets are not increasing",
        ),
        (
            lambda: wrapper(9, 0, GZIP, message(9, 0, b"a", b"") + struct.pack(">qi", 10, 13) + bytes(13)),
            CorruptRecordError,
            r"inner message at byte 27 .* less than the minimum record overhead",
        ),
        (
            lambda: wrapper(9, 0, GZIP, message(9, 7, b"a", b"")),
            CorruptRecordError,
            r"inner message at byte 0 .* invalid magic 7",
        ),
    ],
)
def test_invalid_wrappers(build, error: type[Exception], reason: str) -> None:
    buf = b"\xee" * 9 + build()
    entry = decode_legacy_entry(buf, 9)
    with pytest.raises(error, match=reason) as info:
        entry.records()
    assert info.value.position == 9
    assert info.value.offset == entry.offset


def test_inner_crc_checked_on_request() -> None:
    inner = bytearray(message(0, 1, b"k", b"v", timestamp=1))
    inner[-1] ^= 0xFF
    entry = decode_legacy_entry(wrapper(0, 1, GZIP, bytes(inner), timestamp=1))
    assert entry.records()[0].value == bytes([ord("v") ^ 0xFF])  # Kafka's iterator does not check it
    with pytest.raises(InvalidRecordError, match=r"inner message at byte 0 .* record is corrupt"):
        entry.records(verify_crc=True)


def test_corrupt_compressed_value_is_located_in_the_value() -> None:
    good = wrapper(77, 1, LZ4, message(0, 1, b"k", b"v" * 100, timestamp=1), timestamp=1)
    buf = bytearray(b"\x00" * 50 + good)
    value_position = 50 + 12 + 4 + 1 + 1 + 8 + 4 + 4  # header, null key, value length
    buf[value_position + 6] ^= 0xFF  # the lz4 HC byte
    buf[50 + 12 : 50 + 16] = struct.pack(">I", zlib.crc32(buf[50 + 16 :]))
    entry = decode_legacy_entry(bytes(buf), 50, verify_crc=True)
    assert entry.value_position == value_position
    with pytest.raises(CorruptRecordError, match="cannot decompress the wrapper's value: lz4") as info:
        entry.records()
    assert (info.value.position, info.value.offset) == (value_position + 6, 77)


def test_max_size_bounds_the_inner_set() -> None:
    inner = b"".join(message(i, 1, b"k", bytes(1000), timestamp=1) for i in range(100))
    entry = decode_legacy_entry(wrapper(99, 1, GZIP, inner, timestamp=1))
    assert len(entry.records(max_size=len(inner))) == 100
    with pytest.raises(CorruptRecordError, match="exceeds the limit"):
        entry.records(max_size=len(inner) - 1)


def test_inner_entries_needs_a_wrapper() -> None:
    with pytest.raises(ValueError):
        decode_legacy_entry(message(0, 1, b"k", b"v")).inner_entries()


# ---- shallow structural errors ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        (struct.pack(">qi", 5, 13) + bytes(13), "record size 13 is less than the minimum record overhead"),
        (struct.pack(">qi", 5, -1) + bytes(20), "record size -1"),
        (message(5, 1, b"key", b"value", timestamp=1)[:-1], "truncated entry"),
        (message(5, 2, b"k", b"v"), "invalid magic 2"),
        (message(5, -1, b"k", b"v"), "invalid magic -1"),
        (message(5, 0, b"k", b"v", key_length=-2), "invalid key length -2"),
        (message(5, 1, b"k", b"v", key_length=100), "key of 100 bytes extends beyond the end"),
        (message(5, 0, None, None)[:-4] + struct.pack(">i", 3) + b"", "value of 3 bytes extends beyond"),
        (struct.pack(">qiIbbq", 5, 14, 0, 1, 0, 0), "record size 14 is less than the v1 record overhead"),
        (struct.pack(">qiIbbii", 5, 15, 0, 1, 0, 0, 0) + b"\x00", "record size 15 is less than the v1"),
    ],
)
def test_structural_errors_carry_position_and_offset(entry: bytes, reason: str) -> None:
    buf = b"\x01" * 13 + entry
    with pytest.raises(CorruptRecordError, match=reason) as info:
        decode_legacy_entry(buf, 13)
    assert info.value.position == 13
    assert info.value.offset == 5
    assert "byte 13" in str(info.value)


def test_fewer_than_twelve_bytes() -> None:
    with pytest.raises(CorruptRecordError, match="truncated entry") as info:
        decode_legacy_entry(b"\x00" * 20, 10)
    assert info.value.position == 10 and info.value.offset is None


def test_crc_mismatch() -> None:
    good = message(42, 1, b"k", b"v", timestamp=3)
    bad = good[:-1] + b"w"
    entry = decode_legacy_entry(bad)  # Kafka's readers do not check CRCs unless asked
    assert not entry.is_valid_crc()
    assert entry.computed_crc() == zlib.crc32(bad[16:])
    with pytest.raises(InvalidRecordError, match=r"record is corrupt \(stored crc = ") as info:
        decode_legacy_entry(b"\x00" * 3 + bad, 3, verify_crc=True)
    assert (info.value.position, info.value.offset) == (3, 42)


# ---- fuzz: damaged entries raise only CorruptRecordError --------------------------------------


@st.composite
def damaged_entries(draw: st.DrawFn) -> bytes:
    magic, codec = draw(st.sampled_from([(0, 0), (1, 0), *WRAPPER_KINDS]))
    rows = draw(st.lists(st.tuples(nullable, nullable), min_size=1, max_size=5))
    if codec:
        inner = b"".join(message(i if magic else 100 + i, magic, k, v, timestamp=i) for i, (k, v) in enumerate(rows))
        good = wrapper(100 + len(rows) - 1, magic, codec, inner, timestamp=7)
    else:
        good = message(100, magic, rows[0][0], rows[0][1], timestamp=7)
    buf = bytearray(good)
    how = draw(st.sampled_from(["flip", "truncate", "random", "overwrite"]))
    if how == "flip":
        for _ in range(draw(st.integers(1, 3))):
            buf[draw(st.integers(0, len(buf) - 1))] ^= 1 << draw(st.integers(0, 7))
    elif how == "truncate":
        del buf[draw(st.integers(0, len(buf) - 1)) :]
    elif how == "random":
        buf = bytearray(draw(st.binary(max_size=120)))
    else:
        start = draw(st.integers(0, len(buf) - 1))
        patch = draw(st.binary(min_size=1, max_size=8))
        buf[start : start + len(patch)] = patch
    return bytes(buf)


@settings(max_examples=300)
@given(buf=damaged_entries(), verify=st.booleans())
def test_damaged_entries_raise_only_corrupt_record_error(buf: bytes, verify: bool) -> None:
    try:
        entry = decode_legacy_entry(buf, verify_crc=verify)
        records = entry.records(verify_crc=verify, max_size=1 << 20)
    except CorruptRecordError as e:
        assert e.reason and (e.position is None or 0 <= e.position <= len(buf))
    else:
        assert records and all(isinstance(r, Record) for r in records)
        assert entry.size_in_bytes <= len(buf)
