"""The cleaner as a service over whole Kafka log dirs: what ``kafka-cleaner clean``,
``run`` and ``status`` do, reusable by the demo, the sidecar and the Spark jobs.

``clean`` takes each log dir's ``.lock`` the way a broker does (a POSIX lock), so it
refuses a directory a running broker holds; ``status`` only reads.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time as _time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from cleaner.clock import StoppableTime, Time
from cleaner.config import CleanerConfig, Policy
from cleaner.deletion import DeletionCache, DeletionStatus, deletion_status
from cleaner.engine.log_cleaner import CleanResult, LogCleaner
from cleaner.engine.manager import LogCleanerManager, ManagedLog, PartitionReport
from cleaner.engine.next_clean import NextCleanCache, NextCleanEstimate, estimate_next_clean, section_shape
from cleaner.errors import (
    CorruptRecordError,
    FileChangedError,
    KafkaCleanerError,
    LogDirLockedError,
    ThreadShutdownError,
    failure_reason,
    truncated_batch,
)
from cleaner.records.batch import LOG_OVERHEAD
from cleaner.replica_facts import ReplicaFacts, replica_facts
from cleaner.segment_facts import FactsCache, SegmentFacts
from cleaner.storage.log_dir import LogDirectory
from cleaner.storage.segment import LogSegment
from cleaner.storage.topic_partition import TopicPartition

log = logging.getLogger("cleaner.cleaning")


@dataclass
class CleanOutcome:
    results: list[CleanResult] = field(default_factory=list)
    uncleanable: dict[str, dict[TopicPartition, str]] = field(default_factory=dict)
    bytes_before: int = 0
    bytes_after: int = 0
    elapsed_seconds: float = 0.0
    """Wall time of the cleaning (a measurement: the policy's clock may be pinned)."""
    interrupted: bool = False
    """``stop`` was set before every thread was done: the rounds in flight were aborted."""
    still_eligible: list[TopicPartition] = field(default_factory=list)
    """After an interruption: the partitions a clean would still have taken."""


@contextlib.contextmanager
def locked(log_dirs: Sequence[LogDirectory]) -> Iterator[None]:
    """Hold every log dir's ``.lock`` (refusing, with ``LogDirLockedError``, a dir a broker
    holds) for the duration of the block."""
    with contextlib.ExitStack() as stack:
        for log_dir in log_dirs:
            if not log_dir.exists():
                raise KafkaCleanerError(f"{log_dir}: no such log directory")
            lock = log_dir.lock()
            lock.acquire()  # raises LogDirLockedError
            stack.callback(lock.release)
        yield


def clean(
    paths: Sequence[str | Path],
    policy: Policy,
    time: Time,
    *,
    threads: int | None = None,
    io_meter: Callable[[int], None] | None = None,
    stop: threading.Event | None = None,
    only: Callable[[TopicPartition], bool] | None = None,
) -> CleanOutcome:
    """Run cleaning rounds with the policy's cleaner settings until no partition is
    eligible. A partition that fails is marked uncleanable and reported; the others go on.
    ``only`` (the CLI's ``--topic``/``--partition``) limits the partitions considered."""
    log_dirs = [LogDirectory(p) for p in paths]
    config = with_threads(policy, threads)
    outcome = CleanOutcome()
    with locked(log_dirs):
        manager = LogCleanerManager(log_dirs, policy, time, only=only)
        managed = manager.logs()
        outcome.bytes_before = _total_bytes(managed.values())
        stop = stop or threading.Event()
        # A throttled clean sleeps; SIGINT/SIGTERM must not wait for the sleep to end.
        pool = LogCleaner(manager, config, StoppableTime(time, stop), exit_when_idle=True, io_meter=io_meter)
        started = _time.monotonic()
        pool.start()
        try:
            while any(t.is_alive() for t in pool.threads) and not stop.wait(0.05):
                pass
            outcome.interrupted = stop.is_set() and any(t.is_alive() for t in pool.threads)
        finally:
            pool.shutdown()
        outcome.elapsed_seconds = _time.monotonic() - started
        outcome.results = list(pool.results)
        outcome.uncleanable = manager.uncleanable_partitions()
        outcome.bytes_after = _total_bytes(manager.logs().values())
        if outcome.interrupted:
            now = time.milliseconds()
            outcome.still_eligible = [r.topic_partition for r in manager.report(now) if r.eligible]
    return outcome


def with_threads(policy: Policy, threads: int | None) -> CleanerConfig:
    """The policy's cleaner settings, with ``--threads`` when given."""
    return policy.cleaner if threads is None else replace(policy.cleaner, threads=threads)


def reports(
    paths: Sequence[str | Path], policy: Policy, time: Time, *, only: Callable[[TopicPartition], bool] | None = None
) -> list[PartitionReport]:
    """Every matched partition's cleaning picture from its files' sizes and offsets only
    (no record is read): what ``clean`` decides from, computed read-only."""
    log_dirs = [LogDirectory(p, read_only=True) for p in paths]
    return LogCleanerManager(log_dirs, policy, time, write_checkpoints=False, only=only).report(time.milliseconds())


def _total_bytes(logs: Iterable[ManagedLog]) -> int:
    return sum(m.log.size_in_bytes for m in logs)


@dataclass
class PartitionStatus:
    report: PartitionReport
    facts: SegmentFacts | None
    now_ms: int
    next_clean: NextCleanEstimate | None = None
    replica: ReplicaFacts | None = None
    """What the operator compares with the partition's other replicas (``replica_facts``)."""
    deletion: DeletionStatus | None = None
    """How long superseded records have been on disk, against the deadline (``cleaner.deletion``)."""
    error: BaseException | None = None
    """What ended this partition's look early (then it is reported uncleanable with it,
    unless it is a file the broker changed under the look, ``FileChangedError``: then the
    scan has no facts for it, and the next scan looks again)."""

    @property
    def oldest_tombstone_age_ms(self) -> int | None:
        if self.facts is None or self.facts.oldest_tombstone_timestamp is None:
            return None
        return max(self.now_ms - self.facts.oldest_tombstone_timestamp, 0)

    def as_dict(self) -> dict:
        r = self.report
        return {
            "logDir": r.log_dir,
            "topic": r.topic_partition.topic,
            "partition": r.topic_partition.partition,
            "compacted": r.compacted,
            "segments": r.segments,
            "sizeBytes": r.size_bytes,
            "logStartOffset": r.log_start_offset,
            "logEndOffset": r.log_end_offset,
            "highWatermark": r.high_watermark,
            "lastStableOffset": r.last_stable_offset,
            "firstDirtyOffset": r.first_dirty_offset,
            "firstUncleanableOffset": r.first_uncleanable_offset,
            "cleanBytes": r.clean_bytes,
            "cleanableBytes": r.cleanable_bytes,
            "uncleanableBytes": r.uncleanable_bytes,
            "cleanableRatio": round(r.cleanable_ratio, 6),
            "minCleanableRatio": r.min_cleanable_ratio,
            "eligible": r.eligible,
            "reason": r.reason,
            "uncleanableReason": r.uncleanable_reason,
            "compactionDelaySeconds": r.compaction_delay_ms / 1000.0,
            "records": self.facts.records if self.facts else None,
            "tombstones": self.facts.tombstones if self.facts else None,
            "oldestTombstoneAgeSeconds": (
                self.oldest_tombstone_age_ms / 1000.0 if self.oldest_tombstone_age_ms is not None else None
            ),
            "pendingStartup": r.pending_startup,
            "lsoHolder": self.lso_holder_view(),
            "clusterConfig": r.cluster_config,
            "configSources": r.config_sources,
            "configNotes": r.config_notes,
            "nextClean": self.next_clean_view(),
            "deletion": self.deletion.as_dict() if self.deletion is not None else None,
        }

    def next_clean_view(self) -> dict | None:
        """``nextClean`` of ``status --json`` and the sidecar's ``/status``."""
        e = self.next_clean
        if e is None:
            return None
        return {
            "dirtyRecords": e.dirty_records,
            "dirtyDistinctKeys": e.dirty_distinct_keys,
            "bytesFreed": e.bytes_freed,
            "kafkaPasses": e.kafka_passes,
            "passes": e.passes,
            "onePassDedupeBufferSize": e.one_pass_dedupe_buffer_size,
        }

    def lso_holder_view(self) -> dict | None:
        """``lsoHolder``: the open transaction that pins the last stable offset, if any."""
        holder = self.report.lso_holder
        if holder is None:
            return None
        started = holder.start_timestamp_ms
        return {
            "producerId": holder.producer_id,
            "producerEpoch": holder.producer_epoch,
            "firstOffset": holder.first_offset,
            "startTimestampMs": started,
            "ageSeconds": None if started is None else max(self.now_ms - started, 0) / 1000,
        }


def status(
    paths: Sequence[str | Path],
    policy: Policy,
    time: Time,
    *,
    facts_cache: FactsCache | None = None,
    manager: LogCleanerManager | None = None,
    throttle: Callable[[int], None] | None = None,
    next_clean: NextCleanCache | None = None,
    only: Callable[[TopicPartition], bool] | None = None,
    replicas: bool = False,
    deletion: DeletionCache | None = None,
) -> list[PartitionStatus]:
    """Every matched partition's cleaning picture, computed read-only: safe next to a
    live broker (no file is created, changed or locked). With ``next_clean``, also what
    the next clean of each compacted partition would meet (``engine.next_clean``): it
    reads every record of the cleanable section once, then only when that changes. With
    ``replicas``, also each compacted partition's :class:`ReplicaFacts` (a few hundred bytes read).
    With ``deletion``, also each compacted partition's deletion picture (``cleaner.deletion``:
    every record read, at most at the cache's interval and only when the segments changed)."""
    log_dirs = [LogDirectory(p, read_only=True) for p in paths]
    manager = manager or LogCleanerManager(log_dirs, policy, time, write_checkpoints=False, only=only)
    cache = facts_cache or FactsCache()
    now = time.milliseconds()
    out = []
    logs = manager.logs()
    for report in manager.report(now):
        managed = logs.get(report.topic_partition)
        if managed is None:
            continue  # created since the listing above: the next look sees it
        looked = _look(manager, managed, report, cache, throttle, policy, next_clean, now, replicas, deletion)
        if looked is not None:
            out.append(looked)
    if next_clean is not None:
        next_clean.retain(set(logs))
    if deletion is not None:
        deletion.retain(logs)
    return out


def _look(
    manager: LogCleanerManager,
    managed: ManagedLog,
    report: PartitionReport,
    cache: FactsCache,
    throttle: Callable[[int], None] | None,
    policy: Policy,
    next_clean: NextCleanCache | None,
    now: int,
    replicas: bool,
    deletion: DeletionCache | None = None,
) -> PartitionStatus | None:
    """One partition's status. A file a live broker changed under the look (retention
    renamed a segment away, its cleaner swapped one in: ``FileChangedError``) is no verdict
    on the partition: the directory is looked at again as it now is, once; a second change
    leaves this scan without its facts (the next scan reads them), and a partition dir
    renamed away meanwhile (a deletion, a move) is no partition here any more (None)."""
    tp = report.topic_partition
    for attempt in (1, 2):
        try:
            facts, damage = _log_facts(managed, cache, throttle)
            if damage is not None and report.reason != "uncleanable":
                # What the cleaner will meet when it reads this segment: said now, with its cause.
                report.eligible, report.reason, report.uncleanable_reason = False, "uncleanable", damage
            estimate = _next_clean(managed, report, policy, next_clean, now, throttle) if next_clean else None
            replica = (
                replica_facts(
                    managed.log,
                    report,
                    cluster=manager.cluster_metadata,
                    broker_id=manager.broker_id,
                    now_ms=now,
                    delete_retention_ms=managed.rule.delete_retention_ms,
                    throttle=throttle,
                )
                if replicas and report.compacted
                else None
            )
            removal = (
                _deletion(managed, report, deletion, now, throttle, manager.removal_hold(tp))
                if deletion and report.compacted
                else None
            )
        except ThreadShutdownError:
            raise
        except FileChangedError as e:
            if attempt == 2 or not managed.log.read_only:
                log.warning("cannot scan %s: %s", tp, e)
                return PartitionStatus(report, None, now, error=e)
            log.info("%s changed during the look (%s): looking again", tp, e)
            try:
                managed.log.refresh()
                report = manager.report_partition(managed, now)
            except FileChangedError as gone:
                if managed.log.moved():
                    log.info("%s in %s went away during the look: %s", tp, managed.log_dir, gone)
                    return None
                log.warning("cannot scan %s: %s", tp, gone)
                return PartitionStatus(report, None, now, error=gone)
            continue
        except Exception as e:
            # One partition's look failing (a bug, or a file the broker changed in a way no
            # reader expected) never costs the others theirs.
            log.exception("cannot look at %s", tp)
            report.eligible, report.reason, report.uncleanable_reason = False, "uncleanable", failure_reason(e)
            return PartitionStatus(report, None, now, error=e)
        return PartitionStatus(report, facts, now, estimate, replica, removal)
    raise AssertionError("unreachable")


def _next_clean(
    managed: ManagedLog,
    report: PartitionReport,
    policy: Policy,
    cache: NextCleanCache,
    now: int,
    throttle: Callable[[int], None] | None,
) -> NextCleanEstimate | None:
    if not report.compacted or report.reason == "uncleanable" or report.cleanable_bytes == 0:
        return None
    try:  # a live broker may delete or roll segments under the scan
        shape = section_shape(managed.log, report.first_dirty_offset, report.first_uncleanable_offset)
        known = cache.get(report.topic_partition, shape)
        if known is not None:
            return known
        estimate = estimate_next_clean(
            managed.log,
            report.first_dirty_offset,
            report.first_uncleanable_offset,
            dedupe_buffer_per_thread=policy.cleaner.dedupe_buffer_per_thread,
            load_factor=policy.cleaner.dedupe_buffer_load_factor,
            threads=policy.cleaner.threads,
            now_ms=now,
            delete_retention_ms=managed.rule.delete_retention_ms,
            throttle=throttle,
        )
    except FileChangedError as e:
        log.info(
            "%s changed during the estimate of its next clean (%s): the next scan estimates again",
            report.topic_partition,
            e,
        )
        return None
    except (KafkaCleanerError, OSError) as e:
        log.warning("cannot estimate the next clean of %s: %s", report.topic_partition, e)
        return None
    cache.put(report.topic_partition, shape, estimate)
    return estimate


def _deletion(
    managed: ManagedLog,
    report: PartitionReport,
    cache: DeletionCache,
    now: int,
    throttle: Callable[[int], None] | None,
    removal_hold: str | None,
) -> DeletionStatus | None:
    facts = cache.facts(managed, now, throttle)
    if facts is None:
        return None
    segments = managed.log.segments
    active = segments[-1].base_offset if segments else None
    return deletion_status(facts, report, managed.rule, active, now, removal_hold=removal_hold)


def _log_facts(
    managed: ManagedLog, cache: FactsCache, throttle: Callable[[int], None] | None = None
) -> tuple[SegmentFacts | None, str | None]:
    """The partition's record facts, and the damage found in a segment the cleaner reads
    (every one but the active segment): a batch cut short by the end of its file, or bytes
    that do not decode. A broker may be writing the active segment, so an incomplete tail
    there is not damage."""
    segments = managed.log.segments
    total = SegmentFacts()
    for i, segment in enumerate(segments):
        active = i == len(segments) - 1
        try:
            facts = cache.facts(segment, active=active, throttle=throttle)
        except (FileChangedError, ThreadShutdownError):
            raise  # renamed away or rewritten under the read (the caller looks again); stopping
        except (KafkaCleanerError, OSError) as e:
            log.warning("cannot scan %s: %s", managed.topic_partition, e)
            return None, None if active else str(e)
        total = total + facts
        if not active:
            read = cache.stamp_of(segment)
            if read is not None and read.size != segment.size:
                # Another file under the name since the listing (a swap): its size, not
                # the listed one's, says whether it is whole. Look again at the dir.
                raise FileChangedError(segment.log_path, f"{segment.size} bytes when listed, {read.size} when read")
            if facts.bytes_scanned < segment.size:
                return total, str(_truncation(segment, facts.bytes_scanned))
    return total, None


def _truncation(segment: LogSegment, position: int) -> CorruptRecordError:
    """The batch at ``position`` that the end of the file cuts short, in the cleaner's words."""
    left = segment.size - position
    header = segment.read(position, LOG_OVERHEAD)
    needed = int.from_bytes(header[8:12], "big", signed=True) + LOG_OVERHEAD if len(header) == LOG_OVERHEAD else None
    return truncated_batch(segment.log_path, position, needed, left)


__all__ = [
    "CleanOutcome",
    "LogDirLockedError",
    "PartitionStatus",
    "clean",
    "locked",
    "reports",
    "status",
    "with_threads",
]
