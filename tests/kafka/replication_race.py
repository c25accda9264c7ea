"""What the compaction–replication race tests need beyond ``kafka_broker``: a transactional
producer and a transaction coordinator that stays up, a consumer that reads one partition at a
chosen isolation level record by record (offsets matter: the manifestations are about which
offsets a replica serves), and read-only looks at one broker: the batches of one producer on
its disk (a marker the leader's cleaner removed, or emptied to a header-only batch, is one a
lagging replica never learns), its aborted-transaction index, and the transactions its
producer state holds open (DescribeProducers).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from kafka_broker import RealBroker, wait_until

from cleaner.storage.index import AbortedTxn, TransactionIndex
from cleaner.storage.segment import iter_file_batches


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
