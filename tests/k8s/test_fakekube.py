"""fakekube against the real kubernetes client (raw HTTP where the client cannot say it), and one
end-to-end run of the real kopf, so the operator's tests can trust the emulator's semantics."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import kopf
import kopf.testing
import kubernetes
import pytest
from fakekube import (
    FakeKube,
    RequestRecord,
    RunningFakeKube,
    ServerVersion,
    as_json_schema,
    prune_and_default,
    resolve_request,
    running_fakekube,
    schema_errors,
    strategic_merge_patch,
)
from kubernetes.client import (
    ApiextensionsV1Api,
    AppsV1Api,
    CoreV1Api,
    CustomObjectsApi,
    VersionApi,
)
from kubernetes.client.exceptions import ApiException

HERE = pathlib.Path(__file__).resolve().parent
G, V, P = "samples.fakekube.test", "v1", "widgets"
WIDGET_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{P}.{G}"},
    "spec": {
        "group": G,
        "scope": "Namespaced",
        "names": {"plural": P, "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
        "versions": [{
            "name": V, "served": True, "storage": True, "subresources": {"status": {}},
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                "spec": {
                    "type": "object",
                    "properties": {
                        "size": {"type": "integer", "minimum": 1, "default": 1},
                        "color": {"type": "string", "enum": ["red", "blue"]},
                        "min": {"type": "integer"},
                        "max": {"type": "integer"},
                    },
                    "x-kubernetes-validations": [{"rule": "self.min <= self.max", "message": "min > max"}],
                },
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            }}},
        }],
    },
}


def widget(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{G}/{V}", "kind": "Widget", "metadata": {"name": name}, "spec": spec}


def raw(kube: RunningFakeKube, method: str, path: str, body: Any = None,
        content_type: str = "application/json") -> tuple[int, Any]:
    """One HTTP call, for what the kubernetes client cannot express (or hides)."""
    data = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
    headers = {"Authorization": "Bearer raw", **({"Content-Type": content_type} if data is not None else {})}
    request = urllib.request.Request(kube.url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def watch_events(kube: RunningFakeKube, path: str) -> list[dict[str, Any]]:
    """All events of a raw watch (the path must set ``timeoutSeconds``)."""
    with urllib.request.urlopen(kube.url + path, timeout=10) as response:
        return [json.loads(line) for line in response if line.strip()]


def wait_for(predicate: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if result := predicate():
                return result
        except ApiException:
            pass
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s")


def watches_of(kube: RunningFakeKube) -> list[RequestRecord]:
    return [r for r in kube.server.request_log() if r.info.verb == "watch" and r.info.resource == P]


def api_error(call: Callable[[], Any]) -> ApiException:
    with pytest.raises(ApiException) as caught:
        call()
    return caught.value


@pytest.fixture
def widgets(kube_client: kubernetes.client.ApiClient) -> CustomObjectsApi:
    """The test-only Widget CRD, registered; a CustomObjectsApi to use it."""
    ApiextensionsV1Api(kube_client).create_custom_resource_definition(WIDGET_CRD)
    return CustomObjectsApi(kube_client)


def broker_statefulset() -> dict[str, Any]:
    """A broker StatefulSet as a Kafka operator would write it: two containers, a data volume."""
    kafka = {"name": "kafka", "image": "apache/kafka:4.0.0",
             "env": [{"name": "KAFKA_NODE_ID", "value": "0"}],
             "ports": [{"containerPort": 9092, "name": "client"}],
             "volumeMounts": [{"name": "data", "mountPath": "/var/lib/kafka"}]}
    exporter = {"name": "exporter", "image": "jmx-exporter:1", "ports": [{"containerPort": 5556}]}
    return {"metadata": {"name": "broker"}, "spec": {
        "serviceName": "broker", "selector": {"matchLabels": {"app": "broker"}},
        "template": {"metadata": {"labels": {"app": "broker"}}, "spec": {
            "containers": [kafka, exporter], "volumes": [{"name": "data", "emptyDir": {}}]}}}}


# ---------------------------------------------------------------------------------------------
# Discovery and version
# ---------------------------------------------------------------------------------------------


def test_discovery_lists_resources_and_status_subresources(
        fakekube: RunningFakeKube, kube_client: kubernetes.client.ApiClient, widgets: CustomObjectsApi) -> None:
    _, core = raw(fakekube, "GET", "/api/v1")
    by_name = {r["name"]: r for r in core["resources"]}
    assert {"list", "watch", "patch", "create", "delete"} <= set(by_name["pods"]["verbs"])
    assert by_name["pods/status"]["verbs"] == ["get", "patch", "update"]
    assert all("singularName" in r for r in core["resources"])  # kopf needs the key
    assert {r.name for r in CoreV1Api(kube_client).get_api_resources().resources} >= {"pods", "pods/status",
                                                                                        "events", "namespaces"}
    _, groups = raw(fakekube, "GET", "/apis")
    assert {"apps", "apiextensions.k8s.io", "admissionregistration.k8s.io", "coordination.k8s.io", G} <= {
        g["name"] for g in groups["groups"]}
    _, custom = raw(fakekube, "GET", f"/apis/{G}/{V}")
    assert [r["name"] for r in custom["resources"]] == ["widgets", "widgets/status"]
    assert custom["resources"][0] | {"verbs": None} == {
        "name": "widgets", "singularName": "widget", "namespaced": True, "kind": "Widget", "verbs": None,
        "shortNames": ["wd"], "categories": []}
    assert raw(fakekube, "GET", "/openapi/v2")[0] == 404


@pytest.mark.parametrize("fakekube_version", ["v1.28.4"])
def test_version_is_configurable(fakekube: RunningFakeKube, kube_client: kubernetes.client.ApiClient) -> None:
    code = VersionApi(kube_client).get_code()
    assert (code.major, code.minor, code.git_version) == ("1", "28", "v1.28.4")
    fakekube.server.version = ServerVersion("v1.29.3-eks-adc7111", "1", "29+")  # as EKS reports it
    assert VersionApi(kube_client).get_code().minor == "29+"


# ---------------------------------------------------------------------------------------------
# CRUD, no-ops, watch
# ---------------------------------------------------------------------------------------------


def test_crud_of_a_builtin_object(fakekube: RunningFakeKube, kube_client: kubernetes.client.ApiClient) -> None:
    core = CoreV1Api(kube_client)
    created = core.create_namespaced_config_map("default", {"metadata": {"name": "cfg"}, "data": {"a": "1"}})
    assert created.metadata.uid and created.metadata.creation_timestamp and created.metadata.namespace == "default"
    assert core.read_namespaced_config_map("cfg", "default").data == {"a": "1"}
    assert api_error(lambda: core.create_namespaced_config_map("default", {"metadata": {"name": "cfg"}})).status == 409

    created.data = {"a": "2"}
    replaced = core.replace_namespaced_config_map("cfg", "default", created)
    assert int(replaced.metadata.resource_version) > int(created.metadata.resource_version)
    created.data = {"a": "3"}  # still carries the old resourceVersion
    conflict = api_error(lambda: core.replace_namespaced_config_map("cfg", "default", created))
    assert (conflict.status, json.loads(conflict.body)["reason"]) == (409, "Conflict")

    generated = core.create_namespaced_config_map("default", {"metadata": {"generateName": "cfg-"}})
    assert re.fullmatch(r"cfg-[a-z0-9]{5}", generated.metadata.name)
    assert api_error(lambda: core.create_namespaced_config_map("nowhere", {"metadata": {"name": "x"}})).status == 404
    bad_label = {"metadata": {"name": "y", "labels": {"app": "x" * 64}}}
    assert api_error(lambda: core.create_namespaced_config_map("default", bad_label)).status == 422
    dry = raw(fakekube, "POST", "/api/v1/namespaces/default/configmaps?dryRun=All", {"metadata": {"name": "dry"}})
    assert dry[0] == 201 and fakekube.server.read("v1", "configmaps", "dry", "default") is None

    core.delete_namespaced_config_map("cfg", "default")
    assert api_error(lambda: core.read_namespaced_config_map("cfg", "default")).status == 404


def test_noop_write_keeps_resource_version_and_emits_no_event(
        fakekube: RunningFakeKube, kube_client: kubernetes.client.ApiClient) -> None:
    core = CoreV1Api(kube_client)
    cm = core.create_namespaced_config_map("default", {"metadata": {"name": "cfg"}, "data": {"a": "1"}})
    before = fakekube.server.resource_version
    again = core.patch_namespaced_config_map("cfg", "default", {"data": {"a": "1"}})
    assert again.metadata.resource_version == cm.metadata.resource_version
    assert fakekube.server.resource_version == before
    rv = cm.metadata.resource_version
    path = f"/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={rv}&timeoutSeconds=1"
    assert watch_events(fakekube, path) == []


def test_watch_replays_history_after_resource_version_then_bookmarks(
        kube_client: kubernetes.client.ApiClient) -> None:
    core = CoreV1Api(kube_client)
    first = core.create_namespaced_config_map("default", {"metadata": {"name": "a"}})
    core.create_namespaced_config_map("default", {"metadata": {"name": "b"}})
    core.patch_namespaced_config_map("a", "default", {"data": {"k": "v"}})
    stream = kubernetes.watch.Watch().stream(core.list_namespaced_config_map, "default", timeout_seconds=2,
                                             resource_version=first.metadata.resource_version,
                                             allow_watch_bookmarks=True)
    events = [(e["type"], e["raw_object"]["metadata"].get("name")) for e in stream]
    assert events[:2] == [("ADDED", "b"), ("MODIFIED", "a")]
    assert ("BOOKMARK", None) in events[2:]
    # Without a resourceVersion, a watch starts with the current objects.
    fresh = kubernetes.watch.Watch().stream(core.list_namespaced_config_map, "default", timeout_seconds=1)
    assert sorted((e["type"], e["object"].metadata.name) for e in fresh) == [("ADDED", "a"), ("ADDED", "b")]


def test_watch_from_trimmed_history_gets_410() -> None:
    with running_fakekube(FakeKube(history=3), activate=False) as kube:
        versions = [raw(kube, "POST", "/api/v1/namespaces/default/configmaps", {"metadata": {"name": f"c{i}"}})[1]
                    ["metadata"]["resourceVersion"] for i in range(5)]
        path = "/api/v1/namespaces/default/configmaps?watch=true&timeoutSeconds=1&resourceVersion="
        [error] = watch_events(kube, path + versions[0])
        assert error["type"] == "ERROR"
        assert (error["object"]["code"], error["object"]["reason"]) == (410, "Expired")
        assert [e["object"]["metadata"]["name"] for e in watch_events(kube, path + versions[3])] == ["c4"]
        with kube.api_client() as client:
            stream = kubernetes.watch.Watch().stream(CoreV1Api(client).list_namespaced_config_map, "default",
                                                     resource_version=versions[0], timeout_seconds=1)
            assert api_error(lambda: list(stream)).status == 410


def test_initial_events_end_with_an_annotated_bookmark(fakekube: RunningFakeKube) -> None:
    raw(fakekube, "POST", "/api/v1/namespaces/default/configmaps", {"metadata": {"name": "a"}})
    events = watch_events(fakekube, "/api/v1/namespaces/default/configmaps?watch=true&sendInitialEvents=true"
                          "&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1")
    assert [e["type"] for e in events[:2]] == ["ADDED", "BOOKMARK"]
    assert events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


def test_list_pagination_and_selectors(kube_client: kubernetes.client.ApiClient) -> None:
    core = CoreV1Api(kube_client)
    for name, labels in [("a", {"app": "kafka", "tier": "data"}), ("b", {"app": "kafka"}), ("c", {"app": "zk"})]:
        core.create_namespaced_config_map("default", {"metadata": {"name": name, "labels": labels}})

    def names(**kwargs: Any) -> list[str]:
        return [i.metadata.name for i in core.list_namespaced_config_map("default", **kwargs).items]

    assert names(label_selector="app=kafka") == ["a", "b"]
    assert names(label_selector="app!=kafka") == ["c"]
    assert names(label_selector="app in (zk, other)") == ["c"]
    assert names(label_selector="app notin (zk),tier") == ["a"]
    assert names(label_selector="!tier") == ["b", "c"]
    assert names(field_selector="metadata.name=b") == ["b"]
    assert names(field_selector="metadata.name!=b,metadata.namespace=default") == ["a", "c"]
    assert api_error(lambda: names(label_selector="app in kafka")).status == 400
    assert api_error(lambda: names(field_selector="data.x=1")).status == 400  # not a selectable field
    page = core.list_namespaced_config_map("default", limit=2)
    assert [i.metadata.name for i in page.items] == ["a", "b"] and page.metadata.remaining_item_count == 1
    assert names(limit=2, _continue=page.metadata._continue) == ["c"]


# ---------------------------------------------------------------------------------------------
# Patches
# ---------------------------------------------------------------------------------------------


def test_json_patch_with_a_failed_test_is_422(kube_client: kubernetes.client.ApiClient) -> None:
    core = CoreV1Api(kube_client)
    cm = core.create_namespaced_config_map("default", {"metadata": {"name": "cfg"}})
    rv = cm.metadata.resource_version
    add = {"op": "add", "path": "/metadata/finalizers", "value": ["example.com/hold"]}
    stale = [{"op": "test", "path": "/metadata/resourceVersion", "value": "1"}, add]
    assert api_error(lambda: core.patch_namespaced_config_map("cfg", "default", stale)).status == 422
    fresh = [{"op": "test", "path": "/metadata/resourceVersion", "value": rv}, add]
    assert core.patch_namespaced_config_map("cfg", "default", fresh).metadata.finalizers == ["example.com/hold"]


def test_strategic_merge_patch_adds_a_sidecar_and_keeps_the_broker_container(
        fakekube: RunningFakeKube, kube_client: kubernetes.client.ApiClient) -> None:
    apps = AppsV1Api(kube_client)
    apps.create_namespaced_stateful_set("default", broker_statefulset())
    before = fakekube.server.read("apps/v1", "statefulsets", "broker", "default")
    sidecar = {"name": "cleaner", "image": "kafka-cleaner:1", "ports": [{"containerPort": 9410}],
               "volumeMounts": [{"name": "data", "mountPath": "/var/lib/kafka", "readOnly": True}]}
    patch = {"spec": {"template": {"spec": {
        "initContainers": [sidecar | {"restartPolicy": "Always"}],
        "containers": [{"name": "exporter", "env": [{"name": "EXTRA", "value": "1"}]}],
        "volumes": [{"name": "policy", "configMap": {"name": "broker-policy"}}]}}}}
    patched = apps.patch_namespaced_stateful_set("broker", "default", patch)
    assert fakekube.server.request_log()[-1].content_type == "application/strategic-merge-patch+json"
    after = fakekube.server.read("apps/v1", "statefulsets", "broker", "default")
    pod, old_pod = after["spec"]["template"]["spec"], before["spec"]["template"]["spec"]
    assert pod["containers"][0] == old_pod["containers"][0]  # the broker, byte for byte
    assert pod["containers"][1] == old_pod["containers"][1] | {"env": [{"name": "EXTRA", "value": "1"}]}
    assert [c["name"] for c in pod["initContainers"]] == ["cleaner"]
    assert [v["name"] for v in pod["volumes"]] == ["data", "policy"]
    assert patched.metadata.generation == 2

    # Merging into the sidecar by name changes only what the patch names.
    image = {"spec": {"template": {"spec": {"initContainers": [{"name": "cleaner", "image": "kafka-cleaner:2"}]}}}}
    updated = apps.patch_namespaced_stateful_set("broker", "default", image).spec.template.spec.init_containers[0]
    assert (updated.image, updated.restart_policy, updated.ports[0].container_port) == ("kafka-cleaner:2", "Always",
                                                                                         9410)


def test_strategic_merge_patch_delete_directive_removes_only_the_named_items(
        fakekube: RunningFakeKube, kube_client: kubernetes.client.ApiClient) -> None:
    apps = AppsV1Api(kube_client)
    apps.create_namespaced_stateful_set("default", broker_statefulset())
    before = fakekube.server.read("apps/v1", "statefulsets", "broker", "default")["spec"]["template"]["spec"]
    delete = {"spec": {"template": {"spec": {"containers": [{"name": "exporter", "$patch": "delete"}],
                                             "volumes": [{"name": "absent", "$patch": "delete"}]}}}}
    apps.patch_namespaced_stateful_set("broker", "default", delete)
    after = fakekube.server.read("apps/v1", "statefulsets", "broker", "default")["spec"]["template"]["spec"]
    assert after["containers"] == before["containers"][:1]
    assert after["volumes"] == before["volumes"]


def test_strategic_merge_patch_merge_keys() -> None:
    service = {"spec": {"ports": [{"port": 80, "name": "http"}, {"port": 443, "name": "https"}]}}
    merged = strategic_merge_patch(service, {"spec": {"ports": [{"port": 443, "targetPort": 8443}]}})
    assert merged["spec"]["ports"][1] == {"port": 443, "name": "https", "targetPort": 8443}
    mounts = {"volumeMounts": [{"name": "a", "mountPath": "/a"}, {"name": "a", "mountPath": "/b"}]}
    merged = strategic_merge_patch(mounts, {"volumeMounts": [{"mountPath": "/b", "readOnly": True}]})
    assert merged["volumeMounts"][1] == {"name": "a", "mountPath": "/b", "readOnly": True}
    assert merged["volumeMounts"][0] == mounts["volumeMounts"][0]
    replace = {"volumeMounts": [{"$patch": "replace"}, {"name": "c", "mountPath": "/c"}]}
    replaced = strategic_merge_patch(mounts, replace)
    assert replaced["volumeMounts"] == [{"name": "c", "mountPath": "/c"}]
    assert strategic_merge_patch({"args": ["a", "b"]}, {"args": ["c"]}) == {"args": ["c"]}  # no key: replace


def test_unsupported_media_types_are_415(fakekube: RunningFakeKube, widgets: CustomObjectsApi) -> None:
    widgets.create_namespaced_custom_object(G, V, "default", P, widget("w"))
    path = f"/apis/{G}/{V}/namespaces/default/{P}/w"
    smp = raw(fakekube, "PATCH", path, {"spec": {"size": 2}}, "application/strategic-merge-patch+json")
    assert smp[0] == 415
    assert raw(fakekube, "PATCH", path, b"spec:\n  size: 2\n", "application/apply-patch+yaml")[0] == 415
    protobuf = raw(fakekube, "POST", "/api/v1/namespaces/default/configmaps", b"k8s\x00",
                   "application/vnd.kubernetes.protobuf")
    assert (protobuf[0], protobuf[1]["kind"], protobuf[1]["reason"]) == (415, "Status", "UnsupportedMediaType")
    assert raw(fakekube, "PATCH", path, {"spec": {"size": 2}}, "application/merge-patch+json")[0] == 200


# ---------------------------------------------------------------------------------------------
# Status, generation, finalizers
# ---------------------------------------------------------------------------------------------


def test_status_subresource_split_and_generation(widgets: CustomObjectsApi) -> None:
    created = widgets.create_namespaced_custom_object(G, V, "default", P, widget("w", size=2) | {"status": {"x": 1}})
    assert "status" not in created and created["metadata"]["generation"] == 1

    def patch(body: dict[str, Any], status: bool = False) -> dict[str, Any]:
        call = widgets.patch_namespaced_custom_object_status if status else widgets.patch_namespaced_custom_object
        return call(G, V, "default", P, "w", body)

    on_status = patch({"spec": {"size": 9}, "status": {"phase": "Ready"}}, status=True)
    assert (on_status["spec"]["size"], on_status["status"], on_status["metadata"]["generation"]) == (
        2, {"phase": "Ready"}, 1)
    on_main = patch({"spec": {"size": 3}, "status": {"phase": "Broken"}})
    assert (on_main["spec"]["size"], on_main["status"], on_main["metadata"]["generation"]) == (
        3, {"phase": "Ready"}, 2)
    labelled = patch({"metadata": {"labels": {"team": "data"}}})
    assert labelled["metadata"]["generation"] == 2


def test_pod_status_is_set_through_the_status_subresource(kube_client: kubernetes.client.ApiClient) -> None:
    core = CoreV1Api(kube_client)
    pod = core.create_namespaced_pod("default", {"metadata": {"name": "broker-0"},
                                                 "spec": {"containers": [{"name": "kafka", "image": "k"}]}})
    assert pod.status.phase == "Pending" and pod.status.pod_ip is None
    core.patch_namespaced_pod_status("broker-0", "default", {"status": {"podIP": "127.0.0.1", "phase": "Running"}})
    assert core.read_namespaced_pod("broker-0", "default").status.pod_ip == "127.0.0.1"
    running = core.list_namespaced_pod("default", field_selector="status.podIP=127.0.0.1").items
    assert [p.metadata.name for p in running] == ["broker-0"]


def test_finalizers_hold_deletion_until_removed(widgets: CustomObjectsApi) -> None:
    body = widget("w") | {"metadata": {"name": "w", "finalizers": ["example.com/hold"]}}
    created = widgets.create_namespaced_custom_object(G, V, "default", P, body)
    deleting = widgets.delete_namespaced_custom_object(G, V, "default", P, "w")
    assert deleting["metadata"]["deletionTimestamp"]
    assert deleting["metadata"]["generation"] == created["metadata"]["generation"] + 1
    late = {"metadata": {"finalizers": ["example.com/hold", "example.com/late"]}}
    assert api_error(lambda: widgets.patch_namespaced_custom_object(G, V, "default", P, "w", late)).status == 422

    stream = kubernetes.watch.Watch().stream(widgets.list_namespaced_custom_object, G, V, "default", P,
                                             resource_version=deleting["metadata"]["resourceVersion"],
                                             timeout_seconds=1)
    widgets.patch_namespaced_custom_object(G, V, "default", P, "w", {"metadata": {"finalizers": None}})
    assert [e["type"] for e in stream] == ["MODIFIED", "DELETED"]
    assert api_error(lambda: widgets.get_namespaced_custom_object(G, V, "default", P, "w")).status == 404


# ---------------------------------------------------------------------------------------------
# CRDs at runtime
# ---------------------------------------------------------------------------------------------


def test_crd_registration_prunes_defaults_and_validates(
        fakekube: RunningFakeKube, kube_client: kubernetes.client.ApiClient) -> None:
    crds = ApiextensionsV1Api(kube_client)
    crd = crds.create_custom_resource_definition(WIDGET_CRD)
    assert {c.type: c.status for c in crd.status.conditions} == {"NamesAccepted": "True", "Established": "True"}
    widgets = CustomObjectsApi(kube_client)
    created = widgets.create_namespaced_custom_object(G, V, "default", P, widget("w", colour="red"))
    assert created["spec"] == {"size": 1}  # the typo pruned, the default applied
    invalid = api_error(lambda: widgets.create_namespaced_custom_object(G, V, "default", P, widget("x", size=0)))
    assert invalid.status == 422 and "spec.size" in json.loads(invalid.body)["message"]
    assert api_error(lambda: widgets.create_namespaced_custom_object(
        G, V, "default", P, widget("y", color="green"))).status == 422
    # CEL rules are not evaluated: min > max is accepted here, unlike on a real cluster.
    widgets.create_namespaced_custom_object(G, V, "default", P, widget("z", min=5, max=1))

    crds.delete_custom_resource_definition(f"{P}.{G}")
    assert raw(fakekube, "GET", f"/apis/{G}/{V}")[0] == 404
    assert fakekube.server.objects(f"{G}/{V}", P) == []
    bad = WIDGET_CRD | {"metadata": {"name": "wrong.name"}}
    assert api_error(lambda: crds.create_custom_resource_definition(bad)).status == 422


def test_openapi_exclusive_bounds_are_draft_4_booleans() -> None:
    """OpenAPI 3.0 (so a CRD) says ``minimum: 0, exclusiveMinimum: true`` for "> 0"; JSON Schema
    draft 7 says ``exclusiveMinimum: 0``. A boolean handed to a draft-7 validator as is would
    read as the number 1 (or 0 for ``false``)."""
    schema = {"type": "object", "properties": {
        "ratio": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1, "default": 0.9},
        "rate": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "nullable": True},
        "below": {"type": "integer", "maximum": 10, "exclusiveMaximum": True},
        "closed": {"type": "integer", "minimum": 5, "exclusiveMinimum": False},
        # Property names that are also keywords stay property names.
        "exclusiveMinimum": {"type": "boolean"}, "default": {"type": "object", "properties": {
            "n": {"type": "number", "minimum": 2, "exclusiveMinimum": True}}}}}
    converted = as_json_schema(schema)["properties"]
    assert converted["ratio"] == {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 0.9}
    assert converted["closed"] == {"type": "integer", "minimum": 5}
    assert converted["exclusiveMinimum"] == {"type": "boolean"}
    assert converted["default"]["properties"]["n"] == {"type": "number", "exclusiveMinimum": 2}

    def errors(**value: Any) -> list[str]:
        return schema_errors(value, schema)

    assert errors(ratio=0.9, rate=None, below=9, closed=5, exclusiveMinimum=True, default={"n": 2.5}) == []
    assert errors(ratio=1) == [] and errors(rate=0.001) == []
    for bad in ({"ratio": 0}, {"ratio": -0.1}, {"ratio": 1.01}, {"rate": 0}, {"below": 10}, {"closed": 4},
                {"default": {"n": 2}}):
        [error] = errors(**bad)
        assert error.startswith(next(iter(bad))), error


def test_the_compaction_policy_crd_admits_valid_policies(
        compactionpolicy_crd: dict[str, Any], kube_client: kubernetes.client.ApiClient) -> None:
    """The project's CRD through the emulator: ``cleaner.dedupeBufferLoadFactor`` (> 0, <= 1,
    default 0.9) and ``maxIoBytesPerSecond`` (> 0 or null) as a real API server judges them."""
    policies = CustomObjectsApi(kube_client)
    g, v, p = "kafkacleaner.io", "v1alpha1", "compactionpolicies"

    def create(name: str, **cleaner: Any) -> dict[str, Any]:
        return policies.create_namespaced_custom_object(g, v, "default", p, {
            "apiVersion": f"{g}/{v}", "kind": "CompactionPolicy", "metadata": {"name": name},
            "spec": {"cleaner": cleaner}})

    assert create("defaults")["spec"]["cleaner"]["dedupeBufferLoadFactor"] == 0.9
    assert create("explicit", dedupeBufferLoadFactor=0.9)["spec"]["cleaner"]["dedupeBufferLoadFactor"] == 0.9
    assert create("full", dedupeBufferLoadFactor=1, maxIoBytesPerSecond=None)["spec"]["cleaner"][
        "dedupeBufferLoadFactor"] == 1
    assert create("throttled", maxIoBytesPerSecond=0.5)["spec"]["cleaner"]["maxIoBytesPerSecond"] == 0.5
    for name, cleaner, field in (("zero", {"dedupeBufferLoadFactor": 0}, "dedupeBufferLoadFactor"),
                                 ("over", {"dedupeBufferLoadFactor": 1.5}, "dedupeBufferLoadFactor"),
                                 ("unthrottled", {"maxIoBytesPerSecond": 0}, "maxIoBytesPerSecond")):
        error = api_error(lambda n=name, c=cleaner: create(n, **c))
        assert error.status == 422, error
        assert f"spec.cleaner.{field}" in json.loads(error.body)["message"]


def test_prune_and_default_follow_the_structural_rules() -> None:
    schema = {"type": "object", "properties": {
        "a": {"type": "string", "default": "x"},
        "b": {"type": "string", "nullable": True},
        "m": {"type": "object", "additionalProperties": {"type": "object", "properties": {"k": {"type": "integer"}}}},
        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        "closed": {"type": "object"}}}
    value = {"a": None, "b": None, "m": {"p": {"k": 1, "junk": 2}}, "free": {"any": 1}, "closed": {"x": 1}, "y": 1}
    assert prune_and_default(value, schema) == {"a": "x", "b": None, "m": {"p": {"k": 1}}, "free": {"any": 1},
                                                "closed": {}}


# ---------------------------------------------------------------------------------------------
# Other kinds, the request log, in-process and CLI use
# ---------------------------------------------------------------------------------------------


def test_webhook_configurations_and_leases_are_plain_objects(kube_client: kubernetes.client.ApiClient) -> None:
    admission = kubernetes.client.AdmissionregistrationV1Api(kube_client)
    hook = {"metadata": {"name": "cleaner.kafkacleaner.io"}, "webhooks": [{
        "name": "inject.kafkacleaner.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
        "clientConfig": {"url": "https://127.0.0.1:9443/inject"}}]}
    admission.create_mutating_webhook_configuration(hook)
    admission.patch_mutating_webhook_configuration("cleaner.kafkacleaner.io", {"metadata": {"labels": {"a": "b"}}})
    admission.create_validating_webhook_configuration(hook)
    assert admission.read_mutating_webhook_configuration("cleaner.kafkacleaner.io").metadata.labels == {"a": "b"}
    leases = kubernetes.client.CoordinationV1Api(kube_client)
    leases.create_namespaced_lease("default", {"metadata": {"name": "leader"}, "spec": {"holderIdentity": "me"}})
    assert leases.read_namespaced_lease("leader", "default").spec.holder_identity == "me"


@pytest.mark.parametrize(("method", "path", "query", "expected"), [
    ("GET", "/api/v1/namespaces/ns/pods", {}, ("list", "", "pods", "", "ns", "")),
    ("GET", "/api/v1/pods", {"watch": "true"}, ("watch", "", "pods", "", "", "")),
    ("GET", "/apis/apps/v1/namespaces/ns/statefulsets", {"fieldSelector": "metadata.name=b"},
     ("list", "apps", "statefulsets", "", "ns", "b")),
    ("PATCH", "/apis/g.io/v1/namespaces/ns/things/t/status", {}, ("patch", "g.io", "things", "status", "ns", "t")),
    ("GET", "/api/v1/namespaces/ns", {}, ("get", "", "namespaces", "", "ns", "ns")),
    ("PUT", "/api/v1/namespaces/ns/finalize", {}, ("update", "", "namespaces", "finalize", "ns", "ns")),
    ("DELETE", "/api/v1/namespaces/ns/configmaps", {}, ("deletecollection", "", "configmaps", "", "ns", "")),
    ("POST", "/api/v1/namespaces/ns/events", {}, ("create", "", "events", "", "ns", "")),
])
def test_request_info_follows_the_real_resolver(method: str, path: str, query: dict[str, str],
                                                expected: tuple[str, ...]) -> None:
    info = resolve_request(method, path, query)
    assert info.is_resource_request
    assert (info.verb, info.group, info.resource, info.subresource, info.namespace, info.name) == expected


def test_request_info_of_non_resource_paths() -> None:
    for path in ("/api", "/api/v1", "/apis", "/apis/apps", "/apis/apps/v1", "/version", "/healthz"):
        info = resolve_request("GET", path, {})
        assert (info.is_resource_request, info.verb, info.path) == (False, "get", path)


def test_request_log_records_each_call_with_its_rbac_attributes(
        fakekube: RunningFakeKube, kube_client: kubernetes.client.ApiClient, widgets: CustomObjectsApi) -> None:
    fakekube.server.clear_request_log()
    widgets.create_namespaced_custom_object(G, V, "default", P, widget("w"))
    widgets.patch_namespaced_custom_object_status(G, V, "default", P, "w", {"status": {"phase": "Ready"}})
    widgets.list_cluster_custom_object(G, V, P, label_selector="a=b")
    CoreV1Api(kube_client).delete_collection_namespaced_config_map("default")
    VersionApi(kube_client).get_code()
    log = fakekube.server.request_log()
    rows = [(r.method, r.user, r.info.verb, r.info.group, r.info.rbac_resource, r.info.namespace, r.status)
            for r in log]
    assert rows == [
        ("POST", "test", "create", G, "widgets", "default", 201),
        ("PATCH", "test", "patch", G, "widgets/status", "default", 200),
        ("GET", "test", "list", G, "widgets", "", 200),
        ("DELETE", "test", "deletecollection", "", "configmaps", "default", 200),
        ("GET", "test", "get", "", "", "", 200),
    ]
    assert log[1].content_type == "application/merge-patch+json"
    assert log[2].query == {"labelSelector": "a=b"}
    assert log[4].path.rstrip("/") == "/version" and not log[4].info.is_resource_request


def test_running_fakekube_activates_and_restores_the_kubeconfig(tmp_path: pathlib.Path) -> None:
    def locations() -> tuple[str | None, str]:
        return os.environ.get("KUBECONFIG"), kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION

    before = locations()
    with running_fakekube(kubeconfig=tmp_path / "kc") as kube:
        assert locations() == (str(tmp_path / "kc"), str(tmp_path / "kc"))
        assert [n.metadata.name for n in CoreV1Api().list_namespace().items] == ["default", "kube-system"]
        assert kube.server.request_log()[-1].user == "fakekube"
    assert locations() == before


def test_cli_mode_serves_a_kubeconfig(tmp_path: pathlib.Path) -> None:
    kubeconfig = tmp_path / "kc.yaml"
    server = subprocess.Popen([sys.executable, "-P", str(HERE / "fakekube.py"), "--port", "0", "--kubeconfig",
                               str(kubeconfig), "--kube-version", "v1.30.2"], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        assert "listening on http://127.0.0.1:" in server.stdout.readline()
        with kubernetes.config.new_client_from_config(str(kubeconfig)) as client:
            assert VersionApi(client).get_code().minor == "30"
            assert CoreV1Api(client).read_namespace("kube-system").status.phase == "Active"
    finally:
        server.terminate()
        server.wait(10)


# ---------------------------------------------------------------------------------------------
# The real kopf, end to end
# ---------------------------------------------------------------------------------------------


def test_kopf_operator_runs_end_to_end(fakekube: RunningFakeKube, kube_client: kubernetes.client.ApiClient) -> None:
    """kopf starts before the CRD exists (dynamic discovery), reconnects its watches every 2 s
    (resume by resourceVersion), handles the create exactly once, holds deletion with its
    finalizer until the delete handler ran, and every call it made is in the request log."""
    widgets, core = CustomObjectsApi(kube_client), CoreV1Api(kube_client)
    settings = kopf.OperatorSettings()
    settings.watching.server_timeout = 2
    args = ["run", "--standalone", "--all-namespaces", "--verbose", str(HERE / "sample_operator.py")]
    with kopf.testing.KopfRunner(args, timeout=30, settings=settings) as runner:
        ApiextensionsV1Api(kube_client).create_custom_resource_definition(WIDGET_CRD)
        wait_for(lambda: raw(fakekube, "GET", f"/apis/{G}/{V}")[0] == 200)
        widgets.create_namespaced_custom_object(G, V, "default", P, widget("w", size=3))
        ready = wait_for(lambda: (o := widgets.get_namespaced_custom_object(G, V, "default", P, "w"))
                         .get("status", {}).get("phase") == "Ready" and o)
        assert ready["status"]["create_fn"] == {"size": 3}
        assert ready["metadata"]["finalizers"] == ["kopf.zalando.org/KopfFinalizerMarker"]
        wait_for(lambda: len(watches_of(fakekube)) >= 3, timeout=10)  # reconnected twice, nothing re-handled
        widgets.delete_namespaced_custom_object(G, V, "default", P, "w")
        wait_for(lambda: not fakekube.server.objects(f"{G}/{V}", P))
        wait_for(lambda: {"Created", "Deleting"} <= {e.reason for e in core.list_namespaced_event("default").items})

    assert runner.exception is None and runner.exit_code == 0, runner.output
    assert runner.output.count("Handler 'create_fn' succeeded") == 1
    assert runner.output.count("Handler 'delete_fn' succeeded") == 1
    assert "Traceback" not in runner.output
    warnings = [line for line in runner.output.splitlines() if "WARNING" in line or "ERROR" in line]
    assert [w for w in warnings if "OS signals are ignored" not in w] == []  # e.g. patch inconsistencies
    assert [e.reason for e in core.list_namespaced_event("default").items].count("Created") == 1
    resumed = [r for r in watches_of(fakekube) if r.query.get("resourceVersion")]
    assert len(resumed) >= 2
    kopf_calls = {(r.info.verb, r.info.rbac_resource) for r in fakekube.server.request_log()
                  if r.user == "fakekube" and r.info.is_resource_request}
    assert {("list", "widgets"), ("watch", "widgets"), ("patch", "widgets"), ("patch", "widgets/status"),
            ("create", "events"), ("watch", "customresourcedefinitions")} <= kopf_calls
    finalizer_patches = [r for r in fakekube.server.request_log()
                         if r.content_type == "application/json-patch+json" and r.info.resource == P]
    assert finalizer_patches and all(r.status == 200 for r in finalizer_patches)
