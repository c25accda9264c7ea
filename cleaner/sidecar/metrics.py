"""The sidecar's Prometheus metrics (prefix ``kafka_cleaner_``, base units).

Gauges that describe the log are computed from the latest scan when Prometheus scrapes
(a custom collector), so they are never stale by more than one scan and cost nothing in
between. Counters and the clean-duration histogram are updated as cleans finish. Bytes
are exported, not only ratios, so that sums across brokers stay meaningful.

Kafka JMX equivalents are listed in the README.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cleaner.engine.log_cleaner import CleanResult
from cleaner.errors import FileChangedError, KafkaCleanerError

from .report import ScanSnapshot

PREFIX = "kafka_cleaner_"
SCAN_FAILURE_REASONS = ("file_changed", "unreadable", "unexpected")
LOOP_STEPS = ("scan", "mode", "turn")


def failure_kind(error: BaseException) -> str:
    """The ``reason`` label of a partition's failed look (``SCAN_FAILURE_REASONS``)."""
    if isinstance(error, (FileChangedError, FileNotFoundError, NotADirectoryError)):
        return "file_changed"
    if isinstance(error, (KafkaCleanerError, OSError)):
        return "unreadable"
    return "unexpected"


@dataclass
class CleanerGauges:
    """Kafka's LogCleaner / LogCleanerManager gauges at scrape time."""

    max_buffer_utilization: float = 0.0
    recopy_ratio: float = 0.0
    max_clean_time_seconds: float = 0.0
    max_compaction_delay_seconds: float = 0.0
    dead_threads: int = 0
    thread_deaths: int = 0
    """Cleaner threads that died since the sidecar started (a counter: each compact pass has
    new threads, so ``dead_threads`` is back at 0 at the next pass; this is what alerts use)."""
    stage_min_free_disk_ratio: float | None = None
    """Stage mode's ``stage.minFreeDiskRatio``: below it no set is staged and staged sets are
    deleted, largest first."""
    time_since_last_run_seconds: float = 0.0
    policy_generation: int | None = None


class SidecarMetrics:
    def __init__(
        self,
        snapshot: Callable[[], ScanSnapshot | None],
        gauges: Callable[[], CleanerGauges],
        per_partition: Callable[[str], bool],
        max_partition_series: Callable[[], int],
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.bytes_read = Counter(
            PREFIX + "bytes_read", "Bytes read by cleaning (map building and rewriting)", registry=self.registry
        )
        self.bytes_written = Counter(PREFIX + "bytes_written", "Bytes written by cleaning", registry=self.registry)
        self.records_removed = Counter(
            PREFIX + "records_removed", "Records removed by cleaning", ["topic"], registry=self.registry
        )
        self.tombstones_removed = Counter(
            PREFIX + "tombstones_removed", "Tombstones removed by cleaning", ["topic"], registry=self.registry
        )
        self.cleanings = Counter(PREFIX + "cleanings", "Cleaning rounds by result", ["result"], registry=self.registry)
        self.clean_duration = Histogram(
            PREFIX + "clean_duration_seconds",
            "Duration of one cleaning round",
            buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
            registry=self.registry,
        )
        self.scan_bytes_read = Counter(
            PREFIX + "scan_bytes_read", "Bytes read by observe scans", registry=self.registry
        )
        self.deletion_bytes_read = Counter(
            PREFIX + "deletion_scan_bytes_read",
            "Bytes read for the deletion facts (every record of a partition whose segments changed, at most "
            "every reporting.deletionIntervalSeconds)",
            registry=self.registry,
        )
        self.stage_sets_discarded = Counter(
            PREFIX + "stage_sets_discarded",
            "Staged sets discarded, not committed: the policy or the cluster's topic config in force no longer "
            "wants them (reason: policyGone, notStageMode, paused, noRule, notCompacted, brokerCompacts, tiered, "
            "configChanged, notRecorded)",
            ["reason"],
            registry=self.registry,
        )
        self.scan_failures = Counter(
            PREFIX + "scan_failures",
            "Partitions whose look in a scan failed, by reason: file_changed (a file the broker changed "
            "under the read), unreadable (an I/O error or bytes that do not parse), unexpected (a bug)",
            ["reason"],
            registry=self.registry,
        )
        self.loop_errors = Counter(
            PREFIX + "loop_errors",
            "Exceptions the sidecar's loop caught and went on after, by step: scan (a whole scan), "
            "mode (the mode's step), turn (anything else in one turn of the loop)",
            ["step"],
            registry=self.registry,
        )
        for reason in SCAN_FAILURE_REASONS:  # every series exists from the start (rate() sees the first one)
            self.scan_failures.labels(reason)
        for step in LOOP_STEPS:
            self.loop_errors.labels(step)
        self.registry.register(_LogCollector(snapshot, gauges, per_partition, max_partition_series))

    def record_clean(self, result: CleanResult) -> None:
        s = result.stats
        self.bytes_read.inc(s.bytes_read + s.map_bytes_read)
        self.bytes_written.inc(s.bytes_written)
        self.records_removed.labels(result.topic_partition.topic).inc(max(s.records_removed, 0))
        self.tombstones_removed.labels(result.topic_partition.topic).inc(s.tombstones_removed)
        self.cleanings.labels("success").inc()
        self.clean_duration.observe(s.elapsed_secs)

    def record_failure(self) -> None:
        self.cleanings.labels("failure").inc()


class _LogCollector(Collector):
    def __init__(
        self,
        snapshot: Callable[[], ScanSnapshot | None],
        gauges: Callable[[], CleanerGauges],
        per_partition: Callable[[str], bool],
        max_partition_series: Callable[[], int],
    ) -> None:
        self._snapshot = snapshot
        self._gauges = gauges
        self._per_partition = per_partition
        self._max_series = max_partition_series

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        g = self._gauges()
        snap = self._snapshot()

        def gauge(
            name: str, doc: str, value: float | None = None, labels: list[str] | None = None
        ) -> GaugeMetricFamily:
            family = GaugeMetricFamily(PREFIX + name, doc, labels=labels)
            if value is not None:
                family.add_metric([], value)
            return family

        yield gauge(
            "max_buffer_utilization_ratio",
            "Offset map utilization of the last clean per thread, max (0..1)",
            g.max_buffer_utilization,
        )
        yield gauge("recopy_ratio", "Bytes written / bytes read over each thread's last clean", g.recopy_ratio)
        yield gauge("max_clean_time_seconds", "Duration of the longest last clean per thread", g.max_clean_time_seconds)
        yield gauge(
            "max_compaction_delay_seconds",
            "How far past max.compaction.lag.ms the oldest dirty data is",
            max(g.max_compaction_delay_seconds, (snap.max_compaction_delay_ms / 1000.0) if snap else 0.0),
        )
        yield gauge(
            "dead_threads", "Cleaner threads of the current pass that died of an unexpected error", g.dead_threads
        )
        deaths = CounterMetricFamily(
            PREFIX + "cleaner_thread_deaths",
            "Cleaner threads that died of an unexpected error since the sidecar started",
        )
        deaths.add_metric([], g.thread_deaths)
        yield deaths
        if g.stage_min_free_disk_ratio is not None:
            yield gauge(
                "stage_min_free_disk_ratio",
                "stage.minFreeDiskRatio: below it nothing is staged and staged sets are deleted",
                g.stage_min_free_disk_ratio,
            )
        yield gauge(
            "time_since_last_run_seconds", "Seconds since the cleaner last chose a log", g.time_since_last_run_seconds
        )
        if g.policy_generation is not None:
            yield gauge("policy_generation", "metadata.generation of the loaded policy", g.policy_generation)
        if snap is None:
            return
        yield gauge(
            "max_dirty_ratio", "Highest cleanable ratio over the compacted partitions (0..1)", snap.max_dirty_ratio
        )
        yield gauge("last_scan_timestamp_seconds", "When the last scan finished", snap.scanned_at_ms / 1000.0)
        uncleanable = GaugeMetricFamily(
            PREFIX + "uncleanable_partitions", "Partitions marked uncleanable", labels=["log_dir"]
        )
        uncleanable_bytes = GaugeMetricFamily(
            PREFIX + "uncleanable_bytes", "Cleanable bytes of the uncleanable partitions", labels=["log_dir"]
        )
        free = GaugeMetricFamily(
            PREFIX + "log_dir_free_bytes", "Free bytes on the log dir's filesystem", labels=["log_dir"]
        )
        free_ratio = GaugeMetricFamily(
            PREFIX + "log_dir_free_ratio",
            "Free bytes / size of the log dir's filesystem (0..1; compare stage_min_free_disk_ratio)",
            labels=["log_dir"],
        )
        for d in snap.log_dirs:
            uncleanable.add_metric([d.path], d.uncleanable_partitions)
            uncleanable_bytes.add_metric([d.path], d.uncleanable_bytes)
            free.add_metric([d.path], d.free_bytes)
            if d.total_bytes > 0:  # 0: the filesystem could not be read
                free_ratio.add_metric([d.path], d.free_bytes / d.total_bytes)
        yield uncleanable
        yield uncleanable_bytes
        yield free
        yield free_ratio
        per_topic = {
            "topic_dirty_bytes": ("Bytes after the clean section (cleanable and not yet cleanable)", "dirty_bytes"),
            "topic_cleanable_bytes": ("Bytes the cleaner may clean now", "cleanable_bytes"),
            "topic_clean_bytes": ("Bytes already cleaned", "clean_bytes"),
            "topic_tombstones": ("Tombstones on disk", "tombstones"),
            "topic_staged_bytes": ("Staged bytes awaiting a commit (start-up gate, termination)", "staged_bytes"),
            "topic_next_clean_freed_bytes": ("Bytes the next clean is estimated to free", "next_clean_freed_bytes"),
            "topic_kafka_cleaning_passes": (
                "Most passes Kafka's cleaner needs over one partition's dirty section with this dedupe buffer",
                "kafka_passes",
            ),
            "topic_one_pass_dedupe_buffer_bytes": (
                "log.cleaner.dedupe.buffer.size with which Kafka cleans each partition in one pass",
                "one_pass_dedupe_buffer_size",
            ),
        }
        families = {
            name: GaugeMetricFamily(PREFIX + name, doc, labels=["topic"]) for name, (doc, _) in per_topic.items()
        }
        age = GaugeMetricFamily(
            PREFIX + "topic_oldest_tombstone_age_seconds", "Age of the oldest tombstone", labels=["topic"]
        )
        dirty_ts = GaugeMetricFamily(
            PREFIX + "topic_oldest_dirty_timestamp_seconds",
            "Timestamp of the oldest dirty data (first batch of the oldest dirty segment)",
            labels=["topic"],
        )
        for t in snap.topics():
            for name, (_, attr) in per_topic.items():
                families[name].add_metric([t.topic], getattr(t, attr))
            if t.oldest_tombstone_age_ms is not None:
                age.add_metric([t.topic], t.oldest_tombstone_age_ms / 1000.0)
            if t.oldest_dirty_timestamp_ms is not None:
                dirty_ts.add_metric([t.topic], t.oldest_dirty_timestamp_ms / 1000.0)
        yield from families.values()
        yield age
        yield dirty_ts
        yield self._lso_holders(snap)
        yield from self._deletion_series(snap)
        yield from self._partition_series(snap)

    @staticmethod
    def _lso_holders(snap: ScanSnapshot) -> Metric:
        """One series per partition whose last stable offset an open transaction pins (few:
        a hanging transaction is the exception), for the KafkaCleanerHangingTransaction alert."""
        holders = GaugeMetricFamily(
            PREFIX + "lso_holder_age_seconds",
            "Age of the open transaction that pins the partition's last stable offset",
            labels=["topic", "partition", "producer_id", "producer_epoch"],
        )
        for s in snap.statuses:
            holder = s.lso_holder_view()
            if holder is None or holder["ageSeconds"] is None:
                continue
            tp = s.report.topic_partition
            labels = [tp.topic, str(tp.partition), str(holder["producerId"]), str(holder["producerEpoch"])]
            holders.add_metric(labels, holder["ageSeconds"])
        return holders

    def _deletion_series(self, snap: ScanSnapshot) -> Iterator[Metric]:
        """Per partition with a deletion deadline (``cleaner.deletion``): its oldest superseded
        age, its deadline and whether it is breached, with what holds it back (the alert's
        label). Breached partitions first, capped by ``reporting.maxPartitionSeries``; the count
        of breached partitions is exported whatever the cap."""
        labels = ["topic", "partition"]
        age = GaugeMetricFamily(
            PREFIX + "partition_oldest_superseded_age_seconds",
            "Since the earliest overwrite or tombstone of a key whose older record is still on disk "
            "(a lower bound when the keys overflow the dedupe buffer)",
            labels=labels,
        )
        tombstone = GaugeMetricFamily(
            PREFIX + "partition_oldest_expired_tombstone_age_seconds",
            "How long the oldest tombstone still on disk has been past its delete horizon",
            labels=labels,
        )
        deadline = GaugeMetricFamily(
            PREFIX + "partition_deletion_deadline_seconds",
            "deletionDeadlineMs of the partition's topic (default max.compaction.lag.ms), in seconds",
            labels=labels,
        )
        breached = GaugeMetricFamily(
            PREFIX + "partition_deletion_deadline_breached",
            "1 when superseded records or expired tombstones are on disk past the deadline, with what holds "
            "them back (activeSegment, lso, minCompactionLag, dirtyRatio, paused, uncleanable, cleaning, cleaner, "
            "replicaOutOfSync)",
            labels=[*labels, "held_back_by"],
        )
        with_deadline = [s for s in snap.statuses if s.deletion is not None and s.deletion.deadline_ms is not None]
        with_deadline.sort(key=lambda s: (not s.deletion.breached, str(s.report.topic_partition)))  # type: ignore[union-attr]
        for s in with_deadline[: max(self._max_series(), 0)]:
            d = s.deletion
            assert d is not None and d.deadline_ms is not None
            tp = [s.report.topic_partition.topic, str(s.report.topic_partition.partition)]
            if d.oldest_superseded_age_ms is not None:
                age.add_metric(tp, d.oldest_superseded_age_ms / 1000.0)
            if d.oldest_expired_tombstone_age_ms is not None:
                tombstone.add_metric(tp, d.oldest_expired_tombstone_age_ms / 1000.0)
            deadline.add_metric(tp, d.deadline_ms / 1000.0)
            breached.add_metric([*tp, d.held_back_by or ""], 1.0 if d.breached else 0.0)
        count = GaugeMetricFamily(
            PREFIX + "deletion_deadline_breached_partitions",
            "Partitions past their deletion deadline (all of them, whatever maxPartitionSeries)",
        )
        count.add_metric([], sum(1 for s in with_deadline if s.deletion is not None and s.deletion.breached))
        yield from (age, tombstone, deadline, breached, count)

    def _partition_series(self, snap: ScanSnapshot) -> Iterator[Metric]:
        ratio = GaugeMetricFamily(
            PREFIX + "partition_cleanable_ratio",
            "Cleanable ratio (opt-in per topic rule)",
            labels=["topic", "partition"],
        )
        cleanable = GaugeMetricFamily(
            PREFIX + "partition_cleanable_bytes",
            "Cleanable bytes (opt-in per topic rule)",
            labels=["topic", "partition"],
        )
        budget = self._max_series()
        for s in snap.statuses:
            if budget <= 0:
                break
            tp = s.report.topic_partition
            if not self._per_partition(tp.topic):
                continue
            ratio.add_metric([tp.topic, str(tp.partition)], s.report.cleanable_ratio)
            cleanable.add_metric([tp.topic, str(tp.partition)], s.report.cleanable_bytes)
            budget -= 1
        yield ratio
        yield cleanable
