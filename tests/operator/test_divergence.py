"""Replicas that diverge (compaction_operator.divergence), on generated sidecar reports: what
the dirty section, replication lag and retention timing explain is not flagged; divergent
batches, far-apart log starts and a cleaner that is far behind on one broker are, in the
policy's status (validated against the CRD), its summary and a condition."""

from __future__ import annotations

import copy
import datetime
import json
from typing import Any

import jsonschema
import pytest
from compaction_operator.divergence import MAX_DIVERGING, diverging_partitions
from compaction_operator.sidecar_schema import SCHEMA
from compaction_operator.status import BrokerPod, Outcome, build_status, parse_report
from operator_samples import make_policy, make_report, status_errors

T0 = datetime.datetime(2026, 11, 21, 10, 0, 0, tzinfo=datetime.UTC)
CRC = 0x1234ABCD


def replica(*, log_start: int = 0, log_end: int = 5000, hw: int | None = 5000, first_dirty: int = 3000,
            clean: int = 300_000, dirty: int = 200_000, batches: list[list[int]] | None = None,
            topic: str = "orders", partition: int = 0, min_ratio: float = 0.5) -> dict[str, Any]:
    """One partition's replica facts as a sidecar reports them; by default the batches every
    in-sync replica with this high watermark holds (the aligned one and the last one)."""
    if batches is None:
        batches = [[4096, 4105, CRC], [hw - 10, hw - 1, CRC + hw]] if hw is not None else []
    return {"topic": topic, "partition": partition, "logStartOffset": log_start, "logEndOffset": log_end,
            "highWatermark": hw, "firstDirtyOffset": first_dirty, "cleanBytes": clean, "dirtyBytes": dirty,
            "minCleanableRatio": min_ratio, "batches": batches}


def report(pod: str, *entries: dict[str, Any]) -> dict[str, Any]:
    doc = make_report(pod)
    doc["replicas"] = {"rotation": 1, "partitions": list(entries), "omitted": 0}
    scrape = parse_report(json.dumps(doc), pod)
    assert scrape.error is None, scrape.error
    assert scrape.report is not None
    return dict(scrape.report)


def kinds(reports: dict[str, dict[str, Any]]) -> list[tuple[str, tuple[str, ...]]]:
    return [(d.kind, d.brokers) for d in diverging_partitions(reports)]


def test_in_sync_replicas_a_lagging_follower_and_a_lone_replica_do_not_diverge() -> None:
    reports = {
        "kafka-0": report("kafka-0", replica(), replica(partition=1, first_dirty=0, clean=0)),
        # A follower 20 offsets behind, its cleaner at another point: its last batch is another
        # one, its aligned one is the same; its clean section is its own business.
        "kafka-1": report("kafka-1", replica(log_end=4980, hw=4980, first_dirty=2000, clean=200_000,
                                             dirty=290_000)),
        "kafka-2": report("kafka-2", replica(), replica(partition=7, first_dirty=0, clean=0,
                                                        batches=[[1, 2, 3]])),
    }
    assert kinds(reports) == []


def test_different_batches_over_the_same_committed_offsets_diverge_and_name_the_odd_replica() -> None:
    odd = replica(batches=[[4096, 4101, 0xDEADBEEF], [4990, 4999, CRC + 5000]])
    reports = {"kafka-0": report("kafka-0", replica()), "kafka-1": report("kafka-1", replica()),
               "kafka-2": report("kafka-2", odd)}
    [found] = diverging_partitions(reports)
    assert (found.kind, found.brokers, found.name) == ("divergentBatch", ("kafka-2",), "orders-0")
    assert "at offset 4096 kafka-0 holds batch 4096-4105 crc 0x1234abcd, kafka-2 holds batch 4096-4101" in found.detail
    # Of two replicas neither is the odd one: both are named.
    assert kinds({"kafka-0": report("kafka-0", replica()), "kafka-2": report("kafka-2", odd)}) == [
        ("divergentBatch", ("kafka-0", "kafka-2"))]


def test_a_batch_above_the_other_replicas_high_watermark_is_not_compared() -> None:
    # kafka-1's last batch lies above kafka-0's high watermark: kafka-0 may still truncate it
    # away (a leader change), so a different batch there is not divergence yet.
    leader = replica(log_end=5010, hw=5010, batches=[[4096, 4105, CRC], [5000, 5009, 77]])
    follower = replica(log_end=5010, hw=5000, batches=[[4096, 4105, CRC], [4990, 4999, 5]])
    other = replica(log_end=5010, hw=5010, batches=[[4096, 4105, CRC], [5000, 5009, 78]])
    assert kinds({"kafka-0": report("kafka-0", follower), "kafka-1": report("kafka-1", leader)}) == []
    assert kinds({"kafka-0": report("kafka-0", follower), "kafka-1": report("kafka-1", leader),
                  "kafka-2": report("kafka-2", other)}) == [("divergentBatch", ("kafka-1", "kafka-2"))]
    # Without a high watermark nothing of a replica counts as committed.
    assert kinds({"kafka-0": report("kafka-0", replica(hw=None, batches=[[4096, 4105, 1]])),
                  "kafka-1": report("kafka-1", replica())}) == []


def test_log_starts_a_segment_apart_are_timing_far_apart_diverge() -> None:
    near = {"kafka-0": report("kafka-0", replica(log_start=0)), "kafka-1": report("kafka-1", replica(log_start=1000))}
    assert kinds(near) == []
    far = {"kafka-0": report("kafka-0", replica(log_start=0)), "kafka-1": report("kafka-1", replica(log_start=2000))}
    [found] = diverging_partitions(far)
    assert (found.kind, found.brokers) == ("logStartSkew", ("kafka-0", "kafka-1"))
    assert "2000 offsets apart, more than 25% of the 5000 the log holds" in found.detail


def test_a_cleaner_far_behind_on_one_broker_is_a_clean_skew_that_names_that_broker() -> None:
    working = replica(first_dirty=4000, clean=400_000, dirty=100_000)
    dead = replica(first_dirty=0, clean=0, dirty=1_900_000)
    [found] = diverging_partitions({"kafka-0": report("kafka-0", working), "kafka-1": report("kafka-1", dead)})
    assert (found.kind, found.brokers) == ("cleanSkew", ("kafka-1",))
    assert found.detail == ("kafka-1 has cleaned up to offset 0 (dirty 1.8 MiB, ratio 1.00), kafka-0 up to 4000 "
                            "(its whole log 488.3 KiB): is the log cleaner on kafka-1 dead?")
    # The same replicas the other way round name the same broker.
    assert kinds({"kafka-0": report("kafka-0", dead), "kafka-1": report("kafka-1", working)}) == [
        ("cleanSkew", ("kafka-0",))]
    # A replica whose cleaner waits for the dirty ratio (0.5) is not behind, however dirty the
    # other is not; nor one past its ratio whose dirty section is not twice the other's log.
    waiting = replica(first_dirty=2000, clean=250_000, dirty=250_000)
    assert kinds({"kafka-0": report("kafka-0", working), "kafka-1": report("kafka-1", waiting)}) == []
    due = replica(first_dirty=2000, clean=200_000, dirty=900_000)
    assert kinds({"kafka-0": report("kafka-0", working), "kafka-1": report("kafka-1", due)}) == []
    # A topic with min.cleanable.dirty.ratio 0.9: a replica at 0.8 is waiting, not dead.
    patient = replica(first_dirty=0, clean=300_000, dirty=1_200_000, min_ratio=0.9)
    assert kinds({"kafka-0": report("kafka-0", replica(first_dirty=4000, clean=200_000, dirty=50_000,
                                                       min_ratio=0.9)),
                  "kafka-1": report("kafka-1", patient)}) == []
    # Dirtier but not behind in offsets: the other has not cleaned what this one has not.
    assert kinds({"kafka-0": report("kafka-0", replica(first_dirty=0, clean=10, dirty=100_000)),
                  "kafka-1": report("kafka-1", replica(first_dirty=0, clean=1000, dirty=10))}) == []


def round_(reports: dict[str, dict[str, Any]] | None, previous: dict[str, Any] | None = None) -> dict[str, Any]:
    scrapes = None
    if reports is not None:
        scrapes = {pod: parse_report(json.dumps(doc), pod) for pod, doc in reports.items()}
    status = build_status(policy=make_policy(), generation=3, previous=previous, outcome=Outcome(),
                          pods=[BrokerPod(p, ip="10.0.0.1") for p in ("kafka-0", "kafka-1")],
                          scrapes=scrapes, sidecar_hash=None, now=T0)
    assert status_errors(status) == []
    return status


def condition(status: dict[str, Any]) -> dict[str, Any]:
    [found] = [c for c in status["conditions"] if c["type"] == "ReplicasDiverge"]
    return found


def test_the_policy_status_lists_them_counts_them_and_says_so_in_a_condition() -> None:
    agree = round_({"kafka-0": report("kafka-0", replica()), "kafka-1": report("kafka-1", replica())})
    assert agree["divergingPartitions"] == [] and agree["summary"]["divergingPartitions"] == 0
    assert (condition(agree)["status"], condition(agree)["reason"]) == ("False", "ReplicasAgree")

    odd = replica(batches=[[4096, 4101, 9]])
    status = round_({"kafka-0": report("kafka-0", replica(), replica(partition=1)),
                     "kafka-1": report("kafka-1", odd, replica(partition=1, first_dirty=0, clean=0, dirty=9 << 20))},
                    previous=agree)
    assert [(d["topic"], d["partition"], d["kind"], d["brokers"]) for d in status["divergingPartitions"]] == [
        ("orders", 0, "divergentBatch", ["kafka-0", "kafka-1"]), ("orders", 1, "cleanSkew", ["kafka-1"])]
    assert status["summary"]["divergingPartitions"] == 2
    diverge = condition(status)
    assert (diverge["status"], diverge["reason"]) == ("True", "ReplicasDiverge")
    assert diverge["message"].startswith("orders-0 divergentBatch on kafka-0, kafka-1: at offset 4096 ")
    assert diverge["message"].endswith("divergent history) (and 1 more partition)")
    # Divergence is Kafka's data, not the operator's health: Ready stays as it was.
    assert [c["status"] for c in status["conditions"] if c["type"] == "Ready"] == ["True"]

    # A round without a pull keeps the last comparison.
    kept = round_(None, previous=status)
    assert kept["divergingPartitions"] == status["divergingPartitions"]
    assert kept["summary"]["divergingPartitions"] == 2


def test_the_list_is_bounded_and_the_count_is_not() -> None:
    many = [replica(partition=p) for p in range(MAX_DIVERGING * 3)]
    odd = [replica(partition=p, batches=[[4096, 4105, 1]]) for p in range(MAX_DIVERGING * 3)]
    status = round_({"kafka-0": report("kafka-0", *many), "kafka-1": report("kafka-1", *odd)})
    assert len(status["divergingPartitions"]) == MAX_DIVERGING
    assert status["summary"]["divergingPartitions"] == MAX_DIVERGING * 3


def test_an_operator_without_the_replicas_field_still_accepts_the_report() -> None:
    """Version 1 gains ``replicas`` as an optional field: the schema of an operator from
    before it (the same schema without the field) accepts a report that carries it."""
    older = copy.deepcopy(SCHEMA)
    del older["properties"]["replicas"]
    jsonschema.Draft202012Validator(older).validate(report("kafka-0", replica()))


@pytest.mark.parametrize("bad", [
    {"batches": [[1, 2]]},
    {"batches": [[1, 2, 2**32]]},
    {"highWatermark": "5000"},
])
def test_a_malformed_replicas_section_is_an_invalid_report(bad: dict[str, Any]) -> None:
    doc = make_report("kafka-0")
    doc["replicas"] = {"rotation": 1, "partitions": [{**replica(), **bad}], "omitted": 0}
    scrape = parse_report(json.dumps(doc), "kafka-0")
    assert scrape.error is not None and "replicas/partitions/0" in scrape.error


def _open(entry: dict[str, Any], producer: int, first: int) -> dict[str, Any]:
    return {**entry, "openTransaction": {"producerId": producer, "firstOffset": first}}


def test_a_transaction_open_on_one_replica_that_another_cleaned_past_is_a_stale_lso_on_that_one() -> None:
    """Manifestation 4: kafka-1 holds producer 7's transaction open from offset 1200, below its
    high watermark; kafka-0 has cleaned up to 3000 (only below its own last stable offset: the
    transaction ended there) and kafka-1 has fetched past kafka-0's high watermark."""
    reports = {"kafka-0": report("kafka-0", replica()),
               "kafka-1": report("kafka-1", _open(replica(first_dirty=1000), 7, 1200))}
    [found] = diverging_partitions(reports)
    assert (found.kind, found.brokers) == ("staleLso", ("kafka-1",))
    assert "producer 7's transaction open on kafka-1 from offset 1200" in found.detail


@pytest.mark.parametrize("why", ["open on both", "not cleaned past", "lagging", "below the log start",
                                 "unknown high watermark"])
def test_an_open_transaction_the_other_replica_explains_is_not_a_stale_lso(why: str) -> None:
    stuck = _open(replica(first_dirty=1000), 7, 1200)
    other = replica()
    if why == "open on both":  # an ongoing (or hanging, on every replica) transaction
        other = _open(replica(first_dirty=1200), 7, 1200)
    elif why == "not cleaned past":
        other = replica(first_dirty=1200)
    elif why == "lagging":  # it has not fetched as far as the marker may be
        stuck = _open(replica(log_end=4000, hw=4000, first_dirty=1000), 7, 1200)
    elif why == "below the log start":  # retention removed it there
        other = replica(log_start=2000)
    else:
        other = replica(hw=None)
    found = kinds({"kafka-0": report("kafka-0", other), "kafka-1": report("kafka-1", stuck)})
    assert [kind for kind, _ in found if kind == "staleLso"] == []
