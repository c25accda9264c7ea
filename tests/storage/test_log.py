"""Segments and partition directories: appends and rolls with Kafka's index rule, index
rebuilding that reproduces real brokers' files, start-up handling of leftovers, and the
crash-safe segment swap."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from faults import StepFaults
from kafka_logs import batch_of, broker_view, read_records, snapshot_dir, write_log

from cleaner.errors import LogCleaningAbortedError, LogSegmentOffsetOverflowError, SwapIncompleteError
from cleaner.records.batch import INT32_MAX
from cleaner.records.builder import build_control_batch
from cleaner.records.columns import decode_records
from cleaner.records.control import ControlRecordType
from cleaner.storage.index import AbortedTxn, OffsetIndex, TimeIndex
from cleaner.storage.loader import plan_startup
from cleaner.storage.log import Log, LogConfig
from cleaner.storage.producer_state import snapshot_file_name
from cleaner.storage.segment import LogSegment

SMALL = LogConfig(segment_bytes=1024, index_interval_bytes=100)


def _batches(n: int, per_batch: int = 3, start: int = 0) -> list[bytes]:
    out, offset = [], start
    for _ in range(n):
        offsets = list(range(offset, offset + per_batch))
        out.append(batch_of(offsets, [b"k%d" % (o % 7) for o in offsets]))
        offset += per_batch
    return out


def test_append_rolls_and_indexes_like_kafka(tmp_path: Path) -> None:
    log = write_log(tmp_path / "t-0", _batches(40), config=SMALL)
    segments = log.segments
    assert len(segments) > 3
    assert all(s.size <= SMALL.segment_bytes for s in segments)
    assert log.log_end_offset == 120
    assert [r.offset for r in read_records(log)] == list(range(120))
    for seg in segments:
        batches = [c for c in seg.iter_batches()]
        positions = [int(p) for c in batches for p in c.file_positions]
        lasts = [int(o) for c in batches for o in c.last_offsets]
        maxts = [int(t) for c in batches for t in c.max_timestamps]
        offset_index = OffsetIndex.read(seg.index_path, seg.base_offset)
        time_index = TimeIndex.read(seg.time_index_path, seg.base_offset)
        assert offset_index.entries > 0
        assert offset_index.verify_against(positions, lasts, exact=True) == []
        closed = seg is not segments[-1]
        assert time_index.verify_against(lasts, maxts, closed=closed) == []
        # Kafka's rule: an entry only after more than index.interval.bytes, never at 0.
        assert 0 not in offset_index.positions.tolist()
        # Trimmed files: exactly entries * entry size.
        assert seg.index_path.stat().st_size == offset_index.entries * 8


def test_rebuilt_index_files_equal_what_real_brokers_wrote(real_kafka_root: Path) -> None:
    """Every closed segment's .index/.timeindex, rebuilt from its .log with Kafka's rule
    (plus the final time-index entry a broker writes when the segment stops being active),
    equals the file the broker wrote.

    The offset index must match byte for byte. So must the time index, with one
    documented exception: at append time a broker takes the time-index offset from
    ``LogValidator``, which for uncompressed v2 batches is the offset of the first *record*
    holding the batch's max timestamp, while segment recovery (``LogSegment.recover``)
    and Kafka 4.1's per-batch append use the batch's last offset, which is what we write.
    Where the two differ, each entry must have the same timestamp and the broker's offset
    must be the first record of the batch our entry names that carries that timestamp.
    """
    exact = record_rule = 0
    for index_path in sorted(real_kafka_root.rglob("*.index")):
        log_path = index_path.with_suffix(".log")
        if not log_path.exists() or log_path.stat().st_size == 0:
            continue
        seg = LogSegment(index_path.parent, int(index_path.stem))
        indexer, valid = seg.build_indexes()
        assert valid == log_path.stat().st_size
        assert indexer.offset_index.to_bytes() == index_path.read_bytes(), index_path
        time_path = index_path.with_suffix(".timeindex")
        indexer.time_index.maybe_append(indexer.max_timestamp, indexer.offset_of_max_timestamp, skip_full_check=True)
        ours = indexer.time_index
        if ours.to_bytes() == time_path.read_bytes():
            exact += 1
            continue
        theirs = TimeIndex.read(time_path, seg.base_offset)
        assert theirs.timestamps.tolist() == ours.timestamps.tolist(), time_path
        records = {}
        for chunk in seg.iter_batches():
            columns = decode_records(chunk)
            for row in range(len(columns)):
                b = int(columns.batch[row])
                records.setdefault(int(chunk.last_offsets[b]), []).append(
                    (int(columns.offsets[row]), int(columns.timestamps[row]))
                )
        for ts, their_offset, our_offset in zip(
            theirs.timestamps.tolist(), theirs.offsets.tolist(), ours.offsets.tolist(), strict=True
        ):
            first_with_max = next(o for o, t in records[our_offset] if t == ts)
            assert their_offset == first_with_max, (time_path, ts)
        record_rule += 1
    assert exact >= 5 and record_rule >= 1 and exact + record_rule >= 10, (exact, record_rule)


def test_append_refuses_offsets_outside_the_segment(tmp_path: Path) -> None:
    seg = LogSegment.create(tmp_path, 100)
    with pytest.raises(LogSegmentOffsetOverflowError):
        seg.append(batch_of([100 + INT32_MAX + 1], [b"k"]))
    with pytest.raises(LogSegmentOffsetOverflowError):
        seg.append(batch_of([99], [b"k"]))
    assert seg.size == 0


def test_a_log_rolls_before_an_offset_overflows(tmp_path: Path) -> None:
    log = Log.create(tmp_path / "t-0", LogConfig())
    log.append(batch_of([0], [b"a"]))
    log.append(batch_of([INT32_MAX + 5], [b"b"]))
    assert [s.base_offset for s in log.segments] == [0, INT32_MAX + 5]


def test_truncate_to_removes_whole_batches_and_bumps_generation(tmp_path: Path) -> None:
    log = write_log(tmp_path / "t-0", _batches(40), config=SMALL)
    generation = log.generation
    log.truncate_to(50)  # offset 50 is inside batch [48, 50]
    assert log.generation == generation + 1
    assert log.log_end_offset == 48
    assert [r.offset for r in read_records(log)] == list(range(48))
    reopened = Log.open(log.dir, SMALL)
    assert [r.offset for r in read_records(reopened)] == list(range(48))


def test_truncate_to_keeps_the_producer_snapshot_at_the_truncation_offset(tmp_path: Path) -> None:
    """``ProducerStateManager.truncateAndReload`` deletes the snapshots above the new log
    end, not the one at it (a snapshot at offset o describes the state before o)."""
    log = write_log(tmp_path / "t-0", _batches(40), config=SMALL)
    for offset in (30, 48, 49, 60):
        (log.dir / snapshot_file_name(offset)).write_bytes(b"")
    log.truncate_to(48)
    assert sorted(n for n in os.listdir(log.dir) if n.endswith(".snapshot")) == [
        snapshot_file_name(30),
        snapshot_file_name(48),
    ]


def test_open_starts_the_log_at_its_first_segment(tmp_path: Path) -> None:
    """Without a log-start-offset checkpoint the log starts at its first segment's base."""
    log = Log.create(tmp_path / "t-0", SMALL, base_offset=100)
    for batch in _batches(5, start=100):
        log.append(batch)
    log.close()
    assert Log.open(tmp_path / "t-0", SMALL).log_start_offset == 100
    assert Log.open(tmp_path / "t-0", SMALL, log_start_offset=103).log_start_offset == 103
    assert Log.open(tmp_path / "t-0", SMALL, log_start_offset=7).log_start_offset == 100


def test_flush_and_close_of_a_read_only_log_change_nothing(tmp_path: Path) -> None:
    write_log(tmp_path / "t-0", _batches(40), config=SMALL)
    before = snapshot_dir(tmp_path / "t-0")
    log = Log.open(tmp_path / "t-0", SMALL, read_only=True)
    list(log.iter_batches(0))
    log.flush()
    log.close()
    assert snapshot_dir(tmp_path / "t-0") == before


# -- start-up handling (KAFKA_NOTES §4) -----------------------------------------------


def _next_offsets(table: dict[str, int]):
    return lambda name: table[name]


def test_plan_removes_an_uncommitted_replace() -> None:
    """A crash before the last .cleaned rename: every .cleaned goes, and so does every
    .swap at or above the smallest .cleaned offset (a half-renamed set)."""
    names = ["00.log", "00.index", "05.log", "05.index", "00.log.swap", "00.index.cleaned", "00.timeindex.cleaned"]
    plan = plan_startup(names, _next_offsets({}))
    assert sorted(plan.delete) == ["00.index.cleaned", "00.log.swap", "00.timeindex.cleaned"]
    assert plan.rename == []


def test_plan_completes_a_committed_replace() -> None:
    names = [
        "00000000000000000000.log",
        "00000000000000000000.index",
        "00000000000000000000.timeindex",
        "00000000000000000010.log",
        "00000000000000000010.index",
        "00000000000000000010.snapshot",
        "00000000000000000030.log",
        "00000000000000000030.index",
        "00000000000000000000.log.swap",
        "00000000000000000000.index.swap",
        "00000000000000000000.timeindex.swap",
        "leader-epoch-checkpoint",
        "partition.metadata",
    ]
    plan = plan_startup(names, _next_offsets({"00000000000000000000.log.swap": 25}))
    assert sorted(plan.delete) == sorted(
        [
            "00000000000000000000.log",
            "00000000000000000000.index",
            "00000000000000000000.timeindex",
            "00000000000000000010.log",
            "00000000000000000010.index",
            "00000000000000000010.snapshot",
        ]
    )
    assert sorted(plan.rename) == sorted(
        [
            ("00000000000000000000.log.swap", "00000000000000000000.log"),
            ("00000000000000000000.index.swap", "00000000000000000000.index"),
            ("00000000000000000000.timeindex.swap", "00000000000000000000.timeindex"),
        ]
    )
    after = plan.resulting_names(names)
    assert "00000000000000000030.log" in after and "partition.metadata" in after


def test_plan_warns_of_a_swap_segment_without_its_indexes() -> None:
    """Kafka opens a ``.log.swap`` whose ``.index.swap`` is gone with a new, zero-filled
    index and trusts it: the plan says so, for the status output and the logs."""
    names = ["00.log", "00.log.swap", "00.timeindex.swap"]
    plan = plan_startup(names, _next_offsets({"00.log.swap": 5}))
    missing = [n for n in plan.notes if "is missing" in n]
    assert missing == ["00.index.swap is missing: Kafka would create it zero-filled and trust it (KAFKA_NOTES §4)"]


def test_iter_batches_starts_at_the_batch_holding_the_offset(tmp_path: Path) -> None:
    """Readers (producer-state replay, the cleaner) ask for the batches from an offset in the
    middle of a segment: none before the batch that holds it, every one after it."""
    log = write_log(tmp_path / "t-0", _batches(40), config=SMALL)
    middle = log.segments[1]
    for start in (middle.base_offset + 4, middle.base_offset + 3, 0, 119):
        batches = [
            (int(f), int(la))
            for c in log.iter_batches(start)
            for f, la in zip(c.base_offsets, c.last_offsets, strict=True)
        ]
        assert batches[0][0] <= start <= batches[0][1]
        assert [b for b, _ in batches] == list(range(batches[0][0], 120, 3))


def test_plan_deletes_leftovers_and_orphan_indexes_but_not_kraft_snapshots() -> None:
    names = ["1.log.deleted", "1.index.deleted", "2.checkpoint.deleted", "3.index", "3.timeindex", "4.log", "4.index"]
    plan = plan_startup(names, _next_offsets({}))
    assert sorted(plan.delete) == ["1.index.deleted", "1.log.deleted"]
    assert sorted(plan.delete_orphans) == ["3.index", "3.timeindex"]


def test_a_writable_open_applies_the_whole_plan(tmp_path: Path) -> None:
    """Opening a log writable does what a broker's start-up does: leftovers deleted, orphan
    indexes too."""
    write_log(tmp_path / "t-0", _batches(10), config=SMALL)
    d = tmp_path / "t-0"
    (d / "00000000000000000500.index").write_bytes(b"\0" * 8)
    (d / "00000000000000000500.timeindex").write_bytes(b"\0" * 12)
    (d / "00000000000000000007.log.deleted").write_bytes(b"")
    Log.open(d, SMALL)
    assert not [n for n in os.listdir(d) if n.startswith("00000000000000000500") or n.endswith(".deleted")]


def test_read_only_open_sees_the_committed_swap_and_changes_nothing(tmp_path: Path) -> None:
    log = write_log(tmp_path / "t-0", _batches(40), config=SMALL)
    old = log.segments[:2]
    cleaned = log.new_cleaned_segment(old[0].base_offset)
    for seg in old:
        for chunk in seg.iter_batches():
            cleaned.append(bytes(chunk.entry_bytes(len(chunk) - 1)))
    cleaned.on_become_inactive()
    cleaned.flush()
    cleaned.change_suffix(".swap")  # a crash right after the commit point
    before = snapshot_dir(log.dir)
    view = Log.open(log.dir, SMALL, read_only=True)
    assert view.pending_startup
    assert view.segments[0].base_offset == old[0].base_offset
    expected = broker_view(log.dir, SMALL)
    assert read_records(view) == expected
    assert snapshot_dir(log.dir) == before


# -- replace_segments ---------------------------------------------------------------


def _make_cleaned(log: Log) -> tuple[list[LogSegment], LogSegment]:
    """A cleaned replacement of the log's first three segments that keeps the last batch
    of each (so the old and the new record sets differ)."""
    old = log.segments[:3]
    cleaned = log.new_cleaned_segment(old[0].base_offset)
    for seg in old:
        last = list(seg.iter_batches())[-1]
        cleaned.append(bytes(last.entry_bytes(len(last) - 1)))
    cleaned.on_become_inactive()
    cleaned.flush()
    cleaned.set_last_modified(old[-1].last_modified_ms)
    return old, cleaned


def _prepare_replace(tmp_path: Path):
    log = write_log(tmp_path / "t-0", _batches(40), config=SMALL)
    old, cleaned = _make_cleaned(log)
    return log, old, cleaned


def test_replace_segments_swaps_in_the_new_segment(tmp_path: Path) -> None:
    log, old, cleaned = _prepare_replace(tmp_path)
    before = read_records(log)
    replaced = {r.offset for r in before if r.offset < log.segments[3].base_offset}
    log.replace_segments([cleaned], old)
    after = read_records(log)
    kept = {r.offset for r in after if r.offset < log.segments[1].base_offset}
    assert kept < replaced and kept  # only the last batch of each replaced segment stays
    assert [r for r in after if r.offset not in replaced] == [r for r in before if r.offset not in replaced]
    assert read_records(Log.open(log.dir, SMALL)) == after
    names = os.listdir(log.dir)
    assert not [n for n in names if n.endswith((".cleaned", ".swap", ".deleted"))]


def test_truncation_during_a_clean_aborts_the_swap(tmp_path: Path) -> None:
    log, old, cleaned = _prepare_replace(tmp_path)
    generation = log.generation
    log.truncate_to(log.log_end_offset - 5)
    before = read_records(log)
    with pytest.raises(LogCleaningAbortedError):
        log.replace_segments([cleaned], old, expected_generation=generation)
    assert read_records(Log.open(log.dir, SMALL)) == before
    assert not [n for n in os.listdir(log.dir) if n.endswith((".cleaned", ".swap", ".deleted"))]


def _count_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    log, old, cleaned = _prepare_replace(tmp_path / "count")
    with monkeypatch.context() as m:
        counter = StepFaults().install(m)
        log.replace_segments([cleaned], old)
    return counter.calls


def test_a_failure_at_any_step_leaves_old_or_new_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    steps = _count_steps(tmp_path, monkeypatch)
    assert steps >= 8
    outcomes = set()
    for fail_at in range(1, steps + 1):
        case = tmp_path / f"case{fail_at}"
        log, old, cleaned = _prepare_replace(case)
        old_records = read_records(log)
        new_records = _expected_after_replace(case, log, old, cleaned)
        with monkeypatch.context() as m:
            StepFaults(at=fail_at).install(m)
            with pytest.raises((OSError, SwapIncompleteError)):
                log.replace_segments([cleaned], old)
        view = broker_view(log.dir, SMALL)
        assert view in (old_records, new_records), f"failure at step {fail_at}"
        outcomes.add("old" if view == old_records else "new")
        reopened = read_records(Log.open(log.dir, SMALL))
        assert reopened == view
    assert outcomes == {"old", "new"}


def _expected_after_replace(case: Path, log: Log, old, cleaned) -> list:
    """The records the log holds after a successful swap: the cleaned segment's, then
    those of every segment that is not replaced."""
    replaced = {s.base_offset for s in old}
    out = []
    for seg in [cleaned] + [s for s in log.segments if s.base_offset not in replaced]:
        for chunk in seg.iter_batches():
            out.extend(decode_records(chunk).records())
    return sorted(out, key=lambda r: r.offset)


KILL_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[3])
    from test_log import SMALL, _make_cleaned
    from cleaner.storage import files
    from cleaner.storage.log import Log

    directory, kill_at = Path(sys.argv[1]), int(sys.argv[2])
    log = Log.open(directory, SMALL)
    old, cleaned = _make_cleaned(log)
    calls = {"n": 0}
    def killing(real):
        def wrapper(*a):
            calls["n"] += 1
            if calls["n"] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*a)
        return wrapper
    files.rename = killing(files.rename)
    files.fsync_dir = killing(files.fsync_dir)
    log.replace_segments([cleaned], old)
    """
)


def test_sigkill_at_any_step_leaves_old_or_new_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same swap in a child process killed with SIGKILL at each rename/fsync."""
    steps = _count_steps(tmp_path, monkeypatch)
    here = str(Path(__file__).parent)
    tests_root = str(Path(__file__).parent.parent)
    for kill_at in range(1, steps + 1):
        twin, case = tmp_path / f"twin{kill_at}", tmp_path / f"kill{kill_at}"
        log, old, cleaned = _prepare_replace(twin)
        old_records = read_records(log)
        new_records = _expected_after_replace(twin, log, old, cleaned)
        write_log(case / "t-0", _batches(40), config=SMALL)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, tests_root]))
        proc = subprocess.run(
            [sys.executable, "-P", "-c", KILL_CHILD, str(case / "t-0"), str(kill_at), here],
            capture_output=True,
            timeout=60,
            env=env,
        )
        assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
        view = broker_view(case / "t-0", SMALL)
        assert view in (old_records, new_records), f"kill at step {kill_at}"


def test_a_swap_without_its_cleaned_files_changes_nothing(tmp_path: Path) -> None:
    log, old, cleaned = _prepare_replace(tmp_path)
    before = read_records(log)
    cleaned.delete_files()
    with pytest.raises(LogCleaningAbortedError, match="missing"):
        log.replace_segments([cleaned], old)
    assert read_records(Log.open(log.dir, SMALL)) == before


def test_collect_aborted_transactions_follows_kafka(tmp_path: Path) -> None:
    log = write_log(tmp_path / "t-0", _batches(40), config=SMALL)
    segs = log.segments
    assert len(segs) >= 4
    segs[1].txn_index.append(AbortedTxn(7, segs[1].base_offset, segs[1].base_offset + 1, segs[1].base_offset + 2))
    segs[2].txn_index.append(AbortedTxn(8, segs[2].base_offset, segs[2].base_offset + 1, 10**9))
    segs[3].txn_index.append(AbortedTxn(9, segs[3].base_offset, segs[3].base_offset + 1, segs[3].base_offset + 2))
    found = log.collect_aborted_transactions(segs[1].base_offset, segs[3].base_offset + 5)
    # The search stops, complete, at the entry whose LSO reaches the upper bound.
    assert [t.producer_id for t in found] == [7, 8]


def test_producer_state_is_replayed_after_the_last_snapshot(tmp_path: Path) -> None:
    log = Log.create(tmp_path / "t-0", SMALL)
    log.append(batch_of([0, 1], [b"a", b"b"], producer_id=5, producer_epoch=0, base_sequence=0))
    log.append(batch_of([2], [b"c"], producer_id=6, producer_epoch=0, base_sequence=0, is_transactional=True))
    log.append(batch_of([3], [b"d"], producer_id=5, producer_epoch=0, base_sequence=2))
    psm = log.load_producer_state(now_ms=10_000)
    active = psm.active_producers()
    assert active[5].last_data_offset == 3 and active[6].last_data_offset == 2
    assert psm.first_unstable_offset() == 2
    log.append(
        build_control_batch(
            ControlRecordType.COMMIT, offset=4, producer_id=6, producer_epoch=0, coordinator_epoch=1, timestamp=1_004
        )
    )
    psm = log.load_producer_state(now_ms=10_000)
    assert psm.first_unstable_offset() is None
    log.close()
