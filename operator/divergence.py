"""Replicas that diverge (issue 14, item 5): the sidecars' ``replicas`` sections compared,
partition by partition, across the brokers that report it. Pure functions.

Each sidecar reports, per compacted partition, its log start and end offsets, its high
watermark, its first dirty offset (the cleaner checkpoint), the bytes of its clean and dirty
sections, and a few batches of its dirty section below the high watermark (why those are
byte-identical on every in-sync replica: ``cleaner/replica_facts.py``). Replicas legitimately
differ by where each broker's cleaner has got to, by replication lag and by when retention
ran; the comparison flags only what those do not explain:

``divergentBatch``
    two replicas hold different batches over the same offsets, both in their dirty sections
    and below both high watermarks: divergent history, e.g. a head that came back on one
    replica after an unclean leader election, or a replica restored from an old disk.
``logStartSkew``
    the log start offsets lie more than :data:`LOG_START_SKEW` of the log's offsets apart:
    retention deletes whole segments on each broker at times of its own, so a segment apart
    is timing; a quarter of the log is several segments on any log retention keeps.
``cleanSkew``
    one replica's dirty section is at least :data:`CLEAN_SKEW` times the whole of another's log,
    its dirty ratio (dirty bytes over all bytes) is past its ``min.cleanable.dirty.ratio`` (its
    cleaner is due), and the other has cleaned offsets it has not (so they were cleanable): the
    size skew of a cleaner that died on one broker (Kafka's ``DeadThreadCount``, per partition
    and named). A working cleaner cleans once the ratio passes the threshold, so its dirty
    section stays about the size of its clean section, itself about the size of another
    replica's compacted log: twice that is not waiting, it is not cleaning.
``staleLso``
    manifestation 4 of the compaction–replication race (docs/replica-divergence.md): a
    transaction is open on one replica from an offset below its high watermark (its
    read_committed consumers get nothing past it), while another replica has cleaned past that
    offset, which its cleaner does only below its last stable offset: the transaction ended
    there. The open replica's log end is at or past the other's high watermark, so it fetched
    past the marker wherever the marker was: it never received it, because the other's cleaner
    removed it first. Named on the replica that holds the transaction open, with the producer
    and the offset (``kafka-cleaner diverged`` names it, and 1-3, key by key, from the two logs).

The replication race (issue 24, item 2; :func:`replication_race_risks`): a replica out of the
ISR or offline never receives a tombstone or transaction marker that the others' cleaners
removed meanwhile. For each replica some sidecar's ``__cluster_metadata`` shows out of sync,
the earliest time any other replica may remove a tombstone or marker above that replica's log
end offset (as its own sidecar reported it; a replica that did not report the partition is
taken to hold nothing, the worst case), from the other replicas' ``removals`` points.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Iterable, Mapping
from typing import Any

from cleaner.output import binary_bytes

__all__ = [
    "CLEAN_SKEW",
    "KINDS",
    "LOG_START_SKEW",
    "MAX_DIVERGING",
    "MAX_RACE_RISKS",
    "Divergence",
    "RaceRisk",
    "diverging_partitions",
    "replication_race_risks",
]

LOG_START_SKEW = 0.25
CLEAN_SKEW = 2.0
#: status.divergingPartitions holds at most this many entries (the CRD's maxItems).
MAX_DIVERGING = 50
KINDS = ("divergentBatch", "staleLso", "logStartSkew", "cleanSkew")
#: Race risks kept (the tightest first): the bound of the seconds-left gauge's label sets.
MAX_RACE_RISKS = 50
_MAX_DETAIL = 256


@dataclasses.dataclass(frozen=True)
class Divergence:
    topic: str
    partition: int
    kind: str
    brokers: tuple[str, ...]
    detail: str

    def as_status(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "kind": self.kind,
                "brokers": list(self.brokers), "detail": self.detail[:_MAX_DETAIL]}

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"


def diverging_partitions(reports: Mapping[str, Mapping[str, Any]]) -> list[Divergence]:
    """Every divergence among the partitions several of ``reports`` (pod -> ``/status``)
    carry, sorted by kind (divergent batches first), topic and partition."""
    by_partition: dict[tuple[str, int], dict[str, Mapping[str, Any]]] = {}
    for pod, report in sorted(reports.items()):
        for entry in (report.get("replicas") or {}).get("partitions") or []:
            by_partition.setdefault((entry["topic"], entry["partition"]), {})[pod] = entry
    found: list[Divergence] = []
    for (topic, partition), replicas in by_partition.items():
        if len(replicas) > 1:
            found += _compare(topic, partition, replicas)
    order = {kind: i for i, kind in enumerate(KINDS)}
    return sorted(found, key=lambda d: (order[d.kind], d.topic, d.partition))


def _compare(topic: str, partition: int, replicas: Mapping[str, Mapping[str, Any]]) -> Iterable[Divergence]:
    """At most one divergence of each kind per partition: the first pair (by pod name) that
    shows it in the detail; in ``brokers`` the pods that disagree with the most others (of
    three replicas, the odd one out; of two, both)."""
    pairs: dict[str, list[tuple[str, str, str]]] = {kind: [] for kind in KINDS}
    for (a, ra), (b, rb) in itertools.combinations(sorted(replicas.items()), 2):
        for kind, detail, pods in (_batches(a, ra, b, rb), _stale_lso(a, ra, b, rb), _log_start(a, ra, b, rb),
                                   _clean(a, ra, b, rb)):
            if detail is not None:
                pairs[kind].append((detail, *pods))
    for kind in KINDS:
        if pairs[kind]:
            detail = pairs[kind][0][0]
            counts = collections.Counter(pod for _, *pods in pairs[kind] for pod in pods)
            most = max(counts.values())
            brokers = sorted(pod for pod, n in counts.items() if n == most)
            yield Divergence(topic, partition, kind, tuple(brokers), detail)


def _batches(a: str, ra: Mapping[str, Any], b: str, rb: Mapping[str, Any]) -> tuple[str, str | None, tuple[str, ...]]:
    committed = min(_hw(ra), _hw(rb))
    for pa in ra.get("batches") or []:
        for pb in rb.get("batches") or []:
            overlap = pa[0] <= pb[1] and pb[0] <= pa[1]
            if overlap and max(pa[1], pb[1]) < committed and list(pa) != list(pb):
                return ("divergentBatch",
                        f"at offset {max(pa[0], pb[0])} {a} holds batch {pa[0]}-{pa[1]} crc {pa[2]:#010x}, "
                        f"{b} holds batch {pb[0]}-{pb[1]} crc {pb[2]:#010x} (both uncleaned, below both high "
                        f"watermarks: divergent history)", (a, b))
    return "divergentBatch", None, ()


def _hw(replica: Mapping[str, Any]) -> int:
    hw = replica.get("highWatermark")
    return min(hw, replica["logEndOffset"]) if hw is not None else -1


def _log_start(a: str, ra: Mapping[str, Any], b: str, rb: Mapping[str, Any]) -> tuple[str, str | None, tuple[str, ...]]:
    span = max(ra["logEndOffset"] - ra["logStartOffset"], rb["logEndOffset"] - rb["logStartOffset"], 0)
    apart = abs(ra["logStartOffset"] - rb["logStartOffset"])
    if apart and apart > LOG_START_SKEW * span:
        return ("logStartSkew",
                f"log start offset {ra['logStartOffset']} on {a}, {rb['logStartOffset']} on {b}: {apart} offsets "
                f"apart, more than {LOG_START_SKEW:.0%} of the {span} the log holds", (a, b))
    return "logStartSkew", None, ()


def _stale_lso(a: str, ra: Mapping[str, Any], b: str, rb: Mapping[str, Any]) -> tuple[str, str | None, tuple[str, ...]]:
    for (stuck, rstuck), (ended, rended) in (((a, ra), (b, rb)), ((b, rb), (a, ra))):
        txn = rstuck.get("openTransaction")
        if txn is None:
            continue
        first, other = txn["firstOffset"], rended.get("openTransaction") or {}
        ended_hw = _hw(rended)
        if (rended["logStartOffset"] <= first < rended["firstDirtyOffset"] and other.get("firstOffset") != first
                and 0 <= ended_hw <= rstuck["logEndOffset"]):
            return ("staleLso",
                    f"producer {txn['producerId']}'s transaction open on {stuck} from offset {first} (its LSO); "
                    f"{ended} cleaned past it (to {rended['firstDirtyOffset']}) and {stuck} fetched past {ended}'s "
                    f"high watermark {ended_hw}: the marker was removed first (manifestation 4)", (stuck,))
    return "staleLso", None, ()


def _dirty_ratio(replica: Mapping[str, Any]) -> float:
    total = replica["cleanBytes"] + replica["dirtyBytes"]
    return replica["dirtyBytes"] / total if total else 0.0


def _clean(a: str, ra: Mapping[str, Any], b: str, rb: Mapping[str, Any]) -> tuple[str, str | None, tuple[str, ...]]:
    for (behind, rbehind), (ahead, rahead) in (((a, ra), (b, rb)), ((b, rb), (a, ra))):
        other_log = rahead["cleanBytes"] + rahead["dirtyBytes"]
        ratio = _dirty_ratio(rbehind)
        if (rbehind["firstDirtyOffset"] < rahead["firstDirtyOffset"]
                and ratio > rbehind.get("minCleanableRatio", 0.5)
                and rbehind["dirtyBytes"] >= CLEAN_SKEW * max(other_log, 1)):
            return ("cleanSkew",
                    f"{behind} has cleaned up to offset {rbehind['firstDirtyOffset']} "
                    f"(dirty {binary_bytes(rbehind['dirtyBytes'])}, ratio {ratio:.2f}), {ahead} up to "
                    f"{rahead['firstDirtyOffset']} (its whole log {binary_bytes(other_log)}): is the log cleaner "
                    f"on {behind} dead?", (behind,))
    return "cleanSkew", None, ()



@dataclasses.dataclass(frozen=True)
class RaceRisk:
    """A replica out of sync and the first tombstone or marker above its log end offset that
    another replica's cleaner may remove: past ``removable_at_ms`` it may never receive it."""

    topic: str
    partition: int
    broker: int
    """The lagging replica's broker id."""
    pod: str | None
    """Its sidecar's pod, when it reported the partition."""
    offline: bool
    since_ms: int
    log_end_offset: int | None
    """As its sidecar last reported it; None: unknown (every offset counts as unreplicated)."""
    offset: int
    removable_at_ms: int
    holders: tuple[str, ...]
    """The pods whose cleaners may remove it first."""

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    def seconds_left(self, now_ms: int) -> float:
        return (self.removable_at_ms - now_ms) / 1000.0


def replication_race_risks(reports: Mapping[str, Mapping[str, Any]]) -> list[RaceRisk]:
    """Every replica out of sync with a tombstone or marker it has not replicated, that any
    other replica may remove, the soonest first (at most :data:`MAX_RACE_RISKS`). A partition
    whose replicas all report it in sync gives none, whatever their removals say."""
    by_partition: dict[tuple[str, int], dict[str, Mapping[str, Any]]] = {}
    for pod, report in sorted(reports.items()):
        for entry in (report.get("replicas") or {}).get("partitions") or []:
            by_partition.setdefault((entry["topic"], entry["partition"]), {})[pod] = entry
    found: list[RaceRisk] = []
    for (topic, partition), replicas in sorted(by_partition.items()):
        lagging: dict[int, tuple[int, bool]] = {}
        for entry in replicas.values():
            for out in (entry.get("replication") or {}).get("outOfSync") or []:
                since, offline = lagging.get(out["broker"], (out["sinceMs"], False))
                lagging[out["broker"]] = (min(since, out["sinceMs"]), offline or out["offline"])
        for broker, (since, offline) in sorted(lagging.items()):
            own = next(((pod, e) for pod, e in replicas.items() if e.get("brokerId") == broker), None)
            leo = own[1]["logEndOffset"] if own is not None else None
            first: tuple[int, int, list[str]] | None = None
            for pod, entry in replicas.items():
                if own is not None and pod == own[0]:
                    continue
                for offset, at in entry.get("removals") or []:
                    if leo is not None and offset < leo:
                        continue
                    if first is None or at < first[1]:
                        first = (offset, at, [pod])
                    elif at == first[1] and pod not in first[2]:
                        first[2].append(pod)
                    break  # the first point at or above the log end offset is the earliest
            if first is not None:
                found.append(RaceRisk(topic, partition, broker, own[0] if own is not None else None, offline, since,
                                      leo, first[0], first[1], tuple(first[2])))
    return sorted(found, key=lambda r: (r.removable_at_ms, r.topic, r.partition, r.broker))[:MAX_RACE_RISKS]
