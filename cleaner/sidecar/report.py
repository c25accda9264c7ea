"""What one scan found, per topic and per partition, and the ``/status`` document built
from it (version 1; the contract with the operator, whose schema is
``docs/sidecar-status-v1.schema.json``).

The document stays under 64 KiB whatever the broker holds: ``partitions`` lists the top
``reporting.topPartitions`` by cleanable ratio plus the uncleanable ones, ``errors`` the
last 20 (messages cut to ``MAX_MESSAGE_CHARS``), and when even that is too large
(thousands of topics or uncleanable partitions) the lists are cut, least interesting
first, and ``truncated`` says by how much.

``replicas`` carries what the operator compares across the replicas of a partition
(``cleaner.replica_facts``) for the compacted partitions, in what room is left (at most
:data:`MAX_REPLICA_BYTES`). When not all fit, every broker picks by the same hash of
(rotation, partition), where the rotation is the scan time in :data:`REPLICA_ROTATION_MS`
steps: a partition then tends to be reported by all of its replicas in the same rotation
(each broker keeps the lowest hashes), and over the rotations every partition is.
"""

from __future__ import annotations

import datetime
import json
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cleaner.cleaning import PartitionStatus
from cleaner.in_sync import InSync
from cleaner.storage.topic_partition import TopicPartition

STATUS_VERSION = 1
MAX_STATUS_BYTES = 64 * 1024
MAX_ERRORS = 20
MAX_MESSAGE_CHARS = 1024
"""Error messages and uncleanable reasons are cut to this (an exception text can be long)."""
MAX_REPLICA_BYTES = 24 * 1024
"""The ``replicas`` section's share of the document (about 100 partitions, 220-260 bytes each)."""
REPLICA_RESERVE_BYTES = 8 * 1024
"""Left free after ``replicas`` for what the service adds to the document (gate, stage)."""
REPLICA_ROTATION_MS = 10 * 60 * 1000
_EMPTY_REPLICAS = len(',"replicas":{"rotation":,"partitions":[],"omitted":}') + 2 * 20
"""The replicas section with no partition (its two numbers at their longest)."""
_REASONS = {"ratio", "lag", "lso", "activeSegment", "uncleanable", "paused"}


def rfc3339(ms: int | None) -> str | None:
    if ms is None:
        return None
    return (
        datetime.datetime.fromtimestamp(ms / 1000.0, tz=datetime.UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


@dataclass
class LogDirInfo:
    path: str
    partitions: int = 0
    lock_held_by_broker: bool | None = None
    free_bytes: int = 0
    total_bytes: int = 0
    uncleanable_partitions: int = 0
    uncleanable_bytes: int = 0


@dataclass
class TopicSummary:
    topic: str
    partitions: int = 0
    dirty_bytes: int = 0
    cleanable_bytes: int = 0
    clean_bytes: int = 0
    max_dirty_ratio: float = 0.0
    tombstones: int = 0
    oldest_tombstone_age_ms: int | None = None
    oldest_dirty_timestamp_ms: int | None = None
    staged_bytes: int = 0
    next_clean_freed_bytes: int = 0
    kafka_passes: int = 0
    one_pass_dedupe_buffer_size: int = 0
    cluster_config: bool = False
    from_policy: tuple[str, ...] = ()
    oldest_superseded_age_ms: int | None = None
    deadline_breaches: int = 0

    def as_status(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partitions": self.partitions,
            "dirtyBytes": self.dirty_bytes,
            "cleanableBytes": self.cleanable_bytes,
            "cleanBytes": self.clean_bytes,
            "maxDirtyRatio": round(self.max_dirty_ratio, 6),
            "tombstones": self.tombstones,
            "oldestTombstoneAgeSeconds": (
                None if self.oldest_tombstone_age_ms is None else self.oldest_tombstone_age_ms / 1000.0
            ),
            "nextCleanFreedBytes": self.next_clean_freed_bytes,
            "kafkaPasses": self.kafka_passes,
            "onePassDedupeBufferSize": self.one_pass_dedupe_buffer_size,
            "clusterConfig": self.cluster_config,
            "fromPolicy": list(self.from_policy),
            "oldestSupersededAgeSeconds": (
                None if self.oldest_superseded_age_ms is None else self.oldest_superseded_age_ms / 1000.0
            ),
            "deletionDeadlineBreaches": self.deadline_breaches,
        }


@dataclass
class ScanSnapshot:
    """The result of one scan: what ``/status`` and ``/metrics`` report until the next."""

    scanned_at_ms: int
    statuses: list[PartitionStatus] = field(default_factory=list)
    log_dirs: list[LogDirInfo] = field(default_factory=list)
    staged_bytes: dict[TopicPartition, int] = field(default_factory=dict)
    in_sync: InSync | None = None
    """This broker's place in the ISRs (``cleaner.in_sync``); None without a KRaft metadata
    log on these disks or a broker id."""

    def topics(self) -> list[TopicSummary]:
        by_topic: dict[str, TopicSummary] = {}
        for s in self.statuses:
            r = s.report
            t = by_topic.setdefault(r.topic_partition.topic, TopicSummary(r.topic_partition.topic))
            t.partitions += 1
            # Where the topic's config came from (the same for all its partitions).
            t.cluster_config = r.cluster_config
            t.from_policy = tuple(sorted(k for k, source in r.config_sources.items() if source == "policy"))
            t.clean_bytes += r.clean_bytes
            t.cleanable_bytes += r.cleanable_bytes
            t.dirty_bytes += max(r.size_bytes - r.clean_bytes, 0)
            t.max_dirty_ratio = max(t.max_dirty_ratio, r.cleanable_ratio)
            t.staged_bytes += self.staged_bytes.get(r.topic_partition, 0)
            if s.facts is not None:
                t.tombstones += s.facts.tombstones
            if s.next_clean is not None:
                t.next_clean_freed_bytes += s.next_clean.bytes_freed
                t.kafka_passes = max(t.kafka_passes, s.next_clean.kafka_passes)
                t.one_pass_dedupe_buffer_size = max(
                    t.one_pass_dedupe_buffer_size, s.next_clean.one_pass_dedupe_buffer_size
                )
            if s.deletion is not None:
                t.deadline_breaches += int(s.deletion.breached)
                if s.deletion.oldest_superseded_age_ms is not None:
                    t.oldest_superseded_age_ms = max(
                        t.oldest_superseded_age_ms or 0, s.deletion.oldest_superseded_age_ms
                    )
            age = s.oldest_tombstone_age_ms
            if age is not None:
                t.oldest_tombstone_age_ms = max(t.oldest_tombstone_age_ms or 0, age)
            if r.earliest_dirty_timestamp_ms is not None:
                t.oldest_dirty_timestamp_ms = min(
                    t.oldest_dirty_timestamp_ms or r.earliest_dirty_timestamp_ms, r.earliest_dirty_timestamp_ms
                )
        return sorted(by_topic.values(), key=lambda t: (-t.max_dirty_ratio, t.topic))

    @property
    def max_dirty_ratio(self) -> float:
        return max((s.report.cleanable_ratio for s in self.statuses if s.report.compacted), default=0.0)

    @property
    def max_compaction_delay_ms(self) -> int:
        return max((s.report.compaction_delay_ms for s in self.statuses), default=0)


def partition_entry(status: PartitionStatus, last_cleaned_at_ms: int | None) -> dict[str, Any]:
    r = status.report
    reason = r.reason if r.reason in _REASONS else None
    return {
        "topic": r.topic_partition.topic,
        "partition": r.topic_partition.partition,
        "logDir": r.log_dir,
        "firstDirtyOffset": r.first_dirty_offset,
        "cleanableRatio": round(r.cleanable_ratio, 6),
        "cleanableBytes": r.cleanable_bytes,
        "eligible": r.eligible,
        "reason": reason,
        "lastCleanedAt": rfc3339(last_cleaned_at_ms),
        "uncleanableReason": _capped(r.uncleanable_reason),
        "lsoHolder": status.lso_holder_view(),
        "nextClean": status.next_clean_view(),
        "deletion": status.deletion.as_dict() if status.deletion is not None else None,
    }


def build_status(
    *,
    broker: str,
    mode: str,
    policy_generation: int | None,
    snapshot: ScanSnapshot | None,
    cleaner: dict[str, Any],
    errors: Iterable[dict[str, Any]],
    top_partitions: int,
    last_cleaned_at: dict[TopicPartition, int],
) -> dict[str, Any]:
    statuses = snapshot.statuses if snapshot else []
    compacted = [s for s in statuses if s.report.compacted]
    ranked = sorted(compacted, key=lambda s: (-s.report.cleanable_ratio, str(s.report.topic_partition)))
    top = ranked[:top_partitions]
    chosen = {s.report.topic_partition for s in top}
    uncleanable = [s for s in ranked if s.report.reason == "uncleanable" and s.report.topic_partition not in chosen]
    chosen |= {s.report.topic_partition for s in uncleanable}
    # A partition an open transaction pins is listed too: it is the answer to "why is
    # nothing cleaned" even when its ratio ranks it low.
    pinned = [s for s in ranked if s.report.lso_holder is not None and s.report.topic_partition not in chosen]
    chosen |= {s.report.topic_partition for s in pinned}
    # So is a partition past its deletion deadline: its entry says what holds it back.
    breached = [
        s for s in ranked if s.deletion is not None and s.deletion.breached and s.report.topic_partition not in chosen
    ]
    partitions = [
        partition_entry(s, last_cleaned_at.get(s.report.topic_partition)) for s in top + uncleanable + pinned + breached
    ]
    topics = [t.as_status() for t in snapshot.topics()] if snapshot else []
    doc: dict[str, Any] = {
        "version": STATUS_VERSION,
        "broker": broker,
        "mode": mode,
        "policyGeneration": policy_generation,
        "scannedAt": rfc3339(snapshot.scanned_at_ms) if snapshot else None,
        "logDirs": [
            {
                "path": d.path,
                "partitions": d.partitions,
                "lockHeldByBroker": d.lock_held_by_broker,
                "freeBytes": d.free_bytes,
                "uncleanablePartitions": d.uncleanable_partitions,
            }
            for d in (snapshot.log_dirs if snapshot else [])
        ],
        "cleaner": cleaner,
        "topics": topics,
        "partitions": partitions,
        "errors": [_capped_error(e) for e in list(errors)[-MAX_ERRORS:]],
    }
    # Room kept for the replicas section (at least its empty form) and for what the service
    # adds after (gate, stage): the whole document then stays under MAX_STATUS_BYTES.
    doc = _bounded(doc, keep_partitions=len(top), limit=MAX_STATUS_BYTES - REPLICA_RESERVE_BYTES - _EMPTY_REPLICAS)
    if snapshot is not None and snapshot.in_sync is not None:
        doc["inSync"] = snapshot.in_sync.as_status()
    if snapshot is not None:
        room = min(MAX_REPLICA_BYTES, MAX_STATUS_BYTES - REPLICA_RESERVE_BYTES - _size(doc))
        doc["replicas"] = replica_section(snapshot.statuses, snapshot.scanned_at_ms, room)
    return doc


def replica_section(statuses: Iterable[PartitionStatus], scanned_at_ms: int, room: int) -> dict[str, Any]:
    """The ``replicas`` section: the replica facts of as many compacted partitions as fit
    ``room`` bytes, chosen by the rotation's hash (see the module's docstring)."""
    rotation = scanned_at_ms // REPLICA_ROTATION_MS
    facts = [s for s in statuses if s.replica is not None]

    def rank(s: PartitionStatus) -> tuple[int, str]:
        tp = s.report.topic_partition
        return zlib.crc32(f"{rotation}:{tp.topic}-{tp.partition}".encode()), str(tp)

    entries: list[dict[str, Any]] = []
    used = len('{"rotation":,"partitions":[],"omitted":}') + 2 * 20

    def at_risk(s: PartitionStatus) -> bool:
        # A partition with a replica out of sync goes first: the race check needs it every
        # round; so does one with a transaction holding its LSO (the frozen-LSO check).
        assert s.replica is not None
        replication = s.replica.replication
        return (replication is not None and bool(replication.out_of_sync)) or s.replica.open_transaction is not None

    for s in sorted(facts, key=lambda s: (not at_risk(s), rank(s))):
        assert s.replica is not None
        entry = s.replica.as_status(s.report.topic_partition.topic, s.report.topic_partition.partition)
        size = _size(entry) + 1
        if used + size > room:
            break
        entries.append(entry)
        used += size
    return {"rotation": rotation, "partitions": entries, "omitted": len(facts) - len(entries)}


def _capped(text: str | None) -> str | None:
    if text is None or len(text) <= MAX_MESSAGE_CHARS:
        return text
    return text[: MAX_MESSAGE_CHARS - 3] + "..."


def _capped_error(error: dict[str, Any]) -> dict[str, Any]:
    return {**error, "message": _capped(error.get("message"))}


def _size(doc: dict[str, Any]) -> int:
    return len(json.dumps(doc, separators=(",", ":")))


def _bounded(doc: dict[str, Any], keep_partitions: int, limit: int) -> dict[str, Any]:
    """Cut the long lists until the document fits ``limit`` bytes: first the uncleanable
    partitions beyond the top ones, then topics (least dirty last), then the older errors
    (the newest stays), then the top partitions themselves, then the last error."""
    if _size(doc) <= limit:
        return doc
    total = {"topics": len(doc["topics"]), "partitions": len(doc["partitions"])}
    # Room for the "truncated" counts added at the end (each at most its total).
    limit -= len(json.dumps({"truncated": total}, separators=(",", ":")))
    for key, floor in (("partitions", keep_partitions), ("topics", 0), ("errors", 1), ("partitions", 0)):
        items = doc[key]
        if key == "errors":  # the newest stays: cut the oldest first
            while len(doc[key]) > floor and _size(doc) > limit:
                doc[key] = doc[key][1:]
            if _size(doc) <= limit:
                break
            continue
        lo, hi = min(floor, len(items)), len(items)
        # Binary search the longest prefix that fits.
        while lo < hi:
            mid = (lo + hi + 1) // 2
            doc[key] = items[:mid]
            if _size(doc) <= limit:
                lo = mid
            else:
                hi = mid - 1
        doc[key] = items[:lo]
        if _size(doc) <= limit:
            break
    while _size(doc) > limit and doc["errors"]:
        doc["errors"] = doc["errors"][1:]
    doc["truncated"] = {k: total[k] - len(doc[k]) for k in total}
    return doc
