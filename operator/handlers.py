"""The kopf handlers: reconcile CompactionPolicies, report the sidecars' status, inject by webhook.

The I/O half of the operator. The decisions are made by the pure modules (``injection`` builds
and patches, ``status`` aggregates, ``webhook.choose_policy`` picks); this module reads the
cluster, calls them, and writes what they return.

One *round* (:meth:`Operator.round`) is the whole job for one policy, level-triggered and
idempotent: parse the spec (a bad one is reported as ``Stalled``/``InvalidSpec``), write the
policy ConfigMap, put the sidecar into the StatefulSet's pod template once a server-side dry
run of the pod it would make passes admission (or leave it to the webhook), take it out of
StatefulSets the policy no longer targets, list the target pods, pull their sidecars'
``/status`` and write the policy's status. The create/update/resume handlers
run a round at once (without pulling reports); a daemon per policy runs one every
``reporting.intervalSeconds`` (a kopf daemon rather than a timer, since a timer's interval is
fixed when the handler is declared). Rounds of one policy never overlap. ``spec.paused`` makes
a round change nothing in the cluster while it still reports.

Handlers return None and write the status with explicit merge patches of ``/status`` (the CRD's
status schema is typed: kopf's handler results would be pruned). The finalizer (kopf's, for the
delete handler) removes exactly what was injected and the ConfigMap.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp
import kopf
import kubernetes
import yaml
from compaction_operator import metrics
from compaction_operator.injection import (
    CONFIGMAP_KEY,
    POLICY_ANNOTATION,
    PORT_NAME,
    SIDECAR_HASH_ANNOTATION,
    KubeVersion,
    Sidecar,
    build_sidecar,
    configmap_name,
    find_sidecar,
    grace_period_warning,
    image_refusal,
    inject_into_pod,
    label_selector_string,
    missing_data_volumes,
    patched,
    pod_from_template,
    policy_refusals,
    removal_patch,
    template_patch,
    template_policy,
)
from compaction_operator.kube import GROUP, PLURAL, VERSION, ApiException, Kube, load_config
from compaction_operator.race_guard import HOLD, AdminTopicConfigs, Held, release_plan, topics_out_of_sync
from compaction_operator.rollout import (
    STRIMZI_MANUAL_ROLLING_UPDATE,
    STRIMZI_PODSET,
    Drain,
    PodView,
    Step,
    Workload,
    claim_ops,
    controller_caught_up,
    drain,
    expected_pod_names,
    failing,
    held_by,
    hold_ops,
    how_to_roll,
    isr_wait_after,
    isr_wait_before,
    next_to_roll,
    pending,
    pod_view,
    rehold_ops,
    release_ops,
    rollback_gate,
    step_for,
    stuck,
)
from compaction_operator.scrape import fetch_reports, pod_address
from compaction_operator.settings import OperatorConfig
from compaction_operator.status import (
    BrokerPod,
    Outcome,
    OutcomeKind,
    Scrape,
    build_status,
    format_time,
    race_risk_events,
    race_risks,
    status_patch,
    status_to_write,
)
from compaction_operator.webhook import (
    WEBHOOK_ID,
    Choice,
    admission_rejection,
    choose_policy,
    post_event,
    warn_about_injection,
    webhook_server,
)

from cleaner.clock import SystemTime, Time
from cleaner.config import API_VERSION, KIND, Injection, Policy, RolloutStrategy, parse_policy
from cleaner.errors import PolicyError

__all__ = ["FINALIZER", "WEBHOOK_ID", "Operator", "build_registry", "build_settings"]

log = logging.getLogger("kafka-cleaner-operator")

FINALIZER = "kafkacleaner.io/finalizer"
GENERATION_ANNOTATION = "kafkacleaner.io/policy-generation"
MANAGED_BY = "kafka-cleaner-operator"
#: How long the API server's version is trusted before it is asked again (clusters upgrade).
VERSION_TTL = 600.0
#: Pods listed in status.rollout.pendingPods (the count is always whole).
MAX_PENDING_LISTED = 50


@dataclasses.dataclass
class Target:
    """A round's view of the policy's broker pods and what owns them."""

    pods: list[BrokerPod]
    raw: list[dict[str, Any]]
    workload: Workload | None = None
    #: The workload as read (a StatefulSet, a StrimziPodSet), for spec.replicas and its hold.
    obj: dict[str, Any] | None = None

    @property
    def expected(self) -> list[str] | None:
        if self.workload is None or self.obj is None:
            return None
        return expected_pod_names(self.workload, self.obj)


class Stalled(Exception):
    """A round cannot go on without a change by the user; reported as condition Stalled."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


@dataclasses.dataclass
class PolicyState:
    """What the operator remembers of one policy between rounds (lost on restart, harmlessly)."""

    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    #: The status this operator last wrote: fresher than the body kopf last saw.
    status: dict[str, Any] | None = None
    failing: bool = False
    #: The last AwaitingRollout message about former targets (an Event when it changes).
    told_former: str = ""


@dataclasses.dataclass(frozen=True)
class Former:
    """A StatefulSet this policy holds that no longer carries its sidecar in its template (a
    former target), not released yet."""

    workload: Workload
    sts: dict[str, Any]
    drain: Drain


def _manifest(body: Mapping[str, Any]) -> dict[str, Any]:
    """A plain-dict copy of a kopf body (which is a view) without the status."""
    return json.loads(json.dumps({k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}))


def broker_pod(pod: Mapping[str, Any]) -> BrokerPod:
    """A target pod as the operator sees it: its address, whether it carries the sidecar, and
    the port that sidecar declares (it may be an older sidecar than the policy's)."""
    meta = pod.get("metadata") or {}
    found = find_sidecar(pod.get("spec") or {})
    port = None
    if found is not None:
        port = next((p.get("containerPort") for p in found[1].get("ports") or [] if p.get("name") == PORT_NAME), None)
    return BrokerPod(name=meta["name"], ip=pod_address(pod.get("status") or {}), has_sidecar=found is not None,
                     sidecar_hash=(meta.get("annotations") or {}).get(SIDECAR_HASH_ANNOTATION), port=port)


def _owner_reference(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    return {"apiVersion": API_VERSION, "kind": KIND, "name": meta["name"], "uid": meta["uid"],
            "controller": True, "blockOwnerDeletion": True}


def policy_ref(namespace: str, name: str) -> str:
    """How a hold names its policy (``kafkacleaner.io/held-by``)."""
    return f"{namespace}/{name}"


def policy_file(policy: Policy) -> str:
    """The policy ConfigMap's ``policy.yaml``: the CompactionPolicy manifest (with its generation)."""
    header = (f"# Written by {MANAGED_BY} from CompactionPolicy {policy.namespace}/{policy.name}, "
              f"generation {policy.policy_generation}. Edit the CompactionPolicy, not this file.\n")
    return header + yaml.safe_dump(policy.to_manifest(), sort_keys=False)


class Operator:
    """The operator's state shared by its handlers: settings, API clients, per-policy state."""

    def __init__(self, config: OperatorConfig, *, time: Time | None = None,
                 webhook_ready: threading.Event | None = None) -> None:
        self.config = config
        self.time = time or SystemTime()
        #: Set once the policy index holds every policy the API server lists: only then does
        #: the webhook server listen (:func:`compaction_operator.webhook.webhook_server`'s gate),
        #: and only then is the replica ready (main.py's /readyz).
        self.webhook_ready = webhook_ready or threading.Event()
        """Set while the webhook server listens (it starts once the policies are indexed)."""
        self.policies_indexed = threading.Event()
        """Set once kopf's policy index holds every policy the API server lists."""
        self.index_watch: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self.kube: Kube | None = None
        self.session: aiohttp.ClientSession | None = None
        self.version: KubeVersion | None = None
        self._version_at = 0.0
        self.policies: dict[str, PolicyState] = {}
        #: Set by ``stop``: a round after it does nothing (kopf may start a daemon again from a
        #: watch event handled while the operator stops, after its daemon killer ran).
        self.stopped = False

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self, logger: logging.Logger | logging.LoggerAdapter[Any]) -> None:
        await asyncio.to_thread(load_config)
        self.kube = Kube(kubernetes.client.ApiClient())
        self.session = aiohttp.ClientSession(headers={"User-Agent": MANAGED_BY})
        try:
            await self.cluster_version()
            native = self.version is not None and self.version.native_sidecars
            how = "a native sidecar (initContainers)" if native else "a regular container"
            logger.info(f"Kubernetes {self.version}: the sidecar is injected as {how}.")
        except Exception as exc:
            logger.warning(f"Could not read the Kubernetes version yet: {exc}")

    async def stop(self) -> None:
        """After the rounds in progress (each holds its policy's lock to its end): the clients
        they use are closed under none of them."""
        self.stopped = True
        for state in list(self.policies.values()):
            async with state.lock:
                pass
        if self.session is not None:
            await self.session.close()
        if self.kube is not None:
            self.kube.close()

    def _kube(self) -> Kube:
        if self.kube is None:
            raise RuntimeError("the operator has not started")
        return self.kube

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A blocking client call, off the event loop."""
        return await asyncio.to_thread(fn, *args)

    def _seconds(self) -> float:
        """The monotonic clock, for durations."""
        return self.time.nanoseconds() / 1e9

    def now(self) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.time.milliseconds() / 1000, datetime.UTC)

    async def cluster_version(self) -> KubeVersion:
        if self.version is None or self._seconds() - self._version_at > VERSION_TTL:
            try:
                # The oldest of the API server and every kubelet decides native sidecars.
                self.version, self._version_at = await self.call(self._kube().cluster_version), self._seconds()
            except Exception:
                if self.version is None:
                    raise
        assert self.version is not None
        return self.version

    async def await_policies_indexed(self, index: Mapping[str, Any], poll: float = 0.2) -> None:
        """Set ``policies_indexed`` (the webhook server's gate) once kopf's policy index holds
        every policy the API server lists (kopf fills its index from a watch of its own and says
        nothing when the first listing is in; a webhook answering before that would admit broker
        pods without the sidecar of a policy it has not seen yet). Listed again until then: a policy deleted
        meanwhile is no longer waited for."""
        while True:
            try:
                listed = [(p["metadata"]["namespace"], p["metadata"]["name"])
                          for p in await self.call(self._kube().list_policies, self.config.namespaces)]
            except Exception as exc:  # the API server is not there yet: try again
                log.warning("Cannot list the CompactionPolicies yet: %s", exc)
                listed = None
            if listed is not None:
                missing = [(ns, name) for ns, name in listed
                           if not any((m.get("metadata") or {}).get("name") == name for m in index.get(ns, []))]
                if not missing:
                    log.info("The webhook's policy index holds all %d policies: serving the webhook.", len(listed))
                    self.policies_indexed.set()
                    return
            await asyncio.sleep(poll if listed is not None else 1.0)

    def state(self, body: Mapping[str, Any]) -> PolicyState:
        return self.policies.setdefault(body["metadata"]["uid"], PolicyState())

    def image(self, policy: Policy) -> str | None:
        return policy.sidecar.image or self.config.sidecar_image

    # -- one round -------------------------------------------------------------------------

    async def round(self, body: Mapping[str, Any], *, scrape: bool,
                    logger: logging.Logger | logging.LoggerAdapter[Any]) -> None:
        """Reconcile and report one policy (see the module docstring). API errors propagate."""
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        if meta.get("deletionTimestamp") or self.stopped:
            return
        state = self.state(body)
        async with state.lock:
            if self.stopped:  # stopped while this round waited for the lock
                return
            started = self._seconds()
            metrics.RECONCILIATIONS.labels(namespace, name).inc()
            try:
                await self._round(body, state, scrape=scrape, logger=logger)
            except ApiException as exc:
                metrics.RECONCILE_ERRORS.labels(namespace, name, "ApiError").inc()
                if not state.failing:
                    kopf.event(body, type="Warning", reason="ApiError",
                               message=f"Kubernetes API call failed: {exc.status} {exc.reason}")
                state.failing = True
                raise
            else:
                state.failing = False
            finally:
                metrics.RECONCILE_DURATION.observe(self._seconds() - started)

    async def _round(self, body: Mapping[str, Any], state: PolicyState, *, scrape: bool,
                     logger: logging.Logger | logging.LoggerAdapter[Any]) -> None:
        meta = body["metadata"]
        namespace, name, generation = meta["namespace"], meta["name"], int(meta.get("generation") or 1)
        previous = state.status if state.status is not None else dict(body.get("status") or {})
        rollout: dict[str, Any] = dict(previous.get("rollout") or {})
        pods: list[BrokerPod] | None = None
        overlap: str | None = None
        scrapes: Mapping[str, Scrape] | None = None
        sidecar: Sidecar | None = None
        policy: Policy | None = None
        target: Target | None = None
        former: list[Former] = []
        try:
            policy = parse_policy(_manifest(body), source=f"CompactionPolicy {namespace}/{name}")
            sidecar = await self._expected_sidecar(policy, rollout, strict=not policy.paused)
            rolled_back = rollout.get("rolledBack") or {}
            # A sidecar that was rolled back is not injected again until the spec changes it.
            wanted = None if sidecar is not None and rolled_back.get("sidecarHash") == sidecar.hash else sidecar
            if policy.paused:
                # The sidecars must see spec.paused (it stops their cleaning and staging): the
                # ConfigMap is published; nothing else changes in the cluster.
                await self._ensure_configmap(body, policy, logger)
                outcome = Outcome.paused()
            else:
                former = await self._apply(body, policy, wanted, logger)
                outcome = Outcome()
            target = await self._target_pods(policy, namespace) if policy.target is not None else None
            pods = target.pods if target is not None else []
            if scrape and pods:
                assert self.session is not None
                scrapes = await fetch_reports(self.session, pods, policy.sidecar.port, self.config.scrape_timeout)
                for pod, result in scrapes.items():
                    if result.error is not None:
                        metrics.SCRAPE_FAILURES.labels(namespace, name, pod).inc()
            elif scrape:
                scrapes = {}
            # A pod of a former target on its way back holds the paced steps of this one.
            elsewhere = next((f.drain.busy for f in former if f.drain.busy), None)
            if target is not None and not policy.paused:
                outcome = await self._roll(body, policy, target, sidecar, wanted, scrapes, previous, rollout,
                                           logger, elsewhere=elsewhere)
            elif target is None:
                for key in ("pending", "pendingPods", "rolling", "gate", "step"):
                    rollout.pop(key, None)
            if former:
                await self._drain_former(body, policy, target, former, rollout, state, scrape=scrape,
                                         logger=logger)
            elif not policy.paused:
                state.told_former = ""
            if rolled_back and wanted is None and sidecar is not None and outcome.kind is OutcomeKind.OK:
                outcome = Outcome.stalled("SidecarRolledBack", rolled_back.get("message") or "rolled back")
        except PolicyError as exc:
            outcome = Outcome.stalled("InvalidSpec", str(exc))
        except Stalled as exc:
            outcome = Outcome.stalled(exc.reason, exc.message)
        if policy is not None:  # also when stalled: a TargetConflict stalls the second of two
            overlap = await self._overlap(policy, namespace, pods)
        if outcome.kind is OutcomeKind.STALLED:
            metrics.RECONCILE_ERRORS.labels(namespace, name, outcome.reason).inc()

        if policy is not None and rollout.get("rolledBack") and sidecar is not None and (
                rollout["rolledBack"].get("sidecarHash") != sidecar.hash):
            rollout.pop("rolledBack")  # the spec changed the sidecar: a new try
        # Brokers whose sidecar broke after it ran (not a rollout step's new pod): reported,
        # never deleted (rollout.failing).
        broken = failing([pod_view(p) for p in target.raw], Step.from_status(rollout.get("step"))) if (
            target is not None) else []
        new = build_status(policy=policy, generation=generation, previous=previous, outcome=outcome, pods=pods,
                           scrapes=scrapes, sidecar_hash=sidecar.hash if sidecar is not None else None,
                           now=self.now(), overlap=overlap,
                           expected_pods=target.expected if target is not None else None,
                           rollout_hint=_hint(rollout),
                           sidecar_failing=[(v.name, v.sidecar_waiting) for v in broken])
        if rollout:
            new["rollout"] = rollout
        if previous.get("raceGuard"):
            new["raceGuard"] = previous["raceGuard"]
        # The gauges first: whoever reads this round's status finds the same round in /metrics.
        summary = new["summary"]
        metrics.BROKERS_EXPECTED.labels(namespace, name).set(summary["brokersExpected"])
        metrics.BROKERS_REPORTING.labels(namespace, name).set(summary["brokersReporting"])
        stale = sum(1 for e in new["brokers"].values() if e.get("missedReports", 0) >= 3)
        metrics.STALE_BROKERS.labels(namespace, name).set(stale)
        metrics.DIVERGING_PARTITIONS.labels(namespace, name).set(summary["divergingPartitions"])
        stalled = next((c for c in new["conditions"] if c["type"] == "Stalled"), {})
        metrics.ROLLOUT_STALLED.labels(namespace, name).set(
            1 if stalled.get("status") == "True" and stalled.get("reason") in ROLLOUT_STALL_REASONS else 0)
        metrics.ROLLOUT_PENDING_PODS.labels(namespace, name).set(rollout.get("pending", 0))
        metrics.SIDECAR_FAILING_PODS.labels(namespace, name).set(len(broken))
        await self._write_status(state, namespace, name, previous, new)
        self._announce(body, previous, new, logger)
        if scrapes is not None:  # the replication race (issue 24): gauge and Events from this round's reports
            risks = race_risks(scrapes)
            now = self.now()
            now_ms = int(now.timestamp() * 1000)
            metrics.set_race_risks(namespace, name, {(r.topic, r.partition, r.broker): r.seconds_left(now_ms)
                                                     for r in risks})
            for type_, reason, message in race_risk_events(previous, new, risks, now):
                kopf.event(body, type=type_, reason=reason, message=message)
            if self.config.race_guard_bootstrap and policy is not None:
                await self._race_guard(body, state, policy, pods or [], scrapes)

    async def _race_guard(self, body: Mapping[str, Any], state: PolicyState, policy: Policy,
                          pods: Sequence[BrokerPod], scrapes: Mapping[str, Scrape]) -> None:
        """The race guard's step (``race_guard.py``): hold Kafka's cleaner off the policy's
        compacted topics with a replica out of sync in this round's reports, and set back the
        topics held before once every replica is in sync. A release needs every broker's report
        (a replica whose state is unknown keeps its topics held). What a hold replaced is in
        ``status.raceGuard`` before the topic's configs change."""
        reports = {pod: s.report for pod, s in scrapes.items() if s.report is not None}
        complete = bool(reports) and all(p.name in reports for p in pods if p.has_sidecar)
        wanted = {topic: why for topic, why in topics_out_of_sync(reports).items()
                  if (rule := policy.rule_for(topic)) is not None and rule.compact}
        held = self._held(state, body)
        to_hold = sorted(set(wanted) - set(held))
        to_release = sorted(set(held) - set(wanted)) if complete else []
        if to_hold or to_release:
            await self._guard(body, state, held, {t: wanted[t] for t in to_hold}, to_release)

    def _held(self, state: PolicyState, body: Mapping[str, Any]) -> dict[str, Held]:
        status = state.status if state.status is not None else dict(body.get("status") or {})
        entries = (status.get("raceGuard") or {}).get("held") or {}
        return {topic: Held.from_status(topic, entry) for topic, entry in entries.items()}

    async def _guard(self, body: Mapping[str, Any], state: PolicyState, held: dict[str, Held],
                     hold: Mapping[str, str], release: Sequence[str]) -> None:
        meta = body["metadata"]
        admin: AdminTopicConfigs | None = None
        topic = ""
        try:
            admin = await self.call(AdminTopicConfigs, self.config.race_guard_bootstrap,
                                    self.config.race_guard_options)
            for topic, why in hold.items():
                restore = await self.call(admin.overrides, topic, list(HOLD))
                shared = restore == HOLD  # another policy's guard over the same cluster holds it
                held[topic] = Held(topic, self.now().isoformat(timespec="seconds").replace("+00:00", "Z"), why,
                                   {} if shared else restore, shared)
                await self._write_held(state, meta["namespace"], meta["name"], held)  # before the change
                if shared:
                    continue
                try:
                    await self.call(admin.set, topic, HOLD)
                except Exception:
                    del held[topic]
                    await self._write_held(state, meta["namespace"], meta["name"], held, gone=topic)
                    raise
                kopf.event(body, type="Warning", reason="RaceGuardHolding",
                           message=f"topic {topic}: Kafka's cleaner held off ({why}): min.cleanable.dirty.ratio "
                           "1.0 and max.compaction.lag.ms at its maximum until every replica is in sync")
            for topic in release:
                back, changed = release_plan(held[topic], await self.call(admin.overrides, topic, list(HOLD)))
                if back:
                    await self.call(admin.set, topic, back)
                del held[topic]
                await self._write_held(state, meta["namespace"], meta["name"], held, gone=topic)
                left = f"; {', '.join(changed)} changed by someone else while held, left as it is" if changed else ""
                kopf.event(body, type="Normal", reason="RaceGuardReleased",
                           message=f"topic {topic}: every replica in sync, its own configs set back ({back}){left}")
        except Exception as exc:  # Kafka unreachable, refused, a bad option: said, tried again next round
            kopf.event(body, type="Warning", reason="RaceGuardFailed",
                       message=f"topic {topic}: the Admin API at {self.config.race_guard_bootstrap}: {exc}"[:1000])
        finally:
            if admin is not None:
                await self.call(admin.close)

    async def _write_held(self, state: PolicyState, namespace: str, name: str, held: Mapping[str, Held],
                          gone: str | None = None) -> None:
        """``status.raceGuard`` now, in one merge patch of its own (not waiting for the round's):
        the held topics, and ``gone`` removed."""
        value = {"held": {topic: h.to_status() for topic, h in held.items()}}
        patch = {"status": {"raceGuard": {"held": {**value["held"], **({gone: None} if gone else {})}}}}
        await self.call(self._kube().patch_policy_status, namespace, name, patch)
        if state.status is not None:
            state.status = {**state.status, "raceGuard": value}

    async def _write_status(self, state: PolicyState, namespace: str, name: str, previous: Mapping[str, Any],
                            new: dict[str, Any]) -> None:
        """Patch the status only when it changed meaningfully or the heartbeat is due
        (``status.status_to_write``); ``state.status`` stays what was last written, so that
        small moves add up to a write and are not lost round by round."""
        written = status_to_write(previous, new, self.now())
        if written is None:
            return
        patch = status_patch(previous, written)
        if patch is not None:
            await self.call(self._kube().patch_policy_status, namespace, name, patch)
        state.status = written

    def _announce(self, body: Mapping[str, Any], old: Mapping[str, Any], new: Mapping[str, Any],
                  logger: logging.Logger | logging.LoggerAdapter[Any]) -> None:
        """Events when Stalled or Degraded turn on or off (not every round: no flood)."""
        def condition(status: Mapping[str, Any], type_: str) -> Mapping[str, Any]:
            return next((c for c in status.get("conditions") or [] if c.get("type") == type_), {})

        for type_ in ("Stalled", "Degraded"):
            before, after = condition(old, type_), condition(new, type_)
            if after.get("status") == "True" and (before.get("status") != "True"
                                                   or before.get("reason") != after.get("reason")):
                kopf.event(body, type="Warning", reason=after["reason"], message=after["message"])
                logger.debug(f"{type_}: {after['reason']}: {after['message']}")
            elif after.get("status") == "False" and before.get("status") == "True":
                kopf.event(body, type="Normal", reason=f"{type_}Cleared",
                           message=f"no longer {type_.lower()} ({before.get('reason')})")

    # -- reconcile -------------------------------------------------------------------------

    async def _expected_sidecar(self, policy: Policy, rollout: dict[str, Any], *,
                                strict: bool) -> Sidecar | None:
        """The sidecar the target pods should run, with the image pinned per policy.

        ``spec.sidecar.image`` wins. Without it the operator's default image is used once and
        recorded in ``status.rollout`` (``sidecarImage``, ``sidecarHash``): later rounds build
        the sidecar with the recorded image as long as that gives the recorded hash, so an
        operator upgrade (a new default tag) changes no pod template by itself. A spec change
        that changes the sidecar anyway (mode, port, resources, target, ...) takes the current
        default along; setting ``spec.sidecar.image`` moves a policy explicitly. ``rollout`` is
        updated in place. ``strict``: a missing image or webhook is Stalled (not when paused).
        """
        if policy.target is None:
            return None
        if strict and policy.target.effective_injection is Injection.WEBHOOK and not self.config.webhook_enabled:
            raise Stalled("WebhookDisabled", "target.injection is webhook, but this operator runs without "
                          "its admission webhook (Helm value webhook.enabled)")
        version = await self.cluster_version()
        sidecar: Sidecar | None = None
        pinned_image, pinned_hash = rollout.get("sidecarImage"), rollout.get("sidecarHash")
        # A pinned image the installer no longer allows (the default moved to another
        # repository) is not kept: the current default is.
        if policy.sidecar.image is None and pinned_image and image_refusal(
                pinned_image, self.config.sidecar_image_allowlist) is None:
            candidate = build_sidecar(policy, image=pinned_image, native=version.native_sidecars)
            if candidate.hash == pinned_hash:
                sidecar = candidate
        if sidecar is None:
            image = self.image(policy)
            if image is None:
                if strict:
                    raise Stalled("NoSidecarImage", "spec.sidecar.image is not set and the operator has no "
                                  "default (KAFKA_CLEANER_SIDECAR_IMAGE)")
                return None
            sidecar = build_sidecar(policy, image=image, native=version.native_sidecars)
        rollout["sidecarImage"] = sidecar.container["image"]
        rollout["sidecarHash"] = sidecar.hash
        return sidecar

    async def _apply(self, body: Mapping[str, Any], policy: Policy, sidecar: Sidecar | None,
                     logger: logging.Logger | logging.LoggerAdapter[Any]) -> list[Former]:
        """The ConfigMap and the injection of ``sidecar`` (None: none, take it out); the holds
        of former targets released where done (the others returned)."""
        await self._ensure_configmap(body, policy, logger)
        templated = policy.target.stateful_set if (
            policy.target is not None and policy.target.effective_injection is Injection.STATEFUL_SET) else None
        wanted = templated if sidecar is not None else None
        await self._remove_stale_injections(body, policy, keep=wanted, logger=logger)
        former = await self._former_targets(body, policy.rollout.strategy, current=templated, logger=logger)
        if wanted is not None and sidecar is not None:
            await self._inject(body, policy, wanted, sidecar, logger)
        return former

    async def _former_targets(self, body: Mapping[str, Any], strategy: RolloutStrategy, *, current: str | None,
                              logger: logging.Logger | logging.LoggerAdapter[Any]) -> list[Former]:
        """The StatefulSets this policy holds (``kafkacleaner.io/held-by``) other than its
        current target ``current`` (whose template carries its sidecar): a retarget, a removed
        target, a switch to the webhook. Each is released once no pod of it runs the policy's
        sidecar any more, or where releasing restarts nothing (``rollout.drain``); the others
        are returned, still held."""
        kube = self._kube()
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        ref = policy_ref(namespace, name)
        found: list[Former] = []
        for sts in await self.call(kube.list_statefulsets, namespace):
            sts_name = sts["metadata"]["name"]
            if held_by(sts) != ref or sts_name == current:
                continue
            if template_policy((sts.get("spec") or {}).get("template") or {}) == name:
                continue  # its sidecar is still in the template: _remove_stale_injections failed
            workload = Workload("StatefulSet", sts_name, namespace)
            selector = label_selector_string((sts.get("spec") or {}).get("selector") or {})
            views = [pod_view(p) for p in await self.call(kube.list_pods, namespace, selector)] if selector else []
            step = drain(workload, sts, views, name, paced=strategy is RolloutStrategy.PACED)
            if step.release:
                await self._release(body, workload, sts, ref, logger)
                continue
            found.append(Former(workload, sts, step))
        return found

    async def _release(self, body: Mapping[str, Any], workload: Workload, sts: Mapping[str, Any], ref: str,
                       logger: logging.Logger | logging.LoggerAdapter[Any]) -> None:
        """Put the StatefulSet's own strategy back (its hold is this policy's, or names none)."""
        ops = release_ops(sts, held_by=ref if held_by(sts) == ref else None)
        if ops is None:
            return
        await self.call(self._kube().patch_statefulset, workload.namespace, workload.name, ops)
        message = f"{workload}: no pod runs the sidecar of this policy; its own updateStrategy is back"
        kopf.event(body, type="Normal", reason="HoldReleased", message=message)
        logger.info(message + ".")

    async def _drain_former(self, body: Mapping[str, Any], policy: Policy, target: Target | None,
                            former: Sequence[Former], rollout: dict[str, Any], state: PolicyState, *,
                            scrape: bool, logger: logging.Logger | logging.LoggerAdapter[Any]) -> None:
        """The pods of former targets that still run the sidecar: listed in
        ``status.rollout.pendingPods`` (with the command that rolls each) and an Event when
        they change; ``Paced`` (in reporting rounds) deletes one, only while this policy's own
        rollout has nothing pending or in flight, every pod of its target and of every former
        target exists, none is being deleted and all are Ready: one broker down at a time."""
        kube = self._kube()
        listed = [{"pod": v.name, "workload": str(f.workload), "roll": how_to_roll(f.workload, v.name, f.sts)}
                  for f in former for v in sorted(f.drain.waiting, key=lambda v: v.name)]
        rollout["pending"] = int(rollout.get("pending") or 0) + len(listed)
        rollout["pendingPods"] = [*(rollout.get("pendingPods") or []), *listed][:MAX_PENDING_LISTED]
        if not rollout["pendingPods"]:
            rollout.pop("pendingPods")
        strategy = policy.rollout.strategy
        if strategy is RolloutStrategy.PACED:
            quiet = rollout.get("pending") == len(listed) and "rolling" not in rollout
            if target is not None and target.workload is not None:
                views = [pod_view(p) for p in target.raw]
                quiet = quiet and _settled(views, target.expected) and all(v.ready for v in views)
            busy = next((f.drain.busy for f in former if f.drain.busy), None)
            pick = next((f for f in former if f.drain.delete is not None), None)
            if scrape and quiet and busy is None and pick is not None:
                pod = pick.drain.delete
                assert pod is not None
                await self.call(kube.delete_pod, pick.workload.namespace, pod.name, pod.uid)
                message = (f"{pick.workload}: deleted pod {pod.name} so that it comes back without the sidecar "
                           f"(no longer a target of this policy)")
                kopf.event(body, type="Normal", reason="RollingBroker", message=message)
                logger.info(message + ".")
            return
        told = "; ".join(f"{p['pod']}: {p['roll']}" for p in listed)
        if told and told != state.told_former:
            message = (f"{len(listed)} pod(s) of StatefulSets this policy no longer targets still run its sidecar "
                       f"(rollout.strategy {strategy.value}; each held until then): {told}")
            kopf.event(body, type="Normal", reason="AwaitingRollout", message=message[:1024])
            logger.info(message + ".")
        state.told_former = told

    async def _ensure_configmap(self, body: Mapping[str, Any], policy: Policy,
                                logger: logging.Logger | logging.LoggerAdapter[Any]) -> None:
        kube = self._kube()
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        cm_name = configmap_name(name)
        labels = {"app.kubernetes.io/name": "kafka-cleaner", "app.kubernetes.io/component": "policy",
                  "app.kubernetes.io/managed-by": MANAGED_BY}
        if len(name) <= 63:
            labels[POLICY_ANNOTATION] = name
        annotations = {POLICY_ANNOTATION: name, GENERATION_ANNOTATION: str(policy.policy_generation)}
        owner = _owner_reference(body)
        data = {CONFIGMAP_KEY: policy_file(policy)}
        current = await self.call(kube.read_configmap, namespace, cm_name)
        if current is None:
            await self.call(kube.create_configmap, namespace, {
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": cm_name, "namespace": namespace, "labels": labels,
                             "annotations": annotations, "ownerReferences": [owner]},
                "data": data})
            kopf.event(body, type="Normal", reason="PolicyPublished",
                       message=f"ConfigMap {cm_name} created with generation {policy.policy_generation}")
            logger.info(f"Created ConfigMap {cm_name}.")
            return
        cm_meta = current.get("metadata") or {}
        owners = cm_meta.get("ownerReferences") or []
        if not any(o.get("uid") == owner["uid"] for o in owners) and (
                (cm_meta.get("annotations") or {}).get(POLICY_ANNOTATION) != name):
            raise Stalled("ConfigMapConflict", f"ConfigMap {cm_name} exists and does not belong to this policy")
        new_meta = dict(cm_meta)
        new_meta["labels"] = {**(cm_meta.get("labels") or {}), **labels}
        new_meta["annotations"] = {**(cm_meta.get("annotations") or {}), **annotations}
        new_meta["ownerReferences"] = [*[o for o in owners if o.get("uid") != owner["uid"]], owner]
        if current.get("data") == data and new_meta == cm_meta:
            return
        await self.call(kube.replace_configmap, namespace, cm_name, {**current, "metadata": new_meta, "data": data})
        kopf.event(body, type="Normal", reason="PolicyPublished",
                   message=f"ConfigMap {cm_name} updated to generation {policy.policy_generation}")
        logger.info(f"Updated ConfigMap {cm_name} to generation {policy.policy_generation}.")

    async def _inject(self, body: Mapping[str, Any], policy: Policy, sts_name: str, sidecar: Sidecar,
                      logger: logging.Logger | logging.LoggerAdapter[Any]) -> None:
        kube = self._kube()
        namespace = body["metadata"]["namespace"]
        assert policy.target is not None
        sts = await self.call(kube.read_statefulset, namespace, sts_name)
        if sts is None:
            raise Stalled("TargetNotFound", f"StatefulSet {sts_name} not found in namespace {namespace}")
        template = (sts.get("spec") or {}).get("template") or {}
        owner = template_policy(template)
        if owner not in (None, policy.name) and find_sidecar(template.get("spec") or {}) is not None:
            raise Stalled("TargetConflict", f"StatefulSet {sts_name} already carries the sidecar of "
                          f"CompactionPolicy {owner}")
        missing = missing_data_volumes(policy, template.get("spec") or {},
                                       (sts.get("spec") or {}).get("volumeClaimTemplates") or [])
        if missing:
            raise Stalled("DataVolumeNotFound", f"StatefulSet {sts_name} has no volume or volume claim template "
                          f"named {', '.join(map(repr, missing))} (target.dataVolume, additionalDataVolumes)")
        self._refuse_what_the_author_may_not_choose(policy, sts, sidecar)
        patch = template_patch(template, sidecar, sts["metadata"]["resourceVersion"])
        if patch is None:
            return
        await self._admission_dry_run(sts, patch)
        first = find_sidecar(template.get("spec") or {}) is None
        await self.call(kube.patch_statefulset, namespace, sts_name,
                        patch + hold_ops(sts, policy.rollout.strategy, held_by=policy_ref(namespace, str(policy.name))))
        where = "as a native sidecar" if sidecar.native else "as a container"
        message = (f"{'Injected' if first else 'Updated'} the kafka-cleaner sidecar {where} into StatefulSet "
                   f"{sts_name} (sidecar hash {sidecar.hash})")
        reason = "SidecarInjected" if first else "SidecarUpdated"
        kopf.event(body, type="Normal", reason=reason, message=message)
        kopf.event(sts, type="Normal", reason=reason, message=f"{message} by CompactionPolicy {policy.name}")
        logger.info(message + ".")
        if (grace := grace_period_warning(policy, template.get("spec") or {})) is not None:
            kopf.event(body, type="Warning", reason="TerminationGracePeriodTooShort",
                       message=f"StatefulSet {sts_name}: {grace}")

    def _refuse_what_the_author_may_not_choose(self, policy: Policy, sts: Mapping[str, Any],
                                               sidecar: Sidecar) -> None:
        """Before a template patch: an image outside the installer's allow-list, or a data
        volume that is no data volume (a Secret, a hostPath), is ``Stalled``/``PolicyNotAllowed``
        and nothing is patched; the webhook refuses the same (a fail-open webhook is no way
        round it). A template already carrying such a sidecar keeps it until the policy is fixed
        or deleted: taking it out is a roll of its own."""
        template = (sts.get("spec") or {}).get("template") or {}
        refusals = policy_refusals(policy, str(sidecar.container["image"]), template.get("spec") or {},
                                   (sts.get("spec") or {}).get("volumeClaimTemplates") or [],
                                   self.config.sidecar_image_allowlist)
        if refusals:
            raise Stalled("PolicyNotAllowed", f"StatefulSet {sts['metadata']['name']} was not patched: "
                          + "; ".join(refusals))

    async def _admission_dry_run(self, sts: Mapping[str, Any], patch: Sequence[Mapping[str, Any]]) -> None:
        """Before a patch of a StatefulSet's pod template: a server-side dry-run create of the pod
        the patched template makes, so that admission (Pod Security, webhooks, ResourceQuota,
        LimitRange) judges it before any broker is restarted. The StatefulSet controller would
        delete a broker and then be refused its new pod: the broker would stay down. A rejection
        is ``Stalled``/``AdmissionRejected`` with the API server's message, and no patch; the
        message says whether the pod without the change is rejected as well (then the cause is
        not the sidecar, e.g. a ResourceQuota with no room for one more pod: the dry run counts
        it beside the running brokers, while a roll replaces one)."""
        namespace, sts_name = sts["metadata"]["namespace"], sts["metadata"]["name"]
        rejection = await self._dry_run(namespace, pod_from_template(sts, patched(sts, patch)["spec"]["template"]))
        if rejection is None:
            return
        before = await self._dry_run(namespace, pod_from_template(sts))
        blame = (f"the pod without this change is rejected too ({before})" if before is not None
                 else "the pod without this change is admitted")
        raise Stalled("AdmissionRejected", f"StatefulSet {sts_name} was not patched: a dry run of the pod it would "
                      f"create was rejected: {rejection}; {blame}")

    async def _dry_run(self, namespace: str, pod: Mapping[str, Any]) -> str | None:
        """None if the API server would create ``pod``, else why not (its message). Server
        errors, conflicts and throttling propagate (the round is retried)."""
        try:
            await self.call(self._kube().dry_run_pod, namespace, pod)
        except ApiException as exc:
            if exc.status is None or exc.status >= 500 or exc.status in (409, 429):
                raise
            try:
                return str(json.loads(exc.body)["message"])
            except (TypeError, ValueError, KeyError):
                return f"{exc.status} {exc.reason}"
        return None

    async def _remove_stale_injections(self, body: Mapping[str, Any], policy: Policy | None, *, keep: str | None,
                                       logger: logging.Logger | logging.LoggerAdapter[Any]) -> None:
        """Take this policy's sidecar out of every StatefulSet it injected but no longer targets
        (all of them when ``keep`` is None)."""
        kube = self._kube()
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        strategy = policy.rollout.strategy if policy is not None else _strategy(body)
        for sts in await self.call(kube.list_statefulsets, namespace):
            sts_name = sts["metadata"]["name"]
            template = (sts.get("spec") or {}).get("template") or {}
            if sts_name == keep or template_policy(template) != name:
                continue
            patch = removal_patch(template, sts["metadata"]["resourceVersion"])
            if patch is None:
                continue
            await self.call(kube.patch_statefulset, namespace, sts_name,
                            patch + hold_ops(sts, strategy, held_by=policy_ref(namespace, name)))
            message = f"Removed the kafka-cleaner sidecar from StatefulSet {sts_name}"
            kopf.event(body, type="Normal", reason="SidecarRemoved", message=message)
            kopf.event(sts, type="Normal", reason="SidecarRemoved", message=f"{message} (CompactionPolicy {name})")
            logger.info(message + ".")

    async def _overlap(self, policy: Policy, namespace: str, pods: Sequence[BrokerPod] | None) -> str | None:
        """Which other policies of the namespace select some of this policy's pods (or the
        same StatefulSet), as a message naming them and the pods; None when none does. Every
        policy involved says so in its own status (``Degraded``, ``OverlappingPolicies``) and
        an Event, whichever injected: one pod gets one sidecar (the StatefulSet's owner, or
        the webhook's first by name), and the other policy's settings silently do nothing."""
        if policy.target is None:
            return None
        if pods is None:  # the round stalled before listing them
            try:
                pods = (await self._target_pods(policy, namespace)).pods
            except Stalled:
                pods = []
        mine = {pod.name for pod in pods}
        found: list[str] = []
        shared: set[str] = set()
        for manifest in await self.call(self._kube().list_policies, [namespace]):
            if manifest["metadata"]["name"] == policy.name or manifest["metadata"].get("deletionTimestamp"):
                continue
            try:
                other = parse_policy(_manifest(manifest))
            except PolicyError:
                continue  # an invalid policy injects nothing
            if other.target is None:
                continue
            same_sts = (other.target.stateful_set is not None
                        and other.target.stateful_set == policy.target.stateful_set)
            try:
                theirs = {pod.name for pod in (await self._target_pods(other, namespace)).pods}
            except Stalled:
                theirs = set()
            if same_sts or mine & theirs:
                found.append(str(other.name))
                shared |= mine & theirs
        if not found:
            return None
        listed = sorted(shared)
        more = f" and {len(listed) - 10} more" if len(listed) > 10 else ""
        what = f"pods {', '.join(listed[:10])}{more}" if shared else f"StatefulSet {policy.target.stateful_set}"
        return (f"CompactionPolicies {', '.join(sorted(found))} also select {what}: a pod gets the sidecar "
                "of one policy only; make the targets disjoint")

    async def _target_pods(self, policy: Policy, namespace: str) -> Target:
        kube = self._kube()
        target = policy.target
        assert target is not None
        workload: Workload | None = None
        obj: dict[str, Any] | None = None
        if target.pod_selector is not None:
            selector = label_selector_string(target.pod_selector)
        else:
            assert target.stateful_set is not None
            sts = await self.call(kube.read_statefulset, namespace, target.stateful_set)
            if sts is None:
                if policy.paused:
                    return Target([], [])
                raise Stalled("TargetNotFound", f"StatefulSet {target.stateful_set} not found in namespace "
                              f"{namespace}")
            workload, obj = Workload("StatefulSet", target.stateful_set, namespace), sts
            selector = label_selector_string((sts.get("spec") or {}).get("selector") or {})
            if not selector:
                return Target([], [], workload, obj)
        pods, raw = [], []
        for pod in await self.call(kube.list_pods, namespace, selector):
            meta, status = pod.get("metadata") or {}, pod.get("status") or {}
            if status.get("phase") in ("Succeeded", "Failed"):
                continue
            if workload is None:
                owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
                if owner is not None and owner.get("kind") in (STRIMZI_PODSET, "StatefulSet"):
                    workload = Workload(owner["kind"], owner["name"], namespace)
            raw.append(pod)
            if meta.get("deletionTimestamp"):
                continue
            pods.append(broker_pod(pod))
        if workload is not None and obj is None:  # pods selected by label: their owner, for its pod count
            read = kube.read_strimzipodset if workload.kind == STRIMZI_PODSET else kube.read_statefulset
            obj = await self.call(read, namespace, workload.name)
        return Target(pods, raw, workload, obj)

    # -- rollouts --------------------------------------------------------------------------

    async def _roll(self, body: Mapping[str, Any], policy: Policy, target: Target, sidecar: Sidecar | None,
                    wanted: Sidecar | None, scrapes: Mapping[str, Scrape] | None, previous: Mapping[str, Any],
                    rollout: dict[str, Any], logger: logging.Logger | logging.LoggerAdapter[Any], *,
                    elsewhere: str | None = None) -> Outcome:
        """One step of the rollout of ``wanted`` (None: no sidecar) to the target's pods, as
        ``spec.rollout`` says (rollout.py): name what is pending, undo a sidecar that keeps a
        pod from becoming Ready, take the next paced step, release the StatefulSet when done.
        Updates ``rollout`` (status.rollout) in place. ``elsewhere``: why a broker of another
        workload of this policy (a former target) is down: the next paced step waits for it."""
        workload = target.workload
        strategy, deadline = policy.rollout.strategy, policy.rollout.progress_deadline_seconds
        rollout["strategy"] = strategy.value
        if workload is None:
            # A pod selector's workload is known from its pods: none now (a broker between its
            # deletion and its recreation, a StatefulSet scaled to 0). The step and a paced
            # step in flight stay: the pod that comes back is the step's, and a sidecar that
            # keeps it from being scheduled must still be rolled back.
            for key in ("pending", "pendingPods", "gate"):
                rollout.pop(key, None)
            return Outcome()
        kube, now = self._kube(), self.now()
        namespace = workload.namespace
        views = [pod_view(p) for p in target.raw]
        wanted_hash = wanted.hash if wanted is not None else None
        # The sidecar rolled back, while its pods are undone (the spec has not changed it since).
        undone = (rollout.get("rolledBack") or {}).get("sidecarHash") if wanted_hash is None else None
        # The rollout step: which pods it created, and which of those have been Ready.
        step = step_for(Step.from_status(rollout.get("step")), wanted_hash, undone, now)
        if step is not None:
            step = step.seen(views)
            rollout["step"] = step.to_status()
        else:
            rollout.pop("step", None)
        new_step = step if step is not None and wanted_hash is not None else None
        waiting = pending([v for v in views if not v.deleting], wanted_hash)
        # Pods the webhook injects change when they are created, not with the template: the
        # StatefulSet is neither held nor released for them, and only a deletion rolls one.
        templated = policy.target is not None and policy.target.effective_injection is Injection.STATEFUL_SET
        sts = target.obj if workload.kind == "StatefulSet" and templated else None
        rollout["pending"] = len(waiting)
        rollout["pendingPods"] = [{"pod": v.name, "workload": str(workload), "roll": how_to_roll(workload, v.name, sts)}
                                  for v in sorted(waiting, key=lambda v: v.name)[:MAX_PENDING_LISTED]]
        if not waiting:
            rollout.pop("pendingPods")
        ref = policy_ref(namespace, str(policy.name))
        if sts is not None and template_policy((sts.get("spec") or {}).get("template") or {}) == policy.name:
            ops = claim_ops(sts, ref)  # a hold an older release made names its policy from now on
            if ops is not None:
                sts = await self.call(kube.patch_statefulset, namespace, workload.name, ops)

        # -- the strategy changed while pods wait: the hold follows it ---------------------------
        # While a rollback is undone the hold is OnDelete whatever the strategy: a pod deleted
        # under a Manual partition would come back from the current revision, with the sidecar.
        hold = RolloutStrategy.ON_DELETE if undone else strategy
        if sts is not None and waiting:
            ops = rehold_ops(sts, hold)
            if ops is not None:
                sts = await self.call(kube.patch_statefulset, namespace, workload.name, ops)
                logger.info(f"{workload}: held for rollout.strategy {hold.value}" +
                            (" while the rollback is undone." if undone else "."))

        # -- a sidecar that keeps the pods of its rollout step from becoming Ready is taken out ---
        bad = stuck(views, new_step, now, deadline)
        if bad:
            return await self._roll_back(body, policy, workload, sts, bad, wanted_hash, rollout, logger)
        # The rolled-back sidecar's stuck pods (and any recreated from a template that still had
        # it, before the StatefulSet controller or the webhook saw the rollback) are deleted so
        # that they come back without it: one per round, while every other broker is Ready. A
        # StrimziPodSet's too: Strimzi recreates a deleted pod, and the webhook no longer injects.
        if undone:
            undo = stuck(views, step, now, 0.0)
            if undo:
                pick, gate = rollback_gate(views, target.expected, undo, target.obj, template=sts is not None)
                rollout["gate"] = gate or "open"
                if gate is None and pick is not None:
                    await self.call(kube.delete_pod, namespace, pick.name, pick.uid)
                    message = (f"{workload}: deleted pod {pick.name} ({pick.why}): created by the rollout of "
                               f"sidecar {undone}, never Ready; it comes back without the sidecar")
                    kopf.event(body, type="Normal", reason="RollbackDeletedPod", message=message)
                    logger.info(message + ".")
                    rollout["gate"] = f"waiting for {pick.name} to come back without the sidecar"
                return Outcome()

        # -- the paced step in progress ----------------------------------------------------------
        rolling = rollout.get("rolling")
        if rolling is not None:
            view = next((v for v in views if v.name == rolling["pod"] and not v.deleting), None)
            done, why = self._rolled(view, rolling, wanted_hash, scrapes)
            if done:
                rollout.pop("rolling")
                rollout.pop("gate", None)
                kopf.event(body, type="Normal", reason="BrokerRolled", message=f"{workload}: pod {rolling['pod']} "
                           "runs the wanted sidecar, is Ready and reports as before its restart")
            else:
                rollout["gate"] = why
                since = datetime.datetime.fromisoformat(rolling["since"].replace("Z", "+00:00"))
                if (now - since).total_seconds() > deadline:
                    # The step's deadline runs from the deletion, before the pod's creation: a
                    # pod the sidecar keeps from becoming Ready is taken out now, not a round later.
                    if view is not None and stuck([view], new_step, now, 0.0):
                        return await self._roll_back(body, policy, workload, sts, [view], wanted_hash, rollout, logger)
                    return Outcome.stalled("RolloutStalled", f"{workload}: pod {rolling['pod']}, restarted at "
                                           f"{rolling['since']}, has not come back within "
                                           f"rollout.progressDeadlineSeconds ({deadline}s): {why}")
                return Outcome()

        # -- the next paced step ------------------------------------------------------------------
        if strategy is RolloutStrategy.PACED and waiting and scrapes is not None:
            gate = _gate(views, target.expected, scrapes) or (f"waiting: {elsewhere}" if elsewhere else None)
            rollout["gate"] = gate or "open"
            if gate is None:
                if workload.kind == STRIMZI_PODSET:
                    # Asked once per pod: the gate stays open until KafkaRoller has rolled them,
                    # and an Event every round would bury the others.
                    asked = [v for v in waiting if not v.roll_requested]
                    for view in asked:
                        await self.call(kube.annotate_pod, namespace, view.name,
                                        {STRIMZI_MANUAL_ROLLING_UPDATE: "true"})
                    if asked:
                        names = ", ".join(v.name for v in asked)
                        kopf.event(body, type="Normal", reason="RollRequested", message=f"{workload}: asked "
                                   f"Strimzi's KafkaRoller to roll {names} ({STRIMZI_MANUAL_ROLLING_UPDATE})")
                elif sts is not None and not controller_caught_up(sts):
                    # A pod deleted before the StatefulSet controller has seen the new template
                    # comes back from the old one, still waiting: it would be rolled twice.
                    rollout["gate"] = "the StatefulSet controller has not observed the new template yet"
                else:
                    pick = next_to_roll(waiting)
                    assert pick is not None
                    scrape = scrapes.get(pick.name)
                    unsafe = isr_wait_before(pick.name, scrape.report if scrape is not None else None)
                    if unsafe is not None:
                        rollout["gate"] = unsafe
                    else:
                        await self._delete_for_roll(body, namespace, workload, pick, previous, rollout, now, logger)
        elif not waiting:
            rollout.pop("gate", None)

        # -- done: the StatefulSet gets its own update strategy back ------------------------------
        # Only once every pod it should have is there and none is on its way out: a pod that is
        # being replaced must come back under the hold.
        if sts is not None and not waiting and "rolling" not in rollout and _settled(views, target.expected) and (
                held_by(sts) in (None, ref)):  # another policy's hold is that policy's rollout
            ops = release_ops(sts)
            if ops is not None:
                await self.call(kube.patch_statefulset, namespace, workload.name, ops)
                kopf.event(body, type="Normal", reason="RolloutComplete", message=f"{workload}: every pod runs "
                           "the wanted sidecar; its own updateStrategy is back")
        return Outcome()

    async def _delete_for_roll(self, body: Mapping[str, Any], namespace: str, workload: Workload, pick: PodView,
                               previous: Mapping[str, Any], rollout: dict[str, Any], now: datetime.datetime,
                               logger: logging.Logger | logging.LoggerAdapter[Any]) -> None:
        """A paced step: delete ``pick`` so that it comes back from the template with the wanted
        sidecar, and remember it (``rollout.rolling``) until it is back (:meth:`_rolled`)."""
        before = ((previous.get("brokers") or {}).get(pick.name) or {}).get("partitions")
        await self.call(self._kube().delete_pod, namespace, pick.name, pick.uid)
        rollout["rolling"] = {"pod": pick.name, "uid": pick.uid, "since": format_time(now),
                              **({"partitionsBefore": before} if before is not None else {})}
        message = f"{workload}: deleted pod {pick.name} so that it comes back with the wanted sidecar"
        kopf.event(body, type="Normal", reason="RollingBroker", message=message)
        logger.info(message + ".")
        rollout["gate"] = f"waiting for {pick.name} to come back"

    @staticmethod
    def _rolled(view: PodView | None, rolling: Mapping[str, Any], wanted: str | None,
                scrapes: Mapping[str, Scrape] | None) -> tuple[bool, str]:
        """Whether the broker the operator restarted is back: recreated, Ready, running the
        wanted sidecar, and (with a sidecar) reporting, scanned, and holding at least as many
        partitions as before its restart. Else why not."""
        pod = rolling["pod"]
        if view is None or view.uid == rolling.get("uid"):
            return False, f"waiting for {pod} to be recreated"
        if view.sidecar_hash != wanted:
            return False, f"{pod} came back without the wanted sidecar"
        if not view.ready:
            return False, f"{pod} is not Ready" + (f" ({view.why})" if view.why else "")
        if wanted is None:
            return True, ""
        if scrapes is None:
            return False, f"waiting for the report of {pod}"
        scrape = scrapes.get(pod)
        if scrape is None or scrape.report is None:
            return False, f"no report from {pod}" + (f": {scrape.error}" if scrape and scrape.error else "")
        if not scrape.report.get("scannedAt"):
            return False, f"{pod} has not finished its first scan"
        held = sum(d["partitions"] for d in scrape.report["logDirs"])
        before = rolling.get("partitionsBefore")
        if before is not None and held < before:
            return False, (f"{pod} reports {held} partitions in its log dirs, {before} before its restart: "
                           "replicas are missing (under-replicated as far as the reports can tell)")
        restarted = datetime.datetime.fromisoformat(rolling["since"].replace("Z", "+00:00"))
        behind = isr_wait_after(pod, scrape.report, restarted)
        if behind is not None:
            return False, behind
        return True, ""

    async def _roll_back(self, body: Mapping[str, Any], policy: Policy, workload: Workload,
                         sts: Mapping[str, Any] | None, bad: list[PodView], wanted: str | None,
                         rollout: dict[str, Any], logger: logging.Logger | logging.LoggerAdapter[Any]) -> Outcome:
        """Take the sidecar out of the template whose new pods it keeps from becoming Ready
        (``sts``; None: the webhook injected it, and ``rolledBack`` stops it), held ``OnDelete``
        whatever the strategy, so that a deleted pod comes back from the template without the
        sidecar. Nothing is deleted in this round: later rounds delete a StatefulSet's stuck
        pods one at a time (a StatefulSet never replaces a pod that is not Ready by itself:
        Kubernetes' forced-rollback limitation), once the StatefulSet controller and the
        webhook have seen the rollback; a StrimziPodSet's the same way (Strimzi recreates a
        deleted pod, which the webhook then leaves without the sidecar)."""
        kube = self._kube()
        names = ", ".join(f"{v.name} ({v.why or 'not Ready'})" for v in bad)
        deadline = policy.rollout.progress_deadline_seconds
        message = (f"{workload}: pod {names} runs sidecar {wanted}, was created by its rollout and has not "
                   f"become Ready within rollout.progressDeadlineSeconds ({deadline}s)")
        if workload.kind == "StatefulSet":
            if sts is not None:
                template = (sts.get("spec") or {}).get("template") or {}
                patch = removal_patch(template, sts["metadata"]["resourceVersion"])
                if patch is not None:
                    await self.call(kube.patch_statefulset, workload.namespace, workload.name,
                                    patch + hold_ops(sts, RolloutStrategy.ON_DELETE,
                                                     held_by=policy_ref(workload.namespace, str(policy.name))))
            where = "removed from the pod template" if sts is not None else "no longer injected by the webhook"
            message += (f"; the sidecar was {where}, and such pods are deleted one at a time while every other "
                        "broker is Ready, so each comes back without it. Fix the sidecar in the spec (image, "
                        "resources, securityContext) to try again")
        else:
            message += ("; the webhook no longer injects this sidecar, and such pods are deleted one at a time "
                        "while every other broker is Ready, so Strimzi recreates each without it. Fix the sidecar "
                        "in the spec to try again")
        rollout["rolledBack"] = {"sidecarHash": wanted, "at": format_time(self.now()), "message": message[:4096]}
        rollout.pop("rolling", None)
        kopf.event(body, type="Warning", reason="SidecarRolledBack", message=message)
        logger.warning(message)
        return Outcome.stalled("SidecarRolledBack", message)

    # -- deletion --------------------------------------------------------------------------

    async def remove(self, body: Mapping[str, Any], logger: logging.Logger | logging.LoggerAdapter[Any]) -> None:
        """The finalizer's work: the sidecar out of every StatefulSet, the ConfigMap deleted."""
        kube = self._kube()
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        state = self.state(body)
        async with state.lock:
            # First of all the sidecars stop: they stay in the pods until these are recreated
            # (a Manual policy: until a person rolls them), and a deleted policy must not clean.
            await self._pause_configmap(body, logger)
            held = self._held(state, body)
            if held and self.config.race_guard_bootstrap:  # what the guard holds goes back as it was
                await self._guard(body, state, held, {}, sorted(held))
                if held:  # not set back (RaceGuardFailed says why): the deletion waits, tried again
                    raise kopf.TemporaryError(f"the race guard could not set back the configs of topic(s) "
                                              f"{', '.join(sorted(held))}", delay=30)
            await self._remove_stale_injections(body, None, keep=None, logger=logger)
            await self._await_removal(body, logger)
            cm_name = configmap_name(name)
            current = await self.call(kube.read_configmap, namespace, cm_name)
            if current is not None and any(o.get("uid") == meta["uid"]
                                           for o in (current.get("metadata") or {}).get("ownerReferences") or []):
                await self.call(kube.delete_configmap, namespace, cm_name)
                logger.info(f"Deleted ConfigMap {cm_name}.")
            target = (body.get("spec") or {}).get("target") or {}
            if target.get("podSelector") or target.get("injection") == Injection.WEBHOOK.value:
                kopf.event(body, type="Normal", reason="WebhookPodsUnchanged",
                           message="pods the webhook injected keep the sidecar until they are recreated")
        self.policies.pop(meta["uid"], None)
        metrics.forget_policy(namespace, name)

    async def _pause_configmap(self, body: Mapping[str, Any],
                               logger: logging.Logger | logging.LoggerAdapter[Any]) -> None:
        """The policy's ConfigMap as its sidecars read it now, with ``spec.paused: true``: every
        sidecar stops cleaning, staging and committing (a staged set is discarded, never
        committed) once the kubelet has the new file, whatever the mode, and does nothing else
        until its pod is recreated without it. The ConfigMap goes once no pod runs the sidecar."""
        kube = self._kube()
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        cm_name = configmap_name(name)
        current = await self.call(kube.read_configmap, namespace, cm_name)
        if current is None or not any(o.get("uid") == meta["uid"]
                                      for o in (current.get("metadata") or {}).get("ownerReferences") or []):
            return
        policy: Policy | None = None
        for text in ((current.get("data") or {}).get(CONFIGMAP_KEY), None):
            try:
                source = yaml.safe_load(text) if text is not None else _manifest(body)
                policy = parse_policy(source, source=f"ConfigMap {cm_name}", unknown_fields=[])
                break
            except (PolicyError, yaml.YAMLError, TypeError, AttributeError):
                continue
        if policy is None:
            # Nothing the sidecars could read as paused: without a file they stop too (a
            # deleted policy) and discard their staged sets.
            await self.call(kube.delete_configmap, namespace, cm_name)
            logger.warning(f"Deleted ConfigMap {cm_name}: it held no policy that could be paused.")
            return
        if policy.paused:
            return
        paused = dataclasses.replace(policy, paused=True)
        header = (f"# Written by {MANAGED_BY}: CompactionPolicy {namespace}/{name} is being deleted; its "
                  "sidecars are paused until their pods are recreated without them.\n")
        data = {**(current.get("data") or {}), CONFIGMAP_KEY: header + yaml.safe_dump(paused.to_manifest(),
                                                                                       sort_keys=False)}
        await self.call(kube.replace_configmap, namespace, cm_name, {**current, "data": data})
        kopf.event(body, type="Normal", reason="PolicyPaused",
                   message=f"ConfigMap {cm_name}: the policy is being deleted; its sidecars are paused")
        logger.info(f"Paused the sidecars of ConfigMap {cm_name} (the policy is being deleted).")

    async def _await_removal(self, body: Mapping[str, Any],
                             logger: logging.Logger | logging.LoggerAdapter[Any]) -> None:
        """Deletion follows ``spec.rollout`` too: the finalizer stays until no pod of the
        target StatefulSet, nor of any other StatefulSet this policy holds (a former target:
        ``kafkacleaner.io/held-by``), runs the sidecar (Paced: the operator rolls them one at a
        time, while every pod of all of them is Ready; Manual and OnDelete: a person does),
        and each StatefulSet gets its own update strategy back as soon as it is done (or where
        that restarts nothing: ``rollout.drain``). Polls every reporting interval (an Event
        names the pods and how to roll them when they change); the operator stopping
        meanwhile resumes it later."""
        kube = self._kube()
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        ref = policy_ref(namespace, name)
        target = (body.get("spec") or {}).get("target") or {}
        sts_name = target.get("statefulSet") if target.get("injection") != Injection.WEBHOOK.value else None
        strategy, told = _strategy(body), ""
        while True:
            left: list[Former] = []
            for sts in await self.call(kube.list_statefulsets, namespace):
                this = sts["metadata"]["name"]
                holder = held_by(sts)
                # The target's hold may name no policy (made by an older release); any other
                # StatefulSet is this policy's only if its hold names it.
                if holder != ref and not (this == sts_name and holder is None):
                    continue
                owner = template_policy((sts.get("spec") or {}).get("template") or {})
                if owner is not None and owner != name:
                    # Another policy's sidecar is in the template (this one stalled on a
                    # TargetConflict, or another took the StatefulSet over): a hold is that
                    # policy's rollout, and releasing it would roll every broker at once.
                    continue
                workload = Workload("StatefulSet", this, namespace)
                selector = label_selector_string((sts.get("spec") or {}).get("selector") or {})
                views = [pod_view(p) for p in await self.call(kube.list_pods, namespace, selector)] if selector else []
                step = drain(workload, sts, views, name, paced=strategy is RolloutStrategy.PACED)
                if owner == name:  # the removal patch did not go through yet: nothing is done
                    step = dataclasses.replace(step, release=False, delete=None)
                if step.release:
                    await self._release(body, workload, sts, ref, logger)
                    continue
                left.append(Former(workload, sts, step))
            if not left:
                return
            busy = next((f.drain.busy for f in left if f.drain.busy), None)
            pick = next((f for f in left if f.drain.delete is not None), None)
            if busy is None and pick is not None:  # one broker down at a time, across them all
                pod = pick.drain.delete
                assert pod is not None
                await self.call(kube.delete_pod, namespace, pod.name, pod.uid)
                logger.info(f"{pick.workload}: deleted pod {pod.name} so that it comes back without the sidecar.")
            waiting = [(f, v) for f in left for v in f.drain.waiting]
            how = "; ".join(f"{v.name}: {how_to_roll(f.workload, v.name, f.sts)}"
                            for f, v in waiting[:MAX_PENDING_LISTED])
            where = ", ".join(str(f.workload) for f in left)
            message = (f"waiting for {len(waiting)} pod(s) of {where} to be recreated without the sidecar "
                       f"(rollout.strategy {strategy.value}): {how}")
            if waiting and message != told and strategy is not RolloutStrategy.PACED:
                kopf.event(body, type="Normal", reason="AwaitingRollout", message=message[:1024])
                logger.info(message + ".")
                told = message
            await asyncio.sleep(_interval(body))

    # -- the webhook -----------------------------------------------------------------------

    async def fail_open(self, body: Mapping[str, Any], patch: kopf.Patch, warnings: list[str],
                        manifests: Sequence[Mapping[str, Any]], error: BaseException) -> None:
        """Admit the pod unchanged when the mutation failed: a broker pod must never be refused
        (kopf would answer ``allowed: false``; ``failurePolicy: Ignore`` covers only a webhook
        that does not answer). The pod gets a warning, the policies in its namespace an Event."""
        patch.fns.clear()
        patch.clear()
        meta = body.get("metadata") or {}
        pod = f"{meta.get('namespace')}/{meta.get('name') or (meta.get('generateName') or '') + '*'}"
        message = (f"kafka-cleaner: the sidecar was not injected into pod {pod} ({type(error).__name__}: {error}); "
                   "the pod was admitted unchanged")
        warnings.append(message)
        log.warning("webhook failed open: %s", message)
        metrics.WEBHOOK_FAILURES.inc()
        for manifest in manifests:
            try:
                await self.call(self._kube().create_event, manifest, "Warning", "InjectionFailed", message)
            except Exception as e:  # the pod is admitted all the same
                log.warning("cannot post the InjectionFailed Event on %s: %s", manifest["metadata"]["name"], e)

    def _report_overlap(self, pod: Mapping[str, Any], manifests: Sequence[Mapping[str, Any]],
                        choice: Choice) -> None:
        """A Warning Event on every policy that selects the pod being admitted (not only a
        warning to whoever created the pod), posted in the background: the admission answer
        must not wait for it. The policies' own rounds report the overlap in their status."""
        meta = pod.get("metadata") or {}
        name = meta.get("name") or (meta.get("generateName") or "") + "*"
        message = (f"pod {name}: CompactionPolicies {', '.join(choice.overlapping)} all select it; only "
                   f"{choice.overlapping[0]} injects its sidecar (make the targets disjoint)")

        async def post() -> None:
            for manifest in manifests:
                if manifest["metadata"]["name"] in choice.overlapping:
                    try:
                        await self.call(self._kube().create_event, manifest, "Warning", "OverlappingPolicies",
                                        message)
                    except Exception as e:
                        log.warning("cannot post the OverlappingPolicies Event on %s: %s",
                                    manifest["metadata"]["name"], e)

        task = asyncio.get_running_loop().create_task(post())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def mutate_pod(self, body: Mapping[str, Any], patch: kopf.Patch, warnings: list[str],
                         manifests: Sequence[Mapping[str, Any]], dryrun: bool = False) -> None:
        pod = json.loads(json.dumps(dict(body)))
        choice = choose_policy(pod, manifests)
        warnings.extend(choice.warnings)
        if choice.overlapping:
            self._report_overlap(pod, manifests, choice)
        policy = choice.policy
        if policy is None:
            return
        manifest = next(m for m in manifests if (m.get("metadata") or {}).get("name") == policy.name)
        rollout = dict((manifest.get("status") or {}).get("rollout") or {})
        sidecar = await self._expected_sidecar(policy, rollout, strict=False)
        if sidecar is None:
            warnings.append(f"kafka-cleaner: CompactionPolicy {policy.name} has no sidecar image: no sidecar injected")
            return
        if (rollout.get("rolledBack") or {}).get("sidecarHash") == sidecar.hash:
            warnings.append(f"kafka-cleaner: the sidecar of CompactionPolicy {policy.name} was rolled back "
                            "(status.rollout.rolledBack): no sidecar injected")
            return
        if self._refused_in_webhook(pod, policy, manifest, sidecar, warnings):
            return
        injected = inject_into_pod(pod, sidecar)
        if not dryrun and find_sidecar(pod.get("spec") or {}) is None:  # our own dry run's pod has it
            refused = await self.call(admission_rejection, self._kube(), injected, self.config.webhook_timeout)
            for reason, message in warn_about_injection(policy, injected, refused):
                warnings.append(message)
                post_event(self._background, self._kube(), manifest, reason, message)
            if refused is not None:
                return

        def transform(raw: dict[str, Any]) -> None:
            raw.clear()
            raw.update(injected)

        patch.fns.append(transform)
        metrics.WEBHOOK_INJECTIONS.labels(policy.namespace or "", policy.name or "").inc()


    def _refused_in_webhook(self, pod: Mapping[str, Any], policy: Policy, manifest: Mapping[str, Any],
                            sidecar: Sidecar, warnings: list[str]) -> bool:
        """Whether the policy chose what its author may not (an image outside the allow-list, a
        Secret or hostPath as a data volume): the pod is then admitted without the sidecar, its
        creator warned and a ``PolicyNotAllowed`` Warning Event posted on the policy. Refusing
        the pod itself would keep a broker from starting."""
        refusals = policy_refusals(policy, str(sidecar.container["image"]), pod.get("spec") or {}, (),
                                   self.config.sidecar_image_allowlist)
        if not refusals:
            return False
        meta = pod.get("metadata") or {}
        name = meta.get("name") or (meta.get("generateName") or "") + "*"
        message = (f"kafka-cleaner: the sidecar of CompactionPolicy {policy.name} was not injected into pod {name}: "
                   + "; ".join(refusals))
        warnings.append(message)
        post_event(self._background, self._kube(), manifest, "PolicyNotAllowed", message)
        return True


#: Stalled reasons of a rollout (kafka_cleaner_operator_rollout_stalled).
ROLLOUT_STALL_REASONS = ("RolloutStalled", "SidecarRolledBack")


def _strategy(body: Mapping[str, Any]) -> RolloutStrategy:
    """``spec.rollout.strategy`` of a manifest (the default when unset or not valid)."""
    raw = ((body.get("spec") or {}).get("rollout") or {}).get("strategy")
    try:
        return RolloutStrategy(raw) if raw else RolloutStrategy.MANUAL
    except ValueError:
        return RolloutStrategy.MANUAL


def _hint(rollout: Mapping[str, Any]) -> str:
    """How the pending pods get the wanted sidecar, for the AwaitingRollout condition."""
    listed = rollout.get("pendingPods") or []
    if not listed:
        return ""
    strategy = rollout.get("strategy")
    if strategy == RolloutStrategy.PACED.value:
        return f"; the operator rolls them one at a time ({rollout.get('gate') or 'next round'})"
    who = "a person or the Kafka operator rolls them" if strategy == RolloutStrategy.MANUAL.value else \
        "each gets it when it is recreated"
    return f"; rollout.strategy {strategy}: {who}, e.g. {listed[0]['roll']} (status.rollout.pendingPods)"


def _settled(views: Sequence[PodView], expected: Sequence[str] | None) -> bool:
    """Every pod the workload should have exists and none is being deleted."""
    present = {v.name for v in views if not v.deleting}
    return not any(v.deleting for v in views) and all(name in present for name in expected or ())


def _gate(views: Sequence[PodView], expected: Sequence[str] | None, scrapes: Mapping[str, Scrape]) -> str | None:
    """Why the next paced step must wait (None: go): every expected pod exists and is Ready,
    nobody is being replaced, and every sidecar that runs answers with a valid report."""
    present = {v.name for v in views}
    missing = [n for n in expected or () if n not in present]
    if missing:
        return f"waiting: {', '.join(missing)} missing"
    busy = [v.name for v in views if v.deleting or not v.ready]
    if busy:
        return f"waiting: {', '.join(busy)} not Ready"
    silent = [f"{pod} ({s.error})" for pod, s in sorted(scrapes.items()) if s.report is None]
    if silent:
        return f"waiting: no report from {', '.join(silent)}"
    return None


def _interval(body: Mapping[str, Any]) -> float:
    try:
        return float(((body.get("spec") or {}).get("reporting") or {}).get("intervalSeconds") or 30)
    except (TypeError, ValueError):
        return 30.0


DAEMON_POLL_S = 0.2
"""How often an idle report daemon looks at its stop flag and its policy's spec."""

DAEMON_EXIT_WAIT_S = 5.0
"""How long kopf waits for a deleted policy's report daemon to end by itself (kopf's
``background.instant_exit_timeout``). An idle one ends within ``DAEMON_POLL_S``; kopf's default
waits only a few event-loop cycles, then holds the finalizer for the daemon's whole
``cancellation_backoff``: every policy deletion took 10 s longer."""


async def _until_next_round(stopped: kopf.DaemonStopped, body: Mapping[str, Any]) -> None:
    """Until the policy's next reporting round: ``reporting.intervalSeconds`` after this one, or
    at once when its spec changes (a person who lowers the interval, or switches the rollout to
    Paced, sees it acted on now rather than at the end of the old interval: kopf keeps a
    daemon's ``body`` current), or until the daemon is asked to stop. Not kopf's
    ``stopped.wait(t)``: it waits in a task of its own, and when the daemon is cancelled (the
    operator stopping) just as ``t`` runs out, that task is left with a TimeoutError nobody
    reads, which kopf re-raises at exit: the operator ended a SIGTERM with exit code 1 and a
    traceback (a fresh-clone CI run of ``test_two_replicas_elect_a_leader_and_hand_over``)."""
    loop = asyncio.get_running_loop()
    began, generation = loop.time(), (body.get("metadata") or {}).get("generation")
    while (not stopped and (body.get("metadata") or {}).get("generation") == generation
           and (left := began + _interval(body) - loop.time()) > 0):
        await asyncio.sleep(min(left, DAEMON_POLL_S))


def build_settings(config: OperatorConfig, settings: kopf.OperatorSettings | None = None, *,
                   operator: Operator | None = None) -> kopf.OperatorSettings:
    """kopf's settings for this configuration (on top of ``settings`` if given). With
    ``operator``, the webhook server listens only once its policy index is complete."""
    settings = settings or kopf.OperatorSettings()
    settings.persistence.finalizer = FINALIZER
    # Only warnings and errors of the handlers' logs become Events; the operator posts its
    # own Normal events explicitly (kopf.event), so rounds every few seconds do not flood.
    settings.posting.level = logging.WARNING
    settings.background.instant_exit_timeout = DAEMON_EXIT_WAIT_S
    if config.webhook_enabled:
        settings.admission.server = webhook_server(
            config, gate=operator.policies_indexed if operator else None,
            listening=operator.webhook_ready if operator else None)
        # Never kopf's: the chart deploys the configuration, or the server publishes the
        # operator's own (webhook.webhook_configuration, the chart's field for field).
        settings.admission.managed = None
    return settings


def watch_scope(config: OperatorConfig) -> str:
    """What the operator reconciles, said once at start: a policy in a namespace it does not
    watch is invisible to it (its RBAC covers the watched namespaces only), so the log is where
    a person finds out why such a policy gets no status."""
    if config.clusterwide:
        return "Reconciling CompactionPolicies in every namespace (KAFKA_CLEANER_WATCH_NAMESPACES is empty)."
    return (f"Reconciling CompactionPolicies in namespace(s) {', '.join(config.namespaces)} only "
            "(KAFKA_CLEANER_WATCH_NAMESPACES; the chart's watchNamespaces): policies in any other namespace "
            "are not acted on and get no status.")


def build_registry(config: OperatorConfig, operator: Operator | None = None, *,
                   webhook_only: bool = False) -> kopf.OperatorRegistry:
    """A kopf registry with the operator's handlers (a fresh one per call, so an operator can be
    run several times in one process; the webhook handler only when the webhook is enabled).

    ``webhook_only``: just the admission webhook (and the index of policies it reads), for
    replicas that are not the elected leader: every replica behind the webhook Service answers,
    while only the leader reconciles.
    """
    op = operator or Operator(config)
    registry = kopf.OperatorRegistry()

    # A fresh registry has none of kopf's fallback logins: log in the way kopf would by default
    # with the kubernetes client installed (in-cluster service account, else the kubeconfig).
    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(registry=registry)
    async def startup(logger: logging.Logger, **kwargs: Any) -> None:
        logger.info(watch_scope(config))
        await op.start(logger)
        if config.webhook_enabled:
            # kopf's indices are passed to startup handlers too (empty now, filled later).
            op.index_watch = asyncio.create_task(op.await_policies_indexed(kwargs["policies"]))

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        op.webhook_ready.clear()
        op.policies_indexed.clear()
        if op.index_watch is not None:
            op.index_watch.cancel()
        await op.stop()

    if webhook_only and not config.webhook_enabled:
        raise ValueError("a webhook-only registry needs the webhook enabled")
    if not webhook_only:
        _register_reconciliation(registry, op)
    if config.webhook_enabled:
        _register_webhook(registry, op, config)
    return registry


def _register_reconciliation(registry: kopf.OperatorRegistry, op: Operator) -> None:
    resource = (GROUP, VERSION, PLURAL)

    async def reconcile(body: kopf.Body, logger: logging.Logger, **_: Any) -> None:
        try:
            await op.round(body, scrape=False, logger=logger)
        except ApiException as exc:
            raise kopf.TemporaryError(f"Kubernetes API error {exc.status} {exc.reason}", delay=5) from exc

    kopf.on.create(*resource, id="reconcile", registry=registry)(reconcile)
    kopf.on.update(*resource, id="reconcile", registry=registry)(reconcile)
    kopf.on.resume(*resource, id="reconcile", registry=registry)(reconcile)

    @kopf.on.delete(*resource, id="cleanup", registry=registry)
    async def delete(body: kopf.Body, logger: logging.Logger, **_: Any) -> None:
        try:
            await op.remove(body, logger)
        except ApiException as exc:
            raise kopf.TemporaryError(f"Kubernetes API error {exc.status} {exc.reason}", delay=5) from exc

    # A round in progress when the policy is deleted (or the operator stops) finishes first:
    # kopf sets ``stopped`` and waits up to ``cancellation_backoff`` before it cancels the task.
    # Without it kopf cancels at once, mid-round (a status patch half sent, a thread left behind,
    # and a "cancelled. Will escalate." warning), whenever the deletion meets a running round.
    @kopf.daemon(*resource, id="report", cancellation_backoff=10.0, cancellation_timeout=10.0, registry=registry)
    async def report(body: kopf.Body, stopped: kopf.DaemonStopped, logger: logging.Logger, **_: Any) -> None:
        while not stopped and not op.stopped:  # a daemon started again while the operator stops
            try:
                await op.round(body, scrape=True, logger=logger)
            except asyncio.CancelledError:
                raise
            except ApiException as exc:
                log.warning("Reporting round of %s/%s failed: %s %s", body.metadata.namespace, body.metadata.name,
                            exc.status, exc.reason)
            except Exception:
                log.exception("Reporting round of %s/%s failed", body.metadata.namespace, body.metadata.name)
            await _until_next_round(stopped, body)


def _register_webhook(registry: kopf.OperatorRegistry, op: Operator, config: OperatorConfig) -> None:
    @kopf.index(GROUP, VERSION, PLURAL, id="policies", registry=registry)
    def policies(body: kopf.Body, namespace: str, **_: Any) -> dict[str, dict[str, Any]]:
        manifest = _manifest(body)
        manifest["status"] = {"rollout": dict((body.get("status") or {}).get("rollout") or {})}
        return {namespace: manifest}

    selector = {key: kopf.PRESENT if value is None else value for key, value in config.webhook_object_selector}

    @kopf.on.mutate("", "v1", "pods", id=WEBHOOK_ID, operations=["CREATE"], ignore_failures=True,
                    persistent=True, side_effects=False, labels=selector or None, registry=registry)
    async def inject(body: kopf.Body, patch: kopf.Patch, warnings: list[str], policies: kopf.Index[str, Any],
                     dryrun: bool, **_: Any) -> None:
        namespace = body.metadata.namespace
        if not namespace:
            return
        manifests = list(policies.get(namespace, []))
        try:
            await op.mutate_pod(body, patch, warnings, manifests, dryrun)
        except Exception as e:  # the webhook fails open, whatever went wrong
            await op.fail_open(body, patch, warnings, manifests, e)


