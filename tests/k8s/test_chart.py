"""The Helm chart: the real helm (lint, template), kubernetes-validate on what it renders, the
values schema, least-privilege RBAC, the alert rules under a real promtool, and the settings
the Deployment gives the operator."""

from __future__ import annotations

import base64
import dataclasses
import json
import pathlib
import re
import shlex
import subprocess
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import kubernetes_validate
import pytest
import yaml
from compaction_operator.handlers import WEBHOOK_ID
from compaction_operator.settings import OperatorConfig

REPO = pathlib.Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "kafka-cleaner-operator"
HELM = REPO / ".tools" / "bin" / "helm"
KUBE_VERSION = "1.30.0"
Render = Callable[..., list[dict[str, Any]]]

ALL_ON: dict[str, Any] = {
    "replicaCount": 2, "leaderElection": {"enabled": True}, "webhook": {"enabled": True},
    "metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True},
                "prometheusRule": {"enabled": True}, "grafanaDashboard": {"enabled": True}},
    "networkPolicy": {"enabled": True, "brokerNamespaces": ["kafka"],
                      "brokerPodSelector": {"matchLabels": {"strimzi.io/kind": "Kafka"}},
                      "prometheusPeers": [{"namespaceSelector": {"matchLabels": {
                          "kubernetes.io/metadata.name": "monitoring"}},
                          "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]},
}
VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "all-features": ALL_ON,
    "watch-namespaces": {**ALL_ON, "watchNamespaces": ["kafka", "kafka-b"]},
    "watch-all-namespaces": {**ALL_ON, "watchAllNamespaces": True},
    "webhook-cert-manager": {"webhook": {"enabled": True, "certManager": {"enabled": True}}},
    "webhook-managed-by-operator": {"webhook": {"enabled": True, "manageConfiguration": True}},
    "webhook-existing-secret": {"webhook": {"enabled": True, "tls": {"existingSecret": "mine",
                                                                     "caBundle": "Y2E="}}},
}
#: Kinds kubernetes-validate has no schema for (custom resources of other projects).
FOREIGN_GROUPS = ("monitoring.coreos.com/", "cert-manager.io/")


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    if not HELM.exists():
        pytest.skip(f"helm is not installed at {HELM} (make setup installs it)")
    result = subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


# -------------------------------------------------------------------------------------------
# The CRD, lint, template, validation
# -------------------------------------------------------------------------------------------


def test_the_chart_ships_the_crd_unchanged() -> None:
    shipped = (CHART / "crds" / "compactionpolicy.yaml").read_bytes()
    assert shipped == (REPO / "crds" / "compactionpolicy.yaml").read_bytes()


def test_the_readme_lists_every_value_of_values_yaml() -> None:
    """Each leaf of values.yaml is in the README's table by its full dotted name, or its map
    is (``resources``, ``podSecurityContext``: passed through as a whole)."""
    readme = (CHART / "README.md").read_text()
    documented = set(re.findall(r"`([\w.]+)`", readme))

    def leaves(values: dict[str, Any], prefix: str = "") -> list[str]:
        out = []
        for key, value in values.items():
            name = prefix + key
            out += leaves(value, name + ".") if isinstance(value, dict) and value else [name]
        return out

    def listed(name: str) -> bool:
        parts = name.split(".")
        return any(".".join(parts[:i]) in documented for i in range(1, len(parts) + 1))

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert [name for name in leaves(values) if not listed(name)] == []


def test_the_readme_says_how_to_upgrade_the_crd() -> None:
    readme = (CHART / "README.md").read_text()
    assert "never upgrades" in readme
    assert "kubectl apply --server-side --force-conflicts -f ./helm/kafka-cleaner-operator/crds/compactionpolicy.yaml" \
        in readme


@pytest.mark.parametrize("variant", ["defaults", "all-features"])
def test_helm_lint_strict(variant: str, tmp_path: pathlib.Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(VARIANTS[variant]))
    helm("lint", "--strict", str(CHART), "-f", str(values))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rendered_manifests_are_valid_kubernetes_objects(variant: str, helm_template: Render) -> None:
    objects = helm_template(VARIANTS[variant], extra_args=["--include-crds"])
    assert by_kind(objects, "CustomResourceDefinition"), "--include-crds renders the CRD"
    checked = 0
    for obj in objects:
        if obj["apiVersion"].startswith(FOREIGN_GROUPS):
            continue
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        checked += 1
        meta = obj["metadata"]
        if obj["kind"] != "CustomResourceDefinition":
            assert meta["labels"]["app.kubernetes.io/part-of"] == "kafka-cleaner", (obj["kind"], meta["name"])
        if obj["kind"] not in ("ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                               "MutatingWebhookConfiguration"):
            assert meta.get("namespace"), f"{obj['kind']} {meta['name']} has no namespace"
    assert checked >= 8


@pytest.mark.parametrize(("values", "error"), [
    ({"image": {"pullPolicy": "Sometimes"}}, "image.pullPolicy"),
    ({"replicaCount": "two"}, "replicaCount"),
    ({"watchNamespaces": ["Kafka_NS"]}, "watchNamespaces"),
    ({"logLevel": "TRACE"}, "logLevel"),
    ({"webhook": {"enabled": "yes"}}, "webhook.enabled"),
    ({"webhook": {"port": 70000}}, "webhook.port"),
    ({"leaderElection": {"enabeld": True}}, "enabeld"),
    ({"metrics": {"serviceMonitor": {"interval": "often"}}}, "interval"),
    ({"imagePullPolicy": "Always"}, "imagePullPolicy"),
    ({"image": {"digest": "sha1:abc"}}, "image.digest"),
    ({"podDisruptionBudget": {"maxUnavailable": "lots"}}, "podDisruptionBudget.maxUnavailable"),
    ({"metrics": {"prometheusRule": {"runbookBaseUrl": "docs/runbooks.md"}}}, "runbookBaseUrl"),
    ({"networkPolicy": {"prometheusPeers": [{"pods": "prometheus"}]}}, "prometheusPeers"),
    ({"watchAllNamespaces": "yes"}, "watchAllNamespaces"),
    ({"sidecar": {"allowedImages": ["ghcr.io/kafka-cleaner/kafka-cleaner:1.0"]}}, "sidecar.allowedImages"),
    ({"sidecar": {"allowedImages": ["ghcr.io/x/y@sha256:abc"]}}, "sidecar.allowedImages"),
])
def test_the_values_schema_rejects_bad_values(values: dict[str, Any], error: str, tmp_path: pathlib.Path) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    result = helm("template", "x", str(CHART), "-f", str(path), check=False)
    assert result.returncode != 0, f"helm template accepted {values}"
    assert error in result.stderr


def test_helm_lint_rejects_bad_values_too(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({"logLevel": "TRACE", "webhook": {"enabled": "yes"}}))
    result = helm("lint", "--strict", str(CHART), "-f", str(path), check=False)
    assert result.returncode != 0 and "logLevel" in result.stdout and "webhook.enabled" in result.stdout


@pytest.mark.parametrize(("values", "error"), [
    ({"replicaCount": 2}, "needs leaderElection.enabled=true"),
    ({"networkPolicy": {"enabled": True, "brokerNamespaces": ["kafka"]}}, "brokerPodSelector"),
    ({"watchAllNamespaces": True, "networkPolicy": {"enabled": True, "brokerPodSelector": {"matchLabels": {"a": "b"}}}},
     "brokerNamespaces"),
    ({"watchAllNamespaces": True, "watchNamespaces": ["kafka"]}, "exclude each other"),
    ({"webhook": {"enabled": True, "tls": {"existingSecret": "mine"}}}, "webhook.tls.caBundle"),
])
def test_inconsistent_values_fail_with_a_message(values: dict[str, Any], error: str, tmp_path: pathlib.Path) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    result = helm("template", "x", str(CHART), "-f", str(path), check=False)
    assert result.returncode != 0 and error in result.stderr, result.stderr


# -------------------------------------------------------------------------------------------
# The Deployment and the operator's settings
# -------------------------------------------------------------------------------------------


def deployment_env(objects: list[dict[str, Any]]) -> dict[str, str]:
    [deployment] = by_kind(objects, "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env.update({e["name"]: f"<{e['valueFrom']['fieldRef']['fieldPath']}>" for e in container["env"]
                if "valueFrom" in e})
    return env


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_deployment_configures_the_operator(variant: str, helm_template: Render) -> None:
    objects = helm_template(VARIANTS[variant])
    env = deployment_env(objects)
    config = OperatorConfig.from_env(env)  # what the operator will read: valid for every variant
    values = VARIANTS[variant]
    # Default: the release namespace only; every namespace only when asked for.
    assert config.namespaces == (() if values.get("watchAllNamespaces") else
                                 tuple(values.get("watchNamespaces", ["default"])))
    assert config.sidecar_image_allowlist == ("ghcr.io/kafka-cleaner/kafka-cleaner",)
    assert config.sidecar_image == "ghcr.io/kafka-cleaner/kafka-cleaner:0.1.0"
    assert config.leader_election is bool(values.get("leaderElection"))
    assert config.webhook_enabled is bool(values.get("webhook"))
    if config.webhook_enabled:
        assert config.webhook_service_name == "kco-kafka-cleaner-operator" and config.webhook_service_port == 443
        manage = values["webhook"].get("manageConfiguration", False)
        assert (config.webhook_configuration is not None) is manage
    [deployment] = by_kind(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["command"] == ["kafka-cleaner-operator"]
    assert container["image"] == "ghcr.io/kafka-cleaner/kafka-cleaner:0.1.0"
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 65532
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]} and security["seccompProfile"]["type"] == "RuntimeDefault"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert pod["serviceAccountName"] == by_kind(objects, "ServiceAccount")[0]["metadata"]["name"]


def test_the_image_allow_list_reaches_the_operator(helm_template: Render) -> None:
    env = deployment_env(helm_template({"sidecar": {"allowedImages": ["mirror.example/kc", "localhost:5000/kc"]}}))
    config = OperatorConfig.from_env(env)
    assert config.sidecar_image_allowlist == ("mirror.example/kc", "localhost:5000/kc")


def test_namespaced_by_default_the_webhook_and_monitors_too(helm_template: Render) -> None:
    """The chart's default is the release namespace, for every object that names namespaces:
    the webhook sees pods of that namespace only, the PodMonitor and NetworkPolicy follow."""
    objects = helm_template({"webhook": {"enabled": True}, "metrics": {"podMonitor": {"enabled": True}},
                             "networkPolicy": {"enabled": True, "brokerPodSelector": {"matchLabels": {"a": "b"}}}})
    [configuration] = by_kind(objects, "MutatingWebhookConfiguration")
    assert configuration["webhooks"][0]["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["default"]}]
    [monitor] = by_kind(objects, "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["default"]}
    assert {p["metadata"]["namespace"] for p in by_kind(objects, "NetworkPolicy")} == {"default"}
    assert not [r for r in by_kind(objects, "ClusterRole") if any("pods" in rule["resources"] for rule in r["rules"])]


def test_scheduling_values_reach_the_pod(helm_template: Render) -> None:
    values = {"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}],
              "nodeSelector": {"kubernetes.io/os": "linux"},
              "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                  {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["ops"]}]}]}}},
              "image": {"digest": "sha256:" + "a" * 64}, "resources": {"limits": {"cpu": "1"}}}
    [deployment] = by_kind(helm_template(values), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["tolerations"] == values["tolerations"] and pod["nodeSelector"] == values["nodeSelector"]
    assert pod["affinity"] == values["affinity"]
    assert pod["containers"][0]["image"] == "ghcr.io/kafka-cleaner/kafka-cleaner@sha256:" + "a" * 64
    assert pod["containers"][0]["resources"]["limits"] == {"cpu": "1", "memory": "256Mi"}  # merged with defaults


# -------------------------------------------------------------------------------------------
# RBAC: least privilege
# -------------------------------------------------------------------------------------------


def granted(rbac: SimpleNamespace, objects: list[dict[str, Any]]) -> set[tuple[str, str, str, str, str]]:
    """(scope, apiGroup, resource, verb, resourceName) of every rule bound to the operator."""
    out = set()
    for grant in rbac.operator_grants(objects):
        rule = grant.rule
        assert not rule.get("nonResourceURLs"), rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    for name in rule.get("resourceNames") or ["*any*"]:
                        out.add((grant.namespace or "cluster", group, resource, verb, name))
    return out


#: Exactly the calls of operator/kube.py and kopf's; the end-to-end tests run the operator with
#: the chart's ServiceAccount token, so a grant missing here fails them.
NAMESPACED = {
    ("kafkacleaner.io", "compactionpolicies", v) for v in ("list", "watch", "patch")} | {
    ("kafkacleaner.io", "compactionpolicies/status", "patch")} | {
    ("kafkacleaner.io", "compactionpolicies/finalizers", "update")} | {
    ("apps", "statefulsets", v) for v in ("get", "list", "patch")} | {
    ("", "pods", v) for v in ("list", "create", "patch", "delete")} | {  # create: only with dryRun=All
    ("core.strimzi.io", "strimzipodsets", "get")} | {
    ("", "configmaps", v) for v in ("get", "create", "update", "delete")} | {
    ("", "events", "create")}
CRDS = {("apiextensions.k8s.io", "customresourcedefinitions", v) for v in ("get", "list", "watch")} | {
    ("", "nodes", "list")}  # the kubelets' versions: native sidecar or not


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rbac_grants_exactly_what_the_operator_needs(variant: str, helm_template: Render,
                                                     rbac: SimpleNamespace) -> None:
    values = VARIANTS[variant]
    grants = granted(rbac, helm_template(values))
    watched = [] if values.get("watchAllNamespaces") else values.get("watchNamespaces", ["default"])
    expected = {("cluster", g, r, v, "*any*") for g, r, v in CRDS}
    if watched:
        expected |= {(ns, g, r, v, "*any*") for ns in watched for g, r, v in NAMESPACED}
        expected |= {("cluster", "", "namespaces", v, "*any*") for v in ("get", "list", "watch")}
    else:
        expected |= {("cluster", g, r, v, "*any*") for g, r, v in NAMESPACED}
    if values.get("leaderElection"):
        expected |= {("default", "coordination.k8s.io", "leases", "create", "*any*")}
        expected |= {("default", "coordination.k8s.io", "leases", v, "kco-kafka-cleaner-operator")
                     for v in ("get", "update")}
    if values.get("webhook", {}).get("manageConfiguration"):
        name = "kco-kafka-cleaner-operator.kafkacleaner.io"
        resource = "mutatingwebhookconfigurations"  # the operator's own: no validating twin (kopf's had one)
        expected |= {("cluster", "admissionregistration.k8s.io", resource, "create", "*any*")}
        expected |= {("cluster", "admissionregistration.k8s.io", resource, v, name) for v in ("get", "patch")}
    assert grants == expected


def test_nothing_broad_or_dangerous_is_granted(helm_template: Render, rbac: SimpleNamespace) -> None:
    dangerous = {"secrets", "pods/exec", "pods/attach", "pods/portforward", "pods/log", "serviceaccounts/token",
                 "nodes/proxy", "clusterroles", "roles", "rolebindings", "clusterrolebindings"}
    for values in VARIANTS.values():
        for grant in rbac.operator_grants(helm_template(values)):
            rule = grant.rule
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule.get(key, []), (grant.source, rule)
            assert not dangerous & set(rule["resources"]), (grant.source, rule)
            assert not {"escalate", "bind", "impersonate", "deletecollection"} & set(rule["verbs"])
            if "nodes" in rule["resources"]:
                assert rule["verbs"] == ["list"], (grant.source, rule)  # the kubelets' versions, nothing else
            if "pods" in rule["resources"]:
                # create: the admission dry run (the full verb all the same: the README says
                # what it gives); patch: an annotation; delete: one paced pod at a time
                assert set(rule["verbs"]) <= {"list", "create", "patch", "delete"}


def readme_rbac_table(readme: str) -> set[tuple[str, str]]:
    """(resource, verb) of every row of the README's RBAC tables: ``| `resource` (group) | verbs | ...``."""
    section = readme.split("## RBAC, least privilege", 1)[1].split("\n## ", 1)[0]
    rows = set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and (resource := re.match(r"`([\w./-]+)`", cells[0])):
            rows |= {(resource.group(1), verb.strip()) for verb in cells[1].split(",")}
    return rows


def test_the_readme_says_what_each_granted_verb_is_for(helm_template: Render, rbac: SimpleNamespace) -> None:
    """Issue 20, item 7: every (resource, verb) the chart grants the operator, in any variant
    (webhook and leader election only when asked for, said in prose), has a row in the README's
    table saying why and what breaks without it; and the claim that creating pods adds no power
    (it is the power to run any pod with any ServiceAccount and Secret of the namespace) is gone."""
    readme = (CHART / "README.md").read_text()
    rows = readme_rbac_table(readme)
    optional = {"mutatingwebhookconfigurations", "leases"}
    granted = {(resource, verb) for values in VARIANTS.values() for grant in rbac.operator_grants(helm_template(values))
               for resource in grant.rule["resources"] for verb in grant.rule["verbs"] if resource not in optional}
    assert sorted(granted - rows) == []
    assert sorted(rows - granted) == []
    for path in (CHART / "README.md", REPO / "docs" / "operator.md", CHART / "templates" / "rbac.yaml"):
        text = " ".join(path.read_text().split())
        assert "adds no power" not in text and "gives nothing" not in text, path


def test_aggregated_roles_for_users(helm_template: Render) -> None:
    roles = {r["metadata"]["name"]: r for r in by_kind(helm_template({}), "ClusterRole")}
    edit, view = roles["kco-kafka-cleaner-operator-edit"], roles["kco-kafka-cleaner-operator-view"]
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert set(view["rules"][0]["verbs"]) == {"get", "list", "watch"}
    assert "kco-kafka-cleaner-operator-edit" not in {r["metadata"]["name"] for r in
                                                     by_kind(helm_template({"rbac": {"aggregateToDefaultRoles":
                                                                                     False}}), "ClusterRole")}


# -------------------------------------------------------------------------------------------
# The webhook configuration
# -------------------------------------------------------------------------------------------


def test_the_webhook_configuration_reaches_the_handler(helm_template: Render) -> None:
    objects = helm_template({"webhook": {"enabled": True, "objectSelector": {"strimzi.io/kind": "Kafka"}},
                             "watchNamespaces": ["kafka"]})
    [config] = by_kind(objects, "MutatingWebhookConfiguration")
    [hook] = config["webhooks"]
    assert hook["clientConfig"]["service"] == {"name": "kco-kafka-cleaner-operator", "namespace": "default",
                                               "port": 443, "path": f"/{WEBHOOK_ID}"}
    [service] = by_kind(objects, "Service")
    assert {"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"} in service["spec"]["ports"]
    assert hook["failurePolicy"] == "Ignore" and hook["timeoutSeconds"] == 5
    assert hook["rules"][0]["operations"] == ["CREATE"] and hook["rules"][0]["resources"] == ["pods"]
    # Helm merges maps: the default opt-in label stays unless set to null.
    assert hook["objectSelector"] == {"matchExpressions": [
        {"key": "kafkacleaner.io/inject", "operator": "In", "values": ["enabled"]},
        {"key": "strimzi.io/kind", "operator": "In", "values": ["Kafka"]}]}
    [default] = by_kind(helm_template({"webhook": {"enabled": True}}), "MutatingWebhookConfiguration")
    assert default["webhooks"][0]["objectSelector"] == {"matchExpressions": [
        {"key": "kafkacleaner.io/inject", "operator": "In", "values": ["enabled"]}]}  # opt-in by default
    assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == ["kafka"]
    [secret] = by_kind(objects, "Secret")
    assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    assert base64.b64decode(secret["data"]["tls.crt"]).startswith(b"-----BEGIN CERTIFICATE-----")
    [deployment] = by_kind(objects, "Deployment")
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert {"name": "webhook-tls", "secret": {"secretName": secret["metadata"]["name"]}} in volumes


def test_kubernetes_older_than_1_28_is_refused_by_name() -> None:
    """The CRD's CEL rules use fieldPath (Kubernetes 1.28)."""
    refused = helm("template", "x", str(CHART), "--kube-version", "1.27.9", check=False)
    assert refused.returncode != 0 and ">=1.28.0-0" in refused.stderr, refused.stderr
    helm("template", "x", str(CHART), "--kube-version", "1.28.0")


def test_cert_manager_renders_the_same_every_time(tmp_path: pathlib.Path) -> None:
    """GitOps (Argo CD renders with helm template, where lookup finds nothing): Helm's own
    certificate is a new CA at every render, so the app would never be in sync; with
    cert-manager two renders are identical."""
    def render(values: dict[str, Any]) -> str:
        path = tmp_path / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        return helm("template", "x", str(CHART), "-f", str(path)).stdout

    helm_generated = {"webhook": {"enabled": True}}
    assert render(helm_generated) != render(helm_generated)
    for values in ({"webhook": {"enabled": True, "certManager": {"enabled": True}}},
                   {"webhook": {"enabled": True, "certManager": {"enabled": True, "issuerRef": {
                       "name": "internal-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}}}},
                   VARIANTS["webhook-existing-secret"]):
        assert render(values) == render(values), values


def test_cert_manager_injects_the_ca(helm_template: Render) -> None:
    objects = helm_template({"webhook": {"enabled": True, "certManager": {"enabled": True}}})
    [config] = by_kind(objects, "MutatingWebhookConfiguration")
    assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == \
        "default/kco-kafka-cleaner-operator-webhook"
    [certificate] = by_kind(objects, "Certificate")
    assert "kco-kafka-cleaner-operator.default.svc" in certificate["spec"]["dnsNames"]
    assert by_kind(objects, "Issuer") and not by_kind(objects, "Secret")
    assert "caBundle" not in config["webhooks"][0]["clientConfig"]  # cert-manager's CA injector owns it
    [deployment] = by_kind(objects, "Deployment")
    assert {"name": "webhook-tls", "secret": {"secretName": certificate["spec"]["secretName"]}} in \
        deployment["spec"]["template"]["spec"]["volumes"]
    issuer = {"name": "internal-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    objects = helm_template({"webhook": {"enabled": True, "certManager": {"enabled": True, "issuerRef": issuer}}})
    [certificate] = by_kind(objects, "Certificate")
    assert certificate["spec"]["issuerRef"] == issuer and not by_kind(objects, "Issuer")


# -------------------------------------------------------------------------------------------
# High availability
# -------------------------------------------------------------------------------------------


def test_several_replicas_get_a_disruption_budget(helm_template: Render) -> None:
    objects = helm_template(ALL_ON)
    [budget] = by_kind(objects, "PodDisruptionBudget")
    [deployment] = by_kind(objects, "Deployment")
    assert budget["spec"]["selector"] == deployment["spec"]["selector"]
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"  # a crash loop never blocks a drain
    # One replica: a budget could only block node drains. Or turned off.
    assert not by_kind(helm_template({}), "PodDisruptionBudget")
    assert not by_kind(helm_template({**ALL_ON, "podDisruptionBudget": {"enabled": False}}), "PodDisruptionBudget")
    [percent] = by_kind(helm_template({**ALL_ON, "podDisruptionBudget": {"maxUnavailable": "50%"}}),
                        "PodDisruptionBudget")
    assert percent["spec"]["maxUnavailable"] == "50%"


def test_resource_names_do_not_repeat_the_release(helm_template: Render) -> None:
    """The README installs the release ``kafka-cleaner``: its objects are ``kafka-cleaner-operator``
    (not ``kafka-cleaner-kafka-cleaner-operator``); another release name still prefixes them."""
    for release, name in (("kafka-cleaner", "kafka-cleaner-operator"),
                          ("kafka-cleaner-operator", "kafka-cleaner-operator"),
                          ("kco", "kco-kafka-cleaner-operator")):
        [deployment] = by_kind(helm_template({}, release=release), "Deployment")
        assert deployment["metadata"]["name"] == name, release


def _documented_installs() -> list[tuple[str, str]]:
    """(document, block) for every shell block of the docs that runs ``helm install``."""
    out = []
    for doc in (REPO / "README.md", CHART / "README.md"):
        fences = re.split(r"^ *```.*$", doc.read_text(), flags=re.M)
        for block in fences[1::2]:  # between an opening fence and its closing one
            if "helm install" in block:
                out.append((doc.relative_to(REPO).as_posix(), block.replace("\\\n", " ")))
    return out


@pytest.mark.parametrize(("doc", "block"), _documented_installs(), ids=lambda v: v if v.endswith(".md") else "")
def test_the_documented_install_reconciles_what_it_applies_next(doc: str, block: str, helm_template: Render,
                                                                rbac: SimpleNamespace) -> None:
    """A reader who copies a documented ``helm install`` and the ``kubectl apply`` after it gets
    an operator that reconciles that policy (its namespace watched, the Role there) with the image
    the block built and named (issue 27: the README walkthrough, done again as a new user would)."""
    lines = [shlex.split(line.split(" #")[0]) for line in block.splitlines() if line.strip()]
    [install] = [w[w.index("helm"):] for w in lines if "helm" in w and w[w.index("helm") + 1] == "install"]
    release, chart = install[2], install[3]
    assert (REPO / chart).resolve() == CHART
    namespace = install[install.index("--namespace") + 1]
    sets = [install[i + 1] for i, word in enumerate(install) if word == "--set"]
    extra = [arg for s in sets for arg in ("--set", s)]
    objects = helm_template({}, namespace=namespace, release=release, extra_args=extra)
    config = OperatorConfig.from_env(deployment_env(objects))
    for words in lines:
        image = next((w.split("=", 1)[1] for w in words if w.startswith("IMAGE=")), None)
        if image is not None:  # make image IMAGE=...: the sidecar and the operator run what was built
            assert config.sidecar_image == image, (doc, config.sidecar_image)
    applied = [w[w.index("-f") + 1] for w in lines if w[:2] == ["kubectl", "apply"]]
    assert applied, f"{doc}: a helm install with no policy applied after it"
    grants = granted(rbac, objects)
    for path in applied:
        policy = yaml.safe_load((REPO / path).read_text())
        where = policy["metadata"]["namespace"]
        assert not config.namespaces or where in config.namespaces, (
            f"{doc}: the install watches {list(config.namespaces)}; {path} is in namespace {where!r}")
        assert (where, "apps", "statefulsets", "patch", "*any*") in grants or (
            ("cluster", "apps", "statefulsets", "patch", "*any*") in grants), (doc, path)
    for words in lines:
        if words[:2] == ["kubectl", "wait"]:
            assert words[words.index("-n") + 1] in {yaml.safe_load((REPO / p).read_text())["metadata"]["namespace"]
                                                    for p in applied}


def test_the_chart_readme_network_policy_lets_in_what_it_names(helm_template: Render) -> None:
    """The README's networkPolicy block lets in the broker namespaces and pods and the
    Prometheus peers it names (issue 27 item 2: every YAML block of the docs is run)."""
    text = (CHART / "README.md").read_text()
    [block] = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "networkPolicy:" in b]
    values = yaml.safe_load(block)
    objects = helm_template(values)
    [policy] = [o for o in objects if o["kind"] == "NetworkPolicy"]
    network = values["networkPolicy"]
    assert policy["metadata"]["namespace"] == "kafka" and network["brokerNamespaces"] == ["kafka"]
    assert policy["spec"]["podSelector"] == network["brokerPodSelector"]  # the broker pods, nothing else
    peers = [peer for rule in policy["spec"]["ingress"] for peer in rule.get("from", [])]
    assert network["prometheusPeers"][0] in peers, peers
    operator = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "default"}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "kafka-cleaner-operator",
                                                "app.kubernetes.io/instance": "kco"}}}
    assert operator in peers, peers
    assert {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]} == {9410}


def test_two_operators_never_run_side_by_side(helm_template: Render) -> None:
    """Without leader election nothing stops two operators acting at once, so an upgrade must
    not overlap the old pod and the new one (a RollingUpdate would); with a Lease the new pod
    waits as a follower, and a rolling update keeps the webhook served."""
    [alone] = by_kind(helm_template({}), "Deployment")
    assert alone["spec"]["strategy"] == {"type": "Recreate"}
    [elected] = by_kind(helm_template(ALL_ON), "Deployment")
    assert "strategy" not in elected["spec"]  # Kubernetes' default RollingUpdate


# -------------------------------------------------------------------------------------------
# Monitoring
# -------------------------------------------------------------------------------------------


def test_the_grafana_dashboard(helm_template: Render) -> None:
    [configmap] = [o for o in by_kind(helm_template(ALL_ON), "ConfigMap") if o["metadata"]["name"].endswith(
        "-dashboard")]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(configmap["data"]["kafka-cleaner.json"])
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    for metric in ("kafka_cleaner_max_dirty_ratio", "kafka_cleaner_uncleanable_partitions",
                   "kafka_cleaner_cleaner_thread_deaths_total", "kafka_cleaner_time_since_last_run_seconds",
                   "kafka_cleaner_operator_stale_brokers"):
        assert any(metric in e for e in exprs), metric
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


def test_monitors_and_network_policy(helm_template: Render) -> None:
    objects = helm_template(ALL_ON)
    [service_monitor] = by_kind(objects, "ServiceMonitor")
    [endpoint] = service_monitor["spec"]["endpoints"]
    # The operator's series carry the policy's namespace: kept, not renamed exported_namespace.
    assert endpoint["port"] == "http-metrics" and endpoint["honorLabels"] is True
    [pod_monitor] = by_kind(objects, "PodMonitor")
    [pod_endpoint] = pod_monitor["spec"]["podMetricsEndpoints"]
    assert pod_endpoint["port"] == "cleaner-metrics" and pod_endpoint["honorLabels"] is False
    assert pod_monitor["spec"]["namespaceSelector"] == {"matchNames": ["default"]}  # the watched namespace
    assert by_kind(helm_template({**ALL_ON, "watchAllNamespaces": True}), "PodMonitor")[0]["spec"][
        "namespaceSelector"] == {"any": True}
    [policy] = by_kind(objects, "NetworkPolicy")
    assert policy["metadata"]["namespace"] == "kafka"
    assert policy["spec"]["podSelector"] == {"matchLabels": {"strimzi.io/kind": "Kafka"}}
    operator_rule, prometheus_rule = policy["spec"]["ingress"]
    assert operator_rule["ports"] == prometheus_rule["ports"] == [{"protocol": "TCP", "port": 9410}]
    assert operator_rule["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == \
        "kafka-cleaner-operator"
    assert operator_rule["from"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "default"}
    assert prometheus_rule["from"] == ALL_ON["networkPolicy"]["prometheusPeers"]
    # Without peers only the operator is admitted.
    values = {**ALL_ON, "networkPolicy": {**ALL_ON["networkPolicy"], "prometheusPeers": []}}
    [alone] = by_kind(helm_template(values), "NetworkPolicy")
    assert len(alone["spec"]["ingress"]) == 1


@pytest.mark.parametrize("values", [
    {"webhook": {"enabled": True, "objectSelector": {"strimzi.io/kind": "Kafka"}, "timeoutSeconds": 3},
     "watchNamespaces": ["kafka", "kafka-b"]},
    {"webhook": {"enabled": True}},
])
def test_the_operators_own_webhook_configuration_is_the_charts(values: dict[str, Any], helm_template: Render) -> None:
    """With webhook.manageConfiguration the operator keeps the configuration: the very one the
    chart renders otherwise (failurePolicy, the <= 5 s timeout, the object and namespace
    selectors), not kopf's (30 s, no namespace selector)."""
    from compaction_operator.webhook import webhook_configuration

    [chart_config] = by_kind(helm_template(values), "MutatingWebhookConfiguration")
    [chart_hook] = chart_config["webhooks"]
    managed = {**values, "webhook": {**values["webhook"], "manageConfiguration": True}}
    objects = helm_template(managed)
    assert by_kind(objects, "MutatingWebhookConfiguration") == []
    config = OperatorConfig.from_env(deployment_env(objects))
    config = dataclasses.replace(config, namespace="default")  # POD_NAMESPACE, from the downward API
    # What kopf's server announces: the Service without the handler's path, and the CA.
    announced = {"service": {**chart_hook["clientConfig"]["service"], "path": ""},
                 "caBundle": chart_hook["clientConfig"]["caBundle"]}
    ours = webhook_configuration(config, announced)
    assert ours["metadata"]["name"] == config.webhook_configuration
    assert ours["webhooks"] == [chart_hook]
    assert chart_hook["timeoutSeconds"] <= 5
