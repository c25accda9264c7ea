"""Test helpers: write partition directories from records, and read a directory back the
way a Kafka broker would after its start-up (KAFKA_NOTES §4), without changing it.

``broker_view`` is the oracle of the crash-safety tests: it applies Kafka's start-up
rules to a *copy* of the directory and returns every record a consumer would read.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cleaner.records.builder import build_batch, build_control_batch
from cleaner.records.columns import decode_records
from cleaner.records.compression import CompressionType
from cleaner.records.control import ControlRecordType
from cleaner.records.record import Record
from cleaner.storage.checkpoint import REPLICATION_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleaner.storage.index import AbortedTxn
from cleaner.storage.log import Log, LogConfig


def batch_of(
    offsets: Sequence[int],
    keys: Sequence[bytes | None],
    values: Sequence[bytes | None] | None = None,
    *,
    timestamp: int = 1_000,
    compression: int = CompressionType.NONE,
    **kwargs,
) -> bytes:
    values = values if values is not None else [b"v%d" % o for o in offsets]
    records = [Record(o, timestamp + o, k, v) for o, k, v in zip(offsets, keys, values, strict=True)]
    return build_batch(records, compression=compression, **kwargs)


def write_log(
    directory: str | os.PathLike[str],
    batches: Iterable[bytes],
    *,
    config: LogConfig | None = None,
    roll_every: int | None = None,
) -> Log:
    """A partition directory holding ``batches`` (rolled by ``config.segment_bytes``, or
    every ``roll_every`` batches), closed like a broker at shutdown."""
    log = Log.create(directory, config or LogConfig())
    for i, batch in enumerate(batches):
        if roll_every and i and i % roll_every == 0:
            log.roll()
        log.append(batch)
    log.close()
    return Log.open(directory, config or LogConfig())


def read_records(log: Log) -> list[Record]:
    out: list[Record] = []
    for chunk in log.iter_batches(0):
        v2 = chunk.select(chunk.is_v2)
        if len(v2):
            out.extend(decode_records(v2).records())
        for entry in chunk.legacy.values():
            out.extend(entry.records())
    return sorted(out, key=lambda r: r.offset)


def broker_view(directory: str | os.PathLike[str], config: LogConfig | None = None) -> list[Record]:
    """Records a broker would serve after its start-up, computed on a copy."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / Path(directory).name
        shutil.copytree(directory, copy)
        log = Log.open(copy, config)
        try:
            return read_records(log)
        finally:
            log.close()


def latest_by_key(records: Iterable[Record]) -> dict[bytes | None, Record]:
    latest: dict[bytes | None, Record] = {}
    for r in records:
        latest[r.key] = r
    return latest


def snapshot_dir(directory: str | os.PathLike[str]) -> dict[str, tuple[bytes, int]]:
    """Every file's bytes and mtime, to prove that something changed nothing."""
    out = {}
    for root, _, names in os.walk(directory):
        for name in names:
            p = Path(root) / name
            out[str(p.relative_to(directory))] = (p.read_bytes(), p.stat().st_mtime_ns)
    return out


# -- realistic partitions and what a consumer of them concludes ------------------------------
# Used by the engine's crash-safety and concurrency tests. Additions only: the helpers above
# keep their behaviour for tests/storage.

GENERATED_START_MS = 1_700_000_000_000
"""Timestamp of the first generated record; record ``i`` of a partition is stamped ``+ i``."""


def generate_partition(
    directory: str | os.PathLike[str],
    *,
    seed: int,
    records: int,
    keys: int = 1_000,
    value_bytes: tuple[int, int] = (20, 200),
    config: LogConfig | None = None,
    base_offset: int = 0,
    start_timestamp: int = GENERATED_START_MS,
    tombstone_rate: float = 0.05,
    idempotent_rate: float = 0.2,
    transactional_rate: float = 0.15,
    abort_rate: float = 0.4,
    header_rate: float = 0.05,
    producer_epoch: int = 0,
    codecs: Sequence[int] = (
        CompressionType.NONE,
        CompressionType.NONE,
        CompressionType.GZIP,
        CompressionType.SNAPPY,
        CompressionType.LZ4,
        CompressionType.ZSTD,
    ),
) -> int:
    """Write (or extend, if ``directory`` holds a log) a partition of about ``records``
    records as a broker's leader would: skewed keys, tombstones, record headers, batches of
    1-20 records in every codec, plain, idempotent and transactional producers (up to two
    transactions open at once, interleaved with other data, each ended by a COMMIT or ABORT
    marker, aborted ones in the ``.txnindex`` of the segment holding the marker with the LSO
    of that moment). Every transaction is closed at the end. Returns the log end offset.
    Deterministic for a given ``seed``. To extend a log written before, pass a higher
    ``producer_epoch``: the producers' sequence numbers start again at 0."""
    rng = random.Random(seed)
    config = config or LogConfig()
    d = Path(directory)
    log = Log.open(d, config) if (d / f"{base_offset:020d}.log").exists() else Log.create(d, config)
    offset = log.log_end_offset if log.segments else base_offset
    end = offset + records
    sequences: dict[int, int] = {}
    open_txns: dict[int, int] = {}  # producer id -> first offset

    def make_records(n: int) -> list[Record]:
        out = []
        for i in range(n):
            o = offset + i
            # Half the keys heavily skewed (a few hot keys), half uniform.
            hot = rng.random() < 0.5
            k = min(int(rng.paretovariate(1.1)) - 1, keys - 1) if hot else rng.randrange(keys)
            key = b"key-%06d" % k
            value = None if rng.random() < tombstone_rate else rng.randbytes(rng.randint(*value_bytes))
            headers: tuple = (("h", b"%d" % o),) if rng.random() < header_rate else ()
            out.append(Record(o, start_timestamp + o - base_offset, key, value, headers))
        return out

    def producer_fields(pid: int, n: int) -> dict:
        seq = sequences.get(pid, 0)
        sequences[pid] = seq + n
        return {"producer_id": pid, "producer_epoch": producer_epoch, "base_sequence": seq}

    def end_txn(pid: int) -> None:
        nonlocal offset
        first = open_txns.pop(pid)
        abort = rng.random() < abort_rate
        marker = ControlRecordType.ABORT if abort else ControlRecordType.COMMIT
        log.append(
            build_control_batch(
                marker,
                offset=offset,
                producer_id=pid,
                producer_epoch=producer_epoch,
                coordinator_epoch=3,
                timestamp=start_timestamp + offset - base_offset,
            )
        )
        if abort:
            lso = min(open_txns.values(), default=offset + 1)
            active = log.active_segment
            assert active is not None
            active.append_aborted_txn(AbortedTxn(pid, first, offset, lso))
        offset += 1

    while offset < end or open_txns:
        if open_txns and (offset >= end or rng.random() < 0.3):
            end_txn(rng.choice(sorted(open_txns)))
            continue
        kind = rng.random()
        n = rng.randint(1, 20)
        codec = rng.choice(list(codecs))
        batch_records = make_records(n)
        if kind < transactional_rate:
            pid = 3_000 + rng.randrange(3)
            if pid not in open_txns and len(open_txns) >= 2:
                pid = rng.choice(sorted(open_txns))
            open_txns.setdefault(pid, offset)
            batch = build_batch(batch_records, compression=codec, is_transactional=True, **producer_fields(pid, n))
        elif kind < transactional_rate + idempotent_rate:
            pid = 1_000 + rng.randrange(4)
            batch = build_batch(batch_records, compression=codec, **producer_fields(pid, n))
        else:
            batch = build_batch(batch_records, compression=codec)
        log.append(batch)
        offset += n
    log.close()
    return offset


def write_high_watermarks(log_dir: str | os.PathLike[str], watermarks: dict) -> None:
    """``replication-offset-checkpoint``: without a high watermark nothing is cleanable."""
    OffsetCheckpointFile(Path(log_dir) / REPLICATION_OFFSET_CHECKPOINT).update(set=watermarks)


@dataclass
class ConsumerView:
    """What a ``read_committed`` consumer reading a partition from its start concludes."""

    latest: dict[bytes, bytes | None]
    """Latest committed value of every key (None: a tombstone)."""
    problems: list[str]
    """Offsets that are not strictly increasing in file order (a duplicate, a reordering)."""
    max_offset: int
    """The largest offset of any batch (-1 if none)."""
    batches: int
    records: int

    @property
    def live(self) -> dict[bytes, bytes]:
        """Keys with a value: a tombstoned key and an absent key mean the same to a consumer
        of a compacted topic."""
        return {k: v for k, v in self.latest.items() if v is not None}


def consumer_view(directory: str | os.PathLike[str], config: LogConfig | None = None) -> ConsumerView:
    """Apply a broker's start-up rules to a copy of ``directory`` (KAFKA_NOTES §4), then read
    every batch in file order like a ``read_committed`` consumer: control batches are
    skipped, and transactional data of a producer is dropped when a ``.txnindex`` entry
    ``(pid, firstOffset..lastOffset)`` covers it (the broker sends those entries with a fetch).
    Also reports any offset that does not strictly increase in file order."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / Path(directory).name
        shutil.copytree(directory, copy)
        log = Log.open(copy, config)
        try:
            return _consumer_view(log)
        finally:
            log.close()


def _consumer_view(log: Log) -> ConsumerView:
    aborted_ranges: dict[int, list[tuple[int, int]]] = {}
    for seg in log.segments:
        for txn in seg.txn_index.all_aborted_txns():
            aborted_ranges.setdefault(txn.producer_id, []).append((txn.first_offset, txn.last_offset))
    aborted = {
        pid: (
            np.array([f for f, _ in sorted(r)], dtype=np.int64),
            np.array([la for _, la in sorted(r)], dtype=np.int64),
        )
        for pid, r in aborted_ranges.items()
    }
    latest: dict[bytes, bytes | None] = {}
    problems: list[str] = []
    previous_last = -1
    max_offset = -1
    batches = records = 0
    for seg in log.segments:
        for chunk in seg.iter_batches():
            if not chunk.is_v2.all():
                raise AssertionError(f"{seg.log_path}: legacy batches are not expected here")
            bases, lasts = chunk.base_offsets.tolist(), chunk.last_offsets.tolist()
            for base, last in zip(bases, lasts, strict=True):
                if base <= previous_last or last < base:
                    problems.append(f"{seg.log_path.name}: batch [{base}, {last}] after offset {previous_last}")
                previous_last = max(previous_last, last)
                max_offset = max(max_offset, last)
            batches += len(chunk)
            cols = decode_records(chunk)
            offsets = cols.offsets
            records += len(offsets)
            if len(offsets) > 1 and bool((np.diff(offsets) <= 0).any()):
                problems.append(f"{seg.log_path.name}: record offsets not increasing inside a chunk")
            visible = cols.has_key & ~chunk.is_control[cols.batch]
            transactional = chunk.is_transactional[cols.batch]
            pids = chunk.producer_ids[cols.batch]
            for pid, (firsts, last_offsets) in aborted.items():
                rows = np.flatnonzero(transactional & (pids == pid))
                if rows.size:
                    at = np.searchsorted(firsts, offsets[rows], side="right") - 1
                    hit = (at >= 0) & (offsets[rows] <= last_offsets[np.maximum(at, 0)])
                    visible[rows[hit]] = False
            rows = np.flatnonzero(visible)
            data = memoryview(cols.data)
            starts, ends = (s.tolist() for s in cols.key_spans(rows))
            last_row = dict(
                zip([bytes(data[a:b]) for a, b in zip(starts, ends, strict=True)], rows.tolist(), strict=True)
            )
            for key, row in last_row.items():
                latest[key] = cols.value(row)
    return ConsumerView(latest, problems, max_offset, batches, records)


def leftover_files(directory: str | os.PathLike[str]) -> list[str]:
    """Temporary files of a clean or a swap anywhere under ``directory``."""
    out = []
    for root, _, names in os.walk(directory):
        for name in names:
            if name.endswith((".cleaned", ".swap", ".deleted", ".tmp")):
                out.append(str((Path(root) / name).relative_to(directory)))
    return sorted(out)
