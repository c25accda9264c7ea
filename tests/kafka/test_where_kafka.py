"""``kafka-cleaner where`` on a real broker's disk (issue 25 item 1), per Kafka line.

A key is written, overwritten and deleted through a real broker, sent by kafka-python's
default partitioner (murmur2, as Kafka's ``BuiltInPartitioner``), among other keys that roll
the segments. With the broker stopped:

1. ``where`` finds the key's three records in the partition the producer chose (taken from
   the topic's partition count in ``__cluster_metadata-0``), in order, the tombstone as the
   latest, the superseded values due at the next clean;
2. after ``kafka-cleaner clean`` only the tombstone is left, with its delete horizon as the
   time it can be gone;
3. after more data and a clean past that horizon the key is found nowhere (exit 1), and the
   broker, started again, serves no record of it.
"""

from __future__ import annotations

import json
import random
import subprocess
import time
from pathlib import Path

import pytest
from broker_workload import CLI, DAY_MS
from kafka_broker import EACH_KAFKA_LINE, RealBroker

pytestmark = [pytest.mark.slow, EACH_KAFKA_LINE]

TOPIC, PARTITIONS, KEY = "users", 3, b"user-42@example.com"
POLICY = "mode: compact\ntopics:\n  - match: users\n    cleanupPolicy: compact\n"


def where(broker: RealBroker, now_ms: int) -> tuple[int, list[dict], str]:
    done = subprocess.run([str(CLI), "where", str(broker.log_dir), "--topic", TOPIC, "--key", KEY.decode(),
                           "--json", "--now-ms", str(now_ms)], capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    return done.returncode, json.loads(done.stdout), done.stderr


def clean(broker: RealBroker, policy: Path, now_ms: int) -> None:
    done = subprocess.run([str(CLI), "clean", str(broker.log_dir), "--policy", str(policy), "--now-ms", str(now_ms)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def produce(broker: RealBroker, values: list[bytes | None], filler: int, rng: random.Random) -> int:
    """The key's ``values`` in order, each followed by ``filler`` records of other keys (enough
    to roll 1 MiB segments); returns the key's partition as the producer chose it."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=5)
    try:
        partition = None
        for value in values:
            sent = producer.send(TOPIC, key=KEY, value=value).get(60)
            assert partition in (None, sent.partition)
            partition = sent.partition
            for _ in range(filler):
                other = b"other-%05d" % rng.randrange(2000)
                producer.send(TOPIC, key=other, value=rng.randbytes(900), partition=partition)
            producer.flush(60)
        assert partition is not None
        return partition
    finally:
        producer.close(10)


def test_where_follows_a_key_until_it_is_gone(tmp_path: Path, line: str) -> None:
    rng = random.Random(42)
    broker = RealBroker(tmp_path / "broker", line, separate_metadata=False).start()
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    try:
        broker.create_topic(TOPIC, PARTITIONS, {"cleanup.policy": "compact", "segment.bytes": str(1 << 20)})
        partition = produce(broker, [b"v1", b"v2", None], filler=1500, rng=rng)
        broker.stop()

        now = int(time.time() * 1000)
        code, found, notes = where(broker, now)
        assert code == 0 and f"partition {partition} of {PARTITIONS}" in notes, notes
        assert [(f["partition"], f["kind"], f["latest"]) for f in found] == [
            (partition, "value", False), (partition, "value", False), (partition, "tombstone", True)]
        assert [f["offset"] for f in found] == sorted(f["offset"] for f in found)
        assert all(f["place"] == "segment" for f in found), found  # the filler rolled them out of the active one
        assert all("at the next clean" in f["gone"] for f in found[:2]), found
        assert "delete horizon" in found[2]["gone"]

        clean(broker, policy, now)
        code, found, _ = where(broker, now)
        assert code == 0 and [(f["kind"], f["latest"]) for f in found] == [("tombstone", True)], found
        horizon = found[0]["gone_by_ms"]
        assert horizon == now + DAY_MS, found  # Kafka's 24 h delete.retention.ms, stamped by the clean

        broker.start()
        broker.produce(TOPIC, [(partition, b"other-%05d" % rng.randrange(2000), rng.randbytes(900))
                               for _ in range(3000)])
        broker.stop()
        clean(broker, policy, horizon + 1)
        code, found, notes = where(broker, horizon + 1)
        assert code == 1 and found == [], found

        broker.start()
        served = broker.consume(TOPIC, PARTITIONS)
        assert KEY not in served[partition]
        assert broker.problems([TOPIC]) == [], broker.problems([TOPIC])
    finally:
        broker.stop()
