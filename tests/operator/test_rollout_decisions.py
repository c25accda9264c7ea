"""The rollout's pure decisions (operator/rollout.py): holding and releasing a StatefulSet,
which pods wait, which are stuck, the order of a paced roll, and how a person rolls a pod."""

from __future__ import annotations

import datetime
import json
from typing import Any

import jsonpatch
from compaction_operator.handlers import Operator, _gate
from compaction_operator.injection import SIDECAR_CONTAINER, SIDECAR_HASH_ANNOTATION
from compaction_operator.rollout import (
    STRIMZI_MANUAL_ROLLING_UPDATE,
    UPDATE_STRATEGY_ANNOTATION,
    Step,
    Workload,
    claim_ops,
    controller_caught_up,
    drain,
    expected_pod_names,
    failing,
    hold_ops,
    how_to_roll,
    isr_wait_before,
    next_to_roll,
    pending,
    pod_view,
    rehold_ops,
    release_ops,
    release_rolls_nothing,
    rollback_gate,
    step_for,
    stuck,
)
from compaction_operator.status import BrokerPod, Outcome, Scrape, build_status, parse_report
from operator_samples import make_policy, make_report

from cleaner.config import RolloutStrategy

NOW = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)


def sts(strategy: dict[str, Any] | None = None, replicas: int = 3) -> dict[str, Any]:
    spec: dict[str, Any] = {"replicas": replicas, "template": {}}
    if strategy is not None:
        spec["updateStrategy"] = strategy
    return {"metadata": {"name": "kafka", "resourceVersion": "7"}, "spec": spec}


def pod(name: str, *, hash_: str | None = "new", ready: bool = True, age: float = 5.0,
        why: dict[str, Any] | None = None) -> dict[str, Any]:
    created = (NOW - datetime.timedelta(seconds=age)).strftime("%Y-%m-%dT%H:%M:%SZ")
    spec: dict[str, Any] = {"containers": [{"name": "kafka"}]}
    annotations = {}
    if hash_ is not None:
        spec["initContainers"] = [{"name": SIDECAR_CONTAINER}]
        annotations[SIDECAR_HASH_ANNOTATION] = hash_
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    if why is not None:
        conditions.append(why)
    return {"metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": created,
                         "annotations": annotations},
            "spec": spec, "status": {"conditions": conditions}}


def test_manual_holds_a_rolling_update_with_the_partition_and_release_restores_it() -> None:
    original = sts({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}})
    held = jsonpatch.apply_patch(original, hold_ops(original, RolloutStrategy.MANUAL))
    assert held["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxUnavailable": 1, "partition": 3}}
    saved = json.loads(held["metadata"]["annotations"][UPDATE_STRATEGY_ANNOTATION])
    assert saved == original["spec"]["updateStrategy"]
    # A second change while held keeps the first saved strategy.
    again = jsonpatch.apply_patch(held, hold_ops(held, RolloutStrategy.MANUAL))
    assert again["metadata"]["annotations"][UPDATE_STRATEGY_ANNOTATION] == held["metadata"]["annotations"][
        UPDATE_STRATEGY_ANNOTATION]
    released = jsonpatch.apply_patch(again, release_ops(again))
    assert released["spec"]["updateStrategy"] == original["spec"]["updateStrategy"]
    assert UPDATE_STRATEGY_ANNOTATION not in released["metadata"]["annotations"]
    assert release_ops(released) is None


def test_paced_and_ondelete_hold_with_ondelete_and_an_ondelete_statefulset_is_left_alone() -> None:
    for strategy in (RolloutStrategy.PACED, RolloutStrategy.ON_DELETE):
        held = jsonpatch.apply_patch(sts(), hold_ops(sts(), strategy))
        assert held["spec"]["updateStrategy"] == {"type": "OnDelete"}
        back = jsonpatch.apply_patch(held, release_ops(held))
        assert "updateStrategy" not in back["spec"] or back["spec"]["updateStrategy"]["rollingUpdate"] == {
            "partition": 0}
    assert hold_ops(sts({"type": "OnDelete"}), RolloutStrategy.MANUAL) == []


def test_a_changed_strategy_changes_the_hold() -> None:
    original = sts({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}})
    manual = jsonpatch.apply_patch(original, hold_ops(original, RolloutStrategy.MANUAL))
    assert rehold_ops(manual, RolloutStrategy.MANUAL) is None
    paced = jsonpatch.apply_patch(manual, rehold_ops(manual, RolloutStrategy.PACED))
    assert paced["spec"]["updateStrategy"] == {"type": "OnDelete"}
    back = jsonpatch.apply_patch(paced, rehold_ops(paced, RolloutStrategy.MANUAL))
    assert back["spec"]["updateStrategy"] == manual["spec"]["updateStrategy"]
    assert rehold_ops(original, RolloutStrategy.PACED) is None  # not held: nothing to change
    assert jsonpatch.apply_patch(paced, release_ops(paced))["spec"]["updateStrategy"] == original["spec"][
        "updateStrategy"]


def test_pending_stuck_and_order() -> None:
    views = [pod_view(p) for p in (
        pod("kafka-0", hash_=None), pod("kafka-1", hash_="old"), pod("kafka-2"),
        pod("kafka-10", ready=False, age=700, why={"type": "PodScheduled", "status": "False",
                                                   "reason": "Unschedulable", "message": "Insufficient cpu"}))]
    assert [v.name for v in pending(views, "new")] == ["kafka-0", "kafka-1"]
    assert [v.name for v in pending(views, None)] == ["kafka-1", "kafka-2", "kafka-10"]
    step = Step("new", NOW - datetime.timedelta(seconds=1000))
    [bad] = stuck(views, step, NOW, 600)
    assert bad.name == "kafka-10" and bad.why == "Unschedulable: Insufficient cpu"
    assert stuck(views, step, NOW, 800) == [] and stuck(views, None, NOW, 1) == []
    # Not Ready because of the broker's own container: never the sidecar's fault.
    broker_down = pod("kafka-3", ready=False, age=700)
    broker_down["status"]["containerStatuses"] = [{"name": "kafka", "state": {"waiting": {
        "reason": "CrashLoopBackOff"}}}]
    assert stuck([pod_view(broker_down)], step, NOW, 600) == []
    assert failing([pod_view(broker_down)], step) == []
    pull = pod("kafka-4", ready=False, age=700)
    pull["status"]["initContainerStatuses"] = [{"name": SIDECAR_CONTAINER, "state": {"waiting": {
        "reason": "ImagePullBackOff"}}}]
    assert [v.why for v in stuck([pod_view(pull)], step, NOW, 600)] == [
        f"container {SIDECAR_CONTAINER}: ImagePullBackOff"]
    assert next_to_roll(views).name == "kafka-10"  # by ordinal, not by name


def test_expected_pods_and_how_to_roll() -> None:
    workload = Workload("StatefulSet", "kafka", "brokers")
    assert expected_pod_names(workload, sts(replicas=2)) == ["kafka-0", "kafka-1"]
    assert expected_pod_names(workload, {"spec": {"replicas": 2, "ordinals": {"start": 3}}}) == ["kafka-3", "kafka-4"]
    held = jsonpatch.apply_patch(sts(), hold_ops(sts(), RolloutStrategy.MANUAL))
    assert held["spec"]["updateStrategy"]["rollingUpdate"]["partition"] == 3
    assert how_to_roll(workload, "kafka-2", held) == (
        "kubectl patch statefulset -n brokers kafka --type merge -p "
        "'{\"spec\":{\"updateStrategy\":{\"rollingUpdate\":{\"partition\":2}}}}'")
    # Never a partition that takes more than one broker down: kafka-0's own patch (partition 0)
    # would roll kafka-0, kafka-1 and kafka-2 at once.
    assert how_to_roll(workload, "kafka-0", held) == (
        "roll kafka-2 first, one ordinal at a time from the highest: a partition of 0 now would roll 3 brokers at once")
    lowered = jsonpatch.apply_patch(held, [{"op": "replace", "path": "/spec/updateStrategy/rollingUpdate/partition",
                                            "value": 1}])
    assert "\"partition\":0" in how_to_roll(workload, "kafka-0", lowered)  # the last one: rolls kafka-0 alone
    assert how_to_roll(workload, "kafka-2", lowered) == (
        "the StatefulSet controller rolls it (partition 1 is at or below its ordinal)")
    assert how_to_roll(workload, "kafka-2", sts({"type": "OnDelete"})) == "kubectl delete pod -n brokers kafka-2"
    strimzi = Workload("StrimziPodSet", "my-cluster-kafka", "kafka")
    assert expected_pod_names(strimzi, {"spec": {"pods": [{"metadata": {"name": "my-cluster-kafka-0"}}]}}) == [
        "my-cluster-kafka-0"]
    assert how_to_roll(strimzi, "my-cluster-kafka-0", None) == (
        f"kubectl annotate pod -n kafka my-cluster-kafka-0 {STRIMZI_MANUAL_ROLLING_UPDATE}=true")


def test_a_missing_broker_is_named_from_the_workload_replicas() -> None:
    status = build_status(policy=make_policy(), generation=3, previous=None, outcome=Outcome(),
                          pods=[BrokerPod("kafka-0", sidecar_hash="h")], scrapes=None, sidecar_hash="h",
                          now=NOW, expected_pods=["kafka-0", "kafka-1"])
    assert status["summary"]["brokersExpected"] == 2
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "BrokersMissing" and "kafka-1" in ready["message"]


def test_a_paced_step_is_done_only_when_the_rolled_broker_is_back_whole() -> None:
    rolling = {"pod": "kafka-2", "uid": "old", "since": "2026-01-01T11:59:00Z", "partitionsBefore": 120}
    back = pod_view(pod("kafka-2"))
    report = make_report("kafka-2")  # 120 partitions in its log dir, scanned
    assert Operator._rolled(back, rolling, "new", {"kafka-2": Scrape(report=report)}) == (True, "")
    assert Operator._rolled(pod_view({**pod("kafka-2"), "metadata": {**pod("kafka-2")["metadata"], "uid": "old"}}),
                            rolling, "new", {})[1] == "waiting for kafka-2 to be recreated"
    assert "not Ready" in Operator._rolled(pod_view(pod("kafka-2", ready=False)), rolling, "new", {})[1]
    fewer = make_report("kafka-2")
    fewer["logDirs"][0]["partitions"] = 119
    done, why = Operator._rolled(back, rolling, "new", {"kafka-2": Scrape(report=fewer)})
    assert not done and "reports 119 partitions in its log dirs, 120 before its restart" in why
    unscanned = {**report, "scannedAt": None}
    assert not Operator._rolled(back, rolling, "new", {"kafka-2": Scrape(report=unscanned)})[0]
    assert not Operator._rolled(back, rolling, "new", {"kafka-2": Scrape(error="refused")})[0]
    # Removing the sidecar: back without it and Ready is enough (no report to wait for).
    assert Operator._rolled(pod_view(pod("kafka-2", hash_=None)), rolling, None, None) == (True, "")

    views = [pod_view(pod(f"kafka-{i}")) for i in range(3)]
    assert _gate(views, ["kafka-0", "kafka-1", "kafka-2"], {}) is None
    assert _gate(views, ["kafka-0", "kafka-1", "kafka-2", "kafka-3"], {}) == "waiting: kafka-3 missing"
    assert _gate([*views[:2], pod_view(pod("kafka-2", ready=False))], None, {}) == "waiting: kafka-2 not Ready"
    assert _gate(views, None, {"kafka-1": Scrape(error="timeout")}) == "waiting: no report from kafka-1 (timeout)"


def test_a_pod_is_rolled_only_once_the_statefulset_controller_saw_the_template() -> None:
    """A pod deleted before the controller observed the new template comes back from the old
    one and would be rolled twice; ``kubectl rollout status`` checks the same first."""
    sts = {"metadata": {"generation": 7}, "status": {"observedGeneration": 6}}
    assert not controller_caught_up(sts)
    assert controller_caught_up({**sts, "status": {"observedGeneration": 7}})
    assert not controller_caught_up({"metadata": {"generation": 1}})  # no status yet


def crashing(name: str, *, age: float, hash_: str = "new", uid: str | None = None) -> dict[str, Any]:
    """A pod whose kafka-cleaner container crash-loops (not Ready)."""
    raw = pod(name, hash_=hash_, ready=False, age=age)
    raw["status"]["initContainerStatuses"] = [{"name": SIDECAR_CONTAINER, "state": {"waiting": {
        "reason": "CrashLoopBackOff"}}}]
    if uid is not None:
        raw["metadata"]["uid"] = uid
    return raw


def test_only_a_pod_of_the_step_that_never_became_ready_is_stuck() -> None:
    """Issue 20 item 1: long-running brokers whose sidecar starts crash-looping (an OOM after a
    ConfigMap-only edit) were all taken for stuck pods and deleted at once. Only a pod created
    by the step in progress and never Ready since is stuck; the others are failing (reported)."""
    began = NOW - datetime.timedelta(seconds=3600)
    step = Step("new", began)
    # Created before the step began (the sidecar they run was rolled out by an earlier step of
    # the same hash, e.g. before an operator upgrade): not the step's.
    old = [pod_view(crashing(f"kafka-{i}", age=7200)) for i in range(3)]
    assert stuck(old, step, NOW, 600) == []
    assert [v.name for v in failing(old, step)] == ["kafka-0", "kafka-1", "kafka-2"]
    # Created by the step, and seen Ready since: broke later; failing, not stuck.
    rolled = [pod_view(crashing(f"kafka-{i}", age=1800)) for i in range(3)]
    seen = step.seen([pod_view(pod(f"kafka-{i}", age=1800)) for i in range(3)])
    assert seen.ready == {"uid-kafka-0", "uid-kafka-1", "uid-kafka-2"}
    assert stuck(rolled, seen, NOW, 600) == []
    assert len(failing(rolled, seen)) == 3
    # Created by the step and never Ready: stuck once past the deadline (never "failing").
    assert [v.name for v in stuck(rolled, step, NOW, 600)] == ["kafka-0", "kafka-1", "kafka-2"]
    assert failing(rolled, step) == []
    assert stuck(rolled, step, NOW, 3600) == []  # within the deadline: in progress
    # Another sidecar (an older hash): never this step's.
    assert stuck([pod_view(crashing("kafka-5", age=1800, hash_="older"))], step, NOW, 600) == []
    # A pod created in the step's second counts (creation times have whole seconds).
    same_second = Step("new", NOW - datetime.timedelta(seconds=5) + datetime.timedelta(milliseconds=700))
    assert [v.name for v in stuck([pod_view(crashing("kafka-6", age=5))], same_second, NOW, 1)] == ["kafka-6"]
    # Uids of pods that are gone are forgotten; a recreated pod (new uid) is new again.
    assert seen.seen([pod_view(pod("kafka-0", age=1800))]).ready == {"uid-kafka-0"}
    again = pod_view(crashing("kafka-1", age=900, uid="uid-kafka-1-again"))
    assert stuck([again], seen, NOW, 600) == [again]


def test_the_step_follows_the_wanted_sidecar_and_survives_the_status() -> None:
    first = step_for(None, "new", None, NOW)
    assert first == Step("new", NOW)
    assert step_for(first, "new", None, NOW + datetime.timedelta(hours=1)) is first
    later = NOW + datetime.timedelta(hours=1)
    # A change of the wanted sidecar starts a new step where the last one began: only that
    # change can have put the new hash in a pod, and the webhook injects it from its index
    # before the operator's round sees the change (a pod recreated in between is the step's).
    assert step_for(first, "newer", None, later) == Step("newer", NOW)
    # Rolled back: the rolled-back sidecar's step stays, to undo its pods.
    assert step_for(first, None, "new", later) is first
    assert step_for(first, None, None, later) is None
    seen = first.seen([pod_view(pod("kafka-0", age=-1))])
    assert Step.from_status(json.loads(json.dumps(seen.to_status()))) == seen
    assert Step.from_status(None) is None and Step.from_status({"sidecarHash": "x"}) is None


def test_the_rollback_deletes_one_pod_at_a_time_behind_the_paced_gate() -> None:
    step = Step("bad", NOW - datetime.timedelta(seconds=60))
    b1, b2 = pod_view(crashing("kafka-1", age=30, hash_="bad")), pod_view(crashing("kafka-2", age=30, hash_="bad"))
    healthy = pod_view(pod("kafka-0", hash_=None))
    expected = ["kafka-0", "kafka-1", "kafka-2"]
    undo = stuck([healthy, b1, b2], step, NOW, 0.0)
    held = {"metadata": {"generation": 4}, "status": {"observedGeneration": 4},
            "spec": {"updateStrategy": {"type": "OnDelete"}, "podManagementPolicy": "Parallel"}}

    def gate(pods: list[Any], candidates: list[Any], sts: Any = held, template: bool = True) -> str | None:
        return rollback_gate(pods, expected, candidates, sts, template=template)[1]

    # Both stuck pods are down already: the first may go; Parallel: the highest ordinal first.
    assert rollback_gate([healthy, b1, b2], expected, undo, held, template=True) == (b2, None)
    # Another broker not Ready for a reason of its own: wait.
    sick = pod_view(pod("kafka-0", hash_=None, ready=False))
    assert gate([sick, b1, b2], undo) == "waiting: kafka-0 not Ready"
    # The last deletion is not back yet: wait (never two at once).
    assert gate([healthy, b1], [b1]) == "waiting: kafka-2 missing"
    gone = pod_view({**crashing("kafka-2", age=30, hash_="bad"),
                     "metadata": {**crashing("kafka-2", age=30)["metadata"], "deletionTimestamp": "x"}})
    assert gate([healthy, b1, gone], [b1]) == "waiting: kafka-2 being deleted"
    back = pod_view(pod("kafka-2", hash_=None, ready=False, age=1))
    assert gate([healthy, b1, back], [b1]) == "waiting: kafka-2 not Ready"
    # The StatefulSet controller must have seen the template without the sidecar.
    behind = {**held, "status": {"observedGeneration": 3}}
    assert "has not observed" in gate([healthy, b1, b2], undo, behind)
    # A Manual partition above the pod's ordinal would bring it back from the current revision.
    partition = {**held, "spec": {"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 3}}}}
    assert "current revision" in gate([healthy, b1, b2], undo, partition)
    # The webhook's pods (no template of ours): only the pods decide.
    assert gate([healthy, b1, b2], undo, held, template=False) is None


def test_under_ordered_ready_the_lowest_stuck_pod_goes_first_and_the_missing_above_it_wait() -> None:
    """The StatefulSet controller's default (OrderedReady) creates no pod above one that is not
    Ready: a person deleted kafka-1 and kafka-2, kafka-1 came back stuck and kafka-2 is never
    recreated until kafka-1 is Ready. Waiting for kafka-2 would wait forever."""
    ordered = {"metadata": {"generation": 4}, "status": {"observedGeneration": 4},
               "spec": {"updateStrategy": {"type": "OnDelete"}}}
    b1 = pod_view(crashing("kafka-1", age=30, hash_="bad"))
    healthy = pod_view(pod("kafka-0", hash_=None))
    expected = ["kafka-0", "kafka-1", "kafka-2"]
    assert rollback_gate([healthy, b1], expected, [b1], ordered, template=True) == (b1, None)
    b2 = pod_view(crashing("kafka-2", age=30, hash_="bad"))
    assert rollback_gate([healthy, b1, b2], expected, [b1, b2], ordered, template=True) == (b1, None)
    # A missing pod below the pick is another matter: wait for it.
    assert rollback_gate([b1, b2], expected, [b1, b2], ordered, template=True)[1] == "waiting: kafka-0 missing"


def test_a_rollback_holds_ondelete_whatever_the_strategy() -> None:
    """Under a Manual partition a deleted pod comes back from the current revision (with the
    sidecar when an earlier rollout completed): the rollback's hold is OnDelete."""
    manual = jsonpatch.apply_patch(sts(), hold_ops(sts(), RolloutStrategy.MANUAL))
    rollback = jsonpatch.apply_patch(manual, hold_ops(manual, RolloutStrategy.ON_DELETE))
    assert rollback["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert rollback["metadata"]["annotations"] == manual["metadata"]["annotations"]  # the original, once
    assert rehold_ops(rollback, RolloutStrategy.ON_DELETE) is None
    back = jsonpatch.apply_patch(rollback, rehold_ops(rollback, RolloutStrategy.MANUAL))
    assert back["spec"]["updateStrategy"] == manual["spec"]["updateStrategy"]


def test_a_failing_sidecar_makes_the_policy_degraded_naming_the_pods() -> None:
    status = build_status(policy=make_policy(), generation=3, previous=None, outcome=Outcome(),
                          pods=[BrokerPod(f"kafka-{i}", sidecar_hash="h") for i in range(3)], scrapes=None,
                          sidecar_hash="h", now=NOW, sidecar_failing=[(f"kafka-{i}", "CrashLoopBackOff")
                                                                      for i in range(3)])
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "SidecarFailing")
    assert "kafka-0, kafka-1, kafka-2" in degraded["message"] and "CrashLoopBackOff" in degraded["message"]
    assert "nothing is rolled back or deleted" in degraded["message"]


def test_a_person_s_roll_under_the_manual_hold_is_not_undone() -> None:
    """Manual: the person rolls by lowering the partition (the command in pendingPods). The
    hold must not raise it again while pods wait (the old rehold did, every round: with a
    reporting interval shorter than a broker's restart only the first broker rolled)."""
    manual = jsonpatch.apply_patch(sts(), hold_ops(sts(), RolloutStrategy.MANUAL))
    lowered = jsonpatch.apply_patch(manual, [{"op": "replace", "path": "/spec/updateStrategy/rollingUpdate/partition",
                                              "value": 1}])
    assert rehold_ops(lowered, RolloutStrategy.MANUAL) is None
    assert rehold_ops(lowered, RolloutStrategy.PACED) is not None  # another kind of hold: changed


# -- holds that name their policy, and the StatefulSets a policy no longer targets (issue 20 item 5)


HELD_BY = "kafkacleaner.io/held-by"


def _revision(raw: dict[str, Any], revision: str, *, policy: str | None = "p") -> dict[str, Any]:
    raw["metadata"]["labels"] = {"controller-revision-hash": revision}
    if policy is not None and raw["spec"].get("initContainers"):
        raw["metadata"]["annotations"]["kafkacleaner.io/policy"] = policy
    return raw


def _caught_up(obj: dict[str, Any], update: str = "kafka-new") -> dict[str, Any]:
    obj["metadata"]["generation"] = 2
    obj["status"] = {"observedGeneration": 2, "updateRevision": update}
    return obj


def test_a_hold_names_its_policy_a_takeover_renames_it_and_the_release_removes_it() -> None:
    original = sts({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}})
    held = jsonpatch.apply_patch(original, hold_ops(original, RolloutStrategy.PACED, held_by="ns/a"))
    assert held["metadata"]["annotations"][HELD_BY] == "ns/a"
    # Another policy takes the StatefulSet over: the hold (OnDelete already) is its from now on.
    taken = jsonpatch.apply_patch(held, hold_ops(held, RolloutStrategy.PACED, held_by="ns/b"))
    assert taken["metadata"]["annotations"][HELD_BY] == "ns/b"
    assert taken["metadata"]["annotations"][UPDATE_STRATEGY_ANNOTATION] == held["metadata"]["annotations"][
        UPDATE_STRATEGY_ANNOTATION]
    # a's release of it fails its test (the hold is b's); b's goes through.
    try:
        jsonpatch.apply_patch(taken, release_ops(taken, held_by="ns/a"))
    except jsonpatch.JsonPatchTestFailed:
        pass
    else:
        raise AssertionError("a released b's hold")
    back = jsonpatch.apply_patch(taken, release_ops(taken, held_by="ns/b"))
    assert back["spec"]["updateStrategy"] == original["spec"]["updateStrategy"]
    assert back["metadata"]["annotations"] == {}
    # An older release's hold gets the name of the policy whose sidecar is in the template.
    old = jsonpatch.apply_patch(original, hold_ops(original, RolloutStrategy.MANUAL))
    assert HELD_BY not in old["metadata"]["annotations"]
    claimed = jsonpatch.apply_patch(old, claim_ops(old, "ns/a"))
    assert claimed["metadata"]["annotations"][HELD_BY] == "ns/a" and claim_ops(claimed, "ns/a") is None
    assert claim_ops(original, "ns/a") is None


def test_a_former_target_is_released_once_no_pod_runs_the_sidecar_or_where_releasing_rolls_nothing() -> None:
    work = Workload("StatefulSet", "kafka", "ns")
    original = sts({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}, replicas=2)
    held = _caught_up(jsonpatch.apply_patch(original, hold_ops(original, RolloutStrategy.MANUAL, held_by="ns/p")))
    running = [pod_view(_revision(pod("kafka-0", hash_=None), "kafka-new")),
               pod_view(_revision(pod("kafka-1", hash_="h"), "kafka-old"))]
    step = drain(work, held, running, "p", paced=False)
    assert not step.release and [v.name for v in step.waiting] == ["kafka-1"] and step.delete is None
    assert not release_rolls_nothing(held, running)
    rolled = [running[0], pod_view(_revision(pod("kafka-1", hash_=None), "kafka-new"))]
    assert drain(work, held, rolled, "p", paced=False).release
    # Not settled (a pod missing): wait, whatever runs.
    assert not drain(work, held, rolled[:1], "p", paced=False).release
    # Another policy's sidecar is not this one's to wait for.
    theirs = [running[0], pod_view(_revision(pod("kafka-1", hash_="h"), "kafka-old", policy="q"))]
    assert not drain(work, held, theirs, "p", paced=False).waiting
    # A webhook sidecar on pods of the update revision: releasing restarts nothing.
    webhook = [pod_view(_revision(pod(f"kafka-{i}", hash_="h"), "kafka-new")) for i in range(2)]
    assert drain(work, held, webhook, "p", paced=False).release


def test_paced_drains_a_former_target_one_pod_at_a_time_of_the_old_revision_only() -> None:
    work = Workload("StatefulSet", "kafka", "ns")
    original = sts({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}})
    held = _caught_up(jsonpatch.apply_patch(original, hold_ops(original, RolloutStrategy.PACED, held_by="ns/p")))
    views = [pod_view(_revision(pod(f"kafka-{i}", hash_="h"), "kafka-old")) for i in range(3)]
    step = drain(work, held, views, "p", paced=True)
    assert step.delete is not None and step.delete.name == "kafka-2" and step.busy is None
    assert drain(work, held, views, "p", paced=False).delete is None  # Manual, OnDelete: a person
    down = [*views[:2], pod_view(_revision(pod("kafka-2", hash_=None, ready=False), "kafka-new"))]
    step = drain(work, held, down, "p", paced=True)
    assert step.delete is None and step.busy == "StatefulSet kafka: kafka-2 not Ready"
    # A pod of the update revision with the sidecar (the webhook's) would come back the same.
    mixed = [pod_view(_revision(pod("kafka-0", hash_="h"), "kafka-old")),
             *(pod_view(_revision(pod(f"kafka-{i}", hash_="h"), "kafka-new")) for i in (1, 2))]
    assert drain(work, held, mixed, "p", paced=True).delete == mixed[0]
    # Before the StatefulSet controller has seen the template, a deleted pod comes back from the old one.
    stale = {**held, "status": {"observedGeneration": 1, "updateRevision": "kafka-new"}}
    assert drain(work, stale, views, "p", paced=True).delete is None


def _in_sync(*, out: int = 0, under: int = 0, at_min: int = 0, time: str = "2026-01-01T11:59:30Z") -> dict[str, Any]:
    """A sidecar's ``inSync`` section (``cleaner/in_sync.py``) with as many partitions in each list."""
    def listed(n: int) -> dict[str, Any]:
        return {"count": n, "examples": [f"orders-{i}" for i in range(min(n, 5))]}

    ms = int(datetime.datetime.fromisoformat(time.replace("Z", "+00:00")).timestamp() * 1000)
    return {"brokerId": 2, "replicas": 120, "outOfIsr": listed(out), "underReplicated": listed(under),
            "atMinIsr": listed(at_min), "noSpareReplica": 0, "metadataOffset": 4_242, "metadataTimeMs": ms}


def test_a_rolled_broker_is_back_only_once_in_every_isr_by_metadata_newer_than_its_restart() -> None:
    rolling = {"pod": "kafka-2", "uid": "old", "since": "2026-01-01T11:59:00Z", "partitionsBefore": 120}
    back = pod_view(pod("kafka-2"))

    def rolled(in_sync: dict[str, Any]) -> tuple[bool, str]:
        scrape = parse_report(json.dumps({**make_report("kafka-2"), "inSync": in_sync}), "kafka-2")
        assert scrape.report is not None, scrape.error  # the schema takes the section
        return Operator._rolled(back, rolling, "new", {"kafka-2": scrape})

    assert rolled(_in_sync()) == (True, "")
    done, why = rolled(_in_sync(out=7))
    assert not done and why == "kafka-2 is out of the ISR of 7 of its 120 partitions (orders-0, orders-1, " \
                               "orders-2, orders-3, orders-4 and 2 more): catching up"
    # In sync as of before its restart: it was; that says nothing of now.
    done, why = rolled(_in_sync(time="2026-01-01T11:58:59Z"))
    assert not done and "before the restart at 2026-01-01T11:59:00" in why
    # No KRaft metadata on its disks (no section): the partition count alone, as before.
    assert Operator._rolled(back, rolling, "new", {"kafka-2": Scrape(report=make_report("kafka-2"))}) == (True, "")


def test_a_broker_whose_restart_would_cost_availability_is_not_rolled_next() -> None:
    report = make_report("kafka-1")
    assert isr_wait_before("kafka-1", {**report, "inSync": _in_sync()}) is None
    assert isr_wait_before("kafka-1", report) is None  # no section: nothing known against it
    assert isr_wait_before("kafka-1", None) is None
    at_min = isr_wait_before("kafka-1", {**report, "inSync": _in_sync(at_min=1, under=1)})
    assert at_min == "waiting: restarting kafka-1 now would take 1 partition below min.insync.replicas (orders-0)"
    under = isr_wait_before("kafka-1", {**report, "inSync": _in_sync(under=2)})
    assert under == ("waiting: kafka-1 is in sync for 2 partitions that are under-replicated (orders-0, orders-1); "
                     "restarting it would leave fewer copies")
