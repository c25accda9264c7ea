"""The operator (the real kopf, in-process) against the real control plane, authenticated as
the chart's ServiceAccount with a token the API server issued (TokenRequest): a call its
RBAC lacks is refused by the real authorizer, logged by kopf, and fails the test.

The StatefulSet controller of kube-controller-manager rolls the broker pod when the operator
injects the sidecar and when it removes it; the scheduler places the pods on kwok's nodes and
kwok marks them Running and Ready. The broker pod uses the host network, so kwok gives it the
node's address (127.0.0.1), where the test runs the injected container as a real
``kafka-cleaner sidecar`` process (``test_operator_sidecar_e2e.SidecarProcess``: the kubelet's
part that kwok does not play). ``kubectl wait`` then sees the policy Ready.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from compaction_operator.injection import SIDECAR_CONTAINER, SIDECAR_HASH_ANNOTATION, find_sidecar
from control_plane import ControlPlane, available, missing_reason
from fakekube import activated_kubeconfig
from operator_helpers import free_port, policy, running_operator, wait_for
from test_operator_sidecar_e2e import ConfigMapVolume, SidecarProcess

from cleaner.generate import GeneratorConfig, generate

REPO = pathlib.Path(__file__).resolve().parents[2]
HELM = REPO / ".tools" / "bin" / "helm"
CHART = REPO / "helm" / "kafka-cleaner-operator"
NS, RELEASE_NS = "brokers", "cleaner-operator"
ACCOUNT = "kc-kafka-cleaner-operator"
TIMEOUT = 90.0

pytestmark = [
    pytest.mark.skipif(not available(), reason=missing_reason()),
    pytest.mark.skipif(not HELM.exists(), reason=f"helm is not installed at {HELM} (make setup installs it)"),
    pytest.mark.xdist_group("control-plane"),
]


WEBHOOK = "kc-tests.kafkacleaner.io"


@pytest.fixture(params=["plain", "webhook"])
def as_the_chart(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """The chart installed (its RBAC and ServiceAccount; with the webhook, the rights kopf needs
    to keep its MutatingWebhookConfiguration), and this process's kubeconfig readers pointed
    at the API server with a token of that ServiceAccount."""
    plane = control_plane
    values = ["--set", f"webhook.enabled=true,webhook.manageConfiguration=true,webhook.configurationName={WEBHOOK}"]
    helm = [str(HELM), f"--kubeconfig={plane.kubeconfig}", "upgrade", "--install", "kc", str(CHART), "-n", RELEASE_NS]
    helm += ["--create-namespace", *(values if request.param == "webhook" else []), "--wait", "--timeout=120s"]
    proc = subprocess.run(helm, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plane.kubectl("create", "namespace", NS, check=False)
    # Right after the CRD is created the API server answers 429 "storage is (re)initializing"
    # for a moment; kopf would log its retry as an error.
    wait_for(lambda: plane.kubectl("get", "compactionpolicies", "-A", check=False).returncode == 0,
             timeout=TIMEOUT, what="the CompactionPolicy storage")
    token = plane.kubectl("create", "token", ACCOUNT, "-n", RELEASE_NS, "--duration=3600s").stdout.strip()
    path = plane.root / "kubeconfig-operator"
    path.write_text(yaml.safe_dump(plane.kubeconfig_for(token)))
    with activated_kubeconfig(path):
        yield plane


def _get(plane: ControlPlane, *what: str) -> dict[str, Any] | None:
    proc = plane.kubectl("get", *what, "-n", NS, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def _apply(plane: ControlPlane, obj: dict[str, Any]) -> None:
    path = plane.root / "object.yaml"
    path.write_text(yaml.safe_dump(obj))
    plane.kubectl("apply", "-n", NS, "-f", str(path))


def _broker() -> dict[str, Any]:
    kafka = {
        "name": "kafka",
        "image": "apache/kafka:4.1.0",
        "ports": [{"containerPort": 9092, "name": "client"}],
        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/kafka"}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "broker", "namespace": NS},
        "spec": {
            "replicas": 1,
            "serviceName": "broker",
            "selector": {"matchLabels": {"app": "broker"}},
            "template": {
                "metadata": {"labels": {"app": "broker"}},
                "spec": {"hostNetwork": True, "containers": [kafka], "volumes": [{"name": "data", "emptyDir": {}}]},
            },
        },
    }


def _running_pod(plane: ControlPlane, with_sidecar: bool) -> dict[str, Any]:
    """broker-0 once the StatefulSet controller has (re)created it with or without the sidecar
    and kwok reports it Running."""

    def pod() -> dict[str, Any] | None:
        p = _get(plane, "pod", "broker-0")
        if p is None or p["metadata"].get("deletionTimestamp") or p["status"].get("phase") != "Running":
            return None
        return p if (find_sidecar(p["spec"]) is not None) == with_sidecar else None

    return wait_for(
        pod, timeout=TIMEOUT, interval=0.2, what=f"broker-0 running {'with' if with_sidecar else 'without'} the sidecar"
    )


@pytest.mark.parametrize("as_the_chart", ["plain"], indirect=True)
def test_the_operator_injects_through_a_real_rollout_reports_ready_and_removes_the_sidecar(
    as_the_chart: ControlPlane, tmp_path: pathlib.Path
) -> None:
    plane = as_the_chart
    data = tmp_path / "volumes" / "data"
    generate(
        data / "kafka-log0",
        GeneratorConfig(topics=1, partitions=2, records=2000, keys=200, segment_bytes=64 * 1024, compression="none"),
    )
    _apply(plane, _broker())
    first = _running_pod(plane, with_sidecar=False)
    port = free_port()
    sidecar: SidecarProcess | None = None
    try:
        with running_operator():
            manifest = policy(
                "live",
                target={
                    "statefulSet": "broker",
                    "dataVolume": "data",
                    "mountPath": "/var/lib/kafka",
                    "logDirs": ["kafka-log*"],
                },
                sidecar={"port": port},
                topics=[{"match": "topic-.*", "cleanupPolicy": "compact"}],
                reporting={"intervalSeconds": 1},
            )
            manifest["metadata"]["namespace"] = NS
            _apply(plane, manifest)
            pod = _running_pod(plane, with_sidecar=True)
            assert pod["metadata"]["uid"] != first["metadata"]["uid"]  # the controller replaced it
            assert pod["status"]["podIP"] == "127.0.0.1"
            assert SIDECAR_HASH_ANNOTATION in pod["metadata"]["annotations"]
            sts = _get(plane, "statefulset", "broker")
            assert sts is not None and sts["status"].get("updateRevision") == sts["status"].get("currentRevision")

            [volume] = [v for v in pod["spec"]["volumes"] if v.get("configMap", {}).get("name") == "live-kafka-cleaner"]
            configmap = wait_for(
                lambda: _get(plane, "configmap", "live-kafka-cleaner"), timeout=TIMEOUT, what="the policy's ConfigMap"
            )
            policy_volume = ConfigMapVolume(tmp_path / "volumes" / volume["name"], volume)
            policy_volume.sync(configmap)
            pod["metadata"]["namespace"] = NS
            # The API server's ServiceAccount admission gave the broker its token, not the sidecar.
            containers = {c["name"]: c for c in pod["spec"]["containers"] + pod["spec"]["initContainers"]}
            token = [m["name"] for m in containers["kafka"]["volumeMounts"] if m["name"].startswith("kube-api-access")]
            assert len(token) == 1
            assert token[0] not in {m["name"] for m in containers[SIDECAR_CONTAINER]["volumeMounts"]}
            volumes = {volume["name"]: policy_volume.root, "data": data}
            sidecar = SidecarProcess(pod, volumes, tmp_path / "sidecar.log")
            sidecar.start()
            waited = plane.kubectl(
                "wait",
                "-n",
                NS,
                "--for=condition=Ready",
                "compactionpolicy/live",
                f"--timeout={int(TIMEOUT)}s",
                check=False,
                timeout_s=TIMEOUT + 30,
            )
            assert waited.returncode == 0, waited.stdout + waited.stderr
            status = (_get(plane, "compactionpolicy", "live") or {})["status"]
            assert list(status["brokers"]) == ["broker-0"], status
            assert status["brokers"]["broker-0"]["cleanableBytes"] > 0  # pulled from the sidecar's /status

            plane.kubectl("delete", "-n", NS, "compactionpolicy", "live", "--wait=true", f"--timeout={int(TIMEOUT)}s")
            sidecar.stop()
            restored = _running_pod(plane, with_sidecar=False)
            assert SIDECAR_CONTAINER not in json.dumps(restored["spec"])
            assert _get(plane, "configmap", "live-kafka-cleaner") is None
    finally:
        if sidecar is not None:
            sidecar.close()


@pytest.mark.parametrize("as_the_chart", ["webhook"], indirect=True)
def test_the_api_server_calls_the_webhook_over_tls_for_pods_a_statefulset_creates(
    as_the_chart: ControlPlane, tmp_path: pathlib.Path
) -> None:
    """``injection: webhook``: kopf keeps the MutatingWebhookConfiguration (as the chart's
    ServiceAccount), the real API server calls kopf's server over TLS (a trustme certificate,
    caBundle from the operator) for the pod the StatefulSet controller creates, and the pod is
    created with the sidecar while the StatefulSet's template stays as it was."""
    plane = as_the_chart
    serving = plane.ca.issue_cert("127.0.0.1")
    cert, key, ca = tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "ca.crt"
    serving.cert_chain_pems[0].write_to_path(str(cert))
    serving.private_key_pem.write_to_path(str(key))
    plane.ca.cert_pem.write_to_path(str(ca))
    port = free_port()
    with running_operator(webhook_enabled=True, webhook_addr="127.0.0.1", webhook_port=port,
                          webhook_cert_file=str(cert), webhook_key_file=str(key), webhook_ca_file=str(ca),
                          webhook_host="127.0.0.1", webhook_configuration=WEBHOOK):  # fmt: skip
        target = {"podSelector": {"matchLabels": {"app": "wbroker"}}, "dataVolume": "data",
                  "mountPath": "/var/lib/kafka", "logDirs": ["kafka-log*"], "injection": "webhook"}  # fmt: skip
        manifest = policy("selected", target=target)
        manifest["metadata"]["namespace"] = NS
        _apply(plane, manifest)
        wait_for(lambda: plane.kubectl("get", "mutatingwebhookconfiguration", WEBHOOK, check=False).returncode == 0
                 and _get(plane, "configmap", "selected-kafka-cleaner"), timeout=TIMEOUT,
                 what="the webhook configuration and the policy's ConfigMap")  # fmt: skip
        broker = _broker()
        broker["metadata"]["name"] = "wbroker"
        labels = {"app": "wbroker"}
        broker["spec"]["selector"]["matchLabels"] = broker["spec"]["template"]["metadata"]["labels"] = labels
        _apply(plane, broker)
        pod = wait_for(lambda: _get(plane, "pod", "wbroker-0"), timeout=TIMEOUT, what="wbroker-0")
        found = find_sidecar(pod["spec"])
        assert found is not None and found[0] == "initContainers", pod["spec"]
        assert pod["metadata"]["annotations"]["kafkacleaner.io/policy"] == "selected"
        template = (_get(plane, "statefulset", "wbroker") or {})["spec"]["template"]
        assert find_sidecar(template["spec"]) is None
        plane.kubectl("delete", "-n", NS, "statefulset", "wbroker", "--wait=true")
        plane.kubectl("delete", "-n", NS, "compactionpolicy", "selected", "--wait=true", f"--timeout={int(TIMEOUT)}s")
    # kopf leaves its configurations behind (and an empty validating one of the same name).
    kinds = "mutatingwebhookconfiguration,validatingwebhookconfiguration"
    plane.kubectl("delete", kinds, WEBHOOK, "--ignore-not-found")
