"""A cleaning round split into two distributed phases (``compact-large``, and the dry run
behind ``report``'s reclaimable bytes).

Phase 1 - the offset map, built across executors. A map task reads a few segments with the
engine's ``Cleaner.segment_keys`` and sends, per reducer, one blob of numpy columns:

- the segment's *map keys* (dirty segments: the keys the single-node map build would put,
  under its transaction state), aggregated per key as (first offset, last offset);
- the segment's *lookup keys* (segments of the round's groups: every key of a data batch,
  which is what the rewrite may ask the map about; a superset is harmless, a lookup of a
  key the map holds returns the map's answer) as a sorted set.

Reducers own ranges of the digest space (``blocks.reducer_of``). Per partition they merge the map keys into key
-> (first, last) - the offset map - and intersect it with each group's lookup keys: the
group's *keep-list*, the only part of the map the group's rewrite needs.

The single-node map has a capacity (``OffsetMap.max_keys``, checked before every put) and
ends the round early when it is full (KAFKA_NOTES §9.2), so the end offset depends on it.
The driver reproduces that exactly: with K distinct map keys and capacity C, if K >= C the
map fills at the C-th smallest first-occurrence offset F, and the first refused put is the
next map key after F; likewise for the first key past the map's 32-bit offset range. The
end offset follows Kafka's rule (the latest of: the previous segment's end, the last
offset of every batch completed before the refused key, the last put key), the groups
and transaction states are planned again for it, and those rounds run again with the map cut
at the refused key - from the first job's phase-1 output, less the segments that reach the cut,
of which only the one it falls in is read again (``cut_rows``).

Phase 2 - the groups, rewritten in parallel. Each task runs the engine's
``Cleaner.clean_segments`` for its group with the keep-list as the round's map and the
group's transaction state from the engine's header replay, writing a ``.cleaned``
segment (offsets kept) into an attempt directory that is renamed into the run's staging
area (or, for a dry run, measured and deleted).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
import time as _time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cleaner.clock import SYSTEM_TIME, FixedTime
from cleaner.config import TopicRule
from cleaner.engine.cleaner import Cleaner, LogToClean, Round
from cleaner.engine.manager import log_config_for
from cleaner.engine.offset_map import OffsetMap
from cleaner.engine.stats import CleanerStats
from cleaner.engine.throttler import Throttler
from cleaner.engine.transaction_summary import SegmentTransactions, Summaries, summarize
from cleaner.engine.transactions import CleanedTransactionMetadata
from cleaner.errors import KafkaCleanerError
from cleaner.storage.log import Log
from cleaner.storage.segment import LogSegment

from . import blocks
from .blocks import KeepList, KeyOffsets, KeySet
from .plan import (
    MAX_IO_BUFFER_SIZE,
    PartitionRef,
    RoundPlan,
    SegmentRef,
    StalePlanError,
    log_to_clean_of,
    open_planned_log,
    segments_by_base,
    set_end_offset,
    transaction_state,
)
from .session import task_io_rate
from .spill import REDUCER_MEMORY_CONF, REDUCER_MEMORY_DEFAULT, ReducerInput
from .staging import RunDir, finish_attempt, maybe_fail, new_attempt_dir


@dataclass
class KeyScope:
    """A partition phase 1 reads: for a round (``round``) and/or to count its distinct keys
    over the whole log (``count_keys``, the report)."""

    index: int
    ref: PartitionRef
    rule: TopicRule
    log_start_offset: int
    segments: list[SegmentRef]
    count_keys: bool
    round: RoundPlan | None = None
    cutoff: int | None = None
    """Map keys at or above this offset are left out (the single-node map refused them)."""
    capacity_checked: bool = False
    """The map's capacity was already applied (the cutoff, if any, is where it fills up)."""


@dataclass
class TaskTimes:
    """Per unit of work (map: a segment; reduce: a reducer; rewrite: a group), its wall time
    and the CPU time of its Python worker: how the phases scale is read from these (the CPU
    sum is the work; wall sum / phase time is how many units ran at once; CPU / wall is the
    share of a core a unit got)."""

    map: list[float] = field(default_factory=list)
    reduce: list[float] = field(default_factory=list)
    rewrite: list[float] = field(default_factory=list)
    map_cpu: list[float] = field(default_factory=list)
    reduce_cpu: list[float] = field(default_factory=list)
    rewrite_cpu: list[float] = field(default_factory=list)
    reduce_passes: list[int] = field(default_factory=list)
    """Per reducer, the digest sub-ranges it worked through (1: its input fit in
    ``spark.kafkaCleaner.reducerMemory``; more: it spilled, ``spill``)."""
    map_segment: list[int] = field(default_factory=list)
    """Per map unit, the base offset of the segment it read: phase 1 reads each segment once,
    and a round cut short by a full map reads again only the segment the cut falls in."""


class _Clock:
    """A task's wall and CPU time, reported to the job's accumulator."""

    def __init__(self, kind: str, times: Any) -> None:
        self.kind, self.times = kind, times
        self.wall, self.cpu = _time.perf_counter(), _time.process_time()

    def done(self, **more: int) -> float:
        """Report the unit; ``more``: other figures of it (``passes=3``: ``reduce_passes``)."""
        wall = _time.perf_counter() - self.wall
        if self.times is not None:
            self.times.add(
                {
                    self.kind: [wall],
                    f"{self.kind}_cpu": [_time.process_time() - self.cpu],
                    f"{self.kind}_end": [_time.time()],
                    **{f"{self.kind}_{name}": [value] for name, value in more.items()},
                }
            )
        return wall


@dataclass
class RoundsOutcome:
    distinct_keys: dict[int, int | None] = field(default_factory=dict)
    """Per scope index with ``count_keys``: distinct keys of the log (None: unreadable)."""
    map_keys: dict[int, int] = field(default_factory=dict)
    """Per round: keys in the round's offset map."""
    groups: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    """Per round: each group's rewrite result, in group order."""
    seconds: dict[str, float] = field(default_factory=dict)
    tasks: TaskTimes = field(default_factory=TaskTimes)


# -- helpers shared by the tasks -------------------------------------------------------------


def task_cleaner(io_buffer_size: int, max_io_buffer_size: int, io_rate: float | None, now: int) -> Cleaner:
    """An engine cleaner for one task: a thread's buffers; the round's map is a keep-list
    (the token map here is never used)."""
    time = FixedTime(now)
    return Cleaner(0, OffsetMap(1024), io_buffer_size, max_io_buffer_size, Throttler(io_rate, time), time)


def _open(scope: KeyScope, bases: Sequence[int]) -> Log:
    """The scope's partition, where the segments ``bases`` are read record by record."""
    if scope.round is not None:
        return open_planned_log(scope.round, bases)
    path = scope.ref.localized().path
    return Log.open(path, log_config_for(scope.rule), log_start_offset=scope.log_start_offset, read_only=True)


def lookup_keys(cleaner: Cleaner, log: Log, segment: LogSegment) -> tuple[np.ndarray, np.ndarray]:
    """Every key of the segment's data batches (any offset, aborted or not): the engine's
    ``segment_keys`` from the segment's start with a transaction state that knows of no
    aborted transaction."""
    ltc = LogToClean(log, log.topic_partition, segment.base_offset, segment.base_offset)
    return cleaner.segment_keys(ltc, segment, CleanedTransactionMetadata())


def _slices_by_reducer(hi: np.ndarray, reducers: int) -> list[tuple[int, int, int]]:
    """(reducer, start, end) runs of sorted digests."""
    if hi.size == 0:
        return []
    r = blocks.reducer_of(hi, reducers)
    bounds = np.searchsorted(r, np.arange(reducers + 1), side="left")
    return [(k, int(bounds[k]), int(bounds[k + 1])) for k in range(reducers) if bounds[k + 1] > bounds[k]]


#: Spark configuration: the log bytes one task reads (phase 1) or rewrites (phase 2), and the
#: log bytes (read by phase 1) whose keys one reducer merges. Parallelism follows the data: at least
#: these many tasks, and never fewer than the cluster's cores at submit time (a small job
#: still uses them all).
TASK_BYTES_CONF, TASK_BYTES_DEFAULT = "spark.kafkaCleaner.taskBytes", "256m"
REDUCER_BYTES_CONF, REDUCER_BYTES_DEFAULT = "spark.kafkaCleaner.reducerBytes", "1g"


def sized(sc: Any, total_bytes: int, conf: str, default: str, least: int) -> int:
    """How many tasks for ``total_bytes`` of work: one per ``conf`` bytes (a Spark size:
    ``256m``, ``1g``), at least ``least``."""
    per_task = max(int(sc._jsc.sc().conf().getSizeAsBytes(conf, default)), 1)
    return max(least, -(-total_bytes // per_task))


def reducer_memory(sc: Any) -> int:
    """Each reducer's input held in memory before it spills (``spill``)."""
    return max(int(sc._jsc.sc().conf().getSizeAsBytes(REDUCER_MEMORY_CONF, REDUCER_MEMORY_DEFAULT)), 1)


def balance(items: Sequence[tuple[Any, int]], slices: int) -> list[list[Any]]:
    """Items spread over at most ``slices`` lists of about equal total weight (largest
    first onto the lightest list); each list keeps the items' original order."""
    slices = max(1, min(slices, len(items)))
    loads = [0] * slices
    members: list[list[int]] = [[] for _ in range(slices)]
    for pos in sorted(range(len(items)), key=lambda k: -items[k][1]):
        target = loads.index(min(loads))
        loads[target] += max(items[pos][1], 1)
        members[target].append(pos)
    return [[items[p][0] for p in sorted(m)] for m in members if m]


# -- before phase 1: the transaction states, from the segments' headers ---------------------


def transaction_summaries(
    spark: Any,
    ref: PartitionRef,
    rule: TopicRule,
    log_start_offset: int,
    segments: Sequence[SegmentRef],
    wanted: Sequence[tuple[int, int]],
    io_rate: float | None,
) -> Summaries:
    """The transaction summaries ``wanted`` (``transaction_summary.summaries_needed``: (base
    offset, position)), read by tasks where the segments are, a few bytes a transactional
    batch: the driver composes the round's transaction states from them and reads no batch
    itself. Tasks are sized by the bytes of their segments (``spark.kafkaCleaner.taskBytes``);
    a segment that is not the one the driver listed fails the job (``StalePlanError``)."""
    sc = spark.sparkContext
    listed = {s.base: s for s in segments}
    weighted = [(key, listed[key[0]].size) for key in wanted]
    slices = balance(weighted, sized(sc, sum(w for _, w in weighted), TASK_BYTES_CONF, TASK_BYTES_DEFAULT, 1))
    rate = task_io_rate(sc, io_rate)

    def summarize_slice(keys: list[tuple[int, int]]) -> Iterator[tuple[tuple[int, int], SegmentTransactions]]:
        local = ref.localized_for(base for base, _ in keys)
        log = Log.open(local.path, log_config_for(rule), log_start_offset=log_start_offset, read_only=True)
        found = {s.base_offset: s for s in log.segments}
        throttle = Throttler(rate, SYSTEM_TIME).maybe_throttle
        for base, position in keys:
            segment = found.get(base)
            seen = None if segment is None else SegmentRef(base, segment.size, segment.last_modified_ms)
            if segment is None or seen != listed[base]:
                raise StalePlanError(
                    f"{ref.path}: segment {base} changed since it was listed ({listed[base]} -> {seen})"
                )
            yield (base, position), summarize(log, segment, position, throttle)

    if not slices:
        return {}
    return dict(sc.parallelize(slices, len(slices)).flatMap(summarize_slice).collect())


# -- phase 1: map side -----------------------------------------------------------------------


def key_tasks(scopes: Sequence[KeyScope]) -> list[tuple[tuple[int, int], int]]:
    """((scope, segment index), bytes) of every segment phase 1 must read."""
    out = []
    for scope in scopes:
        wanted: set[int] = set(range(len(scope.segments))) if scope.count_keys else set()
        plan = scope.round
        if plan is not None:
            for members in plan.groups:
                wanted.update(members)
            wanted.update(s for s, _, _ in plan.dirty if plan.segments[s].base < plan.end_offset)
        out.extend(((scope.index, s), scope.segments[s].size) for s in sorted(wanted))
    return out


def map_slice(
    tasks: list[tuple[int, int]], scopes: Mapping[int, KeyScope], reducers: int, faults: Mapping | None, times: Any
) -> Iterator[tuple[int, tuple[int, int, int, int, bytes]]]:
    """One map task: its segments' key blocks, keyed by reducer (timed per segment: the
    unit of phase 1's work)."""
    maybe_fail(faults, "phase1")
    logs: dict[int, Log] = {}
    for i, s in tasks:
        clock = _Clock("map", times)
        scope = scopes[i]
        if i not in logs:
            logs[i] = _open(scope, [scope.segments[s].base for j, s in tasks if j == i])
        out = list(_map_segment(scope, s, logs[i], reducers))
        clock.done(segment=scope.segments[s].base)
        yield from out


# Flags of a map task's block.
COUNTED = 1  # the lookup keys count towards the partition's distinct keys
LOOKUP = 2  # the block holds the segment's lookup keys (mhi, mlo)
MAPPED = 4  # the block holds the segment's map keys (khi, klo, kfirst, klast)
LOOKUP_IS_MAPPED = 8  # the lookup keys are exactly the map keys (sent once)
UNREADABLE = 16  # the segment could not be read (its partition's key count is unknown)


def _map_segment(
    scope: KeyScope, s: int, log: Log, reducers: int
) -> Iterator[tuple[int, tuple[int, int, int, int, bytes]]]:
    plan = scope.round
    ref = scope.segments[s]
    segment = segments_by_base(log, [ref.base])[0]
    group = plan.segment_group().get(s, -1) if plan is not None else -1
    dirty = {seg: (nxt, state) for seg, nxt, state in plan.dirty} if plan is not None else {}
    is_dirty = s in dirty
    if plan is not None:
        cleaner = task_cleaner(plan.io_buffer_size, plan.max_io_buffer_size, plan.io_max_bytes_per_second, plan.now)
    else:
        cleaner = task_cleaner(1 << 20, MAX_IO_BUFFER_SIZE, None, 0)
    own_pass = plan is not None and plan.map_keys_need_own_pass
    want_lookup = scope.count_keys or group >= 0
    keys: tuple[np.ndarray, np.ndarray] | None = None
    if want_lookup or (is_dirty and not own_pass):
        try:
            keys = lookup_keys(cleaner, log, segment)
        except (KafkaCleanerError, OSError):
            if group >= 0 or is_dirty:
                raise
            # A segment outside the round that cannot be read (a live broker's active
            # segment with a batch half written): its partition's key count is unknown.
            yield 0, (scope.index, s, -1, UNREADABLE, b"")
            return
    flags = COUNTED if scope.count_keys else 0
    mapped = None
    if is_dirty:
        assert plan is not None
        if own_pass or keys is None:
            ltc = log_to_clean_of(plan, log)
            digests, offsets = cleaner.segment_keys(ltc, segment, transaction_state(dirty[s][1]))
        else:
            keep = keys[1] >= plan.first_dirty_offset
            digests, offsets = keys[0][keep], keys[1][keep]
            if want_lookup and keep.all() and scope.cutoff is None:
                flags |= LOOKUP_IS_MAPPED
        if scope.cutoff is not None:
            keep = offsets < scope.cutoff
            digests, offsets = digests[keep], offsets[keep]
        hi, lo = blocks.split(digests)
        mapped = KeyOffsets.of(hi, lo, offsets, offsets)
        flags |= MAPPED
    member = None
    if want_lookup and not flags & LOOKUP_IS_MAPPED:
        assert keys is not None
        member = KeySet.of(*blocks.split(keys[0]))
        flags |= LOOKUP
    runs: dict[int, dict[str, np.ndarray]] = defaultdict(dict)
    if member is not None:
        for r, a, b in _slices_by_reducer(member.hi, reducers):
            runs[r].update(mhi=member.hi[a:b], mlo=member.lo[a:b])
    if mapped is not None:
        for r, a, b in _slices_by_reducer(mapped.hi, reducers):
            runs[r].update(khi=mapped.hi[a:b], klo=mapped.lo[a:b], kfirst=mapped.first[a:b], klast=mapped.last[a:b])
    for r, arrays in runs.items():
        yield r, (scope.index, s, group, flags, blocks.pack(**arrays))


# -- phase 1: reduce side --------------------------------------------------------------------


FIRSTS_SLICE = -1
"""The slice of a reducer's first-occurrence offsets: none. They stay in the reducers' kept
output (``_round_job``) for the driver's map-full cut."""


@dataclass(frozen=True)
class Layout:
    """Where the reducers send their results: the phase 2 slice (task) of each group and
    the slices holding each round's groups. Slice 0 also receives the key counts."""

    slice_of: dict[tuple[int, int], int]
    round_slices: dict[int, list[int]]


def _gather(
    items: Iterable[tuple[int, tuple[int, int, int, int, bytes]]],
) -> tuple[dict[int, dict[int, list[KeySet]]], dict[int, list[KeySet]], dict[int, list[KeyOffsets]], set[int]]:
    members: dict[int, dict[int, list[KeySet]]] = defaultdict(lambda: defaultdict(list))
    counted: dict[int, list[KeySet]] = defaultdict(list)
    mapped: dict[int, list[KeyOffsets]] = defaultdict(list)
    unreadable: set[int] = set()
    for _, (i, _s, group, flags, blob) in items:
        if flags & UNREADABLE:
            unreadable.add(i)
            continue
        arrays = blocks.unpack(blob)  # a reducer's share: some of the flagged columns may be absent
        keyset = None
        if "khi" in arrays:
            part = KeyOffsets(arrays["khi"], arrays["klo"], arrays["kfirst"], arrays["klast"])
            mapped[i].append(part)
            if flags & LOOKUP_IS_MAPPED:
                keyset = part.keys
        if "mhi" in arrays:
            keyset = KeySet(arrays["mhi"], arrays["mlo"])
        if keyset is not None:
            if group >= 0:
                members[i][group].append(keyset)
            if flags & COUNTED:
                counted[i].append(keyset)
    return members, counted, mapped, unreadable


def map_offsets_end(scope: KeyScope) -> int | None:
    """An offset past every offset the round's map can hold: the base of the segment after the
    dirty ones (Kafka's segments do not overlap), or the cutoff if lower. None when no segment
    follows them (nothing bounds them then)."""
    plan = scope.round
    assert plan is not None and plan.dirty
    following = plan.dirty[-1][0] + 1  # dirty segments are indexes into the plan's segments
    if following >= len(plan.segments):
        return None
    end = plan.segments[following].base
    return end if scope.cutoff is None else min(end, scope.cutoff)


def may_fill(scope: KeyScope) -> bool:
    """Whether the round's offset map could fill up: its capacity not yet applied, and its
    dirty section holding at least as many offsets as the map holds keys."""
    plan = scope.round
    if plan is None or scope.capacity_checked or not plan.dirty:
        return False
    end = map_offsets_end(scope)
    return end is None or end - plan.first_dirty_offset >= plan.max_keys


def reduce_part(
    reducer: int,
    items: Iterable[tuple[int, tuple[int, int, int, int, bytes]]],
    scopes: Mapping[int, KeyScope],
    layout: Layout,
    times: Any,
    reducers: int,
    memory_bytes: int,
) -> Iterator[tuple[tuple[int, str, int, int], Any]]:
    """One reducer: per partition, its share of the offset map, of the distinct keys and of
    every group's keep-list, keyed by the phase 2 slice they go to. Every reducer reports
    its map size to every slice of the round, so a slice knows the map's full size. For a
    round whose map may fill up (``may_fill``), also its share of the map's first-occurrence
    offsets (``"firsts"``, kept for the map-full cut, never sent to phase 2).
    Past ``memory_bytes`` of input, the input is spilled and worked through one digest
    sub-range at a time (``spill``): the same keys, keep-lists and counts, in more parts."""
    clock = _Clock("reduce", times)
    filling = {i for i, scope in scopes.items() if may_fill(scope)}
    sizes: dict[int, int] = defaultdict(int)
    counts: dict[int, int | None] = defaultdict(int)
    with ReducerInput(reducer, reducers, memory_bytes).add_all(items) as received:
        passes = received.passes
        for part in received.sub_ranges():
            members, counted, mapped, unreadable = _gather(part)
            for i, scope in sorted(scopes.items()):
                if scope.count_keys:
                    known = counts[i]
                    counts[i] = None if i in unreadable or known is None else known + len(
                        KeySet.union(counted.get(i, [])))
                if scope.round is None:
                    continue
                the_map = KeyOffsets.merge(mapped.get(i, []))
                if i in filling:
                    yield (FIRSTS_SLICE, "firsts", i, reducer), blocks.pack(first=the_map.first)
                sizes[i] += len(the_map)
                for g, sets in sorted(members.get(i, {}).items()):
                    keys = KeySet.union(sets)
                    idx = the_map.keys.find(keys.hi, keys.lo)
                    hit = idx >= 0
                    if hit.any():
                        blob = blocks.pack(hi=keys.hi[hit], lo=keys.lo[hit], offset=the_map.last[idx[hit]])
                        yield (layout.slice_of[(i, g)], "keep", i, g), (reducer, blob)
    for i, scope in sorted(scopes.items()):
        if scope.count_keys:
            yield (0, "count", i, reducer), counts[i]
        if scope.round is not None:
            for n in layout.round_slices[i]:
                yield (n, "size", i, reducer), sizes[i]
    if reducer == 0:
        for (i, g), n in layout.slice_of.items():  # every group gets its task, keep-list or not
            yield (n, "group", i, g), None
    clock.done(passes=passes)


# -- the map's end: where the single-node map would fill up ----------------------------------


def map_stop(plan: RoundPlan, log: Log, cleaner: Cleaner, after: int) -> tuple[int, int] | None:
    """The first key the single-node map build puts at an offset > ``after`` - the put it
    would refuse - and the round's end offset that follows (Kafka's ``latestOffset + 1``
    when the build stops there, §9.2). None if no key comes after ``after``."""
    ltc = log_to_clean_of(plan, log)
    start = plan.first_dirty_offset
    for pos, (s, next_start, blob) in enumerate(plan.dirty):
        if next_start - 1 <= after:
            continue
        plan.ref.localized_for([plan.segments[s].base])  # read whole below (from object storage: fetched now)
        segment = segments_by_base(log, [plan.segments[s].base])[0]
        _, offsets = cleaner.segment_keys(ltc, segment, transaction_state(blob))
        later = offsets[offsets > after]
        if later.size == 0:
            continue
        stop = int(later[0])
        latest = segment.base_offset - 1 if pos > 0 else -1
        before = offsets[offsets < stop]
        if before.size:
            latest = max(latest, int(before.max()))
        for chunk in segment.iter_batches():
            lasts = chunk.last_offsets
            done = lasts[(lasts >= start) & (lasts < stop)]
            if done.size:
                latest = max(latest, int(done.max()))
        return stop, latest + 1
    return None


def _kth_smallest(parts: list[np.ndarray], k: int) -> int:
    values = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return int(np.partition(values, k - 1)[k - 1])


# -- the driver ------------------------------------------------------------------------------


def _list_accumulator(sc: Any) -> Any:
    from pyspark.accumulators import AccumulatorParam

    class _Lists(AccumulatorParam):
        def zero(self, value: dict) -> dict:
            return {}

        def addInPlace(self, a: dict, b: dict) -> dict:
            for k, v in b.items():
                a.setdefault(k, []).extend(v)
            return a

    return sc.accumulator({}, _Lists())


def by_reducer(reducer: int) -> int:
    """Phase 1's partitioner: a row's key is its reducer. One function object, so that two
    RDDs partitioned by it compare equal and their union stays partitioned (``_cut_keys``)."""
    return reducer


def _keys_by_reducer(
    sc: Any, scopes: list[KeyScope], reducers: int, faults: Mapping | None, acc: Any,
    tasks: list[tuple[tuple[int, int], int]] | None = None,
) -> Any:  # fmt: skip
    """Phase 1's map stage, shuffled to the reducers (digest-space partitions): of every
    segment the scopes need, or of ``tasks`` only. The result is the phase-1 output a round's
    later jobs reuse: Spark keeps a shuffle's files while its RDD is referenced and skips the
    map stage of any later job that reads it (an executor lost since recomputes its part)."""
    tasks = key_tasks(scopes) if tasks is None else tasks
    shared = sc.broadcast({s.index: s for s in scopes})
    count = sized(sc, sum(size for _, size in tasks), TASK_BYTES_CONF, TASK_BYTES_DEFAULT, sc.defaultParallelism * 2)
    slices = balance(tasks, count) or [[]]
    return (
        sc.parallelize(slices, len(slices))
        .flatMap(lambda sl: map_slice(sl, shared.value, reducers, faults, acc))
        .partitionBy(reducers, by_reducer)
    )


def cut_rows(
    rows: Iterable[tuple[int, tuple[int, int, int, int, bytes]]],
    scopes: Mapping[int, KeyScope],
    cutoffs: Mapping[int, int],
) -> Iterator[tuple[int, tuple[int, int, int, int, bytes]]]:
    """The phase-1 rows a round cut short by a full map still needs, from the rows its first
    job shuffled: its own partitions' rows, each with its segment's group in the cut round,
    less the rows of dirty segments that reach the cut (``cutoffs``: per scope, its new
    map cutoff) - the segments past it and the one it falls in, read again, cut."""
    groups = {i: scope.round.segment_group() for i, scope in scopes.items() if scope.round is not None}
    ends = {i: {s: nxt for s, nxt, _ in scope.round.dirty} for i, scope in scopes.items() if scope.round is not None}
    for reducer, (i, s, _group, flags, blob) in rows:
        if i not in groups:
            continue
        cutoff = cutoffs.get(i)
        if cutoff is not None and ends[i].get(s, 0) > cutoff:
            continue
        yield reducer, (i, s, groups[i].get(s, -1), flags, blob)


def _cut_keys(
    sc: Any, keys: Any, scopes: list[KeyScope], cutoffs: dict[int, int], reducers: int, faults: Mapping | None,
    acc: Any,
) -> Any:  # fmt: skip
    """Phase 1's output for rounds cut short by a full map: the first job's rows (``cut_rows``)
    and, read again with the cut, the segments the cut falls in - not the whole dirty section
    twice more, as when each job read its own."""
    shared = sc.broadcast({s.index: s for s in scopes})
    kept = keys.mapPartitions(lambda rows: cut_rows(rows, shared.value, cutoffs), preservesPartitioning=True)
    dropped = {
        (s.index, seg) for s in scopes if s.index in cutoffs and s.round is not None
        for seg, nxt, _ in s.round.dirty if nxt > cutoffs[s.index]
    }  # fmt: skip
    again = [task for task in key_tasks(scopes) if task[0] in dropped]
    if not again:
        return kept
    return kept.union(_keys_by_reducer(sc, scopes, reducers, faults, acc, again)).partitionBy(reducers, by_reducer)


def _round_job(
    sc: Any,
    scopes: list[KeyScope],
    keys: Any,
    reducers: int,
    run: RunDir | None,
    faults: Mapping | None,
    acc: Any,
) -> tuple[list[dict[str, Any]], Any | None]:
    """One Spark job: phase 1's reduce over ``keys`` (its map stage's output,
    ``_keys_by_reducer``) and phase 2 (the groups' rewrites). Where a round's map may fill
    up (``may_fill``), the reducers' output is also kept (persisted, to memory and disk) and
    returned, so that the map-full cut reads their first-occurrence offsets without merging
    the shuffled keys again; the caller unpersists it."""
    groups = [
        ((s.index, g), s.round.group_source_bytes(g))
        for s in scopes
        if s.round is not None
        for g in range(len(s.round.groups))
    ]
    count = sized(sc, sum(size for _, size in groups), TASK_BYTES_CONF, TASK_BYTES_DEFAULT, sc.defaultParallelism * 2)
    slices = balance(groups, count) or [[]]
    slice_of = {key: n for n, members in enumerate(slices) for key in members}
    round_slices: dict[int, list[int]] = defaultdict(list)
    for (i, _), n in sorted(slice_of.items()):
        if n not in round_slices[i]:
            round_slices[i].append(n)
    layout = sc.broadcast(Layout(slice_of, dict(round_slices)))
    shared = sc.broadcast({s.index: s for s in scopes})
    run_root = (str(run.root), run.id) if run is not None else None
    memory = reducer_memory(sc)
    reduced = keys.mapPartitionsWithIndex(
        lambda r, it: reduce_part(r, it, shared.value, layout.value, acc, reducers, memory)
    )
    kept = None
    if any(may_fill(s) for s in scopes):
        from pyspark import StorageLevel

        kept = reduced = reduced.persist(StorageLevel.MEMORY_AND_DISK)
        reduced = reduced.filter(lambda row: row[0][0] != FIRSTS_SLICE)
    rows = (
        reduced.partitionBy(len(slices), lambda key: key[0])
        .mapPartitionsWithIndex(lambda n, it: rewrite_slice(n, it, shared.value, reducers, run_root, faults, acc))
        .collect()
    )
    return rows, kept


#: The map-full cut: bins of a histogram round, and the most first offsets the driver takes.
HISTOGRAM_BINS = 4096
MAX_COLLECTED_OFFSETS = 1 << 16


def _inside(first: np.ndarray, lo: int, hi: int) -> np.ndarray:
    return first[(first >= lo) & (first < hi)]


def _histogram(first: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Counts of ``first`` in HISTOGRAM_BINS equal offset bins of [lo, hi)."""
    inside = _inside(first, lo, hi)
    width = -(-(hi - lo) // HISTOGRAM_BINS)
    return np.bincount((inside - lo) // width, minlength=HISTOGRAM_BINS)[:HISTOGRAM_BINS]


Ranges = Mapping[int, tuple[int, int]]
"""Per round (its scope's index), an offset range [lo, hi)."""


def kth_smallest_by_histograms(
    wanted: Mapping[int, tuple[int, int, int]],
    histograms: Callable[[Ranges], Mapping[int, np.ndarray]],
    collect: Callable[[Ranges], Mapping[int, list[np.ndarray]]],
) -> dict[int, int | None]:
    """Per round i of ``wanted`` (i -> (k, lo, hi)), the k-th smallest (1-based) of its
    distributed offsets in [lo, hi), or None if the range holds fewer than k. Every round at
    once: ``histograms(ranges)`` counts each round's offsets in HISTOGRAM_BINS equal bins of its
    range (one pass over all of them), and the driver narrows each round down to the bin
    holding its k-th until that bin holds at most MAX_COLLECTED_OFFSETS (or is one offset
    wide); then ``collect(ranges)`` takes only those bins' offsets, in one more pass."""
    out: dict[int, int | None] = {}
    narrowing = dict(wanted)
    final: dict[int, tuple[int, int, int]] = {}
    while narrowing:
        counts_of = histograms({i: (lo, hi) for i, (_, lo, hi) in narrowing.items()})
        for i, (k, lo, hi) in list(narrowing.items()):
            del narrowing[i]
            counts = counts_of.get(i, np.zeros(HISTOGRAM_BINS, dtype=np.int64))
            cumulative = np.cumsum(counts)
            if cumulative[-1] < k:
                out[i] = None
                continue
            b = int(np.searchsorted(cumulative, k))  # the bin where the count reaches k
            width = -(-(hi - lo) // HISTOGRAM_BINS)
            lo, hi, k = lo + b * width, min(lo + (b + 1) * width, hi), k - (int(cumulative[b - 1]) if b else 0)
            if counts[b] <= MAX_COLLECTED_OFFSETS or width == 1:
                final[i] = (k, lo, hi)
            else:
                narrowing[i] = (k, lo, hi)
    if final:
        parts_of = collect({i: (lo, hi) for i, (_, lo, hi) in final.items()})
        out.update({i: _kth_smallest(parts_of.get(i, []), k) for i, (k, _, _) in final.items()})
    return out


def kth_smallest_below(
    wanted: Mapping[int, tuple[int, int, int | None]],
    measure_ends: Callable[[list[int]], Mapping[int, int]],
    histograms: Callable[[Ranges], Mapping[int, np.ndarray]],
    collect: Callable[[Ranges], Mapping[int, list[np.ndarray]]],
) -> dict[int, int]:
    """``kth_smallest_by_histograms`` of each round's offsets at or above ``lo``, below its
    ``bound`` (i -> (k, lo, bound)) if that holds at least k of them: one pass fewer than
    measuring their ends first (``measure_ends``). A bound that holds fewer (offsets past it:
    segments that overlap, which Kafka does not write) or no bound at all: over [lo, the
    measured end)."""
    found = kth_smallest_by_histograms(
        {i: (k, lo, bound) for i, (k, lo, bound) in wanted.items() if bound is not None}, histograms, collect
    )
    unbounded = sorted(i for i in wanted if found.get(i) is None)
    if unbounded:
        ends = measure_ends(unbounded)
        found.update(kth_smallest_by_histograms(
            {i: (wanted[i][0], wanted[i][1], ends[i]) for i in unbounded}, histograms, collect))  # fmt: skip
    short = {i: wanted[i][0] for i in wanted if found.get(i) is None}
    if short:
        raise ValueError(f"rounds {sorted(short)}: fewer first offsets than the map holds keys (k = {short})")
    return {i: int(v) for i, v in found.items() if v is not None}


def _merge_arrays(a: dict[int, np.ndarray], b: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    for i, counts in b.items():
        a[i] = a[i] + counts if i in a else counts
    return a


def _merge_ends(a: dict[int, int], b: dict[int, int]) -> dict[int, int]:
    for i, end in b.items():
        a[i] = max(a.get(i, 0), end)
    return a


def _kth_first_offsets(scopes: list[KeyScope], reduced: Any) -> dict:
    """Per round, the ``max_keys``-th smallest first-occurrence offset of its map's keys: where
    the single-node map fills up (the map-full case). ``reduced``: the round job's kept reducer
    output, holding each reducer's share of the first offsets; the driver narrows every round
    down at once on histograms of them (HISTOGRAM_BINS counts per reducer and round a look)
    until the bin holding the k-th has at most MAX_COLLECTED_OFFSETS, and takes only those:
    never a key's worth of anything per key, so ``spark.driver.maxResultSize`` bounds nothing
    here; and a few jobs however many partitions' maps fill up."""
    firsts = reduced.filter(lambda row: row[0][1] == "firsts").map(
        lambda row: (row[0][2], blocks.unpack(row[1])["first"])
    )

    def histograms(ranges: Ranges) -> Mapping[int, np.ndarray]:
        mine = firsts.filter(lambda kv: kv[0] in ranges)
        return mine.map(lambda kv: {kv[0]: _histogram(kv[1], *ranges[kv[0]])}).fold({}, _merge_arrays)

    def collect(ranges: Ranges) -> Mapping[int, list[np.ndarray]]:
        mine = firsts.filter(lambda kv: kv[0] in ranges)
        parts: dict[int, list[np.ndarray]] = defaultdict(list)
        for i, a in mine.map(lambda kv: (kv[0], _inside(kv[1], *ranges[kv[0]]))).collect():
            parts[i].append(a)
        return parts

    def measure_ends(rounds: list[int]) -> Mapping[int, int]:
        chosen = set(rounds)
        mine = firsts.filter(lambda kv: kv[0] in chosen)
        return mine.map(lambda kv: {kv[0]: int(kv[1].max()) + 1 if len(kv[1]) else 0}).fold({}, _merge_ends)

    wanted = {}
    for scope in scopes:
        plan = scope.round
        assert plan is not None
        wanted[scope.index] = (plan.max_keys, plan.first_dirty_offset, map_offsets_end(scope))
    return kth_smallest_below(wanted, measure_ends, histograms, collect)


def _cut_at_offset_limit(scope: KeyScope) -> KeyScope:
    """A dirty section spanning more than the map's 32-bit offset range: the single-node
    map refuses the first key beyond it, so the round ends there at the latest."""
    plan = scope.round
    assert plan is not None
    if plan.first_uncleanable_offset - 1 <= plan.offset_limit:
        return scope
    log = open_planned_log(plan)
    cleaner = task_cleaner(plan.io_buffer_size, plan.max_io_buffer_size, None, plan.now)
    stop = map_stop(plan, log, cleaner, plan.offset_limit)
    if stop is None:
        return scope
    plan.map_stop_offset = stop[0]
    set_end_offset(plan, log_to_clean_of(plan, log), cleaner, stop[1])
    return dataclasses.replace(scope, cutoff=stop[0])


def run_rounds(
    spark: Any,
    scopes: list[KeyScope],
    *,
    run: RunDir | None,
    faults: Mapping | None = None,
    reducers: int | None = None,
) -> RoundsOutcome:
    """Phase 1 for every scope and phase 2 for every round, in one Spark job; where the
    single-node map would fill up, the round's end is computed and those rounds run again
    cut there. With ``run``, cleaned groups are staged in ``run.done``; without, a dry run."""
    sc = spark.sparkContext
    read = sum(size for _, size in key_tasks(scopes))  # what phase 1 reads: the keys the reducers merge
    reducers = reducers or sized(sc, read, REDUCER_BYTES_CONF, REDUCER_BYTES_DEFAULT, max(2, sc.defaultParallelism))
    out = RoundsOutcome()
    if not scopes:
        return out
    acc = _list_accumulator(sc)
    for scope in scopes:  # each executor's tasks share the policy's rate
        if scope.round is not None:
            scope.round.io_max_bytes_per_second = task_io_rate(sc, scope.round.io_max_bytes_per_second)
    scopes = [_cut_at_offset_limit(s) if s.round is not None else s for s in scopes]
    started = _time.time()
    keys = _keys_by_reducer(sc, scopes, reducers, faults, acc)
    rows, kept = _round_job(sc, scopes, keys, reducers, run, faults, acc)
    results: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row.get("summary"):
            for i, values in row["counts"].items():
                out.distinct_keys[i] = None if any(v is None for v in values) else sum(values)
        else:
            results[row["round"]].append(row)

    # Rounds whose map would have filled up: where exactly, from the kept reducer output of the
    # job above; then those rounds again, cut, from its phase-1 output.
    full = [s for s in scopes if s.round is not None and any(r.get("overflow") for r in results[s.index])]
    try:
        if full and kept is None:
            raise KafkaCleanerError(f"rounds {[s.index for s in full]}: a map filled up that could not (may_fill)")
        kth = _kth_first_offsets(full, kept) if full else {}
    finally:
        if kept is not None:
            kept.unpersist()
    if full:
        cut, cutoffs = [], {}
        for scope in full:
            plan = scope.round
            assert plan is not None
            log = open_planned_log(plan)
            cleaner = task_cleaner(plan.io_buffer_size, plan.max_io_buffer_size, None, plan.now)
            first_refused = kth[scope.index]
            stop = map_stop(plan, log, cleaner, first_refused)
            if stop is not None and (scope.cutoff is None or stop[0] < scope.cutoff):
                plan.map_stop_offset = stop[0]
                set_end_offset(plan, log_to_clean_of(plan, log), cleaner, stop[1])
                scope = dataclasses.replace(scope, cutoff=stop[0])
                cutoffs[scope.index] = stop[0]
            cut.append(dataclasses.replace(scope, count_keys=False, capacity_checked=True))
            del results[scope.index]
        cut_keys = _cut_keys(sc, keys, cut, cutoffs, reducers, faults, acc)
        for row in _round_job(sc, cut, cut_keys, reducers, run, faults, acc)[0]:
            if not row.get("summary"):
                results[row["round"]].append(row)
    ended = _time.time()

    for scope in scopes:
        if scope.round is not None:
            rows_of = sorted(results[scope.index], key=lambda r: r["group"])
            out.groups[scope.index] = rows_of
            out.map_keys[scope.index] = rows_of[0]["mapKeys"] if rows_of else 0
    times = acc.value
    out.tasks = TaskTimes(**{f.name: times.get(f.name, []) for f in dataclasses.fields(TaskTimes)})
    phase1_end = max(times.get("reduce_end", [started]))
    out.seconds["phase1"] = phase1_end - started
    out.seconds["phase2"] = ended - phase1_end
    return out


# -- phase 2 ---------------------------------------------------------------------------------


def group_done_dir(run: RunDir, plan: RoundPlan, g: int) -> Path:
    return run.done / f"p{plan.index}" / f"{plan.group_bases(g)[0]:020d}"


def rewrite_slice(
    n: int,
    items: Iterable[tuple[tuple[int, str, int, int], Any]],
    scopes: Mapping[int, KeyScope],
    reducers: int,
    run_root: tuple[str, str] | None,
    faults: Mapping | None,
    times: Any,
) -> Iterator[dict[str, Any]]:
    """One phase 2 task: its groups, each rewritten against its keep-list; the rounds'
    map sizes say first whether the single-node map would have filled up (then the group is
    left for the driver to cut the round)."""
    sizes: dict[int, list[int]] = defaultdict(list)
    counts: dict[int, list[int | None]] = defaultdict(list)
    keeps: dict[tuple[int, int], list[tuple[int, bytes]]] = defaultdict(list)
    groups: set[tuple[int, int]] = set()
    for (_, kind, i, x), value in items:
        if kind == "size":
            sizes[i].append(value)
        elif kind == "count":
            counts[i].append(value)
        elif kind == "keep":
            keeps[(i, x)].append(value)
        elif kind == "group":
            groups.add((i, x))
    run = RunDir(*run_root) if run_root is not None else None
    logs: dict[int, Log] = {}
    for i, g in sorted(groups):
        scope = scopes[i]
        plan = scope.round
        assert plan is not None
        if len(sizes[i]) != reducers:
            raise KafkaCleanerError(f"round {i}: map sizes from {len(sizes[i])} of {reducers} reducers")
        map_keys = sum(sizes[i])
        if not scope.capacity_checked and map_keys >= plan.max_keys:
            yield {"round": i, "group": g, "overflow": True, "mapKeys": map_keys}
            continue
        clock = _Clock("rewrite", times)
        # In reducer order the parts are sorted as a whole (reducers own digest ranges).
        blobs = [blob for _, blob in sorted(keeps[(i, g)], key=lambda rb: rb[0])]
        result = rewrite_group(plan, g, blobs, logs, run, faults)
        result["mapKeys"] = map_keys
        result["seconds"] = clock.done()
        yield result
    if n == 0:
        yield {"summary": True, "counts": dict(counts)}


def rewrite_group(
    plan: RoundPlan,
    g: int,
    blobs: list[bytes],
    logs: dict[int, Log],
    run: RunDir | None,
    faults: Mapping | None,
) -> dict[str, Any]:
    bases = plan.group_bases(g)
    final = group_done_dir(run, plan, g) if run is not None else None
    if final is not None and (final / "result.json").exists():
        result = json.loads((final / "result.json").read_text())
        result["reused"] = True
        return result
    if plan.index not in logs:
        logs[plan.index] = open_planned_log(plan, bases)
    else:
        plan.ref.localized_for(bases)  # this group's segments whole in the mirror the log reads
    log = logs[plan.index]
    ltc = log_to_clean_of(plan, log)
    cleaner = task_cleaner(plan.io_buffer_size, plan.max_io_buffer_size, plan.io_max_bytes_per_second, plan.now)
    lookup = KeepList.from_blobs(blobs, plan.end_offset - 1)
    stats = CleanerStats(cleaner.time)
    attempt = new_attempt_dir(run, f"p{plan.index}-{bases[0]}") if run is not None else Path(tempfile.mkdtemp())
    result: dict[str, Any] = {
        "round": plan.index,
        "group": g,
        "base": bases[0],
        "sourceSegments": bases,
        "sourceBytes": plan.group_source_bytes(g),
        "keepListKeys": len(lookup),
        "reused": False,
    }

    def commit(cleaned: LogSegment, group: list[LogSegment], generation: int) -> None:
        cleaned.close()
        result.update(
            cleanedBytes=cleaned.size,
            recordsRead=stats.messages_read,
            recordsWritten=stats.messages_written,
            tombstonesRemoved=stats.tombstones_removed,
            invalidRecords=stats.invalid_messages_read,
            bytesRead=stats.bytes_read,
            bytesWritten=stats.bytes_written,
            files=sorted(p.name for p in attempt.iterdir()),
        )
        maybe_fail(faults, "phase2")
        if final is None:
            shutil.rmtree(attempt, ignore_errors=True)
            return
        (attempt / "result.json").write_text(json.dumps(result))
        finish_attempt(attempt, final)

    rnd = Round(
        ltc, plan.now, plan.end_offset, plan.legacy_delete_horizon_ms, log.generation, lookup, stats, commit, attempt
    )
    try:
        cleaner.clean_segments(rnd, segments_by_base(log, bases), transaction_state(plan.group_states[g]))
    finally:
        if final is None:
            shutil.rmtree(attempt, ignore_errors=True)
    return result
