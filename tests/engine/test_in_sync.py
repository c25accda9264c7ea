"""A broker's place in the ISRs from ``__cluster_metadata`` (issue 20, item 6): what the Paced
rollout waits for after a restart (``outOfIsr``) and before the next (``underReplicated``,
``atMinIsr``). The metadata is written as the controller appends it (``metadata_logs``)."""

from __future__ import annotations

import uuid
from pathlib import Path

from metadata_logs import (
    config_record,
    fence,
    isr_change,
    partition_record,
    register_broker,
    registration_change,
    topic_record,
    write_metadata,
)

from cleaner.in_sync import EXAMPLES, in_sync
from cleaner.storage.cluster_metadata import RESOURCE_BROKER, RESOURCE_TOPIC, read_cluster_metadata

T0 = 1_790_000_000_000
ORDERS, AUDIT = uuid.UUID(int=1), uuid.UUID(int=2)


def _cluster(tmp_path: Path, *later: tuple[int, list[bytes]]):
    """Three brokers; ``orders`` (RF 3, min.insync.replicas 2 on the topic) with partitions
    led by each broker, ``audit`` (RF 2, the cluster default of 1)."""
    return read_cluster_metadata(
        write_metadata(
            tmp_path,
            [
                (T0, [register_broker(b, fenced=False) for b in (1, 2, 3)]),
                (
                    T0,
                    [
                        topic_record("orders", ORDERS),
                        config_record(RESOURCE_TOPIC, "orders", "min.insync.replicas", "2"),
                        partition_record(0, [1, 2, 3], [1, 2, 3], 1, ORDERS),
                        partition_record(1, [2, 3, 1], [2, 3, 1], 2, ORDERS),
                        partition_record(2, [3, 1, 2], [3, 1, 2], 3, ORDERS),
                    ],
                ),
                (T0, [topic_record("audit", AUDIT), partition_record(0, [1, 2], [1, 2], 1, AUDIT)]),
                *later,
            ],
        )
    )


def test_a_cluster_in_sync_lets_any_broker_go(tmp_path: Path) -> None:
    view = in_sync(_cluster(tmp_path), 1)
    assert (view.broker_id, view.replicas) == (1, 4)
    assert view.out_of_isr == view.under_replicated == view.at_min_isr == ()
    assert view.no_spare_replica == 0
    assert view.metadata_time_ms == T0 and view.metadata_offset > 0


def test_a_stopped_broker_is_out_of_every_isr_and_the_others_may_not_go(tmp_path: Path) -> None:
    """Broker 2 stops: fenced, then out of the ISRs. It is not back; broker 1's absence would
    now leave ``orders`` below min.insync.replicas 2 and ``audit`` with no copy in sync."""
    cluster = _cluster(
        tmp_path,
        (T0 + 1_000, [fence(2)]),
        (
            T0 + 2_000,
            [
                isr_change(0, [1, 3], topic_id=ORDERS),
                isr_change(1, [3, 1], leader=3, topic_id=ORDERS),
                isr_change(2, [3, 1], topic_id=ORDERS),
                isr_change(0, [1], topic_id=AUDIT),
            ],
        ),
    )
    two = in_sync(cluster, 2)
    assert two.out_of_isr == ("audit-0", "orders-0", "orders-1", "orders-2")
    one = in_sync(cluster, 1)
    assert one.out_of_isr == ()
    assert one.under_replicated == ("audit-0", "orders-0", "orders-1", "orders-2")
    assert one.at_min_isr == ("audit-0", "orders-0", "orders-1", "orders-2")
    assert one.metadata_time_ms == T0 + 2_000
    status = one.as_status()
    assert status["atMinIsr"] == {"count": 4, "examples": ["audit-0", "orders-0", "orders-1", "orders-2"]}


def test_back_when_unfenced_and_in_every_isr_again(tmp_path: Path) -> None:
    stopped = [
        (T0 + 1_000, [fence(2)]),
        (T0 + 2_000, [isr_change(0, [1, 3], topic_id=ORDERS), isr_change(0, [1], topic_id=AUDIT)]),
    ]
    unfenced = (T0 + 3_000, [registration_change(2, -1)])
    # Unfenced but not caught up on orders-0 and audit-0: still out there.
    (tmp_path / "a").mkdir()
    view = in_sync(_cluster(tmp_path / "a", *stopped, unfenced), 2)
    assert view.out_of_isr == ("audit-0", "orders-0")
    (tmp_path / "b").mkdir()
    back = (T0 + 4_000, [isr_change(0, [1, 3, 2], topic_id=ORDERS), isr_change(0, [1, 2], topic_id=AUDIT)])
    view = in_sync(_cluster(tmp_path / "b", *stopped, unfenced, back), 2)
    assert view.out_of_isr == () and view.metadata_time_ms == T0 + 4_000


def test_min_isr_from_the_dynamic_defaults_and_topics_with_no_spare_replica(tmp_path: Path) -> None:
    """A dynamic cluster default of 2 applies to ``audit`` (RF 2): no restart keeps it at 2 in
    sync, so it is counted apart and not held against the roll; a broker default of 3 for
    broker 1 makes every ``orders`` partition RF 3 <= 3 as well (its own view)."""
    cluster = _cluster(tmp_path, (T0 + 1, [config_record(RESOURCE_BROKER, "", "min.insync.replicas", "2")]))
    one = in_sync(cluster, 1)
    assert one.no_spare_replica == 1 and one.at_min_isr == ()
    (tmp_path / "c").mkdir()
    cluster = _cluster(
        tmp_path / "c",
        (T0 + 1, [config_record(RESOURCE_BROKER, "1", "min.insync.replicas", "3")]),
        (T0 + 2, [isr_change(0, [1, 2], topic_id=ORDERS)]),
    )
    # The topic's own 2 wins over broker 1's default: orders-0 at 2 in sync is at its minimum.
    assert in_sync(cluster, 1).at_min_isr == ("orders-0",)
    assert in_sync(cluster, 1).no_spare_replica == 1  # audit: RF 2 <= broker 1's default 3


def test_the_report_names_a_few_and_counts_all(tmp_path: Path) -> None:
    many = [partition_record(p, [1, 2], [1], 1, AUDIT) for p in range(1, 12)]
    view = in_sync(_cluster(tmp_path, (T0 + 5, many)), 1)
    status = view.as_status()
    assert status["underReplicated"]["count"] == 11
    assert len(status["underReplicated"]["examples"]) == EXAMPLES


def test_a_min_isr_that_is_no_number_counts_as_unset(tmp_path: Path) -> None:
    """What a broker would refuse never gets into the metadata; should it, the view still
    stands (Kafka's default of 1) rather than the scan failing."""
    cluster = _cluster(
        tmp_path,
        (T0 + 1, [config_record(RESOURCE_TOPIC, "audit", "min.insync.replicas", "two")]),
        (T0 + 2, [isr_change(0, [1], topic_id=AUDIT)]),
    )
    assert in_sync(cluster, 1).at_min_isr == ("audit-0",)
