"""The mutating admission webhook for ``injection: webhook`` policies.

Brokers that no StatefulSet owns (Strimzi's StrimziPodSets, for one) get the sidecar when their
pods are created: kopf serves a ``@kopf.on.mutate`` handler for pods (CREATE). The
MutatingWebhookConfiguration pointing at it is the chart's, or, with
``KAFKA_CLEANER_WEBHOOK_CONFIGURATION``, the operator's own (:func:`webhook_configuration`: the
chart's, field for field; not kopf's managed one, which has a 30 s timeout, no namespace
selector, and an empty ValidatingWebhookConfiguration beside it). :func:`choose_policy` (pure) decides which
policy, if any, a new pod belongs to; the handler (handlers.py) returns the JSON patch of
:func:`compaction_operator.injection.inject_into_pod`.

The webhook fails open (``failurePolicy: Ignore``): a broker pod is never kept from starting
because the operator is down; it then runs without the sidecar until it is recreated.

The server listens only once the operator's policy index is complete (``gate``, set by
``Operator.await_policies_indexed``): before that it would admit a broker pod unchanged
because it had not seen its policy yet. Not listening leaves the choice to the API server,
whose ``failurePolicy: Ignore`` applies, visibly (the call fails), and the replica is not
ready (/readyz) until then, so the Service sends the calls to replicas that can answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

import kopf
import kubernetes
from compaction_operator.injection import grace_period_warning, missing_data_volumes, selector_matches
from compaction_operator.settings import OperatorConfig
from kubernetes.client.exceptions import ApiException

from cleaner.config import Injection, Policy, parse_policy
from cleaner.errors import PolicyError

__all__ = [
    "WEBHOOK_ID",
    "Choice",
    "GatedWebhookServer",
    "ServiceWebhookServer",
    "admission_rejection",
    "choose_policy",
    "dry_run_body",
    "post_event",
    "warn_about_injection",
    "webhook_configuration",
    "webhook_server",
]

log = logging.getLogger("kafka-cleaner-operator")

#: The mutating webhook's handler id: kopf serves it at ``/<id>`` (the chart's
#: MutatingWebhookConfiguration calls that path).
WEBHOOK_ID = "inject-sidecar"


@dataclasses.dataclass(frozen=True)
class Choice:
    """The policy whose sidecar a pod gets (None: none), and warnings for the API client."""

    policy: Policy | None
    warnings: tuple[str, ...] = ()
    #: Every policy that selects the pod, when more than one does (the first by name injects).
    overlapping: tuple[str, ...] = ()


def _selects(policy: Policy, pod: Mapping[str, Any]) -> bool:
    target = policy.target
    if target is None or target.effective_injection is not Injection.WEBHOOK:
        return False
    meta = pod.get("metadata") or {}
    if target.pod_selector is not None:
        return selector_matches(target.pod_selector, meta.get("labels") or {})
    # statefulSet + injection: webhook: the pods that StatefulSet creates.
    return any(ref.get("kind") == "StatefulSet" and ref.get("name") == target.stateful_set
               for ref in meta.get("ownerReferences") or [])


def choose_policy(pod: Mapping[str, Any], manifests: Iterable[Mapping[str, Any]]) -> Choice:
    """Which of the namespace's policies (CompactionPolicy manifests) injects into ``pod``.

    Paused policies still inject (a broker recreated during a pause keeps its sidecar);
    invalid ones never do. When several select the pod, the first by name wins and the pod's
    creator is warned.
    """
    matching: list[Policy] = []
    for manifest in sorted(manifests, key=lambda m: (m.get("metadata") or {}).get("name", "")):
        try:
            policy = parse_policy({k: manifest[k] for k in ("apiVersion", "kind", "metadata", "spec")
                                   if k in manifest})
        except PolicyError:
            continue
        if _selects(policy, pod):
            matching.append(policy)
    if not matching:
        return Choice(None)
    chosen, warnings = matching[0], []
    overlapping: tuple[str, ...] = ()
    if len(matching) > 1:
        others = ", ".join(p.name or "?" for p in matching[1:])
        warnings.append(f"kafka-cleaner: CompactionPolicies {chosen.name}, {others} all select this pod; "
                        f"only {chosen.name} injects its sidecar")
        overlapping = tuple(p.name or "?" for p in matching)
    assert chosen.target is not None
    missing = missing_data_volumes(chosen, pod.get("spec") or {})
    if missing:
        warnings.append(f"kafka-cleaner: CompactionPolicy {chosen.name} selects this pod, but it has no volume "
                        f"{', '.join(map(repr, missing))} (target.dataVolume, additionalDataVolumes): "
                        "no sidecar injected")
        return Choice(None, tuple(warnings), overlapping)
    return Choice(chosen, tuple(warnings), overlapping)


#: What the API server sets on a create, or what would need rights of its own in a dry run
#: (ownerReferences with blockOwnerDeletion: OwnerReferencesPermissionEnforcement asks for
#: ``update`` of the owner's finalizers): left out of the dry run's pod.
_SERVER_SET = ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
               "generation", "managedFields", "selfLink", "ownerReferences")


def dry_run_body(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The pod being admitted, as the body of a dry-run create: a ``generateName`` instead of
    its name (nothing can collide), without the fields of :data:`_SERVER_SET` and its status."""
    body = json.loads(json.dumps(dict(pod)))
    meta = {key: value for key, value in (body.get("metadata") or {}).items() if key not in _SERVER_SET}
    name = meta.pop("name", None)
    if name and not meta.get("generateName"):
        meta["generateName"] = f"{name[:200]}-"
    body["metadata"] = meta
    body.pop("status", None)
    return body


def admission_rejection(kube: Any, pod: Mapping[str, Any], webhook_timeout: float) -> str | None:
    """Whether the API server would create ``pod`` (the pod being admitted, with the sidecar):
    a server-side dry run (``dryRun=All``), so that validation (a mount path twice, a request
    above its limit), LimitRange, ResourceQuota, Pod Security and the other webhooks judge the
    pod with the sidecar before the webhook hands it back. The API server calls this webhook
    again for the dry run (``dryRun: true``, the sidecar already there): it injects nothing more
    and runs no dry run of its own.

    None: it would (or the dry run said nothing about the pod: a timeout, a server error,
    throttling; the CRD's rules and the policy model have passed the spec, and the admission
    answer must not wait longer than the webhook's timeout: the dry run gets that less 2 s).
    Else the API server's message."""
    namespace = (pod.get("metadata") or {}).get("namespace")
    budget = max(1.0, webhook_timeout - 2.0)
    try:
        kube.dry_run_pod(namespace, dry_run_body(pod), (min(2.0, budget), budget))
    except ApiException as exc:
        if exc.status is None or exc.status >= 500 or exc.status in (409, 429):
            log.warning("the admission dry run of a pod with the sidecar said nothing: %s %s", exc.status, exc.reason)
            return None
        try:
            return str(json.loads(exc.body)["message"])
        except (TypeError, ValueError, KeyError):
            return f"{exc.status} {exc.reason}"
    except Exception as exc:  # a timeout, a connection error
        log.warning("the admission dry run of a pod with the sidecar failed: %s", exc)
        return None
    return None


def warn_about_injection(policy: Policy, injected: Mapping[str, Any], refused: str | None) -> list[tuple[str, str]]:
    """(Event reason, message) of what the webhook tells the pod's creator (an admission
    warning) and the policy (a Warning Event) about an injection: refused by the dry run (the
    pod is then admitted without the sidecar), or a grace period too short for stage mode's
    termination commit."""
    meta = injected.get("metadata") or {}
    pod = meta.get("name") or (meta.get("generateName") or "") + "*"
    if refused is not None:
        return [("AdmissionRejected", f"kafka-cleaner: the sidecar of CompactionPolicy {policy.name} was not injected "
                 f"into pod {pod}: the API server refuses the pod with it (dry run): {refused}")]
    grace = grace_period_warning(policy, injected.get("spec") or {})
    if grace is not None:
        return [("TerminationGracePeriodTooShort", f"kafka-cleaner: pod {pod}: {grace}")]
    return []


def post_event(tasks: set[asyncio.Task[None]], kube: Any, manifest: Mapping[str, Any], reason: str,
               message: str) -> None:
    """A Warning Event on the policy ``manifest``, posted in the background (an admission
    answer must not wait for it; a failure is logged); ``tasks`` holds the task until done."""

    async def post() -> None:
        try:
            await asyncio.to_thread(kube.create_event, manifest, "Warning", reason, message)
        except Exception as exc:
            log.warning("cannot post the %s Event on %s: %s", reason, (manifest.get("metadata") or {}).get("name"), exc)

    task = asyncio.get_running_loop().create_task(post())
    tasks.add(task)
    task.add_done_callback(tasks.discard)


def webhook_configuration(config: OperatorConfig, client_config: Mapping[str, Any]) -> dict[str, Any]:
    """The MutatingWebhookConfiguration the operator keeps (``webhook_configuration`` set): the
    chart's (templates/webhook.yaml), with ``client_config`` as kopf's server announces itself
    (a Service or a URL, and its CA)."""
    assert config.webhook_configuration is not None
    client = json.loads(json.dumps(dict(client_config)))
    if "service" in client:
        client["service"]["path"] = (client["service"].get("path") or "").rstrip("/") + f"/{WEBHOOK_ID}"
    if "url" in client:
        client["url"] = client["url"].rstrip("/") + f"/{WEBHOOK_ID}"
    if config.namespaces:
        namespaces = {"key": "kubernetes.io/metadata.name", "operator": "In", "values": list(config.namespaces)}
    else:
        namespaces = {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                      "values": ["kube-system", config.namespace]}
    webhook: dict[str, Any] = {
        "name": f"{WEBHOOK_ID}.kafkacleaner.io",
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Ignore",
        "matchPolicy": "Equivalent",
        "reinvocationPolicy": "Never",
        "timeoutSeconds": config.webhook_timeout,
        "clientConfig": client,
        "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["CREATE"],
                   "scope": "Namespaced"}],
        "namespaceSelector": {"matchExpressions": [namespaces]},
    }
    if config.webhook_object_selector:
        webhook["objectSelector"] = {"matchExpressions": [
            {"key": key, "operator": "In", "values": [value]} if value else {"key": key, "operator": "Exists"}
            for key, value in config.webhook_object_selector]}
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": config.webhook_configuration,
                         "labels": {"app.kubernetes.io/managed-by": "kafka-cleaner-operator"}},
            "webhooks": [webhook]}


def _publish(config: OperatorConfig, client_config: Mapping[str, Any]) -> None:
    from compaction_operator.kube import Kube, load_config  # the API client only where it is used

    load_config()
    kube = Kube(kubernetes.client.ApiClient())
    try:
        kube.put_mutating_webhook_configuration(webhook_configuration(config, client_config))
    finally:
        kube.close()


class GatedWebhookServer(kopf.WebhookServer):
    """kopf's webhook server, listening only once ``gate`` is set (None: at once), setting
    ``listening`` once it listens (kopf announces its client configuration only after its
    site has started: /readyz must not say ready before a call can connect), and calling
    ``publish`` with every client configuration it announces (the operator's own
    MutatingWebhookConfiguration)."""

    GATE_POLL_SECONDS = 0.05

    def __init__(self, *, gate: threading.Event | None = None, listening: threading.Event | None = None,
                 publish: Callable[[Mapping[str, Any]], None] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gate, self.listening, self.publish = gate, listening, publish

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        while self.gate is not None and not self.gate.is_set():
            await asyncio.sleep(self.GATE_POLL_SECONDS)
        async for config in self._configs(fn):
            if self.listening is not None:
                self.listening.set()
            if self.publish is not None:
                await asyncio.to_thread(self.publish, config)
            yield config

    async def _configs(self, fn: Any) -> AsyncIterator[Any]:
        async for config in super().__call__(fn):
            yield config


class ServiceWebhookServer(GatedWebhookServer):
    """kopf's webhook server, announced to the API server as a Service (``clientConfig.service``)
    instead of a URL: the API server reaches in-cluster webhooks through Services."""

    def __init__(self, *, service_name: str, service_namespace: str, service_port: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.service_name, self.service_namespace, self.service_port = service_name, service_namespace, service_port

    async def _configs(self, fn: Any) -> AsyncIterator[Any]:
        async for config in super()._configs(fn):
            service = {"name": self.service_name, "namespace": self.service_namespace,
                       "port": self.service_port, "path": (self.path or "").rstrip("/")}
            out: dict[str, Any] = {"service": service}
            if config.get("caBundle"):
                out["caBundle"] = config["caBundle"]
            yield out


def webhook_server(config: OperatorConfig, *, gate: threading.Event | None = None,
                   listening: threading.Event | None = None) -> kopf.WebhookServer:
    """The webhook server the configuration asks for (TLS from the mounted files), listening
    once ``gate`` is set, and setting ``listening`` when it does."""
    common: dict[str, Any] = {"addr": config.webhook_addr, "port": config.webhook_port, "gate": gate,
                              "listening": listening}
    if config.webhook_configuration:
        common["publish"] = functools.partial(_publish, config)
    if config.webhook_insecure:
        common["insecure"] = True
    else:
        common.update(certfile=config.webhook_cert_file, pkeyfile=config.webhook_key_file,
                      cafile=config.webhook_ca_file)
    if config.webhook_service_name:
        return ServiceWebhookServer(service_name=config.webhook_service_name,
                                    service_namespace=config.webhook_service_namespace or config.namespace,
                                    service_port=config.webhook_service_port, **common)
    if config.webhook_host:
        common["host"] = config.webhook_host
    return GatedWebhookServer(**common)
