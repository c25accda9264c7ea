"""Producer-state snapshots (format, corruption) and the replay of §3.3 (ProducerAppendInfo rules)."""

from __future__ import annotations

import os
import struct

import crc32c
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from cleaner.clock import MockTime
from cleaner.errors import CorruptSnapshotError
from cleaner.records.batch import BatchHeader
from cleaner.records.control import ControlRecordType
from cleaner.storage.producer_state import (
    DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    ActiveProducer,
    InvalidTxnStateError,
    ProducerSnapshotEntry,
    ProducerStateManager,
    decode_snapshot,
    encode_snapshot,
    list_snapshots,
    read_snapshot,
    snapshot_file_name,
    write_snapshot,
)

ABORT, COMMIT = ControlRecordType.ABORT, ControlRecordType.COMMIT
EMPTY_SNAPSHOT = struct.pack(">hIi", 1, crc32c.crc32c(b"\x00\x00\x00\x00"), 0)


def header(base, delta=0, *, pid=1000, epoch=0, seq=0, ts=1_000, txn=False, control=False, count=None, magic=2):
    return BatchHeader(
        base_offset=base,
        length=100,
        partition_leader_epoch=0,
        magic=magic,
        crc=0,
        attributes=(0x10 if txn else 0) | (0x20 if control else 0),
        last_offset_delta=delta,
        base_timestamp=ts,
        max_timestamp=ts,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        records_count=delta + 1 if count is None else count,
    )


def marker(psm, base, kind, *, pid, epoch=0, coordinator_epoch=5, ts=2_000):
    return psm.update(
        header(base, pid=pid, epoch=epoch, seq=-1, txn=True, control=True, ts=ts),
        kind,
        coordinator_epoch,
        ts,
    )


snapshot_entries = st.builds(
    ProducerSnapshotEntry,
    st.integers(0, 2**63 - 1),
    st.integers(-(2**15), 2**15 - 1),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-1, 2**63 - 1),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-1, 2**63 - 1),
)


# ---------------------------------------------------------------------------------------
# The .snapshot file


@given(st.lists(snapshot_entries, max_size=20))
def test_snapshot_round_trip_is_byte_exact(entries):
    data = encode_snapshot(entries)
    assert len(data) == 10 + 46 * len(entries)
    version, crc, count = struct.unpack_from(">hIi", data)
    assert (version, count) == (1, len(entries))
    assert crc == crc32c.crc32c(data[6:])
    assert decode_snapshot(data) == entries
    assert encode_snapshot(decode_snapshot(data)) == data


def test_snapshot_file_write_read(tmp_path):
    entries = [ProducerSnapshotEntry(7, 2, 41, 1234, 3, 1_700_000_000_000, 9, -1)]
    path = tmp_path / snapshot_file_name(1235)
    assert path.name == "00000000000000001235.snapshot"
    write_snapshot(path, entries)
    assert read_snapshot(path) == entries
    assert encode_snapshot([]) == EMPTY_SNAPSHOT


def _reseal(data: bytes) -> bytes:
    """Recompute the CRC so that only the intended defect remains."""
    body = bytearray(data)
    struct.pack_into(">I", body, 2, crc32c.crc32c(bytes(body[6:])))
    return bytes(body)


GOOD = encode_snapshot([ProducerSnapshotEntry(7, 2, 41, 1234, 3, 1_700_000_000_000, 9, -1)] * 2)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (_reseal(b"\x00\x02" + GOOD[2:]), "unknown file version 2"),
        (_reseal(b"\x00\x00" + GOOD[2:]), "unknown file version 0"),
        (GOOD[:20] + bytes([GOOD[20] ^ 1]) + GOOD[21:], "CRC is no longer valid"),
        (GOOD[:2] + b"\x00\x00\x00\x00" + GOOD[6:], "CRC is no longer valid"),
        (GOOD[:-1], "truncated"),
        (GOOD[:40], "truncated"),
        (GOOD[:9], "shorter than the 10-byte header"),
        (b"", "shorter"),
        (_reseal(GOOD[:6] + struct.pack(">i", -1) + GOOD[10:]), "cannot be negative"),
        (bytes(100), "unknown file version 0"),  # zero-filled
    ],
)
def test_corrupt_snapshots_raise_typed_error(tmp_path, data, reason):
    path = tmp_path / snapshot_file_name(50)
    path.write_bytes(data)
    with pytest.raises(CorruptSnapshotError) as info:
        read_snapshot(path)
    assert reason in info.value.reason and info.value.path == str(path)
    assert path.read_bytes() == data


def test_trailing_bytes_under_a_valid_crc_are_ignored_like_kafka():
    data = _reseal(GOOD + b"\x01\x02")
    assert decode_snapshot(data) == decode_snapshot(GOOD)


def test_list_snapshots(tmp_path):
    for name in [
        "00000000000000000050.snapshot",
        "00000000000000000003.snapshot",
        "00000000000000000010.snapshot.deleted",
        "00000000000000000000.log",
        "abc.snapshot",
        "00000000000000000011.snapshot.swap",
    ]:
        (tmp_path / name).write_bytes(EMPTY_SNAPSHOT)
    (tmp_path / "00000000000000000099.snapshot").mkdir()
    assert list_snapshots(tmp_path) == [
        (3, str(tmp_path / "00000000000000000003.snapshot")),
        (50, str(tmp_path / "00000000000000000050.snapshot")),
    ]


# ---------------------------------------------------------------------------------------
# Replay (ProducerAppendInfo / ProducerStateEntry rules)


def test_idempotent_producer():
    psm = ProducerStateManager()
    for i in range(7):
        assert psm.update(header(10 * i, 4, pid=1, seq=5 * i, ts=100 + i)) is None
    entry = psm.producers[1]
    assert len(entry.batch_metadata) == 5  # NUM_BATCHES_TO_RETAIN
    assert entry.last_seq == 34 and entry.last_data_offset == 64 and entry.last_offset_delta == 4
    assert entry.last_timestamp == 106
    assert psm.active_producers() == {1: ActiveProducer(64, 0)}
    assert psm.first_unstable_offset() is None and psm.map_end_offset == 65
    assert psm.to_snapshot_entries() == [ProducerSnapshotEntry(1, 0, 34, 64, 4, 106, -1, -1)]


def test_transaction_commit_and_first_unstable_offset():
    psm = ProducerStateManager()
    psm.update(header(10, 2, pid=2, txn=True))
    psm.update(header(13, 0, pid=3, txn=True))
    psm.update(header(14, 1, pid=2, txn=True, seq=3))
    assert psm.ongoing_transactions == {2: 10, 3: 13}
    assert psm.first_unstable_offset() == 10
    done = marker(psm, 16, COMMIT, pid=2)
    assert (done.producer_id, done.first_offset, done.last_offset, done.is_aborted) == (2, 10, 16, False)
    assert done.last_stable_offset == 13  # pid 3's open transaction
    assert psm.ongoing_transactions == {3: 13}
    assert psm.first_unstable_offset() == 13
    assert psm.active_producers()[2] == ActiveProducer(15, 0)  # same epoch: last data offset kept
    assert psm.producers[2].coordinator_epoch == 5 and psm.producers[2].last_timestamp == 2_000
    done = marker(psm, 17, ABORT, pid=3)
    assert done.is_aborted and done.last_stable_offset == 18
    assert psm.first_unstable_offset() is None
    # Kafka's firstUnstableOffset also counts completed transactions whose marker is at or
    # above the high watermark.
    assert psm.first_unstable_offset(high_watermark=16) == 10
    assert psm.first_unstable_offset(high_watermark=17) == 13
    assert psm.first_unstable_offset(high_watermark=18) is None


def test_marker_with_new_epoch_clears_the_last_data_offset():
    psm = ProducerStateManager()
    psm.update(header(0, 0, pid=5, epoch=3, txn=True))
    marker(psm, 1, ABORT, pid=5, epoch=4)  # coordinator bumped the epoch (abort on timeout)
    assert psm.active_producers() == {5: ActiveProducer(None, 4)}
    assert psm.to_snapshot_entries()[0].last_offset == -1
    assert marker(psm, 2, COMMIT, pid=5, epoch=4) is None  # a marker with no open txn completes nothing
    assert psm.active_producers() == {5: ActiveProducer(None, 4)}


def test_data_batch_with_new_epoch_clears_metadata():
    psm = ProducerStateManager()
    psm.update(header(0, 0, pid=1, epoch=0, seq=0))
    psm.update(header(1, 0, pid=1, epoch=0, seq=1))
    psm.update(header(2, 1, pid=1, epoch=1, seq=0))
    entry = psm.producers[1]
    assert entry.producer_epoch == 1 and [b.last_offset for b in entry.batch_metadata] == [3]


def test_retain_empty_header_is_replayed_from_its_fields():
    psm = ProducerStateManager()
    psm.update(header(30, 4, pid=9, seq=100, ts=777, count=0))  # records removed by the cleaner
    entry = psm.producers[9]
    assert entry.last_data_offset == 34 and entry.last_seq == 104 and entry.last_timestamp == 777
    psm.update(header(40, 2, pid=9, seq=2**31 - 2, count=0))  # sequence wraps like Kafka's incrementSequence
    assert psm.producers[9].last_seq == 0


def test_empty_control_batch_is_ignored():
    psm = ProducerStateManager()
    psm.update(header(0, 0, pid=1, txn=True))
    before = psm.to_snapshot_entries()
    assert psm.update(header(1, 0, pid=1, txn=True, control=True, count=0)) is None
    assert psm.to_snapshot_entries() == before and psm.ongoing_transactions == {1: 0}
    # An unknown producer is registered with an empty entry, as Kafka's update() inserts it.
    psm.update(header(2, 0, pid=2, epoch=7, txn=True, control=True, count=0))
    assert psm.active_producers()[2] == ActiveProducer(None, -1)


def test_replay_errors_and_ignored_batches():
    psm = ProducerStateManager()
    psm.update(header(0, 0, pid=1, txn=True))
    with pytest.raises(InvalidTxnStateError) as info:
        psm.update(header(1, 0, pid=1, txn=False))
    assert info.value.offset == 1
    with pytest.raises(ValueError):
        psm.update(header(1, 0, pid=1, txn=True, control=True))  # marker type missing
    with pytest.raises(ValueError):
        psm.update(header(1, 0, pid=1, control=True), ControlRecordType.LEADER_CHANGE, 0, 0)
    with pytest.raises(ValueError):
        psm.update(header(1, 0, pid=1, txn=True, control=True), ABORT)  # coordinator epoch missing
    snapshot = psm.to_snapshot_entries()
    psm.update(header(5, 0, pid=-1))  # no producer id
    psm.update(header(6, 0, pid=77, magic=1))  # legacy entries carry no producer state
    assert psm.to_snapshot_entries() == snapshot
    psm.update_map_end_offset(100)
    psm.update(header(90, 5, pid=3))  # wholly below the map end offset: not read by a broker
    assert 3 not in psm.producers


def _write(tmp_path, offset, entries):
    write_snapshot(tmp_path / snapshot_file_name(offset), entries)


def test_load_expires_idle_producers(tmp_path):
    time = MockTime(ms=10_000_000_000)
    now = time.milliseconds()
    exp = DEFAULT_PRODUCER_ID_EXPIRATION_MS
    _write(
        tmp_path,
        20,
        [
            ProducerSnapshotEntry(1, 0, 5, 10, 0, now - exp, -1, -1),  # exactly expired (>=)
            ProducerSnapshotEntry(2, 0, 5, 11, 0, now - exp + 1, -1, -1),
            ProducerSnapshotEntry(3, 0, 5, 12, 0, now - 10 * exp, 4, 12),  # open txn: never expires
        ],
    )
    psm = ProducerStateManager.load(tmp_path, log_start_offset=0, log_end_offset=30, now_ms=now)
    assert sorted(psm.producers) == [2, 3]
    assert psm.snapshot_offset == 20 and psm.map_end_offset == 20 and psm.replay_needed
    assert psm.ongoing_transactions == {3: 12} and psm.first_unstable_offset() == 12
    time.advance(2)
    assert psm.remove_expired_producers(time.milliseconds()) == [2]
    assert sorted(psm.producers) == [3]


def test_load_picks_the_newest_valid_snapshot_in_range(tmp_path):
    now = 5_000
    _write(tmp_path, 10, [ProducerSnapshotEntry(1, 0, 0, 9, 0, now, -1, -1)])
    _write(tmp_path, 20, [ProducerSnapshotEntry(2, 0, 0, 19, 0, now, -1, -1)])
    (tmp_path / snapshot_file_name(30)).write_bytes(b"\x00\x01garbage!!")
    _write(tmp_path, 40, [ProducerSnapshotEntry(4, 0, 0, 39, 0, now, -1, -1)])
    files_before = {p: p.read_bytes() for p in tmp_path.iterdir()}

    psm = ProducerStateManager.load(tmp_path, log_start_offset=0, log_end_offset=35, now_ms=now)
    assert psm.snapshot_offset == 20 and list(psm.producers) == [2]  # 40 > LEO, 30 corrupt
    assert [s.offset for s in psm.skipped_snapshots] == [30]
    assert {p: p.read_bytes() for p in tmp_path.iterdir()} == files_before  # nothing deleted

    psm = ProducerStateManager.load(tmp_path, log_start_offset=20, log_end_offset=35, now_ms=now)
    assert psm.snapshot_offset is None and psm.map_end_offset == 20  # snapshot == log start is dropped
    psm = ProducerStateManager.load(tmp_path, log_start_offset=0, log_end_offset=5, now_ms=now)
    assert psm.snapshot_offset is None and psm.map_end_offset == 0 and not psm.producers


def test_load_ignores_stray_snapshots_and_honours_clean_shutdown(tmp_path):
    now = 5_000
    _write(tmp_path, 15, [ProducerSnapshotEntry(1, 0, 0, 9, 0, now, -1, -1)])  # stray, below the last base
    _write(tmp_path, 60, [ProducerSnapshotEntry(6, 0, 0, 59, 0, now, -1, -1)])  # largest stray, above: kept
    psm = ProducerStateManager.load(
        tmp_path, log_start_offset=0, log_end_offset=70, now_ms=now, segment_base_offsets=[0, 20, 50]
    )
    assert psm.snapshot_offset == 60
    psm = ProducerStateManager.load(
        tmp_path, log_start_offset=0, log_end_offset=70, now_ms=now, segment_base_offsets=[0, 20, 50, 65]
    )
    assert psm.snapshot_offset is None  # both are strays below the last base: the broker deletes them
    psm = ProducerStateManager.load(
        tmp_path,
        log_start_offset=0,
        log_end_offset=70,
        now_ms=now,
        segment_base_offsets=[0, 20, 50, 65],
        had_clean_shutdown=True,
    )
    assert not psm.replay_needed and psm.map_end_offset == 70 and not psm.producers


def test_snapshot_written_by_manager_reloads(tmp_path):
    psm = ProducerStateManager()
    psm.update(header(0, 9, pid=1, seq=0, ts=4_000))
    psm.update(header(10, 0, pid=2, txn=True, ts=4_001))
    path = psm.write_snapshot(tmp_path)
    assert os.path.basename(path) == snapshot_file_name(11)
    back = ProducerStateManager.load(tmp_path, log_start_offset=0, log_end_offset=11, now_ms=4_002)
    assert back.active_producers() == psm.active_producers()
    assert back.ongoing_transactions == {2: 10} and back.map_end_offset == 11


OPS = st.lists(
    st.tuples(
        st.sampled_from(["data", "txn", "commit", "abort", "empty_ctrl", "empty_data"]),
        st.integers(1, 3),  # producer id
        st.integers(0, 2),  # epoch
        st.integers(0, 3),  # last offset delta
    ),
    max_size=25,
)


def _replay(psm, ops, start=0):
    offset = start
    for kind, pid, epoch, delta in ops:
        if kind in ("commit", "abort"):
            marker(psm, offset, ABORT if kind == "abort" else COMMIT, pid=pid, epoch=epoch, ts=offset)
            delta = 0
        elif kind == "empty_ctrl":
            psm.update(header(offset, 0, pid=pid, epoch=epoch, txn=True, control=True, count=0, ts=offset))
            delta = 0
        else:
            psm.update(
                header(
                    offset,
                    delta,
                    pid=pid,
                    epoch=epoch,
                    txn=kind == "txn",
                    ts=offset,
                    count=0 if kind == "empty_data" else None,
                )
            )
        offset += delta + 1
    return offset


@given(OPS, st.integers(0, 25))
def test_snapshot_then_replay_equals_full_replay(ops, cut):
    """The broker's design: state(snapshot at k) + replay(k..) == replay(0..)."""
    full = ProducerStateManager()
    try:
        _replay(full, ops)
    except InvalidTxnStateError:
        assume(False)
    head = ProducerStateManager()
    offset = _replay(head, ops[:cut])
    resumed = ProducerStateManager()
    resumed.load_snapshot_entries(
        decode_snapshot(encode_snapshot(head.to_snapshot_entries())), snapshot_offset=offset, now_ms=0
    )
    _replay(resumed, ops[cut:], start=offset)
    assert resumed.active_producers() == full.active_producers()
    assert resumed.ongoing_transactions == full.ongoing_transactions
    assert resumed.first_unstable_offset() == full.first_unstable_offset()
    assert resumed.to_snapshot_entries() == full.to_snapshot_entries()


# ---------------------------------------------------------------------------------------
# Real Kafka snapshots (read-only)


@pytest.mark.fixtures
def test_every_real_snapshot_parses(real_kafka_root):
    count = 0
    for path in sorted(real_kafka_root.rglob("*.snapshot")):
        before = path.read_bytes()
        entries = read_snapshot(path)
        assert encode_snapshot(entries) == before  # our encoder writes the broker's bytes
        if not entries:
            assert before == EMPTY_SNAPSHOT
        for e in entries:
            assert e.producer_id >= 0 and e.producer_epoch >= 0
        psm = ProducerStateManager.load(
            path.parent, log_start_offset=0, log_end_offset=2**62, now_ms=0, producer_id_expiration_ms=2**62
        )
        assert psm.snapshot_offset is not None
        assert path.read_bytes() == before
        count += 1
    assert count >= 30
