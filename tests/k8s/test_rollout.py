"""Sidecar rollouts on the real control plane (spec.rollout): the StatefulSet controller of
kube-controller-manager recreates the pods, kwok's fake kubelet makes them Ready, and the
operator calls as the chart's ServiceAccount (the real RBAC authorizer judges each call).

* OnDelete: a pod gets the sidecar when someone deletes it, the others keep running.
* Manual (the default): a new policy restarts no pod; the status names each pending pod with
  the command that rolls it; the person's roll (lowering the partition) makes them current and
  the StatefulSet gets its own update strategy back. An operator restarted with another
  default image changes no template (the image is pinned per policy).
* Paced: the operator rolls one broker at a time, never two unavailable at once, and waits
  while a rolled broker's report holds fewer partitions than before its restart.
* A sidecar that keeps its pod from being scheduled makes the rollout Stalled (named) and is
  taken out again: the broker comes back without it. A broker back Ready but without its
  report stalls the roll (RolloutStalled) and keeps the sidecar.
* StrimziPodSet pods: Paced asks KafkaRoller (strimzi.io/manual-rolling-update on the pods).
"""

from __future__ import annotations

import copy
import http.server
import json
import pathlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import pytest
from broker_lock import lock_is_free_for_another_process
from compaction_operator import metrics
from compaction_operator.injection import SIDECAR_CONTAINER, SIDECAR_HASH_ANNOTATION, find_sidecar
from compaction_operator.rollout import STRIMZI_MANUAL_ROLLING_UPDATE, UPDATE_STRATEGY_ANNOTATION
from control_plane import ControlPlane, activated_kubeconfig, available, missing_reason
from operator_helpers import (
    IMAGE,
    ApiCluster,
    G,
    P,
    V,
    broker_statefulset,
    policy,
    running_operator,
    sts_target,
    wait_for,
)
from ports import free_port

from cleaner.clock import MockTime
from cleaner.generate import GeneratorConfig, generate
from cleaner.sidecar.service import Sidecar, SidecarOptions

NS = "rollout"
TIMEOUT = 120.0
NOW_MS = 1_700_000_000_000
#: Whose hold a StatefulSet's is (``rollout.HELD_BY_ANNOTATION``; spelled out: the contract).
HELD_BY_ANNOTATION = "kafkacleaner.io/held-by"

pytestmark = [
    pytest.mark.skipif(not available(), reason=missing_reason()),
    pytest.mark.xdist_group("control-plane"),
]


@pytest.fixture
def cluster(control_plane: ControlPlane, install_chart: Callable[..., pathlib.Path]) -> Iterator[ApiCluster]:
    kubeconfig = install_chart("webhook.enabled=true")
    control_plane.kubectl("create", "namespace", NS, check=False)
    admin = ApiCluster(kubernetes.config.new_client_from_config(config_file=str(control_plane.kubeconfig)), NS)
    # An earlier test's pods still on their way out would be adopted by this test's StatefulSet.
    try:
        wait_for(lambda: not _pods(admin), timeout=TIMEOUT, what=f"no pod left in namespace {NS} by an earlier test")
    except AssertionError as e:
        raise AssertionError(f"{e}; pods: {_pod_states(admin)}") from None
    with activated_kubeconfig(kubeconfig):
        yield admin
    # No operator runs any more to release the finalizers: drop them, so that no policy of
    # this test is still being deleted (and rolling) when the next test's operator starts.
    for item in (admin._json(admin.custom.list_namespaced_custom_object, G, V, NS, P) or {}).get("items", []):
        admin.custom.patch_namespaced_custom_object(G, V, NS, P, item["metadata"]["name"],
                                                    {"metadata": {"finalizers": None}})
    control_plane.kubectl("delete", P, "--all", "-n", NS, "--wait=false", check=False)
    # A test's StrimziPodSet (its CRD exists once a test made it), whose name the next reuses.
    control_plane.kubectl("delete", "strimzipodsets.core.strimzi.io", "--all", "-n", NS, "--wait=true",
                          check=False, timeout_s=120)
    # Wait until the pods are gone: a StatefulSet of the next test would adopt them.
    control_plane.kubectl("delete", "statefulsets,pods", "--all", "-n", NS, "--wait=true", "--timeout=90s",
                          check=False, timeout_s=120)


def _brokers(cluster: ApiCluster, replicas: int, *, host_network: bool = False,
             parallel: bool = False) -> dict[str, Any]:
    sts = broker_statefulset("broker")
    sts["spec"]["replicas"] = replicas
    if parallel:  # as the Bitnami Kafka chart: no pod waits for a lower ordinal to be Ready
        sts["spec"]["podManagementPolicy"] = "Parallel"
    # No storage provisioner here: the data volume is an emptyDir instead of a claim template.
    del sts["spec"]["volumeClaimTemplates"]
    sts["spec"]["template"]["spec"]["volumes"].append({"name": "data", "emptyDir": {}})
    if host_network:
        sts["spec"]["template"]["spec"]["hostNetwork"] = True
        # On the host network every declared port is a host port the scheduler must find free
        # on a node: another test's broker (9092) still on one of the three nodes left this
        # test's third broker Unschedulable. Only the sidecar's port (a free one) is needed.
        for container in sts["spec"]["template"]["spec"]["containers"]:
            container.pop("ports", None)
    cluster.apps.create_namespaced_stateful_set(NS, sts)
    try:
        return wait_for(lambda: _all_ready(cluster, replicas), timeout=TIMEOUT, what=f"{replicas} broker pods Ready")
    except AssertionError as e:
        raise AssertionError(f"{e}; pods: {_pod_states(cluster)}") from None


def _pod_states(cluster: ApiCluster) -> dict[str, str]:
    """Each pod's name with whether it is Ready, being deleted, or why it is not scheduled."""
    states = {}
    for name, pod in _pods(cluster).items():
        conditions = {c["type"]: c for c in pod.get("status", {}).get("conditions", [])}
        states[name] = ("deleting" if pod["metadata"].get("deletionTimestamp") else
                        "Ready" if _ready(pod) else
                        conditions.get("PodScheduled", {}).get("reason") or pod.get("status", {}).get("phase", "?"))
    return states


def _pods(cluster: ApiCluster) -> dict[str, dict[str, Any]]:
    listed = cluster._json(cluster.core.list_namespaced_pod, NS) or {}
    return {p["metadata"]["name"]: p for p in listed.get("items", [])}


def _ready(pod: dict[str, Any]) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def _all_ready(cluster: ApiCluster, replicas: int, sidecar_hash: str | None = "any") -> dict[str, Any] | None:
    """The pods by name once all ``replicas`` are Ready (and run ``sidecar_hash``: "any" ignores it,
    None: no sidecar)."""
    pods = _pods(cluster)
    names = {f"broker-{i}" for i in range(replicas)}
    if set(pods) != names or not all(_ready(p) for p in pods.values()):
        return None
    if sidecar_hash != "any":
        for pod in pods.values():
            has = find_sidecar(pod["spec"]) is not None
            got = pod["metadata"].get("annotations", {}).get(SIDECAR_HASH_ANNOTATION) if has else None
            if got != sidecar_hash:
                return None
    return pods


def _uids(pods: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {name: p["metadata"]["uid"] for name, p in pods.items()}


def _create(cluster: ApiCluster, manifest: dict[str, Any]) -> None:
    cluster.custom.create_namespaced_custom_object(G, V, NS, P, manifest)


def _template_hash(cluster: ApiCluster) -> str | None:
    return cluster.sts()["spec"]["template"]["metadata"].get("annotations", {}).get(SIDECAR_HASH_ANNOTATION)


def _gauge(name: str, policy_name: str) -> float | None:
    return metrics.REGISTRY.get_sample_value(f"kafka_cleaner_operator_{name}", {"namespace": NS, "policy": policy_name})


class Observer:
    """Watches the broker pods from a thread: the most that were unavailable (missing, not
    Ready or being deleted) at any one look, and the order in which pods were replaced."""

    def __init__(self, cluster: ApiCluster, replicas: int) -> None:
        self.cluster, self.replicas = cluster, replicas
        self.worst, self.replaced = 0, []  # type: tuple[int, list[str]]
        self.revisions: list[str] = []  # each replacement's controller-revision-hash, for a failure's message
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Observer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), "the observer could not list the pods a last time"

    def _run(self) -> None:
        """Looks until stopped, and once more after: the test stops it as soon as its own look
        saw the last pod replaced, which may be before this thread's next look (a fresh-clone
        run saw five of six replacements)."""
        seen: dict[str, tuple[str, str | None]] = {}
        while True:
            stopping = self._stop.is_set()
            try:
                pods = _pods(self.cluster)
            except Exception:
                time.sleep(0.05)
                continue
            down = sum(1 for i in range(self.replicas) if not (p := pods.get(f"broker-{i}")) or not _ready(p))
            self.worst = max(self.worst, down)
            for name, pod in pods.items():
                uid = pod["metadata"]["uid"]
                revision = pod["metadata"].get("labels", {}).get("controller-revision-hash")
                if name in seen and seen[name][0] != uid:
                    self.replaced.append(name)
                    self.revisions.append(f"{name}: {seen[name][1]} -> {revision}")
                seen[name] = uid, revision
            if stopping:
                return
            time.sleep(0.05)


class FakeSidecars:
    """``GET /status`` for every broker on the host network (they share 127.0.0.1 and the
    port): a valid v1 report whose log dirs hold ``partitions`` partitions."""

    def __init__(self, port: int) -> None:
        self.partitions = 4
        self.in_sync: dict[str, int] | None = None
        """Counts of ``outOfIsr``, ``underReplicated`` and ``atMinIsr`` for an ``inSync``
        section (its metadata as of now), or None for a report without one."""
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = json.dumps(fake.report()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def report(self) -> dict[str, Any]:
        return {
            "version": 1, "broker": "broker", "mode": "observe", "policyGeneration": 1,
            "scannedAt": "2026-01-01T00:00:00Z",
            "logDirs": [{"path": "/var/lib/kafka/data", "partitions": self.partitions, "lockHeldByBroker": True,
                         "freeBytes": 10_000_000, "uncleanablePartitions": 0}],
            "cleaner": {"threads": 1, "deadThreads": 0, "lastRunAt": None, "maxDirtyRatio": 0.1,
                        "maxCompactionDelaySeconds": 0.0, "bytesReclaimedTotal": 0, "stagedBytes": 0,
                        "state": "observing"},
            "topics": [], "partitions": [], "errors": [],
            **({"inSync": {
                "brokerId": 0, "replicas": 10, "noSpareReplica": 0, "metadataOffset": 100,
                "metadataTimeMs": int(time.time() * 1000),
                **{key: {"count": n, "examples": [f"orders-{i}" for i in range(min(n, 5))]}
                   for key, n in self.in_sync.items()},
            }} if self.in_sync is not None else {}),
        }  # fmt: skip

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_manual_restarts_nothing_names_the_pending_pods_and_pins_the_image(cluster: ApiCluster) -> None:
    before = _brokers(cluster, 2)
    with running_operator():
        _create(cluster, policy("manual", target=sts_target(), reporting={"intervalSeconds": 1}))
        wait_for(lambda: _template_hash(cluster), timeout=TIMEOUT, what="the sidecar in the template")
        sts = cluster.sts()
        assert sts["spec"]["updateStrategy"]["rollingUpdate"]["partition"] == 2  # the staged rollout holds
        assert UPDATE_STRATEGY_ANNOTATION in sts["metadata"]["annotations"]
        rollout = wait_for(lambda: (r := cluster.status("manual").get("rollout", {})).get("pending") == 2 and r,
                           timeout=TIMEOUT, what="two pending pods in the status")  # fmt: skip
        assert rollout["strategy"] == "Manual" and rollout["sidecarImage"] == IMAGE
        assert [p["pod"] for p in rollout["pendingPods"]] == ["broker-0", "broker-1"]
        assert rollout["pendingPods"][1]["roll"] == (
            "kubectl patch statefulset -n rollout broker --type merge -p "
            "'{\"spec\":{\"updateStrategy\":{\"rollingUpdate\":{\"partition\":1}}}}'")
        assert rollout["pendingPods"][0]["roll"] == (  # never a partition 0 that rolls both at once
            "roll broker-1 first, one ordinal at a time from the highest: a partition of 0 now would roll 2 brokers "
            "at once")
        reconciling = cluster.condition("manual", "Reconciling")
        assert (reconciling["status"], reconciling["reason"]) == ("False", "AwaitingManualRollout")
        assert "rollout.strategy Manual" in reconciling["message"]
        assert _gauge("rollout_pending_pods", "manual") == 2
        _await_rounds("manual", 2)  # a few reconciliations more: still nothing restarts
        assert _uids(_pods(cluster)) == _uids(before)
        template = cluster.sts()["spec"]["template"]

    # -- an operator upgrade (another default image) changes no template --------------------
    with running_operator(sidecar_image="registry.example/kafka-cleaner:upgraded"):
        rounds = metrics.REGISTRY.get_sample_value("kafka_cleaner_operator_reconciliations_total",
                                                   {"namespace": NS, "policy": "manual"}) or 0
        cluster.core.patch_namespaced_pod("broker-0", NS, {"metadata": {"labels": {"touch": "1"}}})
        wait_for(lambda: (metrics.REGISTRY.get_sample_value("kafka_cleaner_operator_reconciliations_total",
                                                            {"namespace": NS, "policy": "manual"}) or 0) >= rounds + 1,
                 timeout=TIMEOUT, what="a round of the upgraded operator")  # fmt: skip
        _await_rounds("manual", 1)
        assert cluster.sts()["spec"]["template"] == template
        assert cluster.status("manual")["rollout"]["sidecarImage"] == IMAGE

        # -- the person's roll: lower the partition; the StatefulSet controller rolls ----------
        cluster.apps.patch_namespaced_stateful_set(
            "broker", NS, {"spec": {"updateStrategy": {"rollingUpdate": {"partition": 0}}}})
        wanted = template["metadata"]["annotations"][SIDECAR_HASH_ANNOTATION]
        wait_for(lambda: _all_ready(cluster, 2, wanted), timeout=TIMEOUT, what="both pods with the sidecar")
        wait_for(lambda: cluster.status("manual").get("rollout", {}).get("pending") == 0, timeout=TIMEOUT,
                 what="nothing pending")  # fmt: skip
        sts = wait_for(lambda: (s := cluster.sts()) and UPDATE_STRATEGY_ANNOTATION not in s["metadata"].get(
            "annotations", {}) and s, timeout=TIMEOUT, what="the StatefulSet's own strategy back")  # fmt: skip
        assert sts["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}

        # -- an explicit image: the template changes, held again; no pod restarts ----------------
        rolled = _uids(_pods(cluster))
        cluster.patch_spec("manual", {"sidecar": {"image": "registry.example/kafka-cleaner:upgraded"}})
        wait_for(lambda: find_sidecar(cluster.sts()["spec"]["template"]["spec"])[1]["image"].endswith(":upgraded"),
                 timeout=TIMEOUT, what="the new image in the template")  # fmt: skip
        assert cluster.sts()["spec"]["updateStrategy"]["rollingUpdate"]["partition"] == 2
        _await_rounds("manual", 1)
        assert _uids(_pods(cluster)) == rolled

        # -- deletion is Manual too: the sidecar leaves the template, the pods wait for the
        # person's roll, and only then do the finalizer and the ConfigMap go ------------------
        cluster.custom.delete_namespaced_custom_object(G, V, NS, P, "manual")
        wait_for(lambda: _template_hash(cluster) is None, timeout=TIMEOUT, what="the sidecar out of the template")
        time.sleep(2)  # a policy being deleted runs no rounds to count: a while, then nothing restarted
        assert cluster.policy("manual") is not None and cluster.configmap("manual-kafka-cleaner") is not None
        assert _uids(_pods(cluster)) == rolled
        cluster.wait_for_event("CompactionPolicy", "AwaitingRollout")
        cluster.apps.patch_namespaced_stateful_set(
            "broker", NS, {"spec": {"updateStrategy": {"rollingUpdate": {"partition": 0}}}})
        wait_for(lambda: _all_ready(cluster, 2, None), timeout=TIMEOUT, what="both pods without the sidecar")
        wait_for(lambda: cluster.policy("manual") is None, timeout=TIMEOUT, what="the policy gone")
        assert cluster.configmap("manual-kafka-cleaner") is None
        assert UPDATE_STRATEGY_ANNOTATION not in cluster.sts()["metadata"].get("annotations", {})


def test_ondelete_gives_the_sidecar_to_the_pod_someone_deletes(cluster: ApiCluster) -> None:
    before = _brokers(cluster, 2)
    with running_operator():
        _create(cluster, policy("ondelete", target=sts_target(), rollout={"strategy": "OnDelete"},
                                reporting={"intervalSeconds": 1}))
        wanted = wait_for(lambda: _template_hash(cluster), timeout=TIMEOUT, what="the sidecar in the template")
        assert cluster.sts()["spec"]["updateStrategy"] == {"type": "OnDelete"}
        rollout = wait_for(lambda: (r := cluster.status("ondelete").get("rollout", {})).get("pending") == 2 and r,
                           timeout=TIMEOUT, what="two pending pods")  # fmt: skip
        assert rollout["pendingPods"][0]["roll"] == f"kubectl delete pod -n {NS} broker-0"
        _await_rounds("ondelete", 2)
        assert _uids(_pods(cluster)) == _uids(before)
        cluster.core.delete_namespaced_pod("broker-0", NS)
        pods = wait_for(lambda: (p := _pods(cluster)).get("broker-0") and _ready(p["broker-0"]) and p[
            "broker-0"]["metadata"]["uid"] != before["broker-0"]["metadata"]["uid"] and p, timeout=TIMEOUT,
            what="broker-0 recreated")  # fmt: skip
        assert pods["broker-0"]["metadata"]["annotations"][SIDECAR_HASH_ANNOTATION] == wanted
        assert pods["broker-1"]["metadata"]["uid"] == before["broker-1"]["metadata"]["uid"]
        assert find_sidecar(pods["broker-1"]["spec"]) is None
        wait_for(lambda: cluster.status("ondelete")["rollout"].get("pending") == 1, timeout=TIMEOUT,
                 what="one pod pending")  # fmt: skip


def test_deleting_a_policy_that_lost_a_target_conflict_leaves_the_owners_hold(cluster: ApiCluster) -> None:
    """A second policy for the same StatefulSet stalls (TargetConflict) and injects nothing.
    Deleting it must leave the first policy's Manual hold alone: its finalizer released it
    (no pod of its own was waiting), and the StatefulSet controller would then have rolled
    every broker to the first policy's sidecar at once (seen in a fresh-clone CI run, where
    the two finalizers' releases collided with a 422)."""
    before = _brokers(cluster, 2)
    with running_operator(expected_warnings=("OverlappingPolicies", "TargetConflict")):
        _create(cluster, policy("owner", target=sts_target()))
        wait_for(lambda: cluster.status("owner").get("rollout", {}).get("pending") == 2, timeout=TIMEOUT,
                 what="two pending pods")  # fmt: skip
        held = cluster.sts()
        assert held["spec"]["updateStrategy"]["rollingUpdate"]["partition"] == 2
        _create(cluster, policy("second", target=sts_target()))
        wait_for(lambda: cluster.condition("second", "Stalled").get("reason") == "TargetConflict", timeout=TIMEOUT,
                 what="the second policy stalled")  # fmt: skip
        cluster.custom.delete_namespaced_custom_object(G, V, NS, P, "second")
        wait_for(lambda: cluster.policy("second") is None, timeout=TIMEOUT, what="the second policy gone")
        sts = cluster.sts()  # whatever its finalizer did to the StatefulSet, it did before it went
        assert sts["spec"]["updateStrategy"] == held["spec"]["updateStrategy"]
        assert sts["metadata"]["annotations"][UPDATE_STRATEGY_ANNOTATION] == held["metadata"]["annotations"][
            UPDATE_STRATEGY_ANNOTATION]
        assert _uids(_pods(cluster)) == _uids(before)
        assert cluster.status("owner")["rollout"]["pending"] == 2


def test_switching_from_manual_to_paced_changes_the_hold(cluster: ApiCluster) -> None:
    """Paced under a Manual partition would delete a pod that comes back unchanged: the hold
    follows the strategy, so the first paced pod comes back with the sidecar."""
    before = _brokers(cluster, 2)
    with running_operator():
        _create(cluster, policy("switch", target=sts_target(), reporting={"intervalSeconds": 1}))
        wanted = wait_for(lambda: _template_hash(cluster), timeout=TIMEOUT, what="the sidecar in the template")
        wait_for(lambda: cluster.status("switch").get("rollout", {}).get("pending") == 2, timeout=TIMEOUT,
                 what="two pending pods")  # fmt: skip
        assert cluster.sts()["spec"]["updateStrategy"]["rollingUpdate"]["partition"] == 2
        cluster.patch_spec("switch", {"rollout": {"strategy": "Paced"}})
        pod = wait_for(lambda: (p := _pods(cluster).get("broker-1")) and _ready(p) and p["metadata"]["uid"] != before[
            "broker-1"]["metadata"]["uid"] and p, timeout=TIMEOUT, what="broker-1 rolled")  # fmt: skip
        assert pod["metadata"]["annotations"][SIDECAR_HASH_ANNOTATION] == wanted
        assert cluster.sts()["spec"]["updateStrategy"] == {"type": "OnDelete"}
        # broker-1's sidecar cannot answer here (no process runs it): the next step waits.
        gate = wait_for(lambda: "no report from broker-1" in (g := cluster.status("switch")["rollout"].get(
            "gate", "")) and g, timeout=TIMEOUT, what="the gate waiting for broker-1's report")  # fmt: skip
        assert gate
        assert _pods(cluster)["broker-0"]["metadata"]["uid"] == before["broker-0"]["metadata"]["uid"]


def test_paced_rolls_one_broker_at_a_time_and_waits_for_the_reports(cluster: ApiCluster) -> None:
    port = free_port()
    fake = FakeSidecars(port)
    _brokers(cluster, 3, host_network=True)
    manifest = policy("paced", target=sts_target(), sidecar={"port": port}, reporting={"intervalSeconds": 1},
                      rollout={"strategy": "Paced", "progressDeadlineSeconds": 300})
    try:
        with Observer(cluster, 3) as observer, running_operator():
            _create(cluster, manifest)
            wanted = wait_for(lambda: _template_hash(cluster), timeout=TIMEOUT, what="the sidecar in the template")
            assert cluster.sts()["spec"]["updateStrategy"] == {"type": "OnDelete"}
            wait_for(lambda: _all_ready(cluster, 3, wanted), timeout=3 * TIMEOUT, what="three pods with the sidecar")
            wait_for(lambda: UPDATE_STRATEGY_ANNOTATION not in cluster.sts()["metadata"].get("annotations", {}),
                     timeout=TIMEOUT, what="the StatefulSet's own strategy back")  # fmt: skip
            wait_for(lambda: len(observer.replaced) >= 3, timeout=TIMEOUT, what="the observer to see three replaced")
            assert observer.replaced == ["broker-2", "broker-1", "broker-0"], observer.revisions

            # -- a rolled broker reports fewer partitions than before: the roll waits ---------------
            cluster.patch_spec("paced", {"sidecar": {"port": port, "resources": {"requests": {"cpu": "10m"}}}})
            # The StatefulSet's strategy comes back in the round that ends the last step, a moment
            # before that round's status: wait for this roll's step (the order is checked below).
            rolling = wait_for(lambda: (r := cluster.status("paced").get("rollout", {}).get("rolling"))
                               and r["pod"] == "broker-2" and r, timeout=TIMEOUT, what="a paced step")  # fmt: skip
            assert rolling["partitionsBefore"] == 4
            fake.partitions = 3
            gate = wait_for(lambda: "replicas are missing" in (g := cluster.status("paced")["rollout"].get(
                "gate", "")) and g, timeout=TIMEOUT, what="the gate closed by the report")  # fmt: skip
            assert "broker-2 reports 3 partitions" in gate and "4 before its restart" in gate
            others = {n: u for n, u in _uids(_pods(cluster)).items() if n != "broker-2"}
            _await_rounds("paced", 3)  # three reporting rounds: still waiting
            assert {n: u for n, u in _uids(_pods(cluster)).items() if n != "broker-2"} == others
            # -- back with every partition, not yet in every ISR: the roll waits ---------------------
            fake.in_sync = {"outOfIsr": 3, "underReplicated": 0, "atMinIsr": 0}
            fake.partitions = 4
            gate = wait_for(lambda: "out of the ISR" in (g := cluster.status("paced")["rollout"].get("gate", ""))
                            and g, timeout=TIMEOUT, what="the gate closed by the ISR")  # fmt: skip
            assert "broker-2 is out of the ISR of 3 of its 10 partitions (orders-0, orders-1, orders-2)" in gate
            _await_rounds("paced", 3)
            assert {n: u for n, u in _uids(_pods(cluster)).items() if n != "broker-2"} == others
            # -- in sync, but broker-1's restart would leave a partition below min ISR: it waits --
            fake.in_sync = {"outOfIsr": 0, "underReplicated": 1, "atMinIsr": 1}
            gate = wait_for(lambda: "min.insync.replicas" in (g := cluster.status("paced")["rollout"].get("gate", ""))
                            and g, timeout=TIMEOUT, what="the next step held by min ISR")  # fmt: skip
            assert gate == ("waiting: restarting broker-1 now would take 1 partition below min.insync.replicas "
                            "(orders-0)")
            _await_rounds("paced", 3)
            assert {n: u for n, u in _uids(_pods(cluster)).items() if n != "broker-2"} == others
            fake.in_sync = {"outOfIsr": 0, "underReplicated": 0, "atMinIsr": 0}
            new = _template_hash(cluster)
            wait_for(lambda: _all_ready(cluster, 3, new), timeout=3 * TIMEOUT, what="three pods with the new sidecar")
        assert observer.worst <= 1, f"{observer.worst} brokers unavailable at once"
        assert observer.replaced == ["broker-2", "broker-1", "broker-0"] * 2, observer.revisions
    finally:
        fake.close()


def test_a_stalled_rollout_is_named_and_the_sidecar_taken_out_again(cluster: ApiCluster) -> None:
    before = _brokers(cluster, 2)
    # Requests no node can hold: the new pod is never scheduled (as an image that cannot be
    # pulled or a sidecar refused by admission would keep it from becoming Ready).
    manifest = policy("stuck", target=sts_target(), sidecar={"resources": {"requests": {"cpu": "5000"}}},
                      rollout={"strategy": "Paced", "progressDeadlineSeconds": 3},
                      reporting={"intervalSeconds": 1})  # fmt: skip
    with running_operator(expected_warnings=("has not become Ready",)):
        _create(cluster, manifest)
        # On a busy machine the pod may not even be recreated within the 3 s deadline: the
        # policy is RolloutStalled first, and the sidecar is taken out once the pod shows why.
        stalled = wait_for(lambda: (c := cluster.condition("stuck", "Stalled")).get("status") == "True"
                           and c["reason"] == "SidecarRolledBack" and c, timeout=TIMEOUT,
                           what="Stalled: SidecarRolledBack")  # fmt: skip
        assert "StatefulSet broker: pod broker-1" in stalled["message"] and "Unschedulable" in stalled["message"]
        assert _template_hash(cluster) is None and find_sidecar(cluster.sts()["spec"]["template"]["spec"]) is None
        pods = wait_for(lambda: _all_ready(cluster, 2, None), timeout=TIMEOUT, what="both brokers back, no sidecar")
        assert pods["broker-0"]["metadata"]["uid"] == before["broker-0"]["metadata"]["uid"]
        assert _gauge("rollout_stalled", "stuck") == 1
        cluster.wait_for_event("CompactionPolicy", "SidecarRolledBack")
        # Not injected again until the spec changes the sidecar.
        _await_rounds("stuck", 2)
        assert _template_hash(cluster) is None
        assert cluster.condition("stuck", "Stalled")["reason"] == "SidecarRolledBack"


def test_a_broker_back_without_its_report_stalls_the_paced_roll(cluster: ApiCluster) -> None:
    """A rolled broker that is Ready with the new sidecar but never reports (no process answers
    here, as a sidecar that cannot read the log dirs or listen would not) holds the roll:
    past rollout.progressDeadlineSeconds the policy is Stalled (RolloutStalled) naming the pod
    and what it waits for. The sidecar stays (the pod is Ready: nothing points at it keeping
    the broker down) and no other broker is touched."""
    before = _brokers(cluster, 2)
    manifest = policy("silent", target=sts_target(), rollout={"strategy": "Paced", "progressDeadlineSeconds": 5},
                      reporting={"intervalSeconds": 1})  # fmt: skip
    with running_operator(expected_warnings=("has not come back",)):
        _create(cluster, manifest)
        stalled = wait_for(lambda: (c := cluster.condition("silent", "Stalled")).get("status") == "True" and c,
                           timeout=TIMEOUT, what="Stalled")  # fmt: skip
        assert stalled["reason"] == "RolloutStalled"
        assert "pod broker-1" in stalled["message"] and "progressDeadlineSeconds (5s)" in stalled["message"]
        assert "no report from broker-1" in stalled["message"]
        assert _gauge("rollout_stalled", "silent") == 1
        assert _template_hash(cluster) is not None
        pods = _pods(cluster)
        assert pods["broker-0"]["metadata"]["uid"] == before["broker-0"]["metadata"]["uid"]
        assert _ready(pods["broker-1"]) and pods["broker-1"]["metadata"]["uid"] != before["broker-1"]["metadata"]["uid"]


STRIMZI_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "strimzipodsets.core.strimzi.io"},
    "spec": {"group": "core.strimzi.io", "scope": "Namespaced",
             "names": {"plural": "strimzipodsets", "singular": "strimzipodset", "kind": "StrimziPodSet",
                       "shortNames": ["sps"]},
             "versions": [{"name": "v1beta2", "served": True, "storage": True, "subresources": {"status": {}},
                           "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                               "spec": {"type": "object", "required": ["selector", "pods"], "properties": {
                                   "selector": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                                   "pods": {"type": "array", "items": {
                                       "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}},
                               "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}}}]},
}  # fmt: skip


STRIMZI_LABELS = {"strimzi.io/cluster": "my-cluster", "strimzi.io/kind": "Kafka", "strimzi.io/broker-role": "true"}
STRIMZI_TARGET = {"podSelector": {"matchLabels": STRIMZI_LABELS}, "injection": "webhook", "dataVolume": "data",
                  "mountPath": "/var/lib/kafka", "logDirs": ["data"]}


def _strimzi_podset(cluster: ApiCluster, control_plane: ControlPlane,
                    present: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A StrimziPodSet ``my-cluster-kafka`` of three broker pods, the first ``present`` of them
    created as Strimzi creates them (no Strimzi runs here: the test plays its part); returns
    the pods' manifests and the owner reference they carry."""
    path = control_plane.root / "strimzipodset-crd.json"
    path.write_text(json.dumps(STRIMZI_CRD))
    control_plane.kubectl("apply", "-f", str(path))
    control_plane.kubectl("wait", "--for=condition=Established", "crd/strimzipodsets.core.strimzi.io",
                          "--timeout=60s")
    template = broker_statefulset("unused")["spec"]["template"]["spec"]
    pods = []
    for i in range(3):
        spec = copy.deepcopy(template)
        spec["volumes"].append({"name": "data", "emptyDir": {}})
        pods.append({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"my-cluster-kafka-{i}",
                     "labels": STRIMZI_LABELS}, "spec": spec})  # fmt: skip
    podset = cluster.custom.create_namespaced_custom_object("core.strimzi.io", "v1beta2", NS, "strimzipodsets", {
        "apiVersion": "core.strimzi.io/v1beta2", "kind": "StrimziPodSet", "metadata": {"name": "my-cluster-kafka"},
        "spec": {"selector": {"matchLabels": STRIMZI_LABELS}, "pods": pods}})
    owner = {"apiVersion": "core.strimzi.io/v1beta2", "kind": "StrimziPodSet", "name": "my-cluster-kafka",
             "uid": podset["metadata"]["uid"], "controller": True}
    for pod in pods[:present]:
        pod["metadata"]["ownerReferences"] = [owner]
        cluster.core.create_namespaced_pod(NS, pod)
    return pods, owner


def test_paced_asks_strimzis_kafkaroller_to_roll_the_podset_pods(
        cluster: ApiCluster, control_plane: ControlPlane) -> None:
    pods, owner = _strimzi_podset(cluster, control_plane, present=2)  # my-cluster-kafka-2 is missing
    target = STRIMZI_TARGET
    port = free_port()
    with running_operator(webhook_enabled=True, webhook_insecure=True, webhook_addr="127.0.0.1", webhook_port=port):
        _create(cluster, policy("strimzi", target=target))  # Manual: the pods are named, nobody rolls
        rollout = wait_for(lambda: (r := cluster.status("strimzi").get("rollout", {})).get("pending") == 2 and r,
                           timeout=TIMEOUT, what="two pending pods")  # fmt: skip
        assert rollout["pendingPods"][0] == {
            "pod": "my-cluster-kafka-0", "workload": "StrimziPodSet my-cluster-kafka",
            "roll": f"kubectl annotate pod -n {NS} my-cluster-kafka-0 {STRIMZI_MANUAL_ROLLING_UPDATE}=true"}
        assert cluster.status("strimzi")["summary"]["brokersExpected"] == 3
        assert not any(STRIMZI_MANUAL_ROLLING_UPDATE in (p["metadata"].get("annotations") or {})
                       for p in _pods(cluster).values())
        cluster.patch_spec("strimzi", {"rollout": {"strategy": "Paced"}, "reporting": {"intervalSeconds": 1}})
        # The gate waits for the missing broker; once Strimzi has recreated it, KafkaRoller is asked.
        gate = wait_for(lambda: "my-cluster-kafka-2 missing" in (g := cluster.status("strimzi")["rollout"].get(
            "gate", "")) and g, timeout=TIMEOUT, what="the gate waiting for the missing broker")  # fmt: skip
        assert gate
        # Strimzi recreates it (here without the sidecar: the chart's webhook Service cannot
        # reach this process, and the webhook fails open).
        pods[2]["metadata"]["ownerReferences"] = [owner]
        cluster.core.create_namespaced_pod(NS, pods[2])
        names = [f"my-cluster-kafka-{i}" for i in range(3)]
        wait_for(lambda: sorted(n for n, p in _pods(cluster).items() if (p["metadata"].get("annotations") or {}).get(
            STRIMZI_MANUAL_ROLLING_UPDATE) == "true") == names, timeout=TIMEOUT,
            what="every pending pod annotated for KafkaRoller")  # fmt: skip
        cluster.wait_for_event("CompactionPolicy", "RollRequested")
        # Asked once: the rounds that follow, while KafkaRoller has not rolled yet, post no more.
        _await_rounds("strimzi", 3)
        asked = [m for k, r, m in cluster.events() if r == "RollRequested"]
        assert len(asked) == 1 and all(n in asked[0] for n in names), asked


def test_a_strimzi_pod_the_sidecar_keeps_down_is_deleted_once_and_comes_back_without_it(
        cluster: ApiCluster, control_plane: ControlPlane) -> None:
    """Strimzi (played by the test) recreates my-cluster-kafka-1 with the policy's sidecar, and
    the sidecar keeps it from being scheduled. Past rollout.progressDeadlineSeconds the policy
    is Stalled (SidecarRolledBack), the webhook stops injecting that sidecar, and the operator
    deletes that pod, and only that pod, once every other broker is Ready; Strimzi recreates it
    without the sidecar. Old code: StrimziPodSet pods were left to a person, so the broker
    stayed down (the wait for its deletion below timed out)."""
    pods, _ = _strimzi_podset(cluster, control_plane, present=3)
    port = free_port()
    manifest = policy("strimzi-stuck", target=STRIMZI_TARGET, rollout={"progressDeadlineSeconds": 3},
                      reporting={"intervalSeconds": 1})  # fmt: skip
    before = _uids(_pods(cluster))
    with running_operator(webhook_enabled=True, webhook_insecure=True, webhook_addr="127.0.0.1", webhook_port=port,
                          expected_warnings=("has not become Ready",)):
        _create(cluster, manifest)
        wanted = wait_for(lambda: cluster.status("strimzi-stuck").get("rollout", {}).get("sidecarHash"),
                          timeout=TIMEOUT, what="the wanted sidecar in the status")  # fmt: skip
        # KafkaRoller rolls my-cluster-kafka-1; the webhook gave the new pod a sidecar no node can hold.
        cluster.core.delete_namespaced_pod("my-cluster-kafka-1", NS, grace_period_seconds=0)
        wait_for(lambda: "my-cluster-kafka-1" not in _pods(cluster), timeout=TIMEOUT, what="the old pod gone")
        stuck_pod = copy.deepcopy(pods[1])
        stuck_pod["metadata"]["annotations"] = {SIDECAR_HASH_ANNOTATION: wanted}
        stuck_pod["spec"]["containers"].append({"name": SIDECAR_CONTAINER, "image": IMAGE,
                                                 "resources": {"requests": {"cpu": "5000"}}})
        created = cluster.core.create_namespaced_pod(NS, stuck_pod)
        stalled = wait_for(lambda: (c := cluster.condition("strimzi-stuck", "Stalled")).get("status") == "True"
                           and c["reason"] == "SidecarRolledBack" and c, timeout=TIMEOUT,
                           what="Stalled: SidecarRolledBack")  # fmt: skip
        assert "pod my-cluster-kafka-1 (Unschedulable" in stalled["message"], stalled["message"]
        assert "such pods are deleted one at a time" in stalled["message"]
        wait_for(lambda: _uids(_pods(cluster)).get("my-cluster-kafka-1") != created.metadata.uid, timeout=TIMEOUT,
                 what="the stuck pod deleted")  # fmt: skip
        cluster.wait_for_event("CompactionPolicy", "RollbackDeletedPod")
        # Strimzi recreates it; the webhook no longer injects (here it cannot be reached and
        # fails open: the pod is created as Strimzi asks, without the sidecar).
        wait_for(lambda: "my-cluster-kafka-1" not in _pods(cluster), timeout=TIMEOUT, what="the stuck pod gone")
        cluster.core.create_namespaced_pod(NS, pods[1])
        wait_for(lambda: _ready(_pods(cluster).get("my-cluster-kafka-1") or {"status": {}}), timeout=TIMEOUT,
                 what="my-cluster-kafka-1 back and Ready")  # fmt: skip
        _await_rounds("strimzi-stuck", 3)  # three rounds more: nothing else is deleted
        after = _uids(_pods(cluster))
        assert {n: after[n] for n in ("my-cluster-kafka-0", "my-cluster-kafka-2")} == {
            n: before[n] for n in ("my-cluster-kafka-0", "my-cluster-kafka-2")}
        deleted = [m for _, r, m in cluster.events() if r == "RollbackDeletedPod" and "my-cluster-kafka" in m]
        assert len(deleted) == 1 and "deleted pod my-cluster-kafka-1 (Unschedulable" in deleted[0], deleted


# ---------------------------------------------------------------------------------------------
# Issue 20, item 1: a rollback deletes at most one broker per round, only a pod this rollout
# created that never became Ready, and brings it back without the sidecar under every strategy
# ---------------------------------------------------------------------------------------------


def _state(pod: dict[str, Any]) -> str:
    """How a pod looks to a person: "deleting", "Ready" or "NotReady", with its sidecar hash."""
    found = find_sidecar(pod["spec"])
    sidecar = (pod["metadata"].get("annotations") or {}).get(SIDECAR_HASH_ANNOTATION) if found else None
    state = "deleting" if pod["metadata"].get("deletionTimestamp") else "Ready" if _ready(pod) else "NotReady"
    return f"{state} (sidecar {sidecar})"


class DeletionWatch:
    """Watches the namespace's pods through the API server's watch and records every pod that
    starts being deleted, with the state of every other broker at that moment. The events come
    in the API server's order (by resourceVersion), so the states are those the cluster had when
    the deletion was made, whatever the machine's speed: two deletions in one round show as a
    broker being deleted while another is still being deleted or not recreated yet."""

    def __init__(self, cluster: ApiCluster, replicas: int) -> None:
        self.cluster, self.names = cluster, [f"broker-{i}" for i in range(replicas)]
        #: (pod, its sidecar hash, the other brokers' states) per deletion, in order.
        self.deletions: list[tuple[str, str | None, dict[str, str]]] = []
        self._pods: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._listed = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> DeletionWatch:
        self._thread.start()
        wait_for(self._listed.is_set, timeout=TIMEOUT, what="the pod watch's first listing")
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(TIMEOUT)

    def _others(self, name: str) -> dict[str, str]:
        return {n: _state(self._pods[n]) if n in self._pods else "missing" for n in self.names if n != name}

    def _apply(self, kind: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        old = self._pods.get(name)
        starts = pod["metadata"].get("deletionTimestamp") and not (
            old and old["metadata"]["uid"] == pod["metadata"]["uid"] and old["metadata"].get("deletionTimestamp"))
        if starts or (kind == "DELETED" and not (old and old["metadata"].get("deletionTimestamp"))):
            found = find_sidecar(pod["spec"])
            sidecar = (pod["metadata"].get("annotations") or {}).get(SIDECAR_HASH_ANNOTATION) if found else None
            self.deletions.append((name, sidecar, self._others(name)))
        if kind == "DELETED":
            self._pods.pop(name, None)
        else:
            self._pods[name] = pod

    def _run(self) -> None:
        core = self.cluster.core
        version = ""
        while not self._stop.is_set():
            if not version:
                listed = json.loads(core.list_namespaced_pod(NS, _preload_content=False).data)
                self._pods = {p["metadata"]["name"]: p for p in listed["items"]}
                version = listed["metadata"]["resourceVersion"]
                self._listed.set()
            response = core.list_namespaced_pod(NS, watch=True, resource_version=version, timeout_seconds=2,
                                                allow_watch_bookmarks=True, _preload_content=False)
            try:
                for line in response:
                    event = json.loads(line)
                    if event["type"] == "ERROR":  # 410 Gone: list again
                        version = ""
                        break
                    version = event["object"]["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        self._apply(event["type"], event["object"])
            finally:
                response.release_conn()


def _rounds(policy_name: str) -> float:
    return metrics.REGISTRY.get_sample_value("kafka_cleaner_operator_reconciliations_total",
                                             {"namespace": NS, "policy": policy_name}) or 0.0


def _await_rounds(policy_name: str, count: int) -> None:
    """Until ``count`` more rounds of the policy have run to their end (rounds of one policy
    never overlap and the counter moves as one starts: ``count + 1`` starts)."""
    start = _rounds(policy_name)
    wait_for(lambda: _rounds(policy_name) >= start + count + 1, timeout=TIMEOUT,
             what=f"{count} more rounds of {policy_name}")  # fmt: skip


def _crash_sidecar(cluster: ApiCluster, name: str) -> None:
    """What the kubelet reports of a pod whose kafka-cleaner container crash-loops (an OOM kill
    after a policy edit): the container waiting in CrashLoopBackOff, the pod not Ready. kwok
    plays a pod's status only until it has an IP, so this stays as written."""
    pod = cluster.pod(name)
    assert pod is not None
    spec, status = pod["spec"], pod["status"]
    native = any(c["name"] == "kafka-cleaner" for c in spec.get("initContainers") or [])
    key = "initContainerStatuses" if native else "containerStatuses"
    statuses = []
    for entry in status.get(key) or []:
        if entry["name"] == "kafka-cleaner":
            entry = {**entry, "ready": False, "started": False, "restartCount": 4,
                     "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting "
                                           "failed container kafka-cleaner"}},
                     "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}
        statuses.append(entry)
    conditions = [{**c, "status": "False", "reason": "ContainersNotReady"} if c["type"] in ("Ready", "ContainersReady")
                  else c for c in status.get("conditions") or []]
    cluster.core.patch_namespaced_pod_status(name, NS, {"status": {key: statuses, "conditions": conditions}})


def _roll_manually(cluster: ApiCluster, replicas: int, wanted: str) -> dict[str, Any]:
    """The person's roll of a Manual hold: lower the partition to 0, wait for every pod with
    ``wanted`` and for the StatefulSet's own strategy back."""
    cluster.apps.patch_namespaced_stateful_set(
        "broker", NS, {"spec": {"updateStrategy": {"rollingUpdate": {"partition": 0}}}})
    pods = wait_for(lambda: _all_ready(cluster, replicas, wanted), timeout=3 * TIMEOUT,
                    what=f"{replicas} pods with sidecar {wanted}")  # fmt: skip
    wait_for(lambda: UPDATE_STRATEGY_ANNOTATION not in cluster.sts()["metadata"].get("annotations", {}),
             timeout=TIMEOUT, what="the StatefulSet's own strategy back")  # fmt: skip
    return dict(pods)


def test_a_sidecar_failing_on_brokers_that_were_ready_with_it_is_reported_and_no_broker_deleted(
        cluster: ApiCluster) -> None:
    """Three long-running brokers were rolled to the sidecar (OnDelete: the person deleted
    them one by one) and were Ready with it; then every sidecar crash-loops (an OOM after a
    ConfigMap-only policy edit). None is a pod of a rollout step that never became Ready: none
    is deleted, in any round; the policy is Degraded (SidecarFailing) naming the three, an Event
    says so and kafka_cleaner_operator_sidecar_failing_pods counts them. The old code took all
    three for stuck sidecars and deleted them in one round."""
    _brokers(cluster, 3)
    manifest = policy("oom", target=sts_target(), reporting={"intervalSeconds": 1},
                      rollout={"strategy": "OnDelete", "progressDeadlineSeconds": 1})  # fmt: skip
    with running_operator(expected_warnings=("SidecarFailing", "has not become Ready")):
        _create(cluster, manifest)
        wanted = wait_for(lambda: _template_hash(cluster), timeout=TIMEOUT, what="the sidecar in the template")
        wait_for(lambda: (s := cluster.sts())["status"].get("observedGeneration", 0) >= s["metadata"]["generation"],
                 timeout=TIMEOUT, what="the StatefulSet controller observing the template")  # fmt: skip
        for name in ("broker-2", "broker-1", "broker-0"):  # the person's roll
            uid = _pods(cluster)[name]["metadata"]["uid"]
            cluster.core.delete_namespaced_pod(name, NS)
            wait_for(lambda n=name, u=uid: (p := _pods(cluster).get(n)) and _ready(p) and p["metadata"]["uid"] != u,
                     timeout=TIMEOUT, what=f"{name} back with the sidecar")  # fmt: skip
        rolled = wait_for(lambda: _all_ready(cluster, 3, wanted), timeout=TIMEOUT, what="three pods with the sidecar")
        _await_rounds("oom", 2)  # rounds that see the three Ready with the sidecar
        with DeletionWatch(cluster, 3) as watch:
            for name in sorted(rolled):
                _crash_sidecar(cluster, name)
            wait_for(lambda: all(not _ready(p) for p in _pods(cluster).values()), timeout=TIMEOUT,
                     what="the three brokers NotReady")  # fmt: skip
            _await_rounds("oom", 3)
            assert watch.deletions == [], f"brokers deleted: {watch.deletions}"
            degraded = wait_for(lambda: (c := cluster.condition("oom", "Degraded")).get("reason") == "SidecarFailing"
                                and c, timeout=TIMEOUT, what="Degraded: SidecarFailing")  # fmt: skip
            assert degraded["status"] == "True"
            assert all(name in degraded["message"] for name in rolled), degraded["message"]
            assert "CrashLoopBackOff" in degraded["message"]
            assert _gauge("sidecar_failing_pods", "oom") == 3
            cluster.wait_for_event("CompactionPolicy", "SidecarFailing", containing="broker-0")
            assert _template_hash(cluster) == wanted  # no rollback: the sidecar was fine before
            assert "rolledBack" not in cluster.status("oom")["rollout"]
            assert watch.deletions == [], f"brokers deleted: {watch.deletions}"
        assert _uids(_pods(cluster)) == _uids(rolled)


def test_manual_rollback_brings_the_new_pod_back_without_the_sidecar(cluster: ApiCluster) -> None:
    """Manual: all brokers run a working sidecar (the StatefulSet's current revision has it);
    a spec change makes one that no node can schedule, and the person rolls broker-2 to it.
    The rollback deletes exactly that pod, and it comes back *without* the sidecar: under the
    Manual partition the old code's deletion brought it back from the current revision, with
    the old sidecar."""
    _brokers(cluster, 3)
    manifest = policy("manual-bad", target=sts_target(), reporting={"intervalSeconds": 1},
                      rollout={"strategy": "Manual", "progressDeadlineSeconds": 3})  # fmt: skip
    with running_operator(expected_warnings=("has not become Ready",)):
        _create(cluster, manifest)
        good = wait_for(lambda: _template_hash(cluster), timeout=TIMEOUT, what="the sidecar in the template")
        rolled = _roll_manually(cluster, 3, good)
        cluster.patch_spec("manual-bad", {"sidecar": {"resources": {"requests": {"cpu": "5000"}}}})
        wait_for(lambda: _template_hash(cluster) not in (None, good), timeout=TIMEOUT, what="the bad sidecar in "
                 "the template")  # fmt: skip
        assert cluster.sts()["spec"]["updateStrategy"]["rollingUpdate"]["partition"] == 3
        with DeletionWatch(cluster, 3) as watch:
            cluster.apps.patch_namespaced_stateful_set(  # the person rolls broker-2 only
                "broker", NS, {"spec": {"updateStrategy": {"rollingUpdate": {"partition": 2}}}})
            stalled = wait_for(lambda: (c := cluster.condition("manual-bad", "Stalled")).get("reason")
                               == "SidecarRolledBack" and c, timeout=TIMEOUT, what="SidecarRolledBack")  # fmt: skip
            assert "pod broker-2" in stalled["message"] and "Unschedulable" in stalled["message"]
            back = wait_for(lambda: (p := _pods(cluster).get("broker-2")) and _ready(p) and p["metadata"]["uid"] != (
                rolled["broker-2"]["metadata"]["uid"]) and p, timeout=TIMEOUT, what="broker-2 back and Ready")
            assert find_sidecar(back["spec"]) is None, f"broker-2 came back with a sidecar: {_state(back)}"
            _await_rounds("manual-bad", 2)
        pods = _pods(cluster)
        assert {n: p["metadata"]["uid"] for n, p in pods.items() if n != "broker-2"} == {
            n: p["metadata"]["uid"] for n, p in rolled.items() if n != "broker-2"}
        # The controller's deletion for the person's roll, then the operator's of the stuck pod
        # (again, one per round, if the StatefulSet controller recreated it from the old template).
        assert [d[0] for d in watch.deletions][:2] == ["broker-2", "broker-2"], watch.deletions
        assert all(name == "broker-2" for name, _, _ in watch.deletions), watch.deletions
        assert find_sidecar(pods["broker-2"]["spec"]) is None


def test_ondelete_rolls_back_one_stuck_broker_per_round_each_after_the_last_is_ready(cluster: ApiCluster) -> None:
    """OnDelete: a person deletes two brokers at once and both come back with a sidecar no
    node can schedule (podManagementPolicy Parallel: with the default OrderedReady the
    StatefulSet controller would not recreate broker-2 before broker-1 is Ready). The rollback
    deletes them one at a time: the second only once the first is back (without the sidecar)
    and Ready, never while another broker is being deleted or missing. The old code deleted
    both in one round."""
    before = _brokers(cluster, 3, parallel=True)
    manifest = policy("ondelete-bad", target=sts_target(), sidecar={"resources": {"requests": {"cpu": "5000"}}},
                      reporting={"intervalSeconds": 1},
                      rollout={"strategy": "OnDelete", "progressDeadlineSeconds": 3})  # fmt: skip
    with running_operator(expected_warnings=("has not become Ready",)):
        _create(cluster, manifest)
        bad = wait_for(lambda: _template_hash(cluster), timeout=TIMEOUT, what="the sidecar in the template")
        # Deleted before the StatefulSet controller saw the template, they would come back without it.
        wait_for(lambda: (s := cluster.sts())["status"].get("observedGeneration", 0) >= s["metadata"]["generation"]
                 and s["status"].get("updateRevision") != s["status"].get("currentRevision"), timeout=TIMEOUT,
                 what="the StatefulSet controller observing the template with the sidecar")  # fmt: skip
        with DeletionWatch(cluster, 3) as watch:
            for name in ("broker-1", "broker-2"):
                cluster.core.delete_namespaced_pod(name, NS)
            wait_for(lambda: cluster.condition("ondelete-bad", "Stalled").get("reason") == "SidecarRolledBack",
                     timeout=TIMEOUT, what="SidecarRolledBack")  # fmt: skip
            try:
                pods = wait_for(lambda: _all_ready(cluster, 3, None), timeout=3 * TIMEOUT,
                                what="three brokers Ready without the sidecar")  # fmt: skip
            except AssertionError as e:
                raise AssertionError(f"{e}; pods: {_pod_states(cluster)}; status.rollout: "
                                     f"{cluster.status('ondelete-bad').get('rollout')}") from None
            _await_rounds("ondelete-bad", 2)
        assert pods["broker-0"]["metadata"]["uid"] == before["broker-0"]["metadata"]["uid"]
        operator = [d for d in watch.deletions if d[1] == bad]  # the test deleted pods without the sidecar
        assert [d[0] for d in operator] == ["broker-2", "broker-1"], watch.deletions
        for name, _, others in operator:
            busy = {n: s for n, s in others.items() if s == "missing" or s.startswith("deleting")}
            assert not busy, f"{name} deleted while {busy}"
        # When broker-1 went, broker-2 was back without the sidecar and Ready.
        assert operator[1][2]["broker-2"] == "Ready (sidecar None)", watch.deletions


# -- holds that name their policy: former targets, deletion, and what the sidecars read ---------


def _statefulset(cluster: ApiCluster, name: str, replicas: int) -> dict[str, Any]:
    """Another broker StatefulSet like ``_brokers``' (an emptyDir for data), its pods Ready."""
    sts = broker_statefulset(name)
    sts["spec"]["replicas"] = replicas
    del sts["spec"]["volumeClaimTemplates"]
    sts["spec"]["template"]["spec"]["volumes"].append({"name": "data", "emptyDir": {}})
    cluster.apps.create_namespaced_stateful_set(NS, sts)
    names = {f"{name}-{i}" for i in range(replicas)}
    return wait_for(lambda: (p := {n: q for n, q in _pods(cluster).items() if n in names}) and set(p) == names
                    and all(_ready(q) for q in p.values()) and p, timeout=TIMEOUT,
                    what=f"{replicas} pods of StatefulSet {name} Ready")  # fmt: skip


def _sts_hash(cluster: ApiCluster, name: str) -> str | None:
    return cluster.sts(name)["spec"]["template"]["metadata"].get("annotations", {}).get(SIDECAR_HASH_ANNOTATION)


def _observed(cluster: ApiCluster, name: str = "broker") -> dict[str, Any]:
    """The StatefulSet once its controller has observed its spec (a pod deleted before that
    comes back from the previous template)."""
    return wait_for(lambda: (s := cluster.sts(name))["status"].get("observedGeneration", 0) >= s["metadata"][
        "generation"] and s, timeout=TIMEOUT, what=f"the StatefulSet controller observing {name}")  # fmt: skip


def _recreate(cluster: ApiCluster, pod: str, sidecar: str | None) -> dict[str, Any]:
    """The person's roll of one pod (a deletion), back Ready with sidecar ``sidecar`` (None: none)."""
    uid = _pods(cluster)[pod]["metadata"]["uid"]
    cluster.core.delete_namespaced_pod(pod, NS)
    return wait_for(lambda: (p := _pods(cluster).get(pod)) and _ready(p) and p["metadata"]["uid"] != uid and (
        (p["metadata"].get("annotations") or {}).get(SIDECAR_HASH_ANNOTATION) if find_sidecar(p["spec"]) else None)
        == sidecar and p, timeout=TIMEOUT, what=f"{pod} recreated with sidecar {sidecar}")  # fmt: skip


def _not_held(sts: dict[str, Any]) -> bool:
    annotations = sts["metadata"].get("annotations") or {}
    return UPDATE_STRATEGY_ANNOTATION not in annotations and HELD_BY_ANNOTATION not in annotations


def _uid(cluster: ApiCluster, name: str) -> str:
    manifest = cluster.policy(name)
    assert manifest is not None, f"no policy {name}"
    return str(manifest["metadata"]["uid"])


def _event(cluster: ApiCluster, uid: str, reason: str, *needles: str) -> str:
    """The message of an Event with ``reason`` on the policy with this ``uid`` (earlier tests'
    policies left Events in the namespace) that contains every one of ``needles``, once there."""
    def found() -> str | None:
        listed = cluster._json(cluster.core.list_namespaced_event, NS) or {}
        for event in listed.get("items", []):
            message = str(event.get("message", ""))
            if event["reason"] == reason and event["involvedObject"].get("uid") == uid and all(
                    n in message for n in needles):
                return message
        return None

    return wait_for(found, timeout=TIMEOUT, what=f"a {reason} Event of policy {uid} saying {needles}")


def _finalizer_waiting_for(cluster: ApiCluster, uid: str, pod: str) -> str:
    """The AwaitingRollout Event by which the finalizer of the policy ``uid`` says it waits for ``pod``."""
    return _event(cluster, uid, "AwaitingRollout", "to be recreated without the sidecar", pod)


def test_retargeting_releases_the_former_targets_hold_once_no_pod_runs_the_sidecar(cluster: ApiCluster) -> None:
    """Issue 20 item 5: an OnDelete policy moves from StatefulSet broker (where the person
    rolled broker-1 to the sidecar) to StatefulSet other. broker's template loses the sidecar
    under the policy's hold (OnDelete: no pod restarts), and the hold stays while broker-1
    runs the sidecar (listed in status.rollout.pendingPods with its command); once the person
    has rolled broker-1, broker gets its own updateStrategy back and a later Kafka chart
    update rolls as the chart says. The old code left broker OnDelete for ever."""
    before = _brokers(cluster, 2)
    original = cluster.sts()["spec"]["updateStrategy"]
    _statefulset(cluster, "other", 1)
    manifest = policy("retarget", target=sts_target(), reporting={"intervalSeconds": 1},
                      rollout={"strategy": "OnDelete"})  # fmt: skip
    with running_operator():
        _create(cluster, manifest)
        wanted = wait_for(lambda: _template_hash(cluster), timeout=TIMEOUT, what="the sidecar in broker's template")
        _observed(cluster)
        rolled = _recreate(cluster, "broker-1", wanted)  # the person's roll of broker-1 only

        cluster.patch_spec("retarget", {"target": sts_target("other")})
        wait_for(lambda: _sts_hash(cluster, "other"), timeout=TIMEOUT, what="the sidecar in other's template")
        wait_for(lambda: _template_hash(cluster) is None, timeout=TIMEOUT, what="the sidecar out of broker's template")
        _await_rounds("retarget", 3)
        held = cluster.sts()
        assert held["spec"]["updateStrategy"] == {"type": "OnDelete"}, "released while broker-1 runs the sidecar"
        pods = _pods(cluster)
        assert pods["broker-0"]["metadata"]["uid"] == before["broker-0"]["metadata"]["uid"]
        assert pods["broker-1"]["metadata"]["uid"] == rolled["metadata"]["uid"]
        listed = cluster.status("retarget").get("rollout", {}).get("pendingPods") or []

        # -- the person rolls broker-1: back without the sidecar, the hold is released --------------
        _observed(cluster)
        _recreate(cluster, "broker-1", None)
        released = wait_for(lambda: (s := cluster.sts()) and _not_held(s) and s, timeout=TIMEOUT,
                            what="broker's own updateStrategy back")  # fmt: skip
        assert released["spec"]["updateStrategy"] == original
        assert {"pod": "broker-1", "workload": "StatefulSet broker",
                "roll": f"kubectl delete pod -n {NS} broker-1"} in listed, listed
        _event(cluster, _uid(cluster, "retarget"), "HoldReleased", "StatefulSet broker")

        # -- a later chart update rolls as the chart says (RollingUpdate) ---------------------------
        uid = _pods(cluster)["broker-0"]["metadata"]["uid"]
        cluster.apps.patch_namespaced_stateful_set(
            "broker", NS, {"spec": {"template": {"metadata": {"annotations": {"checksum/config": "def"}}}}})
        wait_for(lambda: (p := _pods(cluster).get("broker-0")) and _ready(p) and p["metadata"]["uid"] != uid,
                 timeout=TIMEOUT, what="broker-0 rolled by the chart update")  # fmt: skip
        # The current target is held by the policy, by name.
        assert cluster.sts("other")["metadata"]["annotations"][HELD_BY_ANNOTATION] == f"{NS}/retarget"


def test_deleting_a_policy_releases_every_statefulset_it_holds(cluster: ApiCluster) -> None:
    """Issue 20 item 5, the finalizer: a Manual policy moved from broker (broker-1 rolled to
    the sidecar by the person) to other, then deleted. The finalizer stays while broker-1 runs
    the sidecar, broker held (partition = replicas), and goes once the person has rolled it,
    each StatefulSet with its own updateStrategy back and no other pod restarted. The old
    finalizer looked at the current target only: the policy went at once and broker stayed
    held for ever."""
    before = _brokers(cluster, 2)
    original = cluster.sts()["spec"]["updateStrategy"]
    other = _statefulset(cluster, "other", 1)
    other_strategy = cluster.sts("other")["spec"]["updateStrategy"]
    with running_operator():
        _create(cluster, policy("moved", target=sts_target(), reporting={"intervalSeconds": 1}))
        wanted = wait_for(lambda: _template_hash(cluster), timeout=TIMEOUT, what="the sidecar in broker's template")
        cluster.apps.patch_namespaced_stateful_set(  # the person rolls broker-1
            "broker", NS, {"spec": {"updateStrategy": {"rollingUpdate": {"partition": 1}}}})
        rolled = wait_for(lambda: (p := _pods(cluster).get("broker-1")) and _ready(p) and p["metadata"].get(
            "annotations", {}).get(SIDECAR_HASH_ANNOTATION) == wanted and p, timeout=TIMEOUT,
            what="broker-1 rolled to the sidecar")  # fmt: skip
        cluster.patch_spec("moved", {"target": sts_target("other")})
        wait_for(lambda: _sts_hash(cluster, "other"), timeout=TIMEOUT, what="the sidecar in other's template")
        wait_for(lambda: _template_hash(cluster) is None, timeout=TIMEOUT, what="the sidecar out of broker's template")

        uid = _uid(cluster, "moved")
        cluster.custom.delete_namespaced_custom_object(G, V, NS, P, "moved")
        _finalizer_waiting_for(cluster, uid, "broker-1")
        assert cluster.policy("moved") is not None
        held = cluster.sts()
        assert held["spec"]["updateStrategy"]["rollingUpdate"]["partition"] == 2
        assert held["metadata"]["annotations"][HELD_BY_ANNOTATION] == f"{NS}/moved"
        assert _pods(cluster)["broker-1"]["metadata"]["uid"] == rolled["metadata"]["uid"]

        # -- the person's roll of broker-1; then the finalizer goes -----------------------------------
        _observed(cluster)
        cluster.apps.patch_namespaced_stateful_set(
            "broker", NS, {"spec": {"updateStrategy": {"rollingUpdate": {"partition": 1}}}})
        wait_for(lambda: cluster.policy("moved") is None, timeout=TIMEOUT, what="the policy gone")
        assert cluster.configmap("moved-kafka-cleaner") is None
        sts = cluster.sts()
        assert _not_held(sts) and sts["spec"]["updateStrategy"] == original, sts["spec"]["updateStrategy"]
        assert find_sidecar(_pods(cluster)["broker-1"]["spec"]) is None
        other_now = cluster.sts("other")
        assert _not_held(other_now) and other_now["spec"]["updateStrategy"] == other_strategy
        pods = _pods(cluster)
        assert pods["broker-0"]["metadata"]["uid"] == before["broker-0"]["metadata"]["uid"]
        assert pods["other-0"]["metadata"]["uid"] == other["other-0"]["metadata"]["uid"]


class RealSidecar:
    """The real sidecar (``cleaner.sidecar.service.Sidecar``, in process, on a MockTime) in
    compact mode on a generated log dir, reading a policy file with the text the operator
    put in the ConfigMap."""

    def __init__(self, root: pathlib.Path) -> None:
        self.data, self.policy = root / "kafka-logs", root / "policy.yaml"
        generate(self.data, GeneratorConfig(now_ms=NOW_MS, topics=1, partitions=1, records=3_000, keys=300,
                                            segment_bytes=32 * 1024))
        self.sidecar: Sidecar | None = None

    def read(self, text: str) -> tuple[str, bool]:
        """The policy file now holds ``text``: one turn of the loop; the cleaner's state and
        whether a broker could take the log dir's lock."""
        tmp = self.policy.with_name("policy.yaml.tmp")
        tmp.write_text(text)
        tmp.replace(self.policy)
        if self.sidecar is None:
            self.sidecar = Sidecar(SidecarOptions(self.policy, [str(self.data)], broker_name="broker-1",
                                                  scan_interval_ms=1_000, listen=("127.0.0.1", 0)), MockTime(NOW_MS))
        else:
            assert isinstance(self.sidecar.time, MockTime)
            self.sidecar.time.advance(2_000)
        self.sidecar.tick()
        return self.sidecar.status_document()["cleaner"]["state"], lock_is_free_for_another_process(self.data)

    def close(self) -> None:
        if self.sidecar is not None:
            self.sidecar.stop()


def _policy_text(cluster: ApiCluster, name: str) -> str:
    cm = cluster.configmap(f"{name}-kafka-cleaner")
    assert cm is not None, f"no ConfigMap {name}-kafka-cleaner"
    return str(cm["data"]["policy.yaml"])


def test_spec_paused_and_the_deletion_of_a_manual_policy_stop_its_sidecars(
        cluster: ApiCluster, tmp_path: pathlib.Path) -> None:
    """Issue 20 item 8: the ConfigMap the operator writes is what the sidecars read. With
    ``spec.paused`` it must say paused (the runbooks' way to stop cleaning: the real sidecar,
    compacting with the lock held, gives the log dir back); the old operator stopped
    publishing instead, and the sidecars went on with the last unpaused spec. Deleting a
    Manual policy leaves its sidecars in the pods until the person rolls them: they must stop
    at once too (the old finalizer left the ConfigMap as it was until the roll)."""
    _brokers(cluster, 2)
    manifest = policy("stop", mode="compact", target=sts_target(), reporting={"intervalSeconds": 1},
                      topics=[{"match": "topic-.*", "cleanupPolicy": "compact"}],
                      cleaner={"dedupeBufferSize": 4 * 1024 * 1024, "backoffMs": 1_000},
                      compact={"windows": ["* * * ? * *"]})  # fmt: skip
    sidecar = RealSidecar(tmp_path)
    try:
        with running_operator():
            _create(cluster, manifest)
            wanted = wait_for(lambda: _template_hash(cluster), timeout=TIMEOUT, what="the sidecar in the template")
            serving = wait_for(lambda: _policy_text(cluster, "stop"), timeout=TIMEOUT, what="the policy ConfigMap")
            state, free = sidecar.read(serving)
            assert state != "paused" and not free, (state, free)  # compacting, the lock held

            # -- spec.paused reaches the sidecar ----------------------------------------------------
            cluster.patch_spec("stop", {"paused": True})
            wait_for(lambda: cluster.condition("stop", "Reconciling").get("reason") == "Paused", timeout=TIMEOUT,
                     what="the operator's round of the paused policy")  # fmt: skip
            _await_rounds("stop", 1)
            assert sidecar.read(_policy_text(cluster, "stop")) == ("paused", True)
            cluster.patch_spec("stop", {"paused": False})
            wait_for(lambda: "paused: true" not in _policy_text(cluster, "stop"), timeout=TIMEOUT,
                     what="the ConfigMap unpaused")  # fmt: skip
            state, _ = sidecar.read(_policy_text(cluster, "stop"))
            assert state != "paused", state

            # -- deleting the Manual policy: the sidecars still in the pods stop at once -------------
            cluster.apps.patch_namespaced_stateful_set(  # the person rolled broker-1
                "broker", NS, {"spec": {"updateStrategy": {"rollingUpdate": {"partition": 1}}}})
            wait_for(lambda: (p := _pods(cluster).get("broker-1")) and _ready(p) and p["metadata"].get(
                "annotations", {}).get(SIDECAR_HASH_ANNOTATION) == wanted, timeout=TIMEOUT,
                what="broker-1 rolled to the sidecar")  # fmt: skip
            uid = _uid(cluster, "stop")
            cluster.custom.delete_namespaced_custom_object(G, V, NS, P, "stop")
            _finalizer_waiting_for(cluster, uid, "broker-1")
            assert cluster.policy("stop") is not None  # the finalizer waits for the person's roll
            assert sidecar.read(_policy_text(cluster, "stop")) == ("paused", True)
            _observed(cluster)
            cluster.apps.patch_namespaced_stateful_set(
                "broker", NS, {"spec": {"updateStrategy": {"rollingUpdate": {"partition": 0}}}})
            wait_for(lambda: cluster.policy("stop") is None, timeout=TIMEOUT, what="the policy gone")
            assert cluster.configmap("stop-kafka-cleaner") is None
    finally:
        sidecar.close()
