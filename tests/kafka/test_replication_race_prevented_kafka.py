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
from replication_race import TRANSACTION_SETTINGS

from cleaner import cleaning
from cleaner.clock import FixedTime
from cleaner.config import Policy, parse_policy_text
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


def _clean_stopped(broker: RealBroker, caplog: pytest.LogCaptureFixture, later_ms: int = 0,
                   policy: Policy = POLICY) -> list[str]:
    """kafka-cleaner on the stopped broker's log dirs (the data and ``metadata.log.dir``, as
    ``clean`` is given a broker's dirs), its clock ``later_ms`` ahead; the hold's log lines."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cleaner"):
        clock = FixedTime(int(time.time() * 1000) + later_ms)
        outcome = cleaning.clean([broker.log_dir, broker.metadata_dir], policy, clock)
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
TXN_BROKER_SETTINGS = {**BROKER_SETTINGS, **TRANSACTION_SETTINGS}
TXN_TOPIC_CONFIGS = {**TOPIC_CONFIGS, "segment.ms": "300"}  # a produce after 300 ms rolls the segment
CLEANS = 4
"""Enough for Kafka's rules to remove every marker without the hold (seen: the ABORT's data
goes first, the marker once its horizon, stamped by a later clean, has passed)."""
TXN_POLICY = parse_policy_text(
    "mode: compact\ntopics:\n  - match: accounts\n    cleanupPolicy: compact\n    minCleanableDirtyRatio: 0.01\n"
    "    deleteRetentionMs: 1000\n"
)


def test_kafka_cleaner_keeps_the_markers_a_replica_away_has_not_fetched(
    tmp_path: Path, line: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Manifestations 2-4 played again with kafka-cleaner as the only cleaner
    (``replication_race.MarkersAway``): broker 2 away while the leader ends three transactions
    (an abort, a committed deletion, a commit then superseded) and their producers expire;
    kafka-cleaner cleans the stopped leader four times, each past the horizons the one before
    stamped. The markers are kept while broker 2 is out; broker 2 back fetches them, the
    producers' next transactions end as they should on both replicas, and broker 2, leading,
    serves every key as broker 1 does: no aborted refund, no deleted account, no frozen
    read_committed."""
    from replication_race import MarkersAway

    started = time.monotonic()
    with two_broker_cluster(tmp_path, line, extra=TXN_BROKER_SETTINGS) as (_, one, two):
        away = MarkersAway(one, two, TXN_TOPIC, TXN_TOPIC_CONFIGS)
        try:
            # kafka-cleaner on the stopped leader, a minute later each time (past every horizon the
            # one before stamped), with a rolled dirty segment before each: where Kafka's cleaner
            # removes the aborted data, the committed deletion, then the markers.
            for clean in range(CLEANS):
                one.stop()
                held = _clean_stopped(one, caplog, later_ms=clean * 60_000, policy=TXN_POLICY)
                assert held and "replica 2 is" in held[0], f"clean {clean + 1} did not hold the markers"
                one.start()
                away.roll(clean + 1)
            assert away.markers_on(one) == away.markers, "a marker went while broker 2 was away"
            away.come_back()
            print(f"prevented (markers) on Kafka {line} in {time.monotonic() - started:.0f} s")
        finally:
            away.close()
