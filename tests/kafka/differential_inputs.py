"""Log dirs for the differential tests (``test_differential.py``) whose shapes the generators
do not write: legacy v0/v1 entries before v2 batches, a hanging transaction, batches whose
delete horizon is exactly the cleaner's clock, a ``__cluster_metadata-0`` next to the
partitions. Each builder writes partition directories; ``finish_log_dir`` adds what a
broker leaves at a clean shutdown (high watermarks at the log end, recovery points)."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path

from kafka.record.legacy_records import LegacyRecordBatchBuilder

from cleaner.records.builder import build_batch, build_control_batch
from cleaner.records.compression import CompressionType
from cleaner.records.control import ControlRecordType, EndTxnMarker
from cleaner.records.record import Record
from cleaner.storage.checkpoint import (
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
)
from cleaner.storage.index import AbortedTxn
from cleaner.storage.log import Log, LogConfig
from cleaner.storage.topic_partition import TopicPartition

Row = tuple[int, int, bytes | None, bytes | None]  # offset, timestamp, key, value


def finish_log_dir(log_dir: Path, ends: Mapping[TopicPartition, int], *, clean_shutdown: bool = True) -> Path:
    """High watermarks and recovery points at ``ends``; a clean-shutdown marker."""
    for checkpoint in (REPLICATION_OFFSET_CHECKPOINT, RECOVERY_POINT_OFFSET_CHECKPOINT):
        OffsetCheckpointFile(log_dir / checkpoint).update(set=dict(ends))
    if clean_shutdown:
        (log_dir / ".kafka_cleanshutdown").write_text('{"version":0,"broker_epoch":1}')
    return log_dir


def legacy_plain(magic: int, row: Row) -> bytes:
    """One uncompressed legacy message (v0 carries no timestamp)."""
    offset, ts, key, value = row
    builder = LegacyRecordBatchBuilder(magic, 0, 1 << 20)
    builder.append(offset, ts if magic else None, key, value)
    return bytes(builder.build())


def legacy_wrapper(magic: int, codec: int, rows: Sequence[Row], *, log_append_time: int | None = None) -> bytes:
    """A compressed wrapper as a broker stores it: offset = last inner offset; inner offsets
    absolute (v0) or relative 0..n-1 (v1); a v1 wrapper carries the largest inner timestamp
    (a producer sends 0 there; the broker's ``LogValidator`` sets it with ``setMaxTimestamp``,
    and an old broker's cleaner wrote the largest too), a v1 LogAppendTime wrapper the time."""
    builder = LegacyRecordBatchBuilder(magic, codec, 1 << 20)
    for i, (offset, ts, key, value) in enumerate(rows):
        builder.append(offset if magic == 0 else i, ts if magic else None, key, value)
    buf = bytearray(builder.build())
    struct.pack_into(">q", buf, 0, rows[-1][0])
    if magic:
        buf[17] |= 0x08 if log_append_time is not None else 0
        wrapper_ts = log_append_time if log_append_time is not None else max(row[1] for row in rows)
        struct.pack_into(">q", buf, 18, wrapper_ts)
        struct.pack_into(">I", buf, 12, zlib.crc32(buf[16:]))
    return bytes(buf)


def v2(rows: Sequence[Row], **kwargs) -> bytes:
    return build_batch([Record(o, t, k, v) for o, t, k, v in rows], **kwargs)


def legacy_then_v2(partition_dir: Path, start_ms: int) -> int:
    """A partition a broker upgraded from the 0.10 message formats: segments of legacy
    entries (v0 and v1; plain messages, gzip, snappy and lz4 wrappers, a LogAppendTime
    wrapper, legacy tombstones, keys rewritten later) before segments of v2 batches that
    overwrite some of those keys, and an active segment. Returns the log end offset."""
    log = Log.create(partition_dir, LogConfig())
    t = start_ms
    o = 0

    def rows(keys: Sequence[bytes], values: Sequence[bytes | None] | None = None) -> list[Row]:
        nonlocal o
        out = [
            (o + i, t + o + i, k, (values[i] if values is not None else b"v%d" % (o + i))) for i, k in enumerate(keys)
        ]
        o += len(keys)
        return out

    # Segment 1: magic 0 (no timestamps).
    for key in (b"a", b"b", b"c"):
        log.append(legacy_plain(0, rows([key])[0]))
    log.append(legacy_wrapper(0, CompressionType.GZIP, rows([b"d", b"a", b"e"])))
    log.append(legacy_wrapper(0, CompressionType.SNAPPY, rows([b"f", b"g"])))
    log.roll(o)
    # Segment 2: magic 1.
    log.append(legacy_plain(1, rows([b"h"])[0]))
    log.append(legacy_plain(1, rows([b"b"], [None])[0]))  # a legacy tombstone
    log.append(legacy_wrapper(1, CompressionType.GZIP, rows([b"i", b"c", b"j", b"k"])))
    log.append(legacy_wrapper(1, CompressionType.LZ4, rows([b"l", b"m", b"d"], [b"x", None, b"y"])))
    log.append(legacy_wrapper(1, CompressionType.SNAPPY, rows([b"n", b"o"]), log_append_time=t + 500))
    log.roll(o)
    # Segment 3: v2 batches overwriting some legacy keys.
    log.append(v2(rows([b"a", b"e"])))
    log.append(v2(rows([b"g", b"h", b"p"], [b"x", None, b"y"]), compression=CompressionType.GZIP))
    log.append(v2(rows([b"q"])))
    log.roll(o)
    log.append(v2(rows([b"z"])))
    log.close()
    return o


def empty_legacy_entry_at_the_rounds_end(partition_dir: Path, start_ms: int) -> int:
    """A round whose last entry is a legacy message that keeps no record (it has no key):
    the cleaner must keep it empty (KAFKA-17076), which Kafka cannot do in magic 1."""
    log = Log.create(partition_dir, LogConfig())
    log.append(v2([(0, start_ms, b"a", b"v0")]))
    log.append(v2([(1, start_ms + 1, b"a", b"v1")]))
    log.append(legacy_plain(1, (2, start_ms + 2, None, b"keyless")))
    log.roll(3)
    log.append(v2([(3, start_ms + 3, b"z", b"v3")]))
    log.close()
    return 4


def hanging_transaction(partition_dir: Path, start_ms: int) -> int:
    """A transaction that was never ended (the producer went away, no marker) after some
    committed and aborted ones, then plenty of data past it in later segments; producers'
    last batches throughout. The last stable offset stays at the hanging transaction's first
    offset: only the segments below it may be cleaned."""
    log = Log.create(partition_dir, LogConfig(segment_bytes=600))
    o = 0
    seqs: dict[int, int] = {}

    def data(keys: Sequence[bytes], pid: int = -1, *, txn: bool = False, value: bytes | None = b"") -> None:
        nonlocal o
        fields = {}
        if pid >= 0:
            fields = {"producer_id": pid, "producer_epoch": 0, "base_sequence": seqs.get(pid, 0)}
            seqs[pid] = seqs.get(pid, 0) + len(keys)
        recs = [(o + i, start_ms + o + i, k, value if value is None else b"v%d" % (o + i)) for i, k in enumerate(keys)]
        log.append(v2(recs, is_transactional=txn, **fields))
        o += len(keys)

    def marker(kind: ControlRecordType, pid: int, first: int) -> None:
        nonlocal o
        log.append(
            build_control_batch(
                kind, offset=o, producer_id=pid, producer_epoch=0, coordinator_epoch=1, timestamp=start_ms + o
            )
        )
        if kind == ControlRecordType.ABORT:
            log.active_segment.append_aborted_txn(AbortedTxn(pid, first, o, o + 1))
        o += 1

    for round_ in range(3):
        first = o
        data([b"k%d" % i for i in range(4)], 500, txn=True)
        data([b"k%d" % i for i in range(2, 6)], 500, txn=True)
        marker(ControlRecordType.ABORT if round_ == 1 else ControlRecordType.COMMIT, 500, first)
        data([b"k%d" % i for i in range(3)])
        data([b"k1"], value=None)
    data([b"k%d" % i for i in range(3)], 600, txn=True)  # hangs: never ended
    for _ in range(6):
        data([b"k%d" % i for i in range(6)])
        data([b"k%d" % i for i in range(6)], 700)
    log.roll(o)
    data([b"z"])
    log.close()
    return o


def horizons_at_the_clock(partition_dir: Path, now_ms: int) -> int:
    """Batches a first clean stamped with delete horizons just before, exactly at and just
    after ``now_ms``: tombstones (plain and in a committed transaction) and the markers of
    transactions whose data is gone (an empty batch of the producer is its last). At the
    clock a horizon is reached (Kafka: ``deleteHorizonMs <= currentTime`` lets the
    tombstone and the marker go)."""
    log = Log.create(partition_dir, LogConfig(segment_bytes=700))
    o = 0
    for i, horizon in enumerate((now_ms - 1, now_ms, now_ms + 1)):
        # A tombstone batch with its horizon.
        log.append(v2([(o, now_ms - 10_000, b"t%d" % i, None)], delete_horizon_ms=horizon))
        o += 1
        # A committed transaction whose data records are gone: its marker, with a horizon.
        log.append(stamped_marker(ControlRecordType.COMMIT, o, 900 + i, now_ms - 10_000, horizon))
        o += 1
        # A transactional tombstone of a later, committed transaction, stamped too.
        pid2 = 950 + i
        log.append(
            v2(
                [(o, now_ms - 9_000, b"x%d" % i, None)],
                delete_horizon_ms=horizon,
                producer_id=pid2,
                producer_epoch=0,
                base_sequence=0,
                is_transactional=True,
            )
        )
        o += 1
        log.append(
            build_control_batch(
                ControlRecordType.COMMIT,
                offset=o,
                producer_id=pid2,
                producer_epoch=0,
                coordinator_epoch=1,
                timestamp=now_ms - 9_000,
            )
        )
        o += 1
        log.append(v2([(o, now_ms - 8_000, b"k%d" % i, b"v")]))
        o += 1
    log.roll(o)
    log.append(v2([(o, now_ms - 1_000, b"k0", b"w")]))  # dirty: makes the partition cleanable
    o += 1
    log.roll(o)
    log.append(v2([(o, now_ms, b"z", b"z")]))
    log.close()
    return o + 1


def stamped_marker(kind: ControlRecordType, offset: int, producer_id: int, timestamp: int, horizon_ms: int) -> bytes:
    """An end-transaction marker as a clean leaves it once its transaction is empty: the
    delete-horizon bit set, the base timestamp the horizon."""
    record = Record(offset, timestamp, kind.key_bytes(), EndTxnMarker(kind, 1).value_bytes())
    return build_batch(
        [record],
        producer_id=producer_id,
        producer_epoch=0,
        is_transactional=True,
        is_control=True,
        delete_horizon_ms=horizon_ms,
    )
