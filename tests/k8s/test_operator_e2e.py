"""The operator end to end on the real control plane, for what test_real_operator.py leaves
out: policies that stall with a reason (a pattern the API server accepts and Python cannot
compile, a missing StatefulSet, a missing data volume) and recover, a retargeted policy moving
its sidecar, and the webhook's exact answer to an AdmissionReview posted to the path the
chart's MutatingWebhookConfiguration names (its Service cannot point at loopback). The
operator calls as the chart's ServiceAccount, so the real RBAC authorizer judges every call.
"""

from __future__ import annotations

import base64
import json
import pathlib
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import jsonpatch
import kubernetes
import pytest
from compaction_operator.injection import POLICY_ANNOTATION, SIDECAR_CONTAINER, SIDECAR_HASH_ANNOTATION
from control_plane import ControlPlane, activated_kubeconfig, available, missing_reason
from operator_helpers import (
    ApiCluster,
    G,
    P,
    V,
    broker_statefulset,
    canonical,
    policy,
    running_operator,
    sts_target,
    wait_for,
)
from ports import free_port

NS = "e2e"

pytestmark = [
    pytest.mark.skipif(not available(), reason=missing_reason()),
    pytest.mark.xdist_group("control-plane"),
]


@pytest.fixture
def cluster(control_plane: ControlPlane, install_chart: Callable[..., pathlib.Path]) -> Iterator[ApiCluster]:
    """The chart installed, the process's kubeconfig readers acting as its ServiceAccount, and
    the test's own view of namespace ``e2e`` (as the admin)."""
    kubeconfig = install_chart("webhook.enabled=true")
    control_plane.kubectl("create", "namespace", NS, check=False)
    with activated_kubeconfig(kubeconfig):
        yield ApiCluster(kubernetes.config.new_client_from_config(config_file=str(control_plane.kubeconfig)), NS)


def _create_policy(cluster: ApiCluster, manifest: dict[str, Any]) -> None:
    cluster.custom.create_namespaced_custom_object(G, V, NS, P, manifest)


def _sts(name: str = "broker") -> dict[str, Any]:
    sts = broker_statefulset(name)
    sts["spec"]["replicas"] = 0  # templates only: no pod, no volume claim to bind
    return sts


def test_stalled_policies_recover_and_a_new_target_takes_the_sidecar(cluster: ApiCluster) -> None:
    """A spec the API server accepts but Python cannot compile, a missing StatefulSet and a
    missing data volume stall with a reason; fixing the spec recovers (a native sidecar, on
    this 1.34 control plane). Changing the target moves the sidecar."""
    cluster.apps.create_namespaced_stateful_set(NS, _sts())
    cluster.apps.create_namespaced_stateful_set(NS, _sts("other"))
    original = cluster.sts()
    with running_operator() as runner:
        # A JavaScript/RE2 named group: fine for the API server, not a Python regex.
        _create_policy(cluster, policy(
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
        names = [c["name"] for c in sts["spec"]["template"]["spec"]["initContainers"]]
        assert names == ["prepare-config", SIDECAR_CONTAINER]  # Kubernetes 1.34: a native sidecar
        assert sts["spec"]["template"]["spec"]["containers"] == original["spec"]["template"]["spec"]["containers"]
        assert sts["spec"]["template"]["spec"]["initContainers"][-1]["restartPolicy"] == "Always"

        # Retarget: the sidecar leaves "broker" and goes to "other".
        cluster.patch_spec("bad", {"target": sts_target("other")})
        wait_for(lambda: SIDECAR_HASH_ANNOTATION in cluster.sts("other")["spec"]["template"]["metadata"]
                 .get("annotations", {}), what="moved")
        wait_for(lambda: canonical(cluster.sts()["spec"]["template"]) == canonical(original["spec"]["template"]),
                 what="removed from the old target")

        # Missing target, missing volume.
        _create_policy(cluster, policy("ghost", target=sts_target("nope")))
        ghost = wait_for(lambda: (c := cluster.condition("ghost", "Stalled")).get("status") == "True" and c)
        assert ghost["reason"] == "TargetNotFound"
        _create_policy(cluster, policy(
            "novol", target={**sts_target(), "dataVolume": "logs"}))
        novol = wait_for(lambda: (c := cluster.condition("novol", "Stalled")).get("status") == "True" and c)
        assert novol["reason"] == "DataVolumeNotFound" and "'logs'" in novol["message"]
        wait_for(lambda: ("CompactionPolicy", "TargetNotFound") in [e[:2] for e in cluster.events()],
                 what="a TargetNotFound Event")

        for name in ("bad", "ghost", "novol"):
            cluster.custom.delete_namespaced_custom_object(G, V, NS, P, name)
        wait_for(lambda: all(cluster.policy(n) is None for n in ("bad", "ghost", "novol")), what="all deleted")
        assert SIDECAR_HASH_ANNOTATION not in cluster.sts("other")["spec"]["template"]["metadata"].get(
            "annotations", {})
    # Each deleted policy's report daemon, idle between rounds, ended when kopf asked it to: kopf
    # signals one that did not, and holds the finalizer for the daemon's cancellation backoff
    # (10 s a policy, every deletion, before the operator's settings waited for it).
    assert "is signalled to exit gracefully" not in runner.output


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


def test_the_webhook_answers_on_the_path_the_charts_configuration_names(
    cluster: ApiCluster, helm_template: Callable[..., list[dict[str, Any]]]
) -> None:
    """An AdmissionReview posted to kopf's webhook server on the path of the chart's
    MutatingWebhookConfiguration: a JSONPatch that adds exactly the sidecar to a pod the policy
    selects, nothing for one it does not; a selected pod created without the sidecar makes the
    policy wait for it (AwaitingManualRollout)."""
    port = free_port()
    with running_operator(webhook_enabled=True, webhook_insecure=True, webhook_addr="127.0.0.1", webhook_port=port):
        _create_policy(cluster, policy(
            "strimzi", mode="stage", target={
                "podSelector": {"matchLabels": {"strimzi.io/kind": "Kafka", "strimzi.io/broker-role": "true"}},
                "dataVolume": "data-0", "mountPath": "/var/lib/kafka/data-0", "logDirs": ["kafka-log*"],
                "injection": "webhook"}, reporting={"intervalSeconds": 1}))  # fmt: skip
        wait_for(lambda: cluster.configmap("strimzi-kafka-cleaner"), what="ConfigMap")
        rendered = helm_template({"webhook": {"enabled": True}})
        [config] = [o for o in rendered if o["kind"] == "MutatingWebhookConfiguration"]
        hook = config["webhooks"][0]
        url = f"http://127.0.0.1:{port}{hook['clientConfig']['service']['path']}"
        assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"

        broker = strimzi_pod("my-cluster-broker-0", {"strimzi.io/kind": "Kafka", "strimzi.io/broker-role": "true"})
        answer = wait_for(lambda: (a := post_review(url, admission_review(broker)))["response"].get("patch") and a,
                          what="an injecting answer")  # fmt: skip
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
                                                             "strimzi.io/controller-role": "true"})  # fmt: skip
        response = post_review(url, admission_review(controller, "e2e-2"))["response"]
        assert response["allowed"] is True and "patch" not in response

        # A selected pod created without the sidecar (no webhook configuration exists here, so
        # the API server calls none): the policy waits for it.
        cluster.core.create_namespaced_pod(NS, broker, _preload_content=False)
        # Waiting for the Kafka operator's roll is no work of ours: Reconciling False (kstatus
        # settles), Ready False with the reason.
        reconciling = wait_for(lambda: (c := cluster.condition("strimzi", "Reconciling")).get("reason")
                               == "AwaitingManualRollout" and c, what="AwaitingManualRollout")  # fmt: skip
        assert reconciling["status"] == "False" and "my-cluster-broker-0" in reconciling["message"]
        assert cluster.condition("strimzi", "Ready")["reason"] == "AwaitingManualRollout"

        cluster.custom.delete_namespaced_custom_object(G, V, NS, P, "strimzi")
        wait_for(lambda: cluster.policy("strimzi") is None, what="deleted")
        assert cluster.configmap("strimzi-kafka-cleaner") is None
        cluster.wait_for_event("CompactionPolicy", "WebhookPodsUnchanged")


def test_overlapping_policies_are_reported_on_both(cluster: ApiCluster) -> None:
    """Two policies selecting the same pods: today's StatefulSet path stalls the second
    (TargetConflict), and now both say so in their own status (Degraded,
    OverlappingPolicies, naming the other) with a Warning Event each, not only the workload."""
    cluster.apps.create_namespaced_stateful_set(NS, _sts("shared"))
    with running_operator(expected_warnings=("OverlappingPolicies", "TargetConflict")):
        _create_policy(cluster, policy("aa-first", target=sts_target("shared"), reporting={"intervalSeconds": 1}))
        wait_for(lambda: SIDECAR_HASH_ANNOTATION in cluster.sts("shared")["spec"]["template"]["metadata"]
                 .get("annotations", {}), what="the first policy's injection")
        _create_policy(cluster, policy("bb-second", target=sts_target("shared"), reporting={"intervalSeconds": 1}))
        for name, other in (("aa-first", "bb-second"), ("bb-second", "aa-first")):
            degraded = wait_for(lambda n=name: (c := cluster.condition(n, "Degraded")).get("reason")
                                == "OverlappingPolicies" and c, timeout=90, what=f"{name} Degraded")
            assert other in degraded["message"] and "StatefulSet shared" in degraded["message"]
        assert cluster.condition("bb-second", "Stalled")["reason"] == "TargetConflict"
        events = wait_for(lambda: [e for e in cluster.events() if e[1] == "OverlappingPolicies"] if len(
            {e[2] for e in cluster.events() if e[1] == "OverlappingPolicies"}) == 2 else None,
            what="an OverlappingPolicies Event on each policy")
        assert {e[0] for e in events} == {"CompactionPolicy"}

        # Disjoint again: the survivor recovers.
        cluster.custom.delete_namespaced_custom_object(G, V, NS, P, "bb-second")
        wait_for(lambda: cluster.condition("aa-first", "Degraded").get("status") == "False", timeout=90,
                 what="recovered")
        cluster.custom.delete_namespaced_custom_object(G, V, NS, P, "aa-first")
        wait_for(lambda: all(cluster.policy(n) is None for n in ("aa-first", "bb-second")), what="deleted")


def test_a_jbod_statefulset_gets_every_data_volume_into_the_sidecar(cluster: ApiCluster) -> None:
    """Two data volumes (claim templates data-0 and data-1, as Strimzi's JBOD): the sidecar
    the API server stores mounts both and is given the log dirs of both; a policy naming a
    third volume the StatefulSet lacks stalls with DataVolumeNotFound, naming it."""
    sts = _sts("jbod")
    kafka = sts["spec"]["template"]["spec"]["containers"][0]
    kafka["volumeMounts"] = [{"name": "data-0", "mountPath": "/var/lib/kafka/data-0"},
                             {"name": "data-1", "mountPath": "/var/lib/kafka/data-1"}]
    claim = sts["spec"]["volumeClaimTemplates"][0]
    sts["spec"]["volumeClaimTemplates"] = [{**claim, "metadata": {"name": f"data-{i}"}} for i in (0, 1)]
    cluster.apps.create_namespaced_stateful_set(NS, sts)
    target = {"statefulSet": "jbod", "dataVolume": "data-0", "mountPath": "/var/lib/kafka/data-0",
              "logDirs": ["kafka-log*"],
              "additionalDataVolumes": [{"name": "data-1", "mountPath": "/var/lib/kafka/data-1"}]}
    with running_operator(expected_warnings=("DataVolumeNotFound",)):
        _create_policy(cluster, policy("jbod", target=target))
        stored = wait_for(lambda: (s := cluster.sts("jbod")) and SIDECAR_HASH_ANNOTATION in
                          s["spec"]["template"]["metadata"].get("annotations", {}) and s, what="injection")
        ours = next(c for c in stored["spec"]["template"]["spec"]["initContainers"] if c["name"] == SIDECAR_CONTAINER)
        mounts = {m["name"]: m["mountPath"] for m in ours["volumeMounts"]}
        assert mounts["data-0"] == "/var/lib/kafka/data-0" and mounts["data-1"] == "/var/lib/kafka/data-1"
        dirs = [ours["args"][i + 1] for i, a in enumerate(ours["args"]) if a == "--log-dir"]
        assert dirs == ["/var/lib/kafka/data-0/kafka-log*", "/var/lib/kafka/data-1/kafka-log*"]

        three = {**target, "additionalDataVolumes": [*target["additionalDataVolumes"],
                                                     {"name": "data-2", "mountPath": "/var/lib/kafka/data-2"}]}
        cluster.patch_spec("jbod", {"target": three})
        stalled = wait_for(lambda: (c := cluster.condition("jbod", "Stalled")).get("status") == "True" and c,
                           what="Stalled")
        assert stalled["reason"] == "DataVolumeNotFound" and "'data-2'" in stalled["message"]
        cluster.custom.delete_namespaced_custom_object(G, V, NS, P, "jbod")
        wait_for(lambda: cluster.policy("jbod") is None, what="deleted")


def test_two_webhook_policies_selecting_one_pod_are_both_told(cluster: ApiCluster) -> None:
    """Webhook injection: two podSelector policies select the same Strimzi broker. The pod
    gets the first one's sidecar (by name), its creator a warning, each policy an
    OverlappingPolicies Event; and once such a pod exists, both policies' status says so."""
    port = free_port()
    # A label of this test's own: other tests' Strimzi-like pods in the namespace stay out of it.
    labels = {"strimzi.io/kind": "Kafka", "kafkacleaner.io/test": "overlap"}
    selector = {"matchLabels": labels}
    target = {"podSelector": selector, "dataVolume": "data-0", "mountPath": "/var/lib/kafka/data-0",
              "logDirs": ["kafka-log*"], "injection": "webhook"}
    url = f"http://127.0.0.1:{port}/inject-sidecar"
    with running_operator(webhook_enabled=True, webhook_insecure=True, webhook_addr="127.0.0.1", webhook_port=port,
                          expected_warnings=("OverlappingPolicies",)):
        for name in ("wa", "wb"):
            _create_policy(cluster, policy(name, target=target, reporting={"intervalSeconds": 1}))
        for name in ("wa", "wb"):
            wait_for(lambda n=name: cluster.configmap(f"{n}-kafka-cleaner"), what=f"{name}'s ConfigMap")
        broker = strimzi_pod("ov-broker-0", labels)
        answer = wait_for(lambda: (a := post_review(url, admission_review(broker, "ov-1")))["response"].get("patch")
                          and a, what="an injecting answer")  # fmt: skip
        response = answer["response"]
        assert any("wa, wb all select this pod; only wa injects" in w for w in response.get("warnings", [])), response
        ops = json.loads(base64.b64decode(response["patch"]))
        assert jsonpatch.apply_patch(broker, ops)["metadata"]["annotations"][POLICY_ANNOTATION] == "wa"
        def overlap_events() -> dict[str, str]:
            listed = json.loads(cluster.core.list_namespaced_event(NS, _preload_content=False).data)
            return {e["involvedObject"]["name"]: e["message"] for e in listed["items"]
                    if e["reason"] == "OverlappingPolicies" and "ov-broker-0" in e["message"]
                    and e["involvedObject"].get("kind") == "CompactionPolicy"}

        events = wait_for(lambda: (found := overlap_events()) and set(found) == {"wa", "wb"} and found,
                          what="an OverlappingPolicies Event on each policy")  # fmt: skip
        assert all("only wa injects" in message for message in events.values())

        cluster.core.create_namespaced_pod(NS, broker, _preload_content=False)
        for name, other in (("wa", "wb"), ("wb", "wa")):
            degraded = wait_for(lambda n=name: (c := cluster.condition(n, "Degraded")).get("reason")
                                == "OverlappingPolicies" and c, timeout=90, what=f"{name} Degraded")
            assert other in degraded["message"] and "ov-broker-0" in degraded["message"]
        cluster.core.delete_namespaced_pod("ov-broker-0", NS, grace_period_seconds=0)
        for name in ("wa", "wb"):
            cluster.custom.delete_namespaced_custom_object(G, V, NS, P, name)
        wait_for(lambda: all(cluster.policy(n) is None for n in ("wa", "wb")), what="deleted")
