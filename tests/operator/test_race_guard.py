"""The race guard's decisions (``compaction_operator.race_guard``) from sidecar reports, and
what it writes to the status and sets back: which topics a report puts on hold, that a hold
round-trips through the status (a JSON merge patch cannot carry a null), and that a release
sets back exactly what the topic had, leaving what someone else changed meanwhile."""

from __future__ import annotations

from compaction_operator.race_guard import HOLD, Held, release_plan, topics_out_of_sync

RATIO, LAG = "min.cleanable.dirty.ratio", "max.compaction.lag.ms"


def _report(*entries: tuple[str, int, list[dict]]) -> dict:
    return {"replicas": {"partitions": [{"topic": t, "partition": p, "brokerId": 1, "logEndOffset": 10,
                                         "replication": {"outOfSync": out}, "removals": []}
                                        for t, p, out in entries]}}


def test_a_topic_is_held_when_any_report_has_a_replica_of_it_out_of_sync() -> None:
    out = [{"broker": 3, "sinceMs": 1, "offline": True}]
    reports = {"kafka-0": _report(("orders", 0, []), ("users", 2, [])),
               "kafka-1": _report(("orders", 1, [{"broker": 2, "sinceMs": 5, "offline": False}]), ("users", 0, out))}
    assert topics_out_of_sync(reports) == {"orders": "orders-1: replica 2 is out of the ISR",
                                           "users": "users-0: replica 3 is offline"}
    assert topics_out_of_sync({"kafka-0": _report(("orders", 0, []))}) == {}
    assert topics_out_of_sync({"kafka-0": {}}) == {}  # a report without the replicas section


def test_a_hold_round_trips_through_the_status_and_is_set_back_exactly() -> None:
    held = Held("orders", "2026-11-28T16:00:00Z", "why", {RATIO: "0.01", LAG: None})
    entry = held.to_status()
    assert entry["restore"] == {RATIO: "0.01"}  # no null: a merge patch would delete the key
    assert Held.from_status("orders", entry) == held
    assert release_plan(held, dict(HOLD)) == ({RATIO: "0.01", LAG: None}, [])  # LAG: None deletes the override

    # Someone set the ratio back while held (a GitOps tool): that key is left as they set it.
    assert release_plan(held, {RATIO: "0.5", LAG: HOLD[LAG]}) == ({LAG: None}, [RATIO])


def test_a_topic_another_guard_holds_is_shared_and_never_set_back_by_this_one() -> None:
    """Two policies over one cluster (node pools) cover the same topic: the second finds the
    hold's values already there. Were they its "restore", it would set the hold back for good
    after the first released it."""
    shared = Held("orders", "2026-11-28T16:00:00Z", "why", {}, shared=True)
    entry = shared.to_status()
    assert entry == {"since": "2026-11-28T16:00:00Z", "why": "why", "restore": {}, "shared": True}
    assert Held.from_status("orders", entry).shared
    assert release_plan(shared, dict(HOLD)) == ({}, [])
