"""Conformance of the cleaning round with KAFKA_NOTES §5-§10 (and §13-§14), scenario by
scenario, in the spirit of Kafka's own ``LogCleanerTest``.

Every scenario writes a partition directory as a broker would, runs the engine, and
asserts the *exact* batches that survive: base and last offset, records (offset, key,
value), delete horizon, producer fields, flags and codec (``Shape``), plus the generic
re-encoding rules of §9.8 (``check_output_rules``: CRC, v2 only, record timestamps
unchanged, 61-byte empty headers, base/max timestamps). What is on disk is read with a
peer decoder (aiokafka), never with the project's own.

The expected values are derived by hand from the specification and Kafka's code.
"""

from __future__ import annotations

import contextlib
import os
import struct
import sys
import zlib
from pathlib import Path

import pytest
from broker_lock import BrokerLock
from engine_helpers import (
    ABORT,
    ABORT_KEY,
    BASE_TS,
    COMMIT,
    COMMIT_KEY,
    DAY,
    NOW,
    TP,
    LogWriter,
    Shape,
    Written,
    all_batches,
    check_output_rules,
    clean_round,
    layout,
    make_cleaner,
    read_segments,
    records_of,
)
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from cleaner import cleaning
from cleaner.clock import MockTime
from cleaner.config import parse_policy
from cleaner.engine.log_cleaner import LogCleaner
from cleaner.engine.manager import LogCleanerManager
from cleaner.records.compression import CompressionType
from cleaner.storage.checkpoint import OffsetCheckpointFile
from cleaner.storage.log import Log, LogConfig
from cleaner.storage.log_dir import CLEAN_SHUTDOWN_FILE, LogDirectory
from cleaner.storage.producer_state import ActiveProducer
from cleaner.storage.topic_partition import TopicPartition

GZIP, SNAPPY, LZ4, ZSTD = (
    int(c) for c in (CompressionType.GZIP, CompressionType.SNAPPY, CompressionType.LZ4, CompressionType.ZSTD)
)
MARKER_VALUE = struct.pack(">hi", 0, 0)  # EndTxnMarker v0, coordinator epoch 0


# ---- expected shapes ----------------------------------------------------------------------


def kv(offset: int, key: bytes | None) -> tuple[int, bytes | None, bytes]:
    """A record as LogWriter writes it by default (value ``v<offset>``)."""
    return (offset, key, b"v%d" % offset)


def tomb(offset: int, key: bytes) -> tuple[int, bytes, None]:
    return (offset, key, None)


def D(base: int, last: int, *records: tuple, **fields) -> Shape:
    return Shape(base, last, tuple(records), **fields)


def E(base: int, last: int, **fields) -> Shape:
    """An empty retained header (RETAIN_EMPTY with nothing kept)."""
    return Shape(base, last, (), **fields)


def M(offset: int, kind: str, pid: int, *, epoch: int = 0, horizon: int | None = None) -> Shape:
    """A transaction marker batch."""
    key = ABORT_KEY if kind == "ABORT" else COMMIT_KEY
    return Shape(offset, offset, ((offset, key, MARKER_VALUE),), horizon, pid, epoch, -1, True, kind, True)


def EM(offset: int, pid: int, *, epoch: int = 0) -> Shape:
    """An emptied marker: a control header kept for an active producer."""
    return Shape(offset, offset, (), None, pid, epoch, -1, True, None, True)


def assert_output_rules(directory: Path, written: Written) -> None:
    for batch in all_batches(directory):
        check_output_rules(batch, written.timestamps)


def assert_verbatim(directory: Path, written: Written, *bases: int) -> None:
    """The batches at these base offsets are the appended bytes, unchanged (§9.8)."""
    on_disk = {b.base_offset: b.raw for b in all_batches(directory)}
    for base in bases:
        assert on_disk[base] == written.batches[base], f"batch {base} was not copied verbatim"


def raw_batches(directory: Path) -> dict[int, bytes]:
    return {b.base_offset: b.raw for b in all_batches(directory)}


def segment_files(directory: Path, base: int) -> dict[str, bytes]:
    stem = f"{base:020d}"
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name.startswith(stem)}


# ---- duplicates ---------------------------------------------------------------------------


def test_duplicates_within_and_across_segments(partition_dir: Path) -> None:
    """testCleanSegments: only the latest record of each key survives; a batch that lost
    records keeps its base offset and lastOffsetDelta."""
    w = LogWriter(partition_dir)
    w.data([b"a", b"e", b"b"])  # 0..2: a and b are overwritten later, e is not
    w.data([b"c"])  # 3
    w.roll()
    w.data([b"b"])  # 4
    w.data([b"a", b"d", b"a"])  # 5..7: a duplicate inside the batch
    w.roll()
    w.data([b"a"])  # 8, active segment
    w.close()

    end, stats = clean_round(partition_dir, first_dirty=0)

    assert end == 8
    assert layout(partition_dir) == {
        0: [
            D(0, 2, kv(1, b"e")),
            D(3, 3, kv(3, b"c")),
            D(4, 4, kv(4, b"b")),
            D(5, 7, kv(6, b"d"), kv(7, b"a")),
        ],
        8: [D(8, 8, kv(8, b"a"))],
    }
    assert_verbatim(partition_dir, w.written, 3, 4, 8)
    assert_output_rules(partition_dir, w.written)
    assert (stats.messages_read, stats.messages_written, stats.invalid_messages_read) == (8, 5, 0)


def test_idempotent_producers_keep_their_last_sequence(partition_dir: Path) -> None:
    """testDuplicateCheckAfterCleaning: rebuilt batches keep base offset, lastOffsetDelta
    and base sequence, so each producer's last sequence is unchanged; once a producer's
    only batch loses its last record, the batch stays as an empty header."""
    w = LogWriter(partition_dir)
    w.data([b"1", b"2", b"3"], pid=1)  # 0..2
    w.data([b"3", b"1", b"4"], pid=2)  # 3..5
    w.data([b"1", b"4"], pid=3)  # 6..7
    w.roll()
    w.data([b"2"], pid=4)  # 8
    w.roll()
    w.close()
    active = w.active_producers()

    end, _ = clean_round(partition_dir, first_dirty=0, first_uncleanable=8, active_producers=active)
    assert layout(partition_dir)[0] == [
        D(0, 2, kv(1, b"2"), pid=1, epoch=0, seq=0),
        D(3, 5, kv(3, b"3"), pid=2, epoch=0, seq=0),
        D(6, 7, kv(6, b"1"), kv(7, b"4"), pid=3, epoch=0, seq=0),
    ]
    end, _ = clean_round(partition_dir, first_dirty=end, active_producers=active)
    assert layout(partition_dir)[0] == [
        E(0, 2, pid=1, epoch=0, seq=0),
        D(3, 5, kv(3, b"3"), pid=2, epoch=0, seq=0),
        D(6, 7, kv(6, b"1"), kv(7, b"4"), pid=3, epoch=0, seq=0),
        D(8, 8, kv(8, b"2"), pid=4, epoch=0, seq=0),
    ]
    assert_output_rules(partition_dir, w.written)


def test_stats_like_kafka(partition_dir: Path) -> None:
    """testLogCleanerStats: keys 0,1,0,1,0 cleaned from offset 2 with room for 3 keys."""
    w = LogWriter(partition_dir)
    for k in (b"0", b"1", b"0", b"1", b"0"):
        w.data([k])
    w.roll()
    w.close()
    before = sum(s.size for s in read_segments(partition_dir))
    cleaner = make_cleaner(100, 0.6)
    assert cleaner.offset_map.max_keys == 3

    end, stats = clean_round(partition_dir, first_dirty=2, cleaner=cleaner)

    assert end == 5
    assert records_of(all_batches(partition_dir)) == [kv(3, b"1"), kv(4, b"0")]
    assert stats.messages_read == 5 and stats.messages_written == 2 and stats.invalid_messages_read == 0
    assert stats.bytes_read == before
    assert stats.bytes_written == sum(s.size for s in read_segments(partition_dir))


# ---- a full offset map ends the round early (§9.2) -------------------------------------------


def test_partial_clean_one_key_at_a_time(partition_dir: Path) -> None:
    """testPartialSegmentClean: a map that holds one key still makes progress; each
    round ends at the map's latest offset + 1."""
    w = LogWriter(partition_dir)
    for k in (b"0", b"1", b"0", b"1", b"0"):
        w.data([k])
    w.roll()
    w.close()
    cleaner = make_cleaner(40, 0.75)
    assert cleaner.offset_map.max_keys == 1

    end, _ = clean_round(partition_dir, first_dirty=2, cleaner=cleaner)
    assert end == 3
    assert records_of(all_batches(partition_dir)) == [kv(1, b"1"), kv(2, b"0"), kv(3, b"1"), kv(4, b"0")]

    end, _ = clean_round(partition_dir, first_dirty=end, cleaner=cleaner)
    assert end == 4
    assert records_of(all_batches(partition_dir)) == [kv(2, b"0"), kv(3, b"1"), kv(4, b"0")]

    end, _ = clean_round(partition_dir, first_dirty=end, cleaner=cleaner)
    assert end == 5
    assert records_of(all_batches(partition_dir)) == [kv(3, b"1"), kv(4, b"0")]
    assert_output_rules(partition_dir, w.written)


def test_records_the_map_build_never_read_are_judged_by_key(partition_dir: Path) -> None:
    """Issue 9, defect 2. The map build starts at the offset index's position for the first
    dirty offset. An index entry that points past it (here: "offset 1" at batch 3's
    position) leaves records 1 and 2 unread; Kafka keeps them, their keys being absent
    from the map, where judging them by the map's values would drop them."""
    w = LogWriter(partition_dir)
    for key in (b"a", b"b", b"c", b"a"):  # 0..3
        w.data([key])
    w.roll()
    w.data([b"z"])  # 4, active
    w.close()
    sizes = [len(w.written.batches[base]) for base in range(3)]
    index = partition_dir / "00000000000000000000.index"
    index.write_bytes(struct.pack(">ii", 1, sum(sizes)))

    clean_round(partition_dir, first_dirty=1)

    assert layout(partition_dir)[0] == [D(1, 1, kv(1, b"b")), D(2, 2, kv(2, b"c")), D(3, 3, kv(3, b"a"))]


def test_map_full_in_the_middle_of_a_batch(partition_dir: Path) -> None:
    """The map fills on the third key of a batch: latestOffset is the last *put*, so the
    round ends mid-batch; records past it are kept untouched, and the next round starts
    there (records below the start are not indexed). Four rounds reach the final state."""
    w = LogWriter(partition_dir)
    w.data([b"a", b"b", b"c"])  # 0..2
    w.data([b"a", b"b"])  # 3..4
    w.data([b"c", b"d"])  # 5..6
    w.roll()
    w.data([b"x"])  # 7, active
    w.close()
    cleaner = make_cleaner(60, 0.75)
    assert cleaner.offset_map.max_keys == 2

    # a@0, b@1 put; c@2 does not fit: latest = 1.
    end, _ = clean_round(partition_dir, first_dirty=0, cleaner=cleaner)
    assert end == 2
    assert_verbatim(partition_dir, w.written, 0, 3, 5, 7)

    # c@2 (batch done: latest 2), a@3; b@4 does not fit: latest = 3.
    end, _ = clean_round(partition_dir, first_dirty=end, cleaner=cleaner)
    assert end == 4
    assert layout(partition_dir)[0] == [
        D(0, 2, kv(1, b"b"), kv(2, b"c")),  # b@1 is not in this round's map: kept
        D(3, 4, kv(3, b"a"), kv(4, b"b")),
        D(5, 6, kv(5, b"c"), kv(6, b"d")),
    ]

    # b@4 (latest 4), c@5; d@6 does not fit: latest = 5.
    end, _ = clean_round(partition_dir, first_dirty=end, cleaner=cleaner)
    assert end == 6
    assert layout(partition_dir)[0] == [D(3, 4, kv(3, b"a"), kv(4, b"b")), D(5, 6, kv(5, b"c"), kv(6, b"d"))]

    # d@6; the segment ends: latest = next start - 1 = 6.
    end, _ = clean_round(partition_dir, first_dirty=end, cleaner=cleaner)
    assert end == 7
    assert layout(partition_dir) == {
        0: [D(3, 4, kv(3, b"a"), kv(4, b"b")), D(5, 6, kv(5, b"c"), kv(6, b"d"))],
        7: [D(7, 7, kv(7, b"x"))],
    }
    assert_verbatim(partition_dir, w.written, 3, 5, 7)
    assert_output_rules(partition_dir, w.written)


def test_offset_gaps_are_crossed(tmp_path: Path) -> None:
    """testCleaningBeyondMissingOffsets (KAFKA-8764): after a segment the map's latest
    offset fast-forwards to the next segment's base - 1, so a round ends past a gap."""
    d = tmp_path / "topic-0"
    w = LogWriter(d)
    for i in range(10):
        w.data([b"%d" % i])
    w.roll(15)  # offsets 10..14 do not exist
    for i in range(15, 25):
        w.data([b"%d" % i])
    w.roll(30)  # 25..29 neither
    w.data([b"1015"])
    w.close()
    end, _ = clean_round(d, first_dirty=0)
    assert end == 30


# ---- segment grouping (§9.3) ---------------------------------------------------------------


def _single_batch_segments(directory: Path, count: int, config: LogConfig, **data) -> LogWriter:
    w = LogWriter(directory, config)
    for i in range(count):
        if i:
            w.roll()
        w.data([b"k%d" % i], **data)
    return w


def test_grouping_by_log_size(partition_dir: Path) -> None:
    """Segments merge while the summed .log sizes stay <= segment.bytes."""
    probe = _single_batch_segments(partition_dir.parent / "probe-0", 1, LogConfig())
    size = len(next(iter(probe.written.batches.values())))
    probe.close()
    w = _single_batch_segments(partition_dir, 6, LogConfig(segment_bytes=2 * size))  # 5 cleanable + active
    w.close()
    assert [s.size for s in read_segments(partition_dir)] == [size] * 6

    end, _ = clean_round(partition_dir, first_dirty=0, config=LogConfig(segment_bytes=2 * size))

    assert end == 5
    assert [s.base_offset for s in read_segments(partition_dir)] == [0, 2, 4, 5]
    assert [len(s) for s in layout(partition_dir).values()] == [2, 2, 1, 1]
    assert raw_batches(partition_dir) == w.written.batches  # nothing removed: all verbatim


@pytest.mark.parametrize(
    ("same_timestamps", "index_bytes", "binding"),
    [(True, 60, "offset index"), (False, 96, "time index")],
)
def test_grouping_by_index_size(partition_dir: Path, same_timestamps: bool, index_bytes: int, binding: str) -> None:
    """Segments merge while the summed offset-index (entries * 8) and time-index
    (entries * 12) sizes stay <= segment.index.bytes. Four batches per segment with
    index.interval.bytes = 1 give 3 offset-index entries; the time index gets one entry
    per increase of the max timestamp (one when every timestamp is equal, three when they
    increase)."""
    config = LogConfig(segment_index_bytes=index_bytes, index_interval_bytes=1)
    w = LogWriter(partition_dir, config)
    for s in range(4):
        if s:
            w.roll()
        for _ in range(4):
            o = w.next_offset
            w.data([b"k%d" % o], timestamps=[BASE_TS if same_timestamps else BASE_TS + o])
    w.roll()
    w.data([b"active"])
    w.close()
    before = read_segments(partition_dir)
    assert [s.index_bytes for s in before[:4]] == [24] * 4
    assert [s.time_index_bytes for s in before[:4]] == [12 if same_timestamps else 36] * 4

    end, _ = clean_round(partition_dir, first_dirty=0, config=config)

    assert end == 16
    # Two segments per group: 2*24 <= 60 < 3*24 (offset index), or 2*36 <= 96 < 3*36 (time index).
    assert [s.base_offset for s in read_segments(partition_dir)] == [0, 8, 16], binding
    assert raw_batches(partition_dir) == w.written.batches


def test_grouping_by_offset_range(partition_dir: Path) -> None:
    """A group's offset span, estimated from the next segment's base (or the first
    uncleanable offset - 1 for the last one), must fit a 32-bit relative offset
    (KAFKA-5413); exactly Int.MaxValue is allowed."""
    w = LogWriter(partition_dir)
    w.data([b"a"])  # 0
    w.roll(100)
    w.data([b"b"])  # 100: estimate 2^31 - 1 - 0 = Int.MaxValue -> same group
    w.roll(2**31)
    w.data([b"c"])  # 2^31: estimate 2^31 + 9 -> a new group
    w.roll(2**31 + 10)
    w.data([b"d"])
    w.close()

    end, _ = clean_round(partition_dir, first_dirty=0)

    assert end == 2**31 + 10
    assert [s.base_offset for s in read_segments(partition_dir)] == [0, 2**31, 2**31 + 10]
    assert layout(partition_dir)[0] == [D(0, 0, kv(0, b"a")), D(100, 100, kv(100, b"b"))]
    assert raw_batches(partition_dir) == w.written.batches


def test_empty_segments_are_merged_whatever_their_offset_span(partition_dir: Path) -> None:
    """KAFKA-12889: the offset-range check is skipped for 0-byte segments, so empty
    segments do not pile up one every 2^31 offsets."""
    w = LogWriter(partition_dir)
    w.data([b"a"])  # 0
    w.roll(10)  # empty
    w.roll(2**31 + 5)  # empty, and its span from 0 is beyond Int.MaxValue
    w.roll(2**31 + 50)
    w.data([b"b"])
    w.roll()
    w.data([b"c"])  # active
    w.close()
    assert [s.size > 0 for s in read_segments(partition_dir)] == [True, False, False, True, True]

    clean_round(partition_dir, first_dirty=0)

    assert [s.base_offset for s in read_segments(partition_dir)] == [0, 2**31 + 50, 2**31 + 51]
    assert raw_batches(partition_dir) == w.written.batches


def test_an_emptied_batch_at_a_group_end_goes_as_in_kafka(partition_dir: Path) -> None:
    """Kafka keeps an emptied batch only for an active producer's last batch or at the
    round's end (KAFKA-17076), not at the end of every segment *group*: a group's last batch
    that loses all its records goes (issue 9, defect 1), the round's last one stays."""
    probe = _single_batch_segments(partition_dir.parent / "probe-0", 1, LogConfig())
    size = len(next(iter(probe.written.batches.values())))
    probe.close()
    config = LogConfig(segment_bytes=2 * size)
    w = LogWriter(partition_dir, config)
    for i, key in enumerate([b"a", b"b", b"c", b"b"]):  # b@1 ends group [0, 1]; b@3 overwrites it
        if i:
            w.roll()
        w.data([key])
    w.roll()
    w.data([b"z"])
    w.close()

    clean_round(partition_dir, first_dirty=0, config=config)

    assert layout(partition_dir) == {
        0: [D(0, 0, kv(0, b"a"))],
        2: [D(2, 2, kv(2, b"c")), D(3, 3, kv(3, b"b"))],
        4: [D(4, 4, kv(4, b"z"))],
    }
    assert_output_rules(partition_dir, w.written)


# ---- tombstones and delete horizons (§9.5, KIP-534) -------------------------------------------


def test_tombstone_lifecycle(partition_dir: Path) -> None:
    """First pass: a surviving tombstone is kept and its batch re-encoded with
    deleteHorizonMs = now + delete.retention.ms (attribute bit 6, base timestamp = horizon,
    record timestamps unchanged). Before the horizon it stays (batch copied verbatim); at
    the horizon (now >= horizon) it goes, and the rebuilt batch keeps the horizon it has."""
    w = LogWriter(partition_dir)
    w.data([b"a"])  # 0: overwritten by the tombstone at 3
    w.data([b"b"])  # 1: overwritten by the tombstone at 5
    w.data([b"x", b"a", b"y"], [b"vx", None, b"vy"], codec=GZIP)  # 2..4
    w.data([b"b"], [None])  # 5
    w.roll()
    w.data([b"z"])
    w.close()

    t1 = NOW
    horizon = t1 + DAY
    clean_round(partition_dir, first_dirty=0, now=t1)
    first = layout(partition_dir)[0]
    assert first == [
        D(2, 4, (2, b"x", b"vx"), tomb(3, b"a"), (4, b"y", b"vy"), horizon=horizon, codec=GZIP),
        D(5, 5, tomb(5, b"b"), horizon=horizon),
    ]
    stamped = all_batches(partition_dir)[0]
    assert stamped.raw[22] & 0x40 and stamped.base_timestamp == horizon
    assert stamped.max_timestamp == BASE_TS + 4
    assert [r.timestamp for r in stamped.records] == [BASE_TS + 2, BASE_TS + 3, BASE_TS + 4]
    assert_output_rules(partition_dir, w.written)
    after_first = raw_batches(partition_dir)

    clean_round(partition_dir, first_dirty=0, now=horizon - 1)  # before the horizon: kept, verbatim
    assert raw_batches(partition_dir) == after_first

    clean_round(partition_dir, first_dirty=0, now=horizon)  # at the horizon: removed
    assert layout(partition_dir)[0] == [
        D(2, 4, (2, b"x", b"vx"), (4, b"y", b"vy"), horizon=horizon, codec=GZIP),
        E(5, 5),  # the round's last batch (nextOffset == first uncleanable): KAFKA-17076
    ]
    assert_output_rules(partition_dir, w.written)
    after_third = raw_batches(partition_dir)

    clean_round(partition_dir, first_dirty=0, now=horizon + 5 * DAY)  # nothing left to change
    assert raw_batches(partition_dir) == after_third


def test_stamped_tombstone_matches_the_spec_test_vector(partition_dir: Path) -> None:
    """KAFKA_NOTES §1.6 (d): a tombstone (key "k", timestamp 1000, leader epoch 0) cleaned
    at now = 1000 is rewritten with horizon 86401000 into exactly these 72 bytes (record
    timestampDelta -86400000, maxTimestamp still 1000)."""
    vector = bytes.fromhex(
        "00000000000000000000003c0000000002d9af37140040000000000000000005265fe800000000000003e8"
        "ffffffffffffffffffffffffffff000000011400ffefb25200026b0100"
    )
    w = LogWriter(partition_dir)
    w.data([b"k"], [None], timestamps=[1000], leader_epoch=0)
    w.roll()
    w.data([b"z"])
    w.close()
    clean_round(partition_dir, first_dirty=0, now=1000)
    assert all_batches(partition_dir)[0].raw == vector


def test_tombstone_with_zero_delete_retention(partition_dir: Path) -> None:
    """delete.retention.ms = 0: stamped with horizon = now on the first pass, removed by
    the next pass even at the same time (now >= horizon)."""
    w = LogWriter(partition_dir)
    w.data([b"a"], [None])
    w.data([b"b"])
    w.roll()
    w.data([b"z"])
    w.close()
    clean_round(partition_dir, first_dirty=0, now=NOW, delete_retention_ms=0)
    assert layout(partition_dir)[0] == [D(0, 0, tomb(0, b"a"), horizon=NOW), D(1, 1, kv(1, b"b"))]
    clean_round(partition_dir, first_dirty=0, now=NOW, delete_retention_ms=0)
    assert layout(partition_dir)[0] == [D(1, 1, kv(1, b"b"))]


def test_tombstone_beyond_the_map_is_kept_and_stamped(partition_dir: Path) -> None:
    """Records past the map's latest offset are kept untouched, and a tombstone among them
    still gets its batch stamped (§9.5)."""
    w = LogWriter(partition_dir)
    w.data([b"a"])
    w.data([b"b"], [None])
    w.roll()
    w.data([b"z"])
    w.close()
    cleaner = make_cleaner(40, 0.75)  # one key: a@0 fits, b@1 does not
    end, _ = clean_round(partition_dir, first_dirty=0, cleaner=cleaner)
    assert end == 1
    assert layout(partition_dir)[0] == [D(0, 0, kv(0, b"a")), D(1, 1, tomb(1, b"b"), horizon=NOW + DAY)]


def test_clean_tombstone_like_kafka(partition_dir: Path) -> None:
    """testCleanTombstone: a tombstone whose timestamp is far in the past is still kept
    on the pass that first sees it (the horizon is wall-clock based, not record based)."""
    w = LogWriter(partition_dir)
    w.data([b"0"], timestamps=[NOW + DAY + 10_000])
    w.roll()
    w.data([b"0"], [None], timestamps=[NOW - DAY - 10_000])
    w.roll()
    w.data([b"1"], timestamps=[NOW])
    w.roll()
    w.close()
    clean_round(partition_dir, first_dirty=0, first_uncleanable=1)
    clean_round(partition_dir, first_dirty=1, first_uncleanable=2)
    assert all_batches(partition_dir)[0].last_offset == 1
    clean_round(partition_dir, first_dirty=2)
    assert all_batches(partition_dir)[0].last_offset == 1
    assert layout(partition_dir)[0] == [D(1, 1, tomb(1, b"0"), horizon=NOW + DAY), D(2, 2, kv(2, b"1"))]


def test_tombstone_in_clean_tail_removed_only_after_its_horizon(partition_dir: Path) -> None:
    """A tombstone in the clean tail with no newer record: KIP-534 keeps it (and stamps
    it) whatever the segment mtimes, unlike the legacy mtime rule."""
    w = LogWriter(partition_dir)
    w.data([b"a"], [None])  # 0
    w.roll()
    w.data([b"b"])  # 1
    w.roll()
    w.data([b"c"])  # 2
    w.roll()
    w.data([b"z"])
    w.close()
    old = (NOW - 30 * DAY) / 1000
    os.utime(partition_dir / f"{0:020d}.log", (old, old))
    clean_round(partition_dir, first_dirty=2)  # segments 0 and 1 are the clean tail
    assert layout(partition_dir)[0] == [
        D(0, 0, tomb(0, b"a"), horizon=NOW + DAY),
        D(1, 1, kv(1, b"b")),
        D(2, 2, kv(2, b"c")),
    ]


# ---- transactions (§9.7) ------------------------------------------------------------------


def test_transaction_marker_lifecycle(partition_dir: Path) -> None:
    """Aborted data goes at once; its ABORT marker stays (with its txn-index entry) while
    data of that transaction is seen in a round, is stamped with a horizon in the first
    round that sees none, stays before the horizon and goes at it. A COMMIT marker stays
    while a transactional batch of its producer precedes it in the round, then follows the
    same horizon path. Each round cleans one more segment, as new data would arrive."""
    w = LogWriter(partition_dir)
    w.data([b"k1"], pid=1, txn=True)  # 0
    w.data([b"k2", b"k3"], pid=1, txn=True)  # 1..2
    w.marker(ABORT, 1)  # 3
    w.data([b"k3"], pid=1, txn=True)  # 4: seq 3
    w.marker(COMMIT, 1)  # 5
    for key in (b"x", b"y", b"k3", b"z", b"q", b"last"):  # 6..11, one segment each
        w.roll()
        w.data([key])
    w.close()
    aborted = read_segments(partition_dir)[0].aborted
    assert [(t.producer_id, t.first_offset, t.last_offset, t.last_stable_offset) for t in aborted] == [(1, 0, 3, 4)]
    data4 = D(4, 4, kv(4, b"k3"), pid=1, epoch=0, seq=3, txn=True)

    # Round 1: aborted data removed, marker kept with its index entry.
    end, _ = clean_round(partition_dir, first_dirty=0, first_uncleanable=6, now=NOW)
    assert end == 6
    assert layout(partition_dir)[0] == [M(3, "ABORT", 1), data4, M(5, "COMMIT", 1)]
    assert read_segments(partition_dir)[0].aborted == aborted
    assert_verbatim(partition_dir, w.written, 3, 4, 5)

    # Round 2: no data of the aborted txn any more: the marker is stamped, not indexed.
    t2 = NOW + 1_000
    h2 = t2 + DAY
    end, _ = clean_round(partition_dir, first_dirty=end, first_uncleanable=7, now=t2)
    assert end == 7
    assert layout(partition_dir)[0] == [M(3, "ABORT", 1, horizon=h2), data4, M(5, "COMMIT", 1), D(6, 6, kv(6, b"x"))]
    assert read_segments(partition_dir)[0].aborted == []
    stamped = raw_batches(partition_dir)[3]

    # Round 3: before the horizon, unchanged.
    end, _ = clean_round(partition_dir, first_dirty=end, first_uncleanable=8, now=h2 - 1)
    assert end == 8
    assert raw_batches(partition_dir)[3] == stamped

    # Round 4: at the horizon the ABORT marker goes. k3@4 is overwritten by k3@8, but its
    # batch was read before the COMMIT, so the COMMIT stays (and is not stamped).
    end, _ = clean_round(partition_dir, first_dirty=end, first_uncleanable=9, now=h2)
    assert end == 9
    assert layout(partition_dir)[0] == [
        M(5, "COMMIT", 1),
        D(6, 6, kv(6, b"x")),
        D(7, 7, kv(7, b"y")),
        D(8, 8, kv(8, b"k3")),
    ]
    assert_verbatim(partition_dir, w.written, 5)

    # Round 5: no transactional batch precedes the COMMIT: stamped.
    t5 = h2 + 10
    end, _ = clean_round(partition_dir, first_dirty=end, first_uncleanable=10, now=t5)
    assert layout(partition_dir)[0][0] == M(5, "COMMIT", 1, horizon=t5 + DAY)

    # Round 6: at its horizon the COMMIT goes.
    end, _ = clean_round(partition_dir, first_dirty=end, first_uncleanable=11, now=t5 + DAY)
    assert end == 11
    assert layout(partition_dir)[0] == [
        D(o, o, kv(o, k)) for o, k in [(6, b"x"), (7, b"y"), (8, b"k3"), (9, b"z"), (10, b"q")]
    ]
    assert_output_rules(partition_dir, w.written)


def test_multi_pass_cleaning_with_aborted_transactions(partition_dir: Path) -> None:
    """testMultiPassSegmentCleaningWithAbortedTransactions (KAFKA-13727): with a map of
    three keys the segment is cleaned in three passes; aborted transactions stay indexed
    while their markers must be kept, and markers go after delete.retention.ms."""
    retention = 50_000
    w = LogWriter(partition_dir)
    w.data([b"1", b"2"], pid=1, txn=True)  # 0..1
    w.data([b"2", b"3"], pid=2, txn=True)  # 2..3
    w.data([b"3", b"4"], pid=1, txn=True)  # 4..5
    w.marker(COMMIT, 1)  # 6
    w.marker(COMMIT, 2)  # 7
    w.data([b"2", b"3"], pid=1, txn=True)  # 8..9
    w.marker(ABORT, 1)  # 10
    w.data([b"4", b"5"], pid=2, txn=True)  # 11..12
    w.data([b"5", b"6"], pid=1, txn=True)  # 13..14
    w.marker(COMMIT, 1)  # 15
    w.marker(ABORT, 2)  # 16
    w.data([b"6", b"7"], pid=2, txn=True)  # 17..18
    w.marker(COMMIT, 2)  # 19
    w.roll()
    w.close()
    expected_aborted = [(1, 8, 10, 11), (2, 11, 16, 17)]

    def aborted() -> list[tuple[int, int, int, int]]:
        return [
            (t.producer_id, t.first_offset, t.last_offset, t.last_stable_offset)
            for s in read_segments(partition_dir)
            for t in s.aborted
        ]

    def bases() -> list[int]:
        return [b.base_offset for b in all_batches(partition_dir)]

    def offsets() -> list[int]:
        return [o for o, _, _ in records_of(all_batches(partition_dir))]

    assert aborted() == expected_aborted
    cleaner = make_cleaner(100, 0.6)
    assert cleaner.offset_map.max_keys == 3

    end, _ = clean_round(partition_dir, first_dirty=0, now=NOW, delete_retention_ms=retention, cleaner=cleaner)
    assert end == 4
    assert layout(partition_dir)[0] == [
        D(0, 1, kv(0, b"1"), pid=1, epoch=0, seq=0, txn=True),
        D(2, 3, kv(2, b"2"), kv(3, b"3"), pid=2, epoch=0, seq=0, txn=True),
        D(4, 5, kv(4, b"3"), kv(5, b"4"), pid=1, epoch=0, seq=2, txn=True),
        M(6, "COMMIT", 1),
        M(7, "COMMIT", 2),
        M(10, "ABORT", 1),
        D(13, 14, kv(13, b"5"), kv(14, b"6"), pid=1, epoch=0, seq=6, txn=True),
        M(15, "COMMIT", 1),
        M(16, "ABORT", 2),
        D(17, 18, kv(17, b"6"), kv(18, b"7"), pid=2, epoch=0, seq=4, txn=True),
        M(19, "COMMIT", 2),
    ]
    assert aborted() == expected_aborted

    end, _ = clean_round(partition_dir, first_dirty=end, now=NOW, delete_retention_ms=retention, cleaner=cleaner)
    assert end == 14
    assert bases() == [0, 2, 4, 6, 7, 10, 13, 15, 16, 17, 19]
    assert offsets() == [0, 2, 4, 5, 6, 7, 10, 13, 14, 15, 16, 17, 18, 19]
    by_base = {s.base: s for s in layout(partition_dir)[0]}
    assert by_base[2] == D(2, 3, kv(2, b"2"), pid=2, epoch=0, seq=0, txn=True)
    assert by_base[10] == M(10, "ABORT", 1, horizon=NOW + retention)
    assert by_base[16] == M(16, "ABORT", 2, horizon=NOW + retention)
    assert aborted() == []

    end, _ = clean_round(
        partition_dir, first_dirty=end, now=NOW + retention, delete_retention_ms=retention, cleaner=cleaner
    )
    assert end == 20
    assert bases() == [0, 2, 4, 6, 7, 13, 15, 17, 19]
    assert offsets() == [0, 2, 4, 5, 6, 7, 13, 15, 17, 18, 19]
    assert aborted() == []
    assert_output_rules(partition_dir, w.written)


def test_basic_transaction_aware_cleaning(partition_dir: Path) -> None:
    """testBasicTransactionAwareCleaning: aborted data never enters the map nor survives,
    and the txn index still lists the aborted transaction after the clean."""
    w = LogWriter(partition_dir)
    w.data([b"1", b"2"], pid=1, txn=True)  # 0..1
    w.data([b"2", b"3"], pid=2, txn=True)  # 2..3
    w.data([b"3", b"4"], pid=1, txn=True)  # 4..5
    w.marker(ABORT, 1)  # 6
    w.marker(COMMIT, 2)  # 7
    w.data([b"2"], pid=1, txn=True)  # 8
    w.marker(COMMIT, 1)  # 9
    w.roll()
    w.close()
    before = read_segments(partition_dir)[0].aborted

    clean_round(partition_dir, first_dirty=0)

    assert records_of(b for b in all_batches(partition_dir) if not b.is_control) == [kv(3, b"3"), kv(8, b"2")]
    assert [o for o, _, _ in records_of(all_batches(partition_dir))] == [3, 6, 7, 8, 9]
    assert read_segments(partition_dir)[0].aborted == before


def test_transactions_spanning_segments(partition_dir: Path) -> None:
    """testCleanWithTransactionsSpanningSegments: aborted data is found through the txn
    index of a later segment; committed data is deduplicated normally."""
    w = LogWriter(partition_dir)
    w.data([b"1", b"2"], pid=1, txn=True)  # 0..1
    w.data([b"2", b"3"], pid=3, txn=True)  # 2..3
    w.data([b"3", b"4"], pid=2, txn=True)  # 4..5
    w.roll()
    w.data([b"5", b"6"], pid=2, txn=True)  # 6..7
    w.data([b"6", b"7"], pid=3, txn=True)  # 8..9
    w.data([b"7", b"8"], pid=1, txn=True)  # 10..11
    w.marker(ABORT, 2)  # 12
    w.data([b"8", b"9"], pid=3, txn=True)  # 13..14
    w.marker(COMMIT, 3)  # 15
    w.data([b"9", b"10"], pid=1, txn=True)  # 16..17
    w.marker(ABORT, 1)  # 18
    w.roll()
    w.data([b"11"], pid=2, txn=True)  # 19
    w.data([b"12"], pid=1, txn=True)  # 20
    w.roll()
    w.close()

    def keys() -> list[bytes]:
        return [k for b in all_batches(partition_dir) if not b.is_control for _, k, _ in records_of([b])]

    end, _ = clean_round(partition_dir, first_dirty=0, first_uncleanable=6)
    assert keys() == [b"2", b"3", b"5", b"6", b"6", b"7", b"7", b"8", b"8", b"9", b"9", b"10", b"11", b"12"]
    clean_round(partition_dir, first_dirty=end, first_uncleanable=19)
    assert keys() == [b"2", b"3", b"6", b"7", b"8", b"9", b"11", b"12"]


def test_committed_and_aborted_transactions_spanning_segments(partition_dir: Path) -> None:
    """testCommittedTransactionSpanningSegments / testAbortedTransactionSpanningSegments,
    two passes each: a COMMIT stays with its data; an aborted batch that is its producer's
    last stays as an empty header, and so its ABORT marker stays (and stays indexed)."""
    committed = partition_dir.parent / "topic-1"
    w = LogWriter(committed)
    w.data([b"1"], pid=1, txn=True)
    w.roll()
    w.marker(COMMIT, 1)
    w.roll()
    w.close()
    for now in (NOW, NOW + DAY + 1):
        clean_round(committed, first_dirty=0, now=now)
    assert [b.last_offset for b in all_batches(committed)] == [0, 1]
    assert records_of(all_batches(committed))[0] == kv(0, b"1")

    w = LogWriter(partition_dir)
    w.data([b"1"], pid=1, txn=True)
    w.roll()
    w.marker(ABORT, 1)
    w.roll()
    w.close()
    active = {1: ActiveProducer(0, 0)}
    clean_round(partition_dir, first_dirty=0, now=NOW, active_producers=active)
    assert layout(partition_dir)[0] == [E(0, 0, pid=1, epoch=0, seq=0, txn=True), M(1, "ABORT", 1)]
    clean_round(partition_dir, first_dirty=0, now=2**62, active_producers=active)
    assert layout(partition_dir)[0] == [E(0, 0, pid=1, epoch=0, seq=0, txn=True), M(1, "ABORT", 1)]
    assert [t.last_offset for t in read_segments(partition_dir)[0].aborted] == [1]


def test_aborted_txn_last_sequence_then_marker_expiry(partition_dir: Path) -> None:
    """testLogCleanerRetainsLastSequenceEvenIfTransactionAborted and
    testAbortMarkerRetentionWithEmptyBatch: the aborted batch that holds the producer's
    last sequence stays as an empty header; once the producer wrote more it goes, which the
    marker still sees (kept, indexed); then the marker is stamped and expires."""
    w = LogWriter(partition_dir)
    w.data([b"1"], pid=1, txn=True)  # 0
    w.data([b"2", b"3"], pid=1, txn=True)  # 1..2
    w.marker(ABORT, 1)  # 3
    w.roll()
    w.data([b"1", b"5"], pid=1, txn=True)  # 4..5, later data of the producer
    w.marker(COMMIT, 1)  # 6
    w.roll()
    w.data([b"z"])
    w.close()

    end, _ = clean_round(partition_dir, first_dirty=0, first_uncleanable=4, active_producers={1: ActiveProducer(2, 0)})
    assert layout(partition_dir)[0] == [E(1, 2, pid=1, epoch=0, seq=1, txn=True), M(3, "ABORT", 1)]
    assert [t.first_offset for t in read_segments(partition_dir)[0].aborted] == [0]

    end, _ = clean_round(partition_dir, first_dirty=end, active_producers={1: ActiveProducer(5, 0)})
    assert end == 7
    assert layout(partition_dir)[0] == [
        M(3, "ABORT", 1),  # the empty header was read in this round: kept, still indexed
        D(4, 5, kv(4, b"1"), kv(5, b"5"), pid=1, epoch=0, seq=3, txn=True),
        M(6, "COMMIT", 1),
    ]
    assert [t.first_offset for t in read_segments(partition_dir)[0].aborted] == [0]

    t3 = NOW + 7
    clean_round(partition_dir, first_dirty=0, now=t3, active_producers={1: ActiveProducer(5, 0)})
    assert layout(partition_dir)[0][0] == M(3, "ABORT", 1, horizon=t3 + DAY)
    assert read_segments(partition_dir)[0].aborted == []
    clean_round(partition_dir, first_dirty=0, now=t3 + DAY, active_producers={1: ActiveProducer(5, 0)})
    assert layout(partition_dir)[0] == [
        D(4, 5, kv(4, b"1"), kv(5, b"5"), pid=1, epoch=0, seq=3, txn=True),
        M(6, "COMMIT", 1),
    ]
    assert_output_rules(partition_dir, w.written)


def test_empty_batch_removal_with_sequence_reuse(partition_dir: Path) -> None:
    """testEmptyBatchRemovalWithSequenceReuse (KAFKA-8335): the group coordinator reuses
    sequence 0; the producer's last batch is found by last offset, not sequence, so only
    it stays as an empty header, and the first COMMIT goes after two passes."""
    w = LogWriter(partition_dir)
    w.data([b"1"], pid=1, txn=True, seq=0)  # 0
    w.marker(COMMIT, 1)  # 1
    w.data([b"2"], pid=1, txn=True, seq=0)  # 2
    w.marker(COMMIT, 1)  # 3
    w.data([b"1"])  # 4
    w.data([b"2"])  # 5
    w.roll()
    w.close()
    active = {1: ActiveProducer(2, 0)}
    clean_round(partition_dir, first_dirty=0, now=NOW, active_producers=active)
    assert [o for o, _, _ in records_of(all_batches(partition_dir))] == [1, 3, 4, 5]
    assert [b.last_offset for b in all_batches(partition_dir)] == [1, 2, 3, 4, 5]
    clean_round(partition_dir, first_dirty=0, now=NOW, active_producers=active)
    clean_round(partition_dir, first_dirty=0, now=NOW + DAY + 1, active_producers=active)
    assert layout(partition_dir)[0] == [
        E(2, 2, pid=1, epoch=0, seq=0, txn=True),
        M(3, "COMMIT", 1),  # an empty transactional header still counts as seen (§9.7 caveat)
        D(4, 4, kv(4, b"1")),
        D(5, 5, kv(5, b"2")),
    ]


def test_control_records_are_never_deduplicated(partition_dir: Path) -> None:
    """testCleaningWithKeysConflictingWithTxnMarkerKeys (§1.4): markers all share a
    4-byte key and a data record may even use it; no marker is removed by key."""
    w = LogWriter(partition_dir)
    w.data([b"1"], pid=1, txn=True)  # 0
    w.marker(COMMIT, 1)  # 1
    w.data([COMMIT_KEY], [b"foo"], pid=2, txn=True)  # 2: a data record with the COMMIT key
    w.marker(COMMIT, 2)  # 3
    w.data([b"x"], pid=3, txn=True)  # 4
    w.marker(COMMIT, 3)  # 5
    w.roll()
    w.close()
    clean_round(partition_dir, first_dirty=0)
    assert [b.last_offset for b in all_batches(partition_dir)] == [0, 1, 2, 3, 4, 5]
    assert raw_batches(partition_dir) == w.written.batches


def test_commit_marker_removal(partition_dir: Path) -> None:
    """testCommitMarkerRemoval: a COMMIT is kept while its transaction has records,
    even when later cleaned at a large time, and removed once it is empty and expired."""
    w = LogWriter(partition_dir)
    w.data([b"1"], pid=1, txn=True)  # 0
    w.data([b"2", b"3"], pid=1, txn=True)  # 1..2
    w.marker(COMMIT, 1)  # 3
    w.data([b"2"], pid=1, txn=True)  # 4
    w.marker(COMMIT, 1)  # 5
    w.roll()
    w.data([b"1", b"3"], pid=1, txn=True)  # 6..7
    w.marker(COMMIT, 1)  # 8
    w.roll()
    w.close()
    large = 2**62
    end, _ = clean_round(partition_dir, first_dirty=0, first_uncleanable=6, now=large)
    assert [(o, k) for o, k, _ in records_of(b for b in all_batches(partition_dir) if not b.is_control)] == [
        (0, b"1"),
        (2, b"3"),
        (4, b"2"),
        (6, b"1"),
        (7, b"3"),
    ]
    assert [o for o, _, _ in records_of(all_batches(partition_dir))] == [0, 2, 3, 4, 5, 6, 7, 8]

    end, _ = clean_round(partition_dir, first_dirty=end, now=large)
    assert [o for o, _, _ in records_of(all_batches(partition_dir))] == [3, 4, 5, 6, 7, 8]
    end, _ = clean_round(partition_dir, first_dirty=0, now=large)  # stamps the COMMIT at 3
    assert [o for o, _, _ in records_of(all_batches(partition_dir))] == [3, 4, 5, 6, 7, 8]
    assert layout(partition_dir)[0][0] == M(3, "COMMIT", 1, horizon=large + DAY)
    clean_round(partition_dir, first_dirty=0, now=large + DAY)
    assert [o for o, _, _ in records_of(all_batches(partition_dir))] == [4, 5, 6, 7, 8]


# ---- producer state: RETAIN_EMPTY (§9.6, §9.8) ----------------------------------------------


def test_last_batch_of_active_producer_kept_as_empty_header(partition_dir: Path) -> None:
    """testLogCleanerRetainsProducerLastSequence: the batch holding an active producer's
    last data offset stays as a 61-byte header with the original offsets, producer fields,
    leader epoch and maxTimestamp; no compression, no horizon, base timestamp -1. Once the
    producer's last batch is elsewhere the header goes."""
    w = LogWriter(partition_dir)
    w.data([b"0"])  # 0
    w.data([b"0", b"0"], pid=1, codec=GZIP, leader_epoch=7)  # 1..2
    w.data([b"0"], pid=2)  # 3
    w.data([b"0"], pid=3)  # 4
    w.data([b"1"], pid=2)  # 5
    w.roll()
    w.data([b"z"])  # 6
    w.close()
    active = w.active_producers()
    assert active == {1: ActiveProducer(2, 0), 2: ActiveProducer(5, 0), 3: ActiveProducer(4, 0)}

    clean_round(partition_dir, first_dirty=0, active_producers=active)

    assert layout(partition_dir)[0] == [
        E(1, 2, pid=1, epoch=0, seq=0),
        D(4, 4, kv(4, b"0"), pid=3, epoch=0, seq=0),
        D(5, 5, kv(5, b"1"), pid=2, epoch=0, seq=1),
    ]
    header = all_batches(partition_dir)[0]
    assert len(header.raw) == 61 and header.partition_leader_epoch == 7
    assert header.max_timestamp == BASE_TS + 2 and header.base_timestamp == -1
    assert header.attributes == 0 and header.records_count == 0 and header.crc_ok
    assert_output_rules(partition_dir, w.written)

    clean_round(partition_dir, first_dirty=0, active_producers={**active, 1: ActiveProducer(100, 0)})
    assert [b.base_offset for b in all_batches(partition_dir)] == [4, 5, 6]


def test_empty_header_matches_the_spec_test_vector(partition_dir: Path) -> None:
    """KAFKA_NOTES §1.6 (c): the RETAIN_EMPTY header of an idempotent batch [10..12],
    pid 7, epoch 1, baseSequence 4, maxTimestamp 3000, leader epoch 0 is exactly these 61
    bytes."""
    vector = bytes.fromhex(
        "000000000000000a000000310000000002bfc4580f000000000002ffffffffffffffff0000000000000bb8"
        "000000000000000700010000000400000000"
    )
    w = LogWriter(partition_dir)
    w.data(
        [b"a", b"b", b"c"], offsets=[10, 11, 12], pid=7, epoch=1, seq=4, timestamps=[1000, 2000, 3000], leader_epoch=0
    )
    w.data([b"a", b"b", b"c"])
    w.roll()
    w.close()
    clean_round(partition_dir, first_dirty=0, active_producers={7: ActiveProducer(12, 1)})
    assert all_batches(partition_dir)[0].raw == vector


def test_marker_of_producer_whose_last_entry_is_a_marker_kept_empty(partition_dir: Path) -> None:
    """testCleanEmptyControlBatch: when an active producer's latest entry is a marker (no
    data offset), its control batches of that epoch are kept; an expired one as an empty
    control header, which later rounds leave alone (KAFKA-7467) until the producer is no
    longer active."""
    w = LogWriter(partition_dir)
    w.marker(COMMIT, 1)  # 0, no data of the transaction anywhere
    w.data([b"2"])  # 1
    w.data([b"3"])  # 2
    w.roll()
    w.close()
    active = {1: ActiveProducer(None, 0)}

    clean_round(partition_dir, first_dirty=0, now=NOW, active_producers=active)
    assert layout(partition_dir)[0] == [
        M(0, "COMMIT", 1, horizon=NOW + DAY),
        D(1, 1, kv(1, b"2")),
        D(2, 2, kv(2, b"3")),
    ]
    clean_round(partition_dir, first_dirty=0, now=NOW + DAY, active_producers=active)
    assert layout(partition_dir)[0] == [EM(0, 1), D(1, 1, kv(1, b"2")), D(2, 2, kv(2, b"3"))]
    assert len(all_batches(partition_dir)[0].raw) == 61
    emptied = raw_batches(partition_dir)
    clean_round(partition_dir, first_dirty=0, now=2**62, active_producers=active)
    assert raw_batches(partition_dir) == emptied
    clean_round(partition_dir, first_dirty=0, now=2**62, active_producers={})
    assert layout(partition_dir)[0] == [D(1, 1, kv(1, b"2")), D(2, 2, kv(2, b"3"))]


def test_commit_marker_retention_with_empty_batch(partition_dir: Path) -> None:
    """testCommitMarkerRetentionWithEmptyBatch: empty headers of active producers keep
    their COMMIT markers alive; when the producer moves on, the header goes and the
    marker follows the two-pass horizon path."""
    w = LogWriter(partition_dir)
    w.data([b"2", b"3"], pid=1, txn=True)  # 0..1
    w.roll()
    w.data([b"2", b"3"], pid=2, txn=True)  # 2..3
    w.marker(COMMIT, 2)  # 4
    w.roll()
    w.data([b"2"])  # 5
    w.data([b"3"])  # 6
    w.marker(COMMIT, 1)  # 7
    w.roll()
    w.data([b"1"], pid=2, txn=True)  # 8
    w.marker(COMMIT, 2)  # 9
    w.roll()
    w.close()
    large = 2**62
    active = {1: ActiveProducer(1, 0), 2: ActiveProducer(3, 0)}

    end, _ = clean_round(partition_dir, first_dirty=0, first_uncleanable=8, now=large, active_producers=active)
    assert [b.last_offset for b in all_batches(partition_dir)][:6] == [1, 3, 4, 5, 6, 7]
    assert [o for o, _, _ in records_of(all_batches(partition_dir))][:4] == [4, 5, 6, 7]
    clean_round(partition_dir, first_dirty=0, first_uncleanable=8, now=large, active_producers=active)
    assert [b.last_offset for b in all_batches(partition_dir)][:6] == [1, 3, 4, 5, 6, 7]

    active = {1: ActiveProducer(1, 0), 2: ActiveProducer(8, 0)}
    end, _ = clean_round(partition_dir, first_dirty=end, now=large, active_producers=active)
    assert [o for o, _, _ in records_of(all_batches(partition_dir))] == [4, 5, 6, 7, 8, 9]
    assert [b.last_offset for b in all_batches(partition_dir)] == [1, 4, 5, 6, 7, 8, 9]
    clean_round(partition_dir, first_dirty=0, now=large, active_producers=active)
    clean_round(partition_dir, first_dirty=0, now=large + DAY + 1, active_producers=active)
    assert [o for o, _, _ in records_of(all_batches(partition_dir))] == [5, 6, 7, 8, 9]
    assert [b.last_offset for b in all_batches(partition_dir)] == [1, 5, 6, 7, 8, 9]


# ---- the round's last batch (KAFKA-17076) ----------------------------------------------------


def test_round_last_batch_kept_empty_when_keyless(partition_dir: Path) -> None:
    """The batch whose nextOffset is the first uncleanable offset stays as an empty header
    even if none of its records survive, so the log end offset cannot move backwards."""
    w = LogWriter(partition_dir)
    w.data([b"a"])
    w.data([None])  # keyless: dropped (it is below the map's latest offset)
    w.roll()
    w.data([b"z"])
    w.close()
    _, stats = clean_round(partition_dir, first_dirty=0)
    assert layout(partition_dir)[0] == [D(0, 0, kv(0, b"a")), E(1, 1)]
    assert stats.invalid_messages_read == 1
    assert_output_rules(partition_dir, w.written)


def test_round_last_batch_kept_empty_when_aborted(partition_dir: Path) -> None:
    """Aborted data that is the round's last batch stays as an empty transactional
    header; its ABORT marker lies in the uncleanable part and is found through the txn
    index of the later segment."""
    w = LogWriter(partition_dir)
    w.data([b"a"])  # 0
    w.data([b"b"], pid=4, txn=True)  # 1
    w.roll()
    w.marker(ABORT, 4)  # 2, uncleanable
    w.roll()
    w.close()
    end, _ = clean_round(partition_dir, first_dirty=0, first_uncleanable=2)
    assert end == 2
    assert layout(partition_dir) == {
        0: [D(0, 0, kv(0, b"a")), E(1, 1, pid=4, epoch=0, seq=0, txn=True)],
        2: [M(2, "ABORT", 4)],
        3: [],
    }


# ---- keyless records (§9.5) -----------------------------------------------------------------


def test_keyless_records_dropped_below_the_map_and_kept_past_it(partition_dir: Path) -> None:
    """testCleaningWithUnkeyedMessages plus a full map: keyless records up to the map's
    latest offset are invalid and dropped; beyond it every record is kept."""
    w = LogWriter(partition_dir)
    w.data([b"a"])  # 0: put
    w.data([None, None])  # 1..2: latest offset 2 once the batch is read
    w.data([b"b"])  # 3: does not fit
    w.data([None])  # 4
    w.roll()
    w.data([b"z"])
    w.close()
    end, stats = clean_round(partition_dir, first_dirty=0, cleaner=make_cleaner(40, 0.75))
    assert end == 3
    assert layout(partition_dir)[0] == [D(0, 0, kv(0, b"a")), D(3, 3, kv(3, b"b")), D(4, 4, kv(4, None))]
    assert stats.invalid_messages_read == 2
    assert_verbatim(partition_dir, w.written, 0, 3, 4)


# ---- re-encoding (§9.8) -----------------------------------------------------------------------


def test_producer_fields_survive_a_rebuild(partition_dir: Path) -> None:
    """Idempotent and transactional batches that lose records keep producer id, epoch,
    base sequence and lastOffsetDelta (so the last sequence stays), codec and leader
    epoch; records keep their offsets, timestamps and headers."""
    w = LogWriter(partition_dir)
    w.data(
        [b"a", b"b", b"c"],
        pid=7,
        epoch=3,
        seq=10,
        codec=GZIP,
        leader_epoch=4,
        headers=[(("h", b"1"),), (("h", None),), ()],
    )  # 0..2
    w.data([b"d", b"e", b"f"], pid=8, epoch=1, txn=True, codec=ZSTD)  # 3..5
    w.marker(COMMIT, 8, epoch=1)  # 6
    w.data([b"a", b"f"])  # 7..8: a@0 and f@5 go (first and last records of their batches)
    w.roll()
    w.data([b"z"])
    w.close()

    clean_round(partition_dir, first_dirty=0)

    assert layout(partition_dir)[0] == [
        D(0, 2, kv(1, b"b"), kv(2, b"c"), pid=7, epoch=3, seq=10, codec=GZIP),
        D(3, 5, kv(3, b"d"), kv(4, b"e"), pid=8, epoch=1, seq=0, txn=True, codec=ZSTD),
        M(6, "COMMIT", 8, epoch=1),
        D(7, 8, kv(7, b"a"), kv(8, b"f")),
    ]
    first, second = all_batches(partition_dir)[:2]
    assert first.partition_leader_epoch == 4 and [r.headers for r in first.records] == [(("h", None),), ()]
    assert first.base_timestamp == BASE_TS + 1 and first.max_timestamp == BASE_TS + 2
    assert second.max_timestamp == BASE_TS + 4  # CreateTime: max of the kept records
    assert_output_rules(partition_dir, w.written)


def _codec_magic(codec: int, section: bytes) -> None:
    if codec == GZIP:
        assert section[:2] == b"\x1f\x8b"
    elif codec == SNAPPY:  # xerial framing, §1.5
        assert section[:16] == b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    elif codec == LZ4:  # a frame with independent blocks: Kafka rejects linked blocks
        assert section[:4] == b"\x04\x22\x4d\x18"
        flg = section[4]
        assert flg >> 6 == 1 and flg & 0x20, f"LZ4 FLG {flg:#x}: version 01 and block independence required"
    elif codec == ZSTD:
        assert section[:4] == b"\x28\xb5\x2f\xfd"


@pytest.mark.parametrize("codec", [GZIP, SNAPPY, LZ4, ZSTD], ids=["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_are_recompressed_with_their_codec(partition_dir: Path, codec: int) -> None:
    w = LogWriter(partition_dir)
    w.data([b"a", b"b", b"a", b"c"], codec=codec)  # 0..3
    w.data([b"b"], codec=codec)  # 4
    w.data([b"x", b"y"], [None, b"vy"], codec=codec)  # 5..6: a tombstone to stamp
    w.roll()
    w.data([b"z"])
    w.close()

    clean_round(partition_dir, first_dirty=0)

    assert layout(partition_dir)[0] == [
        D(0, 3, kv(2, b"a"), kv(3, b"c"), codec=codec),
        D(4, 4, kv(4, b"b"), codec=codec),
        D(5, 6, tomb(5, b"x"), (6, b"y", b"vy"), horizon=NOW + DAY, codec=codec),
    ]
    rebuilt = all_batches(partition_dir)
    _codec_magic(codec, rebuilt[0].raw[61:])
    _codec_magic(codec, rebuilt[2].raw[61:])
    assert_verbatim(partition_dir, w.written, 4)
    assert_output_rules(partition_dir, w.written)


def test_verbatim_copy_keeps_every_byte(partition_dir: Path) -> None:
    """A batch that keeps every record and needs no horizon is copied byte for byte:
    CRC, partition leader epoch (outside the CRC), codec, LogAppendTime, headers."""
    w = LogWriter(partition_dir)
    w.data([b"a", b"b"], leader_epoch=5, codec=LZ4)
    w.data([b"c"], log_append_time=BASE_TS + 999, leader_epoch=6)
    w.data([b"d"], headers=[(("trace", b"x"), ("none", None))], pid=9, epoch=2)
    w.data([b"e", b"f"], pid=10, txn=True, codec=SNAPPY)
    w.marker(COMMIT, 10)
    w.roll()
    w.data([b"z"])
    w.close()
    before = (partition_dir / f"{0:020d}.log").read_bytes()
    clean_round(partition_dir, first_dirty=0)
    assert (partition_dir / f"{0:020d}.log").read_bytes() == before


def test_log_append_time_batch_rebuilt(partition_dir: Path) -> None:
    """A LogAppendTime batch that loses a record keeps its type and maxTimestamp; its
    records read as the batch's append time."""
    w = LogWriter(partition_dir)
    w.data([b"a", b"b"], log_append_time=BASE_TS + 999, codec=GZIP)
    w.data([b"a"])
    w.roll()
    w.data([b"z"])
    w.close()
    clean_round(partition_dir, first_dirty=0)
    batch = all_batches(partition_dir)[0]
    assert layout(partition_dir)[0][0] == D(0, 1, kv(1, b"b"), codec=GZIP)
    assert batch.log_append_time and batch.max_timestamp == BASE_TS + 999
    assert [r.timestamp for r in batch.records] == [BASE_TS + 999]


def test_cleaned_segment_files(partition_dir: Path) -> None:
    """The cleaned segment carries the last source segment's mtime (the legacy tombstone
    and retention clock), a trimmed offset index whose entries point at batch starts with
    the batch's last offset, and a time index ending with (max timestamp, its offset)."""
    config = LogConfig(index_interval_bytes=1)
    w = LogWriter(partition_dir, config)
    for i in range(6):
        w.data([b"k%d" % (i % 4)], timestamps=[BASE_TS + (100 if i == 5 else i)])
    w.roll()
    for i in range(6, 9):
        w.data([b"k%d" % (i % 4)])
    w.roll()
    w.data([b"z"])
    w.close()
    mtime = (NOW - 1234) / 1000
    os.utime(partition_dir / f"{6:020d}.log", (mtime, mtime))

    clean_round(partition_dir, first_dirty=0, config=config)

    seg = read_segments(partition_dir)[0]
    assert (partition_dir / f"{0:020d}.log").stat().st_mtime == pytest.approx(mtime, abs=0.002)
    positions, p = {}, 0
    for b in seg.batches:
        positions[p] = b
        p += len(b.raw)
    index = (partition_dir / f"{0:020d}.index").read_bytes()
    entries = [struct.unpack_from(">ii", index, i) for i in range(0, len(index), 8)]
    assert entries, "index.interval.bytes = 1 gives entries"
    for rel, pos in entries:
        assert pos in positions and positions[pos].last_offset == rel
    time_index = (partition_dir / f"{0:020d}.timeindex").read_bytes()
    last_ts, last_rel = struct.unpack_from(">qi", time_index, len(time_index) - 12)
    top = max(seg.batches, key=lambda b: b.max_timestamp)
    assert (last_ts, last_rel) == (top.max_timestamp, top.last_offset)


# ---- legacy input (§1.7, KAFKA-13093) ----------------------------------------------------------


def _legacy_plain(magic: int, rows: list[tuple[int, int, bytes | None, bytes | None]]) -> bytes:
    builder = LegacyRecordBatchBuilder(magic, 0, 1 << 20)
    for offset, ts, key, value in rows:
        builder.append(offset, ts if magic else None, key, value)
    return bytes(builder.build())


def _legacy_wrapper(
    magic: int,
    codec: int,
    rows: list[tuple[int, int, bytes | None, bytes | None]],
    *,
    log_append_time: int | None = None,
) -> bytes:
    """A compressed wrapper as a broker stores it: offset = last inner offset; inner
    offsets absolute (v0) or relative 0..n-1 (v1)."""
    builder = LegacyRecordBatchBuilder(magic, codec, 1 << 20)
    for i, (offset, ts, key, value) in enumerate(rows):
        builder.append(offset if magic == 0 else i, ts if magic else None, key, value)
    buf = bytearray(builder.build())
    struct.pack_into(">q", buf, 0, rows[-1][0])
    if log_append_time is not None:
        buf[17] |= 0x08
        struct.pack_into(">q", buf, 18, log_append_time)
        struct.pack_into(">I", buf, 12, zlib.crc32(buf[16:]))
    return bytes(buf)


def test_legacy_batches_are_rewritten_as_v2(partition_dir: Path) -> None:
    """Kafka 4.0: every legacy entry that keeps a record becomes a v2 batch: same codec,
    base offset = first kept record, lastOffsetDelta = last kept - base, no producer
    fields, v0 becomes CreateTime with timestamps -1, LogAppendTime keeps the wrapper's
    time; a tombstone in the result is stamped with a horizon."""
    t = BASE_TS
    w = LogWriter(partition_dir)
    w.raw(_legacy_plain(0, [(0, -1, b"a", b"v0")]), next_offset=1)
    w.raw(_legacy_plain(1, [(1, t + 1, b"b", b"v1")]), next_offset=2)
    w.raw(
        _legacy_wrapper(1, GZIP, [(2, t + 2, b"a", b"v2"), (3, t + 3, b"c", b"v3"), (4, t + 4, b"b", b"v4")]),
        next_offset=5,
    )
    w.raw(_legacy_wrapper(0, GZIP, [(5, -1, b"d", b"v5"), (6, -1, None, b"v6")]), next_offset=7)
    w.raw(
        _legacy_wrapper(1, GZIP, [(7, t + 7, b"e", b"v7"), (8, t + 8, b"f", None)], log_append_time=t + 99),
        next_offset=9,
    )
    w.data([b"b"])  # 9
    w.roll()
    w.data([b"z"])
    w.close()
    assert [b.magic for b in all_batches(partition_dir)] == [0, 1, 1, 0, 1, 2, 2]

    clean_round(partition_dir, first_dirty=0)

    assert layout(partition_dir)[0] == [
        D(2, 3, kv(2, b"a"), kv(3, b"c"), codec=GZIP),
        D(5, 5, kv(5, b"d"), codec=GZIP),
        D(7, 8, kv(7, b"e"), tomb(8, b"f"), horizon=NOW + DAY, codec=GZIP),
        D(9, 9, kv(9, b"b")),
    ]
    out = all_batches(partition_dir)
    assert [r.timestamp for r in out[0].records] == [t + 2, t + 3] and not out[0].log_append_time
    assert [r.timestamp for r in out[1].records] == [-1] and out[1].base_timestamp == -1
    assert out[2].log_append_time and out[2].max_timestamp == t + 99
    assert [r.timestamp for r in out[2].records] == [t + 99, t + 99]
    for b in out:
        assert (b.magic, b.crc_ok, b.partition_leader_epoch, b.producer_id, b.base_sequence) == (2, True, -1, -1, -1)


def test_legacy_uncompressed_messages_become_one_batch_each(partition_dir: Path) -> None:
    w = LogWriter(partition_dir)
    w.raw(
        _legacy_plain(1, [(0, BASE_TS, b"a", b"v0"), (1, BASE_TS + 1, b"b", b"v1"), (2, BASE_TS + 2, b"c", b"v2")]),
        next_offset=3,
    )
    w.data([b"b"])  # 3
    w.roll()
    w.data([b"z"])
    w.close()
    clean_round(partition_dir, first_dirty=0)
    assert layout(partition_dir)[0] == [D(0, 0, kv(0, b"a")), D(2, 2, kv(2, b"c")), D(3, 3, kv(3, b"b"))]
    assert all(b.magic == 2 for b in all_batches(partition_dir))


def test_legacy_wrapper_with_a_full_map(partition_dir: Path) -> None:
    """The map fills inside a legacy wrapper, in a round that starts in the middle of it:
    records below the start are not indexed, those past the latest offset are kept, and
    the rewritten v2 batch starts at its first kept record."""
    w = LogWriter(partition_dir)
    w.raw(
        _legacy_wrapper(
            1, GZIP, [(0, BASE_TS, b"a", b"v0"), (1, BASE_TS + 1, b"b", b"v1"), (2, BASE_TS + 2, b"c", b"v2")]
        ),
        next_offset=3,
    )
    w.data([b"a"])  # 3
    w.data([b"b"])  # 4
    w.roll()
    w.data([b"z"])
    w.close()
    cleaner = make_cleaner(60, 0.75)  # two keys: b@1, c@2 (wrapper done: latest 2); a@3 does not fit
    end, _ = clean_round(partition_dir, first_dirty=1, cleaner=cleaner)
    assert end == 3
    assert layout(partition_dir)[0] == [
        D(0, 2, kv(0, b"a"), kv(1, b"b"), kv(2, b"c"), codec=GZIP),
        D(3, 3, kv(3, b"a")),
        D(4, 4, kv(4, b"b")),
    ]
    assert all(b.magic == 2 for b in all_batches(partition_dir))


def test_legacy_round_last_batch_kept_as_v2_empty_header(partition_dir: Path) -> None:
    """The engine's documented choice where Kafka 4.x would throw IllegalStateException
    ("empty batches are only supported for magic v2"): a legacy entry that must be kept
    empty (here the round's last batch) becomes a 61-byte v2 header over its offsets."""
    w = LogWriter(partition_dir)
    w.data([b"a"])  # 0
    w.raw(_legacy_plain(1, [(1, BASE_TS + 1, None, b"keyless")]), next_offset=2)
    w.roll()
    w.data([b"z"])
    w.close()
    clean_round(partition_dir, first_dirty=0)
    assert layout(partition_dir)[0] == [D(0, 0, kv(0, b"a")), E(1, 1)]
    empty = all_batches(partition_dir)[1]
    assert empty.magic == 2 and len(empty.raw) == 61 and empty.crc_ok


def test_legacy_tombstone_follows_the_mtime_rule(partition_dir: Path) -> None:
    """Legacy records have no horizon: retainLegacyDeletes = source segment mtime > (mtime
    of the clean tail's last segment) - delete.retention.ms. A legacy tombstone in an old
    enough tail segment is dropped on this pass; a v2 one next to it is stamped (KIP-534)."""
    w = LogWriter(partition_dir)
    w.raw(_legacy_plain(1, [(0, BASE_TS, b"a", None)]), next_offset=1)  # legacy tombstone
    w.data([b"b"], [None])  # 1: v2 tombstone
    w.roll()
    w.data([b"c"])  # 2: last segment of the clean tail
    w.roll()
    w.data([b"d"])  # 3: dirty
    w.roll()
    w.data([b"z"])
    w.close()
    old, recent = (NOW - 3 * DAY) / 1000, (NOW - DAY // 2) / 1000
    os.utime(partition_dir / f"{0:020d}.log", (old, old))
    os.utime(partition_dir / f"{2:020d}.log", (recent, recent))

    clean_round(partition_dir, first_dirty=3)

    assert layout(partition_dir)[0] == [
        D(1, 1, tomb(1, b"b"), horizon=NOW + DAY),
        D(2, 2, kv(2, b"c")),
        D(3, 3, kv(3, b"d")),
    ]


@pytest.mark.parametrize(("after_horizon_ms", "kept"), [(0, False), (1, True)])
def test_a_legacy_tombstone_exactly_at_the_mtime_horizon_goes(
    partition_dir: Path, after_horizon_ms: int, kept: bool
) -> None:
    """The boundary of the legacy rule (``Cleaner.cleanSegments``:
    ``retainLegacyDeletesAndTxnMarkers = currentSegment.lastModified > legacyDeleteHorizonMs``):
    a segment modified exactly at the horizon no longer keeps its tombstones; one
    millisecond later it does."""
    w = LogWriter(partition_dir)
    w.raw(_legacy_plain(1, [(0, BASE_TS, b"a", None)]), next_offset=1)  # legacy tombstone
    w.roll()
    w.data([b"c"])  # 1: last segment of the clean tail, its mtime sets the horizon
    w.roll()
    w.data([b"d"])  # 2: dirty
    w.roll()
    w.data([b"z"])
    w.close()
    tail_ms = NOW - DAY // 2
    horizon_ms = tail_ms - DAY  # delete.retention.ms: one day
    for base, ms in ((0, horizon_ms + after_horizon_ms), (1, tail_ms)):
        os.utime(partition_dir / f"{base:020d}.log", ns=(ms * 1_000_000, ms * 1_000_000))

    clean_round(partition_dir, first_dirty=2)

    offsets = [batch.base_offset for batch in read_segments(partition_dir)[0].batches]
    assert (0 in offsets) is kept


# ---- the manager: what gets cleaned (§6) -------------------------------------------------------


def _policy(**rule: object):
    topic = {"match": ".*", "cleanupPolicy": "compact", **rule}
    return parse_policy(
        {"mode": "compact", "topics": [topic], "cleaner": {"dedupeBufferSize": 1 << 20, "backoffMs": 0}}
    )


def _log_dir(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    root.mkdir()
    return root


def _set_high_watermark(root: Path, tp: TopicPartition, offset: int) -> None:
    path = OffsetCheckpointFile(root / "replication-offset-checkpoint")
    current = path.read() if path.exists() else {}
    path.write({**current, tp: offset})


def _leo(directory: Path) -> int:
    return max(s.next_offset for s in read_segments(directory))


def _run(root: Path, policy, now: int = NOW) -> cleaning.CleanOutcome:
    return cleaning.clean([root], policy, MockTime(now))


def _duplicates_log(directory: Path, segments: int = 3) -> LogWriter:
    w = LogWriter(directory)
    for s in range(segments):
        if s:
            w.roll()
        w.data([b"a"])
        w.data([b"b%d" % s])
    w.roll()
    w.data([b"a"])  # active
    w.close()
    return w


@pytest.mark.parametrize(
    ("checkpoint", "first_dirty", "forced"),
    [(None, 4, False), (2, 4, True), (5, 5, False), (1000, 4, True)],
    ids=["absent", "below-log-start", "valid", "above-log-end"],
)
def test_checkpoint_reset_rules(tmp_path: Path, checkpoint: int | None, first_dirty: int, forced: bool) -> None:
    """§6.2: a checkpoint below the log start offset or above the log end offset resets to
    the log start offset and is rewritten at once (KAFKA-6266, KAFKA-8724)."""
    root = _log_dir(tmp_path)
    d = root / "topic-0"
    _duplicates_log(d)  # segments 0, 2, 4, active 6
    _set_high_watermark(root, TP, _leo(d))
    OffsetCheckpointFile(root / "log-start-offset-checkpoint").write({TP: 4})
    if checkpoint is not None:
        OffsetCheckpointFile(root / "cleaner-offset-checkpoint").write({TP: checkpoint})
    manager = LogCleanerManager([LogDirectory(root)], _policy(minCleanableDirtyRatio=0.01), MockTime(NOW))
    managed = manager.logs()[TP]
    assert managed.log.log_start_offset == 4

    offsets = manager.cleanable_offsets(managed, checkpoint, NOW)
    assert (offsets.first_dirty_offset, offsets.force_update_checkpoint) == (first_dirty, forced)
    assert offsets.first_uncleanable_dirty_offset == 6

    ltc = manager.grab_filthiest_compacted_log(NOW)
    assert ltc is not None and ltc.first_dirty_offset == first_dirty
    on_disk = OffsetCheckpointFile(root / "cleaner-offset-checkpoint")
    if forced:
        assert on_disk.read() == {TP: first_dirty}  # written eagerly, before the clean
    else:
        assert (on_disk.read() if on_disk.exists() else {}) == ({TP: checkpoint} if checkpoint is not None else {})


def test_clean_writes_the_checkpoint_and_ignores_unmatched_topics(tmp_path: Path) -> None:
    root = _log_dir(tmp_path)
    d = root / "topic-0"
    other = root / "other-0"
    _duplicates_log(d)
    _duplicates_log(other)
    _set_high_watermark(root, TP, _leo(d))
    _set_high_watermark(root, TopicPartition("other", 0), _leo(other))
    before = {p.name: p.read_bytes() for p in other.iterdir()}
    policy = parse_policy(
        {
            "mode": "compact",
            "topics": [{"match": "topic", "cleanupPolicy": "compact"}],
            "cleaner": {"dedupeBufferSize": 1 << 20, "backoffMs": 0},
        }
    )
    outcome = _run(root, policy)
    assert [r.topic_partition for r in outcome.results] == [TP]
    assert OffsetCheckpointFile(root / "cleaner-offset-checkpoint").read() == {TP: 6}
    assert layout(d)[0] == [D(1, 1, kv(1, b"b0")), D(3, 3, kv(3, b"b1")), D(4, 4, kv(4, b"a")), D(5, 5, kv(5, b"b2"))]
    assert {p.name: p.read_bytes() for p in other.iterdir()} == before


def test_uncleanable_partition_does_not_stop_the_others(tmp_path: Path) -> None:
    """KIP-346/KAFKA-8725: a corrupt segment marks its partition uncleanable, with the
    reason kept and reported; its files are not modified; another partition of the same
    log dir is cleaned."""
    root = _log_dir(tmp_path)
    good, bad = root / "topic-0", root / "topic-1"
    _duplicates_log(good)
    w = _duplicates_log(bad)
    _set_high_watermark(root, TP, _leo(good))
    _set_high_watermark(root, TopicPartition("topic", 1), _leo(bad))
    first = len(w.written.batches[0])
    with open(bad / f"{0:020d}.log", "r+b") as f:  # the second batch's magic byte
        f.seek(first + 16)
        f.write(b"\x7f")
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in bad.iterdir()}

    outcome = _run(root, _policy())

    bad_tp = TopicPartition("topic", 1)
    assert list(outcome.uncleanable) == [str(LogDirectory(root))]
    reason = outcome.uncleanable[str(LogDirectory(root))][bad_tp]
    assert "magic" in reason.lower(), reason
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in bad.iterdir()} == before
    assert [r.topic_partition for r in outcome.results] == [TP]
    assert layout(good)[0] == [
        D(1, 1, kv(1, b"b0")),
        D(3, 3, kv(3, b"b1")),
        D(4, 4, kv(4, b"a")),
        D(5, 5, kv(5, b"b2")),
    ]
    assert OffsetCheckpointFile(root / "cleaner-offset-checkpoint").read() == {TP: 6}


def test_uncleanable_reason_is_reported(tmp_path: Path) -> None:
    root = _log_dir(tmp_path)
    d = root / "topic-0"
    w = _duplicates_log(d)
    _set_high_watermark(root, TP, _leo(d))
    with open(d / f"{0:020d}.log", "r+b") as f:
        f.seek(len(w.written.batches[0]) + 16)
        f.write(b"\x7f")
    manager = LogCleanerManager([LogDirectory(root)], _policy(), MockTime(NOW))
    pool = LogCleaner(manager, _policy().cleaner, MockTime(NOW), exit_when_idle=True)
    pool.start()
    pool.join()
    (report,) = manager.report(NOW)
    assert report.reason == "uncleanable" and report.uncleanable_reason
    assert manager.uncleanable_reason(LogDirectory(root), TP) == report.uncleanable_reason


def test_active_segment_never_touched(tmp_path: Path) -> None:
    root = _log_dir(tmp_path)
    d = root / "topic-0"
    w = LogWriter(d)
    w.data([b"a"])
    w.data([b"a"])
    w.roll()
    w.data([b"a"])  # active: duplicates of each other and of the cleaned part
    w.data([b"a"])
    w.close()
    _set_high_watermark(root, TP, _leo(d))
    active = segment_files(d, 2)
    _run(root, _policy())
    assert layout(d) == {0: [D(1, 1, kv(1, b"a"))], 2: [D(2, 2, kv(2, b"a")), D(3, 3, kv(3, b"a"))]}
    assert segment_files(d, 2) == active


def _five_segments(d: Path, *, open_txn_at: int | None = None) -> LogWriter:
    """Segments 0, 2, 4, 6 with a duplicate of key a each, active at 8."""
    w = LogWriter(d)
    for s in range(4):
        if s:
            w.roll()
        w.data([b"a"])
        if open_txn_at == s:
            w.data([b"t"], pid=5, txn=True)  # never ended
        else:
            w.data([b"b%d" % s])
    w.roll()
    w.data([b"a"])
    w.close()
    return w


def test_open_transaction_bounds_the_clean(tmp_path: Path) -> None:
    """§6.3: nothing at or above the LSO (the first offset of an open transaction) is
    cleaned, and the bound is rounded down to its segment's base."""
    root = _log_dir(tmp_path)
    d = root / "topic-0"
    _five_segments(d, open_txn_at=2)  # the open transaction starts at offset 5, in segment 4
    _set_high_watermark(root, TP, _leo(d))
    untouched = {base: segment_files(d, base) for base in (4, 6, 8)}

    _run(root, _policy())

    assert OffsetCheckpointFile(root / "cleaner-offset-checkpoint").read() == {TP: 4}
    assert layout(d)[0] == [D(1, 1, kv(1, b"b0")), D(2, 2, kv(2, b"a")), D(3, 3, kv(3, b"b1"))]
    assert {base: segment_files(d, base) for base in (4, 6, 8)} == untouched


def test_high_watermark_bounds_the_clean(tmp_path: Path) -> None:
    root = _log_dir(tmp_path)
    d = root / "topic-0"
    _five_segments(d)
    _set_high_watermark(root, TP, 5)  # inside segment 4
    untouched = {base: segment_files(d, base) for base in (4, 6, 8)}
    _run(root, _policy())
    assert OffsetCheckpointFile(root / "cleaner-offset-checkpoint").read() == {TP: 4}
    assert {base: segment_files(d, base) for base in (4, 6, 8)} == untouched


def test_without_high_watermark_nothing_is_cleaned(tmp_path: Path) -> None:
    """§14 step 2: no replication-offset-checkpoint entry: nothing is known to be
    committed, so nothing is cleaned."""
    root = _log_dir(tmp_path)
    d = root / "topic-0"
    _five_segments(d)
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    outcome = _run(root, _policy())
    assert outcome.results == []
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before


def test_min_compaction_lag(tmp_path: Path) -> None:
    """§6.3: the first non-active segment (from the first dirty one) whose largest
    timestamp is newer than now - min.compaction.lag.ms bounds the clean."""
    root = _log_dir(tmp_path)
    d = root / "topic-0"
    hour = 3_600_000
    w = LogWriter(d)
    for i, age in enumerate([10 * hour, 10 * hour, 60_000, 10 * hour]):
        if i:
            w.roll()
        w.data([b"a"], timestamps=[NOW - age])
    w.roll()
    w.data([b"a"])
    w.close()
    _set_high_watermark(root, TP, _leo(d))
    untouched = {base: segment_files(d, base) for base in (2, 3, 4)}

    _run(root, _policy(minCompactionLagMs=hour))

    assert OffsetCheckpointFile(root / "cleaner-offset-checkpoint").read() == {TP: 2}
    assert layout(d)[0] == [D(1, 1, (1, b"a", b"v1"))]
    assert {base: segment_files(d, base) for base in (2, 3, 4)} == untouched


@pytest.mark.parametrize("max_lag", [None, 3_600_000], ids=["default", "one-hour"])
def test_max_compaction_lag_forces_cleaning_below_the_ratio(tmp_path: Path, max_lag: int | None) -> None:
    """§6.4: with a small dirty part (ratio below min.cleanable.dirty.ratio) nothing is
    cleaned, unless the oldest dirty data is older than max.compaction.lag.ms."""
    root = _log_dir(tmp_path)
    d = root / "topic-0"
    hour = 3_600_000
    w = LogWriter(d)
    w.data([b"a"])  # 0
    w.roll()
    w.data([b"b"])  # 1
    w.roll()
    w.data([b"a"], timestamps=[NOW - 2 * hour])  # 2: dirty, two hours old
    w.roll()
    w.data([b"z"])
    w.close()
    _set_high_watermark(root, TP, _leo(d))
    OffsetCheckpointFile(root / "cleaner-offset-checkpoint").write({TP: 2})
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    policy = _policy() if max_lag is None else _policy(maxCompactionLagMs=max_lag)

    manager = LogCleanerManager([LogDirectory(root)], policy, MockTime(NOW))
    (report,) = manager.report(NOW)
    assert report.cleanable_ratio < 0.5
    outcome = _run(root, policy)

    if max_lag is None:
        assert (report.eligible, report.reason, report.compaction_delay_ms) == (False, "ratio", 0)
        assert outcome.results == []
        assert {p.name: p.read_bytes() for p in d.iterdir()} == before
    else:
        assert report.eligible and report.compaction_delay_ms == hour
        assert OffsetCheckpointFile(root / "cleaner-offset-checkpoint").read() == {TP: 3}
        assert layout(d)[0] == [D(1, 1, kv(1, b"b")), D(2, 2, (2, b"a", b"v2"))]


def test_log_to_clean_sizes(tmp_path: Path) -> None:
    """§6.5 (testLogToCleanWithUncleanableSection, KAFKA-9826): clean bytes are the
    segments below the first dirty offset, cleanable bytes those from its floor segment up
    to the first uncleanable one; an unaligned first dirty offset counts its segment in
    both; an empty range [x, x) is 0 bytes."""
    root = _log_dir(tmp_path)
    d = root / "topic-0"
    _duplicates_log(d)  # segments 0, 2, 4, active 6 (LEO 7)
    _set_high_watermark(root, TP, _leo(d))
    sizes = {s.base_offset: s.size for s in read_segments(d)}
    manager = LogCleanerManager([LogDirectory(root)], _policy(), MockTime(NOW))
    managed = manager.logs()[TP]

    ltc, _, _ = manager.log_to_clean(managed, 2, NOW)
    assert (ltc.first_dirty_offset, ltc.first_uncleanable_offset) == (2, 6)
    assert (ltc.clean_bytes, ltc.cleanable_bytes) == (sizes[0], sizes[2] + sizes[4])
    assert ltc.cleanable_ratio == pytest.approx((sizes[2] + sizes[4]) / (sizes[0] + sizes[2] + sizes[4]))

    ltc, _, _ = manager.log_to_clean(managed, 3, NOW)
    assert (ltc.clean_bytes, ltc.cleanable_bytes) == (sizes[0] + sizes[2], sizes[2] + sizes[4])

    for checkpoint in (6, 7):
        ltc, _, _ = manager.log_to_clean(managed, checkpoint, NOW)
        assert ltc.cleanable_bytes == 0 and ltc.first_uncleanable_offset == 6


def test_dirty_ratio_must_exceed_the_minimum(tmp_path: Path) -> None:
    """§6.1: eligible only when cleanableRatio > min.cleanable.dirty.ratio (strictly)."""
    root = _log_dir(tmp_path)
    d = root / "topic-0"
    w = LogWriter(d)
    w.data([b"a"])
    w.roll()
    w.data([b"a"])
    w.roll()
    w.data([b"z"])
    w.close()
    _set_high_watermark(root, TP, _leo(d))
    OffsetCheckpointFile(root / "cleaner-offset-checkpoint").write({TP: 1})
    for ratio, eligible in ((0.5, False), (0.49, True)):
        manager = LogCleanerManager([LogDirectory(root)], _policy(minCleanableDirtyRatio=ratio), MockTime(NOW))
        (report,) = manager.report(NOW)
        assert report.cleanable_ratio == 0.5
        assert report.eligible is eligible and report.reason == (None if eligible else "ratio")
        assert (manager.grab_filthiest_compacted_log(NOW) is not None) is eligible


@pytest.mark.parametrize("clean_shutdown_marker", [False, True])
def test_manager_keeps_the_last_batch_of_an_active_producer(tmp_path: Path, clean_shutdown_marker: bool) -> None:
    """§14 step 3 with §9.6: the producer state the manager rebuilds from the log (no
    snapshot) makes an unexpired producer's last batch stay as an empty header."""
    root = _log_dir(tmp_path)
    d = root / "topic-0"
    w = LogWriter(d)
    w.data([b"a"], pid=9, epoch=2, timestamps=[NOW - DAY + 1])  # 0: younger than producer.id.expiration.ms
    w.data([b"a"])  # 1
    w.roll()
    w.data([b"z"])
    w.close()
    _set_high_watermark(root, TP, _leo(d))
    if clean_shutdown_marker:
        # With the marker and a snapshot, the broker starts from the snapshot: write Kafka's.
        (root / CLEAN_SHUTDOWN_FILE).touch()
        Log.open(d, LogConfig()).load_producer_state(NOW).write_snapshot(d, _leo(d))
    _run(root, _policy())
    assert layout(d)[0] == [E(0, 0, pid=9, epoch=2, seq=0), D(1, 1, kv(1, b"a"))]


def test_an_expired_producer_is_forgotten_by_the_start_after_an_unclean_shutdown(tmp_path: Path) -> None:
    """A broker down without a clean shutdown recovers the active segment at its next start
    and loads the producer state back through the snapshot it takes (``LogLoader``): a
    producer expired by then is dropped, and its last batch goes with its records, as both
    Kafka lines do (randomized differential, seed 13). While a broker holds the log dir the
    replayed state is what it has: the producer stays active (next test)."""
    root = _log_dir(tmp_path)
    d = root / "topic-0"
    w = LogWriter(d)
    w.data([b"a"], pid=9, epoch=2, timestamps=[NOW - DAY])  # 0: exactly producer.id.expiration.ms old
    w.data([b"a"])  # 1
    w.roll()
    w.data([b"z"])
    w.close()
    _set_high_watermark(root, TP, _leo(d))
    _run(root, _policy())
    assert layout(d)[0] == [D(1, 1, kv(1, b"a"))]


def test_a_running_broker_keeps_an_expired_producer_until_its_expiration_check(tmp_path: Path) -> None:
    root = _log_dir(tmp_path)
    d = root / "topic-0"
    w = LogWriter(d)
    w.data([b"a"], pid=9, epoch=2, timestamps=[NOW - DAY])
    w.data([b"a"])
    w.close()
    with BrokerLock(root):
        manager = LogCleanerManager([LogDirectory(root, read_only=True)], _policy(), MockTime(NOW))
        active, _ = manager._producer_facts(manager.logs()[TP], NOW)
    assert list(active) == [9]
    manager = LogCleanerManager([LogDirectory(root, read_only=True)], _policy(), MockTime(NOW))
    active, _ = manager._producer_facts(manager.logs()[TP], NOW)
    assert active == {}


def test_round_ends_where_offsets_no_longer_fit_the_map(partition_dir: Path) -> None:
    """The engine's offset map stores offsets relative to the round's first dirty offset
    in 32 bits (issue 3): a key beyond that range ends the round as a full map does, and the
    next round finishes the work."""
    w = LogWriter(partition_dir)
    w.data([b"a"])  # 0
    w.roll(2**32)
    w.data([b"a"])  # 2^32
    w.roll()
    w.data([b"z"])
    w.close()
    end, _ = clean_round(partition_dir, first_dirty=0)
    assert end == 2**32
    assert records_of(all_batches(partition_dir))[0] == kv(0, b"a")
    end, _ = clean_round(partition_dir, first_dirty=end)
    assert end == 2**32 + 1
    assert layout(partition_dir) == {
        0: [],  # its own group (offsets too far apart to merge): emptied, as Kafka leaves it
        2**32: [D(2**32, 2**32, kv(2**32, b"a"))],
        2**32 + 1: [D(2**32 + 1, 2**32 + 1, kv(2**32 + 1, b"z"))],
    }


def test_other_control_records_are_never_removed(partition_dir: Path) -> None:
    """§9.7: control records other than ABORT/COMMIT (here LEADER_CHANGE) are never
    discardable: copied verbatim in every round, whatever the time."""
    from cleaner.records.builder import build_batch
    from cleaner.records.record import Record

    w = LogWriter(partition_dir)
    leader_change = build_batch(
        [Record(0, BASE_TS, struct.pack(">hh", 0, 2), b"\x00\x00\x00\x00\x00\x07")],
        is_control=True,
        partition_leader_epoch=3,
    )
    w.raw(leader_change, next_offset=1)
    w.data([struct.pack(">hh", 0, 2)], [b"data with the same key"])  # 1
    w.data([b"b"])  # 2
    w.roll()
    w.data([b"z"])
    w.close()
    for now in (NOW, 2**62):
        clean_round(partition_dir, first_dirty=0, now=now)
        assert raw_batches(partition_dir)[0] == leader_change
    assert [b.base_offset for b in all_batches(partition_dir)] == [0, 1, 2, 3]


def test_abort_marker_without_txn_index_entry(partition_dir: Path) -> None:
    """§9.7: the cleaner trusts the .txnindex; without the entry, the aborted data looks
    committed (kept, deduplicated as usual) and the ABORT marker is an empty transaction's
    marker: stamped, then removed."""
    from cleaner.records.builder import build_control_batch

    w = LogWriter(partition_dir)
    w.data([b"a"], pid=1, txn=True)  # 0
    w.raw(
        build_control_batch(
            ABORT, offset=1, producer_id=1, producer_epoch=0, coordinator_epoch=0, timestamp=BASE_TS + 1
        ),
        next_offset=2,
    )  # no txn-index entry
    w.data([b"b"])  # 2
    w.roll()
    w.data([b"z"])
    w.close()
    assert read_segments(partition_dir)[0].aborted == []
    clean_round(partition_dir, first_dirty=0, now=NOW)
    assert layout(partition_dir)[0] == [
        D(0, 0, kv(0, b"a"), pid=1, epoch=0, seq=0, txn=True),
        M(1, "ABORT", 1, horizon=NOW + DAY),
        D(2, 2, kv(2, b"b")),
    ]
    clean_round(partition_dir, first_dirty=0, now=NOW + DAY)
    assert layout(partition_dir)[0] == [D(0, 0, kv(0, b"a"), pid=1, epoch=0, seq=0, txn=True), D(2, 2, kv(2, b"b"))]


# ---- buffers, corruption, aborts, offset overflow (§7, §9.4, §9.9) ------------------------------


def _large_records_log(directory: Path, record_size: int) -> tuple[LogWriter, LogConfig]:
    config = LogConfig(max_message_bytes=2 * record_size)
    w = LogWriter(directory, config)
    for i in range(4):
        w.data([b"%d" % (i % 2)], [bytes([i]) * record_size])
    w.roll()
    w.data([b"z"])
    w.close()
    return w, LogConfig(max_message_bytes=record_size // 2)  # the topic's limit lowered afterwards


def test_batches_larger_than_max_message_bytes_are_cleaned(partition_dir: Path) -> None:
    """testMessageLargerThanMaxMessageSize (KAFKA-6834): the read buffer grows to the
    batch's own size even past the topic's max.message.bytes."""
    w, lowered = _large_records_log(partition_dir, 100_000)
    cleaner = make_cleaner(io_buffer_size=1024)
    cleaner.max_io_buffer_size = 1024
    end, _ = clean_round(partition_dir, first_dirty=0, cleaner=cleaner, config=lowered)
    assert end == 4
    assert [(o, k) for o, k, _ in records_of(all_batches(partition_dir))] == [(2, b"0"), (3, b"1"), (4, b"z")]
    assert_verbatim(partition_dir, w.written, 2, 3)


@pytest.mark.parametrize("damage", ["magic", "size"])
def test_corrupt_segment_fails_the_clean_without_changes(partition_dir: Path, damage: str) -> None:
    """testMessageLargerThanMaxMessageSizeWithCorruptHeader and
    testCorruptMessageSizeLargerThanBytesAvailable: a bad magic byte, or a batch running
    past the end of the segment, is a CorruptRecordException; nothing is changed."""
    from cleaner.errors import CorruptDataError

    _, lowered = _large_records_log(partition_dir, 100_000)
    log_file = partition_dir / f"{0:020d}.log"
    if damage == "magic":
        with open(log_file, "r+b") as f:
            f.seek(16)
            f.write(b"\xff")
    else:
        os.truncate(log_file, 1024)
    before = {p.name: p.read_bytes() for p in partition_dir.iterdir()}
    cleaner = make_cleaner(io_buffer_size=1024)
    cleaner.max_io_buffer_size = 1024
    with pytest.raises(CorruptDataError):
        clean_round(partition_dir, first_dirty=0, first_uncleanable=4, cleaner=cleaner, config=lowered)
    assert {p.name: p.read_bytes() for p in partition_dir.iterdir()} == before


def test_aborted_clean_changes_nothing(partition_dir: Path) -> None:
    """testCleanSegmentsWithAbort (§9.4): an abort seen by checkDone raises
    LogCleaningAbortedException and leaves no .cleaned file and no change behind."""
    from cleaner.errors import LogCleaningAbortedError

    _duplicates_log(partition_dir)
    before = {p.name: p.read_bytes() for p in partition_dir.iterdir()}
    cleaner = make_cleaner()
    rewriting = []

    def check_done(tp: TopicPartition) -> None:
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_name == "clean_segments":  # past map building, inside the rewrite
                rewriting.append(tp)
                raise LogCleaningAbortedError("aborted")
            frame = frame.f_back

    cleaner.check_done = check_done
    with pytest.raises(LogCleaningAbortedError):
        clean_round(partition_dir, first_dirty=0, cleaner=cleaner)
    assert rewriting == [TP]
    assert {p.name: p.read_bytes() for p in partition_dir.iterdir()} == before


def test_offset_overflow_in_a_source_segment(partition_dir: Path) -> None:
    """KAFKA_NOTES §9.9 / KAFKA-6264: a source segment holding an offset beyond base +
    Int.MaxValue is split and the round aborted, so the partition is cleaned later."""
    from cleaner.errors import LogCleaningAbortedError
    from cleaner.records.builder import build_batch
    from cleaner.records.record import Record

    w = LogWriter(partition_dir)
    w.data([b"a"])  # 0
    w.data([b"b"])  # 1
    w.roll(2**31 + 100)
    w.data([b"z"])
    w.close()
    with open(partition_dir / f"{0:020d}.log", "ab") as f:  # a segment written before KAFKA-5413 was fixed
        f.write(build_batch([Record(2**31 + 10, BASE_TS, b"a", b"late")]))

    with contextlib.suppress(LogCleaningAbortedError):  # Kafka <= 4.x: segment split, round retried
        clean_round(partition_dir, first_dirty=0)
    for s in read_segments(partition_dir):
        assert all(b.last_offset - s.base_offset <= 2**31 - 1 for b in s.batches), "segment still overflows"
    clean_round(partition_dir, first_dirty=0)
    assert records_of(all_batches(partition_dir)) == [kv(1, b"b"), (2**31 + 10, b"a", b"late"), kv(2**31 + 100, b"z")]


def test_max_compaction_lag_ignores_batches_without_timestamp(tmp_path: Path) -> None:
    """§6.4: only first-batch timestamps > 0 count; a dirty segment whose first batch has
    no timestamp (-1) never forces a clean."""
    root = _log_dir(tmp_path)
    d = root / "topic-0"
    w = LogWriter(d)
    w.data([b"a"])
    w.roll()
    w.data([b"b"])
    w.roll()
    w.data([b"a"], timestamps=[-1])  # dirty
    w.roll()
    w.data([b"z"])
    w.close()
    _set_high_watermark(root, TP, _leo(d))
    OffsetCheckpointFile(root / "cleaner-offset-checkpoint").write({TP: 2})
    manager = LogCleanerManager([LogDirectory(root)], _policy(maxCompactionLagMs=1), MockTime(NOW))
    (report,) = manager.report(NOW)
    assert (report.eligible, report.reason, report.compaction_delay_ms) == (False, "ratio", 0)


def test_the_filthiest_log_is_cleaned_first(tmp_path: Path) -> None:
    """§6.1: among eligible logs the one with the highest cleanable ratio is chosen."""
    root = _log_dir(tmp_path)
    for partition, checkpoint in ((0, 4), (1, 2), (2, 0)):
        d = root / f"topic-{partition}"
        _duplicates_log(d)
        _set_high_watermark(root, TopicPartition("topic", partition), _leo(d))
        OffsetCheckpointFile(root / "cleaner-offset-checkpoint").update(
            set={TopicPartition("topic", partition): checkpoint}
        )
    manager = LogCleanerManager([LogDirectory(root)], _policy(minCleanableDirtyRatio=0.01), MockTime(NOW))
    order = []
    while (ltc := manager.grab_filthiest_compacted_log(NOW)) is not None:
        order.append((ltc.topic_partition.partition, round(ltc.cleanable_ratio, 2)))
    assert order == [(2, 1.0), (1, 0.67), (0, 0.33)]


def test_partial_clean_through_the_manager_checkpoints_the_map_end(tmp_path: Path) -> None:
    """§9.2 with §6.6: when the dedupe buffer fills, the round's end offset (the map's
    latest offset + 1) is what doneCleaning writes to cleaner-offset-checkpoint; the
    partition stays dirty past it."""
    from cleaner.engine.offset_map import OffsetMap

    root = _log_dir(tmp_path)
    d = root / "topic-0"
    w = LogWriter(d)
    for i in range(60):
        w.data([b"k%d" % i])
    w.roll()
    w.data([b"z"])
    w.close()
    _set_high_watermark(root, TP, _leo(d))
    fits = OffsetMap(1024, 0.9).max_keys
    assert fits < 60
    policy = parse_policy(
        {
            "mode": "compact",
            "topics": [{"match": ".*", "cleanupPolicy": "compact"}],
            "cleaner": {"dedupeBufferSize": 1024, "backoffMs": 0},
        }
    )
    outcome = _run(root, policy)
    assert [r.end_offset for r in outcome.results] == [fits]
    assert OffsetCheckpointFile(root / "cleaner-offset-checkpoint").read() == {TP: fits}
    assert raw_batches(d) == w.written.batches


def test_min_compaction_lag_falls_back_to_mtime(tmp_path: Path) -> None:
    """§6.3/§2.3: a segment without record timestamps has no time-index entry; its
    largestTimestamp is the file's mtime, so a recently written one bounds the clean."""
    root = _log_dir(tmp_path)
    d = root / "topic-0"
    hour = 3_600_000
    w = LogWriter(d)
    w.data([b"a"], timestamps=[NOW - 10 * hour])  # 0
    w.roll()
    w.data([b"a"], timestamps=[-1])  # 1: no timestamp
    w.roll()
    w.data([b"a"])
    w.close()
    for base, age in ((0, 10 * hour), (1, 60_000)):
        mtime = (NOW - age) / 1000
        os.utime(d / f"{base:020d}.log", (mtime, mtime))
    _set_high_watermark(root, TP, _leo(d))
    manager = LogCleanerManager([LogDirectory(root)], _policy(minCompactionLagMs=hour), MockTime(NOW))
    offsets = manager.cleanable_offsets(manager.logs()[TP], None, NOW)
    assert (offsets.first_uncleanable_dirty_offset, offsets.binding) == (1, "lag")


def test_max_compaction_lag_uses_the_first_batch_of_each_dirty_segment(tmp_path: Path) -> None:
    """§6.4: firstBatchTimestamp is the maxTimestamp of a segment's *first* batch; an old
    batch later in the segment does not make the partition overdue."""
    root = _log_dir(tmp_path)
    d = root / "topic-0"
    hour = 3_600_000
    w = LogWriter(d)
    w.data([b"a"], timestamps=[NOW - 60_000])
    w.data([b"b"], timestamps=[NOW - 5 * hour])
    w.roll()
    w.data([b"z"])
    w.close()
    _set_high_watermark(root, TP, _leo(d))
    manager = LogCleanerManager([LogDirectory(root)], _policy(maxCompactionLagMs=hour), MockTime(NOW))
    assert manager.max_compaction_delay(manager.logs()[TP], 0, NOW) == 0
    assert manager.max_compaction_delay(manager.logs()[TP], 0, NOW + 2 * hour) == hour + 60_000


def test_map_building_starts_at_the_offset_index_position(partition_dir: Path) -> None:
    """§9.2 taken literally (Kafka's buildOffsetMapForSegment): the first dirty segment is
    read from offsetIndex.lookup(start).position. An ABORT marker before that position is
    not seen, so its (collected) aborted transaction stays open for the producer, whose
    later committed data is then left out of the map: its key is not deduplicated in this
    round. Less compaction than possible, never data loss - and what Kafka does."""
    config = LogConfig(index_interval_bytes=1)  # an index entry for every batch but the first
    w = LogWriter(partition_dir, config)
    w.data([b"k"])  # 0
    w.data([b"x"], pid=1, txn=True)  # 1, aborted
    w.marker(ABORT, 1)  # 2
    w.data([b"k"], pid=1, txn=True)  # 3, committed
    w.marker(COMMIT, 1)  # 4
    w.roll()
    w.data([b"z"])
    w.close()
    end, _ = clean_round(partition_dir, first_dirty=3, config=config)  # lookup(3) -> the batch at 3
    assert end == 5
    assert layout(partition_dir)[0] == [
        D(0, 0, kv(0, b"k")),  # not removed: k@3 never entered the map
        M(2, "ABORT", 1),
        D(3, 3, kv(3, b"k"), pid=1, epoch=0, seq=1, txn=True),
        M(4, "COMMIT", 1),
    ]
