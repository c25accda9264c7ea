"""The workload the real-broker tests produce through a real broker with kafka-python, and
how they read it back (issue 9).

A compacted topic of three partitions with keys with many versions, tombstones, every codec
(none, gzip, snappy, lz4, zstd), headers, an idempotent producer, and transactions both
committed and aborted.
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kafka_broker import RealBroker

TOPIC = "compacted"
PARTITIONS = 3
KEYS = 400
DAY_MS = 86_400_000
CLI = Path(sys.executable).with_name("kafka-cleaner")
POLICY = f"""\
mode: compact
topics:
  - match: {TOPIC}
    cleanupPolicy: compact
    minCleanableDirtyRatio: 0.01
"""


@dataclass(frozen=True)
class Rec:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple


PRODUCERS = [
    *({"compression_type": codec, "acks": "all"} for codec in (None, "gzip", "snappy", "lz4", "zstd")),
    {"enable_idempotence": True, "acks": "all", "compression_type": "lz4"},
]
"""kafka-python settings of the workload's non-transactional producers."""


def produce_workload(broker: RealBroker, seed: int) -> None:
    from kafka import KafkaProducer

    rng = random.Random(seed)

    def record(n: int) -> tuple[int, bytes, bytes | None, list]:
        key = b"key-%04d" % rng.randrange(KEYS)
        value = None if rng.random() < 0.05 else b"%d:" % n + rng.randbytes(rng.randrange(200, 800))
        headers = [("trace", b"%d" % n)] if rng.random() < 0.2 else []
        return rng.randrange(PARTITIONS), key, value, headers

    n = 0
    for settings in PRODUCERS:
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5, **settings)
        try:
            for _ in range(1_500):
                p, key, value, headers = record(n := n + 1)
                producer.send(TOPIC, key=key, value=value, partition=p, headers=headers)
            producer.flush(60)
        finally:
            producer.close(10)
    producer = KafkaProducer(
        bootstrap_servers=broker.bootstrap, transactional_id=f"round-trip-{seed}", compression_type="gzip"
    )
    try:
        producer.init_transactions()
        for txn in range(12):
            producer.begin_transaction()
            for _ in range(150):
                p, key, value, headers = record(n := n + 1)
                producer.send(TOPIC, key=key, value=value, partition=p, headers=headers)
            producer.flush(60)  # on the broker before the end: kafka-python's abort drops unsent records
            if txn % 3 == 1:
                producer.abort_transaction()
            else:
                producer.commit_transaction()
    finally:
        producer.close(10)


def read_all(broker: RealBroker, isolation: str) -> list[Rec]:
    """Every record of the topic, from each partition's earliest offset to its end."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KafkaTopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level=isolation,
    )
    try:
        tps = [KafkaTopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)  # read_committed: the last stable offset
        out: list[Rec] = []
        deadline = time.monotonic() + 90
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, "the consumer did not reach the end offsets"
            for tp, messages in consumer.poll(timeout_ms=500).items():
                out += [Rec(tp.partition, m.offset, m.key, m.value, tuple(m.headers)) for m in messages]
        return sorted(out, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()


def latest(records: list[Rec]) -> dict[tuple[int, bytes | None], bytes | None]:
    """Each key's latest value per partition (None: a tombstone)."""
    return {(r.partition, r.key): r.value for r in records}


def live(records: list[Rec]) -> dict[tuple[int, bytes | None], bytes]:
    return {k: v for k, v in latest(records).items() if v is not None}
