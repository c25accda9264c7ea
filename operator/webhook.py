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
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

import kopf
import kubernetes
from compaction_operator.injection import missing_data_volumes, selector_matches
from compaction_operator.settings import OperatorConfig

from cleaner.config import Injection, Policy, parse_policy
from cleaner.errors import PolicyError

__all__ = [
    "WEBHOOK_ID",
    "Choice",
    "GatedWebhookServer",
    "ServiceWebhookServer",
    "choose_policy",
    "webhook_configuration",
    "webhook_server",
]

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
