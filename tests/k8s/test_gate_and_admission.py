"""Issue 20, items 2 and 4, on the real control plane, with the operator as the chart's
ServiceAccount (its RBAC judged by the real authorizer):

* the start-up gate: the sidecar is a native sidecar with a startupProbe on ``/startupz`` only
  where every node's kubelet is >= 1.29 (a node's ``status.nodeInfo.kubeletVersion``, not the
  API server's version), else a regular container run with ``--no-gate``; a stage-mode policy
  on brokers whose grace period is shorter than its termination commit's bound is warned;
* pods the API server would refuse: the CRD refuses data mounts on the sidecar's own paths,
  and the webhook dry-runs the pod with the sidecar: one the API server refuses (here a
  LimitRange, or a request above its limit) is admitted without the sidecar, not refused;
* item 7, what a policy author may choose: an image outside the installer's allow-list, or a
  Secret/hostPath named as a data volume, is refused by the operator and by the webhook (the
  pure decisions are in test_policy_limits.py).
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import pytest
import yaml
from compaction_operator.injection import find_sidecar
from control_plane import ControlPlane, activated_kubeconfig, available, missing_reason
from operator_helpers import ApiCluster, policy, running_operator, wait_for, webhook_operator

pytestmark = [
    pytest.mark.skipif(not available(), reason=missing_reason()),
    pytest.mark.xdist_group("control-plane"),
]

TIMEOUT = 90.0
WEBHOOK = "kc-gate-tests.kafkacleaner.io"
OLD_NODE = "kubelet-1-28"
#: kopf cancels a policy's report daemon when the operator stops while the policy lives on.
STOPPED_WITH_A_POLICY = ("Daemon 'report' is cancelled",)


def _apply(plane: ControlPlane, namespace: str, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    path = plane.root / "gate-object.yaml"
    path.write_text(yaml.safe_dump(obj))
    return plane.kubectl("apply", "-n", namespace, "-f", str(path), check=False)


def _broker(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    kafka = {"name": "kafka", "image": "apache/kafka:4.1.0", "ports": [{"containerPort": 9092, "name": "client"}],
             "volumeMounts": [{"name": "data", "mountPath": "/var/lib/kafka"}]}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name},
            "spec": {"replicas": 1, "serviceName": name, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name, **(labels or {})}},
                                  "spec": {"hostNetwork": True, "containers": [kafka],
                                           "volumes": [{"name": "data", "emptyDir": {}}]}}}}


@pytest.fixture
def as_the_chart(control_plane: ControlPlane, install_chart: Callable[..., pathlib.Path]) -> Iterator[ControlPlane]:
    """The chart installed with its webhook (the operator keeps the configuration), and this
    process's kubeconfig readers pointed at the API server as the chart's ServiceAccount."""
    kubeconfig = install_chart(f"webhook.enabled=true,webhook.manageConfiguration=true,"
                               f"webhook.configurationName={WEBHOOK}")
    with activated_kubeconfig(kubeconfig):
        yield control_plane


@contextlib.contextmanager
def _namespace(plane: ControlPlane, name: str) -> Iterator[ApiCluster]:
    plane.kubectl("create", "namespace", name, check=False)
    try:
        yield ApiCluster(kubernetes.config.new_client_from_config(config_file=str(plane.kubeconfig)), name)
    finally:
        # A test that fails with its policies alive: their operator has stopped, so their
        # finalizers stay (conftest's no_abandoned_policy_outlives_its_test releases them).
        plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


@contextlib.contextmanager
def _old_kubelet(plane: ControlPlane) -> Iterator[None]:
    """A node whose kubelet is 1.28 (the version skew policy allows three minors below the
    API server): not one kwok plays, so no pod lands on it; it only has to exist."""
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": OLD_NODE, "labels": {"kubernetes.io/hostname": OLD_NODE}},
            "spec": {"unschedulable": True},
            "status": {"nodeInfo": {"kubeletVersion": "v1.28.15", "containerRuntimeVersion": "containerd://1.7"}}}
    path = plane.root / "old-node.yaml"
    path.write_text(yaml.safe_dump(node))
    plane.kubectl("apply", "-f", str(path))
    try:
        yield
    finally:
        plane.kubectl("delete", "node", OLD_NODE, "--ignore-not-found", "--wait=true")


def _template_sidecar(cluster: ApiCluster, sts: str) -> tuple[str, dict[str, Any]] | None:
    found = find_sidecar(cluster.sts(sts)["spec"]["template"]["spec"])
    return (found[0], dict(found[1])) if found is not None else None


def test_the_sidecar_holds_the_broker_only_where_every_kubelet_runs_native_sidecars(
    as_the_chart: ControlPlane,
) -> None:
    """With one node at kubelet 1.28 (API server 1.34) the sidecar goes in as a regular
    container with ``--no-gate``: a native sidecar there would be a plain init container that
    never exits, and the broker would never start. Without that node, the next operator (it
    reads the nodes at start) moves it to a native sidecar whose startupProbe on /startupz
    outlasts twice the gate's bound plus a margin, and the real API server admits the pod
    (the operator's dry run of the pod before its patch). The stage-mode
    policy's termination commit (2 x 60 s) does not fit the brokers' default grace period
    (30 s): a Warning Event says so."""
    plane = as_the_chart
    with _namespace(plane, "gate") as cluster:
        assert _apply(plane, "gate", _broker("broker")).returncode == 0
        target = {"statefulSet": "broker", "dataVolume": "data", "mountPath": "/var/lib/kafka", "logDirs": ["data"],
                  "injection": "statefulSet"}
        manifest = policy("gated", mode="stage", target=target, stage={"maxCommitSeconds": 60},
                          reporting={"intervalSeconds": 1})

        with _old_kubelet(plane), running_operator(expected_warnings=STOPPED_WITH_A_POLICY):
            assert _apply(plane, "gate", manifest).returncode == 0
            where, container = wait_for(lambda: _template_sidecar(cluster, "broker"), timeout=TIMEOUT,
                                        what="the sidecar in the StatefulSet's template (one kubelet at 1.28)")
            assert where == "containers", "a native sidecar although a kubelet is 1.28"
            assert container["args"][-1] == "--no-gate" and "startupProbe" not in container
            assert "restartPolicy" not in container

        with running_operator(expected_warnings=STOPPED_WITH_A_POLICY):  # every kubelet at 1.34 now
            def native() -> dict[str, Any] | None:
                found = _template_sidecar(cluster, "broker")
                return found[1] if found is not None and found[0] == "initContainers" else None

            container = wait_for(native, timeout=TIMEOUT, what="the sidecar moved to a native sidecar")
            assert container["restartPolicy"] == "Always" and "--no-gate" not in container["args"]
            probe = container["startupProbe"]
            assert probe["httpGet"]["path"] == "/startupz" and probe["httpGet"]["port"] == "cleaner-metrics"
            assert probe["failureThreshold"] * probe["periodSeconds"] > 2 * 60 + 60
            message = cluster.wait_for_event("CompactionPolicy", "TerminationGracePeriodTooShort", timeout=TIMEOUT)
            assert "terminationGracePeriodSeconds is 30" in message and "120 s" in message
            # The operator dry-ran the pod of the new template before it patched (the real API
            # server admits a startupProbe only on a native sidecar): nothing stalled.
            assert cluster.condition("gated", "Stalled").get("reason") != "AdmissionRejected"
            plane.kubectl("delete", "-n", "gate", "compactionpolicy", "gated", "--wait=true",
                          f"--timeout={int(TIMEOUT)}s")


def _webhook_operator(plane: ControlPlane, tmp: pathlib.Path) -> contextlib.AbstractContextManager[None]:
    return webhook_operator(plane, tmp, WEBHOOK, expected_warnings=STOPPED_WITH_A_POLICY)


def test_the_webhook_never_makes_a_pod_the_api_server_refuses(as_the_chart: ControlPlane,
                                                              tmp_path: pathlib.Path) -> None:
    """A namespace whose LimitRange allows a container 256Mi at most; the policy's sidecar
    asks 512Mi (the default). The webhook dry-runs the pod with the sidecar, the real API
    server refuses it (LimitRanger), and the pod is admitted without the sidecar: created, with
    a warning to its creator and an AdmissionRejected Event on the policy. Before, the API
    server refused the pod itself (a broker that cannot be created). A policy whose sidecar
    requests more than its limit is invalid (Stalled, InvalidSpec) and injects nothing; one
    that mounts a data volume on the sidecar's own policy dir is refused by the CRD."""
    plane, ns = as_the_chart, "admission"
    with _namespace(plane, ns) as cluster, _webhook_operator(plane, tmp_path):
        limits = {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "small"},
                  "spec": {"limits": [{"type": "Container", "max": {"memory": "256Mi"}}]}}
        assert _apply(plane, ns, limits).returncode == 0
        target = {"podSelector": {"matchLabels": {"app": "hooked"}}, "dataVolume": "data",
                  "mountPath": "/var/lib/kafka", "logDirs": ["kafka-log*"], "injection": "webhook"}
        refused = _apply(plane, ns, policy("bad-mount", target={**target, "mountPath": "/etc/kafka-cleaner"}))
        assert refused.returncode != 0 and "the sidecar needs /etc/kafka-cleaner" in refused.stderr, refused.stderr
        assert _apply(plane, ns, policy("hooked", target=target)).returncode == 0
        wait_for(lambda: plane.kubectl("get", "mutatingwebhookconfiguration", WEBHOOK, check=False).returncode == 0
                 and cluster.configmap("hooked-kafka-cleaner"), timeout=TIMEOUT,
                 what="the webhook configuration and the policy's ConfigMap")  # fmt: skip
        bare = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "hooked-0", "labels": {"app": "hooked", "kafkacleaner.io/inject": "enabled"}},
                "spec": {"containers": [{"name": "kafka", "image": "apache/kafka:4.1.0",
                                         "resources": {"limits": {"memory": "128Mi"}},
                                         "volumeMounts": [{"name": "data", "mountPath": "/var/lib/kafka"}]}],
                         "volumes": [{"name": "data", "emptyDir": {}}]}}
        path = plane.root / "hooked-pod.yaml"
        path.write_text(yaml.safe_dump(bare))
        created = plane.kubectl("create", "-n", ns, "-f", str(path), check=False)
        assert created.returncode == 0, f"the API server refused the broker pod: {created.stderr}"
        assert "was not injected" in created.stderr and "256Mi" in created.stderr, created.stderr
        assert find_sidecar(cluster.pod("hooked-0")["spec"]) is None
        message = cluster.wait_for_event("CompactionPolicy", "AdmissionRejected", timeout=TIMEOUT,
                                         containing="hooked-0")
        assert "dry run" in message

        # Within the limits, the same pod gets the sidecar (the dry run admits it).
        plane.kubectl("patch", "-n", ns, "compactionpolicy", "hooked", "--type=merge", "-p", json.dumps(
            {"spec": {"sidecar": {"resources": {"limits": {"cpu": "100m", "memory": "200Mi"}}}}}))
        bare["metadata"]["name"] = "hooked-1"
        path.write_text(yaml.safe_dump(bare))

        def injected() -> bool:
            plane.kubectl("delete", "pod", "-n", ns, "hooked-1", "--ignore-not-found", "--wait=true")
            plane.kubectl("create", "-n", ns, "-f", str(path))
            return find_sidecar((cluster.pod("hooked-1") or {}).get("spec") or {}) is not None

        wait_for(injected, timeout=TIMEOUT, interval=1.0, what="hooked-1 created with the sidecar (the new limits)")

        # A request above its limit: the API server takes the policy (CEL cannot compare
        # quantities on 1.28), the operator does not, and nothing is injected.
        plane.kubectl("patch", "-n", ns, "compactionpolicy", "hooked", "--type=merge", "-p", json.dumps(
            {"spec": {"sidecar": {"resources": {"requests": {"memory": "250Mi"}}}}}))
        stalled = wait_for(lambda: (c := cluster.condition("hooked", "Stalled")).get("reason") == "InvalidSpec" and c,
                           timeout=TIMEOUT, what="Stalled: InvalidSpec (a request above its limit)")
        assert "above the limit" in stalled["message"], stalled
        bare["metadata"]["name"] = "hooked-2"
        path.write_text(yaml.safe_dump(bare))

        def admitted_without() -> bool:  # once the webhook's policy index has the edit
            plane.kubectl("delete", "pod", "-n", ns, "hooked-2", "--ignore-not-found", "--wait=true")
            created = plane.kubectl("create", "-n", ns, "-f", str(path), check=False)
            assert created.returncode == 0, f"the API server refused the broker pod: {created.stderr}"
            return find_sidecar((cluster.pod("hooked-2") or {}).get("spec") or {}) is None

        wait_for(admitted_without, timeout=TIMEOUT, interval=1.0, what="hooked-2 created without the sidecar")
        for name in ("hooked-0", "hooked-1", "hooked-2"):
            plane.kubectl("delete", "pod", "-n", ns, name, "--wait=false", check=False)
        plane.kubectl("delete", "-n", ns, "compactionpolicy", "hooked", "--wait=true", f"--timeout={int(TIMEOUT)}s")
    plane.kubectl("delete", "mutatingwebhookconfiguration", WEBHOOK, "--ignore-not-found")


def test_a_policy_author_gets_neither_another_image_nor_a_secret_volume(as_the_chart: ControlPlane,
                                                                       tmp_path: pathlib.Path) -> None:
    """Issue 20, item 7: a policy author chooses the sidecar's image and the volumes it mounts,
    beside the broker. An image outside the allow-list (the default sidecar image's repository,
    ``registry.example/kafka-cleaner`` here) or a Secret/hostPath named as a data volume is
    refused by the operator before it patches a StatefulSet (Stalled, PolicyNotAllowed, the
    template untouched) and by the webhook before it injects into a pod (the pod is created
    without the sidecar, its creator warned, a PolicyNotAllowed Event). Before, both injected."""
    plane, ns = as_the_chart, "limits"
    with _namespace(plane, ns) as cluster, _webhook_operator(plane, tmp_path):
        broker = _broker("broker")
        broker["spec"]["template"]["spec"]["volumes"] += [{"name": "creds", "secret": {"secretName": "broker-tls"}},
                                                          {"name": "host", "hostPath": {"path": "/"}}]
        assert _apply(plane, ns, broker).returncode == 0
        target = {"statefulSet": "broker", "dataVolume": "data", "mountPath": "/var/lib/kafka", "logDirs": ["data"],
                  "injection": "statefulSet"}
        assert _apply(plane, ns, policy("templated", target=target,
                                        sidecar={"image": "evil.example/miner:1"})).returncode == 0

        def refused(name: str, text: str) -> dict[str, Any]:
            return wait_for(lambda: (c := cluster.condition(name, "Stalled")).get("reason") == "PolicyNotAllowed"
                            and text in c.get("message", "") and c, timeout=TIMEOUT,
                            what=f"Stalled: PolicyNotAllowed naming {text!r}")  # fmt: skip

        stalled = refused("templated", "spec.sidecar.image 'evil.example/miner:1'")
        assert "registry.example/kafka-cleaner" in stalled["message"], stalled
        assert _template_sidecar(cluster, "broker") is None
        plane.kubectl("patch", "-n", ns, "compactionpolicy", "templated", "--type=merge", "-p", json.dumps(
            {"spec": {"sidecar": {"image": None}, "target": {"dataVolume": "creds"}}}))
        refused("templated", "target.dataVolume 'creds' is a secret volume")
        assert _template_sidecar(cluster, "broker") is None
        plane.kubectl("patch", "-n", ns, "compactionpolicy", "templated", "--type=merge", "-p", json.dumps(
            {"spec": {"target": {"dataVolume": "data"}}}))
        wait_for(lambda: _template_sidecar(cluster, "broker"), timeout=TIMEOUT,
                 what="the sidecar injected once the policy names the data volume and an allowed image")
        plane.kubectl("delete", "-n", ns, "compactionpolicy", "templated", "--wait=true", f"--timeout={int(TIMEOUT)}s")

        # The webhook: the pod is created, without the sidecar.
        hooked = {"podSelector": {"matchLabels": {"app": "hooked"}}, "dataVolume": "data",
                  "mountPath": "/var/lib/kafka", "logDirs": ["kafka-log*"], "injection": "webhook"}
        assert _apply(plane, ns, policy("hooked", target=hooked, sidecar={"image": "evil.example/miner:1"})
                      ).returncode == 0  # fmt: skip
        wait_for(lambda: plane.kubectl("get", "mutatingwebhookconfiguration", WEBHOOK, check=False).returncode == 0
                 and cluster.configmap("hooked-kafka-cleaner"), timeout=TIMEOUT,
                 what="the webhook configuration and the policy's ConfigMap")  # fmt: skip
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "hooked-0", "labels": {"app": "hooked", "kafkacleaner.io/inject": "enabled"}},
               "spec": {"containers": [{"name": "kafka", "image": "apache/kafka:4.1.0",
                                        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/kafka"}]}],
                        "volumes": [{"name": "data", "emptyDir": {}}, {"name": "host", "hostPath": {"path": "/"}}]}}
        path = plane.root / "limits-pod.yaml"
        path.write_text(yaml.safe_dump(pod))

        def created_without(text: str) -> str | None:  # once the webhook's policy index has the edit
            plane.kubectl("delete", "pod", "-n", ns, "hooked-0", "--ignore-not-found", "--wait=true")
            created = plane.kubectl("create", "-n", ns, "-f", str(path), check=False)
            assert created.returncode == 0, f"the API server refused the broker pod: {created.stderr}"
            assert find_sidecar(cluster.pod("hooked-0")["spec"]) is None, "the sidecar was injected"
            return created.stderr if text in created.stderr else None

        warning = wait_for(lambda: created_without("spec.sidecar.image 'evil.example/miner:1'"), timeout=TIMEOUT,
                           interval=1.0, what="hooked-0 created without the sidecar (image not allowed)")
        assert "was not injected" in warning and "registry.example/kafka-cleaner" in warning, warning
        # The StatefulSet policy's PolicyNotAllowed Event above is listed too, maybe first.
        message = cluster.wait_for_event("CompactionPolicy", "PolicyNotAllowed", timeout=TIMEOUT, containing="hooked-0")
        assert "spec.sidecar.image" in message
        plane.kubectl("patch", "-n", ns, "compactionpolicy", "hooked", "--type=merge", "-p", json.dumps(
            {"spec": {"sidecar": {"image": None}, "target": {"dataVolume": "host"}}}))
        wait_for(lambda: created_without("target.dataVolume 'host' is a hostPath volume"), timeout=TIMEOUT,
                 interval=1.0, what="hooked-0 created without the sidecar (a hostPath data volume)")
        plane.kubectl("delete", "pod", "-n", ns, "hooked-0", "--wait=false", check=False)
        plane.kubectl("delete", "-n", ns, "compactionpolicy", "hooked", "--wait=true", f"--timeout={int(TIMEOUT)}s")
    plane.kubectl("delete", "mutatingwebhookconfiguration", WEBHOOK, "--ignore-not-found")


def test_a_pinned_image_the_installer_no_longer_allows_gives_way_to_the_default(as_the_chart: ControlPlane) -> None:
    """The default image is pinned per policy (status.rollout.sidecarImage) so an operator
    upgrade changes no template. An upgrade that moves the default to another repository (a
    mirror) also moves the allow-list: the pinned image is then not allowed, and the policy
    takes the new default instead of stalling with PolicyNotAllowed."""
    plane = as_the_chart
    with _namespace(plane, "repin") as cluster:
        assert _apply(plane, "repin", _broker("broker")).returncode == 0
        target = {"statefulSet": "broker", "dataVolume": "data", "mountPath": "/var/lib/kafka", "logDirs": ["data"],
                  "injection": "statefulSet"}

        def image() -> str | None:
            found = _template_sidecar(cluster, "broker")
            return found[1]["image"] if found is not None else None

        with running_operator(expected_warnings=STOPPED_WITH_A_POLICY):
            assert _apply(plane, "repin", policy("pinned", target=target)).returncode == 0
            wait_for(lambda: image() == "registry.example/kafka-cleaner:e2e"
                     and cluster.status("pinned").get("rollout", {}).get("sidecarImage") == image(),
                     timeout=TIMEOUT, what="the default image injected and pinned")  # fmt: skip
        mirror = "mirror.example/kafka-cleaner:e2e"
        with running_operator(expected_warnings=STOPPED_WITH_A_POLICY, sidecar_image=mirror):
            wait_for(lambda: image() == mirror, timeout=TIMEOUT,
                     what="the new default image (the pinned one is no longer allowed)")
            assert cluster.condition("pinned", "Stalled").get("reason") != "PolicyNotAllowed"
            plane.kubectl("delete", "-n", "repin", "compactionpolicy", "pinned", "--wait=true",
                          f"--timeout={int(TIMEOUT)}s")
