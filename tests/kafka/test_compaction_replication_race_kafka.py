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

Manifestations 2-4 are the same race on transaction markers (see the comment above the second
test, and docs/replica-divergence.md): broker 2 holds a transaction's data and misses its
marker, which the leader's cleaner removed; the transaction stays open on broker 2 until the
producer's next marker ends it with that marker's outcome (2: an aborted refund served as
committed; 3: a committed deletion classified as aborted, the deleted account served again)
or forever (4: read_committed frozen at the open transaction's first offset).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from broker_workload import CLI
from kafka_broker import EACH_KAFKA_LINE, RealBroker, create_topic, two_broker_cluster, wait_until
from replication_race import (
    TRANSACTION_SETTINGS,
    aborted_transactions,
    coordinator_state,
    diverged,
    lead,
    lead_transaction_coordinator,
    of_producer,
    open_transactions,
    operator_divergences,
    producer_id_at,
    serve,
    transactional_producer,
)

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


def _diverge(one: RealBroker, two: RealBroker) -> None:
    """Manifestation 1 up to the divergence: broker 2, back in the ISR, holds the value of a key
    broker 1 deleted and its cleaner removed, tombstone and all."""
    create_topic(one, TOPIC, {0: [1, 2]}, TOPIC_CONFIGS)
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


def test_deleted_data_reappears_on_a_replica_that_was_away_past_the_delete_horizon(tmp_path: Path, line: str) -> None:
    started = time.monotonic()
    with two_broker_cluster(tmp_path, line, extra=BROKER_SETTINGS, cleaner_enable=True) as (_, one, two):
        _diverge(one, two)

        # Named on the replica that has it (issue 24, item 4), and only there.
        code, findings = diverged(one, two, TOPIC, [0])
        assert code == 1 and [(f["manifestation"], f["replica"], f["key"]) for f in findings] == [
            (1, "broker 2", KEY)], findings
        assert diverged(two, one, TOPIC, [0]) == (0, [])

        # Broker 2 leads: the deleted value is served again.
        one.stop()
        wait_until(lambda: two.partition_state(TOPIC)["leader"] == 2, "broker 2 leading")
        served = two.consume(TOPIC, 1)[0]
        assert served.get(KEY) == b"date-of-birth:1990-01-01", "the race did not reproduce"
        print(f"reproduced on Kafka {line} in {time.monotonic() - started:.0f} s")


def test_refetch_repairs_the_replica_that_kept_the_deleted_value(tmp_path: Path, line: str) -> None:
    """Issue 24, item 4: ``kafka-cleaner refetch`` on the diverged broker, stopped, sets its copy
    aside as Kafka's topic deletion does; at its next start it fetches the leader's log and
    serves what the leader serves. Refused while no other replica is in sync, and a dry run
    changes nothing."""
    started = time.monotonic()
    with two_broker_cluster(tmp_path, line, extra=BROKER_SETTINGS, cleaner_enable=True) as (_, one, two):
        _diverge(one, two)
        leader_view = one.consume(TOPIC, 1)[0]
        two.stop()
        wait_until(lambda: one.partition_state(TOPIC)["isr"] == [1], "broker 2 out of the ISR")
        dirs = [str(two.log_dir), str(two.metadata_dir)]
        before = sorted(os.listdir(two.log_dir))
        dry = subprocess.run([str(CLI), "refetch", *dirs, "--topic", TOPIC, "--partition", "0"],
                             capture_output=True, text=True, check=False)
        assert dry.returncode == 0 and "would rename it to profiles-0." in dry.stdout, dry.stdout + dry.stderr
        assert sorted(os.listdir(two.log_dir)) == before
        done = subprocess.run([str(CLI), "refetch", *dirs, "--topic", TOPIC, "--partition", "0", "--execute"],
                              capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        assert not (two.log_dir / f"{TOPIC}-0").exists()
        two.start()
        wait_until(lambda: one.partition_state(TOPIC)["isr"] == [1, 2], "broker 2 back in the ISR")
        assert _records_of_key(two) == [], "broker 2 fetched the deleted key's value again"
        assert diverged(one, two, TOPIC, [0]) == (0, [])
        # The copy set aside waits for Kafka's own delayed deletion (about a minute after the start
        # in our runs, file.delete.delay.ms at 1 s or not); the broker took it for what the name
        # says, with no complaint about the topic.
        assert [p for p in os.listdir(two.log_dir) if p.startswith(f"{TOPIC}-0.") and p.endswith("-delete")]
        assert two.problems([TOPIC]) == [], two.problems([TOPIC])

        # Broker 1 stopped: broker 2 is the last in-sync replica, and refuses to set its copy aside.
        one.stop()
        wait_until(lambda: two.partition_state(TOPIC)["leader"] == 2, "broker 2 leading")
        served = two.consume(TOPIC, 1)[0]
        assert served == leader_view, "broker 2 leading serves other records than broker 1 did"
        two.stop(kill=True)  # the last broker's clean shutdown waits ~30 s for leadership to move
        refused = subprocess.run([str(CLI), "refetch", *dirs, "--topic", TOPIC, "--partition", "0", "--execute"],
                                 capture_output=True, text=True, check=False)
        assert refused.returncode == 2 and "no other replica of profiles-0 is in sync" in refused.stderr, (
            refused.stdout + refused.stderr)
        assert (two.log_dir / f"{TOPIC}-0").is_dir()
        print(f"repaired on Kafka {line} in {time.monotonic() - started:.0f} s")


# -- manifestations 2-4: transaction markers compacted away while a replica is away ---------
#
# A replica that fetched a transaction's data and then went away holds that transaction open
# in its producer state (ProducerAppendInfo.appendDataBatch sets the producer's
# currentTxnFirstOffset). The leader's cleaner removes the marker that ends it once no batch of
# the transaction is left (CleanedTransactionMetadata.onControlBatchRead: an ABORT once the
# aborted data is gone, a COMMIT once no batch of the producer was traversed since its previous
# marker), the marker's delete horizon (stamped by the clean that first finds it removable)
# has passed (Cleaner.cleanInto's checkBatchRetention) and the producer is no longer active on
# the leader: the batch that holds an active producer's last data offset is kept as an empty
# header (isBatchLastRecordOfProducer: RETAIN_EMPTY), which later cleans still traverse, so its
# marker stays. An idle producer expires after producer.id.expiration.ms (1 day by default; 2 s
# here). So the returning replica never closes the transaction; the producer's next marker, if
# it ever writes one, closes it from the old first offset (appendEndTxnMarker) with its own
# outcome, and one that never writes again leaves it open.

TXN_TOPIC = "accounts"
ABORTED_SERVED, COMMITTED_HIDDEN, FROZEN = 0, 1, 2  # one partition per manifestation
TXN_BROKER_SETTINGS = {**BROKER_SETTINGS, **TRANSACTION_SETTINGS}
TXN_TOPIC_CONFIGS = {**TOPIC_CONFIGS, "segment.ms": "300"}  # every produce after 300 ms rolls: dirty segments


class _Phases:
    """Wall time of each phase of a reproduction: printed as each ends (a stall names the phase
    it is in) and summed up at the end (the docs quote them)."""

    def __init__(self, line: str) -> None:
        self.line = line
        self.started = self.last = time.monotonic()
        self.times: list[tuple[str, float]] = []

    def done(self, phase: str) -> None:
        now = time.monotonic()
        self.times.append((phase, now - self.last))
        self.last = now
        print(f"[{time.strftime('%H:%M:%S')}] Kafka {self.line}: {phase} ({now - self.started:.1f} s)", flush=True)

    def report(self) -> str:
        parts = ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in self.times)
        return f"Kafka {self.line}: {parts}; total {time.monotonic() - self.started:.1f} s"


def _all_partitions(broker: RealBroker, want: dict) -> bool:
    return all(broker.partition_state(TXN_TOPIC, p) == want for p in (ABORTED_SERVED, COMMITTED_HIDDEN, FROZEN))


def test_transaction_markers_compacted_away_while_a_replica_is_away(tmp_path: Path, line: str) -> None:
    """Manifestations 2 (aborted data served as committed), 3 (committed data hidden as
    aborted) and 4 (read_committed frozen at a stale last stable offset), one partition each,
    on one cluster: a controller and two brokers, broker 2 away while broker 1 takes the
    markers and its cleaner removes them, then broker 2 back and leading (a preferred
    election: broker 1 stays a follower). Then repaired: ``kafka-cleaner refetch`` on broker 2,
    stopped, and broker 2 leading serves what broker 1 serves."""
    phases = _Phases(line)
    producers = []
    with two_broker_cluster(tmp_path, line, extra=TXN_BROKER_SETTINGS, cleaner_enable=True) as (_, one, two):
        try:
            assignment = {p: [1, 2] for p in (ABORTED_SERVED, COMMITTED_HIDDEN, FROZEN)}
            create_topic(one, TXN_TOPIC, assignment, TXN_TOPIC_CONFIGS)
            wait_until(lambda: _all_partitions(one, {"leader": 1, "isr": [1, 2]}), "both replicas in sync")
            phases.done("cluster up")

            # An account both replicas hold; then each partition's producer opens a transaction:
            # a refund (to be aborted), the account's deletion (to be committed), an order's
            # state (to be committed and superseded). Both replicas take the transactions' data.
            one.produce(TXN_TOPIC, [(COMMITTED_HIDDEN, b"account-3", b"balance:120")])
            aborted, committed, frozen = (
                transactional_producer(one, name) for name in ("aborted", "committed", "frozen")
            )
            producers += [aborted, committed, frozen]
            lead_transaction_coordinator(one, 1, [2])  # it must outlive broker 2's absence
            first: dict[int, int] = {}
            for producer, partition, key, value in (
                (aborted, ABORTED_SERVED, b"payment-7", b"refund:9999"),
                (committed, COMMITTED_HIDDEN, b"account-3", None),
                (frozen, FROZEN, b"order-5", b"state:paid"),
            ):
                producer.begin_transaction()
                first[partition] = producer.send(TXN_TOPIC, key=key, value=value, partition=partition).get(30).offset
                producer.flush(30)
            pid = wait_until(
                lambda: {p: producer_id_at(two.log_dir, TXN_TOPIC, p, first[p]) for p in first},
                "the transactions' data on broker 2",
            )
            phases.done("transactions open on both replicas")

            # Broker 2 is away. The transactions end; a newer state supersedes the paid order.
            two.stop()
            wait_until(lambda: _all_partitions(one, {"leader": 1, "isr": [1]}), "broker 2 out of the ISR")
            aborted.abort_transaction()
            committed.commit_transaction()
            frozen.commit_transaction()
            one.produce(TXN_TOPIC, [(FROZEN, b"order-5", b"state:shipped")])
            phases.done("broker 2 away, the transactions ended on the leader")

            # The producers go idle and expire on the leader; its cleaner removes the aborted
            # refund, the committed deletion (past its horizon), the superseded order, and then,
            # past their own horizons, the markers. Each round adds a rolled, dirty segment.
            tag = 0

            def markers_gone_from_the_leader() -> bool:
                nonlocal tag
                if all(of_producer(one.log_dir, TXN_TOPIC, p, pid[p]) == [] for p in first):
                    return True
                one.produce(TXN_TOPIC, [(p, b"filler-%d" % (tag % 7), b"%d" % tag) for p in first])
                tag += 1
                time.sleep(0.3)
                return False

            wait_until(markers_gone_from_the_leader, "broker 1's cleaner to remove the transactions' data and markers")
            assert one.consume(TXN_TOPIC, 3)[COMMITTED_HIDDEN].get(b"account-3", "absent") == "absent"
            phases.done(f"data and markers compacted away on the leader ({tag} dirty rounds)")

            # Broker 2 comes back with every transaction's data and none of its markers: each
            # transaction is open there, its last stable offset held at its first offset.
            two.start()
            wait_until(lambda: _all_partitions(one, {"leader": 1, "isr": [1, 2]}), "broker 2 back in the ISR")
            for p in first:
                assert of_producer(two.log_dir, TXN_TOPIC, p, pid[p]) == [f"data@{first[p]}"]
            phases.done("broker 2 back in the ISR")

            # Two producers write one more transaction each: broker 2 fetches its data (which
            # joins the open transaction) and its marker (which ends it from the old first
            # offset). The refund's producer commits, the deletion's producer aborts; the third
            # never writes again. A new order is written after them.
            aborted.begin_transaction()
            aborted.send(TXN_TOPIC, key=b"payment-8", value=b"refund:1", partition=ABORTED_SERVED)
            aborted.commit_transaction()
            committed.begin_transaction()
            # (sent before the abort: an abort drops what the producer has not sent yet)
            committed.send(TXN_TOPIC, key=b"account-4", value=b"balance:0", partition=COMMITTED_HIDDEN).get(30)
            committed.abort_transaction()
            for p in (ABORTED_SERVED, COMMITTED_HIDDEN):
                wait_until(
                    lambda p=p: any(m.startswith("marker") for m in of_producer(two.log_dir, TXN_TOPIC, p, pid[p])),
                    f"the next marker on broker 2 ({p})",
                )
            # Broker 2 lists the committed deletion's producer as aborted from the deletion on.
            (closed,) = wait_until(
                lambda: [
                    t
                    for t in aborted_transactions(two.log_dir, TXN_TOPIC, COMMITTED_HIDDEN)
                    if t.producer_id == pid[COMMITTED_HIDDEN]
                ],
                "broker 2's aborted-transaction index entry",
            )
            assert closed.first_offset == first[COMMITTED_HIDDEN]
            assert not [
                t
                for t in aborted_transactions(one.log_dir, TXN_TOPIC, COMMITTED_HIDDEN)
                if t.first_offset <= first[COMMITTED_HIDDEN]
            ]  # the leader's covers only the new transaction
            one.produce(TXN_TOPIC, [(FROZEN, b"order-6", b"state:new")])  # acks=all: on broker 2 too
            # The leader serves each partition as the transactions ended.
            led_by_one = {p: serve(one, TXN_TOPIC, p, "read_committed") for p in first}
            assert led_by_one[ABORTED_SERVED].value_of(b"payment-7") == "absent"
            assert led_by_one[ABORTED_SERVED].value_of(b"payment-8") == b"refund:1"
            assert led_by_one[COMMITTED_HIDDEN].value_of(b"account-3") == "absent"
            assert led_by_one[FROZEN].value_of(b"order-5") == b"state:shipped"
            assert led_by_one[FROZEN].value_of(b"order-6") == b"state:new"
            phases.done("next transactions on both replicas")

            # Named on broker 2, each on its partition, with the key or the transaction (item 4).
            # Broker 2's own cleaner may remove the committed deletion it holds as aborted at any
            # time; once it has, broker 2 just serves a deleted account again: manifestation 1.
            hidden_before = f"data@{first[COMMITTED_HIDDEN]}" in of_producer(
                two.log_dir, TXN_TOPIC, COMMITTED_HIDDEN, pid[COMMITTED_HIDDEN])
            code, findings = diverged(one, two, TXN_TOPIC, list(first))
            hidden_after = f"data@{first[COMMITTED_HIDDEN]}" in of_producer(
                two.log_dir, TXN_TOPIC, COMMITTED_HIDDEN, pid[COMMITTED_HIDDEN])
            named = {(f["partition"], f["manifestation"], f["key"], f["producer_id"]) for f in findings}
            assert code == 1 and {f["replica"] for f in findings} == {"broker 2"}, findings
            assert (ABORTED_SERVED, 2, b"payment-7", pid[ABORTED_SERVED]) in named, findings
            assert (FROZEN, 4, None, pid[FROZEN]) in named, findings
            assert [f["offset"] for f in findings if f["manifestation"] == 4] == [first[FROZEN]], findings
            hidden = {m for p, m, key, _ in named if p == COMMITTED_HIDDEN and key == b"account-3"}
            assert hidden == ({3} if hidden_after else {1} if not hidden_before else hidden & {1, 3}) and hidden, (
                findings)
            # The operator's comparison of the sidecars' reports names 4 on broker 2 too.
            stale = [(d.partition, d.brokers) for d in operator_divergences({"broker-1": one, "broker-2": two},
                                                                            TXN_TOPIC) if d.kind == "staleLso"]
            assert stale == [(FROZEN, ("broker-2",))], stale
            print("diverged:", sorted(named, key=str), f"(deletion held on broker 2: {hidden_before}, {hidden_after})")
            assert diverged(two, one, TXN_TOPIC, list(first)) == (0, [])
            phases.done("named on broker 2 by kafka-cleaner diverged")

            lead(one, TXN_TOPIC, list(first), 2, [1])  # broker 1 stays, a follower in the ISR
            led_by_two = {p: serve(two, TXN_TOPIC, p, "read_committed") for p in first}
            uncommitted = serve(two, TXN_TOPIC, FROZEN, "read_uncommitted")
            phases.done("broker 2 leads")

            # 2: the aborted refund is served as committed.
            assert led_by_two[ABORTED_SERVED].value_of(b"payment-7") == b"refund:9999", (
                "manifestation 2 did not reproduce"
            )
            # 3: the committed deletion is classified as aborted on broker 2 (the next ABORT ended
            # the transaction from its offset; broker 2's own cleaner may since have removed it as
            # aborted data): read_committed serves the deleted account's balance.
            assert first[COMMITTED_HIDDEN] not in led_by_two[COMMITTED_HIDDEN].offsets()
            assert led_by_two[COMMITTED_HIDDEN].value_of(b"account-3") == b"balance:120", (
                "manifestation 3 did not reproduce"
            )
            # 4: the last stable offset is stuck at the open transaction's first offset: nothing
            # at or after it, not even the records written after it, is served.
            assert led_by_two[FROZEN].end == first[FROZEN], "manifestation 4 did not reproduce"
            assert led_by_two[FROZEN].records == []
            assert uncommitted.value_of(b"order-6") == b"state:new"  # on broker 2, not served committed
            # The leader holds the producer's transaction open from that offset; its coordinator
            # completed it (the hanging transaction `kafka-transactions.sh find-hanging` looks for).
            assert open_transactions(two, TXN_TOPIC, FROZEN) == {pid[FROZEN]: first[FROZEN]}
            assert coordinator_state(two, "frozen") == "CompleteCommit"

            # Repair (issue 24, item 4): broker 2 stopped, its copies of the three partitions set
            # aside by `kafka-cleaner refetch` (broker 1 in sync on its metadata); started, it
            # fetches broker 1's logs and, leading again, serves what broker 1 serves.
            two.stop()
            wait_until(lambda: _all_partitions(one, {"leader": 1, "isr": [1]}), "broker 1 leading alone")
            by_one = {p: serve(one, TXN_TOPIC, p, "read_committed") for p in first}
            dirs = [str(two.log_dir), str(two.metadata_dir)]
            for p in first:
                done = subprocess.run([str(CLI), "refetch", *dirs, "--topic", TXN_TOPIC, "--partition", str(p),
                                       "--execute"], capture_output=True, text=True, check=False)  # fmt: skip
                assert done.returncode == 0, done.stdout + done.stderr
            phases.done("broker 2 stopped, its three copies set aside")
            two.start()
            wait_until(lambda: all(sorted(one.partition_state(TXN_TOPIC, p)["isr"]) == [1, 2] for p in first),
                       "broker 2 back in the ISR")  # fmt: skip
            lead(one, TXN_TOPIC, list(first), 2, [1])
            repaired = {p: serve(two, TXN_TOPIC, p, "read_committed") for p in first}
            for p in first:  # per key (a cleaner may have run since: superseded records and old tombstones go)
                assert repaired[p].end == by_one[p].end, p
                assert repaired[p].live() == by_one[p].live(), (p, by_one[p].records, repaired[p].records)
            assert repaired[ABORTED_SERVED].value_of(b"payment-7") == "absent"
            assert repaired[COMMITTED_HIDDEN].value_of(b"account-3") == "absent"
            assert repaired[FROZEN].value_of(b"order-6") == b"state:new"
            assert open_transactions(two, TXN_TOPIC, FROZEN) == {}
            assert diverged(one, two, TXN_TOPIC, list(first)) == (0, [])
            assert operator_divergences({"broker-1": one, "broker-2": two}, TXN_TOPIC) == []
            phases.done("repaired: broker 2 leading serves what broker 1 served")
            print(phases.report())
        finally:
            for producer in producers:
                producer.close(timeout=5)
