"""The operator's own Kubernetes API calls, through the official ``kubernetes`` client.

kopf does the watching, its finalizers and Events; everything else (the StatefulSet, the
ConfigMap, pods, the policy's status, the Lease) goes through here. Objects come and go as
plain JSON dicts (``_preload_content=False``), never the client's models, so the pure modules
see exactly what the API server holds and fields the client does not know survive.

The client is synchronous: the handlers call these methods through ``asyncio.to_thread``.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import kubernetes
from kubernetes.client import (
    AdmissionregistrationV1Api,
    ApiClient,
    AppsV1Api,
    CoordinationV1Api,
    CoreV1Api,
    CustomObjectsApi,
    VersionApi,
)
from kubernetes.client.exceptions import ApiException

from cleaner.config import API_GROUP

__all__ = ["GROUP", "PLURAL", "VERSION", "ApiException", "Kube", "load_config"]

GROUP, VERSION, PLURAL = API_GROUP, "v1alpha1", "compactionpolicies"
#: Seconds for one API call (connect, read): a stuck API server must not stall a handler.
TIMEOUT = (5.0, 30.0)


def load_config() -> None:
    """In a pod, the service account; elsewhere ``$KUBECONFIG`` or ``~/.kube/config``."""
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))


def _json(response: Any) -> Any:
    return json.loads(response.data) if response.data else None


class Kube:
    """Thin, dict-in dict-out wrappers over the calls the operator makes (nothing more, so the
    chart's RBAC rules can stay that small)."""

    def __init__(self, client: ApiClient) -> None:
        self.client = client
        self.core = CoreV1Api(client)
        self.apps = AppsV1Api(client)
        self.custom = CustomObjectsApi(client)
        self.coordination = CoordinationV1Api(client)
        self.versions = VersionApi(client)
        self.admission = AdmissionregistrationV1Api(client)

    def close(self) -> None:
        self.client.close()

    # -- cluster ---------------------------------------------------------------------------

    def version(self) -> dict[str, Any]:
        return _json(self.versions.get_code(_preload_content=False, _request_timeout=TIMEOUT))

    def list_nodes(self) -> list[dict[str, Any]]:
        """Every node, for its kubelet's version (``status.nodeInfo.kubeletVersion``): a native
        sidecar needs every kubelet at 1.29 or later (injection.KubeVersion.of_cluster)."""
        listing = _json(self.core.list_node(_preload_content=False, _request_timeout=TIMEOUT))
        return list(listing.get("items") or [])

    def cluster_version(self) -> Any:
        """The version that decides native sidecars: the oldest of the API server and every
        kubelet (``injection.KubeVersion``). Nodes that cannot be listed (RBAC) count as too old."""
        from compaction_operator.injection import KubeVersion

        info = self.version()
        try:
            nodes: list[dict[str, Any]] | None = self.list_nodes()
            why = ""
        except ApiException as exc:
            if exc.status is None or exc.status >= 500 or exc.status == 429:
                raise
            nodes, why = None, f"{exc.status} {exc.reason}"
        return KubeVersion.of_cluster(info, nodes, why)

    # -- Events ----------------------------------------------------------------------------

    def create_event(self, involved: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """A core/v1 Event about ``involved`` (a manifest), as ``kopf.event`` posts one: for the
        paths that run outside kopf's handler context (the admission webhook)."""
        meta = involved["metadata"]
        now = datetime.datetime.now(datetime.UTC).isoformat()
        body = {
            "metadata": {"namespace": meta["namespace"], "generateName": "kafka-cleaner-"},
            "involvedObject": {"apiVersion": involved["apiVersion"], "kind": involved["kind"], "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta.get("uid")},
            "reason": reason, "message": message[:1024], "type": type_,
            "source": {"component": "kafka-cleaner-operator"},
            "firstTimestamp": now, "lastTimestamp": now, "eventTime": None, "count": 1,
        }
        self.core.create_namespaced_event(meta["namespace"], body, _preload_content=False, _request_timeout=TIMEOUT)

    # -- StatefulSets ----------------------------------------------------------------------

    def read_statefulset(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return _json(self.apps.read_namespaced_stateful_set(name, namespace, _preload_content=False,
                                                                _request_timeout=TIMEOUT))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def list_statefulsets(self, namespace: str) -> list[dict[str, Any]]:
        """The items of a list carry no ``kind``/``apiVersion`` (the API server puts them on the
        list only); they are filled in, so that an Event about one names what it is about."""
        listing = _json(self.apps.list_namespaced_stateful_set(namespace, _preload_content=False,
                                                               _request_timeout=TIMEOUT))
        return [{"apiVersion": "apps/v1", "kind": "StatefulSet", **item} for item in listing.get("items") or []]

    def patch_statefulset(self, namespace: str, name: str, patch: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """A JSON patch (RFC 6902; ``injection.template_patch`` and ``removal_patch``)."""
        return _json(self.apps.patch_namespaced_stateful_set(
            name, namespace, [dict(op) for op in patch], _preload_content=False, _request_timeout=TIMEOUT,
            _content_type="application/json-patch+json"))

    # -- ConfigMaps ------------------------------------------------------------------------

    def read_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return _json(self.core.read_namespaced_config_map(name, namespace, _preload_content=False,
                                                              _request_timeout=TIMEOUT))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def create_configmap(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return _json(self.core.create_namespaced_config_map(namespace, dict(body), _preload_content=False,
                                                            _request_timeout=TIMEOUT))

    def replace_configmap(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """PUT with the body's resourceVersion: 409 if someone changed it meanwhile."""
        return _json(self.core.replace_namespaced_config_map(name, namespace, dict(body), _preload_content=False,
                                                             _request_timeout=TIMEOUT))

    def delete_configmap(self, namespace: str, name: str) -> bool:
        try:
            self.core.delete_namespaced_config_map(name, namespace, _preload_content=False,
                                                   _request_timeout=TIMEOUT)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    # -- the webhook configuration (KAFKA_CLEANER_WEBHOOK_CONFIGURATION) -----------------------

    def put_mutating_webhook_configuration(self, body: Mapping[str, Any]) -> None:
        """Create it, or patch its ``webhooks`` (the chart's RBAC: create, and patch by name)."""
        try:
            self.admission.create_mutating_webhook_configuration(dict(body), _preload_content=False,
                                                                 _request_timeout=TIMEOUT)
        except ApiException as exc:
            if exc.status != 409:
                raise
            self.admission.patch_mutating_webhook_configuration(
                body["metadata"]["name"], {"webhooks": body["webhooks"]}, _preload_content=False,
                _request_timeout=TIMEOUT, _content_type="application/merge-patch+json")

    # -- pods ------------------------------------------------------------------------------

    def dry_run_pod(self, namespace: str, body: Mapping[str, Any],
                    timeout: tuple[float, float] | float = TIMEOUT) -> dict[str, Any]:
        """Create ``body`` with ``dryRun=All``: the API server runs admission (Pod Security,
        webhooks, ResourceQuota, LimitRange) and validation, and stores nothing. RBAC judges it
        as ``create pods``."""
        return _json(self.core.create_namespaced_pod(namespace, dict(body), dry_run="All", _preload_content=False,
                                                     _request_timeout=timeout))

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        listing = _json(self.core.list_namespaced_pod(namespace, label_selector=label_selector,
                                                      _preload_content=False, _request_timeout=TIMEOUT))
        return list(listing.get("items") or [])

    def delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        """Delete exactly the pod that was looked at (a precondition on its uid: a pod
        recreated meanwhile under the same name is left alone); False if it is gone."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        try:
            self.core.delete_namespaced_pod(name, namespace, body=body, _preload_content=False,
                                            _request_timeout=TIMEOUT)
        except ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str]) -> dict[str, Any]:
        """A merge patch of the pod's annotations."""
        return _json(self.core.patch_namespaced_pod(
            name, namespace, {"metadata": {"annotations": dict(annotations)}}, _preload_content=False,
            _request_timeout=TIMEOUT, _content_type="application/merge-patch+json"))

    # -- StrimziPodSets --------------------------------------------------------------------

    def read_strimzipodset(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return _json(self.custom.get_namespaced_custom_object(
                "core.strimzi.io", "v1beta2", namespace, "strimzipodsets", name, _preload_content=False,
                _request_timeout=TIMEOUT))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    # -- the policy ------------------------------------------------------------------------

    def list_policies(self, namespaces: Sequence[str]) -> list[dict[str, Any]]:
        """Every CompactionPolicy in ``namespaces`` (empty: all namespaces)."""
        if namespaces:
            listings = [_json(self.custom.list_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, _preload_content=False, _request_timeout=TIMEOUT))
                for namespace in namespaces]
        else:
            listings = [_json(self.custom.list_cluster_custom_object(
                GROUP, VERSION, PLURAL, _preload_content=False, _request_timeout=TIMEOUT))]
        return [item for listing in listings for item in listing.get("items") or []]

    def patch_policy_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """A merge patch of the status subresource."""
        return _json(self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, dict(patch), _preload_content=False,
            _request_timeout=TIMEOUT, _content_type="application/merge-patch+json"))

    # -- Leases ----------------------------------------------------------------------------

    def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return _json(self.coordination.read_namespaced_lease(name, namespace, _preload_content=False,
                                                                 _request_timeout=TIMEOUT))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def create_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return _json(self.coordination.create_namespaced_lease(namespace, dict(body), _preload_content=False,
                                                               _request_timeout=TIMEOUT))

    def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return _json(self.coordination.replace_namespaced_lease(name, namespace, dict(body),
                                                                _preload_content=False, _request_timeout=TIMEOUT))
