"""What the Spark jobs know before they start: which partitions, their state, and - for a
round run in two distributed phases - everything the single-node round decides before it
reads a record (KAFKA_NOTES §6, §9.1).

A ``RoundPlan`` is computed with the engine's own functions (the manager's
``log_to_clean``, ``legacy_delete_horizon``, ``plan_groups``, the cleaner's
``dirty_segments`` and ``transaction_states``, composed from the segments' transaction
summaries, which the compact-large driver has its tasks read) and travels to the executors,
which open the same partition read-only and check that its segments are still the planned ones.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import pickle
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cleaner.clock import Time
from cleaner.config import CleanerConfig, Policy, TopicRule
from cleaner.engine.cleaner import Cleaner, LogToClean, legacy_delete_horizon, plan_groups
from cleaner.engine.log_cleaner import LogCleaner
from cleaner.engine.manager import LogCleanerManager, ManagedLog, log_config_for
from cleaner.engine.offset_map import OffsetMap
from cleaner.engine.throttler import Throttler
from cleaner.engine.transaction_summary import Summaries, summaries_needed
from cleaner.engine.transactions import CleanedTransactionMetadata
from cleaner.errors import KafkaCleanerError
from cleaner.storage.checkpoint import OFFSET_CHECKPOINT_FILES
from cleaner.storage.log import Log
from cleaner.storage.log_dir import CLEAN_SHUTDOWN_FILE, LogDirectory
from cleaner.storage.producer_state import ActiveProducer
from cleaner.storage.segment import LogSegment
from cleaner.storage.topic_partition import TopicPartition, parse_partition_dir

from .object_store import ObjectLogDir, fill, fingerprint, is_object_uri, mirror

MAX_IO_BUFFER_SIZE: int = inspect.signature(LogCleaner.__init__).parameters["max_message_bytes"].default
"""The cleaner's ``maxIoBufferSize`` as ``kafka-cleaner clean`` runs it (``LogCleaner``'s default,
Kafka's ``message.max.bytes``)."""

OFFSET_MAP_RELATIVE_LIMIT = 2**32 - 2
"""A round's map holds offsets up to first dirty offset + this (``OffsetMap.offset_limit``)."""


class StalePlanError(KafkaCleanerError):
    """The partition changed between planning and execution."""


class PartitionView(LogDirectory):
    """One partition of a log directory: a manager over it sees only that partition, so a
    Spark task plans or reports one partition without opening the others. Its root files
    (checkpoints, ``.kafka_cleanshutdown``) are the log dir's own. Never used to *write* a
    cleaner checkpoint: Kafka's update keeps only the partitions of the directory."""

    def __init__(self, path: str | os.PathLike[str], tp: TopicPartition, *, read_only: bool = True) -> None:
        super().__init__(path, read_only=read_only)
        self.tp = tp

    def partition_dirs(self) -> dict[TopicPartition, Path]:
        d = self.path / self.tp.dir_name
        return {self.tp: d} if d.is_dir() else {}


@dataclass(frozen=True, order=True)
class PartitionRef:
    """A partition directory of one input log dir."""

    root: str
    """The log dir, absolute, or an object-storage log dir (``s3://bucket/prefix``)."""
    topic: str
    partition: int

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def path(self) -> Path:
        return Path(self.root) / self.tp.dir_name

    @property
    def in_object_storage(self) -> bool:
        return is_object_uri(self.root)

    def localized(self, *, hollow: bool = False) -> PartitionRef:
        """This partition where the engine can open it: itself, or (object storage) the
        mirror of its log dir's root files and its own objects on this host's disk, made
        once per listing (``object_store.mirror``). What a task calls before it reads;
        ``hollow``, what a driver that plans calls (its ``.log`` files hold only what planning reads)."""
        if not self.in_object_storage:
            return self
        local = mirror(ObjectLogDir.parse(self.root), self.tp.dir_name, hollow=hollow)
        return PartitionRef(str(local), self.topic, self.partition)

    def localized_for(self, bases: Iterable[int]) -> PartitionRef:
        """This partition where the engine can read the segments ``bases`` record by record
        and plan on the others: itself, or (object storage) this host's hollow mirror with
        those segments made whole (``object_store.fill``). What compact-large's tasks call:
        each executor downloads the segments its tasks read, not the partition."""
        if not self.in_object_storage:
            return self
        local = self.localized(hollow=True)
        fill(local.path, bases)
        return local


def local_path(path: str | os.PathLike[str], what: str) -> Path:
    """A POSIX path: the jobs rename, fsync and lock files, which object stores cannot do."""
    text = os.fspath(path)
    if "://" in text:
        raise KafkaCleanerError(
            f"{what} {text}: not a file system; the jobs read log dirs from S3-compatible object storage "
            f"(s3://bucket/prefix as INPUT of report and compact), and compact writes its --output there, "
            f"but this needs a path (see docs/spark.md)"
        )
    return Path(text).absolute()


def input_root(path: str | os.PathLike[str]) -> str:
    """An INPUT of ``report`` or ``compact``: an absolute path, or an object-storage log dir
    (``s3://`` or ``s3a://``, normalised to ``s3://bucket/prefix``)."""
    text = os.fspath(path)
    if is_object_uri(text):
        return ObjectLogDir.parse(text).uri
    return str(local_path(text, "input"))


def list_partitions(
    roots: Sequence[str | os.PathLike[str]], policy: Policy, *, compacted_only: bool
) -> list[PartitionRef]:
    """The partitions of the log dirs that a policy rule matches (and compacts); of an
    object-storage log dir, from one listing (no object is read)."""
    out = []
    for root in roots:
        if is_object_uri(root):
            log_dir = ObjectLogDir.parse(str(root))
            found = [tp for name in log_dir.layout()[1] if (tp := parse_partition_dir(name)) is not None]
            where = log_dir.uri
        else:
            local = LogDirectory(root, read_only=True)
            if not local.exists():
                raise KafkaCleanerError(f"{root}: no such log directory")
            found, where = list(local.partition_dirs()), str(local.path)
        for tp in found:
            rule = policy.rule_for(tp.topic)
            if rule is None or (compacted_only and not rule.compact):
                continue
            out.append(PartitionRef(where, tp.topic, tp.partition))
    return sorted(out)


def partition_fingerprint(ref: PartitionRef) -> list[tuple[str, int, int | str]]:
    """A partition's files as a plan names them: (name, size, mtime ns) on a file system,
    (name, size, ETag) in object storage, from a listing."""
    if ref.in_object_storage:
        log_dir = ObjectLogDir.parse(ref.root)
        return sorted(fingerprint(log_dir.listing(ref.tp.dir_name + "/")))
    return dir_fingerprint(ref.path)


def partition_of_input(partition: str | os.PathLike[str]) -> PartitionRef:
    """A partition directory, or one of a log dir in object storage
    (``s3://bucket/prefix/<topic>-<partition>``, found in a listing)."""
    text = os.fspath(partition)
    if not is_object_uri(text):
        return partition_of_dir(local_path(text, "partition dir"))
    root, _, name = text.rstrip("/").rpartition("/")
    tp = parse_partition_dir(name)
    log_dir = ObjectLogDir.parse(root) if tp is not None and "/" in root.split("://", 1)[1] else None
    if tp is None or log_dir is None:
        raise KafkaCleanerError(f"{text}: not a partition of a log dir in object storage "
                                f"(s3://<bucket>/<prefix>/<topic>-<partition>)")
    if not log_dir.listing(name + "/"):
        raise KafkaCleanerError(f"{log_dir.uri}/{name}: no such partition (no object under it)")
    return PartitionRef(log_dir.uri, tp.topic, tp.partition)


def partition_of_dir(partition_dir: str | os.PathLike[str]) -> PartitionRef:
    d = Path(partition_dir).absolute()
    tp = parse_partition_dir(d.name)
    if tp is None or not d.is_dir():
        raise KafkaCleanerError(f"{partition_dir}: not a partition directory (<topic>-<partition>)")
    return PartitionRef(str(d.parent), tp.topic, tp.partition)


def open_managed(
    ref: PartitionRef, policy: Policy, time: Time, *, read_only: bool = True, hollow: bool = False
) -> tuple[LogCleanerManager, ManagedLog]:
    """A manager over the one partition (checkpoints never written) and its managed log
    (``hollow``: see ``PartitionRef.localized``)."""
    view = PartitionView(ref.localized(hollow=hollow).root, ref.tp, read_only=read_only)
    manager = LogCleanerManager([view], policy, time, write_checkpoints=False)
    logs = manager.logs()
    if ref.tp not in logs:
        raise KafkaCleanerError(f"{ref.path}: no policy rule matches topic {ref.topic!r}")
    return manager, logs[ref.tp]


# -- fingerprints: the identity of a plan ----------------------------------------------------


def dir_fingerprint(directory: str | os.PathLike[str]) -> list[tuple[str, int, int]]:
    """(name, size, mtime ns) of every regular file: changes whenever a segment is
    appended to, swapped, deleted or touched."""
    out = []
    with os.scandir(directory) as it:
        for entry in it:
            if entry.is_file(follow_symlinks=False):
                st = entry.stat(follow_symlinks=False)
                out.append((entry.name, st.st_size, st.st_mtime_ns))
    return sorted(out)


def root_fingerprint(root: str | os.PathLike[str]) -> dict[str, str | None]:
    """The log dir files the cleaner reads: the offset checkpoints and the clean-shutdown
    marker (contents hashed; in object storage, their ETags: an object's MD5)."""
    if is_object_uri(root):
        etags = {o.name: o.etag for o in ObjectLogDir.parse(str(root)).listing(top_level=True)}
        return {name: etags.get(name) for name in (*OFFSET_CHECKPOINT_FILES, CLEAN_SHUTDOWN_FILE)}
    out: dict[str, str | None] = {}
    for name in (*OFFSET_CHECKPOINT_FILES, CLEAN_SHUTDOWN_FILE):
        p = Path(root) / name
        try:
            out[name] = hashlib.sha256(p.read_bytes()).hexdigest()
        except FileNotFoundError:
            out[name] = None
    return out


def run_id(kind: str, identity: object) -> str:
    """A stable id for a plan: the same inputs in the same state give the same id."""
    text = json.dumps([kind, identity], sort_keys=True, default=str)
    return f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:20]}"


def policy_identity(policy: Policy) -> dict:
    return policy.to_spec_dict()


# -- a cleaning round, planned ---------------------------------------------------------------


@dataclass(frozen=True)
class SegmentRef:
    base: int
    size: int
    mtime_ms: int


@dataclass
class RoundPlan:
    """One cleaning round of one partition, decided up front (KAFKA_NOTES §9.1):
    everything ``Cleaner.do_clean`` computes before and around its two phases."""

    index: int
    ref: PartitionRef
    rule: TopicRule
    log_start_offset: int
    now: int
    first_dirty_offset: int
    first_uncleanable_offset: int
    needs_compaction_now: bool
    clean_bytes: int
    cleanable_bytes: int
    delete_retention_ms: int
    active_producers: dict[int, ActiveProducer]
    legacy_delete_horizon_ms: int
    segments: list[SegmentRef]
    max_keys: int
    """The single-node offset map's capacity (``OffsetMap.max_keys`` for this policy)."""
    io_buffer_size: int
    max_io_buffer_size: int
    io_max_bytes_per_second: float | None
    dirty: list[tuple[int, int, bytes]]
    """(segment index, next start, pickled map-building transaction state at its start)."""
    map_keys_need_own_pass: bool
    """Aborted transactions in the dirty section: the map's keys (outside aborted data)
    are extracted with the map-building transaction state, apart from the lookup keys."""
    end_offset: int
    groups: list[list[int]] = field(default_factory=list)
    group_states: list[bytes] = field(default_factory=list)
    map_stop_offset: int | None = None
    """The offset of the first key the single-node map would refuse (map full), if any."""
    transactions: Summaries | None = field(default=None, repr=False, compare=False)
    """The transaction summaries of the segments (``transaction_summary``) where the driver
    was given them: the states above are composed from them, again when the round is cut. On
    the driver only: a plan travels to the executors without them."""

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "transactions": None}

    @property
    def tp(self) -> TopicPartition:
        return self.ref.tp

    @property
    def offset_limit(self) -> int:
        return self.first_dirty_offset + OFFSET_MAP_RELATIVE_LIMIT

    def group_bases(self, g: int) -> list[int]:
        return [self.segments[i].base for i in self.groups[g]]

    def group_source_bytes(self, g: int) -> int:
        return sum(self.segments[i].size for i in self.groups[g])

    def segment_group(self) -> dict[int, int]:
        return {s: g for g, members in enumerate(self.groups) for s in members}


def planning_cleaner(config: CleanerConfig, time: Time) -> Cleaner:
    """A cleaner with a thread's I/O buffer sizes (as ``CleanerThread`` builds it) and a
    token offset map: rounds run in phases never use its own map."""
    return Cleaner(
        0,
        OffsetMap(1024),
        config.io_buffer_per_thread // 2,
        MAX_IO_BUFFER_SIZE,
        Throttler(config.max_io_bytes_per_second, time),
        time,
    )


def offset_map_capacity(config: CleanerConfig) -> int:
    """``max_keys`` of the map each cleaner thread of this configuration has."""
    return OffsetMap(config.dedupe_buffer_per_thread, config.dedupe_buffer_load_factor).max_keys


def plan_round(
    index: int,
    ref: PartitionRef,
    manager: LogCleanerManager,
    managed: ManagedLog,
    policy: Policy,
    now: int,
    time: Time,
    *,
    max_keys: int | None = None,
    summaries_from: Callable[[list[tuple[int, int]]], Summaries] | None = None,
) -> RoundPlan | None:
    """The next round of the partition, or None when there is nothing to clean.
    ``summaries_from``: where the transaction summaries come from (the Spark driver: a job
    whose tasks read the segments), given the (base offset, position) of each; without it,
    the headers are read here."""
    checkpoint = manager.all_cleaner_checkpoints().get(ref.tp)
    ltc, _, _ = manager.log_to_clean(managed, checkpoint, now)
    if ltc.first_dirty_offset >= ltc.first_uncleanable_offset:
        return None
    the_log = managed.log
    config = policy.cleaner
    cleaner = planning_cleaner(config, time)
    summaries = None
    if summaries_from is not None:
        summaries = summaries_from(summaries_needed(the_log, ltc.first_dirty_offset, ltc.first_uncleanable_offset))
    dirty = cleaner.dirty_segments(ltc, summaries)
    index_of = {s.base_offset: i for i, s in enumerate(the_log.segments)}
    plan = RoundPlan(
        index=index,
        ref=ref,
        rule=managed.rule,
        log_start_offset=the_log.log_start_offset,
        now=now,
        first_dirty_offset=ltc.first_dirty_offset,
        first_uncleanable_offset=ltc.first_uncleanable_offset,
        needs_compaction_now=ltc.needs_compaction_now,
        clean_bytes=ltc.clean_bytes,
        cleanable_bytes=ltc.cleanable_bytes,
        delete_retention_ms=ltc.delete_retention_ms,
        active_producers=dict(ltc.active_producers),
        legacy_delete_horizon_ms=legacy_delete_horizon(ltc),
        segments=[SegmentRef(s.base_offset, s.size, s.last_modified_ms) for s in the_log.segments],
        max_keys=max_keys if max_keys is not None else offset_map_capacity(config),
        io_buffer_size=config.io_buffer_per_thread // 2,
        max_io_buffer_size=MAX_IO_BUFFER_SIZE,
        io_max_bytes_per_second=config.max_io_bytes_per_second,
        dirty=[(index_of[seg.base_offset], nxt, pickle.dumps(state)) for seg, nxt, state in dirty],
        map_keys_need_own_pass=bool(
            the_log.collect_aborted_transactions(ltc.first_dirty_offset, ltc.first_uncleanable_offset)
        ),
        end_offset=ltc.first_uncleanable_offset,
        transactions=summaries,
    )
    set_end_offset(plan, ltc, cleaner, ltc.first_uncleanable_offset)
    return plan


def set_end_offset(plan: RoundPlan, ltc: LogToClean, cleaner: Cleaner, end_offset: int) -> None:
    """The round ends at ``end_offset``: Kafka's groups of the segments below it (§9.3) and
    the transaction state at the start of each, composed from the segments' summaries."""
    plan.end_offset = end_offset
    groups = plan_groups(ltc, end_offset)
    index_of = {s.base: i for i, s in enumerate(plan.segments)}
    plan.groups = [[index_of[s.base_offset] for s in group] for group in groups]
    plan.group_states = [pickle.dumps(s) for s in cleaner.transaction_states(ltc, groups, plan.transactions)]


# -- the executors' side ---------------------------------------------------------------------


def open_planned_log(plan: RoundPlan, bases: Iterable[int] = ()) -> Log:
    """The partition as the plan saw it, read-only, where the segments ``bases`` are read
    record by record (``PartitionRef.localized_for``); raises ``StalePlanError`` if its
    segments changed."""
    path = plan.ref.localized_for(bases).path
    log = Log.open(path, log_config_for(plan.rule), log_start_offset=plan.log_start_offset, read_only=True)
    seen = [SegmentRef(s.base_offset, s.size, s.last_modified_ms) for s in log.segments]
    planned = {s.base: s for s in plan.segments}
    for s in seen:
        p = planned.get(s.base)
        if p is not None and p != s and s.base < plan.first_uncleanable_offset:
            raise StalePlanError(f"{plan.ref.path}: segment {s.base} changed since the plan ({p} -> {s})")
    missing = sorted(set(planned) - {s.base for s in seen})
    if missing:
        raise StalePlanError(f"{plan.ref.path}: segments {missing[:5]} disappeared since the plan")
    return log


def log_to_clean_of(plan: RoundPlan, log: Log) -> LogToClean:
    return LogToClean(
        log,
        plan.tp,
        plan.first_dirty_offset,
        plan.first_uncleanable_offset,
        needs_compaction_now=plan.needs_compaction_now,
        clean_bytes=plan.clean_bytes,
        cleanable_bytes=plan.cleanable_bytes,
        delete_retention_ms=plan.delete_retention_ms,
        active_producers=dict(plan.active_producers),
    )


def segments_by_base(log: Log, bases: Sequence[int]) -> list[LogSegment]:
    by_base = {s.base_offset: s for s in log.segments}
    return [by_base[b] for b in bases]


def transaction_state(blob: bytes) -> CleanedTransactionMetadata:
    state = pickle.loads(blob)
    assert isinstance(state, CleanedTransactionMetadata)
    return state
