"""The record-format layer against two independent implementations, real bytes both ways.

Peers (test-only dependencies):

- kafka-python 3.x (``kafka.record``): pure Python readers and builders;
- aiokafka, C-accelerated (``aiokafka.record._crecords``): a separate Cython implementation;
- aiokafka's pure Python fallback (``_DefaultRecordBatchPy``), a third reader/builder.

Directions checked, for every codec (none, gzip, snappy, lz4, zstd):

- ours -> peers: ``build_batch`` output (plain, idempotent, transactional, LogAppendTime),
  control batches, RETAIN_EMPTY headers and ``rebuild_batch`` output are read by every peer
  with the CRC validated, every batch-header field and every record field equal; also through
  the peers' MemoryRecords readers over many concatenated batches (v2 and legacy mixed);
- peers -> ours: batches from the peers' ``DefaultRecordBatchBuilder`` (base offset and leader
  epoch stamped afterwards in bytes 0..8 and 12..16, which the CRC does not cover, as a broker
  does) and legacy v0/v1 message sets from their ``LegacyRecordBatchBuilder`` decode identically
  with ``scan_batches`` + ``decode_records`` / ``cleaner.records.legacy``, checksums valid.

Peer limitations worked around (documented, not hidden):

- kafka-python's snappy needs python-snappy, which is not installed. Its own xerial framing code
  is used with cramjam's raw snappy block codec standing in (``_kafka_python_snappy``); aiokafka's
  snappy is cramjam-based already. The real-Kafka fixture test covers snappy bytes written by Java.
- aiokafka's C builder treats timestamp -1 as "first timestamp not set yet" and re-bases the
  batch on the next record's timestamp (the first record then reads back with the wrong
  timestamp), so -1 timestamps are only given to the Python builders.
- The peers' builders cannot write LogAppendTime, control batches or a delete horizon; those
  shapes are written by us and read by the peers.
- A peer builder falls back to no compression when compressing does not shrink the records;
  the codec a peer batch ends up with is taken from its attributes.
- aiokafka's C MemoryRecords leaves the inner offsets of a v1 compressed wrapper relative when a
  v0 entry precedes it in the buffer (as if it were v0), and aiokafka refuses Kafka 0.8's lz4
  frames (v0 wrappers): its legacy reader is used entry by entry, v0 lz4 skipped; kafka-python's
  MemoryRecords reads every legacy shape.
"""

from __future__ import annotations

import dataclasses
import struct
import types
import zlib
from collections.abc import Iterator
from contextlib import contextmanager

import cramjam
import crc32c
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cleaner.records.batch import BatchHeader, TimestampType
from cleaner.records.builder import build_batch, build_control_batch, build_empty_batch, rebuild_batch
from cleaner.records.columns import decode_records
from cleaner.records.compression import CompressionType
from cleaner.records.control import ControlRecordType, EndTxnMarker
from cleaner.records.record import Record
from cleaner.records.scan import scan_batches

kafka_codec = pytest.importorskip("kafka.codec")
kafka_default = pytest.importorskip("kafka.record.default_records")
kafka_legacy = pytest.importorskip("kafka.record.legacy_records")
kafka_memory = pytest.importorskip("kafka.record.memory_records")
aiokafka_default = pytest.importorskip("aiokafka.record.default_records")
aiokafka_legacy = pytest.importorskip("aiokafka.record.legacy_records")
aiokafka_memory = pytest.importorskip("aiokafka.record.memory_records")
aiokafka_control = pytest.importorskip("aiokafka.record.control_record")

NONE, GZIP, SNAPPY, LZ4, ZSTD = (
    CompressionType.NONE,
    CompressionType.GZIP,
    CompressionType.SNAPPY,
    CompressionType.LZ4,
    CompressionType.ZSTD,
)
CODECS = list(CompressionType)
CODEC_IDS = [c.kafka_name for c in CODECS]

READERS = {
    "kafka-python": kafka_default.DefaultRecordBatch,
    "aiokafka": aiokafka_default.DefaultRecordBatch,
    "aiokafka-py": aiokafka_default._DefaultRecordBatchPy,
}
BUILDERS = {
    "kafka-python": kafka_default.DefaultRecordBatchBuilder,
    "aiokafka": aiokafka_default.DefaultRecordBatchBuilder,
    "aiokafka-py": aiokafka_default._DefaultRecordBatchBuilderPy,
}
# Builders that keep a first timestamp of -1 (aiokafka's C builder uses -1 as "unset").
BUILDERS_WITH_NO_TIMESTAMP = {"kafka-python", "aiokafka-py"}

PEER_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_peers_are_the_implementations_we_think() -> None:
    """The C reader really is the Cython one (an independent implementation), not the Python fallback."""
    assert aiokafka_default.DefaultRecordBatch.__module__.startswith("aiokafka.record._crecords")
    assert aiokafka_default.DefaultRecordBatchBuilder.__module__.startswith("aiokafka.record._crecords")
    assert aiokafka_memory.MemoryRecords.__module__.startswith("aiokafka.record._crecords")


# ---- kafka-python snappy -------------------------------------------------------------------------


class _RawSnappy(types.SimpleNamespace):
    """python-snappy's two functions that kafka.codec calls, on cramjam's raw block codec."""

    @staticmethod
    def compress(data: bytes) -> bytes:
        return bytes(cramjam.snappy.compress_raw(bytes(data)))

    @staticmethod
    def decompress(data: bytes) -> bytes:
        return bytes(cramjam.snappy.decompress_raw(bytes(data)))


@contextmanager
def _kafka_python_snappy() -> Iterator[None]:
    if kafka_codec.has_snappy():
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kafka_codec, "snappy", _RawSnappy())
        yield


@pytest.fixture(scope="module", autouse=True)
def kafka_python_snappy() -> Iterator[None]:
    with _kafka_python_snappy():
        yield


def test_kafka_python_snappy_stand_in_writes_xerial_framing() -> None:
    """The stand-in only supplies raw blocks; the framing is kafka-python's own xerial writer."""
    data = b"0123456789" * 10_000
    framed = kafka_codec.snappy_encode(data)
    assert framed[:16] == b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    assert kafka_codec.snappy_decode(framed) == data


# ---- strategies ----------------------------------------------------------------------------------

keys = st.one_of(st.none(), st.just(b""), st.binary(max_size=24))
# Repetitive values make the peers' builders actually compress (they fall back to no compression
# when it does not pay, which random bytes never do).
repetitive = st.builds(lambda chunk, n: chunk * n, st.binary(min_size=1, max_size=16), st.integers(8, 300))
values = st.one_of(
    st.none(), st.just(b""), st.binary(max_size=200), st.binary(min_size=300, max_size=2000), repetitive, repetitive
)
header_lists = st.lists(
    st.tuples(st.text(max_size=10), st.one_of(st.none(), st.just(b""), st.binary(max_size=12))), max_size=3
).map(tuple)
realistic_ts = st.integers(1_500_000_000_000, 1_800_000_000_000)
wide_ts = st.integers(0, 2**50)
KINDS = ("plain", "idempotent", "transactional", "log_append")


@st.composite
def batch_specs(
    draw: st.DrawFn, *, allow_no_timestamp: bool = True, kinds: tuple[str, ...] = KINDS, max_records: int = 12
) -> dict:
    """One batch: records with absolute offsets (gaps as after compaction) plus header fields."""
    n = draw(st.integers(1, max_records))
    base = draw(st.integers(0, 2**62))
    gaps = draw(st.lists(st.one_of(st.just(1), st.integers(1, 5), st.integers(1, 2**20)), min_size=n, max_size=n))
    ts_choices = [realistic_ts, wide_ts]
    if allow_no_timestamp:
        ts_choices.append(st.just(-1))
    ts = st.one_of(*ts_choices)
    records, offset = [], base
    for gap in gaps:
        records.append(Record(offset, draw(ts), draw(keys), draw(values), draw(header_lists)))
        offset += gap
    kind = draw(st.sampled_from(kinds))
    has_producer = kind in ("idempotent", "transactional") or (kind == "log_append" and draw(st.booleans()))
    spec = {
        "records": records,
        "kind": kind,
        "base_offset": base,
        "producer_id": draw(st.integers(0, 2**63 - 1)) if has_producer else -1,
        "producer_epoch": draw(st.integers(0, 2**15 - 1)) if has_producer else -1,
        "base_sequence": draw(st.integers(0, 2**31 - 1)) if has_producer else -1,
        "is_transactional": kind == "transactional",
        "partition_leader_epoch": draw(st.one_of(st.just(-1), st.integers(0, 2**31 - 1))),
        # A cleaned batch keeps its lastOffsetDelta past its last remaining record.
        "extra_tail": draw(st.one_of(st.just(0), st.integers(1, 1000))),
        "log_append_time": draw(realistic_ts) if kind == "log_append" else None,
    }
    return spec


def build_ours(spec: dict, codec: CompressionType) -> bytes:
    records = spec["records"]
    log_append = spec["log_append_time"] is not None
    return build_batch(
        records,
        compression=codec,
        timestamp_type=TimestampType.LOG_APPEND_TIME if log_append else TimestampType.CREATE_TIME,
        producer_id=spec["producer_id"],
        producer_epoch=spec["producer_epoch"],
        base_sequence=spec["base_sequence"],
        is_transactional=spec["is_transactional"],
        partition_leader_epoch=spec["partition_leader_epoch"],
        last_offset_delta=records[-1].offset - spec["base_offset"] + spec["extra_tail"],
        max_timestamp=spec["log_append_time"] if log_append else None,
    )


def expected_header(spec: dict, codec: int) -> dict:
    records = spec["records"]
    log_append = spec["log_append_time"] is not None
    return {
        "base_offset": spec["base_offset"],
        "last_offset_delta": records[-1].offset - spec["base_offset"] + spec["extra_tail"],
        "first_timestamp": records[0].timestamp,
        "max_timestamp": spec["log_append_time"] if log_append else max(r.timestamp for r in records),
        "producer_id": spec["producer_id"],
        "producer_epoch": spec["producer_epoch"],
        "base_sequence": spec["base_sequence"],
        "is_transactional": spec["is_transactional"],
        "is_control_batch": False,
        "timestamp_type": 1 if log_append else 0,
        "compression_type": int(codec),
        "magic": 2,
    }


def as_read(records: list[Record], log_append_time: int | None) -> list[Record]:
    """What a reader reports: LogAppendTime batches give every record the batch's time."""
    if log_append_time is None:
        return list(records)
    return [Record(r.offset, log_append_time, r.key, r.value, r.headers) for r in records]


# ---- reading with a peer -------------------------------------------------------------------------


def peer_header(batch: object) -> dict:
    return {
        "base_offset": batch.base_offset,
        "last_offset_delta": batch.last_offset_delta,
        "first_timestamp": batch.first_timestamp,
        "max_timestamp": batch.max_timestamp,
        "producer_id": batch.producer_id,
        "producer_epoch": batch.producer_epoch,
        "base_sequence": batch.base_sequence,
        "is_transactional": bool(batch.is_transactional),
        "is_control_batch": bool(batch.is_control_batch),
        "timestamp_type": batch.timestamp_type,
        "compression_type": batch.compression_type,
        "magic": batch.magic,
    }


def peer_records(batch: object) -> list[Record]:
    return [
        Record(r.offset, r.timestamp, r.key, r.value, tuple((k, v) for k, v in r.headers)) for r in batch
    ]


def read_with(peer: str, data: bytes) -> tuple[dict, list[Record]]:
    """One v2 batch through a peer reader: CRC first (it must come before iteration), then fields."""
    batch = READERS[peer](bytes(data))
    assert batch.validate_crc(), f"{peer} rejects the CRC"
    header = peer_header(batch)
    records = peer_records(batch)
    if peer == "kafka-python":  # the only peer that exposes these two
        header["records_count"] = batch.records_count
        header["partition_leader_epoch"] = batch.leader_epoch
    return header, records


def read_ours(data: bytes) -> tuple[dict, list[Record], BatchHeader]:
    result = scan_batches(data)
    assert result.end == len(data) and result.next_entry_size is None
    batches = result.batches
    assert len(batches) == 1
    assert batches.verify_checksums() == []
    h = batches.header(0)
    header = {
        "base_offset": h.base_offset,
        "last_offset_delta": h.last_offset_delta,
        "first_timestamp": h.base_timestamp,
        "max_timestamp": h.max_timestamp,
        "producer_id": h.producer_id,
        "producer_epoch": h.producer_epoch,
        "base_sequence": h.base_sequence,
        "is_transactional": h.is_transactional,
        "is_control_batch": h.is_control,
        "timestamp_type": int(h.timestamp_type),
        "compression_type": h.compression,
        "magic": h.magic,
    }
    return header, decode_records(batches).records(), h


# ---- ours -> peers -------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
@PEER_SETTINGS
@given(spec=batch_specs())
def test_our_batches_read_identically_by_peers(codec: CompressionType, spec: dict) -> None:
    data = build_ours(spec, codec)
    want_header = expected_header(spec, codec)
    want_records = as_read(spec["records"], spec["log_append_time"])
    ours_header, ours_records, _ = read_ours(data)
    assert ours_header == want_header
    assert ours_records == want_records
    for peer in READERS:
        header, records = read_with(peer, data)
        if peer == "kafka-python":
            assert header.pop("records_count") == len(spec["records"])
            assert header.pop("partition_leader_epoch") == spec["partition_leader_epoch"]
        assert header == want_header, peer
        assert records == want_records, peer


@st.composite
def mixed_logs(draw: st.DrawFn) -> tuple[bytes, list[tuple[dict, list[Record]]]]:
    """Several v2 batches (every codec, control and empty headers among them) in one buffer."""
    parts: list[bytes] = []
    expected: list[tuple[dict, list[Record]]] = []
    for _ in range(draw(st.integers(1, 12))):
        shape = draw(st.sampled_from(["data", "data", "data", "control", "empty"]))
        if shape == "control":
            marker = draw(st.sampled_from([ControlRecordType.ABORT, ControlRecordType.COMMIT]))
            offset, pid, epoch = draw(st.integers(0, 2**60)), draw(st.integers(0, 2**40)), draw(st.integers(0, 99))
            ts, coordinator_epoch = draw(realistic_ts), draw(st.integers(0, 2**31 - 1))
            parts.append(
                build_control_batch(
                    marker, offset=offset, producer_id=pid, producer_epoch=epoch,
                    coordinator_epoch=coordinator_epoch, timestamp=ts,
                )
            )
            header = {
                "base_offset": offset, "last_offset_delta": 0, "first_timestamp": ts, "max_timestamp": ts,
                "producer_id": pid, "producer_epoch": epoch, "base_sequence": -1, "is_transactional": True,
                "is_control_batch": True, "timestamp_type": 0, "compression_type": 0, "magic": 2,
            }
            value = EndTxnMarker(marker, coordinator_epoch).value_bytes()
            expected.append((header, [Record(offset, ts, marker.key_bytes(), value)]))
            continue
        spec = draw(batch_specs(max_records=6))
        codec = draw(st.sampled_from(CODECS))
        data = build_ours(spec, codec)
        if shape == "empty":
            parts.append(build_empty_batch(BatchHeader.parse(data)))
            header = expected_header(spec, NONE) | {"first_timestamp": -1}
            expected.append((header, []))
        else:
            parts.append(data)
            expected.append((expected_header(spec, codec), as_read(spec["records"], spec["log_append_time"])))
    return b"".join(parts), expected


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log=mixed_logs())
def test_concatenated_batches_through_peer_memory_records(log: tuple[bytes, list]) -> None:
    blob, expected = log
    # kafka-python
    seen = []
    for batch in kafka_memory.MemoryRecords(blob):
        assert batch.validate_crc()
        seen.append((peer_header(batch), peer_records(batch)))
    assert seen == expected
    # aiokafka (C)
    records = aiokafka_memory.MemoryRecords(blob)
    seen = []
    while records.has_next():
        batch = records.next_batch()
        assert batch.validate_crc()
        seen.append((peer_header(batch), peer_records(batch)))
    assert seen == expected
    # ours, in one pass over the whole buffer
    batches = scan_batches(blob).batches
    assert batches.verify_checksums() == []
    assert len(batches) == len(expected)
    assert decode_records(batches).records() == [r for _, recs in expected for r in recs]


# ---- control batches and RETAIN_EMPTY headers ----------------------------------------------------


@PEER_SETTINGS
@given(
    marker=st.sampled_from([ControlRecordType.ABORT, ControlRecordType.COMMIT]),
    offset=st.integers(0, 2**62),
    producer_id=st.integers(0, 2**63 - 1),
    producer_epoch=st.integers(0, 2**15 - 1),
    coordinator_epoch=st.integers(0, 2**31 - 1),
    timestamp=realistic_ts,
    leader_epoch=st.integers(-1, 2**31 - 1),
)
def test_transaction_markers_read_by_peers(
    marker: ControlRecordType, offset: int, producer_id: int, producer_epoch: int, coordinator_epoch: int,
    timestamp: int, leader_epoch: int,
) -> None:
    """KAFKA_NOTES §1.4: key = version 0, type; value = version 0, coordinatorEpoch; 78 bytes."""
    data = build_control_batch(
        marker, offset=offset, producer_id=producer_id, producer_epoch=producer_epoch,
        coordinator_epoch=coordinator_epoch, timestamp=timestamp, partition_leader_epoch=leader_epoch,
    )
    assert len(data) == 78
    key, value = struct.pack(">hh", 0, int(marker)), struct.pack(">hi", 0, coordinator_epoch)
    want = {
        "base_offset": offset, "last_offset_delta": 0, "first_timestamp": timestamp, "max_timestamp": timestamp,
        "producer_id": producer_id, "producer_epoch": producer_epoch, "base_sequence": -1,
        "is_transactional": True, "is_control_batch": True, "timestamp_type": 0, "compression_type": 0, "magic": 2,
    }
    for peer in READERS:
        header, records = read_with(peer, data)
        header.pop("records_count", None)
        header.pop("partition_leader_epoch", None)
        assert header == want, peer
        assert records == [Record(offset, timestamp, key, value)], peer
    # The peers' own marker parsers.
    (kp,) = list(kafka_default.DefaultRecordBatch(data))
    assert (kp.version, kp.type, kp.commit, kp.abort) == (
        0, int(marker), marker == ControlRecordType.COMMIT, marker == ControlRecordType.ABORT
    )
    (ak,) = list(aiokafka_default.DefaultRecordBatch(data))
    expected_marker = aiokafka_control.COMMIT_MARKER if marker == ControlRecordType.COMMIT else (
        aiokafka_control.ABORT_MARKER
    )
    assert aiokafka_control.ControlRecord.parse(ak.key) == expected_marker
    # And ours.
    ours_header, ours_records, h = read_ours(data)
    assert ours_header == want
    assert h.partition_leader_epoch == leader_epoch
    (record,) = ours_records
    assert ControlRecordType.parse_key(record.key) == marker
    assert EndTxnMarker.parse(marker, record.value) == EndTxnMarker(marker, coordinator_epoch)


def test_kraft_control_record_types_read_by_peers() -> None:
    """Control batches of the KRaft types (LeaderChange, snapshot header/footer, ...) keep their key."""
    for t in (2, 3, 4, 5, 6):
        key = struct.pack(">hh", 0, t)
        data = build_batch([Record(10, 1000, key, b"\x00\x00payload")], is_control=True, partition_leader_epoch=1)
        for peer in READERS:
            header, records = read_with(peer, data)
            assert header["is_control_batch"] and not header["is_transactional"]
            assert [r.key for r in records] == [key]
        assert ControlRecordType.parse_key(read_ours(data)[1][0].key) == ControlRecordType(t)


# KAFKA_NOTES §1.6 test vectors (CRCs cross-checked there with java.util.zip.CRC32C).
VECTORS = {
    "a": "00000000000000000000003a0000000002716a618900000000000000000000000003e800000000000003e8"
    "ffffffffffffffffffffffffffff0000000110000000026b027600",
    "b": "0000000000000005000000420000000002410cebf300300000000000000000000007d000000000000007d0"
    "00000000000000070001ffffffff000000012000000008000000010c00000000000300",
    "c": "000000000000000a000000310000000002bfc4580f000000000002ffffffffffffffff0000000000000bb8"
    "000000000000000700010000000400000000",
    "d": "00000000000000000000003c0000000002d9af37140040000000000000000005265fe800000000000003e8"
    "ffffffffffffffffffffffffffff000000011400ffefb25200026b0100",
}


@pytest.mark.parametrize("peer", list(READERS))
def test_kafka_notes_vectors_read_by_peers(peer: str) -> None:
    """The spec's vectors mean to the peers what they mean to us: (a) one record, (b) a COMMIT
    marker, (c) a RETAIN_EMPTY header, (d) a tombstone whose timestamp survives the horizon."""
    header, records = read_with(peer, bytes.fromhex(VECTORS["a"]))
    assert records == [Record(0, 1000, b"k", b"v")] and header["max_timestamp"] == 1000
    header, records = read_with(peer, bytes.fromhex(VECTORS["b"]))
    assert header["is_control_batch"] and header["is_transactional"] and header["producer_id"] == 7
    assert records == [Record(5, 2000, struct.pack(">hh", 0, 1), struct.pack(">hi", 0, 3))]
    header, records = read_with(peer, bytes.fromhex(VECTORS["c"]))
    assert records == [] and (header["base_offset"], header["last_offset_delta"]) == (10, 2)
    assert (header["producer_id"], header["producer_epoch"], header["base_sequence"]) == (7, 1, 4)
    assert (header["first_timestamp"], header["max_timestamp"]) == (-1, 3000)
    header, records = read_with(peer, bytes.fromhex(VECTORS["d"]))
    assert header["first_timestamp"] == 86_401_000  # the horizon; the peers know nothing of bit 6
    assert records == [Record(0, 1000, b"k", None)]
    for vector in VECTORS.values():
        assert read_ours(bytes.fromhex(vector))[1] == read_with(peer, bytes.fromhex(vector))[1]


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
@PEER_SETTINGS
@given(spec=batch_specs(kinds=KINDS), control=st.booleans())
def test_retain_empty_headers_read_by_peers(codec: CompressionType, spec: dict, control: bool) -> None:
    """``build_empty_batch``: offsets, producer fields, maxTimestamp kept; no codec, base ts -1, no records."""
    if control:
        spec = spec | {"is_transactional": True, "producer_id": max(spec["producer_id"], 7),
                       "producer_epoch": max(spec["producer_epoch"], 0)}
    original = build_ours(spec, codec)
    original_header = BatchHeader.parse(original)
    if control:  # the header of a control batch (its records long gone)
        original_header = dataclasses.replace(original_header, attributes=original_header.attributes | 0x20)
    empty = build_empty_batch(original_header)
    assert len(empty) == 61
    want = expected_header(spec, NONE) | {"first_timestamp": -1, "is_control_batch": control}
    for peer in READERS:
        header, records = read_with(peer, empty)
        if peer == "kafka-python":
            assert header.pop("records_count") == 0
            assert header.pop("partition_leader_epoch") == spec["partition_leader_epoch"]
        assert header == want, peer
        assert records == [], peer
    ours_header, ours_records, _ = read_ours(empty)
    assert ours_header == want and ours_records == []


# ---- peers -> ours -------------------------------------------------------------------------------


def build_with(peer: str, spec: dict, codec: CompressionType) -> bytes:
    """A peer producer's batch, then what the broker stamps: base offset and leader epoch."""
    builder = BUILDERS[peer](
        2, int(codec), int(spec["is_transactional"]), spec["producer_id"], spec["producer_epoch"],
        spec["base_sequence"], 1 << 30,
    )
    for r in spec["records"]:
        meta = builder.append(r.offset - spec["base_offset"], r.timestamp, r.key, r.value, list(r.headers))
        assert meta is not None
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, spec["base_offset"])  # outside the CRC, as a leader assigns it
    struct.pack_into(">i", data, 12, spec["partition_leader_epoch"])
    return bytes(data)


PEER_KINDS = ("plain", "idempotent", "transactional")


@pytest.mark.parametrize("peer", list(BUILDERS))
@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
@PEER_SETTINGS
@given(data=st.data())
def test_peer_batches_read_identically_by_us(peer: str, codec: CompressionType, data: st.DataObject) -> None:
    spec = data.draw(
        batch_specs(allow_no_timestamp=peer in BUILDERS_WITH_NO_TIMESTAMP, kinds=PEER_KINDS).map(
            lambda s: s | {"extra_tail": 0}
        )
    )
    raw = build_with(peer, spec, codec)
    written_codec = raw[22] & 0x07
    assert written_codec in (int(codec), 0)  # a peer sends uncompressed when compressing does not pay
    header, records, h = read_ours(raw)
    assert header == expected_header(spec, written_codec)
    assert h.partition_leader_epoch == spec["partition_leader_epoch"]
    assert h.records_count == len(spec["records"])
    assert records == spec["records"]
    # The peer agrees with itself on the same bytes.
    assert read_with("kafka-python", raw)[1] == records


@pytest.mark.parametrize("peer", list(BUILDERS))
@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_peer_compressed_batches_of_many_records(peer: str, codec: CompressionType) -> None:
    """A producer-sized batch (~16 KiB of records before compression) that the peer does compress."""
    records = [
        Record(1_000_000 + i, 1_700_000_000_000 + i * 3, b"key-%06d" % (i % 97), b"value %d " % i * 12,
               (("trace", b"%d" % i),) if i % 5 == 0 else ())
        for i in range(150)
    ]
    spec = {
        "records": records, "base_offset": records[0].offset, "producer_id": 42, "producer_epoch": 3,
        "base_sequence": 1000, "is_transactional": False, "partition_leader_epoch": 9, "extra_tail": 0,
        "log_append_time": None,
    }
    raw = build_with(peer, spec, codec)
    assert raw[22] & 0x07 == int(codec)
    if codec != NONE:
        assert len(raw) < 16_000 // 2
    header, decoded, _ = read_ours(raw)
    assert header == expected_header(spec, codec)
    assert decoded == records


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=st.lists(
        st.tuples(st.sampled_from(list(BUILDERS)), st.sampled_from(CODECS), batch_specs(
            allow_no_timestamp=False, kinds=PEER_KINDS, max_records=8
        )),
        min_size=1,
        max_size=24,
    )
)
def test_many_peer_batches_decode_in_one_pass(specs: list) -> None:
    """Enough peer batches in one buffer to exercise the lock-step record boundary walk."""
    blob = b"".join(build_with(peer, spec | {"extra_tail": 0}, codec) for peer, codec, spec in specs)
    batches = scan_batches(blob).batches
    assert len(batches) == len(specs) and batches.verify_checksums() == []
    columns = decode_records(batches)
    assert columns.records() == [r for _, _, spec in specs for r in spec["records"]]
    assert columns.is_tombstone.tolist() == [r.is_tombstone for _, _, spec in specs for r in spec["records"]]


# ---- rebuild -------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
@PEER_SETTINGS
@given(spec=batch_specs(), data=st.data())
def test_rebuilt_batches_read_identically_by_peers(codec: CompressionType, spec: dict, data: st.DataObject) -> None:
    """A subset of the records (the first one possibly gone), with and without a delete horizon."""
    original = build_ours(spec, codec)
    columns = decode_records(scan_batches(original).batches)
    n = len(spec["records"])
    keep = sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1)))
    horizon = data.draw(st.one_of(st.none(), realistic_ts, wide_ts))
    rebuilt = rebuild_batch(columns, 0, np.array(keep, dtype=np.int64), delete_horizon_ms=horizon)
    kept = [spec["records"][i] for i in keep]
    want_records = as_read(kept, spec["log_append_time"])
    log_append = spec["log_append_time"] is not None
    want = expected_header(spec, codec) | {
        "first_timestamp": horizon if horizon is not None else want_records[0].timestamp,
        "max_timestamp": spec["log_append_time"] if log_append else max(r.timestamp for r in kept),
    }
    for peer in READERS:
        header, records = read_with(peer, rebuilt)
        if peer == "kafka-python":
            assert header.pop("records_count") == len(kept)
            assert header.pop("partition_leader_epoch") == spec["partition_leader_epoch"]
        assert header == want, peer
        assert records == want_records, peer
    ours_header, ours_records, h = read_ours(rebuilt)
    assert ours_header == want and ours_records == want_records
    assert h.delete_horizon_ms == horizon
    if keep == list(range(n)) and horizon is None and codec == NONE and not log_append:
        assert rebuilt == original  # nothing changes: the records are copied whole

    # A later cleaning of the cleaned batch: another subset, the horizon kept, replaced or gone.
    columns2 = decode_records(scan_batches(rebuilt).batches)
    keep2 = sorted(data.draw(st.sets(st.integers(0, len(kept) - 1), min_size=1)))
    horizon2 = data.draw(st.sampled_from([horizon, None, 2**41]))
    again = rebuild_batch(columns2, 0, np.array(keep2, dtype=np.int64), delete_horizon_ms=horizon2)
    kept2 = [want_records[i] for i in keep2]
    for peer in READERS:
        header, records = read_with(peer, again)
        assert records == kept2, peer
        assert header["first_timestamp"] == (horizon2 if horizon2 is not None else kept2[0].timestamp), peer
        assert (header["base_offset"], header["last_offset_delta"]) == (want["base_offset"], want["last_offset_delta"])
    assert read_ours(again)[2].delete_horizon_ms == horizon2


@pytest.mark.parametrize("codec", [GZIP, SNAPPY, LZ4, ZSTD], ids=[c.kafka_name for c in (GZIP, SNAPPY, LZ4, ZSTD)])
def test_rebuild_keeping_no_rows_of_a_compressed_batch_is_readable(codec: CompressionType) -> None:
    """A rebuilt batch that keeps none of its records is read as empty by us and by every peer.

    (It was once left empty with the codec bits set, which our decode_records and the peers
    rejected; then written as a header-only snappy stream, which the Python peers read as raw
    snappy and reject. Like Kafka's empty headers it is now written without compression.)"""
    original = build_batch([Record(5, 1000, b"k", b"v"), Record(6, 1001, b"k2", None)], compression=codec)
    columns = decode_records(scan_batches(original).batches)
    rebuilt = rebuild_batch(columns, 0, np.zeros(0, dtype=np.int64), delete_horizon_ms=None)
    batches = scan_batches(rebuilt).batches
    assert batches.verify_checksums() == []
    assert len(decode_records(batches)) == 0
    for peer in READERS:
        assert read_with(peer, rebuilt)[1] == [], peer


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_decode_of_a_zero_record_batch_with_codec_bits_reads_no_records_like_kafka(codec: CompressionType) -> None:
    """Kafka's DefaultRecordBatch.iterator() returns no records for a count of 0 without looking at
    the section; a 0-record batch with codec bits and no section at all reads as empty here too.

    (Before b08373d decode_records decompressed it and raised CorruptRecordError for gzip/snappy/lz4.)"""
    empty = build_empty_batch(BatchHeader.parse(build_batch([Record(9, 1, b"k", b"v")], producer_id=3,
                                                            producer_epoch=0, base_sequence=0)))
    header = bytearray(empty)
    header[22] |= int(codec)
    struct.pack_into(">I", header, 17, crc32c.crc32c(bytes(header[21:])))
    batches = scan_batches(bytes(header)).batches
    assert batches.verify_checksums() == []
    assert len(decode_records(batches)) == 0


# ---- legacy v0/v1 from the peers' builders -------------------------------------------------------

LEGACY_BUILDERS = {
    "kafka-python": kafka_legacy.LegacyRecordBatchBuilder,
    "aiokafka": aiokafka_legacy.LegacyRecordBatchBuilder,
}


def _stamp_legacy(entry: bytearray, position: int, *, offset: int, timestamp: int | None, log_append: bool) -> None:
    """The broker's in-place rewrite of a producer's wrapper (LogValidator): offset, and for v1 the
    wrapper timestamp and type; then the message CRC-32 (magic..end) again."""
    struct.pack_into(">q", entry, position, offset)
    size = struct.unpack_from(">i", entry, position + 8)[0]
    if entry[position + 16] == 1:
        if log_append:
            entry[position + 17] |= 0x08
        if timestamp is not None:
            struct.pack_into(">q", entry, position + 18, timestamp)
    end = position + 12 + size
    struct.pack_into(">I", entry, position + 12, zlib.crc32(entry[position + 16 : end]))


@st.composite
def legacy_sets(draw: st.DrawFn) -> tuple[bytes, list[list[Record]], list[tuple[int, int, int]], list[bytes]]:
    """A log of legacy entries from a peer builder, as a broker stores them.

    Returns (bytes, records of each entry, (magic, codec, wrapper offset) of each entry, the entries).
    """
    entries: list[bytes] = []
    per_entry: list[list[Record]] = []
    shapes: list[tuple[int, int, int]] = []
    next_offset = draw(st.integers(0, 2**50))
    for _ in range(draw(st.integers(1, 6))):
        peer = draw(st.sampled_from(list(LEGACY_BUILDERS)))
        magic = draw(st.sampled_from([0, 1]))
        codec = draw(st.sampled_from([NONE, GZIP, SNAPPY, LZ4]))
        if peer == "aiokafka" and magic == 0 and codec == LZ4:
            peer = "kafka-python"  # aiokafka refuses Kafka 0.8's broken lz4 frame; kafka-python writes it
        n = draw(st.integers(1, 8))
        rows = [
            (draw(keys), draw(values), draw(realistic_ts) if magic == 1 else -1)
            for _ in range(n)
        ]
        offsets = []
        for _ in range(n):
            offsets.append(next_offset)
            next_offset += draw(st.integers(1, 3))
        log_append = magic == 1 and codec != NONE and draw(st.booleans())
        if codec == NONE:
            # Each record is its own entry; the broker writes absolute offsets.
            for offset, (key, value, ts) in zip(offsets, rows, strict=True):
                builder = LEGACY_BUILDERS[peer](magic, 0, 1 << 30)
                assert builder.append(0, ts if magic == 1 else None, key, value) is not None
                entry = bytearray(builder.build())
                _stamp_legacy(entry, 0, offset=offset, timestamp=None, log_append=False)
                entries.append(bytes(entry))
                per_entry.append([Record(offset, ts, key, value)])
                shapes.append((magic, 0, offset))
            continue
        builder = LEGACY_BUILDERS[peer](magic, int(codec), 1 << 30)
        # v0 inner offsets are absolute; v1 inner offsets are relative to the wrapper's.
        inner_offsets = offsets if magic == 0 else [o - offsets[0] for o in offsets]
        for inner, (key, value, ts) in zip(inner_offsets, rows, strict=True):
            assert builder.append(inner, ts if magic == 1 else None, key, value) is not None
        entry = bytearray(builder.build())
        wrapper_ts = draw(realistic_ts) if log_append else (max(r[2] for r in rows) if magic == 1 else None)
        _stamp_legacy(entry, 0, offset=offsets[-1], timestamp=wrapper_ts, log_append=log_append)
        entries.append(bytes(entry))
        per_entry.append([
            Record(o, wrapper_ts if log_append else ts, key, value)
            for o, (key, value, ts) in zip(offsets, rows, strict=True)
        ])
        shapes.append((magic, int(codec), offsets[-1]))
    return b"".join(entries), per_entry, shapes, entries


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log=legacy_sets())
def test_peer_legacy_message_sets_scan_and_decode(log: tuple) -> None:
    blob, per_entry, shapes, entries = log
    result = scan_batches(blob)
    assert result.end == len(blob)
    batches = result.batches
    assert len(batches) == len(per_entry)
    assert batches.verify_checksums() == []
    assert (batches.magic < 2).all() and not batches.is_v2.any()
    assert batches.magic.tolist() == [m for m, _, _ in shapes]
    assert batches.compression.tolist() == [c for _, c, _ in shapes]
    assert batches.last_offsets.tolist() == [o for _, _, o in shapes]
    assert batches.base_offsets.tolist() == [recs[0].offset for recs in per_entry]
    assert batches.records_counts.tolist() == [len(recs) for recs in per_entry]
    assert batches.max_timestamps.tolist() == [
        max(r.timestamp for r in recs) for recs in per_entry
    ]
    decoded = [batches.legacy[i].records(verify_crc=True) for i in range(len(batches))]
    assert decoded == per_entry
    assert len(decode_records(batches)) == 0  # legacy rows are not v2 records
    # kafka-python's and aiokafka's readers see the same.
    kp = [
        [Record(r.offset, -1 if r.timestamp is None else r.timestamp, r.key, r.value) for r in batch]
        for batch in kafka_memory.MemoryRecords(blob)
    ]
    assert kp == per_entry
    # aiokafka's C reader, one entry at a time (its C MemoryRecords mis-reads a v1 wrapper that
    # follows a v0 entry, see the module docstring); it cannot read Kafka 0.8's lz4 frames.
    for entry, (magic, codec, _), want in zip(entries, shapes, per_entry, strict=True):
        if magic == 0 and codec == LZ4:
            continue
        batch = aiokafka_legacy.LegacyRecordBatch(entry, magic)
        assert batch.validate_crc()
        got = [Record(r.offset, -1 if r.timestamp is None else r.timestamp, r.key, r.value) for r in batch]
        assert got == want


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log=legacy_sets(), data=st.data())
def test_legacy_crc32_damage_is_reported_for_that_entry(log: tuple, data: st.DataObject) -> None:
    blob, per_entry, _, _ = log
    batches = scan_batches(blob).batches
    i = data.draw(st.integers(0, len(batches) - 1))
    position, size = int(batches.positions[i]), int(batches.sizes[i])
    damaged = bytearray(blob)
    damaged[position + 12] ^= 0x01  # the stored CRC-32 itself: structure stays intact
    (problem,) = scan_batches(bytes(damaged)).batches.verify_checksums()
    assert problem.position == position and problem.offset == per_entry[i][0].offset
    assert "crc" in problem.reason
    assert bytes(damaged[position : position + size]) != blob[position : position + size]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log=legacy_sets(), spec=batch_specs(max_records=5), codec=st.sampled_from(CODECS))
def test_legacy_and_v2_in_one_buffer(log: tuple, spec: dict, codec: CompressionType) -> None:
    """A segment written across a message-format upgrade: legacy entries, then v2 batches."""
    blob, per_entry, _, _ = log
    last = per_entry[-1][-1].offset
    shift = last + 1 - spec["base_offset"]
    spec = spec | {
        "base_offset": last + 1,
        "records": [Record(r.offset + shift, r.timestamp, r.key, r.value, r.headers) for r in spec["records"]],
    }
    v2 = build_ours(spec, codec)
    batches = scan_batches(blob + v2).batches
    assert batches.verify_checksums() == []
    assert batches.is_v2.tolist() == [False] * len(per_entry) + [True]
    assert decode_records(batches).records() == as_read(spec["records"], spec["log_append_time"])
    seen = [[(r.offset, r.key, r.value) for r in batch] for batch in kafka_memory.MemoryRecords(blob + v2)]
    assert seen[-1] == [(r.offset, r.key, r.value) for r in spec["records"]]
    assert seen[:-1] == [[(r.offset, r.key, r.value) for r in recs] for recs in per_entry]
