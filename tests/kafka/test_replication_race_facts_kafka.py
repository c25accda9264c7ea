"""The replication race facts read from a real cluster's disks (issue 24, item 2): with one
broker stopped, the leader's ``__cluster_metadata`` names it out of the ISR and fenced, the
leader's replica facts report the tombstone above the stopped replica's log end offset with its
earliest removal time, and the operator's pure function names the stopped replica at risk. The
same disks give the Paced rollout's ISR gate (issue 20, item 6): the stopped broker out of the
ISR, the other one alone in it (not to be restarted), then the restarted one back in sync as
its own disk says, through metadata newer than its restart."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from compaction_operator.divergence import replication_race_risks
from kafka_broker import EACH_KAFKA_LINE, RealBroker, create_topic, two_broker_cluster, wait_until

from cleaner.clock import SystemTime
from cleaner.config import parse_policy_text
from cleaner.engine.manager import LogCleanerManager
from cleaner.in_sync import in_sync as in_sync_of
from cleaner.replica_facts import replica_facts
from cleaner.storage.cluster_metadata import find_metadata_dir, read_cluster_metadata
from cleaner.storage.log_dir import LogDirectory
from cleaner.storage.topic_partition import TopicPartition
from cleaner.where import DEFAULT_POLICY

pytestmark = [pytest.mark.slow, EACH_KAFKA_LINE]

TOPIC = "profiles"
RETENTION_MS = 600_000
SETTINGS = {"broker.heartbeat.interval.ms": "500", "min.insync.replicas": "1"}


def _facts(broker: RealBroker, broker_id: int, now_ms: int) -> dict:
    """The partition's replica facts as the broker's sidecar reports them (read-only)."""
    metadata = find_metadata_dir([broker.metadata_dir])
    assert metadata is not None
    manager = LogCleanerManager(
        [LogDirectory(broker.log_dir, read_only=True)],
        parse_policy_text(DEFAULT_POLICY),
        SystemTime(),
        write_checkpoints=False,
    )
    logs = manager.logs()
    tp = TopicPartition(TOPIC, 0)
    [report] = [r for r in manager.report(now_ms) if r.topic_partition == tp]
    facts = replica_facts(
        logs[tp].log,
        report,
        cluster=read_cluster_metadata(metadata),
        broker_id=broker_id,
        now_ms=now_ms,
        delete_retention_ms=RETENTION_MS,
    )
    return facts.as_status(TOPIC, 0)


def test_the_leaders_metadata_names_the_stopped_replica_and_the_tombstone_it_lacks(tmp_path: Path, line: str) -> None:
    started = time.monotonic()
    with two_broker_cluster(tmp_path, line, extra=SETTINGS) as (_, one, two):
        create_topic(one, TOPIC, {0: [1, 2]}, {"cleanup.policy": "compact", "delete.retention.ms": str(RETENTION_MS)})
        wait_until(lambda: one.partition_state(TOPIC) == {"leader": 1, "isr": [1, 2]}, "both replicas in sync")
        one.produce(TOPIC, [(0, b"k%d" % i, b"v") for i in range(20)])

        # In sync: the facts name no replica out, and read nothing for removals.
        in_sync = _facts(one, 1, int(time.time() * 1000))
        assert in_sync["brokerId"] == 1 and "replication" not in in_sync and "removals" not in in_sync

        wait_until(lambda: _facts(two, 2, int(time.time() * 1000))["logEndOffset"] == 20, "broker 2 caught up")
        stopped_at = int(time.time() * 1000)
        two.stop()
        wait_until(lambda: one.partition_state(TOPIC)["isr"] == [1], "broker 2 out of the ISR")
        one.produce(TOPIC, [(0, b"k3", None), (0, b"k30", b"v")])  # a tombstone at offset 20

        def fenced() -> dict | None:
            entry = _facts(one, 1, int(time.time() * 1000))
            out = (entry.get("replication") or {}).get("outOfSync") or []
            return entry if out and out[0]["offline"] else None

        wait_until(lambda: fenced() is not None, "broker 2 fenced in broker 1's __cluster_metadata")
        now = int(time.time() * 1000)
        leader = _facts(one, 1, now)
        [out] = leader["replication"]["outOfSync"]
        assert (out["broker"], out["offline"]) == (2, True)
        assert stopped_at - 5_000 <= out["sinceMs"] <= now  # when the controller recorded it out
        assert leader["replication"]["isr"] == [1] and leader["replication"]["leader"] == 1
        # The tombstone at 20 (dirty: no earlier than now + delete.retention.ms); the batch is
        # the last of the log, so the point's offset is its last offset.
        [[offset, removable_at]] = leader["removals"]
        assert offset == 21 and now + RETENTION_MS <= removable_at <= now + RETENTION_MS + 1000

        # The operator, over both brokers' reports (broker 2's disk as it stopped).
        lagging = _facts(two, 2, now)
        assert lagging["logEndOffset"] == 20
        reports = {
            pod: {"replicas": {"rotation": 0, "partitions": [entry], "omitted": 0}}
            for pod, entry in (("kafka-1", leader), ("kafka-2", lagging))
        }
        [risk] = replication_race_risks(reports)
        assert (risk.broker, risk.pod, risk.offline, risk.log_end_offset, risk.offset, risk.holders) == (
            2,
            "kafka-2",
            True,
            20,
            21,
            ("kafka-1",),
        )

        # The ISR gate of a paced roll (issue 20, item 6), from the same disks: broker 2 is out;
        # broker 1 is the only copy in sync, so its restart now would cost availability.
        leader_view = read_cluster_metadata(find_metadata_dir([one.metadata_dir]))
        assert f"{TOPIC}-0" in in_sync_of(leader_view, 2).out_of_isr
        alone = in_sync_of(leader_view, 1)
        assert f"{TOPIC}-0" in alone.under_replicated and f"{TOPIC}-0" in alone.at_min_isr
        assert alone.metadata_time_ms >= stopped_at
        # Broker 2 restarts: its own sidecar's view (what the operator reads of the rolled
        # broker) shows it back in the ISR only through metadata newer than the restart.
        restarted_at = int(time.time() * 1000)
        two.start()

        def back() -> bool:
            view = in_sync_of(read_cluster_metadata(find_metadata_dir([two.metadata_dir])), 2)
            return view.metadata_time_ms > restarted_at and not view.out_of_isr

        wait_until(back, "broker 2 back in every ISR, as its own disk says")
        assert one.partition_state(TOPIC)["isr"] in ([1, 2], [2, 1])
        wait_until(lambda: not in_sync_of(read_cluster_metadata(find_metadata_dir([one.metadata_dir])), 1).at_min_isr,
                   "broker 1 free to restart again")  # fmt: skip
        print(f"Kafka {line}: facts named the stopped replica, and it came back, in {time.monotonic() - started:.0f} s")
