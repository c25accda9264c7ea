"""Fixtures of the Kubernetes tests: the real control plane (``control_plane.py``), once per
session, with the CRD installed; the chart installed on it with a token of its ServiceAccount
(``install_chart``); the chart rendered by the real helm (``helm_template``); and the rules
the rendered chart binds to the operator's ServiceAccount (``rbac``), for the static checks of
test_chart.py (the real authorizer judges the calls in the end-to-end tests).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import pathlib
import subprocess
import tempfile
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import kubernetes
import pytest
import yaml
from control_plane import CHART_ACCOUNT, CHART_NAMESPACE, CHART_RELEASE, ControlPlane, running
from kubernetes.client.exceptions import ApiException
from operator_helpers import G, P, V, wait_for


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The real control plane (``control_plane.py``), once per session (per xdist worker: the
    tests that use it share the ``control-plane`` xdist group), with the CRD installed."""
    with running(tmp_path_factory.mktemp("control-plane")) as plane:
        crd = pathlib.Path(__file__).resolve().parents[2] / "crds" / "compactionpolicy.yaml"
        plane.kubectl("apply", "--server-side", "-f", str(crd))
        # kubectl wait fails at once on a CRD without status conditions yet (the API server
        # writes them once it has compiled the CEL rules, later under load): wait for them first.
        wait_for(lambda: json.loads(plane.kubectl("get", "crd", "compactionpolicies.kafkacleaner.io", "-o", "json")
                                    .stdout).get("status", {}).get("conditions"),
                 timeout=60, what="the CRD's status conditions")  # fmt: skip
        plane.kubectl("wait", "--for=condition=Established", "crd/compactionpolicies.kafkacleaner.io", "--timeout=60s")
        yield plane




@pytest.fixture(autouse=True)
def no_abandoned_policy_outlives_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test on the control plane, release the policies no operator will ever finish:
    those being deleted and those in a namespace being deleted, once the test's operators have
    stopped (this fixture is torn down after the test's own). The operator's finalizer would
    hold them, and their namespace, in Terminating; the next test's operator then handles
    their deletion, and its log's retried Event posts into a terminating namespace fail that
    test too: one failed test failed two more in a fresh-clone CI run. A test that passes
    deletes its policies while its operator runs, and leaves nothing for this to do."""
    yield
    if "control_plane" not in request.fixturenames:
        return
    plane: ControlPlane = request.getfixturevalue("control_plane")
    with kubernetes.config.new_client_from_config(config_file=str(plane.kubeconfig)) as api:
        core, custom = kubernetes.client.CoreV1Api(api), kubernetes.client.CustomObjectsApi(api)
        terminating = {ns.metadata.name for ns in core.list_namespace().items if ns.metadata.deletion_timestamp}
        for policy in custom.list_cluster_custom_object(G, V, P)["items"]:
            meta = policy["metadata"]
            if not (meta.get("deletionTimestamp") or meta["namespace"] in terminating):
                continue
            # Live ones too: the next operator would put its finalizer back on a policy the
            # namespace controller has not deleted yet.
            with contextlib.suppress(ApiException):
                custom.patch_namespaced_custom_object(G, V, meta["namespace"], P, meta["name"],
                                                      {"metadata": {"finalizers": None}})
                custom.delete_namespaced_custom_object(G, V, meta["namespace"], P, meta["name"])


@pytest.fixture
def install_chart(control_plane: ControlPlane) -> Callable[..., pathlib.Path]:
    """``install_chart("key=value", ...)``: ``helm upgrade --install`` of the chart with those
    values on the real control plane; returns a kubeconfig holding a token of the chart's
    ServiceAccount, issued by the API server (TokenRequest), so that whatever uses it is judged
    by the chart's RBAC."""
    plane = control_plane
    helm = pathlib.Path(__file__).resolve().parents[2] / ".tools" / "bin" / "helm"
    chart = pathlib.Path(__file__).resolve().parents[2] / "helm" / "kafka-cleaner-operator"
    if not helm.exists():
        pytest.skip(f"helm is not installed at {helm} (make setup installs it)")

    def install(*values: str) -> pathlib.Path:
        args = [str(helm), f"--kubeconfig={plane.kubeconfig}", "upgrade", "--install", CHART_RELEASE, str(chart),
                "-n", CHART_NAMESPACE, "--create-namespace", "--wait", "--timeout=120s"]
        if not any("watchNamespaces" in value or "watchAllNamespaces" in value for value in values):
            # The tests' operators act in namespaces of their own: the cluster-wide mode, unless
            # a test asks for the chart's default (the release namespace) or names its own.
            values = ("watchAllNamespaces=true", *values)
        args += [arg for value in values for arg in ("--set", value)]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        # Right after the CRD is created the API server answers 429 "storage is (re)initializing"
        # for a moment; kopf would log its retry as an error.
        wait_for(lambda: plane.kubectl("get", "compactionpolicies", "-A", check=False).returncode == 0,
                 timeout=90, what="the CompactionPolicy storage")
        token = plane.kubectl("create", "token", CHART_ACCOUNT, "-n", CHART_NAMESPACE, "--duration=3600s").stdout
        path = plane.root / "kubeconfig-chart"
        path.write_text(yaml.safe_dump(plane.kubeconfig_for(token.strip())))
        return path

    return install


REPO = pathlib.Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------
# RBAC: the rules the chart binds to the operator
# ---------------------------------------------------------------------------------------------

CHART = REPO / "helm" / "kafka-cleaner-operator"
HELM = REPO / ".tools" / "bin" / "helm"


def render_chart(values: Mapping[str, Any] | None = None, *, namespace: str = "default",
                 release: str = "kco", extra_args: Sequence[str] = ()) -> list[dict[str, Any]]:
    """``helm template`` of the chart (the real helm) with ``values``, as a list of objects
    (rendered once per process for the same arguments; callers get their own copies)."""
    if not HELM.exists():
        pytest.skip(f"helm is not installed at {HELM} (make setup installs it)")
    key = json.dumps([values or {}, namespace, release, list(extra_args)], sort_keys=True)
    if key not in _RENDERED:
        _RENDERED[key] = _helm_template(values, namespace, release, extra_args)
    return copy.deepcopy(_RENDERED[key])


_RENDERED: dict[str, list[dict[str, Any]]] = {}


def _helm_template(values: Mapping[str, Any] | None, namespace: str, release: str,
                   extra_args: Sequence[str]) -> list[dict[str, Any]]:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
        yaml.safe_dump(dict(values or {}), file)
        file.flush()
        args = [str(HELM), "template", release, str(CHART), "--namespace", namespace, "-f", file.name, *extra_args]
        result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise AssertionError(f"helm template failed: {result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@dataclasses.dataclass(frozen=True)
class Grant:
    """One PolicyRule, and where it applies (None: every namespace and the cluster scope)."""

    rule: Mapping[str, Any]
    namespace: str | None
    source: str


def operator_grants(objects: Sequence[Mapping[str, Any]]) -> list[Grant]:
    """The rules bound to the chart's operator ServiceAccount (through any binding)."""
    accounts = [(o["metadata"]["name"], o["metadata"].get("namespace")) for o in objects
                if o["kind"] == "ServiceAccount"]
    assert len(accounts) == 1, accounts
    roles = {(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")): o for o in objects
             if o["kind"] in ("Role", "ClusterRole")}
    grants = []
    for binding in (o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        subjects = {(s["name"], s.get("namespace")) for s in binding.get("subjects") or []
                    if s["kind"] == "ServiceAccount"}
        if accounts[0] not in subjects:
            continue
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        role = roles[(ref["kind"], ref["name"], namespace if ref["kind"] == "Role" else None)]
        grants += [Grant(rule, namespace, f"{role['kind']}/{role['metadata']['name']}")
                   for rule in role.get("rules") or []]
    return grants


@pytest.fixture
def helm_template() -> Callable[..., list[dict[str, Any]]]:
    """:func:`render_chart`: ``helm_template(values, namespace=..., extra_args=...)``."""
    return render_chart


@pytest.fixture
def rbac() -> types.SimpleNamespace:
    """The RBAC helpers: ``operator_grants(objects)``."""
    return types.SimpleNamespace(operator_grants=operator_grants)
