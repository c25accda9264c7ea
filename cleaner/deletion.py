"""A deletion deadline per partition: how long superseded data has been on disk, and what holds it.

Teams delete personal data from compacted topics by overwriting or tombstoning its key, and
rely on compaction to remove the old records. Kafka's only lever is ``max.compaction.lag.ms``
(KIP-354) and it reports neither how old the oldest superseded record is nor why it is still
there. For each compacted partition this module answers:

- **superseded since**: the earliest timestamp of a record that has an earlier record of its key
  on disk (a value or tombstone written over an older one). That older record has been
  superseded at least that long: it is the age a deletion deadline is measured against (the
  age of the superseded record itself would count the years a key sat unchanged before it was
  overwritten);
- **tombstone past its horizon**: the earliest delete horizon (KIP-534, stamped by the clean
  that first kept the tombstone) of a tombstone still on disk; once the horizon has passed the
  next clean should remove it;
- **held back by**: why the next clean does not remove them (:func:`held_back_by`), from the
  partition's cleaning picture: the active segment not rolled (``segment.ms`` /
  ``segment.bytes``), the last stable offset (an open or hanging transaction),
  ``min.compaction.lag.ms``, a dirty ratio below ``min.cleanable.dirty.ratio``, cleaning paused
  or the partition uncleanable, or an eligible partition nobody cleans (the cleaner dead, absent
  or behind).

**Cost.** One read of every record of the partition's log (all segments, the active one too),
through the compiled core: the offset map's xxh3-128 key digest (``digest_keys``) and the
engine's :class:`OffsetMap` (the keys seen so far). Reads are throttled by the caller (the
sidecar's ``maxIoBytesPerSecond``) and page-cache neutral (``page_cache.cold_read``: only the
pages the read brought in are dropped). :class:`DeletionCache` recomputes a partition only when
its segments changed, and at most every ``reporting.deletionIntervalSeconds``: ages move with
the clock in between, from the timestamps computed.

**Memory.** One offset map of the cleaner's ``dedupeBufferSize / threads`` (what a cleaner
thread holds), reused for every partition; a partition of fewer offsets than the map holds keys
uses only the table they can fill (``OffsetMap.clear``'s end offset: the log end offset when
the read starts; should a live broker append past it, the keys move to the whole map). When the
partition has more distinct keys than the map holds (``bounded``), the keys beyond it are not
followed across chunks: a record of such a key that supersedes one in an earlier read chunk is
missed, so the age reported is a **lower bound** (the oldest superseded record is at least that
old) and the count too.

Not modelled: records of aborted transactions count as ordinary records (the next clean
removes them whatever their key); legacy (v0/v1) batches are not read.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from cleaner.config import Policy, TopicRule
from cleaner.engine.manager import ManagedLog, PartitionReport
from cleaner.engine.offset_map import OffsetMap, digest_keys
from cleaner.errors import FileChangedError, KafkaCleanerError
from cleaner.records.columns import decode_records
from cleaner.storage.page_cache import cold_read
from cleaner.storage.segment import iter_fd_batches, open_for_read
from cleaner.storage.topic_partition import TopicPartition

log = logging.getLogger("cleaner.deletion")

#: A partition with less than this share of its deadline left is "at risk": stage mode cleans it
#: before the dirtiest ones (:func:`at_risk`).
AT_RISK_SHARE = 0.25

#: What holds a partition's deletion back (``heldBackBy``), for the runbook and the alert.
HOLD_BACK_CAUSES = (
    "activeSegment",
    "lso",
    "minCompactionLag",
    "dirtyRatio",
    "paused",
    "uncleanable",
    "cleaning",
    "cleaner",
    "replicaOutOfSync",
)


@dataclass(frozen=True)
class DeletionFacts:
    """What one read of a partition's records found (time-independent: ages come at view time)."""

    computed_at_ms: int
    superseded_since_ms: int | None
    """The earliest timestamp of a record with an earlier record of its key on disk."""
    superseding_offset: int | None
    """That record's offset: a clean must cover it to remove what it supersedes."""
    superseded_records: int
    """Records on disk with a newer record of their key (a lower bound when ``bounded``)."""
    earliest_horizon_ms: int | None
    """The earliest delete horizon of a tombstone on disk."""
    horizon_offset: int | None
    bounded: bool
    """The keys overflowed the offset map: the age and count are lower bounds."""
    bytes_read: int


@dataclass(frozen=True)
class DeletionStatus:
    """A partition's deletion picture at ``now``: what ``status``, ``/status`` and metrics show."""

    oldest_superseded_age_ms: int | None
    oldest_expired_tombstone_age_ms: int | None
    """How long the oldest tombstone still on disk has been past its delete horizon."""
    superseded_records: int
    deadline_ms: int | None
    breached: bool
    remaining_ms: int | None
    """Deadline minus the larger age (negative: breached by that much); None without a deadline or age."""
    held_back_by: str | None
    """Why the next clean does not remove them (:data:`HOLD_BACK_CAUSES`); None when nothing waits."""
    bounded: bool
    computed_at_ms: int

    def describe(self) -> str | None:
        """One line for ``status``'s table: the ages against the deadline and what holds them
        back; None when nothing superseded or expired is on disk."""
        ages = []
        if self.oldest_superseded_age_ms is not None:
            ages.append(f"superseded records for {_duration(self.oldest_superseded_age_ms)}")
        if self.oldest_expired_tombstone_age_ms is not None:
            ages.append(f"a tombstone {_duration(self.oldest_expired_tombstone_age_ms)} past its delete horizon")
        if not ages:
            return None
        text = "deletion: " + " and ".join(ages)
        if self.bounded:
            text += " (at least: more keys than the dedupe buffer holds)"
        if self.deadline_ms is not None:
            verdict = "BREACHED" if self.breached else "within"
            text += f"; deadline {_duration(self.deadline_ms)} {verdict}"
        if self.held_back_by is not None:
            text += f"; held back by {self.held_back_by}"
        return text

    def as_dict(self) -> dict:
        def seconds(ms: int | None) -> float | None:
            return None if ms is None else ms / 1000.0

        return {
            "oldestSupersededAgeSeconds": seconds(self.oldest_superseded_age_ms),
            "oldestExpiredTombstoneAgeSeconds": seconds(self.oldest_expired_tombstone_age_ms),
            "supersededRecords": self.superseded_records,
            "deadlineSeconds": seconds(self.deadline_ms),
            "breached": self.breached,
            "remainingSeconds": seconds(self.remaining_ms),
            "heldBackBy": self.held_back_by,
            "bounded": self.bounded,
            "computedAtMs": self.computed_at_ms,
        }


def _duration(ms: int) -> str:
    seconds = ms // 1000
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds}s"


def read_deletion_facts(
    managed: ManagedLog,
    offset_map: OffsetMap,
    now_ms: int,
    throttle: Callable[[int], None] | None = None,
) -> DeletionFacts:
    """One read of every record of the partition (see the module's docstring for the cost)."""
    segments = list(managed.log.segments)
    base = segments[0].base_offset if segments else 0
    offset_map.clear(base, managed.log.log_end_offset)
    since: int | None = None
    since_offset: int | None = None
    horizon: int | None = None
    horizon_offset: int | None = None
    superseded = 0
    bounded = False
    read = 0
    for segment in segments:
        with open_for_read(segment.log_path) as f:
            fd = f.fileno()
            size = os.fstat(fd).st_size
            with cold_read(fd, size):
                for chunk in iter_fd_batches(fd, str(segment.log_path), 0, size, allow_truncated_tail=True):
                    n = int(chunk.sizes.sum())
                    read += n
                    if throttle is not None:
                        throttle(n)
                    data = chunk.select(chunk.is_v2 & ~chunk.is_control)
                    if not len(data):
                        continue
                    cols = decode_records(data)
                    rows = np.flatnonzero(cols.key_length >= 0)
                    if not len(rows):
                        continue
                    offsets = cols.offsets[rows]
                    timestamps = cols.timestamps[rows]
                    starts, ends = cols.key_spans(rows)
                    digests = digest_keys(cols.data, starts, ends)
                    later, full = _superseding(offset_map, digests, offsets)
                    bounded |= full
                    if later.any():
                        superseded += int(later.sum())
                        at = int(np.argmin(np.where(later, timestamps, np.iinfo(np.int64).max)))
                        if since is None or int(timestamps[at]) < since:
                            since, since_offset = int(timestamps[at]), int(offsets[at])
                    stamped = cols.is_tombstone[rows] & data.has_delete_horizon[cols.batch[rows]]
                    if stamped.any():
                        horizons = data.headers["base_timestamp"][cols.batch[rows]]
                        at = int(np.argmin(np.where(stamped, horizons, np.iinfo(np.int64).max)))
                        if horizon is None or int(horizons[at]) < horizon:
                            horizon, horizon_offset = int(horizons[at]), int(offsets[at])
    return DeletionFacts(now_ms, since, since_offset, superseded, horizon, horizon_offset, bounded, read)


def _superseding(offset_map: OffsetMap, digests: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, bool]:
    """Per record of one chunk (in offset order): whether an earlier record of its key was seen
    (in this chunk or, through the offset map, in an earlier one); and whether the map was full."""
    earlier = offset_map.get_many(digests) >= 0
    keys = np.ascontiguousarray(digests, dtype=np.uint8).view(f"V{digests.shape[1]}").ravel()
    _, first = np.unique(keys, return_index=True)
    repeat = np.ones(len(keys), dtype=bool)
    repeat[first] = False
    new = ~earlier & ~repeat & (offsets <= offset_map.offset_limit)
    wanted = int(new.sum())
    full = bool((offsets > offset_map.offset_limit).any())
    if wanted:
        full |= offset_map.put_many(digests[new], offsets[new]) < wanted
    return earlier | repeat, full


def held_back_by(offset: int, report: PartitionReport, active_base_offset: int | None) -> str | None:
    """Why the next clean does not remove what the record at ``offset`` supersedes (or, for a
    tombstone past its horizon, the tombstone itself): a clean must cover ``offset``."""
    if not report.compacted:
        return None
    if report.reason in ("uncleanable", "paused", "cleaning"):
        return report.reason
    if offset >= report.first_uncleanable_offset:
        bounds = [(report.last_stable_offset, "lso"), (active_base_offset, "activeSegment")]
        holding = [(b, name) for b, name in bounds if b is not None and b <= offset]
        return min(holding)[1] if holding else "minCompactionLag"
    if report.eligible:
        return "cleaner"  # cleanable and eligible now, yet still there: no cleaner took it
    if report.reason in ("activeSegment", "lso"):
        return report.reason
    if report.reason == "lag":
        return "minCompactionLag"
    return "dirtyRatio"


def deletion_status(
    facts: DeletionFacts,
    report: PartitionReport,
    rule: TopicRule,
    active_base_offset: int | None,
    now_ms: int,
    *,
    removal_hold: str | None = None,
) -> DeletionStatus:
    """The partition's deletion picture at ``now_ms`` from facts read at or before it.

    ``removal_hold`` (``LogCleanerManager.removal_hold``): another replica is out of the ISR
    or offline, so a clean keeps every tombstone past its horizon (the compaction-replication
    race, docs/replica-divergence.md). When such a tombstone is what waits longest and lies
    where a clean may go, that is what holds the deletion back, whatever else would have to
    happen first (a roll, a dirtier log): ``replicaOutOfSync``. An uncleanable or paused
    partition is said as such: those need a person first."""
    superseded_age = None if facts.superseded_since_ms is None else max(now_ms - facts.superseded_since_ms, 0)
    tombstone_age = None
    if facts.earliest_horizon_ms is not None and facts.earliest_horizon_ms <= now_ms:
        tombstone_age = now_ms - facts.earliest_horizon_ms
    deadline = rule.effective_deletion_deadline_ms
    ages = [a for a in (superseded_age, tombstone_age) if a is not None]
    remaining = None if deadline is None or not ages else deadline - max(ages)
    cause = None
    waiting = [
        (age, offset)
        for age, offset in ((superseded_age, facts.superseding_offset), (tombstone_age, facts.horizon_offset))
        if age is not None and offset is not None
    ]
    if waiting:
        oldest, offset = max(waiting)
        cause = held_back_by(offset, report, active_base_offset)
        tombstone_waits = tombstone_age is not None and oldest == tombstone_age and offset == facts.horizon_offset
        covered = offset < report.first_uncleanable_offset  # a clean may cover it, and would keep it
        if removal_hold is not None and tombstone_waits and covered and cause not in ("uncleanable", "paused"):
            cause = "replicaOutOfSync"
    return DeletionStatus(
        superseded_age,
        tombstone_age,
        facts.superseded_records,
        deadline,
        remaining is not None and remaining < 0,
        remaining,
        cause,
        facts.bounded,
        facts.computed_at_ms,
    )


def at_risk(status: DeletionStatus | None) -> bool:
    """Breached, or less than :data:`AT_RISK_SHARE` of the deadline left."""
    if status is None or status.remaining_ms is None or status.deadline_ms is None:
        return False
    return status.remaining_ms < status.deadline_ms * AT_RISK_SHARE


class DeletionCache:
    """Deletion facts per partition, read again only when its segments changed and at most every
    ``interval_ms``; one offset map of ``memory`` bytes shared by every read.

    ``deadlines_only``: only partitions whose topic rule has a deadline are read. A sidecar
    next to a busy broker sees every active segment change between scans, so without this it
    would read every compacted partition whole every interval; a deadline is what asks for it
    (``status``, run once, reads them all)."""

    def __init__(self, memory: int, load_factor: float, interval_ms: int, *, deadlines_only: bool = False) -> None:
        self._memory = memory
        self._load_factor = load_factor
        self._map: OffsetMap | None = None
        self.interval_ms = interval_ms
        self.deadlines_only = deadlines_only
        self._known: dict[TopicPartition, tuple[tuple, DeletionFacts]] = {}
        self.bytes_read = 0

    @property
    def sizing(self) -> tuple[int, float, int]:
        """What the policy decides: the map's memory and load factor, and the interval."""
        return self._memory, self._load_factor, self.interval_ms

    @classmethod
    def for_policy(cls, policy: Policy, *, deadlines_only: bool = False) -> DeletionCache:
        return cls(
            policy.cleaner.dedupe_buffer_per_thread,
            policy.cleaner.dedupe_buffer_load_factor,
            policy.reporting.deletion_interval_seconds * 1000,
            deadlines_only=deadlines_only,
        )

    def facts(
        self, managed: ManagedLog, now_ms: int, throttle: Callable[[int], None] | None = None
    ) -> DeletionFacts | None:
        """The partition's facts: read now if none are known, or its segments changed and the
        last read is ``interval_ms`` old; else the last ones. None when it cannot be read (a
        damaged segment: the partition's look says why)."""
        if self.deadlines_only and managed.rule.effective_deletion_deadline_ms is None:
            return None
        tp = managed.topic_partition
        shape = tuple((s.base_offset, s.size, s.last_modified_ms) for s in managed.log.segments)
        known = self._known.get(tp)
        if known is not None and (known[0] == shape or now_ms - known[1].computed_at_ms < self.interval_ms):
            return known[1]
        if self._map is None:
            self._map = OffsetMap(self._memory, self._load_factor)
        try:
            facts = read_deletion_facts(managed, self._map, now_ms, throttle)
        except FileChangedError:
            raise  # the partition's look reads it again as it now is
        except (KafkaCleanerError, OSError) as e:
            log.warning("cannot read the deletion facts of %s: %s", tp, e)
            return known[1] if known is not None else None
        self.bytes_read += facts.bytes_read
        self._known[tp] = (shape, facts)
        return facts

    def retain(self, partitions: Iterable[TopicPartition]) -> None:
        """Forget the partitions no longer on the log dirs."""
        keep = set(partitions)
        for tp in [tp for tp in self._known if tp not in keep]:
            del self._known[tp]
