"""What one replica of a partition says about its log, for comparison with the other replicas
(issue 14, item 5): offsets, the sizes of the clean and the dirty section, and a few batches
("probes") that any other in-sync replica holds byte for byte.

Why batches of the dirty section are comparable across replicas, from Kafka's code
(``core/src/main/scala/kafka/server/ReplicaFetcherThread.scala``, ``processPartitionData``):
a follower appends what it fetched with ``log.appendAsFollower(records)``, the leader's
batches as they are; only the leader assigns offsets (``appendAsLeader`` validates and
assigns, ``appendAsFollower`` does not). So below the high watermark every in-sync replica
holds the same batches at the same offsets: same base offset, same last offset, same CRC
(a v2 batch's CRC covers everything from the attributes to the end, i.e. every record; the
partition leader epoch, which it does not cover, is written by the leader too). The same
file's ``handleOffsetOutOfRange`` names the exception: after an unclean leader election
"there is a potential for a mismatch between the logs of the two replicas here. We don't
fix this mismatch as of now." That mismatch, a head that differs on one replica, is what the
operator looks for.

What is *not* comparable: the clean section. Each broker's cleaner runs on its own schedule
over its own dirty range, so the batches below a replica's cleaner checkpoint (its first
dirty offset) are rewritten per broker (v2 keeps a rewritten batch's base and last offset,
not its CRC). A probe is therefore only taken at or above the replica's first dirty offset,
and below its high watermark (what is above may still be truncated by a leader change; the
``replication-offset-checkpoint`` the broker writes every few seconds is a lower bound of it,
which is safe). Two probes per partition: the last batch below the high watermark, and the
batch at or after the high watermark rounded down to a multiple of :data:`PROBE_ALIGNMENT`,
an offset every replica within that many offsets of the others picks alike, so a follower a
little behind still has a probe the leader has too.

The replication race (issue 24, item 2). Each broker's cleaner removes a tombstone or a
transaction marker on its own replica once the batch's delete horizon has passed (Kafka's
``LogCleaner``: ``MemoryRecords.filterTo`` stores ``deleteHorizonMs = clean time +
delete.retention.ms`` in a batch holding tombstones, or the marker of a transaction whose data
is gone, the first time it is cleaned; a later clean drops them once the horizon is past). A
replica out of the ISR, or offline, longer than that never receives what was removed above its
log end offset. So each replica reports, for a partition its ``__cluster_metadata`` shows with a
replica out of sync: its broker id, the ISR and the replicas out of it since when
(:class:`~cleaner.storage.cluster_metadata.Replication`), and :class:`Removal` points: the
earliest time any cleaner may remove a tombstone or marker it holds at or above an offset. The
earliest time is the batch's stored horizon when it has one, else no earlier than the next
clean's time + ``delete.retention.ms``, whose lower bound is now + ``delete.retention.ms``
(raising the topic's ``delete.retention.ms`` therefore moves only the batches not cleaned yet).
Approximations, each on the early side (a warning too soon, never too late): a batch with a
stored horizon counts as holding a tombstone even if its tombstones are gone (Kafka keeps the
horizon on a rewritten batch), and a marker's removal also waits for its transaction's data,
which is not modelled. Legacy (magic 0/1) batches are not looked at. The read walks the
partition's batches (throttled like the scan) only while a replica is out of sync: a cluster in
sync costs nothing and reports no removals.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cleaner.engine.manager import PartitionReport
from cleaner.errors import FileChangedError, KafkaCleanerError
from cleaner.records.batch import LOG_OVERHEAD
from cleaner.records.columns import decode_records
from cleaner.storage.cluster_metadata import ClusterMetadata, Replication
from cleaner.storage.log import Log
from cleaner.storage.segment import open_for_read

__all__ = ["MAX_REMOVALS", "PROBE_ALIGNMENT", "BatchProbe", "Removal", "ReplicaFacts", "removals", "replica_facts"]

log = logging.getLogger(__name__)

#: Offsets the aligned probe is rounded down to: replicas whose high watermarks lie in the
#: same block of this many offsets pick the same batch.
PROBE_ALIGNMENT = 1024
#: A v2 batch header up to lastOffsetDelta: baseOffset, length, partitionLeaderEpoch, magic,
#: crc, attributes, lastOffsetDelta.
_HEAD = struct.Struct(">qiibIhi")
_INDEX_ENTRY = struct.Struct(">ii")
#: Batch headers walked from an index entry before giving up (a missing index: from the
#: segment's start).
_MAX_WALK = 4096
#: Removal points a partition reports at most (the memory of the walk, too): past it, the two
#: points closest in time merge, keeping the earlier time (so the answer errs early).
MAX_REMOVALS = 8


@dataclass(frozen=True)
class Removal:
    """A tombstone or transaction marker at ``offset`` that a cleaner may remove from
    ``removable_at_ms`` on; the points of a replica are in offset order with rising times, so
    the earliest removal at or above any offset X is the time of the first point at or above X."""

    offset: int
    removable_at_ms: int

    def as_status(self) -> list[int]:
        return [self.offset, self.removable_at_ms]


@dataclass(frozen=True)
class BatchProbe:
    """One batch of the replica's dirty section: its offsets and its CRC."""

    base_offset: int
    last_offset: int
    crc: int

    def as_status(self) -> list[int]:
        return [self.base_offset, self.last_offset, self.crc]


@dataclass(frozen=True)
class ReplicaFacts:
    log_start_offset: int
    log_end_offset: int
    high_watermark: int | None
    first_dirty_offset: int
    clean_bytes: int
    dirty_bytes: int
    probes: tuple[BatchProbe, ...] = ()
    min_cleanable_ratio: float = 0.5
    """The partition's ``min.cleanable.dirty.ratio``: above it, its cleaner is due."""
    probe_error: KafkaCleanerError | OSError | None = None
    """Why there are no probes this time (a file the broker changed under the read, most
    often); not in ``/status``: the next scan probes again."""
    broker_id: int | None = None
    """This replica's broker (``meta.properties``' node.id), when known."""
    replication: Replication | None = None
    """The partition's replication from ``__cluster_metadata`` on this disk, when known."""
    removals: tuple[Removal, ...] = ()
    """Only while a replica is out of sync (module doc)."""
    open_transaction: tuple[int, int] | None = None
    """(producer id, first offset) of the transaction open below the high watermark that holds
    the last stable offset, where it binds the cleaning: another replica that has cleaned past
    that offset ended it there, and a replica that fetched past its marker and still holds it
    open never received the marker (manifestation 4, ``operator/divergence.py``)."""

    def as_status(self, topic: str, partition: int) -> dict[str, object]:
        out: dict[str, object] = {
            "topic": topic,
            "partition": partition,
            "logStartOffset": self.log_start_offset,
            "logEndOffset": self.log_end_offset,
            "highWatermark": self.high_watermark,
            "firstDirtyOffset": self.first_dirty_offset,
            "cleanBytes": self.clean_bytes,
            "dirtyBytes": self.dirty_bytes,
            "minCleanableRatio": self.min_cleanable_ratio,
            "batches": [p.as_status() for p in self.probes],
        }
        if self.broker_id is not None:
            out["brokerId"] = self.broker_id
        if self.replication is not None and self.replication.out_of_sync:
            r = self.replication
            out["replication"] = {
                "leader": r.leader,
                "isr": list(r.isr),
                "outOfSync": [{"broker": o.broker, "sinceMs": o.since_ms, "offline": o.offline} for o in r.out_of_sync],
            }
            out["removals"] = [x.as_status() for x in self.removals]
        if self.open_transaction is not None:
            producer, first = self.open_transaction
            out["openTransaction"] = {"producerId": producer, "firstOffset": first}
        return out


def probe_offsets(first_dirty_offset: int, high_watermark: int) -> list[int]:
    """The offsets whose batches are probed: the last one below the high watermark, and the
    aligned one, when they lie in the dirty section (each at most once)."""
    last = high_watermark - 1
    aligned = last - last % PROBE_ALIGNMENT
    return sorted({o for o in (last, aligned) if first_dirty_offset <= o < high_watermark})


def replica_facts(
    partition_log: Log,
    report: PartitionReport,
    *,
    cluster: ClusterMetadata | None = None,
    broker_id: int | None = None,
    now_ms: int = 0,
    delete_retention_ms: int = 86_400_000,
    throttle: Callable[[int], None] | None = None,
    max_removals: int = MAX_REMOVALS,
) -> ReplicaFacts:
    """The replica's facts from the scan's report and a few hundred bytes read for the probes
    (a live broker may roll, trim or delete a segment under them: then no probes and
    ``probe_error`` says why, the rest stands). With ``cluster`` (the metadata on this disk),
    also the partition's replication, and while a replica is out of sync the :class:`Removal`
    points (``removals``: the partition's batches read, through ``throttle``). Anything else
    raised is a bug: the caller's."""
    dirty = max(report.size_bytes - report.clean_bytes, 0)
    probes: list[BatchProbe] = []
    error: KafkaCleanerError | OSError | None = None
    hw = report.high_watermark
    tp = report.topic_partition
    replication = cluster.replication(tp.topic, tp.partition) if cluster is not None else None
    points: list[Removal] = []
    try:
        if hw is not None:
            upper = min(hw, report.log_end_offset)
            for offset in probe_offsets(report.first_dirty_offset, upper):
                probe = _batch_at(partition_log, offset)
                if probe is not None and probe.last_offset < upper and probe not in probes:
                    probes.append(probe)
        if cluster is not None and replication is not None and replication.out_of_sync:
            retention = _earliest_retention_ms(cluster, tp.topic, broker_id, delete_retention_ms)
            points = removals(partition_log, now_ms + retention, throttle, max_removals)
    except (KafkaCleanerError, OSError) as e:
        # A file the broker renamed away or changed under the probe is no fault (the next
        # scan probes the files as they are then); anything else is worth a warning.
        level = logging.INFO if isinstance(e, FileChangedError) else logging.WARNING
        log.log(level, "cannot probe %s: %s", report.topic_partition, e)
        probes, points, error = [], [], e
    return ReplicaFacts(
        log_start_offset=report.log_start_offset,
        log_end_offset=report.log_end_offset,
        high_watermark=hw,
        first_dirty_offset=report.first_dirty_offset,
        clean_bytes=report.clean_bytes,
        dirty_bytes=dirty,
        probes=tuple(probes),
        min_cleanable_ratio=report.min_cleanable_ratio,
        probe_error=error,
        broker_id=broker_id,
        replication=replication,
        removals=tuple(points),
        open_transaction=_open_transaction(report),
    )


def _open_transaction(report: PartitionReport) -> tuple[int, int] | None:
    holder, hw = report.lso_holder, report.high_watermark
    if holder is None or hw is None or holder.first_offset >= hw:
        return None
    return holder.producer_id, holder.first_offset


def _earliest_retention_ms(cluster: ClusterMetadata, topic: str, broker_id: int | None, ours: int) -> int:
    """The shortest ``delete.retention.ms`` a cleaner of this partition may use: kafka-cleaner's
    (``ours``, which never goes below the cluster's) or Kafka's own, the topic's config in the
    metadata (a static ``server.properties`` default is invisible on disk)."""
    known = cluster.topic(topic, broker_id).get("delete.retention.ms")
    try:
        return min(ours, int(known.value)) if known is not None else ours
    except ValueError:
        return ours


def removals(
    partition_log: Log,
    dirty_removable_at_ms: int,
    throttle: Callable[[int], None] | None = None,
    max_removals: int = MAX_REMOVALS,
) -> list[Removal]:
    """The suffix minima of (offset, earliest removal) over the log's tombstones and markers
    (module doc), at most ``max_removals`` of them. ``dirty_removable_at_ms``: the earliest a
    batch without a stored horizon can lose one (now + ``delete.retention.ms``).

    Batches with a stored horizon and control batches are told apart by their header; only a
    data batch without a horizon is decoded, to see whether it holds a tombstone."""
    points: list[Removal] = []
    for batches in partition_log.iter_batches(partition_log.log_start_offset):
        if throttle is not None:
            throttle(int(batches.sizes.sum()))
        v2 = batches.select(batches.is_v2)
        if not len(v2):
            continue
        candidates = v2.has_delete_horizon | v2.is_control
        plain = np.flatnonzero(~candidates)
        if len(plain):
            plain_batches = v2.select(~candidates)
            columns = decode_records(plain_batches)
            with_tombstones = np.zeros(len(plain_batches), dtype=bool)
            with_tombstones[columns.batch[columns.is_tombstone]] = True
            candidates = candidates.copy()
            candidates[plain[with_tombstones]] = True
        for i in np.flatnonzero(candidates).tolist():
            at = int(v2.headers["base_timestamp"][i]) if v2.has_delete_horizon[i] else dirty_removable_at_ms
            _push(points, Removal(int(v2.last_offsets[i]), at), max_removals)
    return points


def _push(points: list[Removal], point: Removal, max_removals: int) -> None:
    """Add a later offset's point: those at or after its time are no suffix minima any more;
    past ``max_removals``, the two closest in time merge into the later offset with the earlier
    time (an answer that errs early, never late)."""
    while points and points[-1].removable_at_ms >= point.removable_at_ms:
        points.pop()
    points.append(point)
    if len(points) > max(max_removals, 1):
        if max_removals <= 1:
            points[:] = [Removal(points[-1].offset, points[0].removable_at_ms)]
            return
        i = min(range(len(points) - 1), key=lambda j: points[j + 1].removable_at_ms - points[j].removable_at_ms)
        points[i : i + 2] = [Removal(points[i + 1].offset, points[i].removable_at_ms)]


def _batch_at(partition_log: Log, offset: int) -> BatchProbe | None:
    """The first batch whose last offset is at least ``offset``, found without reading an
    index or the segment: a binary search of the ``.index`` file with 8-byte reads (a live
    broker's active index is preallocated, 10 MiB of which only the head holds entries), then
    a walk over batch headers (27-byte reads) from that entry's batch, a few KiB of the log at
    most (Kafka indexes every ``index.interval.bytes``, 4 KiB by default). None when that
    segment holds no such batch, or a legacy (magic 0/1) one."""
    segment = partition_log.floor_segment(offset)
    if segment is None:
        return None
    position = _index_floor(segment.index_path, segment.base_offset, offset)
    with open_for_read(segment.log_path) as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        for _ in range(_MAX_WALK):
            head = os.pread(fd, _HEAD.size, position)
            if len(head) < _HEAD.size:
                if position + _HEAD.size <= size:  # truncated since the fstat
                    raise FileChangedError(segment.log_path, f"{size} bytes at first, a short read at byte {position}")
                return None
            base, length, _epoch, magic, crc, _attributes, last_delta = _HEAD.unpack(head)
            if magic < 2 or length < _HEAD.size - LOG_OVERHEAD or position + LOG_OVERHEAD + length > size:
                return None  # legacy, or a batch the broker is still writing
            if base + last_delta >= offset:
                return BatchProbe(base, base + last_delta, crc)
            position += LOG_OVERHEAD + length
    return None


def _index_floor(index_path: Path, base_offset: int, offset: int) -> int:
    """The log position of the last ``.index`` entry at or below ``offset``, else 0 (also
    when there is no index). Entries are (relative offset, position) pairs in offset order;
    the zeros a preallocated index ends with count as beyond every offset (only the first
    entry can have position 0).

    A broker trims its active index at a roll (from the preallocated size to its entries),
    possibly between the ``fstat`` and a read: a short read raises :class:`FileChangedError`."""
    try:
        with open(index_path, "rb") as f:
            fd = f.fileno()
            size = os.fstat(fd).st_size
            lo, hi = 0, size // 8 - 1
            found = 0
            while lo <= hi:
                mid = (lo + hi) // 2
                entry = os.pread(fd, 8, mid * 8)
                if len(entry) < 8:
                    raise FileChangedError(
                        index_path, f"{size} bytes at first, {len(entry)} of entry {mid}'s 8 at byte {mid * 8} later"
                    )
                relative, position = _INDEX_ENTRY.unpack(entry)
                if (mid == 0 or position > 0) and base_offset + relative <= offset:
                    found, lo = position, mid + 1
                else:
                    hi = mid - 1
            return found
    except FileNotFoundError:
        return 0
