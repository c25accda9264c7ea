"""``kafka-cleaner-operator`` as deployed, on the real control plane: settings from the
environment, two replicas electing a leader through a real Lease (the follower serving the
webhook), SIGTERM, and the Lease logic itself under a mock clock. The replicas call the API
server with a token of the chart's ServiceAccount (installed with leader election and the
webhook), so the real RBAC authorizer judges every call."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import pytest
from compaction_operator.kube import Kube
from compaction_operator.leader import LeaseElector
from control_plane import CHART_ACCOUNT, CHART_NAMESPACE, ControlPlane, available, missing_reason
from kubernetes.client import CustomObjectsApi
from operator_helpers import described
from ports import free_port

from cleaner.clock import MockTime

G, V, P = "kafkacleaner.io", "v1alpha1", "compactionpolicies"
NS = "elections"
LEASE = CHART_ACCOUNT  # the chart's Lease name, the only one its Role lets the operator update
OPERATOR = pathlib.Path(sys.executable).with_name("kafka-cleaner-operator")

pytestmark = [
    pytest.mark.skipif(not available(), reason=missing_reason()),
    pytest.mark.skipif(not OPERATOR.exists(), reason=f"console script not installed at {OPERATOR}"),
    pytest.mark.xdist_group("control-plane"),
]


def wait_for(predicate: Callable[[], Any], timeout: float = 45.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if result := predicate():
                return result
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {described(predicate, what)}")


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


class Replica:
    """One ``kafka-cleaner-operator`` process."""

    def __init__(self, name: str, kubeconfig: pathlib.Path, log: pathlib.Path, *, webhook: bool = True) -> None:
        self.name, self.http_port, self.webhook_port = name, free_port(), free_port()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin"), "PYTHONSAFEPATH": "1",
            "KUBECONFIG": str(kubeconfig), "POD_NAME": name, "POD_NAMESPACE": CHART_NAMESPACE,
            "KAFKA_CLEANER_LOG_FORMAT": "plain", "KAFKA_CLEANER_SIDECAR_IMAGE": "registry.example/kc:main",
            "KAFKA_CLEANER_HTTP_ADDR": "127.0.0.1", "KAFKA_CLEANER_HTTP_PORT": str(self.http_port),
            "KAFKA_CLEANER_LEADER_ELECTION": "true", "KAFKA_CLEANER_LEASE_NAME": LEASE,
            "KAFKA_CLEANER_LEASE_DURATION_SECONDS": "4", "KAFKA_CLEANER_LEASE_RENEW_DEADLINE_SECONDS": "3",
            "KAFKA_CLEANER_LEASE_RETRY_PERIOD_SECONDS": "0.5",
            "KAFKA_CLEANER_WEBHOOK_ENABLED": str(webhook).lower(), "KAFKA_CLEANER_WEBHOOK_INSECURE": "true",
            "KAFKA_CLEANER_WEBHOOK_ADDR": "127.0.0.1", "KAFKA_CLEANER_WEBHOOK_PORT": str(self.webhook_port),
        }
        self.log = log
        with log.open("wb") as output:  # the child keeps its own descriptor
            self.process = subprocess.Popen([str(OPERATOR)], env=env, stdout=output, stderr=subprocess.STDOUT)

    def ready(self) -> bool:
        return http_status(f"http://127.0.0.1:{self.http_port}/readyz") == 200

    def metric(self, name: str) -> float | None:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/metrics", timeout=2) as response:
            for line in response.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        return None

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(f"{self.name} did not stop on SIGTERM:\n{self.log.read_text()}") from None


@contextlib.contextmanager
def replicas(kubeconfig: pathlib.Path, tmp_path: pathlib.Path, *names: str) -> Iterator[list[Replica]]:
    started: list[Replica] = []
    try:
        for name in names:
            started.append(Replica(name, kubeconfig, tmp_path / f"{name}.log"))
        yield started
    finally:
        for replica in started:
            if replica.process.poll() is None:
                replica.process.kill()
                replica.process.wait(10)


def _get(plane: ControlPlane, *what: str) -> dict[str, Any] | None:
    proc = plane.kubectl("get", *what, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def lease_holder(plane: ControlPlane) -> str | None:
    lease = _get(plane, "lease", LEASE, "-n", CHART_NAMESPACE)
    return (lease or {}).get("spec", {}).get("holderIdentity")


def ready_condition(plane: ControlPlane, name: str) -> dict[str, Any]:
    obj = _get(plane, "compactionpolicy", name, "-n", NS) or {}
    return next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == "Ready"), {})


@pytest.fixture
def elections(control_plane: ControlPlane, install_chart: Callable[..., pathlib.Path]) -> Iterator[pathlib.Path]:
    """The chart with leader election and the webhook, a clean namespace and no Lease; yields
    the chart's ServiceAccount kubeconfig."""
    kubeconfig = install_chart("leaderElection.enabled=true,webhook.enabled=true")
    control_plane.kubectl("create", "namespace", NS, check=False)
    yield kubeconfig
    control_plane.kubectl("delete", "compactionpolicies", "--all", "-n", NS, "--wait=false", check=False)
    control_plane.kubectl("delete", "lease", LEASE, "-n", CHART_NAMESPACE, "--ignore-not-found")


def admin_client(plane: ControlPlane) -> kubernetes.client.ApiClient:
    return kubernetes.config.new_client_from_config(config_file=str(plane.kubeconfig))


def review(port: int) -> dict[str, Any]:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "b-0", "namespace": NS, "labels": {"app": "b"}},
           "spec": {"containers": [{"name": "kafka", "image": "k"}], "volumes": [{"name": "data", "emptyDir": {}}]}}
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": NS, "operation": "CREATE",
        "userInfo": {"username": "test"}, "object": pod, "oldObject": None, "dryRun": False}}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/inject-sidecar", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())["response"]


def test_two_replicas_elect_a_leader_and_hand_over(
    control_plane: ControlPlane, elections: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    plane = control_plane
    custom = CustomObjectsApi(admin_client(plane))
    webhook_target = {"podSelector": {"matchLabels": {"app": "b"}}, "dataVolume": "data", "mountPath": "/d",
                      "logDirs": ["."]}
    custom.create_namespaced_custom_object(G, V, NS, P, {
        "apiVersion": f"{G}/{V}", "kind": "CompactionPolicy", "metadata": {"name": "by-webhook"},
        "spec": {"target": webhook_target, "reporting": {"intervalSeconds": 1}}})
    with replicas(elections, tmp_path, "op-a") as [a]:
        wait_for(lambda: lease_holder(plane) == "op-a", what="op-a leads")
        # Ready means the webhook answers, and knows the policies the API server lists: the
        # very first review gets the sidecar (kopf fills its index on its own time; before,
        # /readyz was 200 before the index held the policy, and the port already answered).
        wait_for(a.ready, what="op-a ready")
        assert review(a.webhook_port).get("patch")
        with replicas(elections, tmp_path, "op-b") as [b]:
            # Both are ready (rollouts proceed); only the leader reconciles; both answer the webhook.
            wait_for(b.ready, what="op-b ready")
            assert review(b.webhook_port).get("patch")
            wait_for(lambda: a.metric("kafka_cleaner_operator_leader") == 1.0, what="op-a's leader gauge")
            assert b.metric("kafka_cleaner_operator_leader") == 0.0
            wait_for(lambda: ready_condition(plane, "by-webhook").get("reason") == "NoPods", what="reconciled")

            custom.create_namespaced_custom_object(G, V, NS, P, {
                "apiVersion": f"{G}/{V}", "kind": "CompactionPolicy", "metadata": {"name": "first"}, "spec": {}})
            wait_for(lambda: ready_condition(plane, "first").get("reason") == "NoTarget", what="first Ready")
            assert "Leading as op-a" in a.log.read_text() and "Leading as" not in b.log.read_text()

            # The leader stops: it gives the Lease up, and the follower takes over at once.
            assert a.stop() == 0
            wait_for(lambda: lease_holder(plane) == "op-b", what="op-b leads")
            wait_for(lambda: "Leading as op-b" in b.log.read_text(), what="op-b's leader run")
            wait_for(b.ready, what="op-b ready as the leader")
            assert review(b.webhook_port).get("patch")  # the hand-over: ready again only once it answers
            custom.create_namespaced_custom_object(G, V, NS, P, {
                "apiVersion": f"{G}/{V}", "kind": "CompactionPolicy", "metadata": {"name": "second"}, "spec": {}})
            wait_for(lambda: ready_condition(plane, "second").get("reason") == "NoTarget", what="second Ready")
            assert b.stop() == 0
    assert lease_holder(plane) is None  # released
    for log in tmp_path.glob("*.log"):
        text = log.read_text()
        assert "Traceback" not in text and "Forbidden" not in text and " 403" not in text, text


def test_a_waiting_candidate_is_ready_reconciles_nothing_and_stops(
    control_plane: ControlPlane, elections: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    plane = control_plane
    client = admin_client(plane)
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": LEASE, "namespace": CHART_NAMESPACE},
             "spec": {"holderIdentity": "elsewhere", "leaseDurationSeconds": 3600,
                      "renewTime": "2030-01-01T00:00:00.000000Z"}}  # fmt: skip
    (tmp_path / "lease.json").write_text(json.dumps(lease))  # kubectl: the client would reformat the MicroTime
    plane.kubectl("create", "-f", str(tmp_path / "lease.json"))
    CustomObjectsApi(client).create_namespaced_custom_object(G, V, NS, P, {
        "apiVersion": f"{G}/{V}", "kind": "CompactionPolicy", "metadata": {"name": "waiting"}, "spec": {}})
    candidate = Replica("op-c", elections, tmp_path / "op-c.log", webhook=False)
    try:
        wait_for(candidate.ready, what="ready while waiting")
        wait_for(lambda: candidate.metric("kafka_cleaner_operator_leader") == 0.0, what="a follower's leader gauge")
        assert candidate.stop() == 0
    finally:
        if candidate.process.poll() is None:
            candidate.process.kill()
    assert lease_holder(plane) == "elsewhere"
    assert ready_condition(plane, "waiting") == {}  # never reconciled
    assert "Traceback" not in candidate.log.read_text()


# -------------------------------------------------------------------------------------------
# The Lease logic, against the real API server, with a mock clock
# -------------------------------------------------------------------------------------------


def test_lease_election_rules(control_plane: ControlPlane, elections: pathlib.Path) -> None:
    time_ = MockTime()
    kube = Kube(kubernetes.config.new_client_from_config(config_file=str(elections)))  # as the chart's account

    def elector(identity: str) -> LeaseElector:
        return LeaseElector(kube, namespace=CHART_NAMESPACE, name=LEASE, identity=identity,
                            lease_duration=15, renew_deadline=10, retry_period=2, time=time_)

    a, b = elector("a"), elector("b")
    assert a.try_acquire_or_renew() is True  # created
    assert b.try_acquire_or_renew() is False
    time_.advance(10_000)
    assert a.try_acquire_or_renew() is True  # renewed
    assert b.try_acquire_or_renew() is False  # it saw the renewal: not expired
    time_.advance(16_000)  # a stops renewing
    assert b.try_acquire_or_renew() is True  # taken over
    lease = _get(control_plane, "lease", LEASE, "-n", CHART_NAMESPACE)
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1
    assert a.try_acquire_or_renew() is False  # a lost it
    b.release()
    assert a.try_acquire_or_renew() is True  # released: no need to wait

    # keep_leading: renewals that fail past the deadline call on_lost.
    stop, lost = threading.Event(), threading.Event()
    c = LeaseElector(kube, namespace=CHART_NAMESPACE, name=LEASE, identity="c", lease_duration=0.6,
                     renew_deadline=0.4, retry_period=0.1)
    thread = c.keep_leading(stop, lost.set)  # c does not hold it: the first renewal fails
    assert lost.wait(5)
    thread.join(5)
