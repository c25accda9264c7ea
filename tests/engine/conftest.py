"""Helpers of the engine's conformance and reference-model tests.

Two halves, kept apart on purpose:

- *writing* input logs goes through the project's storage layer and batch builder
  (``LogWriter``), as a broker's appends would: offsets, rolls, ``.txnindex`` entries for
  aborted transactions;
- *reading* what the cleaner left behind does not use the project's decoders at all: the
  segment files are split into entries with ``struct``, headers are unpacked from the
  61-byte layout of KAFKA_NOTES §1.1, and records are decoded by a peer implementation
  (aiokafka's C reader), so a decoding bug in the project cannot hide a cleaning bug.

The test modules import these as ``engine_helpers`` (registered at the end of this file):
``import conftest`` would find whichever conftest.py pytest happened to import last, which
under xdist can be another directory's.
"""

from __future__ import annotations

import os
import struct
import sys
import zlib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import crc32c
import pytest

from cleaner.clock import MockTime
from cleaner.engine.cleaner import Cleaner, LogToClean
from cleaner.engine.offset_map import OffsetMap
from cleaner.engine.stats import CleanerStats
from cleaner.engine.throttler import Throttler
from cleaner.records.batch import TimestampType
from cleaner.records.builder import build_batch, build_control_batch
from cleaner.records.control import ControlRecordType
from cleaner.records.record import Record
from cleaner.storage.index import AbortedTxn
from cleaner.storage.log import Log, LogConfig
from cleaner.storage.producer_state import ActiveProducer
from cleaner.storage.topic_partition import TopicPartition

NOW = 1_700_000_000_000
DAY = 86_400_000
TP = TopicPartition("topic", 0)
BASE_TS = 1_600_000_000_000  # record timestamps: far in the past unless a test says otherwise
ABORT, COMMIT = ControlRecordType.ABORT, ControlRecordType.COMMIT

_HEADER = struct.Struct(">qiibIhiqqqhii")  # KAFKA_NOTES §1.1, 61 bytes
_TXN_ENTRY = struct.Struct(">hqqqq")  # §2.4, 34 bytes
COMMIT_KEY = struct.pack(">hh", 0, 1)
ABORT_KEY = struct.pack(">hh", 0, 0)


# ---- what is on disk, read independently ------------------------------------------------


@dataclass(frozen=True)
class Rec:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


@dataclass(frozen=True)
class DiskBatch:
    """One entry of a ``.log`` file as a reader sees it."""

    raw: bytes
    base_offset: int
    last_offset: int
    magic: int
    partition_leader_epoch: int
    crc: int
    attributes: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int
    records: tuple[Rec, ...]

    @property
    def codec(self) -> int:
        return self.attributes & 0x07

    @property
    def log_append_time(self) -> bool:
        return bool(self.attributes & 0x08)

    @property
    def is_transactional(self) -> bool:
        return self.magic >= 2 and bool(self.attributes & 0x10)

    @property
    def is_control(self) -> bool:
        return self.magic >= 2 and bool(self.attributes & 0x20)

    @property
    def horizon(self) -> int | None:
        """KIP-534: with attribute bit 6 the base timestamp is the delete horizon."""
        return self.base_timestamp if self.magic >= 2 and self.attributes & 0x40 else None

    @property
    def crc_ok(self) -> bool:
        if self.magic >= 2:
            return crc32c.crc32c(self.raw[21:]) == self.crc
        return zlib.crc32(self.raw[16:]) == self.crc

    @property
    def control_type(self) -> str | None:
        if not self.is_control or not self.records:
            return None
        key = self.records[0].key or b""
        return {ABORT_KEY: "ABORT", COMMIT_KEY: "COMMIT"}.get(key[:4], "OTHER")

    @property
    def is_empty_header(self) -> bool:
        return self.magic >= 2 and self.records_count == 0


@dataclass
class DiskSegment:
    base_offset: int
    batches: list[DiskBatch]
    aborted: list[AbortedTxn]
    size: int
    index_bytes: int
    time_index_bytes: int

    @property
    def next_offset(self) -> int:
        """``readNextOffset``: after the last batch, or the base offset if empty."""
        return self.batches[-1].last_offset + 1 if self.batches else self.base_offset


def _records_of(raw: bytes, magic: int) -> tuple[Rec, ...]:
    # Imported here so that the other tests of this directory do not depend on the peer.
    from aiokafka.record.legacy_records import LegacyRecordBatch
    from aiokafka.record.memory_records import MemoryRecords

    if magic >= 2:
        batch = MemoryRecords(raw).next_batch()
        return tuple(Rec(r.offset, r.timestamp, r.key, r.value, tuple((k, v) for k, v in r.headers)) for r in batch)
    return tuple(
        Rec(r.offset, -1 if r.timestamp is None else r.timestamp, r.key, r.value) for r in LegacyRecordBatch(raw, magic)
    )


def read_entries(data: bytes) -> list[DiskBatch]:
    out = []
    pos = 0
    while pos < len(data):
        offset, length = struct.unpack_from(">qi", data, pos)
        raw = data[pos : pos + 12 + length]
        assert len(raw) == 12 + length, f"truncated entry at position {pos}"
        magic = raw[16]
        if magic >= 2:
            header = _HEADER.unpack_from(raw)
            (base, _, ple, _, crc, attributes, delta, base_ts, max_ts, pid, epoch, seq, count) = header
            records = _records_of(raw, magic)
            assert len(records) == count, f"recordsCount {count} but {len(records)} records at offset {base}"
            out.append(
                DiskBatch(
                    raw,
                    base,
                    base + delta,
                    magic,
                    ple,
                    crc,
                    attributes,
                    base_ts,
                    max_ts,
                    pid,
                    epoch,
                    seq,
                    count,
                    records,
                )
            )
        else:
            crc = struct.unpack_from(">I", raw, 12)[0]
            attributes = raw[17]
            records = _records_of(raw, magic)
            first = records[0].offset if records else offset
            ts = max((r.timestamp for r in records), default=-1)
            out.append(
                DiskBatch(raw, first, offset, magic, -1, crc, attributes, -1, ts, -1, -1, -1, len(records), records)
            )
        pos += 12 + length
    return out


def read_txn_index(path: Path) -> list[AbortedTxn]:
    if not path.exists():
        return []
    data = path.read_bytes()
    out = []
    for i in range(len(data) // 34):
        version, pid, first, last, lso = _TXN_ENTRY.unpack_from(data, i * 34)
        assert version == 0
        out.append(AbortedTxn(pid, first, last, lso))
    return out


def read_segments(directory: str | os.PathLike[str]) -> list[DiskSegment]:
    """Every segment of a partition directory, in offset order (no leftovers allowed)."""
    d = Path(directory)
    names = sorted(os.listdir(d))
    leftovers = [n for n in names if n.endswith((".cleaned", ".swap", ".deleted"))]
    assert not leftovers, f"temporary files left behind: {leftovers}"
    segments = []
    for name in names:
        if not name.endswith(".log"):
            continue
        base = int(name[:-4])
        stem = d / name[:-4]
        index = Path(f"{stem}.index")
        time_index = Path(f"{stem}.timeindex")
        segments.append(
            DiskSegment(
                base,
                read_entries((d / name).read_bytes()),
                read_txn_index(Path(f"{stem}.txnindex")),
                (d / name).stat().st_size,
                index.stat().st_size if index.exists() else 0,
                time_index.stat().st_size if time_index.exists() else 0,
            )
        )
    return sorted(segments, key=lambda s: s.base_offset)


def all_batches(directory: str | os.PathLike[str]) -> list[DiskBatch]:
    return [b for s in read_segments(directory) for b in s.batches]


# ---- a compact, exact picture of a batch ------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """What a test expects of one batch. Records as (offset, key, value); producer fields,
    flags, codec and horizon must match too (their defaults are a plain batch's)."""

    base: int
    last: int
    records: tuple[tuple[int, bytes | None, bytes | None], ...] = ()
    horizon: int | None = None
    pid: int = -1
    epoch: int = -1
    seq: int = -1
    txn: bool = False
    control: str | None = None  # "ABORT" / "COMMIT" when the batch holds a marker
    control_flag: bool = False  # the control attribute, also for an emptied marker
    codec: int = 0


def shape_of(b: DiskBatch) -> Shape:
    return Shape(
        b.base_offset,
        b.last_offset,
        tuple((r.offset, r.key, r.value) for r in b.records),
        b.horizon,
        b.producer_id,
        b.producer_epoch,
        b.base_sequence,
        b.is_transactional,
        b.control_type,
        b.is_control,
        b.codec,
    )


def shapes(directory: str | os.PathLike[str]) -> list[list[Shape]]:
    """Per segment, the shapes of its batches."""
    return [[shape_of(b) for b in s.batches] for s in read_segments(directory)]


def layout(directory: str | os.PathLike[str]) -> dict[int, list[Shape]]:
    return {s.base_offset: [shape_of(b) for b in s.batches] for s in read_segments(directory)}


def check_output_rules(batch: DiskBatch, original_ts: dict[int, int]) -> None:
    """The re-encoding rules every batch in a cleaned log obeys (KAFKA_NOTES §9.8)."""
    assert batch.magic == 2, f"batch at {batch.base_offset} is magic {batch.magic}: the cleaner writes v2 only"
    assert batch.crc_ok, f"batch at {batch.base_offset}: bad CRC"
    assert batch.base_offset <= batch.last_offset
    for r in batch.records:
        assert batch.base_offset <= r.offset <= batch.last_offset
        if r.offset in original_ts:
            assert r.timestamp == original_ts[r.offset], f"record {r.offset}: timestamp changed"
    if batch.is_empty_header:
        assert len(batch.raw) == 61, "an empty retained batch is a bare 61-byte header"
        assert batch.base_timestamp == -1 and batch.horizon is None and batch.codec == 0
        return
    if batch.horizon is None:
        assert batch.base_timestamp == batch.records[0].timestamp or batch.log_append_time
    if not batch.log_append_time:
        assert batch.max_timestamp == max(r.timestamp for r in batch.records)


# ---- writing input logs -----------------------------------------------------------------


@dataclass
class Written:
    """What a LogWriter appended, for checks against the cleaned result."""

    batches: dict[int, bytes] = field(default_factory=dict)  # base offset -> bytes as appended
    timestamps: dict[int, int] = field(default_factory=dict)  # record offset -> timestamp


class LogWriter:
    """Appends batches to a new partition directory the way a leader would: offsets in
    order, producer sequences counted per producer, and for every ABORT marker the
    ``.txnindex`` entry of the aborted transaction in the segment holding the marker."""

    def __init__(
        self, directory: str | os.PathLike[str], config: LogConfig | None = None, *, append: bool = False
    ) -> None:
        """``append``: go on writing a log already there (after a clean), from its log end."""
        self.dir = Path(directory)
        self.config = config or LogConfig()
        self.log = Log.open(self.dir, self.config) if append else Log.create(self.dir, self.config)
        self.next_offset = self.log.log_end_offset if append else 0
        self.sequences: dict[int, int] = defaultdict(int)
        self.open_txns: dict[int, int] = {}  # pid -> first offset of its open transaction
        self.last_data: dict[int, tuple[int, int]] = {}  # pid -> (last offset of last data batch, epoch)
        self.written = Written()

    def data(
        self,
        keys: Sequence[bytes | None],
        values: Sequence[bytes | None] | None = None,
        *,
        pid: int = -1,
        epoch: int = 0,
        txn: bool = False,
        codec: int = 0,
        timestamps: Sequence[int] | None = None,
        log_append_time: int | None = None,
        leader_epoch: int = -1,
        gap: int = 0,
        offsets: Sequence[int] | None = None,
        headers: Sequence[tuple[tuple[str, bytes | None], ...]] | None = None,
        last_offset_delta: int | None = None,
        seq: int | None = None,
    ) -> tuple[int, int]:
        """One data batch; returns (base offset, last offset). A producer's base sequence
        continues from its previous batch unless ``seq`` is given."""
        base = self.next_offset + gap
        offsets = list(offsets) if offsets is not None else [base + i for i in range(len(keys))]
        base = offsets[0]
        values = list(values) if values is not None else [b"v%d" % o for o in offsets]
        timestamps = list(timestamps) if timestamps is not None else [BASE_TS + o for o in offsets]
        headers = list(headers) if headers is not None else [()] * len(keys)
        records = [
            Record(o, t, k, v, h) for o, t, k, v, h in zip(offsets, timestamps, keys, values, headers, strict=True)
        ]
        if pid >= 0 and seq is None:
            seq = self.sequences[pid]
        seq = -1 if seq is None else seq
        delta = last_offset_delta if last_offset_delta is not None else offsets[-1] - base
        raw = build_batch(
            records,
            base_offset=base,
            compression=codec,
            producer_id=pid,
            producer_epoch=epoch if pid >= 0 else -1,
            base_sequence=seq,
            is_transactional=txn,
            partition_leader_epoch=leader_epoch,
            timestamp_type=TimestampType.LOG_APPEND_TIME if log_append_time is not None else TimestampType.CREATE_TIME,
            max_timestamp=log_append_time,
            last_offset_delta=delta,
        )
        last = base + delta
        if pid >= 0:
            self.sequences[pid] = seq + delta + 1
            self.last_data[pid] = (last, epoch)
        if txn:
            self.open_txns.setdefault(pid, base)
        self._append(raw)
        for r in records:
            self.written.timestamps[r.offset] = log_append_time if log_append_time is not None else r.timestamp
        self.next_offset = last + 1
        return base, last

    def marker(
        self, kind: ControlRecordType, pid: int, *, epoch: int = 0, timestamp: int | None = None, gap: int = 0
    ) -> int:
        """An end-transaction marker; an ABORT also gets its ``.txnindex`` entry."""
        offset = self.next_offset + gap
        ts = BASE_TS + offset if timestamp is None else timestamp
        raw = build_control_batch(
            kind, offset=offset, producer_id=pid, producer_epoch=epoch, coordinator_epoch=0, timestamp=ts
        )
        first = self.open_txns.pop(pid, None)
        self._append(raw)
        self.written.timestamps[offset] = ts
        if kind == ABORT and first is not None:
            others = [o for p, o in self.open_txns.items() if p != pid]
            lso = min(others) if others else offset + 1
            self.log.active_segment.append_aborted_txn(AbortedTxn(pid, first, offset, lso))
        self.next_offset = offset + 1
        return offset

    def raw(self, data: bytes, *, next_offset: int) -> None:
        """Bytes built elsewhere (legacy entries from a peer producer)."""
        self._append(data)
        self.next_offset = next_offset

    def _append(self, data: bytes) -> None:
        base = struct.unpack_from(">q", data, 0)[0]
        self.written.batches[base] = data
        self.log.append(data)

    def roll(self, base_offset: int | None = None) -> int:
        base = self.next_offset if base_offset is None else base_offset
        self.log.roll(base)
        self.next_offset = max(self.next_offset, base)
        return base

    def close(self) -> Path:
        self.log.close()
        return self.dir

    def active_producers(self) -> dict[int, ActiveProducer]:
        return {pid: ActiveProducer(last, epoch) for pid, (last, epoch) in self.last_data.items()}


# ---- running one cleaning round ---------------------------------------------------------


def make_cleaner(
    memory: int = 1 << 20, load_factor: float = 0.9, *, io_buffer_size: int = 64 * 1024, time: MockTime | None = None
) -> Cleaner:
    clock = time or MockTime(NOW)
    return Cleaner(0, OffsetMap(memory, load_factor), io_buffer_size, 1_048_588, Throttler(None, clock), clock)


def clean_round(
    directory: str | os.PathLike[str],
    *,
    first_dirty: int,
    first_uncleanable: int | None = None,
    now: int = NOW,
    delete_retention_ms: int = DAY,
    active_producers: dict[int, ActiveProducer] | None = None,
    cleaner: Cleaner | None = None,
    config: LogConfig | None = None,
    hold_removals: str | None = None,
) -> tuple[int, CleanerStats]:
    """One ``doClean`` over the directory (reopened from disk, closed afterwards); the
    first uncleanable offset defaults to the active segment's base."""
    log = Log.open(directory, config or LogConfig())
    try:
        bound = log.active_segment.base_offset if first_uncleanable is None else first_uncleanable
        ltc = LogToClean(
            log,
            TP,
            first_dirty,
            bound,
            delete_retention_ms=delete_retention_ms,
            active_producers=active_producers or {},
            hold_removals=hold_removals,
        )
        return (cleaner or make_cleaner()).do_clean(ltc, now)
    finally:
        log.close()


@pytest.fixture
def partition_dir(tmp_path: Path) -> Path:
    return tmp_path / f"{TP.topic}-{TP.partition}"


def records_of(batches: Iterable[DiskBatch]) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) for b in batches for r in b.records]


sys.modules.setdefault("engine_helpers", sys.modules[__name__])
