"""Issue 20, item 7: the chart's default RBAC is namespaced. Installed with its default values
(``watchNamespaces`` empty, ``watchAllNamespaces`` false) it binds Roles in the release
namespace only, and the operator, configured as the chart's Deployment configures it and run
with a token of the chart's ServiceAccount against the real API server (whose authorizer judges
every call), injects and reports there, leaves a policy in another namespace alone, says so in
its log at start, and logs no 403 (no warning or error at all: ``running_operator`` fails the
test on any).
"""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Callable
from typing import Any

import kubernetes
import pytest
import yaml
from compaction_operator.injection import find_sidecar
from compaction_operator.settings import OperatorConfig
from control_plane import (
    CHART_ACCOUNT,
    CHART_NAMESPACE,
    CHART_RELEASE,
    ControlPlane,
    activated_kubeconfig,
    available,
    missing_reason,
)
from operator_helpers import ApiCluster, broker_statefulset, policy, running_operator, sts_target, wait_for

pytestmark = [
    pytest.mark.skipif(not available(), reason=missing_reason()),
    pytest.mark.xdist_group("control-plane"),
]

TIMEOUT = 90.0
UNNAMED = "rbac-unnamed"
STOPPED_WITH_A_POLICY = ("Daemon 'report' is cancelled",)


def _apply(plane: ControlPlane, namespace: str, obj: dict[str, Any]) -> None:
    path = plane.root / "rbac-object.yaml"
    path.write_text(yaml.safe_dump(obj))
    plane.kubectl("apply", "-n", namespace, "-f", str(path))


def test_the_default_chart_acts_in_its_namespace_only(
    control_plane: ControlPlane, install_chart: Callable[..., pathlib.Path]
) -> None:
    plane = control_plane
    kubeconfig = install_chart("watchAllNamespaces=false")  # the chart's defaults
    deployment = json.loads(
        plane.kubectl(
            "get", "deployment", "-n", CHART_NAMESPACE, "-o", "json", f"{CHART_RELEASE}-kafka-cleaner-operator"
        ).stdout
    )
    env = {e["name"]: e.get("value", "") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    config = OperatorConfig.from_env({**env, "POD_NAMESPACE": CHART_NAMESPACE})
    assert config.namespaces == (CHART_NAMESPACE,)
    account = f"system:serviceaccount:{CHART_NAMESPACE}:{CHART_ACCOUNT}"
    for namespace, allowed in ((CHART_NAMESPACE, "yes"), (UNNAMED, "no")):
        for verb, resource in (("create", "pods"), ("patch", "statefulsets.apps"), ("list", "compactionpolicies")):
            answer = plane.kubectl(
                "auth", "can-i", verb, resource, "-n", namespace, f"--as={account}", check=False
            ).stdout.strip()
            assert answer == allowed, (namespace, verb, resource)

    plane.kubectl("create", "namespace", UNNAMED, check=False)
    admin = kubernetes.config.new_client_from_config(config_file=str(plane.kubeconfig))
    named, unnamed = ApiCluster(admin, CHART_NAMESPACE), ApiCluster(admin, UNNAMED)
    try:
        for namespace in (CHART_NAMESPACE, UNNAMED):
            _apply(plane, namespace, broker_statefulset("broker"))
            _apply(plane, namespace, policy("scoped", target=sts_target("broker"), reporting={"intervalSeconds": 1}))
        with (
            activated_kubeconfig(kubeconfig),
            running_operator(expected_warnings=STOPPED_WITH_A_POLICY, namespaces=config.namespaces) as runner,
        ):
            wait_for(
                lambda: find_sidecar(named.sts("broker")["spec"]["template"]["spec"]),
                timeout=TIMEOUT,
                what="the sidecar injected in the watched namespace",
            )
            wait_for(
                lambda: named.status("scoped").get("conditions"),
                timeout=TIMEOUT,
                what="the policy's status in the watched namespace",
            )
        assert find_sidecar(unnamed.sts("broker")["spec"]["template"]["spec"]) is None
        assert not unnamed.status("scoped"), unnamed.status("scoped")
        assert f"namespace(s) {CHART_NAMESPACE} only" in runner.output and "not acted on" in runner.output
        # A refused call is an HTTP 403 in urllib3's request lines, or kopf's "Forbidden" (a bare
        # "403" also matches a uid such as ...e9403c0de7a6: a fresh-clone run failed on that).
        refused = re.findall(r'HTTP/1\.1" 403 ', runner.output)
        assert not refused and "Forbidden" not in runner.output, refused
    finally:
        # No operator runs any more to release the watched policy's finalizer (a wait for its
        # deletion would last the whole timeout): drop it, as the other tests' fixture does.
        for namespace in (CHART_NAMESPACE, UNNAMED):
            plane.kubectl(
                "patch", "compactionpolicy", "scoped", "-n", namespace, "--type=merge",
                "-p", '{"metadata":{"finalizers":null}}', check=False,
            )  # fmt: skip
            plane.kubectl("delete", "compactionpolicy", "scoped", "-n", namespace, "--wait=false", check=False)
        plane.kubectl("delete", "statefulset", "broker", "-n", CHART_NAMESPACE, "--wait=false", check=False)
        plane.kubectl("delete", "namespace", UNNAMED, "--wait=false", check=False)
