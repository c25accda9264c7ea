"""Issue 20, item 9: the operator's hold on a StatefulSet that a GitOps tool also applies.

Neither Argo CD nor Flux runs here; what they send the API server does. Argo CD syncs with a
client-side ``kubectl apply`` (a three-way merge against ``last-applied-configuration``) unless
told ``ServerSideApply=true``; Flux's kustomize-controller applies server-side under the field
manager ``kustomize-controller`` and forces conflicts. Both are replayed with the real
``kubectl`` against the real API server, over a StatefulSet the real operator has injected and
held (``rollout.strategy: Manual``, ``updateStrategy.rollingUpdate.partition = replicas``):

* a manifest that does not name the partition (as Kafka charts write ``updateStrategy``) keeps
  the hold and the sidecar under both;
* a manifest that names ``partition: 0`` releases the hold under both: the case for Argo CD's
  ``ignoreDifferences`` with ``RespectIgnoreDifferences=true`` (which sends the live value of an
  ignored field instead of Git's, replayed here) and Flux's ``spec.ignore`` (Kustomization) /
  ``driftDetection.ignore`` (gitops/README.md).
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import pytest
import yaml
from compaction_operator.injection import find_sidecar
from compaction_operator.rollout import HELD_BY_ANNOTATION
from control_plane import ControlPlane, activated_kubeconfig, available, missing_reason
from operator_helpers import (
    ApiCluster,
    broker_statefulset,
    policy,
    running_operator,
    sts_target,
    wait_for,
)
from ports import free_port

pytestmark = [
    pytest.mark.skipif(not available(), reason=missing_reason()),
    pytest.mark.xdist_group("control-plane"),
]

TIMEOUT = 90.0
NS = "gitops"
#: kopf cancels a policy's report daemon when the operator stops while the policy lives on.
STOPPED_WITH_A_POLICY = ("Daemon 'report' is cancelled",)


@pytest.fixture
def cluster(control_plane: ControlPlane, install_chart: Callable[..., pathlib.Path]) -> Iterator[ApiCluster]:
    kubeconfig = install_chart()
    control_plane.kubectl("create", "namespace", NS, check=False)
    try:
        with activated_kubeconfig(kubeconfig):
            yield ApiCluster(kubernetes.config.new_client_from_config(config_file=str(control_plane.kubeconfig)), NS)
    finally:
        control_plane.kubectl(
            "delete", "compactionpolicies", "--all", "-n", NS, "--wait=true", f"--timeout={int(TIMEOUT)}s", check=False
        )
        control_plane.kubectl("delete", "namespace", NS, "--wait=false", check=False)


def _git_manifest(partition: int | None = None) -> dict[str, Any]:
    """The broker StatefulSet as it is in Git: ``updateStrategy`` as a Kafka chart writes it."""
    sts = broker_statefulset("broker")
    sts["metadata"]["namespace"] = NS
    strategy: dict[str, Any] = {"type": "RollingUpdate"}
    if partition is not None:
        strategy["rollingUpdate"] = {"partition": partition}
    sts["spec"]["updateStrategy"] = strategy
    return sts


def _apply(plane: ControlPlane, manifest: dict[str, Any], *args: str) -> dict[str, Any]:
    path = plane.root / "gitops-object.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return json.loads(plane.kubectl("apply", *args, "-o", "json", "-f", str(path)).stdout)


def argo_cd_sync(plane: ControlPlane, manifest: dict[str, Any], *args: str) -> dict[str, Any]:
    """Argo CD's default sync: a client-side apply."""
    return _apply(plane, manifest, *args)


def flux_apply(plane: ControlPlane, manifest: dict[str, Any], *args: str) -> dict[str, Any]:
    """kustomize-controller's apply: server-side, its own field manager, conflicts forced."""
    return _apply(plane, manifest, "--server-side", "--field-manager=kustomize-controller", "--force-conflicts", *args)


def _held(sts: dict[str, Any]) -> bool:
    partition = ((sts["spec"].get("updateStrategy") or {}).get("rollingUpdate") or {}).get("partition")
    return (
        partition == sts["spec"]["replicas"]
        and HELD_BY_ANNOTATION in sts["metadata"].get("annotations", {})
        and find_sidecar(sts["spec"]["template"]["spec"]) is not None
    )


def test_a_gitops_apply_keeps_the_manual_hold_unless_git_names_the_partition(
    control_plane: ControlPlane, cluster: ApiCluster
) -> None:
    plane = control_plane
    argo_cd_sync(plane, _git_manifest())
    with running_operator(expected_warnings=STOPPED_WITH_A_POLICY):
        _apply(plane, {**policy("held", target=sts_target("broker")), "metadata": {"name": "held", "namespace": NS}})
        wait_for(
            lambda: _held(cluster.sts("broker")), timeout=TIMEOUT, what="the sidecar injected and the StatefulSet held"
        )

        # The hold is the operator's own field manager's, none kustomize-controller takes over
        # (its cleanup list: kubectl, before-first-apply, its own pre-SSA updates).
        owners = {
            m["manager"]
            for m in cluster.sts("broker")["metadata"]["managedFields"]
            if '"f:partition"' in json.dumps(m.get("fieldsV1", {}))
        }
        assert owners and not owners & {"kubectl", "before-first-apply", "kustomize-controller"}, owners

        # Git without a partition: neither tool touches the hold or the sidecar.
        for gitops_apply in (argo_cd_sync, flux_apply):
            assert _held(gitops_apply(plane, _git_manifest())), gitops_apply.__name__
            assert _held(cluster.sts("broker")), gitops_apply.__name__

        # Git naming partition 0 would release the hold, under either tool (the API server's
        # answer to a server-side dry run of the same apply).
        for gitops_apply in (argo_cd_sync, flux_apply):
            released = gitops_apply(plane, _git_manifest(partition=0), "--dry-run=server")
            assert released["spec"]["updateStrategy"]["rollingUpdate"]["partition"] == 0, gitops_apply.__name__
            assert find_sidecar(released["spec"]["template"]["spec"]) is not None

        # RespectIgnoreDifferences (Argo CD) / an ignore rule (Flux) on /spec/updateStrategy:
        # the live value is sent instead of Git's, and the hold stays.
        respected = _git_manifest(partition=0)
        respected["spec"]["updateStrategy"] = cluster.sts("broker")["spec"]["updateStrategy"]
        for gitops_apply in (argo_cd_sync, flux_apply):
            assert _held(gitops_apply(plane, respected)), gitops_apply.__name__
            assert _held(cluster.sts("broker")), gitops_apply.__name__
        plane.kubectl("delete", "-n", NS, "compactionpolicy", "held", "--wait=true", f"--timeout={int(TIMEOUT)}s")


# -------------------------------------------------------------------------------------------
# KubeStatefulSetUpdateNotRolledOut under a hold: the alert and the inhibit rule of
# gitops/README.md, under the real promtool and a real Alertmanager (Debian's packages)
# -------------------------------------------------------------------------------------------

README = pathlib.Path(__file__).resolve().parents[2] / "gitops" / "README.md"
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


def _readme_yaml(marker: str) -> Any:
    """The README's yaml block holding ``marker``, parsed: the test runs what the docs say."""
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(), re.S)
    [block] = [b for b in blocks if marker in b]
    return yaml.safe_load(block)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package prometheus)")
def test_the_held_alert_fires_on_kube_state_metrics_annotation(tmp_path: pathlib.Path) -> None:
    [rule] = _readme_yaml("alert: KafkaCleanerStatefulSetHeld")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "held", "rules": [rule]}]}))
    series = 'kube_statefulset_annotations{namespace="kafka",statefulset="%s",annotation_kafkacleaner_io_held_by="%s"}'
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": series % ("broker", "kafka/offsets"), "values": "1x5"},
                    {"series": series % ("zookeeper", ""), "values": "1x5"},
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "2m",
                        "alertname": "KafkaCleanerStatefulSetHeld",
                        "exp_alerts": [
                            {
                                "exp_labels": {"namespace": "kafka", "statefulset": "broker", "severity": "none"},
                                "exp_annotations": {
                                    "summary": rule["annotations"]["summary"]
                                    .replace("{{ $labels.namespace }}", "kafka")
                                    .replace("{{ $labels.statefulset }}", "broker")
                                },
                            }
                        ],
                    }
                ],
            }
        ],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test))
    proc = subprocess.run(
        ["promtool", "test", "rules", "test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.skipif(ALERTMANAGER is None, reason="alertmanager not installed (Debian package prometheus-alertmanager)")
def test_the_inhibit_rule_silences_only_the_held_statefulsets_alert(tmp_path: pathlib.Path) -> None:
    """A real Alertmanager with the README's inhibit rule: KubeStatefulSetUpdateNotRolledOut of
    the held StatefulSet is inhibited while KafkaCleanerStatefulSetHeld fires for it; the same
    alert of another StatefulSet, or of the same name in another namespace, is not."""
    config = {
        "route": {"receiver": "null"},
        "receivers": [{"name": "null"}],
        "inhibit_rules": _readme_yaml("inhibit_rules:")["inhibit_rules"],
    }
    (tmp_path / "alertmanager.yaml").write_text(yaml.safe_dump(config))
    checked = subprocess.run(
        ["amtool", "check-config", str(tmp_path / "alertmanager.yaml")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    port = free_port()
    url = f"http://127.0.0.1:{port}/api/v2/alerts"
    with subprocess.Popen(
        [
            str(ALERTMANAGER),
            f"--config.file={tmp_path / 'alertmanager.yaml'}",
            f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ) as alertmanager:
        try:

            def post(alerts: list[dict[str, str]]) -> bool:
                body = json.dumps([{"labels": labels} for labels in alerts]).encode()
                request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(request, timeout=5) as response:
                        return response.status == 200
                except OSError:  # not listening yet
                    return False

            not_rolled = "KubeStatefulSetUpdateNotRolledOut"
            wait_for(
                lambda: post(
                    [
                        {
                            "alertname": "KafkaCleanerStatefulSetHeld",
                            "namespace": "kafka",
                            "statefulset": "broker",
                            "severity": "none",
                        },
                        {"alertname": not_rolled, "namespace": "kafka", "statefulset": "broker", "severity": "warning"},
                        {
                            "alertname": not_rolled,
                            "namespace": "kafka",
                            "statefulset": "zookeeper",
                            "severity": "warning",
                        },
                        {
                            "alertname": not_rolled,
                            "namespace": "kafka-b",
                            "statefulset": "broker",
                            "severity": "warning",
                        },
                    ]
                ),
                timeout=30,
                interval=0.2,
                what="Alertmanager taking alerts",
            )

            def states() -> dict[tuple[str, str, str], str] | None:
                with urllib.request.urlopen(url, timeout=5) as response:
                    alerts = json.loads(response.read())
                out = {
                    (a["labels"]["alertname"], a["labels"]["namespace"], a["labels"]["statefulset"]): a["status"][
                        "state"
                    ]
                    for a in alerts
                }
                return out if len(out) == 4 else None

            expected = {
                ("KafkaCleanerStatefulSetHeld", "kafka", "broker"): "active",
                (not_rolled, "kafka", "broker"): "suppressed",
                (not_rolled, "kafka", "zookeeper"): "active",
                (not_rolled, "kafka-b", "broker"): "active",
            }
            # Alertmanager's inhibitor learns of the source alert on its own, after the alerts are
            # listed: a target can show "active" for a moment first (a fresh-clone run saw it).
            wait_for(lambda: states() == expected, timeout=30, interval=0.2,
                     what=f"the four alerts as {expected}")  # fmt: skip
            assert states() == expected  # and it stays so
        finally:
            alertmanager.terminate()
            alertmanager.wait(timeout=30)
