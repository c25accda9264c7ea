"""The deletion deadline in the sidecar (issue 25.2 and 25.3): ``/status`` and metrics carry it,
and stage and compact mode clean a partition about to breach before the dirtiest ones."""

from __future__ import annotations

from pathlib import Path

import pytest
from broker_lock import BrokerLock
from prometheus_client import generate_latest
from sidecar_helpers import (
    ALWAYS,
    NOW_MS,
    SimBroker,
    finish_pass,
    new_sidecar,
    next_scan,
    partition_entry,
    topic_entry,
    write_policy,
)

from cleaner.clock import MockTime
from cleaner.sidecar import stage

GENERATED = {"topics": 2, "partitions": 1, "records": 2_000, "keys": 300}


def test_status_and_metrics_carry_the_deadline(tmp_path: Path, make_log_dir) -> None:
    data = make_log_dir(**GENERATED)
    policy = write_policy(
        tmp_path / "policy.yaml",
        topics=[
            {"match": "topic-0", "cleanupPolicy": "compact", "deletionDeadlineMs": 1_000},
            {"match": "topic-1", "cleanupPolicy": "compact"},
        ],
    )
    sc = new_sidecar(policy, [data], MockTime(NOW_MS))
    doc = next_scan(sc)  # validated against docs/sidecar-status-v1.schema.json
    breached = partition_entry(doc, "topic-0-0")
    assert breached is not None and breached["deletion"]["breached"] is True
    assert breached["deletion"]["deadlineSeconds"] == 1.0
    assert breached["deletion"]["heldBackBy"] in ("activeSegment", "dirtyRatio", "cleaner", "minCompactionLag")
    assert breached["deletion"]["oldestSupersededAgeSeconds"] > 1.0
    free = partition_entry(doc, "topic-1-0")
    # No deadline, no read: next to a busy broker every active segment changes between scans,
    # and reading every compacted partition whole each interval is what a deadline asks for.
    assert free is not None and free.get("deletion") is None
    assert topic_entry(doc, "topic-0")["deletionDeadlineBreaches"] == 1
    assert topic_entry(doc, "topic-1")["deletionDeadlineBreaches"] == 0
    text = generate_latest(sc.metrics.registry).decode()
    cause = breached["deletion"]["heldBackBy"]
    series = f'{{held_back_by="{cause}",partition="0",topic="topic-0"}} 1.0'
    assert f"kafka_cleaner_partition_deletion_deadline_breached{series}" in text
    assert 'kafka_cleaner_partition_deletion_deadline_seconds{partition="0",topic="topic-0"} 1.0' in text
    assert 'kafka_cleaner_partition_oldest_superseded_age_seconds{partition="0",topic="topic-0"}' in text
    assert 'topic="topic-1"' not in text.split("kafka_cleaner_partition_deletion_deadline_seconds")[1].split("#")[0]
    assert "kafka_cleaner_deletion_deadline_breached_partitions 1.0" in text


def test_the_deletion_facts_are_not_read_again_on_every_scan(tmp_path: Path, make_log_dir) -> None:
    data = make_log_dir(**GENERATED)
    policy = write_policy(
        tmp_path / "policy.yaml",
        topics=[{"match": "topic-.*", "cleanupPolicy": "compact", "maxCompactionLagMs": 3_600_000}],
        reporting={"deletionIntervalSeconds": 600},
    )
    sc = new_sidecar(policy, [data], MockTime(NOW_MS))
    next_scan(sc)
    assert sc._deletion is not None
    read = sc._deletion.bytes_read
    assert read > 0
    for _ in range(5):
        next_scan(sc)
    assert sc._deletion.bytes_read == read  # nothing changed: no partition read again


@pytest.mark.parametrize("ratio", [0.5, 1.0])
def test_stage_mode_cleans_the_partition_about_to_breach_first(tmp_path: Path, make_log_dir, ratio: float) -> None:
    """Both partitions are never cleaned (dirty ratio 1.0); topic-1 would come second in the
    dirtiest-first order (0.5: a tie), or never (1.0: its minCleanableDirtyRatio is not
    exceeded), but its deadline is breached: it is staged first."""
    data = make_log_dir(**GENERATED)
    policy = write_policy(
        tmp_path / "policy.yaml",
        mode="stage",
        topics=[
            {"match": "topic-0", "cleanupPolicy": "compact"},
            {"match": "topic-1", "cleanupPolicy": "compact", "deletionDeadlineMs": 1_000,
             "minCleanableDirtyRatio": ratio},
        ],
    )  # fmt: skip
    lock = BrokerLock(data).acquire()
    broker = SimBroker(data, seed=5)
    try:
        sc = new_sidecar(policy, [data], MockTime(NOW_MS))
        next_scan(sc)  # the gate, then the first scan: what the next step ranks by
        staged: list[str] = []
        for _ in range(3):
            next_scan(sc)
            for pdir in sorted(p for p in data.iterdir() if p.is_dir()):
                if stage.load(pdir) is not None and pdir.name not in staged:
                    staged.append(pdir.name)
        assert staged[:1] == ["topic-1-0"], staged
    finally:
        broker.close()
        lock.release()


@pytest.mark.parametrize("ratio", [0.5, 1.0])
def test_compact_mode_cleans_the_partition_about_to_breach_first(
    tmp_path: Path, make_log_dir, caplog: pytest.LogCaptureFixture, ratio: float
) -> None:
    """The same in compact mode: the pass the sidecar runs once the broker is down takes
    topic-1 first (its deadline breached, the scan while the broker ran said so), and takes it
    at all with a ratio of 1.0. Old code: Kafka's order only (1.0: topic-1 never cleaned)."""
    data = make_log_dir(**GENERATED)
    policy = write_policy(
        tmp_path / "policy.yaml",
        mode="compact",
        compact=ALWAYS,
        topics=[
            {"match": "topic-0", "cleanupPolicy": "compact"},
            {"match": "topic-1", "cleanupPolicy": "compact", "deletionDeadlineMs": 1_000,
             "minCleanableDirtyRatio": ratio},
        ],
    )  # fmt: skip
    lock = BrokerLock(data).acquire()
    sc = new_sidecar(policy, [data], MockTime(NOW_MS))
    try:
        doc = next_scan(sc)  # the broker runs: the sidecar scans and waits
        assert doc["cleaner"]["state"] == "waitingForBroker"
        assert partition_entry(doc, "topic-1-0")["deletion"]["breached"] is True
    finally:
        lock.release()
    with caplog.at_level("INFO", logger="cleaner.engine.cleaner"):
        next_scan(sc)  # the broker is down: a pass
        finish_pass(sc)
    began = [r.getMessage().rsplit(" ", 1)[-1] for r in caplog.records if "Beginning cleaning of log" in r.getMessage()]
    assert began[:1] == ["topic-1-0"], began
