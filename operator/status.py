"""A CompactionPolicy's status, from the sidecars' ``/status`` reports: pure functions.

The operator is the only writer of the status. Each round (a reconcile, or a tick of the
policy's reporting loop) it lists the target pods, pulls each sidecar's report, and calls
:func:`build_status` with what it saw and the status it read; the result is the whole new
status, and :func:`status_patch` the merge patch that turns the old one into it.

What goes where (crds/compactionpolicy.yaml declares every field; nothing else is written,
since the API server prunes unknown fields):

* ``brokers.<pod>``: a summary of that sidecar's last good report, ``reportedAt`` (when the
  operator got it) and ``missedReports`` (rounds in a row without one). A map keyed by pod, so
  entries never clobber each other; pods that left the target are dropped.
* ``summary``: totals over the brokers whose reports are not stale.
* ``topPartitions``: the top ``reporting.topPartitions`` partitions by cleanable ratio over all
  brokers (a broker that missed a round keeps its last entries until it turns stale).
* ``divergingPartitions``: partitions whose replicas diverge beyond what their dirty sections
  explain (``divergence``), compared over the reports pulled in the same round; their count is
  ``summary.divergingPartitions`` and the condition ``ReplicasDiverge`` names the first.
* ``ReplicationRaceRisk``: a replica out of the ISR or offline has not replicated a tombstone or
  transaction marker that another replica's cleaner may remove (``divergence.replication_race_risks``,
  over the reports of the same round); the message names the soonest, with the time it may go
  (absolute, so that the message does not change every round). The seconds left are the
  gauge ``kafka_cleaner_operator_replication_race_seconds_left`` and the Events'
  (:func:`race_risk_events`).
* ``conditions``: ``Ready``, ``Reconciling``, ``Stalled``, ``Degraded``, ``ReplicasDiverge``,
  ``ReplicationRaceRisk`` (metav1.Condition),
  upserted by type; ``lastTransitionTime`` moves only when a condition's status flips.
* ``observedGeneration`` on every write (and in every condition), ``paused``.

A broker is stale after :data:`STALE_AFTER` rounds without a report, which makes the policy
Degraded with the pod named. Everything is bounded so the status stays well under 256 KiB
with 100 brokers (tests check it).

The status is *written* only when it changed meaningfully (:func:`status_to_write`), not on
every round: 50 brokers with 200 top partitions make an 82 KiB status, and a round in which
only ``reportedAt`` moved would otherwise patch some 23 KiB every 30 s. A meaningful change
writes just the parts that changed; a heartbeat (:data:`HEARTBEAT_SECONDS`) writes everything,
so ``reportedAt`` is never older than that and a reader can tell a status that is quiet from
one nobody updates.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jsonschema
from compaction_operator.divergence import MAX_DIVERGING, RaceRisk, diverging_partitions, replication_race_risks
from compaction_operator.sidecar_schema import SCHEMA, VERSION

from cleaner.config import Policy, RolloutStrategy

__all__ = [
    "CONDITION_TYPES",
    "HEARTBEAT_SECONDS",
    "MAX_BROKERS",
    "STALE_AFTER",
    "BrokerPod",
    "Outcome",
    "OutcomeKind",
    "Scrape",
    "build_status",
    "format_time",
    "meaningful_change",
    "parse_report",
    "race_risk_events",
    "race_risk_message",
    "race_risks",
    "status_patch",
    "status_to_write",
    "upsert_condition",
]

#: Rounds without a report after which a broker is stale and the policy Degraded.
STALE_AFTER = 3
#: status.brokers holds at most this many entries (the CRD's maxProperties).
MAX_BROKERS = 1000
#: A broker's last error, and the free-text fields of a top partition (the CRD allows 4096:
#: kept shorter so that 100 brokers fit the budget below).
MAX_BROKER_MESSAGE = 512
MAX_TEXT = 256
MAX_CONDITION_MESSAGE = 32768
#: The status stays under this (JSON, compact); topPartitions is trimmed to fit. With the caps
#: above, 100 brokers with the longest names Kubernetes allows take about 110 KiB.
STATUS_BUDGET = 200 * 1024
#: Pods named in a condition message before "and N more".
MAX_NAMED_PODS = 10
AWAITING_MANUAL_ROLLOUT = "AwaitingManualRollout"
"""The reason while pods wait for a roll the operator does not make (``rollout.strategy``
Manual or OnDelete): Ready is False, Reconciling False."""
CONDITION_TYPES = ("Ready", "Reconciling", "Stalled", "Degraded", "ReplicasDiverge", "ReplicationRaceRisk")
RACE_RISK = "ReplicationRaceRisk"
#: The one reason for a condition that holds (Stalled=False and so on) when nothing is wrong.
RECONCILED = "Reconciled"

_VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def format_time(moment: datetime.datetime) -> str:
    """RFC 3339 in UTC with second precision, as Kubernetes writes its own timestamps."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(text: str) -> datetime.datetime:
    moment = datetime.datetime.fromisoformat(text)
    if moment.tzinfo is None:
        raise ValueError(f"timestamp without a time zone: {text!r}")
    return moment


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BrokerPod:
    """A target pod as the operator saw it: does it carry the sidecar, and which one."""

    name: str
    ip: str | None = None
    has_sidecar: bool = True
    #: The pod's ``kafkacleaner.io/sidecar-hash`` (None: none, e.g. injected by hand).
    sidecar_hash: str | None = None
    port: int | None = None


@dataclasses.dataclass(frozen=True)
class Scrape:
    """One pull of a sidecar's ``/status``: the validated report, or why there is none."""

    report: Mapping[str, Any] | None = None
    error: str | None = None


def parse_report(raw: bytes | str | Mapping[str, Any], pod: str) -> Scrape:
    """A :class:`Scrape` from a response body: JSON, valid against the v1 schema, with
    timestamps the API server will accept (they are copied into the CR's status)."""
    try:
        doc = json.loads(raw) if isinstance(raw, bytes | str) else raw
    except ValueError as exc:
        return Scrape(error=f"invalid /status from {pod}: not JSON ({exc})")
    if isinstance(doc, Mapping) and doc.get("version") not in (VERSION, None):
        return Scrape(error=f"/status of {pod} is version {doc.get('version')!r}; this operator reads "
                            f"version {VERSION}")
    error = next(iter(sorted(_VALIDATOR.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))), None)
    if error is not None:
        where = "/".join(map(str, error.absolute_path)) or "<document>"
        return Scrape(error=f"invalid /status from {pod}: {where}: {error.message}"[:MAX_BROKER_MESSAGE])
    try:
        for text in _timestamps(doc):
            _parse_time(text)
    except ValueError as exc:
        return Scrape(error=f"invalid /status from {pod}: bad timestamp ({exc})"[:MAX_BROKER_MESSAGE])
    return Scrape(report=doc)


def _timestamps(doc: Mapping[str, Any]) -> Iterable[str]:
    candidates = [doc.get("scannedAt"), doc["cleaner"].get("lastRunAt")]
    candidates += [p.get("lastCleanedAt") for p in doc["partitions"]]
    return [t for t in candidates if t is not None]


class OutcomeKind(enum.Enum):
    OK = "ok"
    STALLED = "stalled"
    PAUSED = "paused"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What the reconcile part of the round did: the sidecar and ConfigMap are in place (OK),
    it cannot proceed without a change by the user (STALLED, with a reason such as
    ``InvalidSpec``), or ``spec.paused`` kept it from changing anything (PAUSED)."""

    kind: OutcomeKind = OutcomeKind.OK
    reason: str = RECONCILED
    message: str = ""

    @classmethod
    def stalled(cls, reason: str, message: str) -> Outcome:
        return cls(OutcomeKind.STALLED, reason, message)

    @classmethod
    def paused(cls) -> Outcome:
        return cls(OutcomeKind.PAUSED, "Paused", "reconciliation is paused (spec.paused): the operator "
                                                 "changes nothing; spec changes wait for resume")


# --------------------------------------------------------------------------------------------
# Conditions
# --------------------------------------------------------------------------------------------


def upsert_condition(conditions: Sequence[Mapping[str, Any]], type_: str, status: bool, reason: str,
                     message: str, generation: int, now: datetime.datetime) -> list[dict[str, Any]]:
    """``conditions`` with the one of ``type_`` set: one entry per type, never duplicated;
    ``lastTransitionTime`` is kept unless the status flips (or the entry is new)."""
    text = "True" if status else "False"
    if len(message) > MAX_CONDITION_MESSAGE:
        message = message[: MAX_CONDITION_MESSAGE - 3] + "..."
    out: list[dict[str, Any]] = []
    found = False
    for condition in conditions:
        if condition.get("type") != type_:
            if not any(c.get("type") == condition.get("type") for c in out):
                out.append(dict(condition))
            continue
        if found:
            continue  # a duplicate written by someone else: drop it
        found = True
        moved = condition.get("status") != text or not condition.get("lastTransitionTime")
        out.append({"type": type_, "status": text, "reason": reason, "message": message,
                    "observedGeneration": generation,
                    "lastTransitionTime": format_time(now) if moved else condition["lastTransitionTime"]})
    if not found:
        out.append({"type": type_, "status": text, "reason": reason, "message": message,
                    "observedGeneration": generation, "lastTransitionTime": format_time(now)})
    order = {t: i for i, t in enumerate(CONDITION_TYPES)}
    return sorted(out, key=lambda c: order.get(c.get("type", ""), len(order)))


def _names(pods: Sequence[str]) -> str:
    shown = ", ".join(pods[:MAX_NAMED_PODS])
    return shown if len(pods) <= MAX_NAMED_PODS else f"{shown} and {len(pods) - MAX_NAMED_PODS} more"


# --------------------------------------------------------------------------------------------
# Brokers
# --------------------------------------------------------------------------------------------


def _broker_entry(report: Mapping[str, Any], now: datetime.datetime) -> dict[str, Any]:
    cleaner = report["cleaner"]
    entry: dict[str, Any] = {
        "reportedAt": format_time(now),
        "mode": report["mode"],
        "state": cleaner["state"],
        "partitions": sum(d["partitions"] for d in report["logDirs"]),
        "uncleanablePartitions": sum(d["uncleanablePartitions"] for d in report["logDirs"]),
        "maxDirtyRatio": float(cleaner["maxDirtyRatio"]),
        "maxCompactionDelaySeconds": float(cleaner["maxCompactionDelaySeconds"]),
        "cleanableBytes": sum(t["cleanableBytes"] for t in report["topics"]),
        "stagedBytes": cleaner["stagedBytes"],
        "bytesReclaimedTotal": cleaner["bytesReclaimedTotal"],
        "deadThreads": cleaner["deadThreads"],
        "missedReports": 0,
    }
    entry.update(_insight(report))
    if report.get("scannedAt") is not None:
        entry["scannedAt"] = format_time(_parse_time(report["scannedAt"]))
    if report.get("policyGeneration") is not None:
        entry["policyGeneration"] = report["policyGeneration"]
    entry["lastRunAt"] = (format_time(_parse_time(cleaner["lastRunAt"]))
                          if cleaner.get("lastRunAt") is not None else None)
    if report["errors"]:
        last = report["errors"][-1]
        where = last.get("partition") or last.get("logDir")
        entry["message"] = (f"{where}: {last['message']}" if where else last["message"])[:MAX_BROKER_MESSAGE]
    return entry


def _insight(report: Mapping[str, Any]) -> dict[str, Any]:
    """What issue 14's insight adds to a broker's entry: the open transactions that pin a last
    stable offset (and since when the oldest is open), the bytes the next cleans would free, and
    the most passes Kafka's cleaner would need over one partition with its dedupe buffer (with
    the buffer that makes it one); issue 25's partitions past their deletion deadline. Only
    stable values: an age would change every round."""
    held = [p["lsoHolder"] for p in report["partitions"] if p.get("lsoHolder")]
    starts = [h["startTimestampMs"] for h in held if h.get("startTimestampMs") is not None]
    topics = report["topics"]
    out: dict[str, Any] = {
        "openTransactions": len(held),
        "nextCleanFreedBytes": sum(t.get("nextCleanFreedBytes") or 0 for t in topics),
        "deletionDeadlineBreaches": sum(t.get("deletionDeadlineBreaches") or 0 for t in topics),
    }
    if starts:
        out["oldestOpenTransactionSince"] = format_time(_from_ms(min(starts)))
    passes = [t["kafkaPasses"] for t in topics if t.get("kafkaPasses") is not None]
    if passes:
        out["maxKafkaPasses"] = max(passes)
        out["onePassDedupeBufferSize"] = max(t.get("onePassDedupeBufferSize") or 0 for t in topics)
    return out


def _from_ms(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)


def _top_entry(pod: str, partition: Mapping[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = {"broker": pod}
    for key in ("topic", "partition", "logDir", "firstDirtyOffset", "cleanableBytes", "eligible",
                "reason", "uncleanableReason"):
        if key in partition:
            entry[key] = partition[key]
    entry["cleanableRatio"] = float(partition["cleanableRatio"])
    if partition.get("lastCleanedAt") is not None:
        entry["lastCleanedAt"] = format_time(_parse_time(partition["lastCleanedAt"]))
    for key in ("uncleanableReason", "logDir"):
        if isinstance(entry.get(key), str):
            entry[key] = entry[key][:MAX_TEXT]
    holder = partition.get("lsoHolder")
    if holder:  # who holds the LSO (its age follows from since: it would move every round)
        entry["openTransaction"] = {
            "producerId": holder["producerId"],
            "producerEpoch": holder["producerEpoch"],
            "firstOffset": holder["firstOffset"],
        }
        if holder.get("startTimestampMs") is not None:
            entry["openTransaction"]["since"] = format_time(_from_ms(holder["startTimestampMs"]))
    next_clean = partition.get("nextClean")
    if next_clean:
        entry["nextCleanFreedBytes"] = next_clean["bytesFreed"]
        entry["kafkaPasses"] = next_clean["kafkaPasses"]
    return entry


def _is_stale(entry: Mapping[str, Any]) -> bool:
    return entry.get("missedReports", 0) >= STALE_AFTER


def _has_report(entry: Mapping[str, Any]) -> bool:
    return "reportedAt" in entry


# --------------------------------------------------------------------------------------------
# The status
# --------------------------------------------------------------------------------------------


def build_status(*, policy: Policy | None, generation: int, previous: Mapping[str, Any] | None,
                 outcome: Outcome, pods: Sequence[BrokerPod] | None,
                 scrapes: Mapping[str, Scrape] | None, sidecar_hash: str | None,
                 now: datetime.datetime, interval_seconds: int = 30,
                 top_partitions: int = 20, overlap: str | None = None,
                 expected_pods: Sequence[str] | None = None, rollout_hint: str = "",
                 sidecar_failing: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
    """The whole new status (without ``status.kopf``, which is kopf's).

    ``pods`` are the target pods (None: not looked up this round, keep the brokers as they
    were); ``scrapes`` the reports pulled this round by pod name (None: no pull this round, so
    no report counts as missed); ``sidecar_hash`` the hash of the sidecar the pods should run
    (None: no target). ``policy`` is None when the spec is invalid. ``overlap``: other
    policies select some of the same pods (the message naming them and the pods), which makes
    the policy Degraded (``OverlappingPolicies``) unless something worse does.
    ``expected_pods``: the pods the workload should have (from its ``spec.replicas``; None:
    unknown, the pods found count), so a broker that is missing altogether is named.
    ``rollout_hint`` is appended to an AwaitingRollout message (how the pending pods get the
    sidecar). ``sidecar_failing``: pods (and why their ``kafka-cleaner`` container waits) whose
    sidecar broke after it ran (rollout.failing): the policy is Degraded (``SidecarFailing``)
    before anything else, since those brokers are not Ready and nobody but a person acts.
    """
    previous = previous or {}
    old_brokers: Mapping[str, Mapping[str, Any]] = previous.get("brokers") or {}
    if policy is not None:
        interval_seconds = policy.reporting.interval_seconds
        top_partitions = policy.reporting.top_partitions
    has_target = policy is not None and policy.target is not None

    # -- brokers ---------------------------------------------------------------------------
    brokers: dict[str, dict[str, Any]] = {}
    fresh_top: list[dict[str, Any]] = []
    fresh_reports: dict[str, Mapping[str, Any]] = {}
    awaiting_sidecar: list[str] = []
    outdated: list[str] = []
    if pods is None:
        brokers = {name: dict(entry) for name, entry in old_brokers.items()}
        pod_view: list[BrokerPod] = []
    else:
        pod_view = sorted(pods, key=lambda p: p.name)[:MAX_BROKERS] if has_target else []
    for pod in pod_view:
        if not pod.has_sidecar:
            awaiting_sidecar.append(pod.name)
            continue
        if sidecar_hash is not None and pod.sidecar_hash not in (None, sidecar_hash):
            outdated.append(pod.name)
        old = dict(old_brokers.get(pod.name) or {})
        scrape = scrapes.get(pod.name) if scrapes is not None else None
        if scrapes is None:
            brokers[pod.name] = old
        elif scrape is not None and scrape.report is not None:
            brokers[pod.name] = _broker_entry(scrape.report, now)
            fresh_top += [_top_entry(pod.name, p) for p in scrape.report["partitions"]]
            fresh_reports[pod.name] = scrape.report
        else:
            entry = {k: v for k, v in old.items() if k != "state"}
            entry["missedReports"] = min(old.get("missedReports", 0) + 1, 2**31 - 1)
            entry["state"] = "unreachable"
            error = scrape.error if scrape is not None and scrape.error else "no report"
            entry["message"] = error[:MAX_BROKER_MESSAGE]
            brokers[pod.name] = entry
    missing: list[str] = []
    if pods is None:
        expected = int((previous.get("summary") or {}).get("brokersExpected", len(brokers)))
    else:
        found = {pod.name for pod in pod_view}
        missing = sorted(name for name in expected_pods or () if name not in found) if has_target else []
        expected = len(pod_view) + len(missing)

    live = {name: e for name, e in brokers.items() if _has_report(e) and not _is_stale(e)}
    stale = sorted(name for name, e in brokers.items() if _is_stale(e))
    never = sorted(name for name, e in brokers.items() if not _has_report(e) and not _is_stale(e))
    broken = sorted(name for name, e in live.items()
                    if e.get("deadThreads", 0) > 0 or e.get("state") == "error")
    # Every policy file the operator writes carries metadata.generation, so a report without a
    # policyGeneration comes from a sidecar that has not loaded the policy (yet): behind too.
    behind = sorted(name for name, e in live.items()
                    if e.get("policyGeneration") is None or e["policyGeneration"] < generation)
    # Answering, but before its first scan (scannedAt null): nothing to report yet. The first
    # scan of a large broker takes minutes; until it ends the policy is not Ready (the sidecar's
    # own /readyz says the same, but it must not gate the broker pod: see injection.py).
    unscanned = sorted(name for name, e in live.items() if not e.get("scannedAt"))

    # -- top partitions --------------------------------------------------------------------
    answered = {name for name, e in brokers.items() if e.get("missedReports", 1) == 0 and scrapes is not None}
    kept = [dict(p) for p in previous.get("topPartitions") or []
            if p.get("broker") in live and p.get("broker") not in answered]
    top = sorted(fresh_top + kept, key=lambda p: (-p.get("cleanableRatio", 0.0), p.get("broker", ""),
                                                  p.get("topic", ""), p.get("partition", 0)))
    top = top[:top_partitions]

    # -- replicas that diverge -------------------------------------------------------------
    # Compared over this round's reports only (replicas seen at about the same time); without
    # a pull this round, the last comparison stands.
    if scrapes is None:
        diverging = [dict(d) for d in previous.get("divergingPartitions") or []]
        diverging_count = int((previous.get("summary") or {}).get("divergingPartitions", len(diverging)))
    else:
        found = diverging_partitions(fresh_reports)
        diverging = [d.as_status() for d in found[:MAX_DIVERGING]]
        diverging_count = len(found)

    # -- summary ---------------------------------------------------------------------------
    summary: dict[str, Any] = {
        "uncleanablePartitions": sum(e.get("uncleanablePartitions", 0) for e in live.values()),
        "cleanableBytes": sum(e.get("cleanableBytes", 0) for e in live.values()),
        "stagedBytes": sum(e.get("stagedBytes", 0) for e in live.values()),
        "bytesReclaimedTotal": sum(e.get("bytesReclaimedTotal", 0) for e in live.values()),
        "brokersReporting": len(live),
        "brokersExpected": expected,
        "brokers": f"{len(live)}/{expected}",
        "divergingPartitions": diverging_count,
        "openTransactions": sum(e.get("openTransactions", 0) for e in live.values()),
        "nextCleanFreedBytes": sum(e.get("nextCleanFreedBytes", 0) for e in live.values()),
        "deletionDeadlineBreaches": sum(e.get("deletionDeadlineBreaches", 0) for e in live.values()),
    }
    since = [e["oldestOpenTransactionSince"] for e in live.values() if e.get("oldestOpenTransactionSince")]
    if since:
        summary["oldestOpenTransactionSince"] = min(since)
    passes = [e["maxKafkaPasses"] for e in live.values() if "maxKafkaPasses" in e]
    if passes:
        summary["maxKafkaPasses"] = max(passes)
        summary["onePassDedupeBufferSize"] = max(e.get("onePassDedupeBufferSize", 0) for e in live.values())
    if live:
        summary["maxDirtyRatio"] = max(e.get("maxDirtyRatio", 0.0) for e in live.values())
        summary["maxCompactionDelaySeconds"] = max(e.get("maxCompactionDelaySeconds", 0.0) for e in live.values())
        summary["reportedAt"] = max(e["reportedAt"] for e in live.values())

    # -- conditions ------------------------------------------------------------------------
    paused = outcome.kind is OutcomeKind.PAUSED
    conditions: list[dict[str, Any]] = list(previous.get("conditions") or [])

    def put(type_: str, status: bool, reason: str, message: str) -> None:
        nonlocal conditions
        conditions = upsert_condition(conditions, type_, status, reason, message, generation, now)

    silent_for = STALE_AFTER * interval_seconds
    if sidecar_failing:
        names = sorted(name for name, _ in sidecar_failing)
        reasons = ", ".join(sorted({why for _, why in sidecar_failing}))
        degraded = ("SidecarFailing",
                    f"the kafka-cleaner container of {_names(names)} is failing ({reasons}) and "
                    f"{'its broker is' if len(names) == 1 else 'their brokers are'} not Ready; "
                    f"{'it' if len(names) == 1 else 'they'} ran this sidecar before (not new pods of a rollout): "
                    "nothing is rolled back or deleted, a person decides (kubectl describe pod; the "
                    "container's previous log)")
    elif stale:
        degraded = ("BrokersNotReporting",
                    f"{'broker' if len(stale) == 1 else 'brokers'} {_names(stale)} "
                    f"{'has' if len(stale) == 1 else 'have'} not reported for {STALE_AFTER} intervals "
                    f"({silent_for}s)" + _first_error(brokers, stale))
    elif broken:
        degraded = ("SidecarErrors", f"sidecar cleaner failing on {_names(broken)}"
                    + _first_error(brokers, broken, dead_threads=True))
    elif overlap is not None:
        degraded = ("OverlappingPolicies", overlap)
    else:
        degraded = None
    put("Degraded", degraded is not None, *(degraded or (RECONCILED, "")))

    if outcome.kind is OutcomeKind.STALLED:
        put("Stalled", True, outcome.reason, outcome.message)
        put("Reconciling", False, outcome.reason, "stalled: " + outcome.message)
        put("Ready", False, outcome.reason, outcome.message)
    else:
        put("Stalled", False, RECONCILED, "")
        waiting: tuple[str, str] | None = None
        # Pods waiting for a roll that a person or the Kafka operator makes (Manual, OnDelete)
        # are no work in progress of the operator: Reconciling stays False, so that kstatus
        # (Flux's wait: true) settles, and Argo CD shows the policy Suspended, not Degraded.
        paced = policy is not None and policy.rollout.strategy is RolloutStrategy.PACED
        awaiting = "AwaitingRollout" if paced else AWAITING_MANUAL_ROLLOUT
        if not has_target:
            pass
        elif awaiting_sidecar:
            waiting = (awaiting, f"{_names(awaiting_sidecar)} "
                       f"{'does' if len(awaiting_sidecar) == 1 else 'do'} not run the sidecar yet "
                       "(waiting for the pods to be recreated)" + rollout_hint)
        elif outdated:
            waiting = (awaiting, f"{_names(outdated)} "
                       f"{'runs' if len(outdated) == 1 else 'run'} an outdated sidecar "
                       "(waiting for the pods to be recreated)" + rollout_hint)
        elif missing:
            waiting = ("BrokersMissing", f"{_names(missing)} {'is' if len(missing) == 1 else 'are'} missing: "
                       f"the workload wants {expected} pods, {expected - len(missing)} found")
        elif expected == 0:
            waiting = ("NoPods", "no target pods found yet")
        elif never:
            waiting = ("AwaitingReports", f"waiting for the first report of {_names(never)}")
        elif behind and not paused:
            waiting = ("AwaitingPolicy", f"{_names(behind)} not yet running policy generation {generation}")
        elif unscanned:
            waiting = ("AwaitingReports", f"waiting for the first scan of {_names(unscanned)}")
        if paused:
            put("Reconciling", False, outcome.reason, outcome.message)
        elif waiting is not None and not stale:
            put("Reconciling", waiting[0] != AWAITING_MANUAL_ROLLOUT, *waiting)
        else:
            put("Reconciling", False, RECONCILED, "")
        suffix = " (paused)" if paused else ""
        if degraded is not None:
            put("Ready", False, degraded[0], degraded[1])
        elif waiting is not None:
            put("Ready", False, waiting[0], waiting[1] + suffix)
        elif not has_target:
            put("Ready", True, "NoTarget",
                "no target: the policy ConfigMap is written, no sidecar is injected" + suffix)
        else:
            ratio = summary.get("maxDirtyRatio")
            detail = f"; max dirty ratio {ratio:.2f}" if ratio is not None else ""
            put("Ready", True, "AllBrokersReporting",
                f"{len(live)}/{expected} brokers reporting{detail}{suffix}")

    if diverging:
        first = diverging[0]
        others = diverging_count - 1
        more = f" (and {others} more partition{'s' if others > 1 else ''})" if others else ""
        put("ReplicasDiverge", True, "ReplicasDiverge",
            f"{first['topic']}-{first['partition']} {first['kind']} on {_names(first['brokers'])}: "
            f"{first['detail']}{more}")
    else:
        put("ReplicasDiverge", False, "ReplicasAgree", "")
    if scrapes is not None:  # without a pull this round, the last verdict stands
        risks = race_risks(scrapes)
        if risks:
            others = len(risks) - 1
            more = f" (and {others} more replica{'s' if others > 1 else ''})" if others else ""
            put(RACE_RISK, True, RACE_RISK, race_risk_message(risks[0]) + more)
        else:
            put(RACE_RISK, False, "NoReplicaAtRisk", "")

    status: dict[str, Any] = {
        "observedGeneration": generation,
        "paused": paused,
        "conditions": conditions,
        "summary": summary,
        "brokers": brokers,
        "topPartitions": top,
        "divergingPartitions": diverging,
    }
    return _fit(status)


def race_risks(scrapes: Mapping[str, Scrape]) -> list[RaceRisk]:
    """The race risks among the reports pulled in one round (``divergence``)."""
    return replication_race_risks({pod: s.report for pod, s in scrapes.items() if s.report is not None})


def race_risk_message(risk: RaceRisk, now: datetime.datetime | None = None) -> str:
    """What a person needs: the partition, the replica, since when it is out, the offset and
    when it may be removed (with ``now``, also the time left: for Events, not the condition)."""
    where = f"broker {risk.broker}" + (f" ({risk.pod})" if risk.pod else "")
    state = "offline" if risk.offline else "out of the ISR"
    leo = (f"its log ends at offset {risk.log_end_offset}" if risk.log_end_offset is not None
           else "its log end offset is unknown (no report of it)")
    at = format_time(_from_ms(risk.removable_at_ms))
    left = ""
    if now is not None:
        seconds = risk.seconds_left(int(now.timestamp() * 1000))
        left = f", {_duration(seconds)} left" if seconds > 0 else ", already removable"
    return (f"{risk.name}: the replica on {where} is {state} since {format_time(_from_ms(risk.since_ms))} and "
            f"{leo}; a tombstone or transaction marker at offset {risk.offset} it has not replicated may be "
            f"removed by the cleaner of {_names(list(risk.holders))} from {at}{left}")


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f}h"
    if seconds >= 60:
        return f"{seconds / 60:.0f}m"
    return f"{seconds:.0f}s"


def race_risk_events(old: Mapping[str, Any], new: Mapping[str, Any], risks: Sequence[RaceRisk],
                     now: datetime.datetime) -> list[tuple[str, str, str]]:
    """The Events (type, reason, message) a round's ``ReplicationRaceRisk`` calls for: a
    Warning when it turns on or names another replica first (not every round: no flood), with
    the time left; a Normal one when it clears."""
    def condition(status: Mapping[str, Any]) -> Mapping[str, Any]:
        return next((c for c in status.get("conditions") or [] if c.get("type") == RACE_RISK), {})

    before, after = condition(old), condition(new)
    if after.get("status") == "True" and risks and (before.get("status") != "True"
                                                    or before.get("message") != after.get("message")):
        return [("Warning", RACE_RISK, race_risk_message(risks[0], now)[:1024])]
    if after.get("status") == "False" and before.get("status") == "True":
        return [("Normal", f"{RACE_RISK}Cleared", "every replica out of sync has replicated what a cleaner may "
                 "remove, or is back in the ISR")]
    return []


def _size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")))


def _fit(status: dict[str, Any]) -> dict[str, Any]:
    """Trim ``topPartitions`` (the least cleanable first) until the status fits the budget."""
    excess = _size(status) - STATUS_BUDGET
    top = status["topPartitions"]
    while excess > 0 and top:
        excess -= _size(top.pop()) + 1
    return status


def _first_error(brokers: Mapping[str, Mapping[str, Any]], pods: Sequence[str], *,
                 dead_threads: bool = False) -> str:
    for pod in pods:
        entry = brokers[pod]
        if dead_threads and entry.get("deadThreads"):
            return f"; {pod}: {entry['deadThreads']} dead cleaner thread(s)"
        if entry.get("message"):
            return f"; {pod}: {entry['message']}"
    return ""


#: The longest a status goes unwritten while nothing meaningful changes: ``summary.reportedAt``
#: is then at most this old (plus a round), so staleness stays visible.
HEARTBEAT_SECONDS = 300
#: Byte counts (and durations) that moved by less than this fraction are not news...
RELATIVE_TOLERANCE = 0.10
#: ...nor ratios that moved by less than this.
RATIO_TOLERANCE = 0.05
#: Moved at every report: never a reason to write on their own.
_VOLATILE = frozenset({"reportedAt", "scannedAt", "lastRunAt"})
_RELATIVE = frozenset({"cleanableBytes", "stagedBytes", "bytesReclaimedTotal", "maxCompactionDelaySeconds",
                       "nextCleanFreedBytes", "onePassDedupeBufferSize"})
_RATIOS = frozenset({"maxDirtyRatio", "cleanableRatio"})
_READY_DETAIL = re.compile(r"; max dirty ratio [0-9.]+")


def _close(key: str, old: Any, new: Any) -> bool:
    if key in _RATIOS and isinstance(old, int | float) and isinstance(new, int | float):
        return abs(new - old) < RATIO_TOLERANCE
    if key in _RELATIVE and isinstance(old, int | float) and isinstance(new, int | float):
        if old == new:
            return True
        if old == 0 or new == 0:
            return False
        return abs(new - old) <= RELATIVE_TOLERANCE * max(abs(old), abs(new))
    if key == "missedReports" and isinstance(old, int) and isinstance(new, int):
        return min(old, STALE_AFTER) == min(new, STALE_AFTER)  # stale is stale
    return bool(old == new)


def _same_entry(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    keys = (set(old) | set(new)) - _VOLATILE
    return all(_close(key, old.get(key), new.get(key)) for key in keys)


def _top_key(entry: Mapping[str, Any]) -> tuple[str, str, int]:
    return (entry.get("broker", ""), entry.get("topic", ""), entry.get("partition", -1))


def _condition_view(conditions: Sequence[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
    return [(c.get("type"), c.get("status"), c.get("reason"), c.get("observedGeneration"),
             _READY_DETAIL.sub("", c.get("message") or "")) for c in conditions]


def meaningful_change(old: Mapping[str, Any], new: Mapping[str, Any]) -> str | None:
    """What changed that a reader of the status should see, or None. Meaningful: the
    generation, ``paused``, anything in ``rollout`` (the paced step in flight and the pinned
    image live there: a round that lost them would roll twice), a condition's status, reason
    or message (the dirty ratio quoted in Ready's aside), a broker coming or going, a
    broker's mode, state, partition counts, policy generation, message, dead threads, turning
    stale; a byte count or duration moving by more than :data:`RELATIVE_TOLERANCE` (or to or
    from zero), a ratio by more than :data:`RATIO_TOLERANCE`; the set of top partitions, or
    one of them moving (offsets exactly: the first dirty offset moves when it is cleaned, and
    that is news); a partition starting or ceasing to diverge (or on other brokers, or
    otherwise). Timestamps of reports and scans are not, nor a divergence's detail alone."""
    for key in ("observedGeneration", "paused", "rollout"):  # rollout: the operator's own state, always kept
        if old.get(key) != new.get(key):
            return key
    if _condition_view(old.get("conditions") or []) != _condition_view(new.get("conditions") or []):
        return "conditions"
    if not _same_entry(old.get("summary") or {}, new.get("summary") or {}):
        return "summary"
    old_brokers, new_brokers = old.get("brokers") or {}, new.get("brokers") or {}
    if set(old_brokers) != set(new_brokers):
        return "brokers"
    for pod, entry in new_brokers.items():
        if not _same_entry(old_brokers[pod], entry):
            return f"brokers.{pod}"
    old_top = {_top_key(e): e for e in old.get("topPartitions") or []}
    new_top = {_top_key(e): e for e in new.get("topPartitions") or []}
    if set(old_top) != set(new_top):
        return "topPartitions"
    for key, entry in new_top.items():
        if not _same_entry(old_top[key], entry):
            return "topPartitions"
    if _divergence_view(old) != _divergence_view(new):
        return "divergingPartitions"
    return None


def _divergence_view(status: Mapping[str, Any]) -> set[tuple[Any, ...]]:
    """Which partitions diverge, how and on which brokers: not the detail, whose offsets move."""
    return {(d.get("topic"), d.get("partition"), d.get("kind"), tuple(d.get("brokers") or ()))
            for d in status.get("divergingPartitions") or []}


def status_to_write(old: Mapping[str, Any] | None, new: dict[str, Any], now: datetime.datetime,
                    heartbeat_seconds: float = HEARTBEAT_SECONDS) -> dict[str, Any] | None:
    """What to write over the written status ``old``, or None (nothing meaningful changed).

    - the heartbeat is due (``old``'s ``summary.reportedAt`` is ``heartbeat_seconds`` old and
      ``new`` has a fresher one): ``new`` whole;
    - a meaningful change (:func:`meaningful_change`): ``new`` with every part that did not
      change meaningfully (a broker's entry, the summary, the top partitions, the conditions)
      kept as written, so that the patch carries the change and not every broker's new
      timestamps;
    - otherwise None.
    """
    if not old:
        return new
    written = (old.get("summary") or {}).get("reportedAt")
    latest = (new.get("summary") or {}).get("reportedAt")
    if (written is not None and latest is not None and latest != written
            and (now - _parse_time(written)).total_seconds() >= heartbeat_seconds):
        return new
    if meaningful_change(old, new) is None:
        return None
    out = dict(new)
    if _condition_view(old.get("conditions") or []) == _condition_view(new.get("conditions") or []):
        out["conditions"] = old["conditions"]
    if "summary" in old and _same_entry(old["summary"], new.get("summary") or {}):
        out["summary"] = old["summary"]
    old_brokers = old.get("brokers") or {}
    out["brokers"] = {pod: (old_brokers[pod] if pod in old_brokers and _same_entry(old_brokers[pod], entry)
                            else entry)
                      for pod, entry in (new.get("brokers") or {}).items()}
    old_top = {_top_key(e): e for e in old.get("topPartitions") or []}
    new_top = new.get("topPartitions") or []
    if set(old_top) == {_top_key(e) for e in new_top} and all(_same_entry(old_top[_top_key(e)], e) for e in new_top):
        out["topPartitions"] = old["topPartitions"]
    if "divergingPartitions" in old and _divergence_view(old) == _divergence_view(new):
        out["divergingPartitions"] = old["divergingPartitions"]
    return out


def status_patch(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch (``{"status": ...}``) from ``old`` to ``new``, or None if they are equal.

    Brokers missing from ``new`` are deleted (``null``), and so are fields a broker entry lost;
    ``status.kopf`` is never touched.
    """
    old = {k: v for k, v in (old or {}).items() if k != "kopf"}
    if old == dict(new):
        return None
    patch: dict[str, Any] = {key: value for key, value in new.items() if old.get(key) != value}
    for key in old:
        if key not in new:
            patch[key] = None
    if "brokers" in patch and isinstance(old.get("brokers"), Mapping):
        brokers: dict[str, Any] = {}
        for pod, entry in new["brokers"].items():
            before = old["brokers"].get(pod)
            if before == entry:
                continue
            if isinstance(before, Mapping):
                brokers[pod] = {**dict(entry), **{k: None for k in before if k not in entry}}
            else:
                brokers[pod] = entry
        brokers.update({pod: None for pod in old["brokers"] if pod not in new["brokers"]})
        patch["brokers"] = brokers
    for key in ("summary", "rollout"):
        if key in patch and isinstance(old.get(key), Mapping) and isinstance(new.get(key), Mapping):
            patch[key] = {**dict(new[key]), **{k: None for k in old[key] if k not in new[key]}}
    return {"status": patch}
