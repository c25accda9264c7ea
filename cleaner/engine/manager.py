"""Which log to clean next, and the state of every partition (Kafka's
``LogCleanerManager``, KAFKA_NOTES §6).

The manager owns the set of logs (every partition of the log dirs whose topic a policy
rule matches), their cleaning states, the ``cleaner-offset-checkpoint`` files and the
partitions marked uncleanable. Every public method takes its lock; the blocking calls
(``abort_and_pause_cleaning``) wait on its condition variable like Kafka's.

``report`` gives, for every partition, what ``kafka-cleaner status`` prints and the
sidecar exports: the first dirty offset, clean/cleanable/uncleanable bytes, the ratio,
and whether it is eligible now or why not.
"""

from __future__ import annotations

import datetime
import enum
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from cleaner.clock import Time
from cleaner.config import Policy, TopicRule
from cleaner.effective_config import EffectiveRule, effective_rule
from cleaner.errors import FileChangedError, KafkaCleanerError, LogCleaningAbortedError, failure_reason
from cleaner.storage.cluster_metadata import ClusterMetadata, ClusterMetadataReader, find_metadata_dir
from cleaner.storage.log import Log, LogConfig, replay_batches
from cleaner.storage.log_dir import LogDirectory, checkpoints_read_once
from cleaner.storage.metadata import read_meta_properties
from cleaner.storage.producer_state import ActiveProducer, ProducerStateManager
from cleaner.storage.topic_partition import TopicPartition

from .cleaner import LogToClean
from .stats import PreCleanStats

log = logging.getLogger("cleaner.engine.manager")

LONG_MAX = 2**63 - 1


class CleaningState(enum.Enum):
    IN_PROGRESS = "LogCleaningInProgress"
    ABORTED = "LogCleaningAborted"
    PAUSED = "LogCleaningPaused"


@dataclass
class _State:
    kind: CleaningState
    paused: int = 0

    def __repr__(self) -> str:
        return f"{self.kind.value}({self.paused})" if self.kind is CleaningState.PAUSED else self.kind.value


class LogCleaningException(KafkaCleanerError):
    """A failure while cleaning (or applying retention to) one log: the partition is
    marked uncleanable and the other partitions go on (KIP-346, KAFKA-8725)."""

    def __init__(self, managed: ManagedLog, cause: BaseException) -> None:
        self.managed = managed
        self.cause = cause
        super().__init__(f"{managed.topic_partition}: {failure_reason(cause)}")


def log_config_for(rule: TopicRule) -> LogConfig:
    return LogConfig(
        segment_bytes=rule.segment_bytes,
        segment_index_bytes=rule.segment_index_bytes,
        index_interval_bytes=rule.index_interval_bytes,
        max_message_bytes=rule.max_message_bytes,
    )


@dataclass
class ManagedLog:
    log_dir: LogDirectory
    topic_partition: TopicPartition
    log: Log
    rule: TopicRule
    """The effective rule: the policy's merged with the cluster's config (``effective_config``)."""
    config: EffectiveRule | None = None

    @property
    def compacted(self) -> bool:
        return self.rule.compact


@dataclass
class OffsetsToClean:
    first_dirty_offset: int
    first_uncleanable_dirty_offset: int
    force_update_checkpoint: bool = False
    binding: str | None = None
    """Which bound set the first uncleanable offset: lso, activeSegment or lag."""


@dataclass
class PartitionReport:
    """One partition, as ``status`` reports it."""

    log_dir: str
    topic_partition: TopicPartition
    compacted: bool
    log_start_offset: int = 0
    log_end_offset: int = 0
    high_watermark: int | None = None
    last_stable_offset: int | None = None
    first_dirty_offset: int = 0
    first_uncleanable_offset: int = 0
    clean_bytes: int = 0
    cleanable_bytes: int = 0
    uncleanable_bytes: int = 0
    cleanable_ratio: float = 0.0
    min_cleanable_ratio: float = 0.5
    compaction_delay_ms: int = 0
    eligible: bool = False
    reason: str | None = None
    """Why not eligible: ratio, lag, lso, activeSegment, uncleanable, paused, cleaning, notCompacted."""
    uncleanable_reason: str | None = None
    earliest_dirty_timestamp_ms: int | None = None
    segments: int = 0
    size_bytes: int = 0
    pending_startup: list[str] = field(default_factory=list)
    lso_holder: HangingTransaction | None = None
    """The open transaction that pins the last stable offset, when one does."""
    config_sources: dict[str, str] = field(default_factory=dict)
    """Kafka key -> where its effective value came from: cluster, policy or default."""
    cluster_config: bool = False
    """Whether the cluster's own topic configs were read (a KRaft metadata log on disk)."""
    config_notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class HangingTransaction:
    """The transaction holding a partition's LSO: what ``kafka-transactions.sh abort``
    needs (``--topic``, ``--partition``, ``--start-offset``), and how long it has been open."""

    producer_id: int
    producer_epoch: int
    first_offset: int
    start_timestamp_ms: int | None
    """The timestamp of the transaction's first batch (None if that batch is gone)."""


@dataclass
class _ProducerStateCache:
    state: ProducerStateManager
    shape: tuple
    log_end_offset: int
    truncations: int


class LogCleanerManager:
    def __init__(
        self,
        log_dirs: Iterable[LogDirectory],
        policy: Policy,
        time: Time,
        *,
        write_checkpoints: bool = True,
        only: Callable[[TopicPartition], bool] | None = None,
    ) -> None:
        self.log_dirs = list(log_dirs)
        self.policy = policy
        self.only = only
        """The CLI's ``--topic``/``--partition``: the partitions it rejects are not managed
        (their checkpoint entries stay as they are)."""
        self.time = time
        self.write_checkpoints = write_checkpoints
        """False in stage mode: cleaner-offset-checkpoint belongs to the live broker."""
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._in_progress: dict[TopicPartition, _State] = {}
        self._uncleanable: dict[str, dict[TopicPartition, str]] = {}
        self._logs: dict[TopicPartition, ManagedLog] = {}
        self._producer_state: dict[TopicPartition, _ProducerStateCache] = {}
        self._memory_checkpoints: dict[TopicPartition, int] = {}
        self.time_of_last_run = time.milliseconds()
        self.dirtiest_log_cleanable_ratio = 0.0
        self.last_clean_end: dict[TopicPartition, int] = {}
        self._cluster_reader: ClusterMetadataReader | None = None
        self.cluster_metadata: ClusterMetadata | None = None
        """The cluster metadata as the last ``logs()`` read it (replication race facts)."""
        self.broker_id: int | None = None
        self.cluster_metadata_error: str | None = None
        self.deletion_at_risk: Mapping[TopicPartition, int] = {}
        """Partitions about to breach their deletion deadline, with the time left in ms (the
        sidecar sets it from its last scan, issue 25, item 3): eligible whatever their dirty
        ratio and cleaned first, least time left first. Empty: Kafka's order alone."""

    # -- the set of logs ------------------------------------------------------------------
    def logs(self) -> dict[TopicPartition, ManagedLog]:
        """Every partition whose topic a rule matches, opened once and kept; directories
        that appeared are opened, those that disappeared are forgotten.

        A kept log is the partition only while its directory is still where and what it
        was when opened (``Log.moved``: the dir's device and inode). A partition moved to
        another log dir (AlterReplicaLogDirs: Kafka renames the ``-future`` dir into place
        there and the old one to ``-delete``), or deleted and created again, is opened
        afresh from where it is now. While a move is in flight both log dirs hold the
        partition for a moment: the log already open stays (a duplicate is reported by
        the sidecar, never picked by the order of the dirs)."""
        with self._lock:
            seen: set[TopicPartition] = set()
            cluster, broker_id = self._cluster_metadata()
            self.cluster_metadata, self.broker_id = cluster, broker_id
            found: dict[TopicPartition, list[LogDirectory]] = {}
            for log_dir in self.log_dirs:
                if not log_dir.exists():
                    continue
                try:
                    listed = log_dir.partition_dirs()
                except (FileNotFoundError, NotADirectoryError):
                    continue  # the log dir itself went away since exists()
                for tp in listed:
                    found.setdefault(tp, []).append(log_dir)
            starts: dict[str, dict[TopicPartition, int]] = {}
            for tp, where in found.items():
                policy_rule = self.policy.rule_for(tp.topic)
                if policy_rule is None or (self.only is not None and not self.only(tp)):
                    continue
                config = effective_rule(policy_rule, cluster.topic(tp.topic, broker_id) if cluster else None)
                rule = config.rule
                managed = self._logs.get(tp)
                stale = managed is None or managed.rule != rule or managed.log.needs_reopen
                if not stale and (
                    all(d.path != managed.log_dir.path for d in where) or managed.log.moved()  # type: ignore[union-attr]
                ):
                    log.info(
                        "%s is no longer the directory opened in %s (moved, or deleted and created again): "
                        "opening it from %s",
                        tp,
                        managed.log_dir,  # type: ignore[union-attr]
                        ", ".join(str(d) for d in where),
                    )
                    stale = True
                    self._memory_checkpoints.pop(tp, None)  # see _forget
                if stale:
                    log_dir = where[0]
                    if managed is not None:
                        same = [d for d in where if d.path == managed.log_dir.path]
                        others = [d for d in where if d.path != managed.log_dir.path]
                        # Moved: where the partition is now, another dir first (a copy left
                        # in the old one is on its way out); otherwise where it was.
                        log_dir = (others + same if managed.log.moved() else same + others)[0]
                    if str(log_dir) not in starts:
                        starts[str(log_dir)] = log_dir.log_start_offsets()
                    try:
                        the_log = log_dir.open_log(
                            tp, log_config_for(rule), log_start_offset=starts[str(log_dir)].get(tp)
                        )
                    except (FileNotFoundError, NotADirectoryError):
                        # Gone since the listing (a topic deletion renames the dir to
                        # -delete, a reassignment moves it): not a log any more.
                        self._forget(tp)
                        continue
                    self._producer_state.pop(tp, None)
                    self._logs[tp] = ManagedLog(log_dir, tp, the_log, rule)
                seen.add(tp)
                self._logs[tp].config = config
            for tp in [tp for tp in self._logs if tp not in seen]:
                self._forget(tp)
            return dict(self._logs)

    def _forget(self, tp: TopicPartition) -> None:
        """A partition no longer here (deleted, moved away, or no longer the policy's). Its
        in-memory checkpoint goes too, as Kafka drops a deleted partition's entry: a topic
        created again under the name is a new log, cleaned from its start. (After a move
        Kafka keeps the entry; here the memory only saves work, so the move costs a redo.)"""
        self._logs.pop(tp, None)
        self._producer_state.pop(tp, None)
        self._memory_checkpoints.pop(tp, None)

    def _cluster_metadata(self) -> tuple[ClusterMetadata | None, int | None]:
        """The cluster's topic configs from the KRaft metadata log on these disks, if one is
        here (``effective_config``). Unreadable metadata leaves the policy's values standing
        and is reported (``cluster_metadata_error``), never stops the cleaner."""
        found = find_metadata_dir([d.path for d in self.log_dirs if d.exists()])
        if found is None:
            self._cluster_reader = None
            return None, None
        if self._cluster_reader is None or self._cluster_reader.dir != found:
            self._cluster_reader = ClusterMetadataReader(found)
        try:
            metadata = self._cluster_reader.refresh()
        except (KafkaCleanerError, OSError) as e:
            if self.cluster_metadata_error != str(e):
                log.warning("Cannot read the cluster's topic configs; the policy's values stand: %s", e)
            self.cluster_metadata_error = str(e)
            self._cluster_reader = None
            return None, None
        self.cluster_metadata_error = None
        try:
            broker_id = read_meta_properties(found.parent / "meta.properties").node_id
        except (KafkaCleanerError, OSError):
            broker_id = None
        return metadata, broker_id

    def set_policy(self, policy: Policy) -> None:
        """A new policy: rules apply from the next selection round."""
        with self._lock:
            self.policy = policy

    # -- checkpoints ----------------------------------------------------------------------
    def all_cleaner_checkpoints(self) -> dict[TopicPartition, int]:
        """Union of every log dir's ``cleaner-offset-checkpoint``, re-read from disk each
        time (the file is the truth, as in Kafka)."""
        out: dict[TopicPartition, int] = {}
        for log_dir in self.log_dirs:
            if log_dir.exists():
                out.update(log_dir.cleaner_checkpoint.read())
        out.update(self._memory_checkpoints)
        return out

    def update_checkpoints(
        self,
        log_dir: LogDirectory,
        update: tuple[TopicPartition, int] | None = None,
        remove: TopicPartition | None = None,
    ) -> None:
        """Kafka's ``updateCheckpoints``: re-read the dir's file, keep only partitions that
        are logs of this dir, apply, rewrite atomically."""
        with self._lock:
            if not self.write_checkpoints or log_dir.read_only:
                if update is not None:
                    self._memory_checkpoints[update[0]] = update[1]
                if remove is not None:
                    self._memory_checkpoints.pop(remove, None)
                return
            current = set(log_dir.partition_dirs())
            log_dir.cleaner_checkpoint.update(
                set=dict([update]) if update is not None else None,
                remove=[remove] if remove is not None else (),
                keep_only=current,
            )

    def maybe_truncate_checkpoint(self, log_dir: LogDirectory, tp: TopicPartition, offset: int) -> None:
        """After a truncation below the cleaned part, move the checkpoint back."""
        with self._lock:
            managed = self._logs.get(tp)
            if managed is None or not managed.compacted:
                return
            current = self.all_cleaner_checkpoints().get(tp, 0)
            if current > offset:
                self.update_checkpoints(log_dir, update=(tp, offset))

    # -- what is cleanable ----------------------------------------------------------------
    def _producer_facts(self, managed: ManagedLog, now: int) -> tuple[dict[int, ActiveProducer], int | None]:
        """Active producers and the first unstable offset at the log end offset.

        The producer state is kept between calls: while the segments are the same and the
        log only grew, just the new batches are replayed (a live broker's log is read once);
        after this process's own cleans and retention (no truncation, nothing appended) it
        is kept as it is, as Kafka's cleaner thread keeps the broker's (``deleteSegments``
        only moves the log start: a transaction still open whose first batches are gone
        holds the first unstable offset at the log start); anything else (a truncation,
        another process's changes) reloads it from the newest snapshot, as a broker's
        start-up would."""
        the_log = managed.log
        tp = managed.topic_partition
        leo = the_log.log_end_offset
        shape = (tuple(s.base_offset for s in the_log.segments), the_log.log_start_offset, the_log.generation)
        cached = self._producer_state.get(tp)
        active = the_log.active_segment
        # Resume only where the bytes replayed so far are provably unchanged (no truncation
        # and rewrite in between); otherwise reload from the newest snapshot.
        resumable = (
            cached is not None
            and cached.shape == shape
            and cached.log_end_offset <= leo
            and active is not None
            and active.position_hint(cached.log_end_offset) is not None
        )
        if resumable:
            psm = cached.state
            if leo > cached.log_end_offset:
                for batches in the_log.iter_batches(cached.log_end_offset):
                    replay_batches(psm, batches)
                psm.update_map_end_offset(leo)
        elif (
            cached is not None
            and not the_log.read_only
            and cached.truncations == the_log.truncations
            and cached.log_end_offset == leo
        ):
            psm = cached.state
            psm.on_log_start_offset_incremented(the_log.log_start_offset)
        else:
            psm = the_log.load_producer_state(
                now,
                producer_id_expiration_ms=self.policy.cleaner.producer_id_expiration_ms,
                had_clean_shutdown=managed.log_dir.had_clean_shutdown,
                recovered_at_start=managed.log_dir.recovered_at_next_start,
            )
        self._producer_state[tp] = _ProducerStateCache(psm, shape, leo, the_log.truncations)
        high_watermark = managed.log_dir.high_watermarks().get(tp)
        first_unstable = psm.first_unstable_offset(high_watermark=high_watermark)
        if first_unstable is not None:  # maybeIncrementFirstUnstableOffset
            first_unstable = max(first_unstable, the_log.log_start_offset)
        return psm.active_producers(), first_unstable

    def last_stable_offset(self, managed: ManagedLog, now: int) -> tuple[int, int | None]:
        """(LSO, high watermark). Without a high watermark in ``replication-offset-checkpoint``
        nothing is known to be committed, so the LSO is the log start offset."""
        high_watermark = managed.log_dir.high_watermarks().get(managed.topic_partition)
        if high_watermark is None:
            return managed.log.log_start_offset, None
        _, first_unstable = self._producer_facts(managed, now)
        lso = high_watermark if first_unstable is None else min(first_unstable, high_watermark)
        return lso, high_watermark

    def hanging_transaction(self, managed: ManagedLog, now: int) -> HangingTransaction | None:
        """The open transaction below the high watermark that the LSO stops at, if any."""
        high_watermark = managed.log_dir.high_watermarks().get(managed.topic_partition)
        if high_watermark is None:
            return None
        self._producer_facts(managed, now)
        holder = self._producer_state[managed.topic_partition].state.lso_holder(high_watermark)
        if holder is None or holder[2] >= high_watermark:
            return None
        pid, epoch, first = holder
        started = None
        for batches in managed.log.iter_batches(first):
            at = np.flatnonzero((batches.base_offsets <= first) & (batches.last_offsets >= first))
            if len(at):
                i = int(at[0])
                started = int(batches.headers["base_timestamp"][i])
                if batches.has_delete_horizon[i]:
                    started = int(batches.max_timestamps[i])
            break
        return HangingTransaction(pid, epoch, first, started)

    @staticmethod
    def _look_again_if_behind(managed: ManagedLog, checkpoint: int | None) -> None:
        """A live broker's log is looked at before the cleaner checkpoint is read; in between
        the broker may append, roll and have its own cleaner checkpoint the new active
        segment's base. Such a checkpoint is above the log end offset seen, which Kafka
        reads as a truncation (and cleans everything again): look at the log once more
        before the checkpoint is judged."""
        if checkpoint is not None and managed.log.read_only and checkpoint > managed.log.log_end_offset:
            managed.log.refresh()

    def cleanable_offsets(self, managed: ManagedLog, checkpoint: int | None, now: int) -> OffsetsToClean:
        """KAFKA_NOTES §6.2-§6.3: the first dirty offset (with Kafka's reset rules) and the
        first offset that may not be cleaned (LSO, active segment, min compaction lag)."""
        self._look_again_if_behind(managed, checkpoint)
        the_log = managed.log
        start = the_log.log_start_offset
        dirty = checkpoint if checkpoint is not None else start
        force = False
        if dirty < start:
            if not (managed.rule.compact and managed.rule.delete):
                log.warning(
                    "Resetting first dirty offset of %s to log start offset %d since the checkpointed offset "
                    "%d is invalid.",
                    managed.topic_partition,
                    start,
                    dirty,
                )
            dirty, force = start, True
        elif dirty > the_log.log_end_offset:
            log.warning(
                "The last checkpoint dirty offset for partition %s is %d, which is larger than the log end "
                "offset %d. Resetting to the log start offset %d.",
                managed.topic_partition,
                dirty,
                the_log.log_end_offset,
                start,
            )
            dirty, force = start, True
        lso, _ = self.last_stable_offset(managed, now)
        active = the_log.active_segment
        bounds: list[tuple[int, str]] = [(lso, "lso")]
        if active is not None:
            bounds.append((active.base_offset, "activeSegment"))
        min_lag = max(managed.rule.min_compaction_lag_ms, 0)
        if min_lag > 0:
            for segment in self._non_active_segments_from(the_log, dirty):
                if segment.largest_timestamp > now - min_lag:
                    bounds.append((segment.base_offset, "lag"))
                    break
        bound, binding = min(bounds, key=lambda b: b[0])
        return OffsetsToClean(dirty, max(dirty, bound), force, binding)

    @staticmethod
    def _non_active_segments_from(the_log: Log, offset: int) -> list:
        active = the_log.active_segment
        if active is None or offset > active.base_offset:
            return []
        return [s for s in the_log.segments_between(offset, active.base_offset)]

    def earliest_dirty_timestamp(self, managed: ManagedLog, first_dirty: int) -> int:
        """The oldest first-batch timestamp of the dirty non-active segments (Long.MAX if none)."""
        segments = self._non_active_segments_from(managed.log, first_dirty)
        stamps = [ts for ts in (s.first_batch_timestamp() for s in segments) if ts > 0]
        return min(stamps) if stamps else LONG_MAX

    def max_compaction_delay(self, managed: ManagedLog, first_dirty: int, now: int) -> int:
        """KIP-354 (§6.4): how far past ``max.compaction.lag.ms`` the oldest dirty data is."""
        earliest = self.earliest_dirty_timestamp(managed, first_dirty)
        clean_until = now - max(managed.rule.max_compaction_lag_ms, 0)
        return clean_until - earliest if earliest < clean_until else 0

    def log_to_clean(
        self, managed: ManagedLog, checkpoint: int | None, now: int
    ) -> tuple[LogToClean, OffsetsToClean, int]:
        offsets = self.cleanable_offsets(managed, checkpoint, now)
        delay = self.max_compaction_delay(managed, offsets.first_dirty_offset, now)
        the_log = managed.log
        first_dirty = offsets.first_dirty_offset
        # Round the bound down to a segment start (LogToClean / calculateCleanableBytes).
        active = the_log.active_segment
        floor = the_log.floor_segment(offsets.first_uncleanable_dirty_offset)
        if active is None:
            first_uncleanable = first_dirty
        elif floor is None or offsets.first_uncleanable_dirty_offset >= active.base_offset:
            first_uncleanable = active.base_offset
        else:
            first_uncleanable = floor.base_offset
        clean_bytes = sum(s.size for s in the_log.segments if s.base_offset < first_dirty)
        low = min(first_dirty, first_uncleanable)
        cleanable_bytes = (
            sum(s.size for s in the_log.segments_between(low, first_uncleanable)) if low < first_uncleanable else 0
        )
        active_producers, _ = self._producer_facts(managed, now) if the_log.segments else ({}, None)
        ltc = LogToClean(
            the_log,
            managed.topic_partition,
            first_dirty,
            first_uncleanable,
            needs_compaction_now=delay > 0,
            clean_bytes=clean_bytes,
            cleanable_bytes=cleanable_bytes,
            delete_retention_ms=managed.rule.delete_retention_ms,
            active_producers=active_producers,
            hold_removals=self.removal_hold(managed.topic_partition),
        )
        return ltc, offsets, delay

    def removal_hold(self, tp: TopicPartition) -> str | None:
        """Why a clean of ``tp`` must keep every tombstone and transaction marker now, or None
        (issue 24, item 3: the compaction-replication race). With the KRaft metadata log on
        these disks: while any other replica of the partition is out of the ISR or offline, it would
        never receive a tombstone or marker removed above its log end, so none is removed on
        any replica (every replica's cleaner reads the same metadata). Cleaning runs below the
        high watermark, which every in-sync replica has reached, so the ISR is the watermark.
        Nothing is held where nothing is known of the other replicas: no metadata log on these
        disks (a ZooKeeper-mode broker, an offline copy), or one that does not know the
        partition (a live broker creates a partition from its metadata, so only a copy or a
        foreign metadata log can lack it); docs/replica-divergence.md says so."""
        cluster = self.cluster_metadata
        if cluster is None:
            return None
        replication = cluster.replication(tp.topic, tp.partition)
        # This broker's own replica is the one being cleaned (offline, in the start-up gate or a
        # maintenance window, its metadata shows it fenced): what it removes it cannot miss.
        others = [o for o in replication.out_of_sync if o.broker != self.broker_id] if replication else []
        if not others:
            return None
        out = others[0]
        since = datetime.datetime.fromtimestamp(out.since_ms / 1000, datetime.UTC).isoformat(timespec="seconds")
        more = len(others) - 1
        return (
            f"replica {out.broker} is {'offline' if out.offline else 'out of the ISR'} since {since}"
            + (f" (and {more} more)" if more else "")
            + ": it would never receive what is removed"
        )

    def grab_filthiest_compacted_log(self, now: int, pre_stats: PreCleanStats | None = None) -> LogToClean | None:
        """§6.1: choose the eligible log with the highest cleanable ratio and mark it in
        progress. A failure computing one log marks it uncleanable (KAFKA-8725)."""
        pre_stats = pre_stats or PreCleanStats()
        with self._lock:
            self.time_of_last_run = now
            checkpoints = self.all_cleaner_checkpoints()
            candidates: list[tuple[LogToClean, float]] = []
            for tp, managed in self.logs().items():
                if not managed.compacted or tp in self._in_progress or self.is_uncleanable(managed.log_dir, tp):
                    continue
                try:
                    ltc, offsets, delay = self.log_to_clean(managed, checkpoints.get(tp), now)
                    if offsets.force_update_checkpoint:
                        self.update_checkpoints(managed.log_dir, update=(tp, offsets.first_dirty_offset))
                except Exception as e:
                    if isinstance(e, FileChangedError) and managed.log.moved():
                        continue  # deleted or moved since the listing: not a verdict on the log
                    self.mark_partition_uncleanable(managed.log_dir, tp, failure_reason(e))
                    continue
                pre_stats.update_max_compaction_delay(delay)
                if ltc.total_bytes > 0:
                    candidates.append((ltc, managed.rule.min_cleanable_dirty_ratio))
            self.dirtiest_log_cleanable_ratio = max((c.cleanable_ratio for c, _ in candidates), default=0.0)
            urgent = self.deletion_at_risk
            eligible = [
                c
                for c, min_ratio in candidates
                if (c.needs_compaction_now and c.cleanable_bytes > 0)
                or c.cleanable_ratio > min_ratio
                or (c.topic_partition in urgent and c.cleanable_bytes > 0)
            ]
            if not eligible:
                return None
            pre_stats.cleanable_partitions = len(eligible)
            at_risk = [c for c in eligible if c.topic_partition in urgent]
            if at_risk:
                chosen = min(at_risk, key=lambda c: urgent[c.topic_partition])
            else:
                chosen = max(eligible, key=lambda c: c.cleanable_ratio)
            self._in_progress[chosen.topic_partition] = _State(CleaningState.IN_PROGRESS)
            return chosen

    def report(self, now: int) -> list[PartitionReport]:
        """Every partition's cleaning picture, without changing anything (the broker's
        checkpoint files read once: ``checkpoints_read_once``)."""
        out = []
        with self._lock, checkpoints_read_once():
            checkpoints = self.all_cleaner_checkpoints()
            for tp, managed in self.logs().items():
                try:
                    out.append(self._report_one(managed, checkpoints.get(tp), now))
                except Exception as e:  # one partition's files changing under the look costs only its picture
                    if isinstance(e, FileChangedError) and managed.log.moved():
                        # Renamed away since the listing (deleted, moved): not a partition
                        # here any more; the next listing opens it where it is now.
                        log.info("%s in %s went away during the look: %s", tp, managed.log_dir, e)
                        continue
                    log.warning("cannot report %s: %s", tp, failure_reason(e))
                    out.append(
                        PartitionReport(
                            str(managed.log_dir),
                            tp,
                            managed.compacted,
                            log_start_offset=managed.log.log_start_offset,
                            reason="uncleanable",
                            uncleanable_reason=failure_reason(e),
                        )
                    )
        return out

    def report_partition(self, managed: ManagedLog, now: int) -> PartitionReport:
        """One partition's ``report`` (after its log was looked at again: a file that
        changed under a scan)."""
        with self._lock:
            return self._report_one(managed, self.all_cleaner_checkpoints().get(managed.topic_partition), now)

    def _report_one(self, managed: ManagedLog, checkpoint: int | None, now: int) -> PartitionReport:
        try:
            return self._report_once(managed, checkpoint, now)
        except FileChangedError:
            if not managed.log.read_only:
                raise
        # A live broker's file changed under the look (retention renamed a segment away,
        # its cleaner swapped one in, an index was trimmed): look at the directory as it is
        # now, once. The log dir itself renamed away raises: the caller's listing sees it.
        managed.log.refresh()
        return self._report_once(managed, checkpoint, now)

    def _report_once(self, managed: ManagedLog, checkpoint: int | None, now: int) -> PartitionReport:
        self._look_again_if_behind(managed, checkpoint)
        tp = managed.topic_partition
        the_log = managed.log
        report = PartitionReport(
            str(managed.log_dir),
            tp,
            managed.compacted,
            log_start_offset=the_log.log_start_offset,
            segments=len(the_log.segments),
            min_cleanable_ratio=managed.rule.min_cleanable_dirty_ratio,
            pending_startup=list(the_log.pending_startup),
        )
        if managed.config is not None:
            report.config_sources = dict(managed.config.sources)
            report.cluster_config = managed.config.cluster_known
            report.config_notes = list(managed.config.notes)
        try:
            report.size_bytes = the_log.size_in_bytes
            report.log_end_offset = the_log.log_end_offset
            ltc, offsets, delay = self.log_to_clean(managed, checkpoint, now)
            report.last_stable_offset, report.high_watermark = self.last_stable_offset(managed, now)
        except Exception as e:
            if isinstance(e, FileChangedError) and the_log.read_only:
                raise  # _report_one looks again
            report.reason = "uncleanable"
            report.uncleanable_reason = failure_reason(e)
            return report
        report.first_dirty_offset = ltc.first_dirty_offset
        report.first_uncleanable_offset = ltc.first_uncleanable_offset
        if offsets.binding == "lso":
            report.lso_holder = self.hanging_transaction(managed, now)
        report.clean_bytes = ltc.clean_bytes
        report.cleanable_bytes = ltc.cleanable_bytes
        report.uncleanable_bytes = max(report.size_bytes - ltc.clean_bytes - ltc.cleanable_bytes, 0)
        report.cleanable_ratio = ltc.cleanable_ratio
        report.compaction_delay_ms = delay
        earliest = self.earliest_dirty_timestamp(managed, ltc.first_dirty_offset)
        report.earliest_dirty_timestamp_ms = None if earliest == LONG_MAX else earliest
        reason = self.uncleanable_reason(managed.log_dir, tp)
        state = self._in_progress.get(tp)
        if not managed.compacted:
            report.reason = "notCompacted"
        elif reason is not None:
            report.reason, report.uncleanable_reason = "uncleanable", reason
        elif state is not None and state.kind is CleaningState.PAUSED:
            report.reason = "paused"
        elif state is not None:
            report.reason = "cleaning"
        elif ltc.cleanable_bytes == 0:
            report.reason = offsets.binding or "activeSegment"
        elif (ltc.needs_compaction_now and ltc.cleanable_bytes > 0) or ltc.cleanable_ratio > report.min_cleanable_ratio:
            report.eligible = True
        else:
            report.reason = "ratio"
        return report

    # -- states and the blocking API (§6.6) ----------------------------------------------
    def state(self, tp: TopicPartition) -> str | None:
        with self._lock:
            s = self._in_progress.get(tp)
            return repr(s) if s is not None else None

    def cleaning_in_progress(self) -> bool:
        with self._lock:
            return any(s.kind is not CleaningState.PAUSED for s in self._in_progress.values())

    def abort_and_pause_cleaning(self, tp: TopicPartition) -> None:
        """Stop any clean of ``tp`` and keep it from being chosen until resumed; blocks
        until an in-progress clean has actually stopped."""
        with self._cond:
            s = self._in_progress.get(tp)
            if s is None:
                self._in_progress[tp] = _State(CleaningState.PAUSED, 1)
            elif s.kind is CleaningState.IN_PROGRESS:
                self._in_progress[tp] = _State(CleaningState.ABORTED)
            elif s.kind is CleaningState.PAUSED:
                s.paused += 1
            else:
                raise RuntimeError(
                    f"Compaction for partition {tp} cannot be aborted and paused since it is in {s!r} state."
                )
            while not self._is_paused(tp):
                self._cond.wait(0.1)

    def _is_paused(self, tp: TopicPartition) -> bool:
        s = self._in_progress.get(tp)
        return s is not None and s.kind is CleaningState.PAUSED

    def abort_cleaning(self, tp: TopicPartition) -> None:
        with self._cond:
            self.abort_and_pause_cleaning(tp)
            self.resume_cleaning([tp])

    def resume_cleaning(self, tps: Iterable[TopicPartition]) -> None:
        with self._cond:
            for tp in tps:
                s = self._in_progress.get(tp)
                if s is None or s.kind is not CleaningState.PAUSED:
                    raise RuntimeError(
                        f"Compaction for partition {tp} cannot be resumed since it is not paused (state {s!r})."
                    )
                if s.paused > 1:
                    s.paused -= 1
                else:
                    del self._in_progress[tp]

    def check_cleaning_aborted(self, tp: TopicPartition) -> None:
        with self._lock:
            s = self._in_progress.get(tp)
            if s is not None and s.kind is CleaningState.ABORTED:
                raise LogCleaningAbortedError(f"cleaning of {tp} was aborted")

    def done_cleaning(self, tp: TopicPartition, log_dir: LogDirectory, end_offset: int) -> None:
        """Kafka's ``doneCleaning``: write the checkpoint and leave the in-progress state.
        The state is left even if the checkpoint write fails (the error still surfaces,
        and marks the partition uncleanable): a stuck state would stop the cleaner."""
        with self._cond:
            s = self._in_progress.get(tp)
            if s is not None and s.kind is CleaningState.IN_PROGRESS:
                try:
                    self.update_checkpoints(log_dir, update=(tp, end_offset))
                    self.last_clean_end[tp] = end_offset
                finally:
                    del self._in_progress[tp]
            else:
                self._leave_aborted(tp, s)

    def _leave_aborted(self, tp: TopicPartition, s: _State | None) -> None:
        """The end of a clean or deletion that was aborted meanwhile: the partition stays paused
        for whoever aborted it (holding ``_cond``), and wakes the thread waiting for that."""
        if s is None or s.kind is not CleaningState.ABORTED:
            raise RuntimeError(f"In-progress partition {tp} cannot be in {s!r} state.")
        self._in_progress[tp] = _State(CleaningState.PAUSED, 1)
        self._cond.notify_all()

    def deletable_logs(self) -> list[ManagedLog]:
        """Compacted logs for the retention step, marked in progress (§6.6, §10)."""
        with self._lock:
            out = []
            for tp, managed in self.logs().items():
                if managed.compacted and tp not in self._in_progress and not self.is_uncleanable(managed.log_dir, tp):
                    self._in_progress[tp] = _State(CleaningState.IN_PROGRESS)
                    out.append(managed)
            return out

    def done_deleting(self, tps: Iterable[TopicPartition]) -> None:
        with self._cond:
            for tp in tps:
                s = self._in_progress.get(tp)
                if s is not None and s.kind is CleaningState.IN_PROGRESS:
                    del self._in_progress[tp]
                else:
                    self._leave_aborted(tp, s)

    # -- uncleanable partitions ----------------------------------------------------------
    def mark_partition_uncleanable(self, log_dir: LogDirectory, tp: TopicPartition, reason: str) -> None:
        with self._lock:
            log.info("Marking %s in %s uncleanable: %s", tp, log_dir, reason)
            self._uncleanable.setdefault(str(log_dir), {})[tp] = reason

    def is_uncleanable(self, log_dir: LogDirectory, tp: TopicPartition) -> bool:
        with self._lock:
            return tp in self._uncleanable.get(str(log_dir), {})

    def uncleanable_reason(self, log_dir: LogDirectory, tp: TopicPartition) -> str | None:
        with self._lock:
            return self._uncleanable.get(str(log_dir), {}).get(tp)

    def uncleanable_partitions(self) -> dict[str, dict[TopicPartition, str]]:
        with self._lock:
            return {d: dict(tps) for d, tps in self._uncleanable.items() if tps}

    def uncleanable_bytes(self, log_dir: LogDirectory) -> int:
        """Kafka's ``uncleanable-bytes`` gauge: the cleanable bytes of that dir's
        uncleanable partitions, recomputed on read."""
        with self._lock:
            total = 0
            now = self.time.milliseconds()
            checkpoints = self.all_cleaner_checkpoints()
            for tp in self._uncleanable.get(str(log_dir), {}):
                managed = self._logs.get(tp)
                if managed is None:
                    continue
                try:
                    ltc, _, _ = self.log_to_clean(managed, checkpoints.get(tp), now)
                    total += ltc.cleanable_bytes
                except Exception:
                    total += managed.log.size_in_bytes if managed.log.segments else 0
            return total

    def maintain_uncleanable_partitions(self) -> None:
        """Forget uncleanable partitions that no longer exist."""
        with self._lock:
            existing = set(self._logs)
            for tps in self._uncleanable.values():
                for tp in [tp for tp in tps if tp not in existing]:
                    del tps[tp]
