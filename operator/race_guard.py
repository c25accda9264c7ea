"""The opt-in guard of the compaction–replication race for topics Kafka's own cleaner compacts
(issue 24, item 3; docs/replica-divergence.md).

kafka-cleaner's own cleans keep every tombstone and transaction marker while a replica is out
of sync (``LogCleanerManager.removal_hold``). Kafka's cleaner has no such rule, and nothing
outside the broker can make it keep a tombstone or marker while still cleaning: a batch's
delete horizon is written into the batch by the clean that first keeps it
(``Cleaner.cleanInto``, KIP-534), so raising ``delete.retention.ms`` afterwards changes
nothing for it. What the Admin API can do is stop the cleaner taking the topic at all:

- ``min.cleanable.dirty.ratio=1.0``: a log is cleaned when its cleanable ratio is *greater*
  than the minimum (``LogCleanerManager.grabFilthiestCompactedLog``), and the ratio is at
  most 1;
- ``max.compaction.lag.ms=9223372036854775807``: or when a segment is older than this lag
  (``needCompactionNow``), Kafka's default, restated in case the topic sets a lower one.

While any replica of one of the topic's partitions is out of the ISR or offline (as the
sidecars read ``__cluster_metadata`` on their brokers' disks), the guard sets both as the
topic's own configs, after writing what it found there into the policy's status
(``status.raceGuard``), and sets back exactly that once every replica is in sync again:
the override it replaced, or none. A clean already running when the replica drops out goes
on; what it may remove is bounded by ``delete.retention.ms`` (a day by default) after the
horizon it stamps, which the guard does not wait for. What it costs: while held the topic is
not compacted at all, superseded values included. A value changed by someone else while held
(a GitOps tool reverting the topic's configs) is left as it is, and the guard says so.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["HOLD", "AdminTopicConfigs", "Held", "release_plan", "topics_out_of_sync"]

HOLD: dict[str, str] = {"min.cleanable.dirty.ratio": "1.0", "max.compaction.lag.ms": str(2**63 - 1)}
"""The topic configs that keep Kafka's cleaner off a topic."""


@dataclasses.dataclass(frozen=True)
class Held:
    """A topic the guard holds: since when, why, and the topic's own overrides it replaced
    (None: the topic had none; the broker's default applied)."""

    topic: str
    since: str
    why: str
    restore: dict[str, str | None]
    shared: bool = False
    """The topic was held already (another policy's guard over the same cluster): this one
    sets nothing back, the guard that set the hold does."""

    def to_status(self) -> dict[str, Any]:
        """``status.raceGuard.held[topic]``: a key the topic did not set is left out of
        ``restore`` (a JSON merge patch cannot carry a null: it deletes)."""
        restore = {k: v for k, v in self.restore.items() if v is not None}
        return {"since": self.since, "why": self.why, "restore": restore, **({"shared": True} if self.shared else {})}

    @classmethod
    def from_status(cls, topic: str, entry: Mapping[str, Any]) -> Held:
        restore = entry.get("restore") or {}
        return cls(topic, str(entry["since"]), str(entry.get("why", "")), {k: restore.get(k) for k in HOLD},
                   bool(entry.get("shared", False)))


def topics_out_of_sync(reports: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Topic -> why (its first partition with a replica out of the ISR or offline), from the
    sidecars' reports (``replicas.partitions[].replication.outOfSync``)."""
    out: dict[str, str] = {}
    for _, report in sorted(reports.items()):
        for entry in (report.get("replicas") or {}).get("partitions") or []:
            lagging = (entry.get("replication") or {}).get("outOfSync") or []
            if lagging and entry["topic"] not in out:
                first = lagging[0]
                out[entry["topic"]] = (f"{entry['topic']}-{entry['partition']}: replica {first['broker']} is "
                                       f"{'offline' if first.get('offline') else 'out of the ISR'}")
    return out


def release_plan(held: Held, current: Mapping[str, str | None]) -> tuple[dict[str, str | None], list[str]]:
    """What to set back on a held topic whose replicas are in sync again, given its overrides
    now: the replaced ones where the guard's value is still there, and the keys someone else
    changed meanwhile (left as they are)."""
    back: dict[str, str | None] = {}
    changed: list[str] = []
    if held.shared:
        return back, changed
    for key, value in HOLD.items():
        if current.get(key) == value:
            back[key] = held.restore.get(key)
        else:
            changed.append(key)
    return back, changed


class AdminTopicConfigs:
    """A topic's own config overrides through Kafka's Admin API (kafka-python's
    ``KafkaAdminClient``: DescribeConfigs, IncrementalAlterConfigs)."""

    ATTEMPTS = 3

    def __init__(self, bootstrap_servers: str, options: Mapping[str, Any] | None = None) -> None:
        self.bootstrap_servers, self.options = bootstrap_servers, dict(options or {})
        self.admin = self._connect()

    def _connect(self) -> Any:
        from kafka.admin import KafkaAdminClient

        # kafka-python logs every refused connection at ERROR, and a broker being away is
        # when the guard works: what fails after the retries reaches RaceGuardFailed instead.
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
        return KafkaAdminClient(bootstrap_servers=self.bootstrap_servers, client_id="kafka-cleaner-race-guard",
                                **self.options)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """An Admin API call, again on a new client when a broker could not be reached: the
        guard acts when a broker is away, and a client may still pick it until the cluster
        has fenced it (its metadata listed it when the client started)."""
        from kafka.errors import KafkaConnectionError, KafkaTimeoutError, NodeNotReadyError

        for attempt in range(self.ATTEMPTS):
            try:
                return getattr(self.admin, method)(*args, **kwargs)
            except (KafkaConnectionError, KafkaTimeoutError, NodeNotReadyError):
                if attempt == self.ATTEMPTS - 1:
                    raise
                self.admin.close()
                self.admin = self._connect()
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.admin.close()

    def overrides(self, topic: str, keys: Iterable[str]) -> dict[str, str | None]:
        """The topic's own values of ``keys`` (None: not set on the topic)."""
        from kafka.admin import ConfigResource, ConfigResourceType

        keys = list(keys)
        described = self._call("describe_configs", [ConfigResource(ConfigResourceType.TOPIC, topic)],
                               config_filter="all")
        entries = _entries(described, topic)
        out: dict[str, str | None] = dict.fromkeys(keys)
        for key in keys:
            entry = entries.get(key)
            if entry is not None and _source(entry) == "DYNAMIC_TOPIC_CONFIG":
                out[key] = entry.get("value")
        return out

    def set(self, topic: str, values: Mapping[str, str | None]) -> None:
        """Set (a value) or remove (None) the topic's own overrides, incrementally: other
        configs of the topic are not touched."""
        from kafka.admin import AlterConfigOp, ConfigResource, ConfigResourceType

        configs = {k: (AlterConfigOp.SET, v) if v is not None else (AlterConfigOp.DELETE, None)
                   for k, v in values.items()}
        result = self._call("alter_configs", [ConfigResource(ConfigResourceType.TOPIC, topic, configs=configs)],
                            incremental=True)
        _raise_errors(result, topic)


def _entries(described: Mapping[str, Any], topic: str) -> dict[str, Mapping[str, Any]]:
    """kafka-python's ``{"topic": {name: {key: {"value", "config_source", ...}}}}``."""
    return dict(described["topic"][topic])


def _source(entry: Mapping[str, Any]) -> str:
    return str(entry.get("config_source"))


def _raise_errors(result: Mapping[str, Any], topic: str) -> None:
    """kafka-python's ``{"topic": {name: "OK" or the error}}``."""
    outcome = result["topic"][topic]
    if outcome != "OK":
        raise RuntimeError(f"altering the configs of topic {topic}: {outcome}")
