"""What the compaction–replication race tests need beyond ``kafka_broker``: a transactional
producer and a transaction coordinator that stays up, a consumer that reads one partition at a
chosen isolation level record by record (offsets matter: the manifestations are about which
offsets a replica serves), and read-only looks at one broker: the batches of one producer on
its disk (a marker the leader's cleaner removed, or emptied to a header-only batch, is one a
lagging replica never learns), its aborted-transaction index, and the transactions its
producer state holds open (DescribeProducers).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from broker_workload import CLI
from compaction_operator.divergence import Divergence, diverging_partitions
from kafka_broker import RealBroker, create_topic, wait_until

from cleaner import cleaning
from cleaner.clock import SYSTEM_TIME
from cleaner.config import parse_policy_text
from cleaner.sidecar.report import replica_section
from cleaner.storage.index import AbortedTxn, TransactionIndex
from cleaner.storage.segment import iter_file_batches
from cleaner.where import DEFAULT_POLICY


@dataclass(frozen=True)
class Served:
    """One partition as a consumer of one isolation level reads it from its start: the
    records (offset, key, value) and the end it reads to (the last stable offset for
    ``read_committed``, the high watermark for ``read_uncommitted``)."""

    records: list[tuple[int, bytes, bytes | None]]
    end: int

    def value_of(self, key: bytes) -> bytes | str | None:
        """The key's latest value, or ``"absent"``."""
        found: bytes | str | None = "absent"
        for _, k, v in self.records:
            if k == key:
                found = v
        return found

    def offsets(self) -> set[int]:
        return {offset for offset, _, _ in self.records}

    def live(self) -> dict[bytes, bytes]:
        """Every key's latest value, the deleted keys left out: what two replicas must agree
        on. Whether a deleted key's tombstone is still there is each broker's own cleaner's
        business: past ``delete.retention.ms`` (a second in these tests) it removes it on its
        own schedule, which may fall between the reads of the two brokers."""
        latest = {k: v for _, k, v in self.records}
        return {k: v for k, v in latest.items() if v is not None}


def serve(broker: RealBroker, topic: str, partition: int, isolation: str) -> Served:
    """Every record the broker serves of the partition at ``isolation`` (it must lead it)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level=isolation,
    )
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end = consumer.end_offsets([tp])[tp]
        records: list[tuple[int, bytes, bytes | None]] = []
        deadline = time.monotonic() + 30
        while consumer.position(tp) < end:
            assert time.monotonic() < deadline, f"the {isolation} consumer did not reach {end}"
            for message in consumer.poll(timeout_ms=300).get(tp, []):
                records.append((message.offset, message.key, message.value))
        return Served(records, end)
    finally:
        consumer.close()


def transactional_producer(broker: RealBroker, transactional_id: str):  # type: ignore[no-untyped-def]
    """A kafka-python transactional producer, its producer id registered with the coordinator."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=transactional_id, linger_ms=0)
    producer.init_transactions()
    return producer


@dataclass(frozen=True)
class OnDisk:
    """One batch of a partition on a broker's disk (header only)."""

    base_offset: int
    producer_id: int
    control: bool
    records: int


def batches_on_disk(log_dir: Path, topic: str, partition: int) -> list[OnDisk]:
    """The partition's batches on one broker's disk, in offset order (read-only, next to the
    live broker; a segment the cleaner swaps away meanwhile is skipped, the caller polls)."""
    out: list[OnDisk] = []
    for segment in sorted((log_dir / f"{topic}-{partition}").glob("*.log")):
        try:
            for chunk in iter_file_batches(segment, allow_truncated_tail=True):
                out.extend(OnDisk(h.base_offset, h.producer_id, h.is_control, h.records_count) for h in chunk)
        except FileNotFoundError:
            continue
    return sorted(out, key=lambda b: b.base_offset)


def producer_id_at(log_dir: Path, topic: str, partition: int, offset: int) -> int:
    """The producer id of the batch that holds ``offset`` on this disk (ValueError while it is
    not there yet: ``wait_until`` polls on)."""
    (batch,) = [b for b in batches_on_disk(log_dir, topic, partition) if b.base_offset == offset]
    return batch.producer_id


def of_producer(log_dir: Path, topic: str, partition: int, producer_id: int) -> list[str]:
    """What of one producer's batches holds records on this disk: ``"data@offset"`` and
    ``"marker@offset"`` (an emptied batch, the cleaner's header-only remnant, carries no
    record: a replica that fetches it learns nothing from it)."""
    return [
        f"{'marker' if b.control else 'data'}@{b.base_offset}"
        for b in batches_on_disk(log_dir, topic, partition)
        if b.producer_id == producer_id and b.records > 0
    ]


def aborted_transactions(log_dir: Path, topic: str, partition: int) -> list[AbortedTxn]:
    """The aborted transactions a broker's ``.txnindex`` files list for the partition: what
    its read_committed fetches hand consumers to drop (producer id, first and last offset)."""
    out: list[AbortedTxn] = []
    for index in sorted((log_dir / f"{topic}-{partition}").glob("*.txnindex")):
        try:
            out.extend(TransactionIndex.read(index, int(index.name.split(".")[0])).all_aborted_txns())
        except FileNotFoundError:
            continue
    return out


def lead(broker: RealBroker, topic: str, partitions: list[int], node_id: int, others: list[int]) -> None:
    """Make ``node_id`` lead the partitions, the other replicas staying followers: it becomes
    the first replica (a reassignment of the same replicas), then a preferred election. The
    followers stay up and in the ISR, unlike a leader change by stopping the leader."""
    from kafka import TopicPartition
    from kafka.admin import KafkaAdminClient

    if all(broker.partition_state(topic, p)["leader"] == node_id for p in partitions):
        return
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=30_000)
    try:
        admin.alter_partition_reassignments({TopicPartition(topic, p): [node_id, *others] for p in partitions})
        wait_until(
            lambda: (
                admin.elect_leaders(0, {topic: partitions}, raise_errors=False) is not None
                and all(broker.partition_state(topic, p)["leader"] == node_id for p in partitions)
            ),
            f"broker {node_id} leading {topic} {partitions}",
        )
    finally:
        admin.close()


def lead_transaction_coordinator(broker: RealBroker, node_id: int, replicas: list[int]) -> None:
    """Move the transaction coordinator (``__transaction_state``'s one partition, created by
    the first ``init_transactions``) to ``node_id``. A kafka-python producer whose coordinator's
    broker stops can wait forever in ``commit_transaction``; one that stays up answers
    NOT_COORDINATOR, which it follows."""
    lead(broker, "__transaction_state", [0], node_id, replicas)


def open_transactions(broker: RealBroker, topic: str, partition: int) -> dict[int, int]:
    """What the partition's leader (``broker`` must lead it) holds open in its producer state:
    producer id -> the open transaction's first offset (DescribeProducers, as
    ``kafka-transactions.sh describe-producers`` reads it)."""
    from kafka import TopicPartition
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=30_000)
    try:
        tp = TopicPartition(topic, partition)
        state = admin.describe_producers([tp])[tp]
        return {
            p.producer_id: p.current_transaction_start_offset
            for p in state.active_producers
            if p.current_transaction_start_offset >= 0
        }
    finally:
        admin.close()


def active_producers(broker: RealBroker, topic: str, partition: int) -> set[int]:
    """The producer ids the partition's leader (``broker``) holds in its producer state: an
    idle one leaves it after ``producer.id.expiration.ms``, and only then may a cleaner remove
    the batch holding its last data, and so its last marker (isBatchLastRecordOfProducer)."""
    from kafka import TopicPartition
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=30_000)
    try:
        tp = TopicPartition(topic, partition)
        return {p.producer_id for p in admin.describe_producers([tp])[tp].active_producers}
    finally:
        admin.close()


def coordinator_state(broker: RealBroker, transactional_id: str) -> str:
    """The transaction coordinator's state of a transactional id (DescribeTransactions)."""
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=30_000)
    try:
        return str(admin.describe_transactions([transactional_id])[transactional_id].state.value)
    finally:
        admin.close()


TRANSACTION_SETTINGS = {
    # The coordinator's log must survive broker 2's absence and the leader change.
    "transaction.state.log.replication.factor": "2",
    "transaction.state.log.num.partitions": "1",
    "transaction.state.log.min.isr": "1",
    # An idle producer leaves the leader's producer state within seconds, not a day: its last
    # batch is then no longer kept, and its marker can go (isBatchLastRecordOfProducer).
    "producer.id.expiration.ms": "2000",
    "producer.id.expiration.check.interval.ms": "500",
}
"""Broker settings of the transaction scenarios (with the tests' own)."""

ABORTED_SERVED, COMMITTED_HIDDEN, FROZEN = 0, 1, 2
"""The partitions of :class:`MarkersAway`, one per manifestation (2, 3, 4)."""


class MarkersAway:
    """Manifestations 2-4 up to the point a cleaner may remove the markers: a topic of three
    partitions on brokers 1 and 2; on each a producer's transaction both replicas take (a refund,
    an account's deletion, an order's state); broker 2 away; the transactions end on the leader
    (aborted, committed, committed and superseded); the leader's last segments rolled; the idle
    producers expired there, so that only a hold keeps their markers. Then :meth:`come_back`:
    broker 2 back fetches what the leader kept, the producers' next transactions, and broker 2,
    leading, must serve what broker 1 serves with none of the three manifestations."""

    PARTITIONS = (ABORTED_SERVED, COMMITTED_HIDDEN, FROZEN)

    def __init__(self, one: RealBroker, two: RealBroker, topic: str, configs: dict[str, str], *,
                 when_away: Callable[[], None] | None = None) -> None:
        """``when_away``: called once broker 2 is out of the ISR, before the transactions end
        (a guard that must be in place before any marker is removable)."""
        self.one, self.two, self.topic = one, two, topic
        self.producers: list = []
        partitions = list(self.PARTITIONS)
        create_topic(one, topic, {p: [1, 2] for p in partitions}, configs)
        wait_until(lambda: all(one.partition_state(topic, p) == {"leader": 1, "isr": [1, 2]} for p in partitions),
                   "both replicas in sync")  # fmt: skip
        one.produce(topic, [(COMMITTED_HIDDEN, b"account-3", b"balance:120")])
        self.aborted, self.committed, frozen = (transactional_producer(one, n) for n in ("aborted", "committed",
                                                                                         "frozen"))
        self.producers += [self.aborted, self.committed, frozen]
        lead_transaction_coordinator(one, 1, [2])
        self.first: dict[int, int] = {}
        for producer, partition, key, value in (
            (self.aborted, ABORTED_SERVED, b"payment-7", b"refund:9999"),
            (self.committed, COMMITTED_HIDDEN, b"account-3", None),
            (frozen, FROZEN, b"order-5", b"state:paid"),
        ):
            producer.begin_transaction()
            self.first[partition] = producer.send(topic, key=key, value=value, partition=partition).get(30).offset
            producer.flush(30)
        self.pid = wait_until(lambda: {p: producer_id_at(two.log_dir, topic, p, self.first[p]) for p in self.first},
                              "the transactions' data on broker 2")  # fmt: skip

        two.stop()
        wait_until(lambda: all(one.partition_state(topic, p)["isr"] == [1] for p in partitions),
                   "broker 2 out of the ISR")  # fmt: skip
        if when_away is not None:
            when_away()
        self.aborted.abort_transaction()
        self.committed.commit_transaction()
        frozen.commit_transaction()
        one.produce(topic, [(FROZEN, b"order-5", b"state:shipped")])
        self.roll(0)
        self.markers = self.markers_on(one)
        assert all(self.markers.values()), self.markers
        wait_until(lambda: not any(self.pid[p] in active_producers(one, topic, p) for p in partitions),
                   "the idle producers to expire on broker 1")  # fmt: skip

    def markers_on(self, broker: RealBroker) -> dict[int, list[str]]:
        """Per partition, the markers of the transactions' producers on the broker's disk."""
        return {p: [m for m in of_producer(broker.log_dir, self.topic, p, self.pid[p]) if m.startswith("marker")]
                for p in self.PARTITIONS}  # fmt: skip

    def roll(self, tag: int) -> None:
        """A produce to every partition after ``segment.ms`` (300 ms): what came before is in
        rolled segments, and the log is dirty again."""
        time.sleep(0.4)
        self.one.produce(self.topic, [(p, b"filler-%d" % (tag % 7), b"%d" % tag) for p in self.PARTITIONS])

    def come_back(self, *, when_back: Callable[[], None] | None = None) -> None:
        """``when_back``: called once broker 2 is back in the ISR with the markers."""
        one, two, topic, partitions = self.one, self.two, self.topic, list(self.PARTITIONS)
        two.start()
        wait_until(lambda: all(sorted(one.partition_state(topic, p)["isr"]) == [1, 2] for p in partitions),
                   "broker 2 back in the ISR")  # fmt: skip
        wait_until(lambda: self.markers_on(two) == self.markers, "the markers on broker 2")
        if when_back is not None:
            when_back()
        self.aborted.begin_transaction()
        self.aborted.send(topic, key=b"payment-8", value=b"refund:1", partition=ABORTED_SERVED)
        self.aborted.commit_transaction()
        self.committed.begin_transaction()
        self.committed.send(topic, key=b"account-4", value=b"balance:0", partition=COMMITTED_HIDDEN).get(30)
        self.committed.abort_transaction()
        one.produce(topic, [(FROZEN, b"order-6", b"state:new")])
        by_one = {p: serve(one, topic, p, "read_committed") for p in partitions}
        lead(one, topic, partitions, 2, [1])
        by_two = {p: serve(two, topic, p, "read_committed") for p in partitions}
        for p in partitions:
            assert by_two[p].end == by_one[p].end, f"partition {p}: read_committed ends elsewhere on broker 2"
            assert by_two[p].live() == by_one[p].live(), (
                f"partition {p}: {by_one[p].records} on broker 1, {by_two[p].records} on broker 2")
        assert by_two[ABORTED_SERVED].value_of(b"payment-7") == "absent", "manifestation 2 happened"
        # (the committed deletion's tombstone may still be there: broker 2 was away past its horizon)
        assert by_two[COMMITTED_HIDDEN].value_of(b"account-3") in (None, "absent"), "manifestation 3 happened"
        assert by_two[FROZEN].value_of(b"order-6") == b"state:new", "manifestation 4 happened"

    def close(self) -> None:
        for producer in self.producers:
            producer.close(timeout=5)


def diverged(in_sync: RealBroker, replica: RealBroker, topic: str, partitions: list[int]) -> tuple[int, list[dict]]:
    """``kafka-cleaner diverged`` of ``replica`` against ``in_sync`` on their live log dirs: its
    exit code and findings (manifestation, replica, offset, key as text, producer id)."""
    args = [str(CLI), "diverged", "--in-sync", str(in_sync.log_dir), "--replica", str(replica.log_dir),
            "--topic", topic, *(a for p in partitions for a in ("--partition", str(p))), "-o", "json"]
    done = subprocess.run(args, capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    findings = [{**f, "key": None if f["key"] is None else bytes.fromhex(f["key"])} for f in json.loads(done.stdout)]
    return done.returncode, findings


def operator_divergences(brokers: dict[str, RealBroker], topic: str) -> list[Divergence]:
    """What the operator's replica comparison says of ``topic``, from the replica facts each
    broker's sidecar would report (its scan of the live log dirs, read-only)."""
    policy = parse_policy_text(DEFAULT_POLICY)
    reports = {}
    for name, broker in brokers.items():
        dirs = list(dict.fromkeys([broker.log_dir, broker.metadata_dir]))
        statuses = cleaning.status(dirs, policy, SYSTEM_TIME, replicas=True, only=lambda tp: tp.topic == topic)
        reports[name] = {"replicas": replica_section(statuses, SYSTEM_TIME.milliseconds(), 1 << 20)}
    return diverging_partitions(reports)
