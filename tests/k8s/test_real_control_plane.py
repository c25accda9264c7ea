"""The chart, the CRD and the injected sidecar against a real Kubernetes control plane
(``control_plane.py``: kube-apiserver, etcd, kube-controller-manager, kube-scheduler and kwok
built from their Go modules). What the emulator could not show, shown by Kubernetes' own
code: CEL validation of the CRD, helm's install/upgrade/uninstall (releases stored as
Secrets), RBAC under the chart's ServiceAccount, Pod Security admission of the injected pod,
and a real StatefulSet rollout whose pods kwok makes Ready.
"""

from __future__ import annotations

import json
import pathlib
import subprocess

import pytest
import yaml
from compaction_operator.injection import build_sidecar, inject_into_pod, label_selector_string, selector_matches
from control_plane import ControlPlane, available, missing_reason
from test_crd import CEL_RULES

from cleaner.config import parse_policy

REPO = pathlib.Path(__file__).resolve().parents[2]
HELM = REPO / ".tools" / "bin" / "helm"
CHART = REPO / "helm" / "kafka-cleaner-operator"

pytestmark = [
    pytest.mark.skipif(not available(), reason=missing_reason()),
    pytest.mark.xdist_group("control-plane"),  # one control plane per session, on one worker
]


@pytest.fixture
def plane(control_plane: ControlPlane) -> ControlPlane:
    return control_plane


def _policy(name: str, spec: dict) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "kafkacleaner.io/v1alpha1",
            "kind": "CompactionPolicy",
            "metadata": {"name": name, "namespace": "default"},
            "spec": spec,
        }
    )


def _apply(plane: ControlPlane, text: str) -> subprocess.CompletedProcess[str]:
    path = plane.root / "manifest.yaml"
    path.write_text(text)
    return plane.kubectl("apply", "-f", str(path), check=False)


@pytest.mark.parametrize(("where", "rule", "valid", "invalid", "field"), CEL_RULES, ids=[r[1][:40] for r in CEL_RULES])
def test_the_api_server_judges_each_cel_rule_as_the_policy_parser_does(
    plane: ControlPlane, where: str, rule: str, valid: dict, invalid: dict, field: str
) -> None:
    """Each CEL rule of the CRD, by the API server itself (server-side dry run): the spec that
    the rule and ``parse_policy`` accept is created, the one they refuse is refused, naming
    the field (test_crd.py checks the same table against ``parse_policy``)."""
    accepted = _create(plane, "valid", valid)
    assert accepted.returncode == 0, accepted.stderr
    refused = _create(plane, "invalid", invalid)
    assert refused.returncode != 0, f"the API server accepted {invalid}"
    assert field in refused.stderr, refused.stderr


def _create(plane: ControlPlane, name: str, spec: dict) -> subprocess.CompletedProcess[str]:
    path = plane.root / f"{name}.yaml"
    path.write_text(_policy(name, spec))
    return plane.kubectl("create", "--dry-run=server", "-f", str(path), check=False)


def test_a_statefulset_rolls_out_on_fake_nodes_through_the_real_controllers(plane: ControlPlane) -> None:
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "kafka", "namespace": "default"},
        "spec": {
            "replicas": 3,
            "serviceName": "kafka",
            "selector": {"matchLabels": {"app": "kafka"}},
            "template": {
                "metadata": {"labels": {"app": "kafka"}},
                "spec": {"containers": [{"name": "kafka", "image": "apache/kafka:4.1.0"}]},
            },
        },
    }
    assert _apply(plane, yaml.safe_dump(sts)).returncode == 0
    plane.kubectl("rollout", "status", "statefulset/kafka", "--timeout=120s")
    pods = json.loads(plane.kubectl("get", "pods", "-l", "app=kafka", "-o", "json").stdout)["items"]
    assert sorted(p["metadata"]["name"] for p in pods) == ["kafka-0", "kafka-1", "kafka-2"]
    assert all(p["spec"]["nodeName"].startswith("kwok-node-") for p in pods)
    assert all(c["type"] != "Ready" or c["status"] == "True" for p in pods for c in p["status"]["conditions"])


def _helm(plane: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(HELM), f"--kubeconfig={plane.kubeconfig}", *args], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, f"helm {' '.join(args)}:\n{proc.stdout}{proc.stderr}"
    return proc


@pytest.mark.skipif(not HELM.exists(), reason=f"helm is not installed at {HELM} (make setup installs it)")
def test_helm_installs_upgrades_and_uninstalls_the_chart_and_its_rbac_is_what_the_operator_needs(
    plane: ControlPlane,
) -> None:
    """The real helm against the real API server (releases stored as Secrets, which the
    emulator refused); then the chart's ServiceAccount, impersonated, asked by the real RBAC
    authorizer: what the operator calls is allowed, what it must never have is not."""
    ns = "cleaner-system"  # a release of its own: the other tests keep theirs installed
    _helm(plane, "install", "life", str(CHART), "-n", ns, "--create-namespace", "--wait", "--timeout=120s")
    deployment = json.loads(
        plane.kubectl("get", "deployment", "-n", ns, "life-kafka-cleaner-operator", "-o", "json").stdout
    )
    assert deployment["status"].get("readyReplicas") == 1  # the operator's pod, Ready on a kwok node
    account = f"system:serviceaccount:{ns}:life-kafka-cleaner-operator"

    def can(verb: str, resource: str, namespace: str = ns) -> bool:
        # "pods/exec" as one argument would be the pod named "exec": subresources are an option.
        resource, _, subresource = resource.partition("/")
        extra = [f"--subresource={subresource}"] if subresource else []
        proc = plane.kubectl("auth", "can-i", verb, resource, *extra, "-n", namespace, f"--as={account}",
                             check=False)
        return proc.stdout.strip() == "yes"

    for verb, resource in [
        ("list", "compactionpolicies.kafkacleaner.io"),
        ("watch", "compactionpolicies.kafkacleaner.io"),
        ("patch", "compactionpolicies.kafkacleaner.io/status"),
        ("patch", "statefulsets.apps"),
        ("list", "pods"),
        ("create", "pods"),  # only ever with dryRun=All
        ("create", "configmaps"),
        ("create", "events"),
    ]:
        assert can(verb, resource), f"the operator may not {verb} {resource}"
        # By default only the release namespace: nothing in a namespace the chart does not name.
        assert not can(verb, resource, "kafka"), f"the operator may {verb} {resource} in another namespace"
    for verb, resource in [
        ("get", "secrets"),
        ("list", "secrets"),
        ("create", "pods/exec"),
        ("get", "pods"),  # granted once, never used
        ("watch", "statefulsets.apps"),
        ("list", "configmaps"),
        ("patch", "configmaps"),
        ("delete", "statefulsets.apps"),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
    ]:
        assert not can(verb, resource), f"the operator may {verb} {resource}"

    _helm(plane, "upgrade", "life", str(CHART), "-n", ns, "--set", "logLevel=DEBUG", "--wait", "--timeout=120s")
    env = json.loads(plane.kubectl("get", "deployment", "-n", ns, "life-kafka-cleaner-operator", "-o", "json").stdout)
    container = env["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "KAFKA_CLEANER_LOG_LEVEL", "value": "DEBUG"} in container["env"]
    _helm(plane, "uninstall", "life", "-n", ns, "--wait", "--timeout=120s")
    left = plane.kubectl(
        "get",
        "deployment,serviceaccount,clusterrole,clusterrolebinding",
        "-A",
        "-l",
        "app.kubernetes.io/instance=life",
        "-o",
        "name",
    ).stdout
    assert left.strip() == ""
    # Helm never deletes what crds/ installed: the CRD, and so the users' policies, stay.
    plane.kubectl("get", "crd", "compactionpolicies.kafkacleaner.io")


def _minimal_crd(group: str, kind: str, plural: str) -> dict:
    """A stand-in for one of cert-manager's or the Prometheus Operator's CRDs (group, version,
    kind, any spec): enough for the API server to store what the chart renders; no controller
    of theirs runs."""
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {"group": group, "scope": "Namespaced",
                     "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
                     "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                         "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}  # fmt: skip


@pytest.mark.skipif(not HELM.exists(), reason=f"helm is not installed at {HELM} (make setup installs it)")
def test_helm_installs_the_gitops_variant_with_cert_manager_and_a_disruption_budget(plane: ControlPlane) -> None:
    """Two replicas with leader election, the webhook's certificate from cert-manager: the real
    API server stores the Certificate, the Issuer, the webhook configuration with the CA
    injector's annotation and no caBundle, and the PodDisruptionBudget; an upgrade with the same
    values changes none of them (what Argo CD needs to settle). With a PodMonitor and a
    NetworkPolicy that admits only the operator, the notes say that Prometheus is shut out."""
    crds = [("cert-manager.io", "Certificate", "certificates"), ("cert-manager.io", "Issuer", "issuers"),
            ("monitoring.coreos.com", "PodMonitor", "podmonitors")]
    for group, kind, plural in crds:
        assert _apply(plane, yaml.safe_dump(_minimal_crd(group, kind, plural))).returncode == 0
    plane.kubectl("wait", "--for=condition=Established", *(f"crd/{plural}.{group}" for group, _, plural in crds),
                  "--timeout=60s")
    ns, release, brokers = "cleaner-gitops", "gitops", "kafka-gitops"
    plane.kubectl("create", "namespace", brokers, check=False)
    values = ["--set", "replicaCount=2", "--set", "leaderElection.enabled=true", "--set", "webhook.enabled=true",
              "--set", "webhook.certManager.enabled=true", "--set", "metrics.podMonitor.enabled=true",
              "--set", "networkPolicy.enabled=true", "--set", f"networkPolicy.brokerNamespaces={{{brokers}}}",
              "--set", "networkPolicy.brokerPodSelector.matchLabels.strimzi\\.io/kind=Kafka"]
    notes = _helm(plane, "install", release, str(CHART), "-n", ns, "--create-namespace", *values, "--wait",
                  "--timeout=120s").stdout
    assert "Kubernetes 1.28 or later" in notes and "generated by Helm" not in notes
    assert "Prometheus cannot scrape them" in notes and "networkPolicy.prometheusPeers" in notes
    fullname = f"{release}-kafka-cleaner-operator"

    def stored() -> dict[str, dict]:
        objects = {}
        for kind, name, namespace in (("certificate", f"{fullname}-webhook", ns),
                                      ("issuer", f"{fullname}-selfsigned", ns),
                                      ("poddisruptionbudget", fullname, ns),
                                      ("networkpolicy", f"{fullname}-sidecar-status", brokers),
                                      ("podmonitor", f"{fullname}-sidecars", ns),
                                      ("mutatingwebhookconfiguration", f"{fullname}.kafkacleaner.io", None)):
            args = ["get", kind, name, "-o", "json"] + (["-n", namespace] if namespace else [])
            objects[kind] = json.loads(plane.kubectl(*args).stdout)
        return objects

    before = stored()
    config = before["mutatingwebhookconfiguration"]
    assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{ns}/{fullname}-webhook"
    assert "caBundle" not in config["webhooks"][0]["clientConfig"]
    assert f"{fullname}.{ns}.svc" in before["certificate"]["spec"]["dnsNames"]
    assert before["certificate"]["spec"]["issuerRef"] == {"name": f"{fullname}-selfsigned", "kind": "Issuer"}
    assert before["networkpolicy"]["spec"]["podSelector"] == {"matchLabels": {"strimzi.io/kind": "Kafka"}}
    budget = before["poddisruptionbudget"]
    assert budget["spec"]["maxUnavailable"] == 1 and budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    deployment = json.loads(plane.kubectl("get", "deployment", "-n", ns, fullname, "-o", "json").stdout)
    assert budget["spec"]["selector"] == deployment["spec"]["selector"]
    assert not plane.kubectl("get", "secret", f"{fullname}-webhook-tls", "-n", ns, check=False).stdout.strip(), \
        "the chart wrote the Secret that cert-manager owns"

    _helm(plane, "upgrade", release, str(CHART), "-n", ns, *values, "--wait", "--timeout=120s")
    after = stored()
    assert {k: o["metadata"]["resourceVersion"] for k, o in after.items()} == \
        {k: o["metadata"]["resourceVersion"] for k, o in before.items()}
    _helm(plane, "uninstall", release, "-n", ns, "--wait", "--timeout=120s")


def test_the_sidecar_gets_no_service_account_token_and_the_broker_keeps_its_own(plane: ControlPlane) -> None:
    """The API server's ServiceAccount admission mounts the pod's token into every container
    with nothing at the token path: the injected sidecar has the policy volume there, so it
    gets none (it calls no Kubernetes API); the broker's container gets its token as before."""
    # generateName: a dry-run create of a name in use is AlreadyExists, and other tests have a kafka-0.
    broker = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "token-", "namespace": "default"},
              "spec": {"containers": [{"name": "kafka", "image": "apache/kafka:4.1.0",
                                       "volumeMounts": [{"name": "data", "mountPath": "/var/lib/kafka"}]}],
                       "volumes": [{"name": "data", "emptyDir": {}}]}}  # fmt: skip
    wait_for_account = plane.kubectl("get", "serviceaccount", "default", "-n", "default", check=False)
    assert wait_for_account.returncode == 0, wait_for_account.stderr
    for native in (True, False):
        sidecar = build_sidecar(parse_policy(_policy_document("default")), image="kc:test", native=native)
        path = plane.root / "token.yaml"
        path.write_text(yaml.safe_dump(inject_into_pod(broker, sidecar)))
        admitted = json.loads(plane.kubectl("create", "--dry-run=server", "-o", "json", "-f", str(path)).stdout)
        token_volumes = {v["name"] for v in admitted["spec"]["volumes"] if v["name"].startswith("kube-api-access-")}
        assert len(token_volumes) == 1, admitted["spec"]["volumes"]  # the admission did run
        containers = {c["name"]: c for key in ("containers", "initContainers") for c in admitted["spec"].get(key, [])}
        mounts = {name: {m["name"] for m in c.get("volumeMounts", [])} for name, c in containers.items()}
        assert token_volumes <= mounts["kafka"]
        assert not token_volumes & mounts["kafka-cleaner"], mounts


def test_pod_security_admits_the_injected_broker_pod_in_a_restricted_namespace(plane: ControlPlane) -> None:
    """The sidecar's restricted security context passes the real PodSecurity admission at
    ``enforce: restricted``, running as the broker container's uid (Confluent's 1000, where
    the pod says 1001), copied, not hard-coded; the same pod with a capability added to the
    sidecar is refused."""
    plane.kubectl("create", "namespace", "restricted-kafka")
    plane.kubectl("label", "namespace", "restricted-kafka", "pod-security.kubernetes.io/enforce=restricted")
    restricted = {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    broker = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "kafka-0", "namespace": "restricted-kafka"},
        "spec": {
            "securityContext": {"runAsUser": 1001, "fsGroup": 1001},
            "containers": [
                {
                    "name": "kafka",
                    "image": "apache/kafka:4.1.0",
                    "securityContext": {**restricted, "runAsUser": 1000, "runAsGroup": 1000},
                    "volumeMounts": [{"name": "data", "mountPath": "/var/lib/kafka"}],
                }
            ],
            "volumes": [{"name": "data", "emptyDir": {}}],
        },
    }
    for native in (True, False):
        sidecar = build_sidecar(parse_policy(_policy_document("restricted-kafka")), image="kc:test", native=native)
        pod = inject_into_pod(broker, sidecar)
        admitted = _create_object(plane, pod)
        assert admitted.returncode == 0, admitted.stderr
        created = yaml.safe_load(admitted.stdout) if admitted.stdout.strip().startswith("apiVersion") else pod
        ours = next(c for c in created["spec"][sidecar.list_name] if c["name"] == "kafka-cleaner")
        assert (ours["securityContext"]["runAsUser"], ours["securityContext"]["runAsGroup"]) == (1000, 1000)
        widened = inject_into_pod(broker, sidecar)
        sidecar_container = next(c for c in widened["spec"][sidecar.list_name] if c["name"] == "kafka-cleaner")
        sidecar_container["securityContext"]["capabilities"] = {"add": ["NET_ADMIN"], "drop": ["ALL"]}
        refused = _create_object(plane, widened)
        assert refused.returncode != 0 and 'violates PodSecurity "restricted:' in refused.stderr, refused.stderr


def _policy_document(namespace: str) -> dict:
    target = {"statefulSet": "kafka", "dataVolume": "data", "mountPath": "/var/lib/kafka", "logDirs": ["data"]}
    return {"apiVersion": "kafkacleaner.io/v1alpha1", "kind": "CompactionPolicy",
            "metadata": {"name": "offsets", "namespace": namespace, "generation": 1},
            "spec": {"target": target}}  # fmt: skip


def _create_object(plane: ControlPlane, obj: dict, *, output: bool = False) -> subprocess.CompletedProcess[str]:
    """A server-side dry-run create (admission, defaulting and the pod's computed status run;
    nothing is stored); ``output``: the object the API server returns, as JSON."""
    path = plane.root / "object.yaml"
    path.write_text(yaml.safe_dump(obj))
    return plane.kubectl("create", "--dry-run=server", "-f", str(path), *(["-o", "json"] if output else []),
                         check=False)


def test_the_label_selector_the_operator_sends_lists_the_pods_the_api_server_selects(plane: ControlPlane) -> None:
    """For each case of test_injection.SELECTOR_CASES: a pod with the case's labels, listed by
    the real API server with ``label_selector_string(selector)``, is in the list exactly when
    ``selector_matches`` says it matches."""
    import sys

    sys.path.insert(0, str(REPO / "tests" / "operator"))
    from test_injection import SELECTOR_CASES

    namespace = "selectors"
    plane.kubectl("create", "namespace", namespace, check=False)
    for i, (selector, labels, expected) in enumerate(SELECTOR_CASES):
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"case-{i}", "namespace": namespace, "labels": {**labels, "case": str(i)}},
               "spec": {"containers": [{"name": "c", "image": "busybox"}]}}  # fmt: skip
        _create_object_for_real(plane, pod)
        query = label_selector_string(selector)
        found = plane.kubectl("get", "pods", "-n", namespace, "-l", f"{query},case={i}", "-o", "json")
        listed = json.loads(found.stdout)
        assert (len(listed["items"]) == 1) is expected, (selector, labels, query)
        assert selector_matches(selector, labels) is expected


def _create_object_for_real(plane: ControlPlane, obj: dict) -> None:
    path = plane.root / "object.yaml"
    path.write_text(yaml.safe_dump(obj))
    plane.kubectl("create", "-f", str(path))


@pytest.mark.parametrize(("resources", "qos"), [
    (None, "Guaranteed"),  # the defaults: requests = limits
    ({"limits": {"cpu": "100m", "memory": "256Mi"}}, "Guaranteed"),  # the API server sets requests = limits
    ({"requests": {"cpu": "100m", "memory": "256Mi"}}, "Burstable"),  # no limits: the pod is no longer Guaranteed
])
@pytest.mark.parametrize("native", [True, False], ids=["native", "container"])
def test_the_qos_class_the_api_server_gives_a_guaranteed_broker_with_the_sidecar(
    plane: ControlPlane, resources: dict | None, qos: str, native: bool
) -> None:
    """The API server computes ``status.qosClass`` over every container, init and native
    sidecar containers included: the default sidecar keeps a Guaranteed broker Guaranteed."""
    guaranteed = {"cpu": "1", "memory": "2Gi"}
    broker = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "qos-broker-", "namespace": "default"},  # a dry run of a taken name fails
        "spec": {
            "containers": [{"name": "kafka", "image": "apache/kafka:4.1.0",
                            "resources": {"requests": guaranteed, "limits": guaranteed},
                            "volumeMounts": [{"name": "data", "mountPath": "/var/lib/kafka"}]}],
            "volumes": [{"name": "data", "emptyDir": {}}],
        },
    }  # fmt: skip
    alone = _create_object(plane, broker, output=True)
    assert alone.returncode == 0, alone.stderr
    assert json.loads(alone.stdout)["status"]["qosClass"] == "Guaranteed"
    document = _policy_document("default")
    if resources is not None:
        document["spec"]["sidecar"] = {"resources": resources}
    sidecar = build_sidecar(parse_policy(document), image="kc:test", native=native)
    created = _create_object(plane, inject_into_pod(broker, sidecar), output=True)
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["status"]["qosClass"] == qos
