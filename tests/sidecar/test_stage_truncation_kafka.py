"""Stage mode against a real truncation, on a real three-node KRaft cluster (a controller and
two brokers), on both Kafka lines.

Issue 10's stale case that one broker cannot show: a replica stages a set over records that
the cluster later discards. Broker 2 leads alone (broker 1 is stopped) and takes records that
never reach broker 1; its sidecar stages a set over them. Broker 2 then stops answering
(SIGSTOP: the controller fences it), broker 1 comes back and is elected uncleanly, and takes
other records at the same offsets. Broker 2 resumes as a follower and Kafka truncates its log
to the new leader's (the divergent records are gone from it). A commit of the set at broker
2's next restart would bring them back on that replica, at offsets the other replica holds
different records at, and a leader change would then serve them. The gate must find the set
stale and delete it; broker 2, leading again, must serve exactly what broker 1 served.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from kafka_broker import EACH_KAFKA_LINE, RealBroker, create_topic, two_broker_cluster, wait_until
from sidecar_helpers import new_sidecar, next_scan, status_of, write_policy

from cleaner.clock import MockTime
from cleaner.sidecar import stage
from cleaner.storage.log_dir import LogDirectory
from cleaner.storage.topic_partition import TopicPartition

pytestmark = [pytest.mark.slow, EACH_KAFKA_LINE]

TOPIC = "orders"
SEGMENT_BYTES = 1 << 20  # Kafka 4's smallest segment.bytes
BROKER_SETTINGS = {"broker.heartbeat.interval.ms": "500", "min.insync.replicas": "1"}


def _records(tag: bytes, n: int, keys: int = 400) -> list[tuple[int, bytes, bytes | None]]:
    return [(0, b"key-%05d" % (i % keys), tag + b"-%06d:" % i + b"v" * 900) for i in range(n)]


def _latest(*batches: list[tuple[int, bytes, bytes | None]]) -> dict[bytes, bytes | None]:
    return {key: value for batch in batches for _, key, value in batch}


def _past_the_handover(log: str) -> list[str]:
    """ERROR/WARN lines about the topic, less the one a leader change may cost a follower.

    Broker 1's controlled shutdown hands the leadership to broker 2 under a new leader epoch.
    Broker 1 may learn that epoch first and fence a fetch broker 2 had in flight; Kafka's
    ``AbstractFetcherThread.onPartitionFenced`` then logs "Partition ... has an older epoch"
    at INFO and "Partition ... marked as failed" at WARN, and the fetcher waits for the new
    epoch, which makes broker 2 the leader. Every other cause of that WARN is an ERROR first.
    """
    lines = [line for line in log.splitlines() if TOPIC in line]
    fenced = sum(f"Partition {TOPIC}-0 has an older epoch" in line for line in lines)
    problems = []
    for line in lines:
        if "ERROR" not in line and "WARN" not in line:
            continue
        if fenced and line.endswith(f"Partition {TOPIC}-0 marked as failed (kafka.server.ReplicaFetcherThread)"):
            fenced -= 1
            continue
        problems.append(line)
    return problems


def _elect_uncleanly(broker: RealBroker, admin_config: Path) -> str:
    """Kafka's own kafka-leader-election, UNCLEAN, until it succeeds (the controller must have
    fenced the old leader first). Its admin client gives up on a call after 3 s: until the
    controller fences the SIGSTOPped broker, the metadata names it, the client may send it the
    request, and by default waits 30 s for an answer that never comes (a run took 31 s here)."""
    admin_config.write_text("request.timeout.ms=1500\ndefault.api.timeout.ms=3000\n")
    args = ("--bootstrap-server", broker.bootstrap, "--admin.config", str(admin_config),
            "--election-type", "unclean", "--topic", TOPIC, "--partition", "0")  # fmt: skip

    def elect() -> str | None:
        out = broker.run_tool("org.apache.kafka.tools.LeaderElectionCommand", *args, check=False)
        return out if "Successfully completed leader election" in out else None

    return wait_until(elect, "an unclean election of broker 1")


def test_a_set_staged_over_records_a_truncation_discards_is_deleted_at_the_gate(tmp_path: Path, line: str) -> None:
    with two_broker_cluster(tmp_path, line, extra=BROKER_SETTINGS) as (_, one, two):
        configs = {"cleanup.policy": "compact,delete", "segment.bytes": str(SEGMENT_BYTES), "retention.ms": "-1"}
        create_topic(two, TOPIC, {0: [2, 1]}, configs)
        wait_until(lambda: two.partition_state(TOPIC) == {"leader": 2, "isr": [1, 2]}, "both replicas in sync")

        # Both replicas take the first records; then broker 2 leads alone and takes records
        # broker 1 never sees, over several segments.
        shared = _records(b"shared", 1_500)
        two.produce(TOPIC, shared)
        one.stop()
        wait_until(lambda: two.partition_state(TOPIC)["isr"] == [2], "broker 1 out of the ISR")
        divergent = _records(b"divergent", 1_000)
        two.produce(TOPIC, divergent)
        # The sidecar stages only below the high watermark broker 2 has checkpointed
        # (replication-offset-checkpoint, every replica.high.watermark.checkpoint.interval.ms).
        hw_on_disk = LogDirectory(two.log_dir, read_only=True).high_watermarks
        wait_until(
            lambda: hw_on_disk().get(TopicPartition(TOPIC, 0), 0) >= len(shared) + len(divergent),
            "broker 2's checkpointed high watermark",
        )

        # Broker 2's sidecar stages a set over them while it serves.
        pdir = two.log_dir / f"{TOPIC}-0"
        policy = write_policy(
            tmp_path / "policy.yaml",
            mode="stage",
            topics=[{"match": TOPIC, "cleanupPolicy": "compact", "minCleanableDirtyRatio": 0.01}],
        )
        sc = new_sidecar(policy, [two.log_dir], MockTime(int(time.time() * 1000)), scan_ms=1_000)
        staged = wait_until(lambda: next_scan(sc) and stage.load(pdir), "a staged set on broker 2", timeout_s=60)
        assert staged.next_offset > len(shared), "the set must reach into the records the truncation discards"

        # Broker 2 stops answering: the controller fences it; broker 1 is back and elected
        # uncleanly, and takes other records at the offsets broker 2 gave the divergent ones.
        assert two.proc is not None
        os.kill(two.proc.pid, signal.SIGSTOP)
        one.start()
        _elect_uncleanly(one, tmp_path / "admin.properties")
        wait_until(lambda: one.partition_state(TOPIC)["leader"] == 1, "broker 1 leading")
        after = _records(b"after", 500, keys=200)
        one.produce(TOPIC, after)

        # Broker 2 resumes as a follower, and Kafka truncates its log to broker 1's.
        os.kill(two.proc.pid, signal.SIGCONT)
        wait_until(lambda: one.partition_state(TOPIC)["isr"] == [1, 2], "broker 2 back in the ISR")
        assert "Truncat" in two.log_since_start(), two.log_tail()
        served = one.consume(TOPIC, 1)[0]
        assert served == _latest(shared, after)

        # A pod restart of broker 2: the gate finds the set stale and deletes it.
        two.stop()
        gate_sidecar = new_sidecar(policy, [two.log_dir], MockTime(int(time.time() * 1000)), scan_ms=1_000)
        gate_sidecar.tick()
        doc = status_of(gate_sidecar)
        assert doc["gate"]["deleted"] == 1 and doc["gate"]["committed"] == 0, doc["gate"]
        # The truncated segment is one of the set's sources (the divergent records that
        # followed it in the set were cut from it, broker 1's appended).
        assert any("the source segment" in e["message"] and "changed (size" in e["message"] for e in doc["errors"]), (
            doc["errors"]
        )
        assert stage.load(pdir) is None
        two.start()
        wait_until(lambda: one.partition_state(TOPIC)["isr"] == [1, 2], "broker 2 in sync again")
        assert two.problems([TOPIC]) == [], two.problems([TOPIC])

        # Broker 2 leads again and serves exactly what broker 1 served, at the same offsets.
        offsets = one.offsets(TOPIC, 1)
        one.stop()
        wait_until(lambda: two.partition_state(TOPIC)["leader"] == 2, "broker 2 leading")
        assert two.consume(TOPIC, 1)[0] == served
        assert two.offsets(TOPIC, 1) == offsets
        assert _past_the_handover(two.log_since_start()) == [], two.log_tail()
