"""The policy status from the sidecars' reports (compaction_operator.status): aggregation,
conditions, staleness, bounds; every status built is validated against the CRD's schema."""

from __future__ import annotations

import datetime
import json
import pathlib
from collections.abc import Callable
from typing import Any

import pytest
from compaction_operator.sidecar_schema import SCHEMA
from compaction_operator.status import (
    STALE_AFTER,
    BrokerPod,
    Outcome,
    Scrape,
    build_status,
    meaningful_change,
    parse_report,
    status_patch,
    upsert_condition,
)
from operator_samples import REPO, REPORT, make_policy, make_report

T0 = datetime.datetime(2026, 11, 21, 10, 0, 0, tzinfo=datetime.UTC)
HASH = "0123456789abcdef"
Validate = Callable[[dict[str, Any]], None]


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def pods(*names: str, **kwargs: Any) -> list[BrokerPod]:
    return [BrokerPod(name, ip="10.0.0.1", sidecar_hash=HASH, **kwargs) for name in names]


def ok(pod: str, **changes: Any) -> Scrape:
    scrape = parse_report(json.dumps(make_report(pod, **changes)), pod)
    assert scrape.error is None, scrape.error
    return scrape


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    found = [c for c in status["conditions"] if c["type"] == type_]
    assert len(found) == 1
    return found[0]


def round_(previous: dict[str, Any] | None, scrapes: dict[str, Scrape] | None, *, now: datetime.datetime = T0,
           names: tuple[str, ...] = ("kafka-0", "kafka-1", "kafka-2"), outcome: Outcome | None = None,
           generation: int = 3, policy: Any = None, pod_list: list[BrokerPod] | None = None) -> dict[str, Any]:
    return build_status(policy=policy or make_policy(generation=generation), generation=generation,
                        previous=previous, outcome=outcome or Outcome(),
                        pods=pod_list if pod_list is not None else pods(*names), scrapes=scrapes,
                        sidecar_hash=HASH, now=now)


# -------------------------------------------------------------------------------------------
# The report contract
# -------------------------------------------------------------------------------------------


def test_the_docs_schema_is_the_one_the_operator_uses() -> None:
    docs = json.loads((REPO / "docs" / "sidecar-status-v1.schema.json").read_text())
    assert docs == SCHEMA


@pytest.mark.parametrize(("raw", "error"), [
    (b"not json", "not JSON"),
    (json.dumps({**make_report(), "version": 2}), "version 2"),
    (json.dumps({k: v for k, v in make_report().items() if k != "cleaner"}), "'cleaner' is a required property"),
    (json.dumps(make_report(cleaner__state="sleeping")), "cleaner/state"),
    (json.dumps(make_report(cleaner__maxDirtyRatio=1.5)), "cleaner/maxDirtyRatio"),
    (json.dumps(make_report(scannedAt="yesterday")), "bad timestamp"),
    (json.dumps(make_report(scannedAt="2026-11-21T10:00:00")), "without a time zone"),
    (json.dumps([1, 2]), "<document>"),
])
def test_invalid_reports_are_rejected_with_a_reason(raw: str | bytes, error: str) -> None:
    scrape = parse_report(raw, "kafka-0")
    assert scrape.report is None and scrape.error is not None and error in scrape.error, scrape.error


def test_a_report_may_carry_fields_added_later_in_version_1() -> None:
    assert parse_report(json.dumps({**make_report(), "future": {"x": 1}}), "kafka-0").error is None


# -------------------------------------------------------------------------------------------
# Aggregation
# -------------------------------------------------------------------------------------------


def test_all_brokers_reporting_is_ready(validate_status: Validate) -> None:
    scrapes = {"kafka-0": ok("kafka-0"), "kafka-1": ok("kafka-1", cleaner__maxDirtyRatio=0.9),
               "kafka-2": ok("kafka-2", cleaner__stagedBytes=7)}
    status = round_(None, scrapes)
    validate_status(status)
    assert status["observedGeneration"] == 3 and status["paused"] is False
    summary = status["summary"]
    assert summary["brokers"] == "3/3" and summary["brokersReporting"] == summary["brokersExpected"] == 3
    assert summary["maxDirtyRatio"] == 0.9
    assert summary["uncleanablePartitions"] == 3
    assert summary["cleanableBytes"] == 3 * 420
    assert summary["stagedBytes"] == 50 + 50 + 7
    assert summary["reportedAt"] == "2026-11-21T10:00:00Z"
    broker = status["brokers"]["kafka-0"]
    assert broker == {"reportedAt": "2026-11-21T10:00:00Z", "mode": "observe", "state": "observing",
                      "partitions": 120, "uncleanablePartitions": 1, "maxDirtyRatio": 0.62,
                      "maxCompactionDelaySeconds": 12.5, "cleanableBytes": 420, "stagedBytes": 50,
                      "bytesReclaimedTotal": 1000, "deadThreads": 0, "missedReports": 0,
                      "openTransactions": 0, "nextCleanFreedBytes": 0, "deletionDeadlineBreaches": 0,
                      "scannedAt": "2026-11-21T10:00:00Z", "policyGeneration": 3, "lastRunAt": None,
                      "message": "orders-3: corrupt batch at offset 17"}
    assert [(p["broker"], p["topic"], p["partition"]) for p in status["topPartitions"][:3]] == [
        ("kafka-0", "__consumer_offsets", 7), ("kafka-1", "__consumer_offsets", 7),
        ("kafka-2", "__consumer_offsets", 7)]
    assert status["topPartitions"][0]["lastCleanedAt"] == "2026-11-21T09:00:00Z"  # normalised to UTC, Z
    ready = condition(status, "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "AllBrokersReporting")
    assert ready["message"] == "3/3 brokers reporting; max dirty ratio 0.90"
    assert ready["observedGeneration"] == 3
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Ready": "True", "Reconciling": "False", "Stalled": "False", "Degraded": "False", "ReplicasDiverge": "False",
        "ReplicationRaceRisk": "False"}
    assert [c["type"] for c in status["conditions"]] == ["Ready", "Reconciling", "Stalled", "Degraded",
                                                         "ReplicasDiverge", "ReplicationRaceRisk"]


def test_top_partitions_are_the_top_n_over_all_brokers() -> None:
    policy = make_policy(reporting={"topPartitions": 5})
    scrapes = {f"kafka-{i}": ok(f"kafka-{i}", partitions=30) for i in range(3)}
    status = round_(None, scrapes, policy=policy)
    ratios = [p["cleanableRatio"] for p in status["topPartitions"]]
    assert len(ratios) == 5 and ratios == sorted(ratios, reverse=True)
    assert ratios[0] == max(p["cleanableRatio"] for s in scrapes.values() for p in s.report["partitions"])


def test_a_broker_that_misses_three_rounds_makes_the_policy_degraded(validate_status: Validate) -> None:
    status = round_(None, {n: ok(n) for n in ("kafka-0", "kafka-1", "kafka-2")})
    top_of_kafka_2 = [p for p in status["topPartitions"] if p["broker"] == "kafka-2"]
    for rounds in range(1, STALE_AFTER + 1):
        scrapes = {"kafka-0": ok("kafka-0"), "kafka-1": ok("kafka-1"),
                   "kafka-2": Scrape(error="GET http://10.0.0.1:9410/status: connection refused")}
        status = round_(status, scrapes, now=at(30 * rounds))
        validate_status(status)
        entry = status["brokers"]["kafka-2"]
        assert entry["missedReports"] == rounds and entry["state"] == "unreachable"
        assert entry["reportedAt"] == "2026-11-21T10:00:00Z"  # the last good report's time is kept
        assert "connection refused" in entry["message"]
        degraded = condition(status, "Degraded")
        if rounds < STALE_AFTER:
            assert degraded["status"] == "False"
            assert condition(status, "Ready")["status"] == "True"
            # Its last partitions stay in the top list until it turns stale.
            assert [p for p in status["topPartitions"] if p["broker"] == "kafka-2"] == top_of_kafka_2
            assert status["summary"]["brokers"] == "3/3"
    assert degraded["status"] == "True" and degraded["reason"] == "BrokersNotReporting"
    assert degraded["message"].startswith("broker kafka-2 has not reported for 3 intervals (90s)")
    assert "connection refused" in degraded["message"]
    ready = condition(status, "Ready")
    assert ready["status"] == "False" and "kafka-2" in ready["message"]
    assert condition(status, "Reconciling")["status"] == "False"
    assert status["summary"]["brokers"] == "2/3"
    assert not [p for p in status["topPartitions"] if p["broker"] == "kafka-2"]
    transition = degraded["lastTransitionTime"]
    assert transition == "2026-11-21T10:01:30Z"

    # Still silent: the condition stays, its transition time too.
    status = round_(status, {"kafka-0": ok("kafka-0"), "kafka-1": ok("kafka-1"), "kafka-2": Scrape(error="x")},
                    now=at(120))
    assert condition(status, "Degraded")["lastTransitionTime"] == transition
    # It answers again: Ready at once.
    status = round_(status, {n: ok(n) for n in ("kafka-0", "kafka-1", "kafka-2")}, now=at(150))
    assert condition(status, "Degraded")["status"] == "False"
    assert condition(status, "Ready")["status"] == "True"
    assert status["brokers"]["kafka-2"]["missedReports"] == 0 and "state" in status["brokers"]["kafka-2"]


def test_a_pod_that_never_answered_is_awaited_then_degraded(validate_status: Validate) -> None:
    status = None
    for rounds in range(1, STALE_AFTER + 1):
        status = round_(status, {"kafka-0": Scrape(error="pod kafka-0 has no IP address yet")},
                        names=("kafka-0",), now=at(rounds))
        validate_status(status)
        if rounds < STALE_AFTER:
            assert condition(status, "Reconciling")["reason"] == "AwaitingReports"
            assert condition(status, "Ready")["status"] == "False"
    assert condition(status, "Degraded")["status"] == "True"
    assert "kafka-0" in condition(status, "Degraded")["message"]
    assert status["brokers"]["kafka-0"] == {"missedReports": 3, "state": "unreachable",
                                            "message": "pod kafka-0 has no IP address yet"}


def test_pods_without_the_sidecar_or_with_an_old_one_are_awaited() -> None:
    pod_list = [BrokerPod("kafka-0", ip="10.0.0.1", has_sidecar=False),
                BrokerPod("kafka-1", ip="10.0.0.2", sidecar_hash=HASH)]
    # Manual (the default): the roll is a person's or the Kafka operator's, not in progress here.
    status = round_(None, {"kafka-1": ok("kafka-1")}, pod_list=pod_list)
    reconciling = condition(status, "Reconciling")
    assert (reconciling["status"], reconciling["reason"]) == ("False", "AwaitingManualRollout")
    assert reconciling["message"].startswith("kafka-0 does not run the sidecar yet")
    assert (condition(status, "Ready")["status"], condition(status, "Ready")["reason"]) == (
        "False", "AwaitingManualRollout")
    # Paced: the operator rolls them itself, so it is reconciling.
    paced = round_(None, {"kafka-1": ok("kafka-1")}, pod_list=pod_list,
                   policy=make_policy(rollout={"strategy": "Paced"}))
    assert (condition(paced, "Reconciling")["status"], condition(paced, "Reconciling")["reason"]) == (
        "True", "AwaitingRollout")
    assert status["summary"]["brokers"] == "1/2" and "kafka-0" not in status["brokers"]

    pod_list = [BrokerPod("kafka-0", ip="10.0.0.1", sidecar_hash="old"), BrokerPod("kafka-1", sidecar_hash=HASH)]
    status = round_(None, {"kafka-0": ok("kafka-0"), "kafka-1": ok("kafka-1")}, pod_list=pod_list)
    assert condition(status, "Reconciling")["message"].startswith("kafka-0 runs an outdated sidecar")


def test_brokers_running_an_older_policy_are_awaited() -> None:
    status = round_(None, {"kafka-0": ok("kafka-0", policyGeneration=2)}, names=("kafka-0",), generation=3)
    reconciling = condition(status, "Reconciling")
    assert (reconciling["status"], reconciling["reason"]) == ("True", "AwaitingPolicy")
    assert "generation 3" in reconciling["message"]
    status = round_(status, {"kafka-0": ok("kafka-0", policyGeneration=3)}, names=("kafka-0",), generation=3)
    assert condition(status, "Ready")["status"] == "True"


def test_a_sidecar_without_a_policy_or_a_scan_keeps_the_policy_not_ready(validate_status: Validate) -> None:
    """The sidecar answers /status as soon as it listens: before it has read the policy file
    (``policyGeneration: null``) and before its first scan ends (``scannedAt: null``, no
    partitions). Neither is a report of the current policy: Ready waits (the broker pod's
    readiness does not, see test_injection)."""
    no_policy = ok("kafka-0", policyGeneration=None, scannedAt=None, partitions=0, topics=[], logDirs=[],
                   errors=[{"at": "2026-11-21T09:59:00Z", "logDir": None, "partition": None,
                            "message": "policy: /etc/kafka-cleaner/policy.yaml: No such file or directory"}])
    status = round_(None, {"kafka-0": no_policy}, names=("kafka-0",), generation=3)
    validate_status(status)
    reconciling = condition(status, "Reconciling")
    assert (reconciling["status"], reconciling["reason"]) == ("True", "AwaitingPolicy")
    assert condition(status, "Ready")["status"] == "False"
    assert "policyGeneration" not in status["brokers"]["kafka-0"]
    assert status["brokers"]["kafka-0"]["message"].startswith("policy: ")

    scanning = ok("kafka-0", scannedAt=None, partitions=0, topics=[], logDirs=[])
    status = round_(status, {"kafka-0": scanning}, names=("kafka-0",), generation=3)
    validate_status(status)
    ready = condition(status, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "AwaitingReports")
    assert ready["message"] == "waiting for the first scan of kafka-0"
    assert condition(status, "Reconciling")["status"] == "True"

    status = round_(status, {"kafka-0": ok("kafka-0")}, names=("kafka-0",), generation=3)
    assert condition(status, "Ready")["status"] == "True"
    assert condition(status, "Reconciling")["status"] == "False"


def test_dead_threads_make_the_policy_degraded() -> None:
    status = round_(None, {"kafka-0": ok("kafka-0", cleaner__deadThreads=1)}, names=("kafka-0",))
    degraded = condition(status, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "SidecarErrors")
    assert "kafka-0: 1 dead cleaner thread(s)" in degraded["message"]


def test_paused_reports_truthfully_and_says_so(validate_status: Validate) -> None:
    scrapes = {"kafka-0": ok("kafka-0", policyGeneration=2)}
    status = round_(None, scrapes, names=("kafka-0",), outcome=Outcome.paused(), generation=3)
    validate_status(status)
    assert status["paused"] is True and status["observedGeneration"] == 3
    reconciling = condition(status, "Reconciling")
    assert (reconciling["status"], reconciling["reason"]) == ("False", "Paused")
    ready = condition(status, "Ready")  # the older generation is expected while paused
    assert ready["status"] == "True" and ready["message"].endswith("(paused)")


def test_stalled_advances_observed_generation(validate_status: Validate) -> None:
    outcome = Outcome.stalled("InvalidSpec", "spec.topics[0].match: is not a valid Python regular expression")
    status = build_status(policy=None, generation=5, previous=None, outcome=outcome, pods=None, scrapes=None,
                          sidecar_hash=None, now=T0)
    validate_status(status)
    assert status["observedGeneration"] == 5
    stalled = condition(status, "Stalled")
    assert (stalled["status"], stalled["reason"], stalled["observedGeneration"]) == ("True", "InvalidSpec", 5)
    assert condition(status, "Ready")["status"] == "False"
    assert condition(status, "Reconciling")["status"] == "False"


def test_stalled_keeps_what_the_brokers_last_reported() -> None:
    before = round_(None, {"kafka-0": ok("kafka-0")}, names=("kafka-0",))
    outcome = Outcome.stalled("TargetNotFound", "StatefulSet kafka not found")
    status = build_status(policy=make_policy(), generation=4, previous=before, outcome=outcome, pods=None,
                          scrapes=None, sidecar_hash=None, now=at(5))
    assert status["brokers"] == before["brokers"] and status["summary"]["brokersExpected"] == 1


def test_no_target_is_ready() -> None:
    status = build_status(policy=make_policy(target=None), generation=1, previous=None, outcome=Outcome(),
                          pods=[], scrapes={}, sidecar_hash=None, now=T0)
    ready = condition(status, "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "NoTarget")
    assert status["summary"]["brokers"] == "0/0"


def test_pods_that_left_are_dropped_and_the_patch_deletes_them() -> None:
    before = round_(None, {n: ok(n) for n in ("kafka-0", "kafka-1")}, names=("kafka-0", "kafka-1"))
    after = round_(before, {"kafka-0": ok("kafka-0")}, names=("kafka-0",), now=at(30))
    assert set(after["brokers"]) == {"kafka-0"}
    patch = status_patch({**before, "kopf": {"progress": {}}}, after)
    assert patch is not None
    assert patch["status"]["brokers"]["kafka-1"] is None
    assert "kopf" not in patch["status"]
    assert status_patch(after, after) is None


def test_the_patch_removes_fields_a_broker_entry_lost() -> None:
    before = round_(None, {"kafka-0": ok("kafka-0")}, names=("kafka-0",))
    after = round_(before, {"kafka-0": Scrape(error="x")}, names=("kafka-0",), now=at(30))
    after = round_(after, {"kafka-0": ok("kafka-0", errors=[])}, names=("kafka-0",), now=at(60))
    patch = status_patch(before, after)
    assert patch is not None and patch["status"]["brokers"]["kafka-0"]["message"] is None


# -------------------------------------------------------------------------------------------
# Conditions
# -------------------------------------------------------------------------------------------


def test_conditions_are_upserted_by_type() -> None:
    conditions = upsert_condition([], "Ready", True, "A", "a", 1, T0)
    assert conditions == [{"type": "Ready", "status": "True", "reason": "A", "message": "a",
                           "observedGeneration": 1, "lastTransitionTime": "2026-11-21T10:00:00Z"}]
    # Same status, new reason/message/generation: updated in place, transition time kept.
    conditions = upsert_condition(conditions, "Ready", True, "B", "b", 2, at(60))
    assert conditions == [{"type": "Ready", "status": "True", "reason": "B", "message": "b",
                           "observedGeneration": 2, "lastTransitionTime": "2026-11-21T10:00:00Z"}]
    # A flip moves the transition time.
    conditions = upsert_condition(conditions, "Ready", False, "C", "c", 2, at(120))
    assert conditions[0]["lastTransitionTime"] == "2026-11-21T10:02:00Z"
    # Other types are kept, in a fixed order; duplicates written by someone else disappear.
    messy = [*conditions, {"type": "Custom", "status": "True", "reason": "X", "message": "",
                           "lastTransitionTime": "2026-01-01T00:00:00Z"}, dict(conditions[0])]
    tidy = upsert_condition(messy, "Degraded", False, "Reconciled", "", 2, at(180))
    assert [c["type"] for c in tidy] == ["Ready", "Degraded", "Custom"]


def test_long_messages_are_cut_to_the_schema_bound() -> None:
    conditions = upsert_condition([], "Ready", False, "A", "x" * 40000, 1, T0)
    assert len(conditions[0]["message"]) == 32768


# -------------------------------------------------------------------------------------------
# Bounds
# -------------------------------------------------------------------------------------------


def test_the_status_of_100_brokers_stays_under_256_kib(validate_status: Validate, tmp_path: pathlib.Path) -> None:
    names = tuple(f"kafka-cluster-with-a-long-name-broker-{i}" for i in range(100))
    long_error = [{"at": "2026-11-21T09:59:00Z", "logDir": "/var/lib/kafka/data-0/kafka-log" + "x" * 200,
                   "partition": "t" * 249 + "-1", "message": "m" * 3000}] * 20
    policy = make_policy(reporting={"topPartitions": 200})
    scrapes = {n: ok(n, partitions=300, errors=long_error) for n in names}
    status = round_(None, scrapes, names=names, policy=policy)
    validate_status(status)
    size = len(json.dumps(status, separators=(",", ":")))
    assert len(status["topPartitions"]) == 200 and len(status["brokers"]) == 100
    assert size < 256 * 1024, size
    # Also after all of them went silent long enough to be named in the conditions.
    for rounds in range(STALE_AFTER):
        status = round_(status, dict.fromkeys(names, Scrape(error="e" * 5000)), names=names, policy=policy,
                        now=at(rounds))
    validate_status(status)
    assert len(json.dumps(status, separators=(",", ":"))) < 256 * 1024
    assert "and 90 more" in condition(status, "Degraded")["message"]


def test_at_most_1000_brokers() -> None:
    names = tuple(f"b-{i:04d}" for i in range(1100))
    status = round_(None, {}, names=names)
    assert len(status["brokers"]) == 1000


# -------------------------------------------------------------------------------------------
# Churn: the status is written when it changes meaningfully, and on a heartbeat
# -------------------------------------------------------------------------------------------


def _size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")))


def test_50_brokers_whose_reports_only_move_in_time_write_nothing(validate_status: Validate) -> None:
    """50 brokers x 200 top partitions: the status is some 70 KiB. Two more rounds in which
    only the reports' and scans' times moved (and the byte counts by a little) write nothing
    (each used to patch some 70 KiB); a real change (one broker's dead thread) patches that
    broker and the conditions, about 1 KiB; the heartbeat writes everything after
    HEARTBEAT_SECONDS."""
    from compaction_operator.status import HEARTBEAT_SECONDS, meaningful_change, status_to_write

    names = tuple(f"kafka-{i}" for i in range(50))
    policy = make_policy(reporting={"topPartitions": 200})

    def reports(moment: float, jitter: int = 0, **changes: Any) -> dict[str, Scrape]:
        stamp = at(moment).strftime("%Y-%m-%dT%H:%M:%SZ")
        out = {}
        for n in names:
            report = make_report(n, partitions=200, scannedAt=stamp)
            for p in report["partitions"]:
                p["cleanableBytes"] += jitter  # a busy topic's few new records
            report["logDirs"][0]["freeBytes"] -= jitter
            for key, value in (changes.get(n) or {}).items():
                report["cleaner"][key] = value
            scrape = parse_report(json.dumps(report), n)
            assert scrape.error is None, scrape.error
            out[n] = scrape
        return out

    written = round_(None, reports(0), names=names, policy=policy)
    validate_status(written)
    full = _size(written)
    assert 60 * 1024 < full < 120 * 1024 and len(written["topPartitions"]) == 200, full
    naive_patches = []
    for moment in (30, 60):
        new = round_(written, reports(moment, jitter=moment), names=names, policy=policy, now=at(moment))
        naive_patches.append(_size(status_patch(written, new)))  # what every round used to write
        assert meaningful_change(written, new) is None
        assert status_to_write(written, new, at(moment)) is None
    assert min(naive_patches) > 10 * 1024, naive_patches

    # A real change: kafka-7's cleaner thread died.
    dead = {"kafka-7": {"deadThreads": 1, "state": "error"}}
    new = round_(written, reports(90, jitter=90, **dead), names=names, policy=policy, now=at(90))
    assert meaningful_change(written, new) in ("conditions", "brokers.kafka-7")
    to_write = status_to_write(written, new, at(90))
    assert to_write is not None
    validate_status(to_write)
    patch = status_patch(written, to_write)
    assert patch is not None and set(patch["status"]) == {"brokers", "conditions"}, sorted(patch["status"])
    assert set(patch["status"]["brokers"]) == {"kafka-7"}
    assert _size(patch) < 2048, _size(patch)
    print(f"\nstatus {full} B; patches of the old rounds {naive_patches} B; a real change's patch {_size(patch)} B")
    assert condition(to_write, "Degraded")["reason"] == "SidecarErrors"
    assert to_write["brokers"]["kafka-7"]["deadThreads"] == 1 and to_write["brokers"]["kafka-7"]["state"] == "error"
    written = to_write

    # Nothing meaningful for a while: the heartbeat writes everything once HEARTBEAT_SECONDS passed.
    quiet = round_(written, reports(120, **dead), names=names, policy=policy, now=at(120))
    assert status_to_write(written, quiet, at(120)) is None
    late = HEARTBEAT_SECONDS
    beat = round_(written, reports(late, **dead), names=names, policy=policy, now=at(late))
    assert meaningful_change(written, beat) is None and status_to_write(written, beat, at(late)) is beat
    assert beat["summary"]["reportedAt"] == at(late).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.parametrize(("change", "meaningful"), [
    ({"cleaner__maxDirtyRatio": 0.64}, False),
    ({"cleaner__maxDirtyRatio": 0.70}, True),
    ({"cleaner__stagedBytes": 54}, False),
    ({"cleaner__stagedBytes": 80}, True),
    ({"cleaner__stagedBytes": 0}, True),
    ({"cleaner__state": "cleaning"}, True),
    ({"policyGeneration": 2}, True),
    ({"logDirs": [{"path": "/d", "partitions": 121, "lockHeldByBroker": True, "freeBytes": 1,
                   "uncleanablePartitions": 1}]}, True),
    ({"scannedAt": "2026-11-21T11:00:00Z", "cleaner__lastRunAt": "2026-11-21T11:00:00Z"}, False),
])
def test_what_is_a_meaningful_change(change: dict[str, Any], meaningful: bool) -> None:
    from compaction_operator.status import meaningful_change

    before = round_(None, {n: ok(n) for n in ("kafka-0", "kafka-1", "kafka-2")})
    after = round_(before, {"kafka-0": ok("kafka-0", **change), "kafka-1": ok("kafka-1"), "kafka-2": ok("kafka-2")},
                   now=at(30))
    assert (meaningful_change(before, after) is not None) is meaningful, meaningful_change(before, after)


def test_a_broker_that_stays_silent_is_written_until_it_is_stale() -> None:
    from compaction_operator.status import status_to_write

    names = ("kafka-0", "kafka-1", "kafka-2")
    written = round_(None, {n: ok(n) for n in names})
    writes = 0
    for r in range(1, 8):  # 210 s: no heartbeat yet
        new = round_(written, {"kafka-0": ok("kafka-0"), "kafka-1": ok("kafka-1"), "kafka-2": Scrape(error="down")},
                     now=at(30 * r))
        to_write = status_to_write(written, new, at(30 * r))
        if to_write is not None:
            writes += 1
            written = to_write
    assert writes == STALE_AFTER and written["brokers"]["kafka-2"]["missedReports"] == STALE_AFTER
    assert condition(written, "Degraded")["reason"] == "BrokersNotReporting"


def test_overlapping_policies_degrade_the_policy() -> None:
    message = "CompactionPolicies other also select pods kafka-0: a pod gets the sidecar of one policy only"
    status = build_status(policy=make_policy(), generation=3, previous=None, outcome=Outcome(),
                          pods=pods("kafka-0"), scrapes={"kafka-0": ok("kafka-0")}, sidecar_hash=HASH, now=T0,
                          overlap=message)
    degraded = condition(status, "Degraded")
    assert (degraded["status"], degraded["reason"], degraded["message"]) == ("True", "OverlappingPolicies", message)
    assert condition(status, "Ready")["reason"] == "OverlappingPolicies"


def test_a_divergence_starting_or_moving_is_news_and_its_detail_alone_is_not() -> None:
    from compaction_operator.status import meaningful_change, status_to_write

    before = round_(None, {n: ok(n) for n in ("kafka-0", "kafka-1")})
    entry = {"topic": "orders", "partition": 3, "kind": "divergentBatch", "brokers": ["kafka-1"],
             "detail": "batch [1200, 1299] crc 1 on kafka-0, 2 on kafka-1"}
    diverged = {**before, "divergingPartitions": [entry]}
    assert meaningful_change(before, diverged) == "divergingPartitions"
    moved = {**diverged, "divergingPartitions": [{**entry, "detail": "batch [1300, 1399] crc 3 on kafka-0, 4"}]}
    assert meaningful_change(diverged, moved) is None
    elsewhere = {**diverged, "divergingPartitions": [{**entry, "brokers": ["kafka-0"]}]}
    assert meaningful_change(diverged, elsewhere) == "divergingPartitions"
    # A write for another reason keeps the written detail: no churn from it.
    other = {**moved, "paused": True}
    assert status_to_write(diverged, other, at(30))["divergingPartitions"] == [entry]


def test_who_holds_the_lso_and_what_the_next_clean_meets_reach_the_cr_status(validate_status: Validate) -> None:
    """Issue 14's insight where a kubectl user looks: each top partition names the open
    transaction pinning its LSO (since when, not an age that would move every round) and what
    its next clean frees; each broker and the summary count the open transactions, the oldest's
    start, the bytes the next cleans free and the most passes Kafka's cleaner would need."""
    started = 1_763_700_000_000  # 2025-11-21T04:40:00Z
    holder = {"producerId": 4711, "producerEpoch": 3, "firstOffset": 1200, "startTimestampMs": started,
              "ageSeconds": 90_000.0}
    next_clean = {"dirtyRecords": 900, "dirtyDistinctKeys": 800, "bytesFreed": 5_000, "kafkaPasses": 2,
                  "passes": 1, "onePassDedupeBufferSize": 300_000_000}
    pinned = {**REPORT["partitions"][0], "lsoHolder": holder, "nextClean": next_clean}
    topics = [{**REPORT["topics"][0], "nextCleanFreedBytes": 5_000, "kafkaPasses": 2,
               "onePassDedupeBufferSize": 300_000_000, "deletionDeadlineBreaches": 2},
              {**REPORT["topics"][1], "nextCleanFreedBytes": 700, "kafkaPasses": 1,
               "onePassDedupeBufferSize": 1_000_000}]
    def kafka_0(first: dict[str, Any]) -> Scrape:
        report = make_report("kafka-0", topics=topics)
        report["partitions"] = [first, REPORT["partitions"][1]]
        scrape = parse_report(json.dumps(report), "kafka-0")
        assert scrape.error is None, scrape.error
        return scrape

    scrapes = {"kafka-0": kafka_0(pinned),
               "kafka-1": ok("kafka-1"), "kafka-2": ok("kafka-2")}
    status = round_(None, scrapes)
    validate_status(status)  # the CRD's status schema keeps every field (none pruned)
    [top] = [p for p in status["topPartitions"] if p["broker"] == "kafka-0" and p["partition"] == 7]
    assert top["openTransaction"] == {"producerId": 4711, "producerEpoch": 3, "firstOffset": 1200,
                                      "since": "2025-11-21T04:40:00Z"}
    assert (top["nextCleanFreedBytes"], top["kafkaPasses"]) == (5_000, 2)
    broker = status["brokers"]["kafka-0"]
    assert (broker["openTransactions"], broker["oldestOpenTransactionSince"]) == (1, "2025-11-21T04:40:00Z")
    assert (broker["nextCleanFreedBytes"], broker["maxKafkaPasses"]) == (5_700, 2)
    summary = status["summary"]
    assert summary["openTransactions"] == 1 and summary["oldestOpenTransactionSince"] == "2025-11-21T04:40:00Z"
    assert (summary["maxKafkaPasses"], summary["onePassDedupeBufferSize"]) == (2, 300_000_000)
    assert summary["nextCleanFreedBytes"] == 5_700
    # Issue 25: the partitions past their deletion deadline, per broker and over the cluster.
    assert broker["deletionDeadlineBreaches"] == 2 and summary["deletionDeadlineBreaches"] == 2
    # The holder's age moving is no news; another transaction pinning it is.
    older = {**holder, "ageSeconds": 90_030.0}
    later = round_(status, {**scrapes, "kafka-0": kafka_0({**pinned, "lsoHolder": older})}, now=at(30))
    assert meaningful_change(status, later) is None
    other = round_(status, {**scrapes, "kafka-0": kafka_0({**pinned, "lsoHolder": {**holder, "producerId": 4712}})},
                   now=at(30))
    assert meaningful_change(status, other) == "topPartitions"
