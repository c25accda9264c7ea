"""The transaction state the Spark job plans with (``Cleaner.dirty_segments`` and
``Cleaner.transaction_states``) is replayed from batch headers only
(``LogSegment.transaction_batches``: the data batches' headers, the control batches whole).
It must be the state a replay of every byte gives, at every segment and group boundary: the
job's bytes depend on it. The reference here replays the whole log with the engine's own
reader (``Cleaner._chunks``), as the sequential clean reads it."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from cleaner.clock import FixedTime
from cleaner.config import parse_policy
from cleaner.engine.cleaner import Cleaner, LogToClean, plan_groups
from cleaner.engine.transaction_summary import summaries_needed, summarize
from cleaner.engine.transactions import CleanedTransactionMetadata, control_types, run_transactions
from cleaner.errors import CorruptRecordError
from cleaner.generate import GeneratorConfig, generate
from cleaner.records.builder import build_batch, build_control_batch
from cleaner.records.control import ControlRecordType
from cleaner.records.record import Record
from cleaner.spark.plan import open_managed, partition_of_dir, planning_cleaner
from cleaner.storage.index import AbortedTxn
from cleaner.storage.log import Log, LogConfig
from cleaner.storage.segment import LogSegment
from cleaner.storage.topic_partition import TopicPartition

NOW = 1_700_000_000_000


def canonical(state: CleanedTransactionMetadata) -> tuple:
    """What of a transaction state decides the clean: the aborted transactions still to come,
    those ongoing (and whether a batch of each was seen), the producers in a committed one."""
    return (sorted((first, dataclasses.astuple(txn)) for first, _, txn in state._aborted),
            sorted((pid, dataclasses.astuple(a.txn), a.last_observed_batch_offset)
                   for pid, a in state._ongoing_aborted.items()),
            sorted(state._ongoing_committed))


def _planned(root: Path, seed: int, transactions: float, segment_kb: int, records: int):  # type: ignore[no-untyped-def]
    generate(root, GeneratorConfig(topics=1, partitions=1, records=records, keys=records // 8, seed=seed,
                                   transactions=transactions, tombstones=0.05, compression="none",
                                   segment_bytes=segment_kb << 10, now_ms=NOW))
    group_bytes = 4 * segment_kb << 10
    policy = parse_policy({"topics": [{"match": ".*", "cleanupPolicy": "compact", "segmentBytes": group_bytes}]})
    [partition] = [p for p in root.iterdir() if p.is_dir()]
    ref = partition_of_dir(partition)
    manager, managed = open_managed(ref, policy, FixedTime(NOW + 3_600_000), read_only=True)
    ltc, _, _ = manager.log_to_clean(managed, manager.all_cleaner_checkpoints().get(ref.tp), NOW + 3_600_000)
    return ltc, planning_cleaner(policy.cleaner, FixedTime(NOW))


def _group_states_replayed(ltc: LogToClean, cleaner: Cleaner, groups: list[list[LogSegment]]) -> list[tuple]:
    """The state at the start of each group (canonical), from a replay of every batch."""
    the_log = ltc.log
    state, out = CleanedTransactionMetadata(), []
    for group in groups:
        out.append(canonical(copy.deepcopy(state)))
        for i, segment in enumerate(group):
            upper = group[i + 1].base_offset if i + 1 < len(group) else segment.read_next_offset()
            state.add_aborted_transactions(the_log.collect_aborted_transactions(segment.base_offset, upper))
            for chunk in cleaner._chunks(segment, 0, the_log.config.max_message_bytes):
                run_transactions(chunk, control_types(chunk), state)
    return out


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**16), transactions=st.sampled_from([0.0, 0.2, 0.6, 1.0]),
       segment_kb=st.sampled_from([16, 64, 256]))
def test_header_only_replay_gives_the_state_of_a_whole_replay(tmp_path_factory: pytest.TempPathFactory,
                                                             caplog: pytest.LogCaptureFixture, seed: int,
                                                             transactions: float, segment_kb: int) -> None:
    caplog.clear()
    ltc, cleaner = _planned(tmp_path_factory.mktemp("log"), seed, transactions, segment_kb, 6000)
    the_log = ltc.log
    max_message_bytes = the_log.config.max_message_bytes

    # dirty_segments: the state at the start of each dirty segment, less the aborted
    # transactions no batch of the segment can reach (they begin at or after its end), and
    # the same aborted/not decision for every batch of the segment as the whole replay's.
    start, end = ltc.first_dirty_offset, ltc.first_uncleanable_offset
    state = CleanedTransactionMetadata()
    state.add_aborted_transactions(the_log.collect_aborted_transactions(start, end))
    expected, decisions = [], []
    dirty = the_log.segments_between(start, end)
    for segment, next_start in zip(dirty, [s.base_offset for s in dirty[1:]] + [end], strict=True):
        aborted, ongoing, committed = canonical(state)
        expected.append((segment.base_offset, ([a for a in aborted if a[0] < next_start], ongoing, committed)))
        for chunk in cleaner._chunks(segment, segment.lookup_position(start), max_message_bytes):
            decisions.append(run_transactions(chunk, control_types(chunk), state).tolist())
    planned = cleaner.dirty_segments(ltc)
    assert [(segment.base_offset, canonical(s)) for segment, _, s in planned] == expected
    replayed = []
    for segment, _, s in planned:
        for chunk in cleaner._chunks(segment, segment.lookup_position(start), max_message_bytes):
            replayed.append(run_transactions(chunk, control_types(chunk), s).tolist())
    assert replayed == decisions

    # transaction_states: the state at the start of each group.
    groups = plan_groups(ltc, end)
    expected = _group_states_replayed(ltc, cleaner, groups)
    assert [canonical(s) for s in cleaner.transaction_states(ltc, groups)] == expected

    # The same states composed from the segments' summaries, as the Spark driver composes them;
    # on a log a broker wrote, every summary is there and fits (no segment is read again on the
    # driver).
    summaries = {key: summarize(the_log, next(s for s in the_log.segments if s.base_offset == key[0]), key[1])
                 for key in summaries_needed(the_log, start, end)}
    assert [(seg.base_offset, canonical(s)) for seg, _, s in cleaner.dirty_segments(ltc, summaries)] == [
        (seg.base_offset, canonical(s)) for seg, _, s in cleaner.dirty_segments(ltc)]
    assert [canonical(s) for s in cleaner.transaction_states(ltc, groups, summaries)] == expected
    assert not [r.getMessage() for r in caplog.records if "replaying its headers here" in r.getMessage()]


def test_a_batch_running_past_the_segment_end_is_corruption_naming_the_file(tmp_path: Path) -> None:
    ltc, _ = _planned(tmp_path, 1, 0.5, 64, 3000)
    segment = ltc.log.segments[0]
    with open(segment.log_path, "r+b") as f:
        f.truncate(segment.size - 7)
    with pytest.raises(CorruptRecordError, match=r"past the end of the segment") as e:
        list(segment.transaction_batches(0))
    assert str(segment.log_path) in str(e.value)


def test_the_planned_states_grow_with_the_aborted_transactions_not_with_segments_times_them(
        tmp_path: Path) -> None:
    """The plan holds one transaction state per dirty segment. Each copied every aborted
    transaction still to come, so the plan grew as segments x aborted transactions (here
    ~300 segments and ~60 aborted: thousands of entries); each now holds the ones its own
    batches can reach, about each transaction once."""
    ltc, cleaner = _planned(tmp_path, seed=5, transactions=1.0, segment_kb=64, records=150_000)
    aborted = ltc.log.collect_aborted_transactions(ltc.first_dirty_offset, ltc.first_uncleanable_offset)
    planned = cleaner.dirty_segments(ltc)
    assert len(planned) >= 100 and len(aborted) >= 40, (len(planned), len(aborted))
    held = sum(len(state._aborted) for _, _, state in planned)
    assert held <= len(aborted) + len(planned), (held, len(aborted), len(planned))


# -- summaries composed, on logs no producer would write ------------------------------------
# The generator above writes transactions as a broker's leader does. The composition's claim is
# wider: whatever the batches, markers and ``.txnindex`` entries, the composed state is the
# replayed one. So here producers interleave freely, markers come with or without data before
# them, aborted transactions begin in offset gaps (their first batch cleaned away) or below the
# segment of their marker, and segments roll anywhere.

_PRODUCER = st.integers(0, 2)
_EVENT = st.one_of(
    st.tuples(st.just("data"), _PRODUCER, st.sampled_from([True, True, True, False]), st.integers(1, 3)),
    st.tuples(st.just("marker"), _PRODUCER, st.sampled_from(["ABORT", "ABORT", "COMMIT"]), st.integers(0, 3)),
    st.tuples(st.just("roll"),),
    st.tuples(st.just("roll"),),
    st.tuples(st.just("gap"), st.integers(1, 3)),
)


def _adversarial_log(directory: Path, events: list[tuple], rng_first: list[int]) -> LogToClean:
    # Groups of one or two segments (plan_groups); every batch indexed, so that a first dirty
    # offset inside a segment starts its replay part-way (a summary from that position).
    config = LogConfig(segment_bytes=200, index_interval_bytes=1)
    log = Log.create(directory, config)
    offset, firsts, draws = 0, {}, iter(rng_first)
    for event in events:
        if event[0] == "gap":
            offset += event[1]
        elif event[0] == "roll":
            if log.active_segment is not None and log.active_segment.size:
                log.roll(offset)
        elif event[0] == "data":
            _, pid, transactional, n = event
            records = [Record(offset + i, NOW + offset + i, b"k%d" % (offset % 7), b"v") for i in range(n)]
            log.append(build_batch(records, producer_id=1000 + pid, producer_epoch=0, base_sequence=offset,
                                   is_transactional=transactional))
            if transactional:
                firsts.setdefault(pid, offset)
            offset += n
        else:
            _, pid, kind, how = event
            marker = ControlRecordType.ABORT if kind == "ABORT" else ControlRecordType.COMMIT
            log.append(build_control_batch(marker, offset=offset, producer_id=1000 + pid, producer_epoch=0,
                                           coordinator_epoch=1, timestamp=NOW + offset))
            # how 3 on a COMMIT: a stray marker, the transaction goes on
            first = firsts.get(pid) if marker == ControlRecordType.COMMIT and how == 3 else firsts.pop(pid, None)
            if marker == ControlRecordType.ABORT and how:
                # how 1: the txn's first batch; 2: an offset below it, maybe in a gap or an earlier
                # segment; 3: the marker itself (no data seen)
                start = first if first is not None else offset
                start = {1: start, 2: max(0, start - next(draws, 1)), 3: offset}[how]
                assert log.active_segment is not None
                log.active_segment.append_aborted_txn(AbortedTxn(1000 + pid, start, offset, start))
            offset += 1
    log.roll(offset)
    log.close()
    log = Log.open(directory, config)
    end = log.segments[-1].base_offset
    dirty = log.segments[len(log.segments) // 4]
    dirty_at = dirty.read_next_offset() - 1 if dirty.size else dirty.base_offset  # its last batch, if any
    return LogToClean(log, TopicPartition("t", 0), min(dirty_at, end), end)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(_EVENT, min_size=1, max_size=80), below=st.lists(st.integers(1, 12), max_size=30))
# A segment between the data of an aborted transaction and its ABORT touches its producer
# without ending it (a stray COMMIT): the batch seen before must still count at the ABORT.
@example(events=[("data", 0, True, 1), ("roll",), ("marker", 0, "COMMIT", 3), ("roll",), ("data", 1, False, 1),
                 ("roll",), ("marker", 0, "ABORT", 1), ("roll",), ("data", 1, False, 1)], below=[])
def test_composed_summaries_are_the_replayed_state_whatever_the_batches(
        tmp_path_factory: pytest.TempPathFactory, caplog: pytest.LogCaptureFixture, events: list[tuple],
        below: list[int]) -> None:
    caplog.clear()
    ltc = _adversarial_log(tmp_path_factory.mktemp("log") / "t-0", events, below)
    cleaner = planning_cleaner(parse_policy({"topics": [{"match": ".*", "cleanupPolicy": "compact"}]}).cleaner,
                               FixedTime(NOW))
    the_log, start, end = ltc.log, ltc.first_dirty_offset, ltc.first_uncleanable_offset
    assume(start < end)  # the planner plans a round only then

    def replay(segment, position: int, state: CleanedTransactionMetadata) -> list[list[bool]]:  # type: ignore[no-untyped-def]
        return [run_transactions(chunk, control_types(chunk), state).tolist()
                for chunk in cleaner._chunks(segment, position, the_log.config.max_message_bytes)]

    # Each summary crosses a pickle, as from a Spark task to the driver.
    summaries = {key: pickle.loads(pickle.dumps(summarize(the_log, next(s for s in the_log.segments
                                                                         if s.base_offset == key[0]), key[1])))
                 for key in summaries_needed(the_log, start, end)}
    for given_summaries in (None, summaries):
        state = CleanedTransactionMetadata()
        state.add_aborted_transactions(the_log.collect_aborted_transactions(start, end))
        for segment, next_start, s in cleaner.dirty_segments(ltc, given_summaries):
            aborted, ongoing, committed = canonical(state)
            assert canonical(s) == ([a for a in aborted if a[0] < next_start], ongoing, committed)
            position = segment.lookup_position(start)
            assert replay(segment, position, s) == replay(segment, position, state)
        groups = plan_groups(ltc, end)
        expected = _group_states_replayed(ltc, cleaner, groups)
        assert [canonical(s) for s in cleaner.transaction_states(ltc, groups, given_summaries)] == expected
    assert not [r.getMessage() for r in caplog.records if "no summary was made" in r.getMessage()]
