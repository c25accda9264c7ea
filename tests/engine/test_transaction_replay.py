"""The transaction state the Spark job plans with (``Cleaner.dirty_segments`` and
``Cleaner.transaction_states``) is replayed from batch headers only
(``LogSegment.transaction_batches``: the data batches' headers, the control batches whole).
It must be the state a replay of every byte gives, at every segment and group boundary: the
job's bytes depend on it. The reference here replays the whole log with the engine's own
reader (``Cleaner._chunks``), as the sequential clean reads it."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cleaner.clock import FixedTime
from cleaner.config import parse_policy
from cleaner.engine.cleaner import _run_transactions, control_types, plan_groups
from cleaner.engine.transactions import CleanedTransactionMetadata
from cleaner.errors import CorruptRecordError
from cleaner.generate import GeneratorConfig, generate
from cleaner.spark.plan import open_managed, partition_of_dir, planning_cleaner

NOW = 1_700_000_000_000


def canonical(state: CleanedTransactionMetadata) -> tuple:
    """What of a transaction state decides the clean: the aborted transactions still to come,
    those ongoing (and whether a batch of each was seen), the producers in a committed one."""
    return (sorted((first, txn) for first, _, txn in state._aborted),
            sorted((pid, a.txn, a.last_observed_batch_offset) for pid, a in state._ongoing_aborted.items()),
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


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**16), transactions=st.sampled_from([0.0, 0.2, 0.6, 1.0]),
       segment_kb=st.sampled_from([16, 64, 256]))
def test_header_only_replay_gives_the_state_of_a_whole_replay(tmp_path_factory: pytest.TempPathFactory, seed: int,
                                                             transactions: float, segment_kb: int) -> None:
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
            decisions.append(_run_transactions(chunk, control_types(chunk), state).tolist())
    planned = cleaner.dirty_segments(ltc)
    assert [(segment.base_offset, canonical(s)) for segment, _, s in planned] == expected
    replayed = []
    for segment, _, s in planned:
        for chunk in cleaner._chunks(segment, segment.lookup_position(start), max_message_bytes):
            replayed.append(_run_transactions(chunk, control_types(chunk), s).tolist())
    assert replayed == decisions

    # transaction_states: the state at the start of each group.
    groups = plan_groups(ltc, end)
    state, expected = CleanedTransactionMetadata(), []
    for group in groups:
        expected.append(canonical(copy.deepcopy(state)))
        for i, segment in enumerate(group):
            upper = group[i + 1].base_offset if i + 1 < len(group) else segment.read_next_offset()
            state.add_aborted_transactions(the_log.collect_aborted_transactions(segment.base_offset, upper))
            for chunk in cleaner._chunks(segment, 0, max_message_bytes):
                _run_transactions(chunk, control_types(chunk), state)
    assert [canonical(s) for s in cleaner.transaction_states(ltc, groups)] == expected


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
