"""The operator end to end: the real kopf (KopfRunner) and the real kubernetes client against
fakekube, with the project's CRD. Each test ends by checking every API call the operator made
against the RBAC rules of the Helm chart.

Here the sidecar is the injected container only (a port where nothing answers, or the webhook's
patch); test_operator_sidecar_e2e.py runs the real ``kafka-cleaner sidecar`` behind the pod.
"""

from __future__ import annotations

import base64
import json
import pathlib
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import jsonpatch
import pytest
from compaction_operator import handlers, metrics
from compaction_operator.handlers import WEBHOOK_ID
from compaction_operator.injection import POLICY_ANNOTATION, SIDECAR_CONTAINER, SIDECAR_HASH_ANNOTATION
from fakekube import RunningFakeKube
from operator_helpers import (
    IMAGE,
    NS,
    Cluster,
    G,
    P,
    V,
    broker_statefulset,
    canonical,
    free_port,
    pod_of,
    policy,
    running_operator,
    scrape_metrics,
    sts_target,
    wait_for,
    without_injection,
)

from cleaner.config import load_policy, parse_policy

# -------------------------------------------------------------------------------------------
# The StatefulSet injection, from create to delete
# -------------------------------------------------------------------------------------------


def test_statefulset_lifecycle(cluster: Cluster, tmp_path: pathlib.Path, fakekube: RunningFakeKube,
                               assert_rbac_allows: Callable[..., None]) -> None:
    """Inject exactly the sidecar, publish the policy, touch the template only when the sidecar
    changes, go Degraded when the broker's sidecar does not answer, pause and resume, and
    remove exactly what was injected on delete."""
    cluster.apps.create_namespaced_stateful_set(NS, broker_statefulset())
    original = cluster.sts()
    silent_port = free_port()  # nothing listens here: the sidecar "does not answer"
    http = metrics.start_http_server("127.0.0.1", 0, lambda: True)
    try:
        with running_operator():
            cluster.custom.create_namespaced_custom_object(G, V, NS, P, policy(
                "offsets", target=sts_target(), sidecar={"port": silent_port},
                topics=[{"match": "__consumer_offsets", "cleanupPolicy": "compact"}],
                reporting={"intervalSeconds": 1}))

            # -- the sidecar, and nothing else ---------------------------------------------
            sts = wait_for(lambda: (s := cluster.sts()) and SIDECAR_HASH_ANNOTATION in
                           s["spec"]["template"]["metadata"].get("annotations", {}) and s, what="injection")
            template = sts["spec"]["template"]
            assert canonical(template["spec"]["containers"]) == canonical(original["spec"]["template"]["spec"]
                                                                         ["containers"])
            assert canonical(without_injection(template)) == canonical(original["spec"]["template"])
            assert sts["spec"]["volumeClaimTemplates"] == original["spec"]["volumeClaimTemplates"]
            sidecar = template["spec"]["initContainers"][-1]  # Kubernetes 1.33: a native sidecar
            assert sidecar["name"] == SIDECAR_CONTAINER and sidecar["restartPolicy"] == "Always"
            assert sidecar["image"] == IMAGE
            assert sidecar["args"] == ["sidecar", "--policy", "/etc/kafka-cleaner/policy.yaml",
                                       "--log-dir", "/var/lib/kafka/data", "--listen", f"0.0.0.0:{silent_port}",
                                       "--broker-name", "$(POD_NAME)"]
            assert {"name": "data", "mountPath": "/var/lib/kafka", "readOnly": True} in sidecar["volumeMounts"]
            assert template["metadata"]["annotations"][POLICY_ANNOTATION] == "offsets"
            first_hash = template["metadata"]["annotations"][SIDECAR_HASH_ANNOTATION]

            # -- the policy file -------------------------------------------------------------
            cr = cluster.policy("offsets")
            assert cr is not None
            cm = wait_for(lambda: cluster.configmap("offsets-kafka-cleaner"), what="ConfigMap")
            (tmp_path / "policy.yaml").write_text(cm["data"]["policy.yaml"])
            published = load_policy(tmp_path / "policy.yaml")
            assert published.policy_generation == cr["metadata"]["generation"] == 1
            assert published == parse_policy(cr) and published.name == "offsets"
            assert cm["metadata"]["ownerReferences"][0]["uid"] == cr["metadata"]["uid"]

            # -- a spec change reaches the ConfigMap, not the pod template --------------------
            sts_version = cluster.sts()["metadata"]["resourceVersion"]
            generation = cluster.patch_spec("offsets", {"topics": [
                {"match": "__consumer_offsets|_schemas", "cleanupPolicy": "compact"}]})
            assert generation == 2
            wait_for(lambda: "generation: 2" in cluster.configmap("offsets-kafka-cleaner")["data"]["policy.yaml"],
                     what="ConfigMap at generation 2")
            wait_for(lambda: cluster.status("offsets").get("observedGeneration") == 2, what="observed 2")
            assert cluster.sts()["metadata"]["resourceVersion"] == sts_version

            # -- a broker pod whose sidecar never answers: Degraded after 3 intervals -------------
            pod = cluster.core.create_namespaced_pod(NS, pod_of(cluster.sts(), 0), _preload_content=False)
            assert pod.status == 201
            cluster.core.patch_namespaced_pod_status("broker-0", NS, {"status": {"podIP": "127.0.0.1"}})
            degraded = wait_for(lambda: (c := cluster.condition("offsets", "Degraded")).get("status") == "True"
                                and c, what="Degraded")
            assert degraded["reason"] == "BrokersNotReporting" and "broker-0" in degraded["message"]
            assert degraded["observedGeneration"] == 2
            status = cluster.status("offsets")
            assert status["brokers"]["broker-0"]["missedReports"] >= 3
            assert status["summary"]["brokers"] == "0/1"
            assert cluster.condition("offsets", "Ready")["status"] == "False"
            wait_for(lambda: ("CompactionPolicy", "BrokersNotReporting") in [e[:2] for e in cluster.events()],
                     what="a BrokersNotReporting Event")

            # -- a sidecar change touches the template: the new port, same broker containers ----
            new_port = free_port()
            cluster.patch_spec("offsets", {"sidecar": {"port": new_port}})
            sts = wait_for(lambda: (s := cluster.sts())["spec"]["template"]["metadata"]["annotations"]
                           [SIDECAR_HASH_ANNOTATION] != first_hash and s, what="sidecar update")
            sidecar = sts["spec"]["template"]["spec"]["initContainers"][-1]
            assert sidecar["ports"][0]["containerPort"] == new_port
            assert canonical(without_injection(sts["spec"]["template"])) == canonical(original["spec"]["template"])
            assert len([c for c in sts["spec"]["template"]["spec"]["initContainers"]
                        if c["name"] == SIDECAR_CONTAINER]) == 1

            # -- pause: nothing changes, and the status says so -----------------------------------
            cluster.patch_spec("offsets", {"paused": True})
            wait_for(lambda: cluster.status("offsets").get("paused") is True, what="paused")
            reconciling = cluster.condition("offsets", "Reconciling")
            assert (reconciling["status"], reconciling["reason"]) == ("False", "Paused")
            frozen_sts = cluster.sts()["metadata"]["resourceVersion"]
            frozen_cm = cluster.configmap("offsets-kafka-cleaner")["metadata"]["resourceVersion"]
            generation = cluster.patch_spec("offsets", {"sidecar": {"port": free_port()}})
            wait_for(lambda: cluster.status("offsets").get("observedGeneration") == generation, what="observed")
            time.sleep(1.5)  # a reporting round or more
            assert cluster.sts()["metadata"]["resourceVersion"] == frozen_sts
            assert cluster.configmap("offsets-kafka-cleaner")["metadata"]["resourceVersion"] == frozen_cm

            # -- resume: the pending changes are applied --------------------------------------------
            generation = cluster.patch_spec("offsets", {"paused": False})
            wait_for(lambda: f"generation: {generation}" in
                     cluster.configmap("offsets-kafka-cleaner")["data"]["policy.yaml"], what="resumed")
            wait_for(lambda: cluster.sts()["metadata"]["resourceVersion"] != frozen_sts, what="sidecar after resume")
            wait_for(lambda: cluster.status("offsets").get("paused") is False, what="not paused")

            # -- the operator's metrics --------------------------------------------------------------
            text = scrape_metrics(http.server_address[1])
            assert 'kafka_cleaner_operator_reconciliations_total{namespace="default",policy="offsets"}' in text
            assert 'kafka_cleaner_operator_sidecar_scrape_failures_total{namespace="default",pod="broker-0",' \
                   'policy="offsets"}' in text
            assert 'kafka_cleaner_operator_stale_brokers{namespace="default",policy="offsets"} 1.0' in text
            assert "kafka_cleaner_operator_reconcile_duration_seconds_count" in text

            # -- delete: exactly what was injected goes, and the ConfigMap --------------------------
            cluster.custom.delete_namespaced_custom_object(G, V, NS, P, "offsets")
            wait_for(lambda: cluster.policy("offsets") is None, what="policy gone")
            assert canonical(cluster.sts()["spec"]["template"]) == canonical(original["spec"]["template"])
            assert cluster.configmap("offsets-kafka-cleaner") is None
    finally:
        http.shutdown()
        http.server_close()

    reasons = {e[:2] for e in cluster.events()}
    assert {("CompactionPolicy", "SidecarInjected"), ("StatefulSet", "SidecarInjected"),
            ("CompactionPolicy", "SidecarUpdated"), ("CompactionPolicy", "PolicyPublished"),
            ("CompactionPolicy", "SidecarRemoved"), ("StatefulSet", "SidecarRemoved")} <= reasons
    assert_rbac_allows(fakekube)


@pytest.mark.parametrize("fakekube_version", ["v1.28.9"])
def test_regular_container_before_1_29_and_stalled_policies(cluster: Cluster, fakekube: RunningFakeKube,
                                                            assert_rbac_allows: Callable[..., None]) -> None:
    """Kubernetes 1.28: a regular container. A spec the API server accepts but Python cannot
    compile, a missing StatefulSet and a missing data volume stall with a reason; fixing the
    spec recovers. Changing the target moves the sidecar."""
    cluster.apps.create_namespaced_stateful_set(NS, broker_statefulset())
    cluster.apps.create_namespaced_stateful_set(NS, broker_statefulset("other"))
    original = cluster.sts()
    with running_operator():
        # A JavaScript/RE2 named group: fine for the API server, not a Python regex.
        cluster.custom.create_namespaced_custom_object(G, V, NS, P, policy(
            "bad", target=sts_target(), topics=[{"match": "(?<name>orders)"}]))
        stalled = wait_for(lambda: (c := cluster.condition("bad", "Stalled")).get("status") == "True" and c,
                           what="Stalled")
        assert stalled["reason"] == "InvalidSpec" and "spec.topics[0].match" in stalled["message"]
        assert cluster.status("bad")["observedGeneration"] == 1
        assert SIDECAR_HASH_ANNOTATION not in cluster.sts()["spec"]["template"]["metadata"]["annotations"]

        cluster.patch_spec("bad", {"topics": [{"match": "(?P<name>orders)"}]})
        wait_for(lambda: cluster.condition("bad", "Stalled").get("status") == "False", what="recovered")
        sts = wait_for(lambda: (s := cluster.sts()) and SIDECAR_HASH_ANNOTATION in
                       s["spec"]["template"]["metadata"]["annotations"] and s, what="injection")
        names = [c["name"] for c in sts["spec"]["template"]["spec"]["containers"]]
        assert names == ["kafka", "jmx-exporter", SIDECAR_CONTAINER]
        assert sts["spec"]["template"]["spec"]["initContainers"] == original["spec"]["template"]["spec"][
            "initContainers"]
        assert "restartPolicy" not in sts["spec"]["template"]["spec"]["containers"][-1]

        # Retarget: the sidecar leaves "broker" and goes to "other".
        cluster.patch_spec("bad", {"target": sts_target("other")})
        wait_for(lambda: SIDECAR_HASH_ANNOTATION in cluster.sts("other")["spec"]["template"]["metadata"]
                 .get("annotations", {}), what="moved")
        wait_for(lambda: canonical(cluster.sts()["spec"]["template"]) == canonical(original["spec"]["template"]),
                 what="removed from the old target")

        # Missing target, missing volume.
        cluster.custom.create_namespaced_custom_object(G, V, NS, P, policy("ghost", target=sts_target("nope")))
        ghost = wait_for(lambda: (c := cluster.condition("ghost", "Stalled")).get("status") == "True" and c)
        assert ghost["reason"] == "TargetNotFound"
        cluster.custom.create_namespaced_custom_object(G, V, NS, P, policy(
            "novol", target={**sts_target(), "dataVolume": "logs"}))
        novol = wait_for(lambda: (c := cluster.condition("novol", "Stalled")).get("status") == "True" and c)
        assert novol["reason"] == "DataVolumeNotFound" and "'logs'" in novol["message"]
        wait_for(lambda: ("CompactionPolicy", "TargetNotFound") in [e[:2] for e in cluster.events()],
                 what="a TargetNotFound Event")

        for name in ("bad", "ghost", "novol"):
            cluster.custom.delete_namespaced_custom_object(G, V, NS, P, name)
        wait_for(lambda: not fakekube.server.objects(f"{G}/{V}", P), what="all deleted")
        assert SIDECAR_HASH_ANNOTATION not in cluster.sts("other")["spec"]["template"]["metadata"].get(
            "annotations", {})
    assert_rbac_allows(fakekube)


# -------------------------------------------------------------------------------------------
# The admission webhook
# -------------------------------------------------------------------------------------------


def admission_review(pod: dict[str, Any], uid: str = "e2e-1") -> dict[str, Any]:
    """An AdmissionReview as the API server sends it for a pod CREATE."""
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "name": pod["metadata"]["name"], "namespace": NS, "operation": "CREATE",
        "userInfo": {"username": "system:serviceaccount:strimzi:strimzi-cluster-operator", "groups": []},
        "object": pod, "oldObject": None, "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}}}


def post_review(url: str, review: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(review).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def strimzi_pod(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": labels},
            "spec": {"containers": [{"name": "kafka", "image": "quay.io/strimzi/kafka:0.45.0-kafka-3.9.0",
                                     "volumeMounts": [{"name": "data-0", "mountPath": "/var/lib/kafka/data-0"}]}],
                     "volumes": [{"name": "data-0", "persistentVolumeClaim": {"claimName": f"data-0-{name}"}}]}}


def test_the_webhook_fails_open_when_its_handler_raises(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf answers ``allowed: false`` for a handler that raises (reproduced on a live
    cluster: the operator had not learned the Kubernetes version): a broker that cannot
    start. Now the pod is admitted unchanged, with a warning, and the policy gets a Warning
    Event. The webhook's own step raises here, so the reconciliation goes on unharmed."""

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the Kubernetes version is not known yet")

    port = free_port()
    with running_operator(webhook_enabled=True, webhook_insecure=True, webhook_addr="127.0.0.1", webhook_port=port,
                          expected_warnings=("webhook failed open",)):
        cluster.custom.create_namespaced_custom_object(G, V, NS, P, policy(
            "strimzi", mode="observe", target={
                "podSelector": {"matchLabels": {"strimzi.io/kind": "Kafka"}},
                "dataVolume": "data-0", "mountPath": "/var/lib/kafka/data-0", "logDirs": ["kafka-log*"],
                "injection": "webhook"}))
        wait_for(lambda: cluster.configmap("strimzi-kafka-cleaner"), what="ConfigMap")
        monkeypatch.setattr(handlers, "inject_into_pod", broken)
        url = f"http://127.0.0.1:{port}/{WEBHOOK_ID}"
        broker = strimzi_pod("my-cluster-broker-0", {"strimzi.io/kind": "Kafka"})
        response = wait_for(lambda: (r := post_review(url, admission_review(broker))["response"]).get("warnings") and r,
                            what="an answer with a warning")
        assert response["allowed"] is True and "patch" not in response
        assert any("not injected" in w and "Kubernetes version is not known" in w for w in response["warnings"])
        wait_for(lambda: ("CompactionPolicy", "InjectionFailed") in [e[:2] for e in cluster.events()],
                 what="an InjectionFailed Event on the policy")
        monkeypatch.undo()
        cluster.custom.delete_namespaced_custom_object(G, V, NS, P, "strimzi")
        wait_for(lambda: cluster.policy("strimzi") is None, what="deleted")


@pytest.mark.parametrize("managed", [False, True], ids=["chart-configuration", "kopf-managed-configuration"])
def test_webhook_injects_into_matching_pods(cluster: Cluster, fakekube: RunningFakeKube, managed: bool,
                                            assert_rbac_allows: Callable[..., None],
                                            helm_template: Callable[..., list[dict[str, Any]]]) -> None:
    """A real AdmissionReview to kopf's webhook server: a JSONPatch that adds the sidecar to a
    pod the policy selects, nothing for one it does not. The MutatingWebhookConfiguration is
    the chart's (its path reaches the handler), or, opted in, kept by the operator."""
    port = free_port()
    name = "kafka-cleaner.kafkacleaner.io"
    with running_operator(webhook_enabled=True, webhook_insecure=True, webhook_addr="127.0.0.1",
                          webhook_port=port, webhook_configuration=name if managed else None):
        cluster.custom.create_namespaced_custom_object(G, V, NS, P, policy(
            "strimzi", mode="stage", target={
                "podSelector": {"matchLabels": {"strimzi.io/kind": "Kafka", "strimzi.io/broker-role": "true"}},
                "dataVolume": "data-0", "mountPath": "/var/lib/kafka/data-0", "logDirs": ["kafka-log*"],
                "injection": "webhook"}, reporting={"intervalSeconds": 1}))
        wait_for(lambda: cluster.configmap("strimzi-kafka-cleaner"), what="ConfigMap")
        if managed:
            config = wait_for(lambda: (c := fakekube.server.read("admissionregistration.k8s.io/v1",
                                                               "mutatingwebhookconfigurations", name))
                              and c.get("webhooks") and c, what="webhook configuration")
            hook = config["webhooks"][0]
            assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                                      "operations": ["CREATE"], "scope": "*"}]
            url = hook["clientConfig"]["url"]
            assert url == f"http://127.0.0.1:{port}/{WEBHOOK_ID}"
        else:
            rendered = helm_template({"webhook": {"enabled": True}})
            [config] = [o for o in rendered if o["kind"] == "MutatingWebhookConfiguration"]
            hook = config["webhooks"][0]
            url = f"http://127.0.0.1:{port}{hook['clientConfig']['service']['path']}"
        assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"

        broker = strimzi_pod("my-cluster-broker-0", {"strimzi.io/kind": "Kafka", "strimzi.io/broker-role": "true"})
        answer = wait_for(lambda: (a := post_review(url, admission_review(broker)))["response"].get("patch") and a,
                          what="an injecting answer")
        response = answer["response"]
        assert answer["kind"] == "AdmissionReview" and response["uid"] == "e2e-1" and response["allowed"] is True
        assert response["patchType"] == "JSONPatch"
        ops = json.loads(base64.b64decode(response["patch"]))
        patched = jsonpatch.apply_patch(broker, ops)
        sidecar = patched["spec"]["initContainers"][0]
        assert sidecar["name"] == SIDECAR_CONTAINER and sidecar["restartPolicy"] == "Always"
        assert "--log-dir" in sidecar["args"] and "/var/lib/kafka/data-0/kafka-log*" in sidecar["args"]
        assert {"name": "data-0", "mountPath": "/var/lib/kafka/data-0", "readOnly": False} in sidecar["volumeMounts"]
        assert patched["spec"]["containers"] == broker["spec"]["containers"]
        assert patched["spec"]["volumes"][-1]["configMap"]["name"] == "strimzi-kafka-cleaner"
        assert patched["metadata"]["annotations"][POLICY_ANNOTATION] == "strimzi"
        assert {op["path"] for op in ops} <= {"/spec/initContainers", "/spec/volumes/1", "/metadata/annotations"}

        controller = strimzi_pod("my-cluster-controller-3", {"strimzi.io/kind": "Kafka",
                                                             "strimzi.io/controller-role": "true"})
        response = post_review(url, admission_review(controller, "e2e-2"))["response"]
        assert response["allowed"] is True and "patch" not in response

        # A pod the policy selects, created for real, is reported as not running the sidecar
        # yet (fakekube calls no webhooks), and the policy waits for it.
        cluster.core.create_namespaced_pod(NS, broker, _preload_content=False)
        reconciling = wait_for(lambda: (c := cluster.condition("strimzi", "Reconciling")).get("reason")
                               == "AwaitingRollout" and c, what=f"AwaitingRollout: {cluster.status('strimzi')}")
        assert "my-cluster-broker-0" in reconciling["message"]

        cluster.custom.delete_namespaced_custom_object(G, V, NS, P, "strimzi")
        wait_for(lambda: cluster.policy("strimzi") is None, what="deleted")
        assert cluster.configmap("strimzi-kafka-cleaner") is None
    assert ("CompactionPolicy", "WebhookPodsUnchanged") in [e[:2] for e in cluster.events()]
    assert_rbac_allows(fakekube, {"webhook": {"enabled": True, "manageConfiguration": managed,
                                              "configurationName": name}})
    if not managed:
        assert not fakekube.server.objects("admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations")
