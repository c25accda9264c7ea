"""Helpers of the operator's end-to-end tests on the real control plane: the operator in
kopf's test runner, a broker StatefulSet as a Kafka chart writes it, policies, and the test's
view of the cluster (``ApiCluster``).

Imported as ``operator_helpers`` (``tests/k8s`` is on ``sys.path``).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import json
import pathlib
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import kopf
import kopf.testing
import kubernetes
from compaction_operator.handlers import build_registry, build_settings
from compaction_operator.injection import POLICY_ANNOTATION, POLICY_VOLUME, SIDECAR_CONTAINER, SIDECAR_HASH_ANNOTATION
from compaction_operator.settings import OperatorConfig
from control_plane import ControlPlane
from kubernetes.client import AppsV1Api, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException
from ports import free_port

G, V, P = "kafkacleaner.io", "v1alpha1", "compactionpolicies"
NS = "default"
IMAGE = "registry.example/kafka-cleaner:e2e"
WEBHOOK_TIMEOUT = 90.0  # an operator's start and its first listing of the policies, on a loaded machine


def described(predicate: Callable[[], Any], what: str = "") -> str:
    """``what``, or else the source of ``predicate`` (the lambda's own text where it can be
    cut out of its line): a timeout names the condition, never ``<function <lambda>>``."""
    if what:
        return what
    try:
        source = " ".join(line.strip() for line in inspect.getsource(predicate).splitlines())
    except (OSError, TypeError):
        return repr(predicate)
    start = source.find("lambda")
    return source[start:] if start >= 0 else source


def wait_for(predicate: Callable[[], Any], timeout: float = 45.0, what: str = "", interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned), or fail after ``timeout``
    seconds naming what it waited for (``what``, else the predicate's source), the last value
    and the last lookup that failed. Lookups that fail (an API error, a missing key) count as
    "not yet". Generous timeouts: CI machines are small and busy."""
    deadline = time.monotonic() + timeout
    last: Any = None
    failure: Exception | None = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except (ApiException, KeyError, IndexError, TypeError) as e:
            failure = e
        time.sleep(interval)
    failed = f"; last failed lookup: {type(failure).__name__}: {str(failure)[:300]}" if failure is not None else ""
    raise AssertionError(f"timed out after {timeout} s waiting for {described(predicate, what)}; "
                         f"last: {last!r}{failed}")


@contextlib.contextmanager
def running_operator(*, expected_warnings: tuple[str, ...] = (), **config: Any) -> Iterator[kopf.testing.KopfRunner]:
    """The operator (this project's registry and settings) in kopf's test runner; its log is
    checked for tracebacks, errors and warnings (other than ``expected_warnings``) when it stops."""
    config.setdefault("sidecar_image", IMAGE)
    operator_config = OperatorConfig(http_port=0, scrape_timeout=1.0, **config)
    settings = build_settings(operator_config)
    settings.watching.server_timeout = 10
    scope = [f"--namespace={ns}" for ns in operator_config.namespaces] or ["--all-namespaces"]
    args = ["run", "--standalone", *scope, "--verbose"]
    with kopf.testing.KopfRunner(args, registry=build_registry(operator_config), settings=settings,
                                 timeout=30) as runner:
        yield runner
    assert runner.exception is None and runner.exit_code == 0, runner.output
    assert "Traceback" not in runner.output, runner.output
    # kopf's own: its test runner ignores OS signals; a watch stream still open when the
    # runner stops is reported as unprocessed (seen on a loaded machine, harmless here).
    noise = ("OS signals are ignored", "Unprocessed streams left", *expected_warnings)
    bad = [line for line in runner.output.splitlines()
           if ("WARNING" in line or "ERROR" in line) and not any(n in line for n in noise)]
    assert bad == [], "\n".join(bad)


@contextlib.contextmanager
def webhook_operator(plane: ControlPlane, tmp: pathlib.Path, configuration: str, **config: Any) -> Iterator[None]:
    """The operator with its admission webhook on 127.0.0.1 (a serving certificate from the
    control plane's CA), keeping the MutatingWebhookConfiguration ``configuration``, opt-in by
    label; entered once that configuration points at this operator's port. The server listens
    only once the operator's policy index is complete, and publishes its configuration after
    that, so from then on a pod created is this operator's to inject. A configuration that
    merely exists may be an operator's stopped before (another test's, or this test's before an
    upgrade): a pod created then is admitted unchanged (``failurePolicy: Ignore``)."""
    serving = plane.ca.issue_cert("127.0.0.1")
    cert, key, ca = tmp / "tls.crt", tmp / "tls.key", tmp / "ca.crt"
    serving.cert_chain_pems[0].write_to_path(str(cert))
    serving.private_key_pem.write_to_path(str(key))
    plane.ca.cert_pem.write_to_path(str(ca))
    port = free_port()

    def published() -> bool:
        got = plane.kubectl("get", "mutatingwebhookconfiguration", configuration, "-o", "json", check=False)
        hooks = json.loads(got.stdout).get("webhooks", []) if got.returncode == 0 else []
        return bool(hooks) and all(urllib.parse.urlsplit(h["clientConfig"]["url"]).port == port for h in hooks)

    with running_operator(webhook_enabled=True, webhook_addr="127.0.0.1", webhook_port=port,
                          webhook_cert_file=str(cert), webhook_key_file=str(key), webhook_ca_file=str(ca),
                          webhook_host="127.0.0.1", webhook_configuration=configuration,
                          webhook_object_selector=(("kafkacleaner.io/inject", "enabled"),), **config):  # fmt: skip
        wait_for(published, timeout=WEBHOOK_TIMEOUT,
                 what=f"the webhook configuration {configuration} pointing at this operator's webhook (port {port})")
        yield


def broker_statefulset(name: str = "broker") -> dict[str, Any]:
    """A broker StatefulSet as a Kafka chart writes it: the broker and a JMX exporter, an init
    container, a config volume and the data volume from a claim template."""
    kafka = {"name": "kafka", "image": "apache/kafka:4.0.0",
             "env": [{"name": "KAFKA_NODE_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
             "ports": [{"containerPort": 9092, "name": "client"}],
             "resources": {"requests": {"cpu": "1", "memory": "2Gi"}},
             "volumeMounts": [{"name": "data", "mountPath": "/var/lib/kafka"},
                              {"name": "config", "mountPath": "/opt/kafka/config"}]}
    exporter = {"name": "jmx-exporter", "image": "bitnami/jmx-exporter:1.0.1",
                "ports": [{"containerPort": 9404, "name": "metrics"}]}
    init = {"name": "prepare-config", "image": "busybox:1.36", "command": ["sh", "-c", "true"]}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name}, "spec": {
        "serviceName": name, "replicas": 1, "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}, "annotations": {"checksum/config": "abc"}},
                     "spec": {"initContainers": [init], "containers": [kafka, exporter],
                              "volumes": [{"name": "config", "configMap": {"name": f"{name}-config"}}]}},
        "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}}}]}}


def policy(name: str, **spec: Any) -> dict[str, Any]:
    """A CompactionPolicy manifest."""
    return {"apiVersion": f"{G}/{V}", "kind": "CompactionPolicy", "metadata": {"name": name}, "spec": spec}


def sts_target(sts: str = "broker") -> dict[str, Any]:
    """``spec.target`` for :func:`broker_statefulset`."""
    return {"statefulSet": sts, "dataVolume": "data", "mountPath": "/var/lib/kafka", "logDirs": ["data"]}


def without_injection(template: dict[str, Any]) -> dict[str, Any]:
    """A pod template without what the operator injects (to compare with the original)."""
    out = copy.deepcopy(template)
    spec = out["spec"]
    for key in ("initContainers", "containers"):
        if key in spec:
            spec[key] = [c for c in spec[key] if c["name"] != SIDECAR_CONTAINER]
    spec["volumes"] = [v for v in spec.get("volumes", []) if v["name"] != POLICY_VOLUME]
    for key in (SIDECAR_HASH_ANNOTATION, POLICY_ANNOTATION):
        out["metadata"].get("annotations", {}).pop(key, None)
    for key in ("initContainers", "volumes"):  # lists the injection created, emptied again
        if spec.get(key) == []:
            del spec[key]
    if out["metadata"].get("annotations") == {}:
        del out["metadata"]["annotations"]
    return out


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


class ApiCluster:
    """The test's view of a cluster through its API (the real control plane's), in namespace
    ``namespace``: objects as the API server returns them (raw JSON), None for a 404."""

    def __init__(self, client: kubernetes.client.ApiClient, namespace: str) -> None:
        self.ns, self.custom = namespace, CustomObjectsApi(client)
        self.apps, self.core = AppsV1Api(client), CoreV1Api(client)

    @staticmethod
    def _json(call: Callable[..., Any], *args: Any) -> dict[str, Any] | None:
        try:
            return dict(json.loads(call(*args, _preload_content=False).data))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def sts(self, name: str = "broker") -> dict[str, Any]:
        obj = self._json(self.apps.read_namespaced_stateful_set, name, self.ns)
        assert obj is not None
        return obj

    def pod(self, name: str) -> dict[str, Any] | None:
        return self._json(self.core.read_namespaced_pod, name, self.ns)

    def policy(self, name: str) -> dict[str, Any] | None:
        return self._json(self.custom.get_namespaced_custom_object, G, V, self.ns, P, name)

    def status(self, name: str) -> dict[str, Any]:
        return (self.policy(name) or {}).get("status") or {}

    def condition(self, name: str, type_: str) -> dict[str, Any]:
        return next((c for c in self.status(name).get("conditions", []) if c["type"] == type_), {})

    def configmap(self, name: str) -> dict[str, Any] | None:
        return self._json(self.core.read_namespaced_config_map, name, self.ns)

    def patch_spec(self, name: str, spec: dict[str, Any]) -> int:
        obj = self.custom.patch_namespaced_custom_object(G, V, self.ns, P, name, {"spec": spec})
        return int(obj["metadata"]["generation"])

    def events(self) -> list[tuple[str, str, str]]:
        listed = self._json(self.core.list_namespaced_event, self.ns) or {}
        items = listed.get("items", [])
        return [(e["involvedObject"].get("kind", ""), e["reason"], e.get("message", "")) for e in items]

    def wait_for_event(self, kind: str, reason: str, timeout: float = 45.0, containing: str = "") -> str:
        """The message of an Event with this kind and reason (and, given, a message containing
        that text), once it is there: kopf posts Events from a queue of its own, after the
        change that caused them may already be visible. ``containing`` tells one Event from an
        earlier one of the same reason, which may be listed first."""
        return wait_for(lambda: next((m for k, r, m in self.events() if (k, r) == (kind, reason) and containing in m),
                                     None),
                        timeout=timeout, what=f"a {reason} Event on a {kind} containing {containing!r}")  # fmt: skip


def scrape_metrics(port: int) -> str:
    """The text of an operator's ``/metrics`` on a loopback port."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()
