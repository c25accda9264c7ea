"""The compaction–replication race does not happen where kafka-cleaner compacts (issue 24,
item 3), on a real cluster of each Kafka line: manifestation 1 of
``test_compaction_replication_race_kafka.py`` played again with kafka-cleaner as the only
cleaner (Kafka's own is off), run on the leader's disk while it is stopped, as compact mode's
gate and maintenance windows run it.

Broker 2 is away (fenced, out of the ISR). The leader, broker 1, takes the key's tombstone and
more data. kafka-cleaner cleans broker 1's log dir twice: the first clean removes the key's old
value and stamps the tombstone's delete horizon (``delete.retention.ms`` 1 s, read from the
cluster's metadata on the disk), the second runs past that horizon, where Kafka's cleaner
removes the tombstone (the baseline). The metadata log on broker 1's disk says broker 2 is out,
so the tombstone is kept (``LogCleanerManager.removal_hold``). Broker 2 comes back, fetches from
its log end, which is below the tombstone, and so receives it: leading, it serves no value for
the key. Seen failing with the hold disabled: broker 2 served the deleted value.

Manifestations 2-4 the same way (``test_kafka_cleaner_keeps_the_markers_a_replica_away_has_not_fetched``):
three transactions end on the leader while broker 2 is away, their producers expire there, and
kafka-cleaner cleans the stopped leader four times a minute apart; the markers are kept, broker 2
fetches them, and leading serves what broker 1 serves. Seen failing with the hold disabled
(4.3.1): the four cleans removed all three markers, and broker 2 leading served the aborted
refund (2), the deleted account's balance (3) and nothing at all on the frozen partition (4).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from kafka_broker import EACH_KAFKA_LINE, RealBroker, create_topic, two_broker_cluster, wait_until

from cleaner import cleaning
from cleaner.clock import FixedTime
from cleaner.config import parse_policy_text
from cleaner.where import DEFAULT_POLICY, where

pytestmark = [pytest.mark.slow, EACH_KAFKA_LINE]

TOPIC, KEY, VALUE = "profiles", b"user-42", b"date-of-birth:1990-01-01"
BROKER_SETTINGS = {"broker.heartbeat.interval.ms": "500", "min.insync.replicas": "1"}
TOPIC_CONFIGS = {
    "cleanup.policy": "compact",
    "delete.retention.ms": "1000",
    "min.cleanable.dirty.ratio": "0.01",
    "segment.bytes": str(1 << 20),  # Kafka 4's smallest: the filler rolls segments
}
POLICY = parse_policy_text(  # the topic's own delete.retention.ms: a policy may not shorten it, nor lengthen it here
    "mode: compact\ntopics:\n  - match: profiles\n    cleanupPolicy: compact\n    minCleanableDirtyRatio: 0.01\n"
    "    deleteRetentionMs: 1000\n"
)


def _filler(n: int, tag: int) -> list[tuple[int, bytes, bytes | None]]:
    return [(0, b"other-%04d" % (i % 300), b"%d:" % tag + b"x" * 900) for i in range(n)]


def _records_of_key(broker: RealBroker) -> list[str]:
    sightings, _ = where([broker.log_dir], parse_policy_text(DEFAULT_POLICY), KEY, TOPIC,
                         int(time.time() * 1000), partition=0)
    return [s.kind for s in sightings]


def _clean_stopped(broker: RealBroker, caplog: pytest.LogCaptureFixture, later_ms: int = 0) -> list[str]:
    """kafka-cleaner on the stopped broker's log dirs (the data and ``metadata.log.dir``, as
    ``clean`` is given a broker's dirs), its clock ``later_ms`` ahead; the hold's log lines."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cleaner"):
        clock = FixedTime(int(time.time() * 1000) + later_ms)
        outcome = cleaning.clean([broker.log_dir, broker.metadata_dir], POLICY, clock)
    assert not outcome.uncleanable, outcome.uncleanable
    return [r.getMessage() for r in caplog.records if "keeping every tombstone" in r.getMessage()]


def test_kafka_cleaner_keeps_the_tombstone_a_replica_away_has_not_fetched(
    tmp_path: Path, line: str, caplog: pytest.LogCaptureFixture
) -> None:
    started = time.monotonic()
    with two_broker_cluster(tmp_path, line, extra=BROKER_SETTINGS) as (_, one, two):
        create_topic(one, TOPIC, {0: [1, 2]}, TOPIC_CONFIGS)
        wait_until(lambda: one.partition_state(TOPIC) == {"leader": 1, "isr": [1, 2]}, "both replicas in sync")
        one.produce(TOPIC, [(0, KEY, VALUE), *_filler(50, 0)])
        wait_until(lambda: _records_of_key(two) == ["value"], "the value on broker 2's disk")

        # Broker 2 is away; the key is deleted on the leader.
        two.stop()
        wait_until(lambda: one.partition_state(TOPIC)["isr"] == [1], "broker 2 out of the ISR")
        one.produce(TOPIC, [(0, KEY, None), *_filler(1_500, 1)])

        # The first clean: the value goes, the tombstone's horizon is stamped.
        one.stop()
        held = _clean_stopped(one, caplog)
        assert _records_of_key(one) == ["tombstone"]
        assert held and "replica 2 is" in held[0], held

        # More data, then a clean past the horizon: Kafka's cleaner would remove the tombstone.
        one.start()
        one.produce(TOPIC, _filler(1_200, 2))
        one.stop()
        held = _clean_stopped(one, caplog, later_ms=60_000)  # past the 1 s horizon the first clean stamped
        assert held and "replica 2 is" in held[0], "the second clean did not hold the tombstone"
        assert _records_of_key(one) == ["tombstone"], "the tombstone went while broker 2 was away"

        # Broker 2 back: it fetches the tombstone from its log end on and, leading, serves no value.
        one.start()
        two.start()
        wait_until(lambda: one.partition_state(TOPIC)["isr"] == [1, 2], "broker 2 back in the ISR")
        wait_until(lambda: "tombstone" in _records_of_key(two), "the tombstone on broker 2's disk")
        one.stop()
        wait_until(lambda: two.partition_state(TOPIC)["leader"] == 2, "broker 2 leading")
        served = two.consume(TOPIC, 1)[0]
        assert served.get(KEY) != VALUE, "broker 2 served the deleted value: the race happened"
        assert served.get(KEY, "absent") in (None, "absent")
        print(f"prevented on Kafka {line} in {time.monotonic() - started:.0f} s")


# -- manifestations 2-4: transaction markers ------------------------------------------------

TXN_TOPIC = "accounts"
ABORTED_SERVED, COMMITTED_HIDDEN, FROZEN = 0, 1, 2  # as in test_compaction_replication_race_kafka
TXN_BROKER_SETTINGS = {
    **BROKER_SETTINGS,
    "transaction.state.log.replication.factor": "2",
    "transaction.state.log.num.partitions": "1",
    "transaction.state.log.min.isr": "1",
    "producer.id.expiration.ms": "2000",
    "producer.id.expiration.check.interval.ms": "500",
}
TXN_TOPIC_CONFIGS = {**TOPIC_CONFIGS, "segment.ms": "300"}  # a produce after 300 ms rolls the segment
CLEANS = 4
"""Enough for Kafka's rules to remove every marker without the hold (seen: the ABORT's data
goes first, the marker once its horizon, stamped by a later clean, has passed)."""
TXN_POLICY = parse_policy_text(
    "mode: compact\ntopics:\n  - match: accounts\n    cleanupPolicy: compact\n    minCleanableDirtyRatio: 0.01\n"
    "    deleteRetentionMs: 1000\n"
)


def _roll(broker: RealBroker, tag: int) -> None:
    """A produce to every partition after ``segment.ms``: what came before is in rolled segments."""
    time.sleep(0.4)
    broker.produce(TXN_TOPIC, [(p, b"filler-%d" % (tag % 7), b"%d" % tag) for p in (0, 1, 2)])


def _clean_stopped_txn(broker: RealBroker, caplog: pytest.LogCaptureFixture, later_ms: int = 0) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cleaner"):
        clock = FixedTime(int(time.time() * 1000) + later_ms)
        outcome = cleaning.clean([broker.log_dir, broker.metadata_dir], TXN_POLICY, clock)
    assert not outcome.uncleanable, outcome.uncleanable
    return [r.getMessage() for r in caplog.records if "keeping every tombstone" in r.getMessage()]


def test_kafka_cleaner_keeps_the_markers_a_replica_away_has_not_fetched(
    tmp_path: Path, line: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Manifestations 2-4 played again with kafka-cleaner as the only cleaner: broker 2 away
    while the leader ends three transactions (an abort, a committed deletion, a commit then
    superseded); kafka-cleaner cleans the stopped leader twice, the second time past every
    marker's horizon. The markers are kept while broker 2 is out; broker 2 back fetches them,
    the producers' next transactions end as they should on both replicas, and broker 2,
    leading, serves every key as broker 1 does: no aborted refund, no deleted account, no
    frozen read_committed."""
    from replication_race import (
        active_producers,
        lead,
        lead_transaction_coordinator,
        of_producer,
        producer_id_at,
        serve,
    )
    from replication_race import transactional_producer as txn_producer

    started = time.monotonic()
    producers = []
    with two_broker_cluster(tmp_path, line, extra=TXN_BROKER_SETTINGS) as (_, one, two):
        try:
            partitions = [ABORTED_SERVED, COMMITTED_HIDDEN, FROZEN]
            create_topic(one, TXN_TOPIC, {p: [1, 2] for p in partitions}, TXN_TOPIC_CONFIGS)
            wait_until(lambda: all(one.partition_state(TXN_TOPIC, p) == {"leader": 1, "isr": [1, 2]}
                                   for p in partitions), "both replicas in sync")  # fmt: skip
            one.produce(TXN_TOPIC, [(COMMITTED_HIDDEN, b"account-3", b"balance:120")])
            aborted, committed, frozen = (txn_producer(one, name) for name in ("aborted", "committed", "frozen"))
            producers += [aborted, committed, frozen]
            lead_transaction_coordinator(one, 1, [2])
            first: dict[int, int] = {}
            for producer, partition, key, value in (
                (aborted, ABORTED_SERVED, b"payment-7", b"refund:9999"),
                (committed, COMMITTED_HIDDEN, b"account-3", None),
                (frozen, FROZEN, b"order-5", b"state:paid"),
            ):
                producer.begin_transaction()
                first[partition] = producer.send(TXN_TOPIC, key=key, value=value, partition=partition).get(30).offset
                producer.flush(30)
            pid = wait_until(lambda: {p: producer_id_at(two.log_dir, TXN_TOPIC, p, first[p]) for p in first},
                             "the transactions' data on broker 2")  # fmt: skip

            # Broker 2 is away; the transactions end on the leader; the paid order is superseded.
            two.stop()
            wait_until(lambda: all(one.partition_state(TXN_TOPIC, p)["isr"] == [1] for p in partitions),
                       "broker 2 out of the ISR")  # fmt: skip
            aborted.abort_transaction()
            committed.commit_transaction()
            frozen.commit_transaction()
            one.produce(TXN_TOPIC, [(FROZEN, b"order-5", b"state:shipped")])
            _roll(one, 0)
            markers = {p: [m for m in of_producer(one.log_dir, TXN_TOPIC, p, pid[p]) if m.startswith("marker")]
                       for p in partitions}  # fmt: skip
            assert all(markers.values()), markers
            # The producers expire on the leader (2 s idle): nothing but the hold keeps their markers.
            wait_until(lambda: not any(pid[p] in active_producers(one, TXN_TOPIC, p) for p in partitions),
                       "the idle producers to expire on broker 1")  # fmt: skip

            # kafka-cleaner on the stopped leader, a minute later each time (past every horizon the
            # one before stamped), with a rolled dirty segment before each: where Kafka's cleaner
            # removes the aborted data, the committed deletion, then the markers.
            for clean in range(CLEANS):
                one.stop()
                held = _clean_stopped_txn(one, caplog, later_ms=clean * 60_000)
                assert held and "replica 2 is" in held[0], f"clean {clean + 1} did not hold the markers"
                one.start()
                _roll(one, clean + 1)
            for p in partitions:
                kept = [m for m in of_producer(one.log_dir, TXN_TOPIC, p, pid[p]) if m.startswith("marker")]
                assert kept == markers[p], f"partition {p}: a marker went while broker 2 was away"

            # Broker 2 back: it fetches the markers; the producers' next transactions end as they should.
            two.start()
            wait_until(lambda: all(sorted(one.partition_state(TXN_TOPIC, p)["isr"]) == [1, 2] for p in partitions),
                       "broker 2 back in the ISR")  # fmt: skip
            for p in partitions:
                wait_until(lambda p=p: [m for m in of_producer(two.log_dir, TXN_TOPIC, p, pid[p])
                                        if m.startswith("marker")] == markers[p],
                           f"the marker of partition {p} on broker 2")  # fmt: skip
            aborted.begin_transaction()
            aborted.send(TXN_TOPIC, key=b"payment-8", value=b"refund:1", partition=ABORTED_SERVED)
            aborted.commit_transaction()
            committed.begin_transaction()
            committed.send(TXN_TOPIC, key=b"account-4", value=b"balance:0", partition=COMMITTED_HIDDEN).get(30)
            committed.abort_transaction()
            one.produce(TXN_TOPIC, [(FROZEN, b"order-6", b"state:new")])
            by_one = {p: serve(one, TXN_TOPIC, p, "read_committed") for p in partitions}

            lead(one, TXN_TOPIC, partitions, 2, [1])
            by_two = {p: serve(two, TXN_TOPIC, p, "read_committed") for p in partitions}
            for p in partitions:
                assert by_two[p].end == by_one[p].end, f"partition {p}: read_committed ends elsewhere on broker 2"
                assert {k: v for _, k, v in by_two[p].records} == {k: v for _, k, v in by_one[p].records}, p
            assert by_two[ABORTED_SERVED].value_of(b"payment-7") == "absent", "manifestation 2 happened"
            # (the committed deletion's tombstone is still there: broker 2 was away past its horizon)
            assert by_two[COMMITTED_HIDDEN].value_of(b"account-3") in (None, "absent"), "manifestation 3 happened"
            assert by_two[FROZEN].value_of(b"order-6") == b"state:new", "manifestation 4 happened"
            print(f"prevented (markers) on Kafka {line} in {time.monotonic() - started:.0f} s")
        finally:
            for producer in producers:
                producer.close(timeout=5)
