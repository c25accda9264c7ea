"""The sidecar and its patches (compaction_operator.injection), without a server: the JSON
patches are applied with the ``jsonpatch`` library (tests/k8s/test_real_*.py send the same
patches to a real API server)."""

from __future__ import annotations

import copy
import json
import pathlib
import sys
from typing import Any

import jsonpatch
import pytest
from compaction_operator import injection
from compaction_operator.injection import (
    POLICY_ANNOTATION,
    POLICY_VOLUME,
    PULL_SECRETS_ANNOTATION,
    SIDECAR_CONTAINER,
    SIDECAR_HASH_ANNOTATION,
    KubeVersion,
    build_sidecar,
    configmap_name,
    inject_into_pod,
    removal_patch,
    selector_matches,
    template_patch,
)
from operator_samples import make_policy

from cleaner.config import parse_policy_text

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "k8s"))

IMAGE = "registry.example/kafka-cleaner:0.1.0"


def broker_template(**extra_spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": "kafka"}, "annotations": {"prometheus.io/scrape": "true"}},
        "spec": {
            "initContainers": [{"name": "init-config", "image": "busybox", "command": ["true"]}],
            "containers": [
                {"name": "kafka", "image": "apache/kafka:4.0.0", "ports": [{"containerPort": 9092}],
                 "volumeMounts": [{"name": "data", "mountPath": "/var/lib/kafka"}]},
                {"name": "jmx-exporter", "image": "jmx:1", "ports": [{"containerPort": 9404}]},
            ],
            "volumes": [{"name": "config", "emptyDir": {}}],
            **extra_spec,
        },
    }


def sts(template: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "kafka", "resourceVersion": "7"}, "spec": {"template": template}}


def apply(template: dict[str, Any], patch: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The template after a JSON patch, applied by the ``jsonpatch`` library (the tests of
    tests/k8s/test_real_*.py send the same patches to a real API server)."""
    assert patch is not None
    return jsonpatch.apply_patch(sts(template), patch)["spec"]["template"]


# -------------------------------------------------------------------------------------------
# Version
# -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("info", "expected", "native"), [
    ({"major": "1", "minor": "29", "gitVersion": "v1.29.0"}, (1, 29), True),
    ({"major": "1", "minor": "28", "gitVersion": "v1.28.9"}, (1, 28), False),
    ({"major": "1", "minor": "29+", "gitVersion": "v1.29.3-eks-adc7111"}, (1, 29), True),
    ({"major": "1", "minor": "27+", "gitVersion": "v1.27.16-gke.1"}, (1, 27), False),
    ({"major": "", "minor": "", "gitVersion": "v1.31.2-eks-x"}, (1, 31), True),
    ({"gitVersion": "v1.28.3+k3s1"}, (1, 28), False),
    ({"major": "1", "minor": "33"}, (1, 33), True),
])
def test_version_parsing(info: dict[str, str], expected: tuple[int, int], native: bool) -> None:
    version = KubeVersion.from_version_info(info)
    assert (version.major, version.minor) == expected
    assert version.native_sidecars is native


def test_version_without_numbers_is_an_error() -> None:
    with pytest.raises(ValueError, match="cannot tell"):
        KubeVersion.from_version_info({"gitVersion": "unknown"})


# -------------------------------------------------------------------------------------------
# The sidecar
# -------------------------------------------------------------------------------------------


def test_sidecar_command_line_and_mounts() -> None:
    policy = make_policy(target={"statefulSet": "kafka", "dataVolume": "data-0", "mountPath": "/var/lib/kafka/data-0",
                                 "logDirs": ["kafka-log*", ".", "sub/dir/"]},
                         sidecar={"port": 9555})
    sidecar = build_sidecar(policy, image=IMAGE, native=True)
    c = sidecar.container
    assert c["name"] == SIDECAR_CONTAINER and c["image"] == IMAGE and c["command"] == ["kafka-cleaner"]
    assert c["args"] == ["sidecar", "--policy", "/etc/kafka-cleaner/policy.yaml",
                         "--log-dir", "/var/lib/kafka/data-0/kafka-log*",
                         "--log-dir", "/var/lib/kafka/data-0",
                         "--log-dir", "/var/lib/kafka/data-0/sub/dir",
                         "--listen", "0.0.0.0:9555", "--broker-name", "$(POD_NAME)"]
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}} \
        in c["env"]
    assert c["ports"] == [{"name": "cleaner-metrics", "containerPort": 9555, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert "readinessProbe" not in c  # the broker pod's readiness is the broker's
    assert c["startupProbe"]["httpGet"]["path"] == "/startupz"  # the start-up gate holds the broker
    assert c["volumeMounts"] == [
        {"name": POLICY_VOLUME, "mountPath": "/etc/kafka-cleaner", "readOnly": True},
        {"name": "data-0", "mountPath": "/var/lib/kafka/data-0", "readOnly": True},
        {"name": POLICY_VOLUME, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": True},
    ]
    assert c["restartPolicy"] == "Always" and sidecar.list_name == "initContainers"
    assert sidecar.volume == {"name": POLICY_VOLUME, "configMap": {
        "name": "offsets-kafka-cleaner", "optional": True, "items": [{"key": "policy.yaml", "path": "policy.yaml"}]}}
    assert c["resources"] == injection.DEFAULT_RESOURCES  # requests = limits: Guaranteed stays Guaranteed


def test_regular_container_below_1_29() -> None:
    sidecar = build_sidecar(make_policy(), image=IMAGE, native=False)
    assert "restartPolicy" not in sidecar.container and sidecar.list_name == "containers"


# -------------------------------------------------------------------------------------------
# The start-up gate (issue 20 item 2)
# -------------------------------------------------------------------------------------------


def _budget(container: dict[str, Any]) -> int:
    probe = container["startupProbe"]
    return int(probe["failureThreshold"]) * int(probe["periodSeconds"])


@pytest.mark.parametrize(("mode", "compact", "stage", "bound"), [
    ("observe", {}, {}, 0),
    ("compact", {}, {}, 60),
    ("compact", {"maxGateSeconds": 3600}, {"maxCommitSeconds": 5}, 3600),
    ("compact", {"maxGateSeconds": 0}, {"maxCommitSeconds": 900}, 900),  # stage is one ConfigMap edit away
    ("stage", {"maxGateSeconds": 10}, {"maxCommitSeconds": 600}, 600),
    ("stage", {}, {"maxCommitSeconds": 0}, 60),
])
def test_a_native_sidecar_holds_the_broker_until_its_gate_is_open_and_no_longer(
        mode: str, compact: dict[str, Any], stage: dict[str, Any], bound: int) -> None:
    """The README's start-up gate: the native sidecar's startupProbe asks /startupz, so the
    kubelet starts the broker container once the gate is open. Its budget exceeds twice the
    gate's own bound with a margin: the sidecar's bound, not the kubelet, opens the gate (a
    kubelet that gave up first would restart the sidecar mid-gate, and the gate would start
    over, the broker waiting for ever)."""
    target = {"statefulSet": "kafka", "dataVolume": "data", "mountPath": "/d", "logDirs": ["."],
              "injection": "statefulSet"}
    policy = make_policy(mode=mode, target=target, compact=compact, stage=stage)
    assert injection.gate_bound_seconds(policy) == bound
    c = build_sidecar(policy, image=IMAGE, native=True).container
    probe = c["startupProbe"]
    assert probe["httpGet"] == {"path": "/startupz", "port": "cleaner-metrics", "scheme": "HTTP"}
    assert probe["timeoutSeconds"] <= probe["periodSeconds"] and probe["successThreshold"] == 1
    assert _budget(c) >= 2 * bound + injection.STARTUP_MARGIN_SECONDS
    assert "--no-gate" not in c["args"]


def test_a_regular_container_runs_without_the_gate() -> None:
    """Nothing orders a regular container before the broker: ``--no-gate``, so the sidecar
    takes no .lock at start (the broker starting beside it would exit on it), and no
    startupProbe (it would hold nothing back)."""
    c = build_sidecar(make_policy(mode="compact"), image=IMAGE, native=False).container
    assert c["args"][-1] == "--no-gate" and "startupProbe" not in c


def test_no_gate_is_a_flag_the_sidecar_has() -> None:
    from click.testing import CliRunner

    from cleaner.sidecar.command import sidecar_command

    result = CliRunner().invoke(sidecar_command, ["--help"])
    assert "--no-gate" in result.output


def _node(name: str, version: str | None) -> dict[str, Any]:
    info = {"kubeletVersion": version} if version is not None else {}
    return {"metadata": {"name": name}, "status": {"nodeInfo": info}}


SERVER_1_34 = {"major": "1", "minor": "34", "gitVersion": "v1.34.2"}


@pytest.mark.parametrize(("nodes", "native", "named"), [
    ([_node("a", "v1.34.2"), _node("b", "v1.29.0-eks-5e0fdde")], True, "node b"),
    ([_node("a", "v1.34.2"), _node("old", "v1.28.15")], False, "node old"),  # the skew policy allows it
    ([_node("a", "v1.31.1+k3s1"), _node("gke", "v1.30.5-gke.1014001")], True, "node gke"),
    ([_node("a", "v1.34.2"), _node("odd", "kwok-v0.7.0")], False, "node odd"),
    ([_node("a", "v1.34.2"), _node("none", None)], False, "node none"),
    ([], True, "API server"),
])
def test_native_sidecars_are_decided_by_the_oldest_kubelet(nodes: list[dict[str, Any]], native: bool,
                                                           named: str) -> None:
    """Not the API server's version: a 1.28 kubelet runs an init container with
    restartPolicy Always as a plain init container, which never exits, and the broker never
    starts. A kubelet whose version cannot be read counts as too old."""
    version = KubeVersion.of_cluster(SERVER_1_34, nodes)
    assert version.native_sidecars is native
    assert named in str(version)


def test_nodes_that_cannot_be_listed_mean_a_regular_container() -> None:
    version = KubeVersion.of_cluster(SERVER_1_34, None, "403 Forbidden")
    assert not version.native_sidecars and "403 Forbidden" in str(version)
    assert not KubeVersion.of_cluster({"major": "1", "minor": "28"}, [_node("a", "v1.34.2")]).native_sidecars


@pytest.mark.parametrize(("mode", "max_commit", "grace", "warned"), [
    ("stage", 60, None, True),      # the default 30 s
    ("stage", 60, 119, True),
    ("stage", 60, 120, False),
    ("stage", 10, None, False),
    ("stage", 0, 5, False),         # never commits
    ("compact", 600, 30, False),    # no termination commit
])
def test_a_grace_period_too_short_for_the_termination_commit_is_warned(
        mode: str, max_commit: int, grace: int | None, warned: bool) -> None:
    target = {"statefulSet": "kafka", "dataVolume": "data", "mountPath": "/d", "logDirs": ["."],
              "injection": "statefulSet"}
    policy = make_policy(mode=mode, target=target, stage={"maxCommitSeconds": max_commit})
    spec = broker_template()["spec"]
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    message = injection.grace_period_warning(policy, spec)
    assert (message is not None) is warned
    if message is not None:
        assert "terminationGracePeriodSeconds" in message and str(2 * max_commit) in message


@pytest.mark.parametrize(("mode", "read_only"), [("observe", True), ("compact", False), ("stage", False)])
def test_data_mount_is_read_only_in_observe_mode(mode: str, read_only: bool) -> None:
    target = {"statefulSet": "kafka", "dataVolume": "data", "mountPath": "/d", "logDirs": ["x"],
              "injection": "statefulSet"}
    sidecar = build_sidecar(make_policy(mode=mode, target=target), image=IMAGE, native=True)
    assert sidecar.container["volumeMounts"][1] == {"name": "data", "mountPath": "/d", "readOnly": read_only}


def test_security_context_restricted_defaults_merged_with_the_policy() -> None:
    plain = build_sidecar(make_policy(), image=IMAGE, native=True).container["securityContext"]
    assert plain == injection.RESTRICTED_SECURITY_CONTEXT
    policy = make_policy(sidecar={"securityContext": {"runAsUser": 1001, "runAsGroup": 1001,
                                                      "capabilities": {"add": ["NET_BIND_SERVICE"]}}})
    merged = build_sidecar(policy, image=IMAGE, native=True).container["securityContext"]
    assert merged["runAsUser"] == 1001 and merged["runAsGroup"] == 1001
    assert merged["capabilities"] == {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}
    assert merged["readOnlyRootFilesystem"] is True and merged["seccompProfile"] == {"type": "RuntimeDefault"}


def test_resources_from_the_policy() -> None:
    policy = make_policy(sidecar={"resources": {"requests": {"cpu": "50m", "memory": "128Mi"},
                                                "limits": {"memory": 268435456}}})
    c = build_sidecar(policy, image=IMAGE, native=True).container
    assert c["resources"] == {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "268435456"}}
    # Never merged with the defaults (a default limit below a request would make an invalid pod).
    only = build_sidecar(make_policy(sidecar={"resources": {"limits": {"memory": "1Gi"}}}), image=IMAGE, native=True)
    assert only.container["resources"] == {"limits": {"memory": "1Gi"}}
    none = build_sidecar(make_policy(sidecar={"resources": {}}), image=IMAGE, native=True)
    assert "resources" not in none.container


def test_the_hash_follows_the_sidecar_not_the_rest_of_the_policy() -> None:
    base = build_sidecar(make_policy(), image=IMAGE, native=True)
    topics = build_sidecar(make_policy(generation=9, topics=[{"match": "x", "cleanupPolicy": "compact"}],
                                       reporting={"intervalSeconds": 5}), image=IMAGE, native=True)
    assert topics.hash == base.hash
    for other in (build_sidecar(make_policy(sidecar={"port": 9411}), image=IMAGE, native=True),
                  build_sidecar(make_policy(), image=IMAGE + "x", native=True),
                  build_sidecar(make_policy(), image=IMAGE, native=False),
                  build_sidecar(make_policy(mode="compact"), image=IMAGE, native=True)):
        assert other.hash != base.hash


def test_a_sidecar_needs_a_target() -> None:
    with pytest.raises(ValueError):
        build_sidecar(make_policy(target=None), image=IMAGE, native=True)


def test_configmap_names_stay_valid() -> None:
    assert configmap_name("offsets") == "offsets-kafka-cleaner"
    long = "a" * 250
    name = configmap_name(long)
    assert len(name) <= 253 and name.endswith("-kafka-cleaner") and name != configmap_name("a" * 249 + "b")


# -------------------------------------------------------------------------------------------
# Patching a StatefulSet's pod template
# -------------------------------------------------------------------------------------------


def _without_injection(template: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(template)
    spec = out["spec"]
    for key in ("initContainers", "containers"):
        if key in spec:
            spec[key] = [c for c in spec[key] if c["name"] != SIDECAR_CONTAINER]
    spec["volumes"] = [v for v in spec.get("volumes", []) if v["name"] != POLICY_VOLUME]
    for key in (SIDECAR_HASH_ANNOTATION, POLICY_ANNOTATION):
        out["metadata"]["annotations"].pop(key, None)
    return out


@pytest.mark.parametrize("native", [True, False])
def test_injection_adds_only_the_sidecar_and_removal_undoes_it_exactly(native: bool) -> None:
    template = broker_template()
    sidecar = build_sidecar(make_policy(), image=IMAGE, native=native)
    patch = template_patch(template, sidecar, "7")
    assert patch is not None and patch[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}
    # The patch names nothing of the broker's own.
    text = json.dumps(patch)
    assert "jmx-exporter" not in text and "apache/kafka" not in text and "init-config" not in text
    injected = apply(template, patch)
    assert json.dumps(injected["spec"]["containers"][:2]) == json.dumps(template["spec"]["containers"])
    listed = injected["spec"][sidecar.list_name]
    assert listed[-1] == sidecar.container
    assert injected["spec"]["volumes"] == [*template["spec"]["volumes"], sidecar.volume]
    assert injected["metadata"]["annotations"][SIDECAR_HASH_ANNOTATION] == sidecar.hash
    assert _without_injection(injected) == template
    # Idempotent: nothing to do the second time.
    assert template_patch(injected, sidecar) is None
    # And the removal restores the template byte for byte.
    with pytest.raises(jsonpatch.JsonPatchTestFailed):  # the StatefulSet changed since it was read
        apply(injected, removal_patch(injected, "6"))
    removed = apply(injected, removal_patch(injected, "7"))
    assert json.dumps(removed, sort_keys=True) == json.dumps(template, sort_keys=True)
    assert removal_patch(removed) is None


def test_removal_leaves_no_empty_lists_or_maps_behind() -> None:
    template = {"metadata": {"labels": {"app": "kafka"}},
                "spec": {"containers": [{"name": "kafka", "image": "k"}]}}
    for native in (True, False):
        sidecar = build_sidecar(make_policy(), image=IMAGE, native=native)
        injected = apply(template, template_patch(template, sidecar))
        patch = removal_patch(injected)
        assert patch is not None
        removed = {op["path"] for op in patch if op["op"] == "remove"}
        if native:
            assert "/spec/template/spec/initContainers" in removed
        assert {"/spec/template/spec/volumes", "/spec/template/metadata/annotations"} <= removed
        assert apply(injected, patch) == template


def test_a_changed_sidecar_replaces_the_old_one_whole() -> None:
    template = broker_template()
    old = build_sidecar(make_policy(sidecar={"resources": {"limits": {"memory": "1Gi"}}}), image=IMAGE, native=True)
    injected = apply(template, template_patch(template, old))
    new = build_sidecar(make_policy(sidecar={"port": 9500}), image=IMAGE, native=True)
    patch = template_patch(injected, new)
    assert patch is not None
    index = [c["name"] for c in injected["spec"]["initContainers"]].index(SIDECAR_CONTAINER)
    path = f"/spec/template/spec/initContainers/{index}"
    assert {"op": "test", "path": f"{path}/name", "value": SIDECAR_CONTAINER} in patch
    assert {"op": "replace", "path": path, "value": new.container} in patch  # the entry whole, not the list
    updated = apply(injected, patch)
    assert updated["spec"]["initContainers"][:index] == template["spec"]["initContainers"]
    sidecars = [c for c in updated["spec"]["initContainers"] if c["name"] == SIDECAR_CONTAINER]
    assert sidecars == [new.container]  # no lingering resources from the old one
    assert updated["spec"]["containers"] == template["spec"]["containers"]
    assert _without_injection(updated) == template


def test_upgrading_to_native_sidecars_moves_the_container() -> None:
    template = broker_template()
    regular = build_sidecar(make_policy(), image=IMAGE, native=False)
    injected = apply(template, template_patch(template, regular))
    native = build_sidecar(make_policy(), image=IMAGE, native=True)
    moved = apply(injected, template_patch(injected, native))
    assert [c["name"] for c in moved["spec"]["containers"]] == ["kafka", "jmx-exporter"]
    assert [c["name"] for c in moved["spec"]["initContainers"]] == ["init-config", SIDECAR_CONTAINER]
    assert _without_injection(moved) == template


# -------------------------------------------------------------------------------------------
# Pods at admission, selectors
# -------------------------------------------------------------------------------------------


def test_inject_into_pod() -> None:
    pod = {"metadata": {"name": "kafka-0", "labels": {"app": "kafka"}},
           "spec": copy.deepcopy(broker_template()["spec"])}
    sidecar = build_sidecar(make_policy(), image=IMAGE, native=True)
    injected = inject_into_pod(pod, sidecar)
    assert injected["spec"]["initContainers"][-1] == sidecar.container
    assert injected["spec"]["containers"] == pod["spec"]["containers"]
    assert injected["metadata"]["annotations"] == sidecar.annotations
    assert pod["metadata"].get("annotations") is None  # the input is not modified
    assert inject_into_pod(injected, sidecar) == injected  # a pod with the sidecar keeps it as it is


def test_pull_secrets_are_merged_without_duplicates_and_only_the_added_ones_removed() -> None:
    template = broker_template(imagePullSecrets=[{"name": "broker-pull"}])
    wanted = make_policy(sidecar={"imagePullSecrets": ["broker-pull", "cleaner-pull"]})
    sidecar = build_sidecar(wanted, image=IMAGE, native=True)
    assert sidecar.hash != build_sidecar(make_policy(), image=IMAGE, native=True).hash
    injected = apply(template, template_patch(template, sidecar, "7"))
    assert injected["spec"]["imagePullSecrets"] == [{"name": "broker-pull"}, {"name": "cleaner-pull"}]
    assert injected["metadata"]["annotations"][PULL_SECRETS_ANNOTATION] == "cleaner-pull"
    assert template_patch(injected, sidecar, "7") is None
    # Another secret instead: the one the operator added goes, the broker's own stays.
    other = build_sidecar(make_policy(sidecar={"imagePullSecrets": ["other-pull"]}), image=IMAGE, native=True)
    changed = apply(injected, template_patch(injected, other, "7"))
    assert changed["spec"]["imagePullSecrets"] == [{"name": "broker-pull"}, {"name": "other-pull"}]
    assert changed["metadata"]["annotations"][PULL_SECRETS_ANNOTATION] == "other-pull"
    # None at all: no annotation left behind.
    plain = build_sidecar(make_policy(), image=IMAGE, native=True)
    dropped = apply(changed, template_patch(changed, plain, "7"))
    assert dropped["spec"]["imagePullSecrets"] == [{"name": "broker-pull"}]
    assert PULL_SECRETS_ANNOTATION not in dropped["metadata"]["annotations"]
    # Removal restores the template exactly, the broker's own secret included.
    assert apply(changed, removal_patch(changed, "7")) == template
    bare = broker_template()
    assert apply(apply(bare, template_patch(bare, sidecar, "7")), removal_patch(
        apply(bare, template_patch(bare, sidecar, "7")), "7")) == bare
    # The webhook's pod gets the missing ones too.
    pod = {"metadata": {"name": "kafka-0"}, "spec": copy.deepcopy(template["spec"])}
    assert inject_into_pod(pod, sidecar)["spec"]["imagePullSecrets"] == [{"name": "broker-pull"},
                                                                         {"name": "cleaner-pull"}]


@pytest.mark.parametrize("native", [True, False])
def test_patched_applies_the_patches_as_jsonpatch_does(native: bool) -> None:
    """The operator's own applier (for the admission dry run) against the ``jsonpatch`` library."""
    sidecar = build_sidecar(make_policy(sidecar={"imagePullSecrets": ["cleaner-pull"]}), image=IMAGE, native=native)
    for template in (broker_template(), broker_template(imagePullSecrets=[{"name": "x"}]),
                     {"metadata": {}, "spec": {"containers": [{"name": "kafka", "image": "k"}]}}):
        patch = template_patch(template, sidecar, "7")
        assert injection.patched(sts(template), patch) == jsonpatch.apply_patch(sts(template), patch)
        injected = apply(template, patch)
        removal = removal_patch(injected, "7")
        assert injection.patched(sts(injected), removal) == jsonpatch.apply_patch(sts(injected), removal)
    with pytest.raises(ValueError, match="test failed"):
        injection.patched(sts(broker_template()), template_patch(broker_template(), sidecar, "8"))


def test_the_dry_run_pod_is_the_one_the_statefulset_controller_would_create() -> None:
    template = broker_template()
    stateful_set = {"metadata": {"name": "kafka", "namespace": "brokers"}, "spec": {
        "template": template, "volumeClaimTemplates": [{"metadata": {"name": "data"}}]}}
    pod = injection.pod_from_template(stateful_set)
    assert pod["metadata"] == {**template["metadata"], "generateName": "kafka-", "namespace": "brokers"}
    assert pod["spec"]["volumes"] == [*template["spec"]["volumes"],
                                      {"name": "data", "persistentVolumeClaim": {"claimName": "data-kafka-0"}}]
    assert pod["spec"]["containers"] == template["spec"]["containers"]
    assert "volumes" not in template["spec"] or len(template["spec"]["volumes"]) == 1  # the input is not modified


#: (selector, labels, whether they match); tests/k8s/test_real_control_plane.py asks the real
#: API server the same of ``label_selector_string(selector)``.
SELECTOR_CASES = [
    ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
    ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "2"}, True),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"a": "1"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
    ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": ""}, False),
    ({"matchLabels": {"strimzi.io/kind": "Kafka"},
      "matchExpressions": [{"key": "strimzi.io/broker-role", "operator": "In", "values": ["true"]}]},
     {"strimzi.io/kind": "Kafka", "strimzi.io/broker-role": "true"}, True),
]


@pytest.mark.parametrize(("selector", "labels", "expected"), SELECTOR_CASES)
def test_selectors_match_as_the_api_server_does(selector: dict[str, Any], labels: dict[str, str],
                                                expected: bool) -> None:
    assert selector_matches(selector, labels) is expected


def test_policy_file_round_trip(tmp_path: pathlib.Path) -> None:
    from compaction_operator.handlers import policy_file
    policy = make_policy(topics=[{"match": "orders-.*", "cleanupPolicy": "compact,delete"}])
    text = policy_file(policy)
    loaded = parse_policy_text(text)
    assert loaded == policy and loaded.policy_generation == 3 and loaded.name == "offsets"


# -------------------------------------------------------------------------------------------
# The sidecar runs as the broker
# -------------------------------------------------------------------------------------------


def _sidecar_of(spec: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in spec["initContainers"] if c["name"] == SIDECAR_CONTAINER)


def test_the_sidecar_takes_the_brokers_uid_from_its_container_else_the_pod() -> None:
    """Strimzi and Bitnami run the broker as 1001, Confluent as 1000: compact and stage modes
    must write as that uid. The broker container's own securityContext wins over the pod's;
    nothing is hard-coded (no uid, none: what an SCC assigns applies to both containers)."""
    sidecar = build_sidecar(make_policy(mode="compact"), image=IMAGE, native=True)
    template = broker_template(securityContext={"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000})
    template["spec"]["containers"][0]["securityContext"] = {"runAsUser": 1001}
    context = _sidecar_of(apply(template, template_patch(template, sidecar, "7"))["spec"])["securityContext"]
    assert context["runAsUser"] == 1001 and context["runAsGroup"] == 1000 and context["runAsNonRoot"] is True
    assert "fsGroup" not in context  # pod-wide: the sidecar has it already

    # No uid anywhere: none is invented (restricted-v2 assigns one to the whole pod).
    plain = broker_template()
    context = _sidecar_of(apply(plain, template_patch(plain, sidecar, "7"))["spec"])["securityContext"]
    assert "runAsUser" not in context and "runAsGroup" not in context
    # Root is never copied (the restricted defaults say runAsNonRoot).
    root = broker_template(securityContext={"runAsUser": 0})
    assert "runAsUser" not in _sidecar_of(apply(root, template_patch(root, sidecar, "7"))["spec"])["securityContext"]

    # The webhook's pods get the same.
    pod = {"metadata": {"name": "kafka-0", "namespace": "kafka"},
           **broker_template(securityContext={"runAsUser": 1001})}
    assert _sidecar_of(inject_into_pod(pod, sidecar)["spec"])["securityContext"]["runAsUser"] == 1001


def test_the_policys_uid_wins_and_a_changed_broker_uid_is_followed() -> None:
    pinned = build_sidecar(make_policy(mode="compact", sidecar={"securityContext": {"runAsUser": 1234}}),
                           image=IMAGE, native=True)
    template = broker_template(securityContext={"runAsUser": 1001, "runAsGroup": 1001})
    context = _sidecar_of(apply(template, template_patch(template, pinned, "7"))["spec"])["securityContext"]
    assert context["runAsUser"] == 1234 and context["runAsGroup"] == 1001

    sidecar = build_sidecar(make_policy(mode="compact"), image=IMAGE, native=True)
    injected = apply(template, template_patch(template, sidecar, "7"))
    assert template_patch(injected, sidecar, "7") is None  # nothing changed: no patch, no roll
    injected["spec"]["securityContext"]["runAsUser"] = 1000  # the broker moved to another uid
    moved = apply(injected, template_patch(injected, sidecar, "7"))
    assert _sidecar_of(moved["spec"])["securityContext"]["runAsUser"] == 1000
    assert template_patch(moved, sidecar, "7") is None


# -------------------------------------------------------------------------------------------
# JBOD: every data volume of the broker
# -------------------------------------------------------------------------------------------


def test_a_jbod_broker_gets_every_data_volume_mounted_and_every_log_dir_passed() -> None:
    """Strimzi JBOD: volumes data-0 and data-1 at /var/lib/kafka/data-0 and -1, a log dir
    kafka-log<id> in each. The sidecar mounts both and is given the log dirs of both."""
    target = {"statefulSet": "kafka", "dataVolume": "data-0", "mountPath": "/var/lib/kafka/data-0",
              "logDirs": ["kafka-log*"],
              "additionalDataVolumes": [{"name": "data-1", "mountPath": "/var/lib/kafka/data-1"}]}
    policy = make_policy(mode="compact", target=target)
    sidecar = build_sidecar(policy, image=IMAGE, native=True)
    args = sidecar.container["args"]
    dirs = [args[i + 1] for i, a in enumerate(args) if a == "--log-dir"]
    assert dirs == ["/var/lib/kafka/data-0/kafka-log*", "/var/lib/kafka/data-1/kafka-log*"]
    mounts = {m["name"]: m for m in sidecar.container["volumeMounts"]}
    assert mounts["data-0"]["mountPath"] == "/var/lib/kafka/data-0" and mounts["data-0"]["readOnly"] is False
    assert mounts["data-1"]["mountPath"] == "/var/lib/kafka/data-1" and mounts["data-1"]["readOnly"] is False

    one_disk = broker_template(volumes=[{"name": "data-0", "emptyDir": {}}])
    assert injection.missing_data_volumes(policy, one_disk["spec"]) == ["data-1"]
    both = broker_template(volumes=[{"name": "data-0", "emptyDir": {}}, {"name": "data-1", "emptyDir": {}}])
    assert injection.missing_data_volumes(policy, both["spec"]) == []
    claims = [{"metadata": {"name": "data-0"}}, {"metadata": {"name": "data-1"}}]
    assert injection.missing_data_volumes(policy, broker_template()["spec"], claims) == []


# -------------------------------------------------------------------------------------------
# Pods the API server would refuse (issue 20 item 4)
# -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("target", "field"), [
    ({"mountPath": injection.POLICY_DIR}, "spec.target.mountPath"),
    ({"mountPath": injection.SERVICE_ACCOUNT_TOKEN_DIR}, "spec.target.mountPath"),
    ({"mountPath": "/var/run"}, "spec.target.mountPath"),                      # above the token dir
    ({"mountPath": "/etc/kafka-cleaner/data"}, "spec.target.mountPath"),        # inside a read-only mount
    ({"mountPath": "/opt/kafka-cleaner"}, "spec.target.mountPath"),             # hides the program
    ({"mountPath": "/var/lib/kafka/"}, "spec.target.mountPath"),                # a second spelling
    ({"dataVolume": POLICY_VOLUME}, "spec.target.dataVolume"),
    ({"additionalDataVolumes": [{"name": "d1", "mountPath": "/d1"}, {"name": "d2", "mountPath": "/d1"}]},
     "spec.target.additionalDataVolumes"),
    ({"additionalDataVolumes": [{"name": "d1", "mountPath": "/etc/kafka-cleaner"}]},
     "spec.target.additionalDataVolumes[0].mountPath"),
])
def test_a_policy_whose_sidecar_the_api_server_would_refuse_is_invalid(target: dict[str, Any], field: str) -> None:
    """Each of these made a pod the API server refuses (the same mount path twice in the
    sidecar, the policy volume replacing a data volume) or a sidecar that cannot start."""
    from cleaner.errors import PolicyError

    base = {"statefulSet": "kafka", "dataVolume": "data", "mountPath": "/var/lib/kafka", "logDirs": ["data"]}
    with pytest.raises(PolicyError) as error:
        make_policy(target={**base, **target})
    assert error.value.field == field


def test_mount_paths_of_the_sidecar_are_unique_for_every_valid_policy() -> None:
    target = {"statefulSet": "kafka", "dataVolume": "data", "mountPath": "/etc/kafka-cleaner-data",
              "logDirs": ["data"], "additionalDataVolumes": [{"name": "d1", "mountPath": "/var/lib/kafka/d1"}]}
    mounts = build_sidecar(make_policy(target=target), image=IMAGE, native=True).container["volumeMounts"]
    assert len({m["mountPath"] for m in mounts}) == len(mounts)


@pytest.mark.parametrize(("resources", "bad"), [
    ({"requests": {"cpu": "2"}, "limits": {"cpu": "1500m"}}, "spec.sidecar.resources.requests.cpu"),
    ({"requests": {"memory": "1Gi"}, "limits": {"memory": "1000Mi"}}, "spec.sidecar.resources.requests.memory"),
    ({"requests": {"memory": "1e9"}, "limits": {"memory": "953Mi"}}, "spec.sidecar.resources.requests.memory"),
    ({"requests": {"cpu": "1", "memory": "512Mi"}, "limits": {"cpu": "1000m", "memory": "0.5Gi"}}, None),
    ({"requests": {"cpu": 2}, "limits": {"memory": "1Gi"}}, None),  # no cpu limit: nothing to exceed
])
def test_requests_above_limits_are_invalid(resources: dict[str, Any], bad: str | None) -> None:
    from cleaner.errors import PolicyError

    if bad is None:
        make_policy(sidecar={"resources": resources})
        return
    with pytest.raises(PolicyError) as error:
        make_policy(sidecar={"resources": resources})
    assert error.value.field == bad and "above the limit" in error.value.message


def test_the_dry_run_body_is_the_admitted_pod_as_a_create() -> None:
    from compaction_operator.webhook import dry_run_body

    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "my-cluster-broker-0", "namespace": "kafka", "uid": "u", "resourceVersion": "1",
                        "creationTimestamp": "2026-01-01T00:00:00Z", "labels": {"a": "b"},
                        "ownerReferences": [{"kind": "StrimziPodSet", "name": "x", "blockOwnerDeletion": True}],
                        "managedFields": [{}]},
           "spec": {"containers": [{"name": "kafka"}]}, "status": {"phase": "Pending"}}
    body = dry_run_body(pod)
    assert body["metadata"] == {"namespace": "kafka", "labels": {"a": "b"}, "generateName": "my-cluster-broker-0-"}
    assert "status" not in body and body["spec"] == pod["spec"]
    assert pod["metadata"]["name"] == "my-cluster-broker-0"  # a copy


def test_the_webhook_reports_a_refused_injection_and_a_short_grace_period() -> None:
    from compaction_operator.webhook import warn_about_injection

    target = {"podSelector": {"matchLabels": {"app": "kafka"}}, "dataVolume": "data", "mountPath": "/d",
              "logDirs": ["."], "injection": "webhook"}
    stage = make_policy(mode="stage", target=target)
    pod = {"metadata": {"name": "b-0"}, "spec": {"terminationGracePeriodSeconds": 30}}
    [(reason, message)] = warn_about_injection(stage, pod, "limit is 512Mi")
    assert reason == "AdmissionRejected" and "not injected into pod b-0" in message and "512Mi" in message
    [(reason, message)] = warn_about_injection(stage, pod, None)
    assert reason == "TerminationGracePeriodTooShort"
    assert warn_about_injection(stage, {"metadata": {}, "spec": {"terminationGracePeriodSeconds": 300}}, None) == []
