"""The replication race warning (issue 24, item 2) in the operator: from the sidecars' replica
facts, each replica out of the ISR or offline, the earliest time another replica's cleaner may
remove a tombstone or marker it has not replicated; the condition, the Events and the gauge."""

from __future__ import annotations

import datetime
import json
from typing import Any

from compaction_operator import metrics
from compaction_operator.divergence import MAX_RACE_RISKS, replication_race_risks
from compaction_operator.status import (
    BrokerPod,
    Outcome,
    Scrape,
    build_status,
    parse_report,
    race_risk_events,
    race_risks,
)
from operator_samples import make_policy, make_report, status_errors

from cleaner.clock import MockTime

T0 = datetime.datetime(2026, 11, 21, 10, 0, 0, tzinfo=datetime.UTC)
T0_MS = int(T0.timestamp() * 1000)
HOUR = 3_600_000
OUT_SINCE = T0_MS - 2 * HOUR


def entry(
    broker: int,
    log_end: int,
    *,
    out: list[tuple[int, bool]] = (),
    removals: list[list[int]] | None = None,
    partition: int = 0,
) -> dict[str, Any]:
    e: dict[str, Any] = {
        "topic": "orders",
        "partition": partition,
        "logStartOffset": 0,
        "logEndOffset": log_end,
        "highWatermark": log_end,
        "firstDirtyOffset": 0,
        "cleanBytes": 0,
        "dirtyBytes": 100,
        "minCleanableRatio": 0.5,
        "batches": [],
        "brokerId": broker,
    }
    if out:
        e["replication"] = {
            "leader": 1,
            "isr": [b for b in (1, 2, 3) if b not in {o for o, _ in out}],
            "outOfSync": [{"broker": b, "sinceMs": OUT_SINCE, "offline": off} for b, off in out],
        }
        e["removals"] = removals or []
    return e


def report(pod: str, *entries: dict[str, Any]) -> dict[str, Any]:
    doc = make_report(pod)
    doc["replicas"] = {"rotation": 1, "partitions": list(entries), "omitted": 0}
    scrape = parse_report(json.dumps(doc), pod)
    assert scrape.error is None, scrape.error
    assert scrape.report is not None
    return dict(scrape.report)


def lagging_cluster(*, lagging_reports: bool = True, horizon: int = T0_MS + HOUR) -> dict[str, dict[str, Any]]:
    """kafka-1 (broker 2) stopped at offset 500; the leader (broker 1) and broker 3 went on to
    900 and hold a tombstone at 600 cleaned with a horizon, and dirty ones above."""
    points = [[100, T0_MS - HOUR], [600, horizon], [880, T0_MS + 24 * HOUR]]
    reports = {
        "kafka-0": report("kafka-0", entry(1, 900, out=[(2, True)], removals=points)),
        "kafka-2": report(
            "kafka-2", entry(3, 900, out=[(2, True)], removals=[[600, horizon + 5000], [880, T0_MS + 24 * HOUR]])
        ),
    }
    if lagging_reports:
        # Its own metadata stopped with it: it still sees itself in sync.
        reports["kafka-1"] = report("kafka-1", entry(2, 500))
    return reports


def test_a_stopped_replica_is_at_risk_from_the_first_tombstone_above_its_log_end() -> None:
    risks = replication_race_risks(lagging_cluster())
    assert len(risks) == 1
    risk = risks[0]
    assert (risk.name, risk.broker, risk.pod, risk.offline, risk.since_ms) == (
        "orders-0",
        2,
        "kafka-1",
        True,
        OUT_SINCE,
    )
    # The tombstone at 100 is below its log end (it has it); the one at 600 goes first, on kafka-0.
    assert (risk.log_end_offset, risk.offset, risk.removable_at_ms, risk.holders) == (
        500,
        600,
        T0_MS + HOUR,
        ("kafka-0",),
    )
    clock = MockTime(T0_MS)
    assert risk.seconds_left(clock.milliseconds()) == 3600.0
    clock.sleep(HOUR + 60_000)
    assert risk.seconds_left(clock.milliseconds()) == -60.0  # past it: may already be gone


def test_a_replica_whose_log_end_is_unknown_is_taken_to_hold_nothing() -> None:
    risks = replication_race_risks(lagging_cluster(lagging_reports=False))
    assert [(r.pod, r.log_end_offset, r.offset, r.removable_at_ms) for r in risks] == [
        (None, None, 100, T0_MS - HOUR)
    ]  # the worst case: the earliest of all, already past


def test_no_risk_when_every_replica_is_in_sync_whatever_they_hold() -> None:
    in_sync = {
        pod: report(pod, entry(b, 900), entry(b, 10, partition=1))
        for pod, b in (("kafka-0", 1), ("kafka-1", 2), ("kafka-2", 3))
    }
    assert replication_race_risks(in_sync) == []
    # A replica out of sync that has everything above its log end offset that others hold: none either.
    caught_up = lagging_cluster()
    caught_up["kafka-1"] = report("kafka-1", entry(2, 881))
    assert replication_race_risks(caught_up) == []
    status = build(in_sync)
    condition = next(c for c in status["conditions"] if c["type"] == "ReplicationRaceRisk")
    assert (condition["status"], condition["reason"]) == ("False", "NoReplicaAtRisk")
    assert status_errors(status) == []


def build(
    reports: dict[str, dict[str, Any]], previous: dict[str, Any] | None = None, now: datetime.datetime = T0
) -> dict[str, Any]:
    pods = [BrokerPod(name, ip="10.0.0.1") for name in ("kafka-0", "kafka-1", "kafka-2")]
    scrapes = {p.name: Scrape(report=reports[p.name]) if p.name in reports else Scrape(error="no answer") for p in pods}
    return build_status(
        policy=make_policy(),
        generation=1,
        previous=previous,
        outcome=Outcome(),
        pods=pods,
        scrapes=scrapes,
        sidecar_hash=None,
        now=now,
    )


def test_the_condition_and_events_name_partition_replica_offset_and_time_left() -> None:
    reports = lagging_cluster()
    status = build(reports)
    assert status_errors(status) == []
    condition = next(c for c in status["conditions"] if c["type"] == "ReplicationRaceRisk")
    assert (condition["status"], condition["reason"]) == ("True", "ReplicationRaceRisk")
    message = condition["message"]
    assert "orders-0" in message and "broker 2 (kafka-1)" in message and "offline" in message
    assert "offset 600" in message and "2026-11-21T11:00:00Z" in message and "kafka-0" in message
    risks = race_risks({pod: Scrape(report=r) for pod, r in reports.items()})
    events = race_risk_events({}, status, risks, T0)
    assert len(events) == 1 and events[0][:2] == ("Warning", "ReplicationRaceRisk")
    assert "offset 600" in events[0][2] and "1.0h left" in events[0][2]
    # The next round, 10 minutes on, the same risk: the condition's message does not move (no
    # status write, no Event); the replica back in sync clears it, with one Normal Event.
    later = T0 + datetime.timedelta(minutes=10)
    again = build(reports, previous=status, now=later)
    assert next(c for c in again["conditions"] if c["type"] == "ReplicationRaceRisk") == condition
    assert race_risk_events(status, again, risks, later) == []
    back = {pod: report(pod, entry(b, 900)) for pod, b in (("kafka-0", 1), ("kafka-1", 2), ("kafka-2", 3))}
    cleared = build(back, previous=again, now=later)
    assert race_risk_events(again, cleared, [], later) == [
        (
            "Normal",
            "ReplicationRaceRiskCleared",
            "every replica out of sync has replicated what a cleaner may remove, or is back in the ISR",
        )
    ]


def test_the_gauge_has_a_series_per_replica_at_risk_and_drops_it_after() -> None:
    def series() -> dict[tuple[str, ...], float]:
        out = {}
        for family in metrics.REGISTRY.collect():
            if family.name == "kafka_cleaner_operator_replication_race_seconds_left":
                for s in family.samples:
                    if s.labels["policy"] == "race-test":
                        out[(s.labels["topic"], s.labels["partition"], s.labels["broker"])] = s.value
        return out

    risks = replication_race_risks(lagging_cluster())
    metrics.set_race_risks("ns", "race-test", {(r.topic, r.partition, r.broker): r.seconds_left(T0_MS) for r in risks})
    assert series() == {("orders", "0", "2"): 3600.0}
    metrics.set_race_risks("ns", "race-test", {})
    assert series() == {}
    metrics.set_race_risks("ns", "race-test", {("orders", 1, 3): 5.0})
    metrics.forget_policy("ns", "race-test")
    assert series() == {}


def test_risks_are_bounded_and_the_soonest_first() -> None:
    many = {
        "kafka-0": report(
            "kafka-0",
            *[
                entry(1, 900, out=[(2, False)], removals=[[600, T0_MS + p * 1000]], partition=p)
                for p in range(MAX_RACE_RISKS + 10)
            ],
        )
    }
    risks = replication_race_risks(many)
    assert len(risks) == MAX_RACE_RISKS
    assert [r.partition for r in risks] == list(range(MAX_RACE_RISKS))
    assert all(r.log_end_offset is None and not r.offline for r in risks)
