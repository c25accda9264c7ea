"""A topic's effective config: the policy's rule merged with the cluster's real config.

The policy's rules say *which* topics kafka-cleaner acts on. On a KRaft broker the
cluster's own topic configs are on the same disk (``cleaner.storage.cluster_metadata``),
and they are what the cluster promised the topic's consumers. The merge keeps those
promises; a policy may differ from the cluster only in the direction that is safe:

=========================== ===================================================================
key                         effective value
=========================== ===================================================================
cleanup.policy              the cluster's. Compacting a ``delete`` topic removes records its
                            retention keeps; retention on a ``compact`` topic removes latest values.
delete.retention.ms         the longer: tombstones and markers never vanish earlier than promised.
min.compaction.lag.ms       the longer: records stay uncompacted at least as long as promised.
retention.ms, retention.bytes
                            the longer / larger (-1 is unlimited): never delete earlier.
segment.bytes, segment.index.bytes, index.interval.bytes, max.message.bytes
                            the cluster's: the shape of what the broker itself writes and accepts.
min.cleanable.dirty.ratio, max.compaction.lag.ms
                            the policy's: they only decide *when* a clean runs.
=========================== ===================================================================

A key the cluster does not set takes the policy's value, which is Kafka's default unless
the rule says otherwise; for the keys that keep the longer value, the cluster's value is then
Kafka's default, so a policy never shortens a promise the cluster makes by setting nothing.
Static settings in the brokers' ``server.properties`` (``log.cleaner.delete.retention.ms``)
are not on the disk: set them on the policy too, or as dynamic cluster defaults. Every value
carries its source (``cluster``, ``policy`` or ``default``), which ``status`` shows. Without a
metadata log (ZooKeeper-era dirs, or a log dir that is not ``metadata.log.dir``) the policy's
values stand, and ``status`` says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from cleaner.config import CleanupPolicy, TopicRule, spec_fields
from cleaner.storage.cluster_metadata import ConfigValue

CLUSTER = "cluster"
POLICY = "policy"
DEFAULT = "default"


def _longer(policy: int, cluster: int) -> int:
    """The longer of two retentions, where a negative value is unlimited."""
    if policy < 0 or cluster < 0:
        return -1
    return max(policy, cluster)


_Merge = Callable[[object, object], object]

#: Keys whose merge keeps the longer value: what the cluster promised its consumers. Where a
#: metadata log is read and sets none of them, the cluster promises Kafka's default (a policy's
#: shorter ``deleteRetentionMs`` must not drop tombstones before Kafka's 24 hours).
PROMISES = frozenset({"delete.retention.ms", "min.compaction.lag.ms", "retention.ms", "retention.bytes"})

#: Kafka key -> how the policy's and the cluster's values combine.
MERGE_RULES: dict[str, _Merge] = {
    "cleanup.policy": lambda _policy, cluster: cluster,
    "delete.retention.ms": lambda policy, cluster: max(policy, cluster),
    "min.compaction.lag.ms": lambda policy, cluster: max(policy, cluster),
    "retention.ms": _longer,
    "retention.bytes": _longer,
    "segment.bytes": lambda _policy, cluster: cluster,
    "segment.index.bytes": lambda _policy, cluster: cluster,
    "index.interval.bytes": lambda _policy, cluster: cluster,
    "max.message.bytes": lambda _policy, cluster: cluster,
    "min.cleanable.dirty.ratio": lambda policy, _cluster: policy,
    "max.compaction.lag.ms": lambda policy, _cluster: policy,
}


@dataclass(frozen=True)
class EffectiveRule:
    rule: TopicRule
    """The rule to clean with: the policy's, with the merged values."""
    sources: Mapping[str, str]
    """Kafka key -> ``cluster``, ``policy`` or ``default``."""
    cluster_known: bool
    """Whether a metadata log was read at all (False: the policy's values stand)."""
    remote_storage: bool = False
    """``remote.storage.enable=true``: a tiered log (stage mode refuses it)."""
    cluster_compacts: bool = False
    """The cluster's own ``cleanup.policy`` includes ``compact``: the broker's cleaner
    compacts the topic (stage mode refuses it)."""
    notes: tuple[str, ...] = ()
    """Where the policy asked for something the cluster overrode, one line each."""


def _parse(kind_value: object, text: str) -> object:
    if isinstance(kind_value, CleanupPolicy):
        return CleanupPolicy(",".join(sorted(part.strip().lower() for part in text.split(","))))
    if isinstance(kind_value, float):
        return float(text)
    return int(text)


def effective_rule(rule: TopicRule, cluster: Mapping[str, ConfigValue] | None) -> EffectiveRule:
    """Merge ``rule`` with the topic's cluster config (None: no metadata log was found)."""
    changes: dict[str, object] = {}
    sources: dict[str, str] = {}
    notes: list[str] = []
    defaults = TopicRule(match=".*")
    for f, spec in spec_fields(TopicRule):
        key = spec.kafka
        if key is None or key not in MERGE_RULES:
            continue
        policy_value = getattr(rule, f.name)
        source = DEFAULT if policy_value == getattr(defaults, f.name) else POLICY
        known = cluster.get(key) if cluster else None
        cluster_value: object = None
        whose = "the cluster's"
        if known is not None:
            try:
                cluster_value = _parse(policy_value, known.value)
            except ValueError:
                notes.append(f"{key}: the cluster's value {known.value!r} does not parse; the policy's stands")
        elif cluster is not None and key in PROMISES:
            # Nothing in the metadata sets it: the cluster promises Kafka's default.
            cluster_value, whose = getattr(defaults, f.name), "Kafka's default"
        if cluster_value is not None:
            merged = MERGE_RULES[key](policy_value, cluster_value)
            if merged != policy_value:
                changes[f.name] = merged
                if source == POLICY:
                    notes.append(f"{key}: the policy's {policy_value} gave way to {whose} {cluster_value}")
            if known is None:
                source = DEFAULT if merged != policy_value else source
            elif merged == cluster_value and (merged != policy_value or source == DEFAULT):
                source = CLUSTER
        sources[key] = source
    # Kafka requires min.compaction.lag.ms <= max.compaction.lag.ms; a longer promised
    # minimum lifts the policy's maximum with it.
    min_lag = changes.get("min_compaction_lag_ms", rule.min_compaction_lag_ms)
    if min_lag > rule.max_compaction_lag_ms:
        changes["max_compaction_lag_ms"] = min_lag
    remote = bool(cluster and cluster.get("remote.storage.enable", ConfigValue("false", "")).value.lower() == "true")
    policy_value = cluster.get("cleanup.policy") if cluster else None
    compacts = policy_value is not None and "compact" in policy_value.value.lower()
    merged_rule = dataclasses.replace(rule, **changes) if changes else rule
    return EffectiveRule(merged_rule, sources, cluster is not None, remote, compacts, tuple(notes))
