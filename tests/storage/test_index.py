"""Offset, time and transaction indexes: Kafka's append rules, lookups against brute-force
models, trimmed round trips, corrupt files, and every real Kafka index file."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cleaner.errors import CorruptIndexError
from cleaner.storage.index import (
    NO_TIMESTAMP,
    AbortedTxn,
    IndexFullError,
    IndexOffsetOverflowError,
    InvalidOffsetError,
    InvalidTimestampError,
    OffsetIndex,
    TimeIndex,
    TransactionIndex,
)

INT32_MAX = 2**31 - 1
bases = st.integers(min_value=0, max_value=2**62)


@st.composite
def offset_index_entries(draw, max_size=60):
    """(base, offsets, positions) Kafka could have written: offsets strictly increasing within
    the relative range, positions non-decreasing."""
    base = draw(bases)
    rel = sorted(set(draw(st.lists(st.integers(0, INT32_MAX), max_size=max_size))))
    steps = draw(st.lists(st.integers(0, 5000), min_size=len(rel), max_size=len(rel)))
    positions = list(np.cumsum(steps)) if steps else []
    return base, [base + r for r in rel], [int(p) for p in positions]


@st.composite
def time_index_entries(draw, max_size=60):
    base = draw(bases)
    ts = sorted(set(draw(st.lists(st.integers(0, 2**62), max_size=max_size))))
    rel_steps = draw(st.lists(st.integers(0, 1000), min_size=len(ts), max_size=len(ts)))
    offsets = [base + int(r) for r in np.cumsum(rel_steps)] if rel_steps else []
    return base, ts, offsets


# ---------------------------------------------------------------------------------------
# OffsetIndex


@given(offset_index_entries())
def test_offset_index_round_trip_is_byte_exact(case):
    base, offsets, positions = case
    idx = OffsetIndex(base)
    for o, p in zip(offsets, positions, strict=True):
        idx.append(o, p)
    data = idx.to_bytes()
    assert len(data) == 8 * len(offsets) == idx.size_in_bytes
    back = OffsetIndex.from_bytes(data, base)
    assert back.offsets.tolist() == offsets
    assert back.positions.tolist() == positions
    assert back.to_bytes() == data
    # The file layout: relativeOffset int32, position int32, big-endian.
    for i, (o, p) in enumerate(zip(offsets, positions, strict=True)):
        assert struct.unpack_from(">ii", data, 8 * i) == (o - base, p)
    bulk = OffsetIndex(base)
    bulk.append_many(offsets, positions)
    assert bulk.to_bytes() == data


def test_offset_index_write_to_is_trimmed(tmp_path):
    idx = OffsetIndex(100, max_index_size=10 * 1024 * 1024)
    idx.append_many([105, 110, 120], [4100, 8300, 12500])
    path = tmp_path / "00000000000000000100.index"
    idx.write_to(path)
    assert os.path.getsize(path) == 24  # never the preallocated 10 MiB
    back = OffsetIndex.read(path, 100)
    assert back.offsets.tolist() == [105, 110, 120]
    assert back.max_entries == 3 and back.is_full  # a loaded index is sized to its file, like Kafka's mmap
    back.resize(1024)
    assert back.max_entries == 128 and not back.is_full
    with pytest.raises(ValueError):
        back.resize(16)


def test_offset_index_append_rules():
    idx = OffsetIndex(1000, max_index_size=8 * 3 + 7)
    assert idx.max_entries == 3
    assert idx.last_entry == (1000, 0) and idx.last_offset == 1000
    idx.append(1000, 0)  # an empty index accepts its base offset
    with pytest.raises(InvalidOffsetError):
        idx.append(1000, 10)
    with pytest.raises(InvalidOffsetError):
        idx.append(999, 10)
    with pytest.raises(IndexOffsetOverflowError):
        idx.append(1000 + INT32_MAX + 1, 10)
    idx.append(1000 + INT32_MAX, 10)
    assert idx.entries == 2
    with pytest.raises(IndexOffsetOverflowError):
        OffsetIndex(1000).append(999, 0)  # below the base: negative relative offset
    idx2 = OffsetIndex(0, max_index_size=24)
    idx2.append_many([1, 2, 3], [10, 20, 30])
    assert idx2.is_full
    with pytest.raises(IndexFullError):
        idx2.append(4, 40)
    with pytest.raises(ValueError):
        OffsetIndex(0, max_index_size=7)


@given(
    st.integers(0, 100),
    st.lists(st.integers(0, 60), max_size=12),
    st.integers(1, 10),
    st.booleans(),
)
def test_offset_index_append_many_matches_sequential_appends(base, rel, max_entries, prefill):
    offsets = [base + r for r in rel]
    positions = list(range(0, 10 * len(offsets), 10))

    def fresh():
        idx = OffsetIndex(base, max_index_size=8 * max_entries)
        if prefill:
            idx.append(base + 3, 0)
        return idx

    seq = fresh()
    seq_error = None
    for o, p in zip(offsets, positions, strict=True):
        try:
            seq.append(o, p)
        except (InvalidOffsetError, IndexFullError) as e:
            seq_error = type(e)
            break
    bulk = fresh()
    before = bulk.to_bytes()
    if seq_error is None:
        bulk.append_many(offsets, positions)
        assert bulk.to_bytes() == seq.to_bytes()
    else:
        with pytest.raises(seq_error):
            bulk.append_many(offsets, positions)
        assert bulk.to_bytes() == before  # all or nothing


@given(offset_index_entries(max_size=40), st.lists(st.integers(-5, 2**62 + 2**31), max_size=30))
def test_offset_index_lookup_matches_brute_force(case, targets):
    base, offsets, positions = case
    idx = OffsetIndex(base)
    idx.append_many(offsets, positions)
    extra = [o + d for o in offsets for d in (-1, 0, 1)]
    for t in targets + extra + [base - 1, base]:
        below = [(o, p) for o, p in zip(offsets, positions, strict=True) if o <= t]
        expected = below[-1] if below else (base, 0)
        assert idx.lookup(t) == expected
    all_targets = targets + extra
    offs, pos = idx.lookup_many(all_targets)
    assert list(zip(offs.tolist(), pos.tolist(), strict=True)) == [idx.lookup(t) for t in all_targets]


@given(offset_index_entries(max_size=30), st.integers(-5, 2**62 + 2**31))
def test_offset_index_truncate_to(case, cut):
    base, offsets, positions = case
    idx = OffsetIndex(base)
    idx.append_many(offsets, positions)
    for target in [cut, *offsets[:3]]:
        idx2 = OffsetIndex.from_bytes(idx.to_bytes(), base, max_index_size=1 << 20)
        idx2.truncate_to(target)
        assert idx2.offsets.tolist() == [o for o in offsets if o < target]
        if idx2.entries and idx2.last_offset < base + INT32_MAX:
            idx2.append(idx2.last_offset + 1, idx2.positions[-1])  # appendable again after truncation
    idx.truncate()
    assert idx.entries == 0 and idx.to_bytes() == b""


# ---------------------------------------------------------------------------------------
# TimeIndex


@given(time_index_entries())
def test_time_index_round_trip_is_byte_exact(case):
    base, timestamps, offsets = case
    idx = TimeIndex(base)
    for t, o in zip(timestamps, offsets, strict=True):
        assert idx.maybe_append(t, o)
    data = idx.to_bytes()
    assert len(data) == 12 * len(timestamps) == idx.size_in_bytes
    back = TimeIndex.from_bytes(data, base)
    assert back.timestamps.tolist() == timestamps and back.offsets.tolist() == offsets
    assert back.to_bytes() == data
    for i, (t, o) in enumerate(zip(timestamps, offsets, strict=True)):
        assert struct.unpack_from(">qi", data, 12 * i) == (t, o - base)


def test_time_index_maybe_append_rules():
    idx = TimeIndex(50)
    assert idx.last_entry == (NO_TIMESTAMP, 50)
    assert not idx.maybe_append(-1, 55)  # NO_TIMESTAMP is never indexed (v0 data)
    assert idx.entries == 0
    assert idx.maybe_append(100, 55)
    assert not idx.maybe_append(100, 56)  # same timestamp: ignored (close / roll re-append)
    assert idx.maybe_append(200, 55)  # same offset, larger timestamp: allowed
    with pytest.raises(InvalidOffsetError):
        idx.maybe_append(300, 54)
    with pytest.raises(InvalidTimestampError):
        idx.maybe_append(150, 60)
    with pytest.raises(IndexOffsetOverflowError):
        idx.maybe_append(300, 50 + INT32_MAX + 1)
    assert idx.to_bytes() == struct.pack(">qiqi", 100, 5, 200, 5)


def test_time_index_reserves_the_last_slot_for_the_final_entry():
    idx = TimeIndex(0, max_index_size=12 * 3 + 11)
    assert idx.max_entries == 3
    idx.maybe_append(10, 1)
    assert not idx.is_full
    idx.maybe_append(20, 2)
    assert idx.is_full  # entries >= max_entries - 1
    with pytest.raises(IndexFullError):
        idx.maybe_append(30, 3)
    with pytest.raises(IndexFullError):
        idx.maybe_append(5, 3)  # Kafka checks fullness before anything else
    assert idx.maybe_append(30, 3, skip_full_check=True)  # the entry written on roll / close
    with pytest.raises(IndexFullError):
        idx.maybe_append(40, 4, skip_full_check=True)  # no room at all any more
    assert idx.entries == 3


@given(
    st.integers(0, 50),
    st.lists(st.tuples(st.integers(-3, 40), st.integers(0, 30)), max_size=14),
    st.integers(2, 8),
    st.booleans(),
)
def test_time_index_append_many_matches_sequential(base, pairs, max_entries, prefill):
    ts = [t for t, _ in pairs]
    offs = [base + r for _, r in pairs]

    def fresh():
        idx = TimeIndex(base, max_index_size=12 * max_entries)
        if prefill:
            idx.maybe_append(5, base + 2)
        return idx

    seq = fresh()
    seq_error = None
    added = 0
    for t, o in zip(ts, offs, strict=True):
        try:
            added += seq.maybe_append(t, o)
        except (InvalidOffsetError, InvalidTimestampError, IndexFullError) as e:
            seq_error = type(e)
            break
    bulk = fresh()
    before = bulk.to_bytes()
    if seq_error is None:
        assert bulk.append_many(ts, offs) == added
        assert bulk.to_bytes() == seq.to_bytes()
    else:
        with pytest.raises(seq_error):
            bulk.append_many(ts, offs)
        assert bulk.to_bytes() == before


@given(time_index_entries(max_size=40), st.lists(st.integers(-5, 2**62 + 5), max_size=30))
def test_time_index_lookup_matches_brute_force(case, targets):
    base, timestamps, offsets = case
    idx = TimeIndex(base)
    idx.append_many(timestamps, offsets)
    for t in targets + [x + d for x in timestamps for d in (-1, 0, 1)]:
        below = [(ts, o) for ts, o in zip(timestamps, offsets, strict=True) if ts <= t]
        assert idx.lookup(t) == (below[-1] if below else (NO_TIMESTAMP, base))


@given(time_index_entries(max_size=30), st.integers(-5, 2**62))
def test_time_index_truncate_to_removes_offsets_at_or_above(case, cut):
    base, timestamps, offsets = case
    for target in [cut, *offsets[:4]]:
        idx = TimeIndex(base)
        idx.append_many(timestamps, offsets)
        idx.truncate_to(target)
        assert idx.offsets.tolist() == [o for o in offsets if o < target]


# ---------------------------------------------------------------------------------------
# Corrupt index files: typed error naming the file, file unchanged.


def _corrupt_case(tmp_path, cls, name, data, base=0):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(CorruptIndexError) as info:
        cls.read(path, base)
    assert path.read_bytes() == data
    assert info.value.path == str(path)
    return info.value


@pytest.mark.parametrize(
    ("cls", "data", "reason"),
    [
        (OffsetIndex, struct.pack(">ii", 1, 100) + b"\x00\x00\x00", "multiple of 8"),  # truncated
        (OffsetIndex, bytes(80), "not greater"),  # zero-filled (preallocated, untrimmed)
        (OffsetIndex, struct.pack(">iiii", 5, 100, 3, 200), "not greater"),  # offsets go back
        (OffsetIndex, struct.pack(">iiii", 5, 100, 6, 50), "below the previous"),  # positions go back
        (OffsetIndex, struct.pack(">ii", -5, 100), "less than the base offset"),  # Kafka's sanityCheck
        (OffsetIndex, b"\xde\xad\xbe\xef" * 5, "multiple of 8"),
        (TimeIndex, struct.pack(">qi", 10, 1) + b"\x01", "multiple of 12"),
        (TimeIndex, bytes(120), "not greater"),
        (TimeIndex, struct.pack(">qiqi", 10, 1, 20, 0), "below the previous"),
        (TimeIndex, struct.pack(">qiqi", 30, 1, 20, 2), "less than the first timestamp"),
        (TimeIndex, struct.pack(">qi", 30, -1), "less than the first offset"),
    ],
)
def test_corrupt_index_files_raise_typed_error(tmp_path, cls, data, reason):
    error = _corrupt_case(
        tmp_path, cls, "00000000000000000000" + (".index" if cls is OffsetIndex else ".timeindex"), data
    )
    assert reason in error.reason


@given(st.binary(min_size=16, max_size=200).filter(lambda b: len(b) % 8 == 0))
def test_garbage_offset_index_is_rejected_or_is_a_valid_index(data):
    try:
        idx = OffsetIndex.from_bytes(data, 0, path="garbage.index")
    except CorruptIndexError as e:
        assert e.path == "garbage.index"
        return
    assert idx.to_bytes() == data  # only a well-formed index gets through
    assert np.all(np.diff(idx.offsets) > 0) and np.all(np.diff(idx.positions) >= 0)


def test_lenient_read_floors_like_a_broker(tmp_path):
    data = struct.pack(">ii", 1, 100) + bytes(8) + b"\x00\x01"
    idx = OffsetIndex.from_bytes(data, 0, strict=False)
    assert idx.entries == 2  # entries = length / 8, zero padding read as an entry
    assert idx.length == 18
    with pytest.raises(CorruptIndexError, match="multiple of 8"):
        idx.sanity_check()


# ---------------------------------------------------------------------------------------
# verify_against (dump --verify)

# A segment at base 100: five batches.
POSITIONS = [0, 4200, 8400, 12600, 16800]
LASTS = [104, 109, 110, 119, 125]
MAX_TS = [1000, 1500, 1400, 2000, 2000]


def test_offset_index_verify_accepts_kafka_shapes():
    per_batch = OffsetIndex(100)
    per_batch.append_many([109, 119], [4200, 12600])  # 4.1+: (batch.lastOffset, batch start)
    assert per_batch.verify_against(POSITIONS, LASTS, exact=True) == []
    chunk = OffsetIndex(100)
    chunk.append_many([110, 125], [4200, 12600])  # <= 4.0: (largest offset of chunk, chunk start)
    assert chunk.verify_against(POSITIONS, LASTS) == []
    problems = chunk.verify_against(POSITIONS, LASTS, exact=True)
    assert len(problems) == 2 and all("is not the lastOffset" in p for p in problems)
    zero = OffsetIndex(100)
    zero.append(104, 0)  # an entry at position 0 is harmless
    assert zero.verify_against(POSITIONS, LASTS) == []
    assert OffsetIndex(100).verify_against([], []) == []


@pytest.mark.parametrize(
    ("offsets", "positions", "expected"),
    [
        ([109], [4000], "not the start of a batch"),
        ([125], [21000], "past the last batch"),
        ([130], [16800], "beyond the log"),
        ([105], [8400], "a lookup would miss it"),  # batch at 4200 (lastOffset 109 >= 105) skipped
        ([99], [0], "below the base offset"),
    ],
)
def test_offset_index_verify_reports_errors(offsets, positions, expected):
    idx = OffsetIndex.from_bytes(
        b"".join(struct.pack(">ii", o - 100, p) for o, p in zip(offsets, positions, strict=True)), 100, strict=False
    )
    problems = idx.verify_against(POSITIONS, LASTS)
    assert any(expected in p for p in problems), problems


def test_time_index_verify():
    good = TimeIndex(100)
    good.append_many([1500, 2000], [109, 119])
    assert good.verify_against(LASTS, MAX_TS, closed=True) == []
    record_offset = TimeIndex(100)
    record_offset.append_many([1500, 2000], [107, 117])  # offsets inside the batch holding the max: fine
    assert record_offset.verify_against(LASTS, MAX_TS) == []
    wrong_ts = TimeIndex(100)
    wrong_ts.append_many([1400, 2000], [110, 119])
    assert any("differs from the largest batch timestamp 1500" in p for p in wrong_ts.verify_against(LASTS, MAX_TS))
    no_final = TimeIndex(100)
    no_final.maybe_append(1500, 109)
    assert no_final.verify_against(LASTS, MAX_TS, closed=False) == []
    assert any("not the segment's max timestamp" in p for p in no_final.verify_against(LASTS, MAX_TS, closed=True))
    empty = TimeIndex(100)
    assert any("fall back to the file's mtime" in p for p in empty.verify_against(LASTS, MAX_TS))
    assert empty.verify_against(LASTS, [-1] * 5) == []  # v0 data: no timestamps, no entries
    beyond = TimeIndex(100)
    beyond.maybe_append(2000, 130)
    assert any("beyond the log" in p for p in beyond.verify_against(LASTS, MAX_TS))


# ---------------------------------------------------------------------------------------
# TransactionIndex


@st.composite
def aborted_txns(draw, base=0):
    lasts = sorted(set(draw(st.lists(st.integers(base, base + 10_000), max_size=25))))
    txns = []
    for last in lasts:
        first = draw(st.integers(base - 50, last))
        lso = draw(st.integers(first, last + 200))
        txns.append(AbortedTxn(draw(st.integers(0, 2**63 - 1)), first, last, lso))
    return txns


@given(aborted_txns(base=500))
def test_txn_index_round_trip_is_byte_exact(txns):
    idx = TransactionIndex(500)
    for t in txns:
        idx.append(t)
    data = idx.to_bytes()
    assert len(data) == 34 * len(txns)
    assert data == b"".join(t.to_bytes() for t in txns)
    assert all(data[34 * i : 34 * i + 2] == b"\x00\x00" for i in range(len(txns)))
    back = TransactionIndex.from_bytes(data, 500)
    assert back.all_aborted_txns() == txns
    assert back.to_bytes() == data
    # A trailing partial entry is ignored, as Kafka's iterator does.
    assert TransactionIndex.from_bytes(data + b"\x00" * 20, 500).all_aborted_txns() == txns


def test_txn_index_append_must_increase_last_offset():
    idx = TransactionIndex(0)
    idx.append(AbortedTxn(1, 0, 10, 11))
    with pytest.raises(ValueError, match="must increase"):
        idx.append(AbortedTxn(2, 5, 10, 11))
    with pytest.raises(ValueError):
        idx.append(AbortedTxn(2, 5, 9, 11))
    idx.append(AbortedTxn(2, 5, 11, 12))
    assert idx.last_offset == 11


@given(aborted_txns(), st.integers(-10, 10_100), st.integers(-10, 10_300))
def test_collect_aborted_txns_matches_kafka_loop(txns, fetch, upper):
    idx = TransactionIndex(0)
    for t in txns:
        idx.append(t)
    expected, complete = [], False
    for t in txns:  # TransactionIndex.collectAbortedTxns, literally
        if t.last_offset >= fetch and t.first_offset < upper:
            expected.append(t)
        if t.last_stable_offset >= upper:
            complete = True
            break
    assert idx.collect_aborted_txns(fetch, upper) == (expected, complete)


@given(aborted_txns(), st.integers(-10, 10_100))
def test_txn_index_truncate_to(txns, cut):
    idx = TransactionIndex(0)
    for t in txns:
        idx.append(t)
    idx.truncate_to(cut)
    assert idx.all_aborted_txns() == [t for t in txns if t.last_offset < cut]


def test_txn_index_version_quirk_checks_only_the_first_byte(tmp_path):
    entry = AbortedTxn(7, 10, 20, 21).to_bytes()
    ok_second_byte = b"\x00\x05" + entry[2:]
    ok_negative = b"\xff\x00" + entry[2:]  # read as signed byte -1: not > 0, accepted by Kafka
    assert TransactionIndex.from_bytes(ok_second_byte, 0).all_aborted_txns()[0].producer_id == 7
    assert TransactionIndex.from_bytes(ok_negative, 0).entries == 1
    bad = entry + b"\x01\x00" + entry[2:]
    error = _corrupt_case(tmp_path, TransactionIndex, "00000000000000000000.txnindex", bad)
    assert error.position == 34 and "version 1" in error.reason


def test_txn_index_sanity_check_and_missing_file(tmp_path):
    data = AbortedTxn(1, 90, 99, 100).to_bytes()
    error = _corrupt_case(tmp_path, TransactionIndex, "00000000000000000100.txnindex", data, base=100)
    assert error.offset == 99
    assert TransactionIndex.from_bytes(data, 100, strict=False).entries == 1
    missing = TransactionIndex.read(tmp_path / "nope.txnindex", 0)
    assert missing.entries == 0 and not (tmp_path / "nope.txnindex").exists()
    with pytest.raises(FileNotFoundError):
        TransactionIndex.read(tmp_path / "nope.txnindex", 0, missing_ok=False)


def test_txn_index_write_to(tmp_path):
    idx = TransactionIndex(0, path=tmp_path / "00000000000000000000.txnindex.cleaned")
    idx.append(AbortedTxn(3, 1, 5, 6))
    idx.write_to()
    assert (tmp_path / "00000000000000000000.txnindex.cleaned").read_bytes() == AbortedTxn(3, 1, 5, 6).to_bytes()


# ---------------------------------------------------------------------------------------
# Real Kafka files (read-only)


def _walk_log(path):
    """(positions, last offsets, max timestamps) of the entries of a .log, by header fields."""
    data = path.read_bytes()
    positions, lasts, max_ts = [], [], []
    p = 0
    while p + 17 <= len(data):
        base, length = struct.unpack_from(">qi", data, p)
        magic = data[p + 16]
        if magic == 2:
            last = base + struct.unpack_from(">i", data, p + 23)[0]
            ts = struct.unpack_from(">q", data, p + 35)[0]
        elif magic == 1:
            last, ts = base, struct.unpack_from(">q", data, p + 18)[0]
        else:
            last, ts = base, -1
        positions.append(p)
        lasts.append(last)
        max_ts.append(ts)
        p += 12 + length
    assert p == len(data), f"{path}: trailing bytes"
    return positions, lasts, max_ts


@pytest.mark.fixtures
def test_every_real_index_file_parses_and_verifies(real_kafka_root):
    seen = {".index": 0, ".timeindex": 0, ".txnindex": 0}
    for path in sorted(real_kafka_root.rglob("*")):
        if not path.is_file() or path.suffix not in seen:
            continue
        seen[path.suffix] += 1
        before = path.read_bytes()
        base = int(path.name.split(".")[0])
        log = path.with_suffix(".log")
        batches = _walk_log(log) if log.exists() else ([], [], [])
        if path.suffix == ".index":
            idx = OffsetIndex.read(path, base)
            assert idx.to_bytes() == before
            assert idx.verify_against(batches[0], batches[1], exact=True) == [], path
        elif path.suffix == ".timeindex":
            tidx = TimeIndex.read(path, base)
            assert tidx.to_bytes() == before
            assert tidx.verify_against(batches[1], batches[2], closed=True) == [], path
        else:
            txn = TransactionIndex.read(path, base)
            assert txn.to_bytes() == before[: txn.size_in_bytes]
        assert path.read_bytes() == before
    assert seen[".index"] > 20 and seen[".timeindex"] > 20
