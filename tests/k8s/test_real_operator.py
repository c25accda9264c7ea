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

import contextlib
import json
import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import pytest
import yaml
from compaction_operator import handlers, injection, metrics
from compaction_operator.injection import SIDECAR_CONTAINER, SIDECAR_HASH_ANNOTATION, find_sidecar
from control_plane import ControlPlane, activated_kubeconfig, available, missing_reason
from kubelet import ConfigMapVolume, SidecarProcess, files_of
from operator_helpers import (
    IMAGE,
    ApiCluster,
    canonical,
    policy,
    running_operator,
    scrape_metrics,
    wait_for,
    webhook_operator,
    without_injection,
)
from ports import free_port

from cleaner.config import load_policy, parse_policy
from cleaner.generate import GeneratorConfig, generate

NS = "brokers"
TIMEOUT = 90.0

pytestmark = [
    pytest.mark.skipif(not available(), reason=missing_reason()),
    pytest.mark.xdist_group("control-plane"),
]


WEBHOOK = "kc-tests.kafkacleaner.io"


@pytest.fixture(params=["plain", "webhook"])
def as_the_chart(
    control_plane: ControlPlane, install_chart: Callable[..., pathlib.Path], request: pytest.FixtureRequest
) -> Iterator[ControlPlane]:
    """The chart installed (its RBAC and ServiceAccount; with the webhook, the rights kopf needs
    to keep its MutatingWebhookConfiguration), and this process's kubeconfig readers pointed
    at the API server with a token of that ServiceAccount."""
    webhook = f"webhook.enabled=true,webhook.manageConfiguration=true,webhook.configurationName={WEBHOOK}"
    kubeconfig = install_chart(*([webhook] if request.param == "webhook" else []))
    control_plane.kubectl("create", "namespace", NS, check=False)
    with activated_kubeconfig(kubeconfig):
        yield control_plane


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


POLICY, CONFIGMAP = "live", "live-kafka-cleaner"


def reconciliations() -> float:
    return metrics.REGISTRY.get_sample_value(
        "kafka_cleaner_operator_reconciliations_total", {"namespace": NS, "policy": POLICY}
    ) or 0.0


@pytest.mark.parametrize("as_the_chart", ["plain"], indirect=True)
def test_the_real_sidecar_reports_through_the_operator_over_real_rollouts(
    as_the_chart: ControlPlane, tmp_path: pathlib.Path
) -> None:
    """Inject (a real rollout), Ready at generation 1 with the broker's entry, dirty ratios and
    top partitions; a spec change reaches the ConfigMap, then the sidecar, with no rollout; a
    killed sidecar makes the policy Degraded and a restarted one Ready; pause freezes what
    reaches the cluster and resume publishes the pending spec; deletion removes the sidecar
    through another real rollout and deletes the ConfigMap. The operator calls as the chart's
    ServiceAccount throughout, so every call it makes is one the chart's RBAC allows."""
    plane = as_the_chart
    cluster = ApiCluster(kubernetes.config.new_client_from_config(config_file=str(plane.kubeconfig)), NS)
    data = tmp_path / "volumes" / "data"
    config = GeneratorConfig(topics=2, partitions=2, records=2000, keys=200, segment_bytes=64 * 1024,
                             compression="none")  # fmt: skip
    generate(data / "kafka-log0", config)
    data_before = files_of(data)
    _apply(plane, _broker())
    first = _running_pod(plane, with_sidecar=False)
    original = cluster.sts()
    port = free_port()

    def ready_at(generation: int) -> dict[str, Any] | None:
        status = cluster.status(POLICY)
        ready = cluster.condition(POLICY, "Ready")
        ok = (ready.get("status") == "True" and ready.get("observedGeneration") == generation
              and status.get("observedGeneration") == generation)  # fmt: skip
        return status if ok else None

    sidecar: SidecarProcess | None = None
    http = metrics.start_http_server("127.0.0.1", 0, lambda: True)
    try:
        with running_operator():
            target = {"statefulSet": "broker", "dataVolume": "data", "mountPath": "/var/lib/kafka",
                      "logDirs": ["kafka-log*"]}  # fmt: skip
            # Paced: the operator itself rolls broker-0 (the default, Manual, would restart nothing).
            manifest = policy(POLICY, target=target, sidecar={"port": port}, reporting={"intervalSeconds": 1},
                              rollout={"strategy": "Paced"},
                              topics=[{"match": "topic-.*", "cleanupPolicy": "compact"}])  # fmt: skip
            manifest["metadata"]["namespace"] = NS
            _apply(plane, manifest)

            # -- the StatefulSet controller replaces the pod; kwok runs it on the host network --
            pod = _running_pod(plane, with_sidecar=True)
            # Exactly the sidecar, its volume and annotations were added to the template.
            template = cluster.sts()["spec"]["template"]
            assert canonical(without_injection(template)) == canonical(original["spec"]["template"])
            first_hash = template["metadata"]["annotations"][SIDECAR_HASH_ANNOTATION]
            cr = cluster.policy(POLICY)
            published = wait_for(lambda: cluster.configmap(CONFIGMAP), timeout=TIMEOUT, what="the ConfigMap")
            (tmp_path / "policy.yaml").write_text(published["data"]["policy.yaml"])
            assert load_policy(tmp_path / "policy.yaml") == parse_policy(cr)
            assert published["metadata"]["ownerReferences"][0]["uid"] == cr["metadata"]["uid"]
            assert pod["metadata"]["uid"] != first["metadata"]["uid"]
            assert pod["status"]["podIP"] == "127.0.0.1"
            assert SIDECAR_HASH_ANNOTATION in pod["metadata"]["annotations"]
            container = find_sidecar(pod["spec"])[1]
            assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
            assert "readinessProbe" not in container  # never gates the broker pod
            # The API server's ServiceAccount admission gave the broker its token, not the sidecar.
            containers = {c["name"]: c for c in pod["spec"]["containers"] + pod["spec"]["initContainers"]}
            token = [m["name"] for m in containers["kafka"]["volumeMounts"] if m["name"].startswith("kube-api-access")]
            assert len(token) == 1
            assert token[0] not in {m["name"] for m in containers[SIDECAR_CONTAINER]["volumeMounts"]}

            [volume] = [v for v in pod["spec"]["volumes"] if v.get("configMap", {}).get("name") == CONFIGMAP]
            policy_volume = ConfigMapVolume(tmp_path / "volumes" / volume["name"], volume)
            assert policy_volume.sync(wait_for(lambda: cluster.configmap(CONFIGMAP), timeout=TIMEOUT,
                                               what="the ConfigMap"))  # fmt: skip
            sidecar = SidecarProcess(pod, {volume["name"]: policy_volume.root, "data": data}, tmp_path / "sidecar.log")
            assert sidecar.port == port
            sidecar.start()

            # -- Ready at generation 1 (kubectl wait, as a person or a pipeline would) ---------
            waited = plane.kubectl("wait", "-n", NS, "--for=condition=Ready", f"compactionpolicy/{POLICY}",
                                   f"--timeout={int(TIMEOUT)}s", check=False, timeout_s=TIMEOUT + 30)  # fmt: skip
            assert waited.returncode == 0, waited.stdout + waited.stderr
            status = wait_for(lambda: ready_at(1), timeout=TIMEOUT, what="Ready at generation 1")
            own = sidecar.status()
            assert own["broker"] == "broker-0" and own["policyGeneration"] == 1
            broker = status["brokers"]["broker-0"]
            assert broker["policyGeneration"] == 1 and broker["mode"] == "observe" and broker["state"] == "observing"
            assert broker["partitions"] == 4 and broker["uncleanablePartitions"] == 0
            assert 0 < broker["maxDirtyRatio"] <= 1 and broker["cleanableBytes"] > 0
            assert status["summary"]["brokers"] == "1/1"
            top = status["topPartitions"]
            assert {(p["topic"], p["partition"]) for p in top} == {(f"topic-{t}", p) for t in (0, 1) for p in (0, 1)}
            ready = cluster.condition(POLICY, "Ready")
            assert ready["reason"] == "AllBrokersReporting" and ready["message"].startswith("1/1 brokers reporting")

            # -- a spec change: the ConfigMap, then (once the kubelet syncs) the sidecar -------
            sts_version = cluster.sts()["metadata"]["resourceVersion"]
            generation = cluster.patch_spec(POLICY, {"topics": [{"match": "topic-0", "cleanupPolicy": "compact"}]})
            assert generation == 2
            configmap = wait_for(lambda: (c := cluster.configmap(CONFIGMAP)) and "generation: 2" in c["data"][
                "policy.yaml"] and c, timeout=TIMEOUT, what="the ConfigMap at generation 2")  # fmt: skip
            awaiting = wait_for(lambda: (c := cluster.condition(POLICY, "Reconciling")).get("reason")
                                == "AwaitingPolicy" and c, timeout=TIMEOUT, what="AwaitingPolicy")  # fmt: skip
            assert awaiting["status"] == "True" and "broker-0" in awaiting["message"]
            assert policy_volume.sync(configmap)
            wait_for(lambda: sidecar.status()["policyGeneration"] == 2, timeout=TIMEOUT, interval=0.2,
                     what="the sidecar at policyGeneration 2")  # fmt: skip
            wait_for(lambda: ready_at(2), timeout=TIMEOUT, what="Ready at generation 2")
            wait_for(lambda: {p["topic"] for p in cluster.status(POLICY)["topPartitions"]} == {"topic-0"},
                     timeout=TIMEOUT, what="top partitions of topic-0 only")  # fmt: skip
            assert cluster.sts()["metadata"]["resourceVersion"] == sts_version  # no rollout for a policy edit

            # -- the sidecar dies: Degraded, the pod named; restarted: Ready again --------------
            sidecar.kill()
            degraded = wait_for(lambda: (c := cluster.condition(POLICY, "Degraded")).get("status") == "True" and c,
                                timeout=TIMEOUT, what="Degraded")  # fmt: skip
            assert degraded["reason"] == "BrokersNotReporting" and "broker-0" in degraded["message"]
            assert cluster.status(POLICY)["brokers"]["broker-0"]["state"] == "unreachable"
            sidecar.start()
            wait_for(lambda: ready_at(2), timeout=TIMEOUT, what="Ready after the restart")
            assert cluster.condition(POLICY, "Degraded")["status"] == "False"

            # -- pause: only the ConfigMap changes (paused: the sidecar stops); reports go on ---------
            generation = cluster.patch_spec(POLICY, {"paused": True})
            wait_for(lambda: cluster.status(POLICY).get("paused") is True, timeout=TIMEOUT, what="paused")
            frozen_sts = cluster.sts()["metadata"]["resourceVersion"]
            configmap = wait_for(lambda: (c := cluster.configmap(CONFIGMAP)) and f"generation: {generation}" in c[
                "data"]["policy.yaml"] and c, timeout=TIMEOUT, what="the paused policy published")  # fmt: skip
            assert parse_policy(yaml.safe_load(configmap["data"]["policy.yaml"])).paused
            assert policy_volume.sync(configmap)
            wait_for(lambda: sidecar.status()["cleaner"]["state"] == "paused", timeout=TIMEOUT, interval=0.2,
                     what="the sidecar paused")  # fmt: skip
            paused_generation = cluster.patch_spec(POLICY, {"topics": [{"match": "topic-.*",
                                                                        "cleanupPolicy": "compact"}]})  # fmt: skip
            wait_for(lambda: cluster.status(POLICY).get("observedGeneration") == paused_generation,
                     timeout=TIMEOUT, what="the paused generation observed")  # fmt: skip
            rounds = reconciliations()
            wait_for(lambda: reconciliations() >= rounds + 2, timeout=TIMEOUT, what="two reporting rounds")
            assert cluster.sts()["metadata"]["resourceVersion"] == frozen_sts

            # -- resume: the pending spec is published and reaches the sidecar ---------------------
            generation = cluster.patch_spec(POLICY, {"paused": False})
            published = f"generation: {generation}"
            configmap = wait_for(lambda: (c := cluster.configmap(CONFIGMAP)) and published in c["data"]["policy.yaml"]
                                 and c, timeout=TIMEOUT, what="the resumed ConfigMap")  # fmt: skip
            assert policy_volume.sync(configmap)
            wait_for(lambda: (s := ready_at(generation)) and len(s["topPartitions"]) == 4, timeout=TIMEOUT,
                     what=f"Ready at generation {generation}, all topics again")  # fmt: skip

            # -- the operator's metrics ------------------------------------------------------------
            text = scrape_metrics(http.server_address[1])
            assert f'kafka_cleaner_operator_reconciliations_total{{namespace="{NS}",policy="{POLICY}"}}' in text
            assert f'kafka_cleaner_operator_stale_brokers{{namespace="{NS}",policy="{POLICY}"}} 0.0' in text
            assert "kafka_cleaner_operator_reconcile_duration_seconds_count" in text

            # -- a sidecar change touches the template: another real rollout ----------------------
            # (The paced step starts while every sidecar reports: the old one still runs.)
            new_port = free_port()
            cluster.patch_spec(POLICY, {"sidecar": {"port": new_port}})
            updated = wait_for(lambda: (t := cluster.sts()["spec"]["template"])["metadata"]["annotations"][
                SIDECAR_HASH_ANNOTATION] != first_hash and t, timeout=TIMEOUT, what="the sidecar updated")  # fmt: skip
            assert canonical(without_injection(updated)) == canonical(original["spec"]["template"])
            wait_for(lambda: (p := _running_pod(plane, with_sidecar=True)) and find_sidecar(p["spec"])[1]["ports"][0][
                "containerPort"] == new_port, timeout=TIMEOUT, what="broker-0 with the new port")  # fmt: skip
            sidecar.stop()

            # -- delete: a real rollout removes the sidecar, the ConfigMap goes -------------------
            plane.kubectl("delete", "-n", NS, "compactionpolicy", POLICY, "--wait=true", f"--timeout={int(TIMEOUT)}s")
            restored = _running_pod(plane, with_sidecar=False)
            assert SIDECAR_CONTAINER not in json.dumps(restored["spec"])
            assert json.dumps(cluster.sts()["spec"]["template"], sort_keys=True) == json.dumps(
                original["spec"]["template"], sort_keys=True)  # fmt: skip
            assert cluster.configmap(CONFIGMAP) is None
    finally:
        http.shutdown()
        http.server_close()
        if sidecar is not None:
            sidecar.close()
    assert files_of(data) == data_before  # observe mode: the log dir untouched
    assert "Traceback" not in (tmp_path / "sidecar.log").read_text()
    events = {e[:2] for e in cluster.events()}
    assert all(kind for kind, _ in events), sorted(events)  # every Event names the kind of its object
    assert {("CompactionPolicy", "SidecarInjected"), ("StatefulSet", "SidecarInjected"),
            ("CompactionPolicy", "SidecarUpdated"), ("CompactionPolicy", "PolicyPublished"),
            ("CompactionPolicy", "BrokersNotReporting"), ("CompactionPolicy", "DegradedCleared"),
            ("CompactionPolicy", "SidecarRemoved"), ("StatefulSet", "SidecarRemoved")} <= events  # fmt: skip


def _webhook_operator(plane: ControlPlane, tmp: pathlib.Path, **config: Any) -> contextlib.AbstractContextManager[None]:
    """The operator with its admission webhook, keeping the chart's MutatingWebhookConfiguration
    (``operator_helpers.webhook_operator``)."""
    return webhook_operator(plane, tmp, WEBHOOK, **config)


def _webhook_policy(name: str, app: str, **spec: Any) -> dict[str, Any]:
    """A policy whose sidecar the webhook injects into the pods labelled ``app``."""
    target = {"podSelector": {"matchLabels": {"app": app}}, "dataVolume": "data",
              "mountPath": "/var/lib/kafka", "logDirs": ["kafka-log*"], "injection": "webhook"}  # fmt: skip
    manifest = policy(name, target=target, **spec)
    manifest["metadata"]["namespace"] = NS
    return manifest


def _opted_in_broker(app: str) -> dict[str, Any]:
    """A broker StatefulSet named ``app`` whose pods carry the chart's opt-in label."""
    broker = _broker()
    broker["metadata"]["name"] = app
    broker["spec"]["selector"]["matchLabels"] = {"app": app}
    broker["spec"]["template"]["metadata"]["labels"] = {"app": app, "kafkacleaner.io/inject": "enabled"}
    return broker


@pytest.mark.parametrize("as_the_chart", ["webhook"], indirect=True)
def test_the_api_server_calls_the_webhook_over_tls_for_pods_a_statefulset_creates(
    as_the_chart: ControlPlane, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``injection: webhook``: kopf keeps the MutatingWebhookConfiguration (as the chart's
    ServiceAccount), the real API server calls kopf's server over TLS (a trustme certificate,
    caBundle from the operator) for the pod the StatefulSet controller creates, and the pod is
    created with the sidecar while the StatefulSet's template stays as it was. Then the webhook
    fails open: with its handler raising, the API server still creates the pod (unchanged,
    kubectl shows the warning) and the policy gets an InjectionFailed Event."""
    plane = as_the_chart
    with _webhook_operator(plane, tmp_path, expected_warnings=("webhook failed open",)):
        _apply(plane, _webhook_policy("selected", "wbroker"))
        wait_for(lambda: plane.kubectl("get", "mutatingwebhookconfiguration", WEBHOOK, check=False).returncode == 0
                 and _get(plane, "configmap", "selected-kafka-cleaner"), timeout=TIMEOUT,
                 what="the webhook configuration and the policy's ConfigMap")  # fmt: skip
        # The operator's configuration is the chart's: fails open, answers within 5 s, opt-in
        # pods only, and never the operator's own namespace or kube-system.
        [hook] = (_get(plane, "mutatingwebhookconfiguration", WEBHOOK) or {})["webhooks"]
        assert hook["failurePolicy"] == "Ignore" and hook["timeoutSeconds"] == 5, hook
        assert hook["namespaceSelector"]["matchExpressions"][0]["operator"] == "NotIn", hook
        assert "kube-system" in hook["namespaceSelector"]["matchExpressions"][0]["values"]
        # Opt-in: only pods with the chart's default label go through the webhook at all.
        _apply(plane, _opted_in_broker("wbroker"))
        pod = wait_for(lambda: _get(plane, "pod", "wbroker-0"), timeout=TIMEOUT, what="wbroker-0")
        found = find_sidecar(pod["spec"])
        assert found is not None and found[0] == "initContainers", pod["spec"]
        assert pod["metadata"]["annotations"]["kafkacleaner.io/policy"] == "selected"
        template = (_get(plane, "statefulset", "wbroker") or {})["spec"]["template"]
        assert find_sidecar(template["spec"]) is None

        def broken(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("the Kubernetes version is not known yet")

        monkeypatch.setattr(handlers, "inject_into_pod", broken)
        bare = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "wbroker-bare", "namespace": NS, "labels": {
                    "app": "wbroker", "kafkacleaner.io/inject": "enabled"}},
                "spec": {"containers": [{"name": "kafka", "image": "apache/kafka:4.1.0",
                                         "volumeMounts": [{"name": "data", "mountPath": "/var/lib/kafka"}]}],
                         "volumes": [{"name": "data", "emptyDir": {}}]}}  # fmt: skip
        path = plane.root / "bare.yaml"
        path.write_text(yaml.safe_dump(bare))
        created = plane.kubectl("create", "-f", str(path))
        assert "not injected" in created.stderr and "Kubernetes version is not known" in created.stderr
        assert find_sidecar((_get(plane, "pod", "wbroker-bare") or {})["spec"]) is None
        cluster = ApiCluster(kubernetes.config.new_client_from_config(config_file=str(plane.kubeconfig)), NS)
        wait_for(lambda: ("CompactionPolicy", "InjectionFailed") in [e[:2] for e in cluster.events()],
                 timeout=TIMEOUT, what="an InjectionFailed Event on the policy")  # fmt: skip
        monkeypatch.undo()
        plane.kubectl("delete", "-n", NS, "pod", "wbroker-bare", "--wait=false")
        # A pod the policy selects but without the opt-in label is never sent to the webhook.
        bare["metadata"] = {"name": "wbroker-unlabelled", "namespace": NS, "labels": {"app": "wbroker"}}
        path.write_text(yaml.safe_dump(bare))
        plane.kubectl("create", "-f", str(path))
        assert find_sidecar((_get(plane, "pod", "wbroker-unlabelled") or {})["spec"]) is None
        plane.kubectl("delete", "-n", NS, "pod", "wbroker-unlabelled", "--wait=false")
        plane.kubectl("delete", "-n", NS, "statefulset", "wbroker", "--wait=true")
        plane.kubectl("delete", "-n", NS, "compactionpolicy", "selected", "--wait=true", f"--timeout={int(TIMEOUT)}s")
    # The operator leaves its configuration behind (and no validating twin, as kopf's did).
    assert plane.kubectl("get", "validatingwebhookconfiguration", WEBHOOK, check=False).returncode != 0
    plane.kubectl("delete", "mutatingwebhookconfiguration", WEBHOOK, "--ignore-not-found")


@pytest.mark.parametrize("as_the_chart", ["webhook"], indirect=True)
def test_the_webhook_injects_the_pinned_image_and_stops_injecting_a_sidecar_it_rolled_back(
    as_the_chart: ControlPlane, tmp_path: pathlib.Path
) -> None:
    """``injection: webhook`` for a StatefulSet's pods, through the real API server: the image
    the policy first ran is pinned, so an operator restarted with another default image injects
    the same sidecar as before; a spec change whose sidecar keeps the pod from being scheduled
    is found past rollout.progressDeadlineSeconds, the policy is Stalled (SidecarRolledBack)
    and the pod deleted (a StatefulSet never replaces a pod that is not Ready), and the webhook
    no longer injects that sidecar: the broker comes back without it."""
    plane = as_the_chart
    cluster = ApiCluster(kubernetes.config.new_client_from_config(config_file=str(plane.kubeconfig)), NS)
    manifest = _webhook_policy("hooked", "hbroker", rollout={"progressDeadlineSeconds": 3},
                               reporting={"intervalSeconds": 1})
    # Stopped while the policy lives on: kopf cancels the policy's report daemon, and says so.
    with _webhook_operator(plane, tmp_path, expected_warnings=("Daemon 'report' is cancelled",)):
        _apply(plane, manifest)
        wait_for(lambda: cluster.status("hooked").get("rollout", {}).get("sidecarImage") == IMAGE,
                 timeout=TIMEOUT, what="the default image pinned in status.rollout")  # fmt: skip

    upgraded = "registry.example/kafka-cleaner:upgraded"
    with _webhook_operator(plane, tmp_path, sidecar_image=upgraded, expected_warnings=("has not become Ready",)):
        _apply(plane, _opted_in_broker("hbroker"))
        pod = wait_for(lambda: (p := _get(plane, "pod", "hbroker-0")) and p["status"].get("phase") == "Running" and p,
                       timeout=TIMEOUT, what="hbroker-0 running")  # fmt: skip
        found = find_sidecar(pod["spec"])
        assert found is not None and found[1]["image"] == IMAGE, "an operator upgrade changed the pinned image"

        # A change of the sidecar takes the operator's current default along, and asks for a
        # CPU no node has: the recreated pod is never scheduled.
        plane.kubectl("patch", "-n", NS, "compactionpolicy", "hooked", "--type=merge", "-p",
                      json.dumps({"spec": {"sidecar": {"resources": {"requests": {"cpu": "5000"}}}}}))
        wait_for(lambda: cluster.status("hooked").get("rollout", {}).get("sidecarImage") == upgraded,
                 timeout=TIMEOUT, what="the changed sidecar with the new default image")  # fmt: skip
        plane.kubectl("delete", "-n", NS, "pod", "hbroker-0", "--wait=false")
        stalled = wait_for(lambda: (c := cluster.condition("hooked", "Stalled")).get("status") == "True"
                           and c["reason"] == "SidecarRolledBack" and c, timeout=TIMEOUT,
                           what="Stalled: SidecarRolledBack")  # fmt: skip
        assert "pod hbroker-0 (Unschedulable" in stalled["message"], stalled["message"]
        assert "no longer injected by the webhook, and such pods are deleted one at a time" in stalled["message"]
        back = wait_for(lambda: (p := _get(plane, "pod", "hbroker-0")) and not p["metadata"].get("deletionTimestamp")
                        and p["status"].get("phase") == "Running" and p, timeout=TIMEOUT,
                        what="hbroker-0 back and running")  # fmt: skip
        assert find_sidecar(back["spec"]) is None
        assert (cluster.status("hooked")["rollout"]["rolledBack"]["sidecarHash"]
                == cluster.status("hooked")["rollout"]["sidecarHash"])
        plane.kubectl("delete", "-n", NS, "statefulset", "hbroker", "--wait=true")
        plane.kubectl("delete", "-n", NS, "compactionpolicy", "hooked", "--wait=true", f"--timeout={int(TIMEOUT)}s")
    plane.kubectl("delete", "mutatingwebhookconfiguration", WEBHOOK, "--ignore-not-found")


@pytest.mark.parametrize("as_the_chart", ["webhook"], indirect=True)
def test_a_rollout_step_outlives_a_round_that_finds_no_pod_of_its_target(
    as_the_chart: ControlPlane, tmp_path: pathlib.Path
) -> None:
    """A pod-selector target's workload is known from its pods only: a round between a pod's
    deletion and its recreation finds none (seen in CI, the broker deleted by hand). That round
    must keep the rollout step: the operator forgot it, began a new one after the pod came back
    with the changed sidecar, and never took the pod for the step's, so the sidecar that keeps
    it from being scheduled was never rolled back and the broker stayed down. Here the round
    with no pod is made certain: the StatefulSet is scaled to 0 and back."""
    plane = as_the_chart
    cluster = ApiCluster(kubernetes.config.new_client_from_config(config_file=str(plane.kubeconfig)), NS)
    manifest = _webhook_policy("scaled", "sbroker", rollout={"progressDeadlineSeconds": 3},
                               reporting={"intervalSeconds": 1})
    with _webhook_operator(plane, tmp_path, expected_warnings=("has not become Ready",)):
        _apply(plane, manifest)
        _apply(plane, _opted_in_broker("sbroker"))
        wait_for(lambda: (p := _get(plane, "pod", "sbroker-0")) and p["status"].get("phase") == "Running"
                 and find_sidecar(p["spec"]) is not None, timeout=TIMEOUT,
                 what="sbroker-0 running with the sidecar")  # fmt: skip
        plane.kubectl("patch", "-n", NS, "compactionpolicy", "scaled", "--type=merge", "-p",
                      json.dumps({"spec": {"sidecar": {"resources": {"requests": {"cpu": "5000"}}}}}))
        changed = wait_for(lambda: (r := cluster.status("scaled").get("rollout", {})).get("step", {}).get("sidecarHash")
                           == r.get("sidecarHash") and (r.get("pending") or 0) == 1 and r, timeout=TIMEOUT,
                           what="the step of the changed sidecar, sbroker-0 pending")  # fmt: skip
        plane.kubectl("scale", "-n", NS, "statefulset", "sbroker", "--replicas=0")
        wait_for(lambda: _get(plane, "pod", "sbroker-0") is None and "brokers" in (s := cluster.status("scaled"))
                 and "sbroker-0" not in s["brokers"] and s, timeout=TIMEOUT,
                 what="a round that found no pod")  # fmt: skip
        assert cluster.status("scaled")["rollout"].get("step") == changed["step"], "the round with no pod lost the step"
        plane.kubectl("scale", "-n", NS, "statefulset", "sbroker", "--replicas=1")
        stalled = wait_for(lambda: (c := cluster.condition("scaled", "Stalled")).get("status") == "True"
                           and c["reason"] == "SidecarRolledBack" and c, timeout=TIMEOUT,
                           what="Stalled: SidecarRolledBack")  # fmt: skip
        assert "pod sbroker-0 (Unschedulable" in stalled["message"], stalled["message"]
        back = wait_for(lambda: (p := _get(plane, "pod", "sbroker-0")) and not p["metadata"].get("deletionTimestamp")
                        and p["status"].get("phase") == "Running" and p, timeout=TIMEOUT,
                        what="sbroker-0 back and running")  # fmt: skip
        assert find_sidecar(back["spec"]) is None
        plane.kubectl("delete", "-n", NS, "statefulset", "sbroker", "--wait=true")
        plane.kubectl("delete", "-n", NS, "compactionpolicy", "scaled", "--wait=true", f"--timeout={int(TIMEOUT)}s")
    plane.kubectl("delete", "mutatingwebhookconfiguration", WEBHOOK, "--ignore-not-found")


@pytest.mark.parametrize("as_the_chart", ["plain"], indirect=True)
def test_a_pod_admission_would_refuse_is_never_rolled_out_and_the_reason_is_reported(
    as_the_chart: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A namespace at Pod Security ``enforce: restricted`` with a compliant broker. A sidecar
    that breaks the profile (a default gone wrong: the CRD's CEL rules refuse such a policy, see
    test_a_policy_editor_cannot_get_a_privileged_sidecar_injected) is dry-run first: the real
    PodSecurity admission refuses it, the StatefulSet is not touched, the broker keeps running,
    and the policy is Stalled with the API server's message and a Warning Event. With a
    compliant sidecar the same round patches, and the pod the StatefulSet controller creates
    passes the real admission with the sidecar and the policy's pull secret."""
    plane, ns = as_the_chart, "psa-brokers"
    plane.kubectl("create", "namespace", ns, check=False)
    plane.kubectl("label", "--overwrite", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    cluster = ApiCluster(kubernetes.config.new_client_from_config(config_file=str(plane.kubeconfig)), ns)
    restricted = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    broker = _broker()
    broker["metadata"]["namespace"] = ns
    spec = broker["spec"]["template"]["spec"]
    del spec["hostNetwork"]  # Pod Security baseline refuses the host network
    spec["securityContext"] = {"runAsNonRoot": True, "runAsUser": 1001, "seccompProfile": {"type": "RuntimeDefault"}}
    spec["containers"][0]["securityContext"] = restricted
    spec["imagePullSecrets"] = [{"name": "broker-pull"}]
    path = plane.root / "restricted-broker.yaml"
    path.write_text(yaml.safe_dump(broker))
    plane.kubectl("apply", "-f", str(path))

    def running(with_sidecar: bool) -> dict[str, Any] | None:
        p = cluster.pod("broker-0")
        if p is None or p["metadata"].get("deletionTimestamp") or p["status"].get("phase") != "Running":
            return None
        return p if (find_sidecar(p["spec"]) is not None) == with_sidecar else None

    first = wait_for(lambda: running(False), timeout=TIMEOUT, what="the restricted broker-0 running")
    original = cluster.sts()
    # A sidecar that escalates privileges: what the dry run is there to catch.
    monkeypatch.setitem(injection.RESTRICTED_SECURITY_CONTEXT, "allowPrivilegeEscalation", True)
    with running_operator():
        target = {"statefulSet": "broker", "dataVolume": "data", "mountPath": "/var/lib/kafka", "logDirs": ["data"]}
        manifest = policy("guarded", target=target, reporting={"intervalSeconds": 1}, rollout={"strategy": "Paced"},
                          sidecar={"imagePullSecrets": ["broker-pull", "cleaner-pull"]})
        manifest["metadata"]["namespace"] = ns
        path.write_text(yaml.safe_dump(manifest))
        plane.kubectl("apply", "-f", str(path))
        stalled = wait_for(lambda: (c := cluster.condition("guarded", "Stalled")).get("status") == "True" and c,
                           timeout=TIMEOUT, what="Stalled")  # fmt: skip
        assert stalled["reason"] == "AdmissionRejected", stalled
        assert 'violates PodSecurity "restricted' in stalled["message"], stalled
        assert "allowPrivilegeEscalation" in stalled["message"] and "without this change is admitted" in \
            stalled["message"], stalled
        wait_for(lambda: ("CompactionPolicy", "AdmissionRejected") in [e[:2] for e in cluster.events()],
                 timeout=TIMEOUT, what="an AdmissionRejected Event")  # fmt: skip
        sts = cluster.sts()
        assert sts["metadata"]["generation"] == original["metadata"]["generation"]
        assert canonical(sts["spec"]["template"]) == canonical(original["spec"]["template"])
        assert cluster.pod("broker-0")["metadata"]["uid"] == first["metadata"]["uid"]  # never restarted

        # The sidecar fixed: the next round dry-runs, admits and patches; the real pod passes too.
        monkeypatch.undo()
        pod = wait_for(lambda: running(True), timeout=TIMEOUT, what="broker-0 with the sidecar")
        assert pod["spec"]["imagePullSecrets"] == [{"name": "broker-pull"}, {"name": "cleaner-pull"}]
        template = cluster.sts()["spec"]["template"]
        assert template["metadata"]["annotations"]["kafkacleaner.io/image-pull-secrets"] == "cleaner-pull"
        wait_for(lambda: cluster.condition("guarded", "Stalled").get("status") == "False", timeout=TIMEOUT,
                 what="Stalled cleared")  # fmt: skip

        plane.kubectl("delete", "-n", ns, "compactionpolicy", "guarded", "--wait=true", f"--timeout={int(TIMEOUT)}s")
        wait_for(lambda: running(False), timeout=TIMEOUT, what="broker-0 without the sidecar")
        # The broker's own pull secret stays; only the one the operator added went.
        assert canonical(cluster.sts()["spec"]["template"]) == canonical(original["spec"]["template"])
    plane.kubectl("delete", "namespace", ns, "--wait=false")


@pytest.mark.parametrize("as_the_chart", ["plain"], indirect=True)
def test_a_policy_editor_cannot_get_a_privileged_sidecar_injected(as_the_chart: ControlPlane) -> None:
    """Someone bound only to the chart's aggregated CompactionPolicy role (what ``edit`` and
    ``admin`` gain from it), with a token the API server issued: the API server refuses every
    policy whose sidecar would be privileged or run as root (the CRD's CEL rules), admits a
    restricted one, and the user can neither create pods nor patch StatefulSets: the operator's
    rights never pass to them."""
    plane, ns = as_the_chart, "editors"
    plane.kubectl("create", "namespace", ns, check=False)
    plane.kubectl("create", "serviceaccount", "policy-editor", "-n", ns, check=False)
    plane.kubectl("create", "rolebinding", "policy-editor", "-n", ns, "--clusterrole=kc-kafka-cleaner-operator-edit",
                  f"--serviceaccount={ns}:policy-editor", check=False)  # fmt: skip
    token = plane.kubectl("create", "token", "policy-editor", "-n", ns, "--duration=600s").stdout.strip()
    kubeconfig = plane.root / "kubeconfig-editor"
    kubeconfig.write_text(yaml.safe_dump(plane.kubeconfig_for(token)))

    def create(name: str, security: dict[str, Any]) -> Any:
        target = {"statefulSet": "broker", "dataVolume": "data", "mountPath": "/var/lib/kafka", "logDirs": ["data"]}
        manifest = policy(name, target=target, sidecar={"securityContext": security})
        manifest["metadata"]["namespace"] = ns
        path = plane.root / f"{name}.yaml"
        path.write_text(yaml.safe_dump(manifest))
        # A server-side dry run: authorized and admitted as a create, and nothing is left behind
        # for the operators of the later tests to reconcile in a namespace being deleted.
        return plane.kubectl("create", "--dry-run=server", "-f", str(path), kubeconfig=kubeconfig, check=False)

    allowed = create("restricted", {"runAsUser": 1001, "runAsGroup": 1001,
                                    "capabilities": {"add": ["NET_BIND_SERVICE"]}})
    assert allowed.returncode == 0, allowed.stderr  # the role does allow creating policies
    for name, security, field in [
        ("privileged", {"privileged": True}, "privileged"),
        ("escalating", {"allowPrivilegeEscalation": True}, "allowPrivilegeEscalation"),
        ("capable", {"capabilities": {"add": ["SYS_ADMIN"]}}, "capabilities.add[0]"),
        ("root", {"runAsUser": 0, "runAsNonRoot": False}, "runAsUser"),
        ("unconfined", {"seccompProfile": {"type": "Unconfined"}}, "seccompProfile.type"),
    ]:
        refused = create(name, security)
        assert refused.returncode != 0, f"{name} was admitted"
        assert f"spec.sidecar.securityContext.{field}" in refused.stderr and "Pod Security restricted" in \
            refused.stderr, refused.stderr
    for verb, resource in [("create", "pods"), ("patch", "statefulsets.apps"), ("patch", "configmaps")]:
        can = plane.kubectl("auth", "can-i", verb, resource, "-n", ns, kubeconfig=kubeconfig, check=False)
        assert can.stdout.strip() == "no", (verb, resource)
    plane.kubectl("delete", "namespace", ns, "--wait=false")


@pytest.mark.parametrize("as_the_chart", ["plain"], indirect=True)
def test_a_dry_run_refused_for_the_broker_itself_says_the_sidecar_is_not_the_cause(
    as_the_chart: ControlPlane,
) -> None:
    """A ResourceQuota with no room for one more pod: the dry run of the injected pod and of the
    unchanged one are both refused (the dry run counts a pod beside the running broker), the
    message says so, nothing is patched; with room, the same policy is injected."""
    plane, ns = as_the_chart, "quota-brokers"
    plane.kubectl("create", "namespace", ns, check=False)
    plane.kubectl("create", "quota", "pods", "--hard=pods=1", "-n", ns)
    cluster = ApiCluster(kubernetes.config.new_client_from_config(config_file=str(plane.kubeconfig)), ns)
    broker = _broker()
    broker["metadata"]["namespace"] = ns
    path = plane.root / "quota-broker.yaml"
    path.write_text(yaml.safe_dump(broker))
    plane.kubectl("apply", "-f", str(path))
    wait_for(lambda: (p := cluster.pod("broker-0")) and p["status"].get("phase") == "Running", timeout=TIMEOUT,
             what="broker-0 running")  # fmt: skip
    wait_for(lambda: json.loads(plane.kubectl("get", "quota", "pods", "-n", ns, "-o", "json").stdout)["status"].get(
        "used", {}).get("pods") == "1", timeout=TIMEOUT, what="the quota's usage")  # fmt: skip
    original = cluster.sts()
    with running_operator():
        target = {"statefulSet": "broker", "dataVolume": "data", "mountPath": "/var/lib/kafka", "logDirs": ["data"]}
        manifest = policy("quota", target=target, reporting={"intervalSeconds": 1}, rollout={"strategy": "Paced"})
        manifest["metadata"]["namespace"] = ns
        path.write_text(yaml.safe_dump(manifest))
        plane.kubectl("apply", "-f", str(path))
        stalled = wait_for(lambda: (c := cluster.condition("quota", "Stalled")).get("status") == "True" and c,
                           timeout=TIMEOUT, what="Stalled")  # fmt: skip
        assert stalled["reason"] == "AdmissionRejected", stalled
        assert "exceeded quota" in stalled["message"] and "without this change is rejected too" in \
            stalled["message"], stalled
        assert cluster.sts()["metadata"]["generation"] == original["metadata"]["generation"]
        plane.kubectl("patch", "quota", "pods", "-n", ns, "--type=merge", "-p", '{"spec":{"hard":{"pods":"2"}}}')
        wait_for(lambda: find_sidecar(cluster.sts()["spec"]["template"]["spec"]) is not None, timeout=TIMEOUT,
                 what="the sidecar injected once the quota has room")  # fmt: skip
        # The roll done before the deletion (a removal patch racing the StatefulSet controller's
        # writes fails its resourceVersion test, and is retried with an error in the log).
        wait_for(lambda: (p := cluster.pod("broker-0")) and p["status"].get("phase") == "Running"
                 and find_sidecar(p["spec"]) is not None, timeout=TIMEOUT, what="broker-0 with the sidecar")
        plane.kubectl("delete", "-n", ns, "compactionpolicy", "quota", "--wait=true", f"--timeout={int(TIMEOUT)}s")
    plane.kubectl("delete", "namespace", ns, "--wait=false")
