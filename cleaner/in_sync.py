"""Whether this broker is back in sync, and whether it may be restarted now, from the
``__cluster_metadata`` on its own disk (issue 20, item 6).

A rollout that restarts brokers one at a time must wait, after each restart, until the broker
is back in the ISR of every partition it replicates, and must not restart a broker whose
absence would take a partition below ``min.insync.replicas`` (producers with ``acks=all``
would then fail: an outage). Strimzi's KafkaRoller asks the brokers through the Admin API
(``KafkaAvailability.canRoll``); the sidecar has no client, but it has what the controller
recorded: every KRaft broker keeps the whole metadata log on its disk
(:mod:`cleaner.storage.cluster_metadata`), with each partition's replicas and ISR and which
brokers are fenced. So each sidecar reports, for its own broker (``meta.properties``'
``node.id``), three lists of partitions:

``outOfIsr``
    the broker is a replica but not in the ISR, or the broker is fenced: it has not caught
    up (right after a restart: not yet).
``underReplicated``
    the broker is in the ISR, and the ISR is smaller than the replica set: another replica
    is behind already, and this broker's absence would leave fewer copies still.
``atMinIsr``
    the broker is in the ISR, and the ISR has no more than ``min.insync.replicas`` members:
    without this broker the partition is below it. Only for topics whose replication factor
    is above their ``min.insync.replicas`` (with RF at or below it no restart keeps the
    partition available; those are counted apart, ``noSpareReplica``, and not held against
    the roll: nothing would ever roll).

The view is as current as the metadata log on disk: ``metadataTimeMs`` is the newest record's
timestamp (a live quorum appends one every ``metadata.max.idle.interval.ms``, 500 ms by
default), so a reader can tell a view from before a restart. ``min.insync.replicas`` is read
where the metadata holds it (the topic's own, a dynamic broker or cluster default); a value set
only in a broker's static ``server.properties`` is not on disk, and Kafka's default of 1 is
assumed, which makes ``atMinIsr`` a lower bound there; ``underReplicated`` does not depend on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from cleaner.storage.cluster_metadata import ClusterMetadata

__all__ = ["EXAMPLES", "InSync", "in_sync"]

EXAMPLES = 5
"""Partitions named per list in the report (the counts are whole)."""

_DEFAULT_MIN_ISR = 1


@dataclass(frozen=True)
class InSync:
    """One broker's place in the ISRs, as its own copy of the metadata log says."""

    broker_id: int
    replicas: int
    """Partitions the broker holds a replica of."""
    out_of_isr: tuple[str, ...]
    under_replicated: tuple[str, ...]
    at_min_isr: tuple[str, ...]
    no_spare_replica: int
    metadata_offset: int
    metadata_time_ms: int

    def as_status(self) -> dict[str, object]:
        def listed(names: tuple[str, ...]) -> dict[str, object]:
            return {"count": len(names), "examples": list(names[:EXAMPLES])}

        return {
            "brokerId": self.broker_id,
            "replicas": self.replicas,
            "outOfIsr": listed(self.out_of_isr),
            "underReplicated": listed(self.under_replicated),
            "atMinIsr": listed(self.at_min_isr),
            "noSpareReplica": self.no_spare_replica,
            "metadataOffset": self.metadata_offset,
            "metadataTimeMs": self.metadata_time_ms,
        }


def in_sync(cluster: ClusterMetadata, broker_id: int) -> InSync:
    """Where ``broker_id`` stands in every partition it replicates (module doc)."""
    names = {topic_id: name for name, topic_id in cluster.topics.items()}
    fenced = broker_id in cluster.fenced_since_ms
    min_isr_of: dict[str, int] = {}
    replicas = 0
    out_of_isr: list[str] = []
    under_replicated: list[str] = []
    at_min_isr: list[str] = []
    no_spare = 0
    held = sorted(
        (
            (names.get(topic_id, str(topic_id)), partition, state)
            for (topic_id, partition), state in cluster.partitions.items()
            if broker_id in state.replicas
        ),
        key=lambda held: held[:2],
    )
    for topic, partition, state in held:
        replicas += 1
        name = f"{topic}-{partition}"
        if fenced or broker_id not in state.isr:
            out_of_isr.append(name)
            continue
        if len(state.isr) < len(state.replicas):
            under_replicated.append(name)
        if topic not in min_isr_of:
            min_isr_of[topic] = _min_isr(cluster, topic, broker_id)
        min_isr = min_isr_of[topic]
        if len(state.replicas) <= min_isr:
            no_spare += 1
        elif len(state.isr) <= min_isr:
            at_min_isr.append(name)
    return InSync(
        broker_id=broker_id,
        replicas=replicas,
        out_of_isr=tuple(out_of_isr),
        under_replicated=tuple(under_replicated),
        at_min_isr=tuple(at_min_isr),
        no_spare_replica=no_spare,
        metadata_offset=cluster.end_offset,
        metadata_time_ms=cluster.last_record_ms,
    )


def _min_isr(cluster: ClusterMetadata, topic: str, broker_id: int) -> int:
    """The topic's ``min.insync.replicas`` as the metadata holds it, else Kafka's default (a
    value the broker would refuse is not on disk; one that is not a number counts as unset)."""
    known = cluster.topic(topic, broker_id).get("min.insync.replicas")
    try:
        return int(known.value) if known is not None else _DEFAULT_MIN_ISR
    except ValueError:
        return _DEFAULT_MIN_ISR
