"""The mutating admission webhook for ``injection: webhook`` policies.

Brokers that no StatefulSet owns (Strimzi's StrimziPodSets, for one) get the sidecar when their
pods are created: kopf serves a ``@kopf.on.mutate`` handler for pods (CREATE). The chart
renders the MutatingWebhookConfiguration that points at it (opt-in by label, a 5 s timeout);
only with ``KAFKA_CLEANER_WEBHOOK_CONFIGURATION`` set does kopf keep one of that name itself. :func:`choose_policy` (pure) decides which
policy, if any, a new pod belongs to; the handler (handlers.py) returns the JSON patch of
:func:`compaction_operator.injection.inject_into_pod`.

The webhook fails open (``failurePolicy: Ignore``): a broker pod is never kept from starting
because the operator is down; it then runs without the sidecar until it is recreated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

import kopf
from compaction_operator.injection import has_data_volume, selector_matches
from compaction_operator.settings import OperatorConfig

from cleaner.config import Injection, Policy, parse_policy
from cleaner.errors import PolicyError

__all__ = ["Choice", "ServiceWebhookServer", "choose_policy", "webhook_server"]


@dataclasses.dataclass(frozen=True)
class Choice:
    """The policy whose sidecar a pod gets (None: none), and warnings for the API client."""

    policy: Policy | None
    warnings: tuple[str, ...] = ()


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
    if len(matching) > 1:
        others = ", ".join(p.name or "?" for p in matching[1:])
        warnings.append(f"kafka-cleaner: CompactionPolicies {chosen.name}, {others} all select this pod; "
                        f"only {chosen.name} injects its sidecar")
    assert chosen.target is not None
    if not has_data_volume(pod.get("spec") or {}, chosen.target.data_volume):
        warnings.append(f"kafka-cleaner: CompactionPolicy {chosen.name} selects this pod, but it has no volume "
                        f"{chosen.target.data_volume!r} (target.dataVolume): no sidecar injected")
        return Choice(None, tuple(warnings))
    return Choice(chosen, tuple(warnings))


class ServiceWebhookServer(kopf.WebhookServer):
    """kopf's webhook server, announced to the API server as a Service (``clientConfig.service``)
    instead of a URL: the API server reaches in-cluster webhooks through Services."""

    def __init__(self, *, service_name: str, service_namespace: str, service_port: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.service_name, self.service_namespace, self.service_port = service_name, service_namespace, service_port

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        async for config in super().__call__(fn):
            service = {"name": self.service_name, "namespace": self.service_namespace,
                       "port": self.service_port, "path": (self.path or "").rstrip("/")}
            out: dict[str, Any] = {"service": service}
            if config.get("caBundle"):
                out["caBundle"] = config["caBundle"]
            yield out


def webhook_server(config: OperatorConfig) -> kopf.WebhookServer:
    """The webhook server the configuration asks for (TLS from the mounted files)."""
    common: dict[str, Any] = {"addr": config.webhook_addr, "port": config.webhook_port}
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
    return kopf.WebhookServer(**common)
