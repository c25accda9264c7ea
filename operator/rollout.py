"""How a change of the sidecar reaches the broker pods: pure decisions over plain dicts.

The operator changes a StatefulSet's pod template (injection.py); the StatefulSet controller
would then roll every broker (``RollingUpdate``, one at a time but blind to Kafka's replicas).
So in the *same* JSON patch as the template change the operator holds the StatefulSet
(:func:`hold_ops`), and releases it (:func:`release_ops`) once no pod waits:

* ``Manual``: ``updateStrategy.rollingUpdate.partition`` is raised to ``spec.replicas``, the
  staged rollout of Kubernetes itself. The new revision exists, no pod moves to it; even a pod
  deleted by a node drain comes back *unchanged* (an ordinal below the partition is recreated
  at the current revision), so nothing surprises a person on call. A person rolls by lowering
  the partition (the controller then rolls the ordinals at or above it, one at a time, waiting
  for Ready). A StatefulSet that is ``OnDelete`` already is left so: a deleted pod gets it.
* ``OnDelete`` and ``Paced``: ``updateStrategy.type`` becomes ``OnDelete``; a pod gets the new
  template when it is recreated, by whoever deletes it (``Paced``: the operator, one at a time).

The StatefulSet's own ``updateStrategy`` is saved in the annotation
:data:`UPDATE_STRATEGY_ANNOTATION` and put back when every pod runs the wanted sidecar, so the
StatefulSet ends as its owner wrote it. Argo CD or Flux that re-apply ``updateStrategy`` in
between release the hold early (the Kafka chart's own strategy then rolls the rest).

Pods of a StrimziPodSet get the sidecar from the webhook when Strimzi creates them; there the
operator asks Strimzi's KafkaRoller to roll them with the pod annotation
:data:`STRIMZI_MANUAL_ROLLING_UPDATE` (honoured per pod; KafkaRoller rolls annotated pods one
after the other in one reconciliation, keeping partitions at or above min ISR, and the new pod
comes without the annotation).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Mapping, Sequence
from typing import Any

from compaction_operator.injection import POLICY_ANNOTATION, SIDECAR_CONTAINER, SIDECAR_HASH_ANNOTATION, _pointer

from cleaner.config import RolloutStrategy

__all__ = [
    "HELD_BY_ANNOTATION",
    "STRIMZI_MANUAL_ROLLING_UPDATE",
    "UPDATE_STRATEGY_ANNOTATION",
    "Drain",
    "PodView",
    "Step",
    "Workload",
    "claim_ops",
    "controller_caught_up",
    "drain",
    "expected_pod_names",
    "failing",
    "held_by",
    "hold_ops",
    "how_to_roll",
    "isr_wait_after",
    "isr_wait_before",
    "next_to_roll",
    "pending",
    "pod_view",
    "rehold_ops",
    "release_ops",
    "release_rolls_nothing",
    "rollback_gate",
    "settled",
    "step_for",
    "stuck",
]

UPDATE_STRATEGY_ANNOTATION = "kafkacleaner.io/update-strategy"
#: Whose hold it is: ``<namespace>/<policy>`` of the CompactionPolicy that held the StatefulSet
#: (set by :func:`hold_ops`, removed by :func:`release_ops`). A policy finds the StatefulSets it
#: holds by it, also those it no longer targets (a retarget, a removed target, its deletion).
HELD_BY_ANNOTATION = "kafkacleaner.io/held-by"
STRIMZI_MANUAL_ROLLING_UPDATE = "strimzi.io/manual-rolling-update"
STRIMZI_PODSET = "StrimziPodSet"
#: The most uids ``status.rollout.step.ready`` holds (the CRD's maxItems).
MAX_STEP_READY = 10000


@dataclasses.dataclass(frozen=True)
class Workload:
    """What owns the broker pods: a StatefulSet (the operator patches its template) or a
    StrimziPodSet (the webhook injects, KafkaRoller rolls)."""

    kind: str
    name: str
    namespace: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


@dataclasses.dataclass(frozen=True)
class PodView:
    """A broker pod as the rollout sees it."""

    name: str
    uid: str
    ready: bool
    deleting: bool
    created: datetime.datetime | None
    #: ``kafkacleaner.io/sidecar-hash`` (None: no sidecar of ours).
    sidecar_hash: str | None
    has_sidecar: bool
    #: Why it is not Ready, as the kubelet or the scheduler said it (empty when unknown).
    why: str = ""
    roll_requested: bool = False
    #: ``kafkacleaner.io/policy``: whose sidecar it runs.
    policy: str | None = None
    #: Why the ``kafka-cleaner`` container is waiting (``CrashLoopBackOff``, ...; empty: it is not).
    sidecar_waiting: str = ""
    #: The StatefulSet revision it was created from (label ``controller-revision-hash``).
    revision: str = ""


def _time(text: str | None) -> datetime.datetime | None:
    if not text:
        return None
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def pod_view(pod: Mapping[str, Any]) -> PodView:
    meta, status, spec = pod.get("metadata") or {}, pod.get("status") or {}, pod.get("spec") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    ready = (conditions.get("Ready") or {}).get("status") == "True"
    why, sidecar_waiting = "", ""
    if not ready:
        scheduled = conditions.get("PodScheduled") or {}
        if scheduled.get("status") == "False":
            why = f"{scheduled.get('reason') or 'Unschedulable'}: {scheduled.get('message') or ''}".strip(": ")
        for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") and cs.get("name") == SIDECAR_CONTAINER:
                why = f"container {SIDECAR_CONTAINER}: {waiting['reason']}"
                sidecar_waiting = str(waiting["reason"])
    annotations = meta.get("annotations") or {}
    has_sidecar = any(c.get("name") == SIDECAR_CONTAINER
                      for c in (spec.get("initContainers") or []) + (spec.get("containers") or []))
    return PodView(name=meta.get("name", ""), uid=meta.get("uid", ""), ready=ready,
                   deleting=bool(meta.get("deletionTimestamp")), created=_time(meta.get("creationTimestamp")),
                   sidecar_hash=annotations.get(SIDECAR_HASH_ANNOTATION) if has_sidecar else None,
                   has_sidecar=has_sidecar, why=why,
                   roll_requested=annotations.get(STRIMZI_MANUAL_ROLLING_UPDATE) == "true",
                   policy=annotations.get(POLICY_ANNOTATION) if has_sidecar else None,
                   sidecar_waiting=sidecar_waiting,
                   revision=str((meta.get("labels") or {}).get("controller-revision-hash") or ""))


def expected_pod_names(workload: Workload, obj: Mapping[str, Any]) -> list[str]:
    """The pods the workload should have: ``<sts>-<ordinal>`` for ``spec.replicas`` ordinals
    from ``spec.ordinals.start``; a StrimziPodSet lists its pods in ``spec.pods``."""
    spec = obj.get("spec") or {}
    if workload.kind == STRIMZI_PODSET:
        return [str((p.get("metadata") or {}).get("name")) for p in spec.get("pods") or []
                if (p.get("metadata") or {}).get("name")]
    replicas = spec.get("replicas")
    replicas = 1 if replicas is None else int(replicas)
    start = int((spec.get("ordinals") or {}).get("start") or 0)
    return [f"{workload.name}-{i}" for i in range(start, start + replicas)]


def pending(pods: Sequence[PodView], wanted: str | None) -> list[PodView]:
    """The pods that do not run the wanted sidecar (``wanted`` None: any sidecar is unwanted)."""
    return [p for p in pods if p.sidecar_hash != wanted or (wanted is None and p.has_sidecar)]


@dataclasses.dataclass(frozen=True)
class Step:
    """The rollout step of one sidecar (``status.rollout.step``): since when the operator wants
    ``sidecar_hash`` in the pods, and the pods created since then that it has seen Ready with
    it (uids). Only a pod of the step that was never Ready can be taken for a sidecar that
    keeps its broker down: a pod that ran the sidecar before the step began, or was Ready with
    it since, is a broker whose sidecar broke later (an OOM after a policy edit, a bug on data
    every replica holds), and deleting it proves nothing and takes a working broker down."""

    sidecar_hash: str
    since: datetime.datetime
    ready: frozenset[str] = frozenset()

    @classmethod
    def from_status(cls, raw: Mapping[str, Any] | None) -> Step | None:
        if not raw or not raw.get("sidecarHash") or not raw.get("since"):
            return None
        since = _time(str(raw["since"]))
        assert since is not None
        return cls(str(raw["sidecarHash"]), since, frozenset(str(u) for u in raw.get("ready") or ()))

    def to_status(self) -> dict[str, Any]:
        # The CRD's bound (a workload of more pods than that would be a first).
        return {"sidecarHash": self.sidecar_hash, "since": _format(self.since),
                "ready": sorted(self.ready)[:MAX_STEP_READY]}

    def created_by_it(self, pod: PodView) -> bool:
        """Whether ``pod`` runs this step's sidecar and was created once it began. (Creation
        times have whole seconds: a pod of the second the step began counts.)"""
        return (pod.sidecar_hash == self.sidecar_hash and pod.created is not None
                and pod.created >= self.since.replace(microsecond=0))

    def never_ready(self, pod: PodView) -> bool:
        """A pod this step created that has not been Ready since (as far as the operator saw)."""
        return self.created_by_it(pod) and not pod.ready and pod.uid not in self.ready

    def seen(self, pods: Sequence[PodView]) -> Step:
        """The step with the pods of it that are Ready now remembered, and the uids of pods
        that are gone forgotten (the list stays as long as the workload)."""
        present = {p.uid for p in pods}
        ready = {u for u in self.ready if u in present}
        ready |= {p.uid for p in pods if p.ready and not p.deleting and self.created_by_it(p)}
        return self if ready == self.ready else dataclasses.replace(self, ready=frozenset(ready))


def _format(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def step_for(step: Step | None, wanted: str | None, rolled_back: str | None,
             now: datetime.datetime) -> Step | None:
    """The step of this round: a new one when the wanted sidecar changed, beginning where the
    last step began: only the change can have put the new hash in a pod, and the webhook
    injects it from its index before a round of the operator sees the change, so a pod
    recreated in between is this step's. The first step (an operator upgraded to this release)
    begins now: its sidecar is the one the pods run already, and none of them counts as new.
    The rolled-back sidecar's step stays while it is undone."""
    hash_ = wanted if wanted is not None else rolled_back
    if hash_ is None:
        return None
    if step is not None and step.sidecar_hash == hash_:
        return step
    return Step(hash_, step.since if step is not None else now)


def stuck(pods: Sequence[PodView], step: Step | None, now: datetime.datetime,
          deadline_seconds: float) -> list[PodView]:
    """Pods the sidecar keeps from starting, for named reasons: created by this rollout
    ``step`` and never Ready since, not Ready ``deadline_seconds`` after their creation, and
    the cause points at the sidecar: the pod cannot be scheduled (the sidecar's requests were
    added to it) or the sidecar container is waiting (an image that cannot be pulled, a crash
    loop, a configuration error). A broker that is not Ready for a reason of its own (its own
    container failing) is never taken for a sidecar problem; neither is a pod that ran the
    sidecar before the step or was Ready with it since (:func:`failing` reports those)."""
    if step is None:
        return []
    return [p for p in pods if step.never_ready(p) and not p.deleting and p.why
            and p.created is not None and (now - p.created).total_seconds() > deadline_seconds]


def failing(pods: Sequence[PodView], step: Step | None) -> list[PodView]:
    """Pods whose sidecar container is failing (waiting: ``CrashLoopBackOff``, ...) and that are
    not Ready, but are no pods of a step in progress that never became Ready: brokers whose
    sidecar broke after it ran. They are reported, never deleted: a person decides."""
    return [p for p in pods if p.has_sidecar and not p.ready and not p.deleting and p.sidecar_waiting
            and not (step is not None and step.never_ready(p))]


def _ordinal(pod: str) -> int | None:
    tail = pod.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else None


def rollback_gate(pods: Sequence[PodView], expected: Sequence[str] | None, stuck_pods: Sequence[PodView],
                  sts: Mapping[str, Any] | None, *, template: bool) -> tuple[PodView | None, str | None]:
    """The stuck pod the rollback deletes next, and why it must wait (None: go), the gate of a
    paced step: every pod the workload should have exists, none is being deleted (the last
    deletion is back), and every other broker is Ready (one that is not Ready only because it
    is stuck the same way is down already; deleting it next is no loss).

    ``sts``: the StatefulSet (or StrimziPodSet). Under its default ``podManagementPolicy: OrderedReady`` the
    StatefulSet controller creates no pod above one that is not Ready, so the lowest stuck
    ordinal goes first and the pods missing above it are no reason to wait (they come once it
    is back); with ``Parallel`` the highest goes first, as the StatefulSet controller would.
    ``template``: the operator holds ``sts``'s template; then the StatefulSet controller must
    have observed the template without the sidecar, and the hold must recreate a deleted pod
    from it (``OnDelete``, not a partition above its ordinal, which would bring it back from
    the current revision, with the sidecar)."""
    if not stuck_pods:
        return None, None
    # A StrimziPodSet creates its pods at once, as a Parallel StatefulSet does.
    ordered = ((sts or {}).get("kind") or "StatefulSet") == "StatefulSet" and (
        ((sts or {}).get("spec") or {}).get("podManagementPolicy", "OrderedReady") != "Parallel")
    if ordered:
        pick = min(stuck_pods, key=lambda p: (o if (o := _ordinal(p.name)) is not None else 1 << 30, p.name))
    else:
        pick = next_to_roll(stuck_pods)
        assert pick is not None
    present = {p.name for p in pods}
    above = _ordinal(pick.name)
    missing = [n for n in expected or () if n not in present
               and not (ordered and above is not None and (o := _ordinal(n)) is not None and o > above)]
    if missing:
        return pick, f"waiting: {', '.join(missing)} missing"
    deleting = [p.name for p in pods if p.deleting]
    if deleting:
        return pick, f"waiting: {', '.join(deleting)} being deleted"
    down = {p.name for p in stuck_pods}
    busy = [p.name for p in pods if not p.ready and p.name not in down]
    if busy:
        return pick, f"waiting: {', '.join(busy)} not Ready"
    if template and sts is not None:
        if not controller_caught_up(sts):
            return pick, "waiting: the StatefulSet controller has not observed the template without the sidecar yet"
        strategy = (sts.get("spec") or {}).get("updateStrategy") or {}
        partition = int((strategy.get("rollingUpdate") or {}).get("partition") or 0)
        if strategy.get("type", "RollingUpdate") != "OnDelete" and above is not None and above < partition:
            return pick, (f"waiting: the StatefulSet's updateStrategy (partition {partition}) would bring "
                          f"{pick.name} back from its current revision, with the sidecar")
    return pick, None


# --------------------------------------------------------------------------------------------
# The ISR gate of a paced step (issue 20, item 6): what the brokers' own metadata says
# --------------------------------------------------------------------------------------------


def _partitions(n: int) -> str:
    return f"{n} partition" + ("" if n == 1 else "s")


def _examples(listed: Mapping[str, Any]) -> str:
    names = listed.get("examples") or []
    more = int(listed.get("count") or 0) - len(names)
    return ", ".join(names) + (f" and {more} more" if more > 0 else "")


def isr_wait_after(pod: str, report: Mapping[str, Any], restarted: datetime.datetime) -> str | None:
    """Why the broker the operator restarted (at ``restarted``) is not back in sync yet, from
    its sidecar's ``inSync`` section (``cleaner/in_sync.py``), or None: it is in the ISR of
    every partition it replicates, as metadata newer than the restart says (a view from before
    the restart would show it in sync: it was). A report without the section (no KRaft metadata
    on the broker's disks, an older sidecar) says nothing here: the partition count stands."""
    in_sync = report.get("inSync")
    if not in_sync:
        return None
    seen = datetime.datetime.fromtimestamp(in_sync["metadataTimeMs"] / 1000, tz=datetime.UTC)
    if seen <= restarted:
        return (f"the metadata {pod}'s sidecar reads ends at {_format(seen)}, before the restart at "
                f"{_format(restarted)}: waiting for a current view of the ISRs")
    out = in_sync["outOfIsr"]
    if out["count"]:
        return (f"{pod} is out of the ISR of {out['count']} of its {_partitions(in_sync['replicas'])} "
                f"({_examples(out)}): catching up")
    return None


def isr_wait_before(pod: str, report: Mapping[str, Any] | None) -> str | None:
    """Why ``pod``'s broker must not be restarted now, from its sidecar's ``inSync`` section,
    or None. As Strimzi's KafkaRoller (``KafkaAvailability.canRoll``): not while a partition
    whose ISR holds it would drop below ``min.insync.replicas`` without it (producers with
    ``acks=all`` would fail), nor while one it is in sync for is under-replicated already (its
    absence would leave fewer copies still)."""
    in_sync = (report or {}).get("inSync")
    if not in_sync:
        return None
    at_min, under = in_sync["atMinIsr"], in_sync["underReplicated"]
    if at_min["count"]:
        return (f"waiting: restarting {pod} now would take {_partitions(at_min['count'])} below "
                f"min.insync.replicas ({_examples(at_min)})")
    if under["count"]:
        return (f"waiting: {pod} is in sync for {_partitions(under['count'])} that are under-replicated "
                f"({_examples(under)}); restarting it would leave fewer copies")
    return None


def next_to_roll(waiting: Sequence[PodView]) -> PodView | None:
    """The StatefulSet controller's order: the highest ordinal first."""
    def ordinal(p: PodView) -> tuple[int, str]:
        tail = p.name.rsplit("-", 1)[-1]
        return (int(tail) if tail.isdigit() else -1, p.name)

    return max(waiting, key=ordinal, default=None)


# --------------------------------------------------------------------------------------------
# Holding and releasing a StatefulSet (JSON patch operations)
# --------------------------------------------------------------------------------------------


def _held_strategy(sts: Mapping[str, Any], strategy: RolloutStrategy) -> dict[str, Any] | None:
    spec = sts.get("spec") or {}
    current = spec.get("updateStrategy") or {}
    if current.get("type", "RollingUpdate") == "OnDelete":
        return None  # nothing rolls by itself already
    if strategy is RolloutStrategy.MANUAL:
        replicas = spec.get("replicas")
        replicas = 1 if replicas is None else int(replicas)
        rolling = dict(current.get("rollingUpdate") or {})
        rolling["partition"] = max(replicas, int(rolling.get("partition") or 0))
        return {"type": "RollingUpdate", "rollingUpdate": rolling}
    return {"type": "OnDelete"}


def held_by(sts: Mapping[str, Any]) -> str | None:
    """``<namespace>/<policy>`` of the policy whose hold this is (None: not held, or held by a
    release that did not name its policy yet)."""
    return ((sts.get("metadata") or {}).get("annotations") or {}).get(HELD_BY_ANNOTATION)


def _annotation_ops(sts: Mapping[str, Any], values: Mapping[str, str]) -> list[dict[str, Any]]:
    """Operations that set the annotations ``values`` (creating the map when there is none)."""
    annotations = (sts.get("metadata") or {}).get("annotations") or {}
    if not values:
        return []
    if not annotations:
        return [{"op": "add", "path": "/metadata/annotations", "value": dict(values)}]
    return [{"op": "add", "path": f"/metadata/annotations/{_pointer(k)}", "value": v} for k, v in values.items()]


def hold_ops(sts: Mapping[str, Any], strategy: RolloutStrategy, *,
             held_by: str | None = None) -> list[dict[str, Any]]:
    """Operations that keep the StatefulSet controller from rolling the template change that
    goes with them (the module docstring says how), saving its own strategy once. ``held_by``
    (``<namespace>/<policy>``) names the hold's policy in :data:`HELD_BY_ANNOTATION`, also on a
    StatefulSet held already (a policy that takes over another's hold owns it from then on:
    the other must not release it under this one's rollout)."""
    annotations = (sts.get("metadata") or {}).get("annotations") or {}
    already = UPDATE_STRATEGY_ANNOTATION in annotations
    held = _held_strategy(sts, strategy)
    if held is None and not already:
        return []
    values: dict[str, str] = {}
    if not already:
        values[UPDATE_STRATEGY_ANNOTATION] = json.dumps((sts.get("spec") or {}).get("updateStrategy") or {},
                                                        sort_keys=True)
    if held_by is not None and annotations.get(HELD_BY_ANNOTATION) != held_by:
        values[HELD_BY_ANNOTATION] = held_by
    ops = _annotation_ops(sts, values)
    if held is not None:
        ops.append({"op": "add", "path": "/spec/updateStrategy", "value": held})
    return ops


def claim_ops(sts: Mapping[str, Any], held_by: str) -> list[dict[str, Any]] | None:
    """Operations that name ``held_by`` on a hold that names no policy (made by an older
    release, for the policy whose sidecar the template carries), or None: not held, or named."""
    annotations = (sts.get("metadata") or {}).get("annotations") or {}
    if UPDATE_STRATEGY_ANNOTATION not in annotations or HELD_BY_ANNOTATION in annotations:
        return None
    path = f"/metadata/annotations/{_pointer(UPDATE_STRATEGY_ANNOTATION)}"
    return [{"op": "test", "path": path, "value": annotations[UPDATE_STRATEGY_ANNOTATION]},
            *_annotation_ops(sts, {HELD_BY_ANNOTATION: held_by})]


def _saved_strategy(sts: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The StatefulSet's own ``updateStrategy`` saved in its annotation while held: the
    annotation's text (what a patch tests) and its value ({} when unreadable), or None when
    the StatefulSet is not held."""
    saved = ((sts.get("metadata") or {}).get("annotations") or {}).get(UPDATE_STRATEGY_ANNOTATION)
    if saved is None:
        return None
    try:
        original = json.loads(saved)
    except ValueError:
        original = {}
    return saved, original


def rehold_ops(sts: Mapping[str, Any], strategy: RolloutStrategy) -> list[dict[str, Any]] | None:
    """Operations that change a held StatefulSet's hold to the one ``strategy`` asks for (the
    policy's strategy changed while pods wait: a paced deletion under a Manual partition would
    bring the pod back unchanged), or None when it is right already or not held."""
    held = _saved_strategy(sts)
    if held is None:
        return None
    saved, original = held
    base = {**sts, "spec": {**(sts.get("spec") or {}), "updateStrategy": original}}
    wanted = _held_strategy(base, strategy) or original
    current = (sts.get("spec") or {}).get("updateStrategy") or {}
    # The kind of hold, not the partition: a Manual hold whose partition a person lowered is
    # that person's roll (the documented one), and raising it again would stop it.
    if current.get("type", "RollingUpdate") == wanted.get("type", "RollingUpdate"):
        return None
    path = f"/metadata/annotations/{_pointer(UPDATE_STRATEGY_ANNOTATION)}"
    return [{"op": "test", "path": path, "value": saved}, {"op": "add", "path": "/spec/updateStrategy",
                                                           "value": wanted}]


def release_ops(sts: Mapping[str, Any], *, held_by: str | None = None) -> list[dict[str, Any]] | None:
    """Operations that put the StatefulSet's own ``updateStrategy`` back (None: not held).
    ``held_by``: only if the hold is that policy's (a test of :data:`HELD_BY_ANNOTATION`: a
    policy that took the hold over meanwhile keeps it)."""
    held = _saved_strategy(sts)
    if held is None:
        return None
    saved, original = held
    # A test of the annotation, not of the resourceVersion: the StatefulSet controller writes
    # the status right after every template change, and a release is right whatever it wrote.
    path = f"/metadata/annotations/{_pointer(UPDATE_STRATEGY_ANNOTATION)}"
    ops: list[dict[str, Any]] = [{"op": "test", "path": path, "value": saved}, {"op": "remove", "path": path}]
    owner_path = f"/metadata/annotations/{_pointer(HELD_BY_ANNOTATION)}"
    if held_by is not None:
        ops.insert(0, {"op": "test", "path": owner_path, "value": held_by})
    if HELD_BY_ANNOTATION in ((sts.get("metadata") or {}).get("annotations") or {}):
        ops.append({"op": "remove", "path": owner_path})
    if original:
        ops.append({"op": "add", "path": "/spec/updateStrategy", "value": original})
    elif "updateStrategy" in (sts.get("spec") or {}):
        # The API server defaults an absent strategy to RollingUpdate/partition 0: the same.
        ops.append({"op": "add", "path": "/spec/updateStrategy",
                    "value": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}})
    return ops


def release_rolls_nothing(sts: Mapping[str, Any], pods: Sequence[PodView]) -> bool:
    """Whether putting the StatefulSet's own strategy back would restart no pod: it is
    ``OnDelete``, or every pod at or above its partition was created from the StatefulSet's
    update revision (the StatefulSet controller has observed its spec)."""
    held = _saved_strategy(sts)
    if held is None:
        return True
    original = held[1]
    if original.get("type", "RollingUpdate") == "OnDelete":
        return True
    if not controller_caught_up(sts):
        return False
    update = (sts.get("status") or {}).get("updateRevision")
    partition = int((original.get("rollingUpdate") or {}).get("partition") or 0)
    return bool(update) and all(p.revision == update for p in pods
                                if not p.deleting and (_ordinal(p.name) or 0) >= partition)


def settled(pods: Sequence[PodView], expected: Sequence[str] | None) -> bool:
    """Every pod the workload should have exists and none is being deleted."""
    present = {p.name for p in pods if not p.deleting}
    return not any(p.deleting for p in pods) and all(name in present for name in expected or ())


@dataclasses.dataclass(frozen=True)
class Drain:
    """What to do with a StatefulSet a policy holds but whose template no longer carries its
    sidecar (a former target: retargeted, target removed, the policy deleted)."""

    #: Pods that still run the policy's sidecar.
    waiting: tuple[PodView, ...]
    #: Put the StatefulSet's own strategy back now.
    release: bool
    #: The pod to delete now (``Paced`` only, one at a time), or None.
    delete: PodView | None
    #: Why no other broker may be taken down now (a pod of this workload missing, being
    #: deleted or not Ready), or None.
    busy: str | None


def drain(workload: Workload, sts: Mapping[str, Any], pods: Sequence[PodView], policy: str, *,
          paced: bool) -> Drain:
    """One step of taking ``policy``'s sidecar out of the pods of a StatefulSet it holds that
    no longer carries it in its template. The hold is released once the StatefulSet is
    settled and no pod runs the sidecar any more, or where releasing restarts no pod
    (:func:`release_rolls_nothing`): releasing a ``RollingUpdate`` strategy earlier would have
    the StatefulSet controller roll the rest, which ``Manual`` leaves to a person. A
    StatefulSet that is not held (``OnDelete`` of its own) is done once no pod runs the sidecar. ``paced``:
    one pod of the old revision is deleted (it comes back from the template without the
    sidecar), only while every pod exists, none is being deleted, all are Ready, and the
    StatefulSet controller has observed the template."""
    expected = expected_pod_names(workload, sts)
    live = [p for p in pods if not p.deleting]
    waiting = tuple(p for p in live if p.has_sidecar and p.policy == policy)
    present = {p.name for p in live}
    missing = [n for n in expected if n not in present]
    busy: str | None = None
    if missing:
        busy = f"{workload}: {', '.join(missing)} missing"
    elif deleting := [p.name for p in pods if p.deleting]:
        busy = f"{workload}: {', '.join(deleting)} being deleted"
    elif not_ready := [p.name for p in live if not p.ready]:
        busy = f"{workload}: {', '.join(not_ready)} not Ready"
    held = _saved_strategy(sts) is not None
    if settled(pods, expected) and (not waiting or (held and release_rolls_nothing(sts, pods))):
        return Drain(waiting, True, None, busy)
    pick = None
    if paced and busy is None and controller_caught_up(sts):
        update = (sts.get("status") or {}).get("updateRevision")
        # A pod of the update revision that runs the sidecar got it from elsewhere (the
        # webhook): deleting it would bring it back the same.
        pick = next_to_roll([p for p in waiting if p.revision != update])
    return Drain(waiting, False, pick, busy)


def how_to_roll(workload: Workload, pod: str, sts: Mapping[str, Any] | None) -> str:
    """The command that rolls ``pod`` as the held workload allows it (for the status)."""
    ns = workload.namespace
    if workload.kind == STRIMZI_PODSET:
        return f"kubectl annotate pod -n {ns} {pod} {STRIMZI_MANUAL_ROLLING_UPDATE}=true"
    strategy = ((sts or {}).get("spec") or {}).get("updateStrategy") or {}
    partition = int((strategy.get("rollingUpdate") or {}).get("partition") or 0)
    head, _, tail = pod.rpartition("-")
    if strategy.get("type", "RollingUpdate") == "RollingUpdate" and partition and tail.isdigit():
        # A partition P rolls every ordinal from P up: lowered to just below the current one,
        # it rolls exactly one broker. Lower, it would take several down at once.
        ordinal = int(tail)
        if ordinal >= partition:
            return f"the StatefulSet controller rolls it (partition {partition} is at or below its ordinal)"
        if ordinal < partition - 1:
            return (f"roll {head}-{partition - 1} first, one ordinal at a time from the highest: a partition of "
                    f"{ordinal} now would roll {partition - ordinal} brokers at once")
        patch = json.dumps({"spec": {"updateStrategy": {"rollingUpdate": {"partition": ordinal}}}},
                           separators=(",", ":"))
        return f"kubectl patch statefulset -n {ns} {workload.name} --type merge -p '{patch}'"
    return f"kubectl delete pod -n {ns} {pod}"


def controller_caught_up(sts: Mapping[str, Any]) -> bool:
    """Whether the StatefulSet controller has observed the StatefulSet's current spec (what
    ``kubectl rollout status`` checks first): only then does a deleted pod come back from the
    current template."""
    observed = (sts.get("status") or {}).get("observedGeneration")
    return observed is not None and observed >= (sts.get("metadata") or {}).get("generation", 0)
