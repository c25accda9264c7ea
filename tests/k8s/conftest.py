"""Fixtures for tests that need a Kubernetes API server: fakekube, served in-process.

``fakekube`` yields a ``RunningFakeKube`` (``.server`` is the FakeKube with its request log and
stored objects, ``.url``, ``.kubeconfig``) and points this process's kubeconfig readers at it, so
kopf run by ``kopf.testing.KopfRunner`` and ``kubernetes.client.*Api()`` reach it, calling as the
user ``fakekube``. ``kube_client`` is an ApiClient calling as ``test`` instead, so the test's own
calls can be told apart from the operator's in the request log.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import pathlib
import re
import subprocess
import tempfile
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import kubernetes
import pytest
import yaml
from control_plane import ControlPlane, running
from fakekube import FakeKube, RequestInfo, RunningFakeKube, running_fakekube
from operator_helpers import Cluster, wait_for


@pytest.fixture
def fakekube_version() -> str:
    """The version ``GET /version`` reports; override it per test with
    ``@pytest.mark.parametrize("fakekube_version", ["v1.28.9"])``."""
    return "v1.33.0"


@pytest.fixture
def fakekube(fakekube_version: str, tmp_path: pathlib.Path) -> Iterator[RunningFakeKube]:
    """A fresh emulator on a free loopback port, active as this process's cluster.

    Bookmarks come every second (instead of the real server's minute), so watch code paths that
    depend on them run within a test's time.
    """
    server = FakeKube(version=fakekube_version, bookmark_interval=1.0)
    with running_fakekube(server, kubeconfig=tmp_path / "kubeconfig") as kube:
        yield kube


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The real control plane (``control_plane.py``), once per session (per xdist worker: the
    tests that use it share the ``control-plane`` xdist group), with the CRD installed."""
    with running(tmp_path_factory.mktemp("control-plane")) as plane:
        crd = pathlib.Path(__file__).resolve().parents[2] / "crds" / "compactionpolicy.yaml"
        plane.kubectl("apply", "--server-side", "-f", str(crd))
        plane.kubectl("wait", "--for=condition=Established", "crd/compactionpolicies.kafkacleaner.io", "--timeout=60s")
        yield plane


CHART_RELEASE, CHART_NAMESPACE = "kc", "cleaner-operator"
CHART_ACCOUNT = "kc-kafka-cleaner-operator"  # the release's full name: ServiceAccount, Lease, ...


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


@pytest.fixture
def kube_client(fakekube: RunningFakeKube) -> Iterator[kubernetes.client.ApiClient]:
    """A kubernetes ApiClient calling the emulator as the user ``test``."""
    with fakekube.api_client("test") as client:
        yield client


# ---------------------------------------------------------------------------------------------
# The operator's fixtures
# ---------------------------------------------------------------------------------------------

REPO = pathlib.Path(__file__).resolve().parents[2]
CRD_PATH = REPO / "crds" / "compactionpolicy.yaml"


@pytest.fixture
def compactionpolicy_crd(fakekube: RunningFakeKube, kube_client: kubernetes.client.ApiClient) -> dict[str, Any]:
    """crds/compactionpolicy.yaml, registered in the emulator (returns the CRD)."""
    crd = yaml.safe_load(CRD_PATH.read_text())
    kubernetes.client.ApiextensionsV1Api(kube_client).create_custom_resource_definition(crd)
    return crd


@pytest.fixture
def cluster(fakekube: RunningFakeKube, kube_client: kubernetes.client.ApiClient,
            compactionpolicy_crd: dict[str, Any]) -> Cluster:
    """The test's view of the emulator with the CRD registered (calls as the user ``test``)."""
    return Cluster(fakekube, kube_client)


# ---------------------------------------------------------------------------------------------
# RBAC: the chart's rules against the calls an operator made
# ---------------------------------------------------------------------------------------------

CHART = REPO / "helm" / "kafka-cleaner-operator"
HELM = REPO / ".tools" / "bin" / "helm"
#: Non-resource paths every authenticated user may GET: the nonResourceURLs of the default
#: system:discovery and system:public-info-viewer ClusterRoles (/api, /api/*, /apis, /apis/*,
#: /openapi, /openapi/*, /version, /version/, /healthz, /livez, /readyz).
DISCOVERY_PATHS = re.compile(r"^/(api|apis|openapi)(/.*)?$|^/version/?$|^/(healthz|livez|readyz)$")


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


def _match(values: Sequence[str], value: str) -> bool:
    return "*" in values or value in values


def grant_allows(grant: Grant, info: RequestInfo) -> bool:
    rule = grant.rule
    if grant.namespace is not None and info.namespace != grant.namespace:
        return False
    resource = info.rbac_resource
    resources = rule.get("resources") or []
    if not (_match(rule.get("apiGroups") or [], info.group) and _match(rule.get("verbs") or [], info.verb)
            and (_match(resources, resource) or (info.subresource and f"*/{info.subresource}" in resources))):
        return False
    names = rule.get("resourceNames") or []
    return not names or (bool(info.name) and info.name in names and info.verb != "create")


@pytest.fixture
def helm_template() -> Callable[..., list[dict[str, Any]]]:
    """:func:`render_chart`: ``helm_template(values, namespace=..., extra_args=...)``."""
    return render_chart


@pytest.fixture
def rbac() -> types.SimpleNamespace:
    """The RBAC helpers: ``operator_grants(objects)`` and ``grant_allows(grant, request_info)``."""
    return types.SimpleNamespace(operator_grants=operator_grants, grant_allows=grant_allows)


@pytest.fixture
def assert_rbac_allows() -> Callable[..., None]:
    """``assert_rbac_allows(kube, values, user="fakekube")``: every call ``user`` made was
    allowed by the chart rendered with ``values`` (release namespace ``default``)."""

    def check(kube: RunningFakeKube, values: Mapping[str, Any] | None = None, *, user: str = "fakekube") -> None:
        grants = operator_grants(render_chart(values, namespace="default"))
        denied = set()
        for record in kube.server.request_log():
            if record.user != user:
                continue
            info = record.info
            if not info.is_resource_request:
                if not (info.verb == "get" and DISCOVERY_PATHS.match(info.path)):
                    denied.add(f"{record.method} {record.path} (non-resource)")
                continue
            if not any(grant_allows(g, info) for g in grants):
                denied.add(f"{info.verb} {info.group or 'core'}/{info.rbac_resource} "
                           f"ns={info.namespace or '-'} name={info.name or '-'}")
        assert not denied, "calls the chart's RBAC does not allow:\n" + "\n".join(sorted(denied))

    return check
