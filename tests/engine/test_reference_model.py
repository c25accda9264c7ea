"""The cleaning round against a plain, per-record model of KAFKA_NOTES §9.

Random logs (keys, values, tombstones, keyless records, idempotent and transactional
producers with commits and aborts and their ``.txnindex`` entries, every codec,
LogAppendTime, offset gaps, empty segments, small and large segments and index
intervals) are cleaned in several rounds at advancing clocks, with maps of 1 to many
keys, read buffers from a whole segment down to less than one batch (several chunks per
segment, buffer growth), checkpoint resets and a growing cleanable range. After every round the engine's
segments must equal what the model predicts: the same segment bases, and per batch either
the very same bytes (verbatim copy), or a rebuilt batch with exactly the model's records,
horizon and header fields, or a 61-byte empty header; and the same txn-index entries.

The model reads the input the way the specification describes it (facts that are part
of the input: batches, file sizes, offset-index entries, txn-index entries) and applies
§9.2 (offset map), §9.3 (grouping), §9.5-§9.7 (retention, transactions) and §9.8
(re-encoding) one record and one batch at a time, with no cleverness.

Not modelled: legacy v0/v1 input (see the conformance tests), offset overflow, the
offset-map's 32-bit range limit (offsets stay small here).
"""

from __future__ import annotations

import itertools
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest
from engine_helpers import (
    ABORT,
    BASE_TS,
    COMMIT,
    DAY,
    NOW,
    DiskBatch,
    DiskSegment,
    LogWriter,
    Rec,
    clean_round,
    make_cleaner,
    read_segments,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cleaner.storage import files
from cleaner.storage.index import AbortedTxn
from cleaner.storage.log import LogConfig
from cleaner.storage.producer_state import ActiveProducer

INT32_MAX = 2**31 - 1
KEYS = [b"a", b"b", b"c", b"d", b"e"]


# ---- the model ------------------------------------------------------------------------------


def floor_position(segments: list[DiskSegment], offset: int) -> int | None:
    found = None
    for i, s in enumerate(segments):
        if s.base_offset <= offset:
            found = i
    return found


def segments_between(segments: list[DiskSegment], start: int, end: int) -> list[DiskSegment]:
    """``logSegments(start, end)``: from the segment holding ``start``, bases below ``end``."""
    f = floor_position(segments, start)
    first = segments[f].base_offset if f is not None else start
    return [s for s in segments if first <= s.base_offset < end]


def collect_aborted(segments: list[DiskSegment], start: int, upper: int, log_start: int) -> list[AbortedTxn]:
    """§2.4 / §9.4: from the segment holding ``start`` on, entries with lastOffset >=
    logStartOffset and firstOffset < upper, stopping after the first entry whose
    lastStableOffset >= upper."""
    f = floor_position(segments, start)
    if f is None:
        return []
    out = []
    for s in segments[f:]:
        for t in s.aborted:
            if t.last_offset >= log_start and t.first_offset < upper:
                out.append(t)
            if t.last_stable_offset >= upper:
                return out
    return out


class TxnModel:
    """§9.7 ``CleanedTransactionMetadata``, one decision at a time."""

    def __init__(self) -> None:
        self.pending: list[AbortedTxn] = []
        self.ongoing_aborted: dict[int, list] = {}  # pid -> [txn, last observed batch offset or None]
        self.committed: set[int] = set()
        self.index: list[AbortedTxn] | None = None

    def add(self, txns: list[AbortedTxn]) -> None:
        self.pending.extend(txns)

    def consume(self, upto: int) -> None:
        ready = sorted((t for t in self.pending if t.first_offset <= upto), key=lambda t: t.first_offset)
        self.pending = [t for t in self.pending if t.first_offset > upto]
        for t in ready:
            self.ongoing_aborted.setdefault(t.producer_id, [t, None])

    def on_control(self, b: DiskBatch) -> bool:
        self.consume(b.last_offset)
        if b.records_count == 0:
            return True
        if b.control_type == "ABORT":
            entry = self.ongoing_aborted.pop(b.producer_id, None)
            if entry is not None and entry[1] is not None:
                if self.index is not None:
                    self.index.append(entry[0])
                return False
            return True
        if b.control_type == "COMMIT":
            if b.producer_id in self.committed:
                self.committed.discard(b.producer_id)
                return False
            return True
        return False

    def on_data(self, b: DiskBatch) -> bool:
        self.consume(b.last_offset)
        if not b.is_transactional:
            return False
        if b.producer_id in self.ongoing_aborted:
            self.ongoing_aborted[b.producer_id][1] = b.last_offset
            return True
        self.committed.add(b.producer_id)
        return False


def batch_positions(s: DiskSegment) -> list[int]:
    positions, p = [], 0
    for b in s.batches:
        positions.append(p)
        p += len(b.raw)
    return positions


def lookup_start(s: DiskSegment, index: list[tuple[int, int]], start: int) -> int:
    """Index of the batch where map building starts: the position of the largest offset-index
    entry with offset <= start (§2.1), else the segment start."""
    candidates = [pos for off, pos in index if off <= start]
    if not candidates:
        return 0
    return batch_positions(s).index(candidates[-1])


def build_map(
    segments: list[DiskSegment],
    indexes: dict[int, list[tuple[int, int]]],
    start: int,
    end: int,
    max_keys: int,
    log_start: int,
) -> tuple[dict[bytes, int], int]:
    """§9.2: keys of the cleanable section, a put refused once the map holds max_keys;
    aborted data and control records never enter it."""
    m: dict[bytes, int] = {}
    latest = -1
    dirty = segments_between(segments, start, end)
    txn = TxnModel()
    txn.add(collect_aborted(segments, start, end, log_start))
    for i, s in enumerate(dirty):
        next_start = dirty[i + 1].base_offset if i + 1 < len(dirty) else end
        for b in s.batches[lookup_start(s, indexes[s.base_offset], start) :]:
            if b.is_control:
                txn.on_control(b)
            elif not txn.on_data(b):
                for r in b.records:
                    if r.key is not None and r.offset >= start:
                        if len(m) < max_keys:
                            m[r.key] = r.offset
                            latest = r.offset
                        else:
                            return m, latest
            if b.last_offset >= start:
                latest = b.last_offset
        latest = next_start - 1
    return m, latest


def group_segments(
    segments: list[DiskSegment], max_size: int, max_index: int, uncleanable: int
) -> list[list[DiskSegment]]:
    """§9.3."""
    groups = []
    i = 0
    while i < len(segments):
        g = [segments[i]]
        size, index, time_index = segments[i].size, segments[i].index_bytes, segments[i].time_index_bytes
        i += 1
        while i < len(segments):
            c = segments[i]
            estimate = segments[i + 1].base_offset - 1 if i + 1 < len(segments) else uncleanable - 1
            if not (
                size + c.size <= max_size
                and index + c.index_bytes <= max_index
                and time_index + c.time_index_bytes <= max_index
                and (c.size == 0 or estimate - g[0].base_offset <= INT32_MAX)
            ):
                break
            g.append(c)
            size, index, time_index = size + c.size, index + c.index_bytes, time_index + c.time_index_bytes
            i += 1
        groups.append(g)
    return groups


@dataclass
class Expected:
    kind: str  # "verbatim", "rebuilt" or "empty"
    source: DiskBatch
    records: tuple[Rec, ...] = ()
    horizon: int | None = None


@dataclass
class ExpectedSegment:
    base_offset: int
    batches: list[Expected]
    aborted: list[AbortedTxn]


def model_round(
    segments: list[DiskSegment],
    indexes: dict[int, list[tuple[int, int]]],
    *,
    first_dirty: int,
    first_uncleanable: int,
    now: int,
    delete_retention_ms: int,
    active: dict[int, ActiveProducer],
    max_keys: int,
    config: LogConfig,
    log_start: int = 0,
) -> tuple[int, list[ExpectedSegment]]:
    m, latest = build_map(segments, indexes, first_dirty, first_uncleanable, max_keys, log_start)
    end = latest + 1
    to_clean = [s for s in segments if s.base_offset < end]
    txn = TxnModel()  # one for the whole round (KAFKA-8351)
    out: list[ExpectedSegment] = []

    def keep_record(b: DiskBatch, r: Rec) -> bool:  # §9.5 shouldRetainRecord
        if b.is_control:
            return True
        if r.offset > latest:
            return True
        if r.key is None:
            return False
        found = m.get(r.key, -1)
        keep_deletes = b.horizon is None or now < b.horizon
        return r.offset >= found and (r.value is not None or keep_deletes)

    for g in group_segments(to_clean, config.segment_bytes, config.segment_index_bytes, first_uncleanable):
        txn.index = []
        kept: list[Expected] = []
        for i, s in enumerate(g):
            upper = g[i + 1].base_offset if i + 1 < len(g) else s.next_offset
            txn.add(collect_aborted(segments, s.base_offset, upper, log_start))
            for b in s.batches:
                # §9.6 checkBatchRetention
                can_discard = txn.on_control(b) if b.is_control else txn.on_data(b)
                if b.is_control:
                    discard = can_discard and b.horizon is not None and b.horizon <= now
                else:
                    discard = can_discard
                producer = active.get(b.producer_id)
                last_of_producer = producer is not None and (
                    b.last_offset == producer.last_data_offset
                    if producer.last_data_offset is not None
                    else b.is_control and b.producer_epoch == producer.producer_epoch
                )
                retain_empty = (
                    (b.producer_id > -1 and last_of_producer)
                    or b.last_offset + 1 == first_uncleanable  # KAFKA-17076
                )
                if discard and not retain_empty:
                    continue
                records = () if discard else tuple(r for r in b.records if keep_record(b, r))
                if records:
                    need_horizon = (any(r.value is None for r in records) or (can_discard and b.is_control)) and (
                        b.horizon is None
                    )
                    if len(records) == b.records_count and not need_horizon:
                        kept.append(Expected("verbatim", b))
                    else:
                        horizon = now + delete_retention_ms if need_horizon else b.horizon
                        kept.append(Expected("rebuilt", b, records, horizon))
                elif retain_empty:
                    kept.append(Expected("empty", b))
        out.append(ExpectedSegment(g[0].base_offset, kept, txn.index))
    for s in segments:
        if s.base_offset >= end:
            out.append(ExpectedSegment(s.base_offset, [Expected("verbatim", b) for b in s.batches], s.aborted))
    return end, out


# ---- comparing ------------------------------------------------------------------------------


def offset_index(directory: Path, base: int) -> list[tuple[int, int]]:
    data = (directory / f"{base:020d}.index").read_bytes()
    return [(base + rel, pos) for rel, pos in (struct.unpack_from(">ii", data, i) for i in range(0, len(data), 8))]


def check_offset_index(s: DiskSegment, index: list[tuple[int, int]]) -> None:
    """§2.1: entries increase; each points at a batch start and names that batch's last
    offset (so every batch with lastOffset >= O starts at or after P)."""
    starts = dict(zip(batch_positions(s), s.batches, strict=True))
    assert [o for o, _ in index] == sorted({o for o, _ in index}), f"segment {s.base_offset}: index not increasing"
    for offset, position in index:
        assert position in starts, f"segment {s.base_offset}: index entry {offset}@{position} is not a batch start"
        assert starts[position].last_offset == offset


def time_index(directory: Path, base: int) -> list[tuple[int, int]]:
    data = (directory / f"{base:020d}.timeindex").read_bytes()
    return [(ts, base + rel) for ts, rel in (struct.unpack_from(">qi", data, i) for i in range(0, len(data), 12))]


def check_time_index(s: DiskSegment, entries: list[tuple[int, int]]) -> None:
    """§2.3: timestamps strictly increase, offsets never decrease, and a cleaned segment
    ends with (max timestamp, last offset of the first batch carrying it)."""
    assert all(a[0] < b[0] and a[1] <= b[1] for a, b in itertools.pairwise(entries)), f"segment {s.base_offset}"
    top = max((b.max_timestamp for b in s.batches), default=-1)
    if top >= 0:
        carrier = next(b for b in s.batches if b.max_timestamp == top)
        assert entries and entries[-1] == (top, carrier.last_offset), f"segment {s.base_offset}: final time entry"


def assert_batch(actual: DiskBatch, e: Expected, now: int) -> None:
    src = e.source
    where = f"batch {src.base_offset}..{src.last_offset} ({e.kind})"
    if e.kind == "verbatim":
        assert actual.raw == src.raw, f"{where}: not copied verbatim"
        return
    got = (
        actual.magic,
        actual.base_offset,
        actual.last_offset,
        actual.producer_id,
        actual.producer_epoch,
        actual.base_sequence,
        actual.partition_leader_epoch,
        actual.is_transactional,
        actual.is_control,
        actual.log_append_time,
    )
    want = (
        2,
        src.base_offset,
        src.last_offset,
        src.producer_id,
        src.producer_epoch,
        src.base_sequence,
        src.partition_leader_epoch,
        src.is_transactional,
        src.is_control,
        src.log_append_time,
    )
    assert got == want, f"{where}: header fields"
    assert actual.crc_ok, f"{where}: CRC"
    if e.kind == "empty":
        assert len(actual.raw) == 61 and actual.records_count == 0, f"{where}: not an empty header"
        assert (actual.codec, actual.horizon, actual.base_timestamp, actual.max_timestamp) == (
            0,
            None,
            -1,
            src.max_timestamp,
        ), f"{where}: empty header fields"
        return
    assert actual.records == e.records, f"{where}: records"
    assert actual.codec == src.codec, f"{where}: codec"
    assert actual.horizon == e.horizon, f"{where}: horizon (now={now})"
    base_ts = e.horizon if e.horizon is not None else e.records[0].timestamp
    max_ts = src.max_timestamp if src.log_append_time else max(r.timestamp for r in e.records)
    assert (actual.base_timestamp, actual.max_timestamp) == (base_ts, max_ts), f"{where}: timestamps"


def assert_matches(directory: Path, expected: list[ExpectedSegment], now: int, cleaned: set[int]) -> None:
    actual = read_segments(directory)
    assert [s.base_offset for s in actual] == [s.base_offset for s in expected], "segment bases"
    for a, e in zip(actual, expected, strict=True):
        assert len(a.batches) == len(e.batches), (
            f"segment {a.base_offset}: batches {[(b.base_offset, b.records_count) for b in a.batches]} != "
            f"{[(x.source.base_offset, x.kind, len(x.records)) for x in e.batches]}"
        )
        for got, want in zip(a.batches, e.batches, strict=True):
            assert_batch(got, want, now)
        assert a.aborted == e.aborted, f"segment {a.base_offset}: txn index"
        check_offset_index(a, offset_index(directory, a.base_offset))
        if a.base_offset in cleaned:
            check_time_index(a, time_index(directory, a.base_offset))


# ---- random logs ----------------------------------------------------------------------------

record = st.tuples(
    st.one_of(st.sampled_from(KEYS), st.sampled_from(KEYS), st.sampled_from(KEYS), st.none()),  # key (keyless: 1/4)
    st.sampled_from([False, False, False, True]),  # tombstone (null value)
)
data_step = st.tuples(
    st.just("data"),
    st.lists(record, min_size=1, max_size=4),
    st.sampled_from(["plain", "plain", "idempotent", "txn1", "txn2", "txn1", "txn2"]),
    st.sampled_from([0, 0, 1, 2, 3, 4]),  # codec
    st.sampled_from([False, False, False, True]),  # LogAppendTime
    st.sampled_from([0, 0, 0, 0, 1, 3]),  # offset gap before the batch
)
end_step = st.tuples(st.just("end"), st.sampled_from([1, 2]), st.sampled_from([ABORT, COMMIT, COMMIT]))
roll_step = st.tuples(st.just("roll"), st.sampled_from([0, 0, 0, 2]))
segment_steps = st.lists(st.one_of(data_step, data_step, data_step, end_step), min_size=0, max_size=8)
# Segments separated by rolls (a roll may skip offsets; an empty segment is possible).
log_steps = st.lists(st.tuples(roll_step, segment_steps), min_size=2, max_size=6).map(
    lambda segs: [step for roll, seg in segs for step in (roll, *seg)]
)

round_plan = st.tuples(
    st.integers(0, 20),  # which segment base becomes the first uncleanable offset
    st.sampled_from(["none", "tick", "before", "at", "after", "days"]),  # how the clock moves
    st.sampled_from([False, False, False, True]),  # reset the checkpoint to the log start
)


def write_log(directory: Path, steps: list, config: LogConfig, tail: bool) -> LogWriter:
    w = LogWriter(directory, config)
    active_empty = True
    for step in steps:
        if step[0] == "data":
            _, records, producer, codec, log_append, gap = step
            keys = [k for k, _ in records]
            pid, txn = {"plain": (-1, False), "idempotent": (3, False), "txn1": (1, True), "txn2": (2, True)}[producer]
            offsets = list(range(w.next_offset + gap, w.next_offset + gap + len(records)))
            values = [None if tomb else b"v%d" % o for (_, tomb), o in zip(records, offsets, strict=True)]
            w.data(
                keys,
                values,
                pid=pid,
                txn=txn,
                codec=codec,
                gap=gap,
                log_append_time=BASE_TS + offsets[-1] + 500 if log_append else None,
            )
            active_empty = False
        elif step[0] == "end":
            _, pid, kind = step
            if pid in w.open_txns or kind == COMMIT:
                w.marker(kind, pid)
                active_empty = False
        else:
            gap = step[1]
            if not active_empty or gap:
                w.roll(w.next_offset + gap)
                active_empty = True
    if not active_empty:
        w.roll()
    if tail:
        w.data([b"tail"])
    w.close()
    return w


def advance(how: str, retention: int) -> int:
    return {"none": 0, "tick": 1, "before": retention - 1, "at": retention, "after": retention + 1, "days": 5 * DAY}[
        how
    ]


@pytest.mark.slow  # about 15-30 s
@settings(
    max_examples=600,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    steps=log_steps,
    tail=st.booleans(),
    segment_bytes=st.sampled_from([1 << 30, 1 << 30, 400, 900]),
    index_interval=st.sampled_from([4096, 150, 1]),
    map_size=st.sampled_from([(1 << 20, 0.9), (24 << 20, 0.9), (40, 0.75), (60, 0.75), (200, 0.9)]),
    io_buffer=st.sampled_from([64 * 1024, 64 * 1024, 90, 250]),
    retention=st.sampled_from([DAY, 1_000, 0]),
    active_choice=st.sampled_from(["none", "all", "some", "epoch"]),
    rounds=st.lists(round_plan, min_size=1, max_size=4),
)
def test_engine_matches_the_model(
    steps: list,
    tail: bool,
    segment_bytes: int,
    index_interval: int,
    map_size: tuple[int, float],
    io_buffer: int,
    retention: int,
    active_choice: str,
    rounds: list,
) -> None:
    config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=index_interval)
    # Durability is not under test here (the crash tests own it): skip the fsyncs.
    with (
        tempfile.TemporaryDirectory() as tmp,
        mock.patch.object(files, "fsync_file", lambda *_: None),
        mock.patch.object(files, "fsync_dir", lambda *_: None),
    ):
        d = Path(tmp) / "topic-0"
        w = write_log(d, steps, config, tail)
        producers = w.active_producers()
        active = {
            "none": {},
            "all": producers,
            "some": {pid: p for pid, p in producers.items() if pid != 2},
            "epoch": {**producers, 1: ActiveProducer(None, 0)},
        }[active_choice]
        # The last stable offset: nothing at or above an open transaction may be cleaned.
        lso = min(w.open_txns.values(), default=None)

        cleaner = make_cleaner(*map_size, io_buffer_size=io_buffer)
        checkpoint, now = 0, NOW
        for pick, clock, reset in rounds:
            segments = read_segments(d)
            bases = [s.base_offset for s in segments]
            bound = bases[-1]  # the active segment is never cleaned
            if lso is not None:
                bound = min(bound, max(b for b in bases if b <= lso))
            first_dirty = 0 if reset else checkpoint
            options = [b for b in bases if first_dirty < b <= bound]
            if not options:
                continue
            uncleanable = options[pick % len(options)]
            now += advance(clock, retention)
            indexes = {s.base_offset: offset_index(d, s.base_offset) for s in segments}
            expected_end, expected = model_round(
                segments,
                indexes,
                first_dirty=first_dirty,
                first_uncleanable=uncleanable,
                now=now,
                delete_retention_ms=retention,
                active=active,
                max_keys=cleaner.offset_map.max_keys,
                config=config,
            )
            end, _ = clean_round(
                d,
                first_dirty=first_dirty,
                first_uncleanable=uncleanable,
                now=now,
                delete_retention_ms=retention,
                active_producers=active,
                cleaner=cleaner,
                config=config,
            )
            assert end == expected_end, "end offset"
            assert_matches(d, expected, now, {s.base_offset for s in expected if s.base_offset < expected_end})
            checkpoint = end
