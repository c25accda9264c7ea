"""The operator end to end on the emulator (fakekube), for what the real control plane of
test_real_*.py cannot show yet: a cluster older than Kubernetes 1.29 (the control plane is
built at 1.34 only), the webhook's exact answers to AdmissionReviews the test sends, and the
chart-rendered webhook configuration's path (its Service cannot point at loopback on a real
API server). The StatefulSet lifecycle, the status flow, the webhook called by the API server
and its failing open run on the real control plane. Each test here ends by
checking every API call the operator made against the RBAC rules of the Helm chart.
"""

from __future__ import annotations

import base64
import json
import urllib.request
from collections.abc import Callable
from typing import Any

import jsonpatch
import pytest
from compaction_operator.handlers import WEBHOOK_ID
from compaction_operator.injection import POLICY_ANNOTATION, SIDECAR_CONTAINER, SIDECAR_HASH_ANNOTATION
from fakekube import RunningFakeKube
from operator_helpers import (
    NS,
    Cluster,
    G,
    P,
    V,
    broker_statefulset,
    canonical,
    free_port,
    policy,
    running_operator,
    sts_target,
    wait_for,
)


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
