"""Issue 20, item 7: what a policy author may choose. Whoever may edit a CompactionPolicy (the
chart aggregates that right to the built-in ``edit`` role) chooses the sidecar's image and
which of the broker pod's volumes it mounts; the sidecar then runs beside the broker, with
its data. The image is limited to repositories the installer allowed
(``KAFKA_CLEANER_ALLOWED_SIDECAR_IMAGES``, default: the chart's own sidecar image's), and the
volumes to data volumes (never a Secret, ConfigMap, projected token or hostPath).

Here the pure decisions and the settings; the webhook and the operator refusing them on the
real API server are in test_gate_and_admission.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from compaction_operator.injection import data_volume_refusals, image_refusal, image_repository, policy_refusals
from compaction_operator.settings import OperatorConfig, SettingsError

from cleaner.config import parse_policy

ALLOWED = ("ghcr.io/kafka-cleaner/kafka-cleaner",)


def _policy(data_volume: str = "data", *others: str) -> Any:
    target = {
        "statefulSet": "broker",
        "dataVolume": data_volume,
        "mountPath": "/var/lib/kafka",
        "logDirs": ["data"],
        "additionalDataVolumes": [{"name": name, "mountPath": f"/var/lib/kafka-{i}"} for i, name in enumerate(others)],
    }
    return parse_policy(
        {
            "apiVersion": "kafkacleaner.io/v1alpha1",
            "kind": "CompactionPolicy",
            "metadata": {"name": "p", "namespace": "kafka"},
            "spec": {"target": target},
        }
    )


POD_SPEC = {
    "containers": [{"name": "kafka", "image": "apache/kafka:4.1.0"}],
    "volumes": [
        {"name": "data", "emptyDir": {}},
        {"name": "disk-1", "persistentVolumeClaim": {"claimName": "disk-1"}},
        {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
        {"name": "creds", "secret": {"secretName": "broker-tls"}},
        {"name": "config", "configMap": {"name": "broker-config"}},
        {"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}},
        {"name": "host", "hostPath": {"path": "/"}},
        {"name": "store", "csi": {"driver": "secrets-store.csi.k8s.io"}},
    ],
}


@pytest.mark.parametrize(
    ("image", "allowed"),
    [
        ("ghcr.io/kafka-cleaner/kafka-cleaner:1.2.3", True),
        ("ghcr.io/kafka-cleaner/kafka-cleaner@sha256:" + "a" * 64, True),
        ("ghcr.io/kafka-cleaner/kafka-cleaner:1.2@sha256:" + "a" * 64, True),
        ("ghcr.io/kafka-cleaner/kafka-cleaner", True),
        ("ghcr.io/kafka-cleaner/kafka-cleaner-evil:1", False),
        ("ghcr.io/kafka-cleaner:1", False),
        ("docker.io/library/busybox:1.36", False),
        ("evil.example/ghcr.io/kafka-cleaner/kafka-cleaner:1", False),
    ],
)
def test_an_image_is_allowed_only_by_its_whole_repository(image: str, allowed: bool) -> None:
    refusal = image_refusal(image, ALLOWED)
    assert (refusal is None) is allowed
    if not allowed:
        assert refusal is not None and "spec.sidecar.image" in refusal and ALLOWED[0] in refusal


def test_an_image_repository_keeps_a_registry_port() -> None:
    assert image_repository("localhost:5000/kc:1") == "localhost:5000/kc"
    assert image_repository("localhost:5000/kc") == "localhost:5000/kc"


def test_the_allow_list_defaults_to_the_default_sidecar_images_repository() -> None:
    config = OperatorConfig.from_env({"KAFKA_CLEANER_SIDECAR_IMAGE": "ghcr.io/kafka-cleaner/kafka-cleaner:0.9"})
    assert config.sidecar_image_allowlist == ALLOWED
    config = OperatorConfig.from_env(
        {
            "KAFKA_CLEANER_SIDECAR_IMAGE": "ghcr.io/kafka-cleaner/kafka-cleaner:0.9",
            "KAFKA_CLEANER_ALLOWED_SIDECAR_IMAGES": " mirror.example/kc , ghcr.io/x/y,",
        }
    )
    assert config.sidecar_image_allowlist == ("mirror.example/kc", "ghcr.io/x/y")
    assert OperatorConfig.from_env({}).sidecar_image_allowlist == ()  # no default image: none allowed
    assert image_refusal("ghcr.io/x/y:1", ()) is not None


def test_an_allow_list_entry_with_a_tag_is_refused() -> None:
    with pytest.raises(SettingsError, match=r"KAFKA_CLEANER_ALLOWED_SIDECAR_IMAGES.*'ghcr\.io/x/y'"):
        OperatorConfig.from_env({"KAFKA_CLEANER_ALLOWED_SIDECAR_IMAGES": "ghcr.io/x/y:1"})


def test_data_volumes_are_claims_ephemeral_or_empty_dirs_only() -> None:
    assert data_volume_refusals(_policy("data", "disk-1", "scratch"), POD_SPEC) == []
    refusals = data_volume_refusals(_policy("creds", "config", "token", "host", "store"), POD_SPEC)
    assert [r.split(" is a ")[0] for r in refusals] == [
        "target.dataVolume 'creds'",
        "target.additionalDataVolumes[0].name 'config'",
        "target.additionalDataVolumes[1].name 'token'",
        "target.additionalDataVolumes[2].name 'host'",
        "target.additionalDataVolumes[3].name 'store'",
    ]
    assert [r.split(" is a ")[1].split(" ")[0] for r in refusals] == [
        "secret",
        "configMap",
        "projected",
        "hostPath",
        "csi",
    ]


def test_a_claim_template_wins_over_a_pod_volume_of_its_name() -> None:
    """The StatefulSet controller replaces a template volume named like a claim template."""
    spec = {"volumes": [{"name": "data", "secret": {"secretName": "s"}}]}
    assert data_volume_refusals(_policy("data"), spec, [{"metadata": {"name": "data"}}]) == []
    assert data_volume_refusals(_policy("data"), spec) != []


def test_a_missing_volume_is_not_a_refusal() -> None:
    """missing_data_volumes reports it (DataVolumeNotFound)."""
    assert data_volume_refusals(_policy("absent"), POD_SPEC) == []


def test_policy_refusals_name_both_the_image_and_the_volume() -> None:
    refusals = policy_refusals(_policy("host"), "evil.example/miner:1", POD_SPEC, (), ALLOWED)
    assert len(refusals) == 2 and "spec.sidecar.image" in refusals[0] and "hostPath" in refusals[1]
