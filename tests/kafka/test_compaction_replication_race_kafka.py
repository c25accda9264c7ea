"""Kafka's compaction–replication race, reproduced on a real cluster (issue 24 item 1): the
failing baseline, per Kafka line. It documents what Apache Kafka does today; it passes while
the race exists and will be turned around by the guards that prevent it.

Each broker compacts its own replica, guarded only by time. A KRaft controller and two
brokers; a compacted topic with a short ``delete.retention.ms`` (1 s) and Kafka's own cleaner
on. Both replicas take a key's value. Broker 2 stops. The leader, broker 1, takes the key's
tombstone; its cleaner removes the old value, stamps the tombstone's delete horizon, and once
the horizon has passed removes the tombstone too: no record of the key is left on its disk
(seen with ``kafka-cleaner where`` on the live broker's log dir). Broker 2 comes back: it
fetches from its own log end on, where nothing of the key is, and rejoins the ISR with the
old value still on its disk. Broker 1 shuts down cleanly and broker 2 leads: a consumer is
served the deleted key's old value. Manifestation 1 of the four, "deleted data reappears".
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from kafka_broker import EACH_KAFKA_LINE, RealBroker, wait_until

from cleaner.config import parse_policy_text
from cleaner.where import DEFAULT_POLICY, where

pytestmark = [pytest.mark.slow, EACH_KAFKA_LINE]

TOPIC, KEY = "profiles", b"user-42"
BROKER_SETTINGS = {"broker.heartbeat.interval.ms": "500", "min.insync.replicas": "1", "log.cleaner.backoff.ms": "200"}
TOPIC_CONFIGS = {
    "cleanup.policy": "compact",
    "delete.retention.ms": "1000",
    "min.cleanable.dirty.ratio": "0.01",
    "segment.bytes": str(1 << 20),  # Kafka 4's smallest: the filler rolls segments
}


def _filler(n: int, tag: int) -> list[tuple[int, bytes, bytes | None]]:
    return [(0, b"other-%04d" % (i % 300), b"%d:" % tag + b"x" * 900) for i in range(n)]


def _records_of_key(broker: RealBroker) -> list[str]:
    """What of the key is on the broker's disk (read-only, next to the live broker)."""
    policy = parse_policy_text(DEFAULT_POLICY)
    sightings, _ = where([broker.log_dir], policy, KEY, TOPIC, int(time.time() * 1000), partition=0)
    return [s.kind for s in sightings]


def test_deleted_data_reappears_on_a_replica_that_was_away_past_the_delete_horizon(
    tmp_path: Path, line: str
) -> None:
    controller = RealBroker(
        tmp_path / "controller", line, node_id=0, roles="controller", extra={"broker.session.timeout.ms": "3000"}
    )
    one = RealBroker(tmp_path / "broker-1", line, node_id=1, roles="broker", quorum=controller,
                     cleaner_enable=True, extra=BROKER_SETTINGS)
    two = RealBroker(tmp_path / "broker-2", line, node_id=2, roles="broker", quorum=controller,
                     cleaner_enable=True, extra=BROKER_SETTINGS)
    nodes = (controller, one, two)
    started = time.monotonic()
    try:
        controller.start(wait=False)
        one.start(wait=False)
        two.start()
        one.wait_ready()
        from kafka.admin import KafkaAdminClient, NewTopic

        admin = KafkaAdminClient(bootstrap_servers=one.bootstrap, request_timeout_ms=30_000)
        try:
            admin.create_topics([NewTopic(TOPIC, replica_assignments={0: [1, 2]}, topic_configs=TOPIC_CONFIGS)])
        finally:
            admin.close()
        wait_until(lambda: one.partition_state(TOPIC) == {"leader": 1, "isr": [1, 2]}, "both replicas in sync")

        # Both replicas hold the key's value.
        one.produce(TOPIC, [(0, KEY, b"date-of-birth:1990-01-01"), *_filler(50, 0)])
        wait_until(lambda: _records_of_key(two) == ["value"], "the value on broker 2's disk")

        # Broker 2 is away. The key is deleted; broker 1's cleaner removes the value, then,
        # past the 1 s delete horizon and with more data to make the log dirty again, the tombstone.
        two.stop()
        wait_until(lambda: one.partition_state(TOPIC)["isr"] == [1], "broker 2 out of the ISR")
        one.produce(TOPIC, [(0, KEY, None), *_filler(1_500, 1)])
        tag = 2

        def gone_from_the_leader() -> bool:
            nonlocal tag
            if _records_of_key(one) == []:
                return True
            one.produce(TOPIC, _filler(1_200, tag))  # a rolled, dirty segment for the next clean
            tag += 1
            return False

        wait_until(gone_from_the_leader, "broker 1's cleaner to remove the key's value and tombstone")

        # Broker 2 comes back, catches up from its own log end and rejoins the ISR: it still
        # holds the value, and nothing it fetched tells it the key was deleted.
        two.start()
        wait_until(lambda: one.partition_state(TOPIC)["isr"] == [1, 2], "broker 2 back in the ISR")
        assert _records_of_key(two) == ["value"]
        assert one.consume(TOPIC, 1)[0].get(KEY, "absent") == "absent"  # the leader serves no record of it

        # Broker 2 leads: the deleted value is served again.
        one.stop()
        wait_until(lambda: two.partition_state(TOPIC)["leader"] == 2, "broker 2 leading")
        served = two.consume(TOPIC, 1)[0]
        assert served.get(KEY) == b"date-of-birth:1990-01-01", "the race did not reproduce"
        print(f"reproduced on Kafka {line} in {time.monotonic() - started:.0f} s")
    finally:
        for node in reversed(nodes):
            if node.proc is not None:
                os.kill(node.proc.pid, signal.SIGCONT)
            node.stop(kill=True)
