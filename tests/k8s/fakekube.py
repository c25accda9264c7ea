"""fakekube: the project's in-memory Kubernetes API server, for tests.

Why it exists: no kube-apiserver can be had on the machines the tests run on (no Docker, and no
registry we can reach ships one; see ../shared/K8S_TESTING.md). The operator's tests must still
run the *real* kopf and the *real* ``kubernetes`` client, because mocking single calls would only
test our beliefs about the API server. So this module reproduces the API server's observable
behaviour, the parts kopf and the client depend on, closely enough that both run unmodified.

Served (JSON over plain HTTP; any bearer token, or none, is accepted):

* discovery: ``/api``, ``/api/v1``, ``/apis``, ``/apis/{g}``, ``/apis/{g}/{v}``, with every
  subresource listed as its own ``{plural}/status`` entry (kopf only patches ``/status`` when it
  sees one), and ``GET /version`` with a configurable version (``ServerVersion``);
* built-in kinds as plain stored objects: namespaces (``default`` and ``kube-system`` exist),
  pods, configmaps, secrets, services, serviceaccounts, events, statefulsets, deployments,
  RBAC roles and bindings, networkpolicies, leases, mutating/validating webhook configurations and
  CRDs. Nothing acts on them: no kubelet (tests set a pod's ``status.podIP`` through
  ``pods/status``), no controllers, no admission calls;
* CRDs registered at runtime: creating one serves its versions at once, with structural pruning,
  ``default``s and validation (422) from ``openAPIV3Schema``;
* get, list (label and field selectors, ``limit``/``continue``), create (``generateName``,
  ``dryRun``), update, delete, deletecollection;
* watch: a global ``resourceVersion``, replay of a bounded history after the client's version,
  ``ERROR 410 Expired`` once that history is trimmed, periodic bookmarks, ``sendInitialEvents``
  with the ``k8s.io/initial-events-end`` bookmark, ``timeoutSeconds``;
* patch: merge patch, JSON patch (a failed ``test`` op is 422, as kopf's finalizer handling
  needs), and strategic merge patch for built-in kinds, merging ``containers``,
  ``initContainers``, ``volumes``, ``env`` etc. by name, ``volumeMounts`` by ``mountPath``,
  ``ports`` by ``containerPort`` (``port`` for services), honouring ``$patch: delete``/``replace``;
* the status subresource split (the main endpoint ignores ``status``, ``/status`` ignores the
  rest), ``metadata.generation`` bumped only by changes outside metadata and status, no-op writes
  that keep the resourceVersion and emit no event, optimistic concurrency (409 on a stale
  ``resourceVersion``), finalizers with ``deletionTimestamp`` and the real delete once the last
  one is gone, and metadata validation (names, label keys and values, 256 KiB of annotations);
* a request log (``FakeKube.request_log()``) recording, for every call, the method, path, query,
  content type, caller (bearer token) and what the real server's request-info resolver derives
  from it (group, version, resource, subresource, namespace, name, RBAC verb), so a test can check
  every call an operator made against the RBAC rules of the Helm chart.

Answered with 415, as the real server would for our purposes: strategic merge patch on custom
resources, server-side apply (``application/apply-patch+yaml``, not emulated), protobuf and CBOR
bodies (so ``helm install`` and typed ``kubectl create`` do not work; ``kubectl apply`` does).

Not emulated, so tests must not rely on them: CEL ``x-kubernetes-validations`` rules in CRD
schemas are NOT evaluated (test those rules elsewhere); controllers of any kind (no pods from
StatefulSets, no ownerReference garbage collection, no namespace cascade deletion); RBAC and
admission; conversion between CRD versions; OpenAPI documents (``/openapi/v2`` is 404) and
aggregated discovery (clients fall back to the classic documents); ``$deleteFromPrimitiveList``
and ``$setElementOrder`` directives (ignored); pagination is by key over live data, not over a
snapshot; TLS (use plain http).

Use: ``FakeKube`` + ``running_fakekube()`` (or the ``fakekube`` fixture of tests/k8s/conftest.py)
in tests; by hand: ``python -P tests/k8s/fakekube.py --port 8765 --kubeconfig /tmp/kc.yaml`` and
``KUBECONFIG=/tmp/kc.yaml kubectl get ns``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import copy
import dataclasses
import datetime
import json
import logging
import os
import pathlib
import random
import re
import socket
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jsonpatch
import jsonschema
import kubernetes
import yaml
from aiohttp import web

log = logging.getLogger("fakekube")

Obj = dict[str, Any]
Key = tuple[str, str, str]  # (group, version, plural)

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
SUBRESOURCE_VERBS = ("get", "patch", "update")
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
MAX_ANNOTATIONS_BYTES = 256 * 1024


# ---------------------------------------------------------------------------------------------
# Resources
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ResourceDef:
    """One served group/version/resource, carrying what discovery and the verbs need to know."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    subresources: frozenset[str] = frozenset()
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    custom: bool = False
    schema: str = ""  # a CRD version's openAPIV3Schema as JSON text, so the dataclass stays hashable
    singular: str = ""

    @property
    def singular_name(self) -> str:
        return self.singular or self.kind.lower()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> Key:
        return (self.group, self.version, self.plural)


def _builtin(api_version: str, plural: str, kind: str, namespaced: bool = True, *,
             status: bool = False, short: tuple[str, ...] = ()) -> ResourceDef:
    group, _, version = api_version.rpartition("/")
    return ResourceDef(group, version, plural, kind, namespaced,
                       frozenset({"status"}) if status else frozenset(), short)


BUILTINS = (
    _builtin("v1", "namespaces", "Namespace", False, status=True, short=("ns",)),
    _builtin("v1", "pods", "Pod", status=True, short=("po",)),
    _builtin("v1", "configmaps", "ConfigMap", short=("cm",)),
    _builtin("v1", "secrets", "Secret"),
    _builtin("v1", "services", "Service", status=True, short=("svc",)),
    _builtin("v1", "serviceaccounts", "ServiceAccount", short=("sa",)),
    _builtin("v1", "events", "Event", short=("ev",)),
    _builtin("apps/v1", "statefulsets", "StatefulSet", status=True, short=("sts",)),
    _builtin("apps/v1", "deployments", "Deployment", status=True, short=("deploy",)),
    _builtin("rbac.authorization.k8s.io/v1", "clusterroles", "ClusterRole", False),
    _builtin("rbac.authorization.k8s.io/v1", "clusterrolebindings", "ClusterRoleBinding", False),
    _builtin("rbac.authorization.k8s.io/v1", "roles", "Role"),
    _builtin("rbac.authorization.k8s.io/v1", "rolebindings", "RoleBinding"),
    _builtin("networking.k8s.io/v1", "networkpolicies", "NetworkPolicy", short=("netpol",)),
    _builtin("coordination.k8s.io/v1", "leases", "Lease"),
    _builtin("admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations",
             "MutatingWebhookConfiguration", False),
    _builtin("admissionregistration.k8s.io/v1", "validatingwebhookconfigurations",
             "ValidatingWebhookConfiguration", False),
    _builtin("apiextensions.k8s.io/v1", "customresourcedefinitions", "CustomResourceDefinition",
             False, status=True, short=("crd", "crds")),
)
NAMESPACES: Key = ("", "v1", "namespaces")
CRDS: Key = ("apiextensions.k8s.io", "v1", "customresourcedefinitions")

# What a new object's status starts as, where the real server (or a controller we do not run)
# would set one at once.
INITIAL_STATUS: dict[Key, Obj] = {NAMESPACES: {"phase": "Active"}, ("", "v1", "pods"): {"phase": "Pending"}}

# Field selectors the real server accepts beyond metadata.name/metadata.namespace (a subset).
SELECTABLE_FIELDS: dict[Key, frozenset[str]] = {
    ("", "v1", "pods"): frozenset({"spec.nodeName", "spec.serviceAccountName", "spec.restartPolicy",
                                   "status.phase", "status.podIP"}),
    ("", "v1", "events"): frozenset({"involvedObject.kind", "involvedObject.namespace",
                                     "involvedObject.name", "involvedObject.uid",
                                     "involvedObject.apiVersion", "reason", "type"}),
    ("", "v1", "secrets"): frozenset({"type"}),
    NAMESPACES: frozenset({"status.phase"}),
}


@dataclasses.dataclass(frozen=True)
class ServerVersion:
    """What ``GET /version`` reports.

    Operators branch on it (native sidecars need Kubernetes >= 1.29), and managed clusters report
    odd values (``minor: "29+"``, ``gitVersion: v1.29.3-eks-adc7111``), so every field is settable.
    """

    git_version: str = "v1.33.0"
    major: str = "1"
    minor: str = "33"

    @classmethod
    def parse(cls, git_version: str) -> ServerVersion:
        """``v1.28.4`` -> major ``1``, minor ``28``."""
        match = re.match(r"v?(\d+)\.(\d+)", git_version)
        if not match:
            raise ValueError(f"not a Kubernetes version: {git_version!r}")
        return cls("v" + git_version.removeprefix("v"), match.group(1), match.group(2))

    def document(self) -> Obj:
        return {"major": self.major, "minor": self.minor, "gitVersion": self.git_version,
                "gitCommit": "0" * 40, "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
                "goVersion": "go1.24", "compiler": "gc", "platform": "linux/amd64"}


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


class ApiError(Exception):
    """A failed call, answered with a ``kind: Status`` body like the real server's.

    Clients branch on ``code``/``reason`` (kopf retries a 422 from its finalizer JSON patch on the
    next cycle but loops on a 500), so each failure uses the code the real server would.
    """

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> Obj:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}


def _not_found(what: str = "the server could not find the requested resource") -> ApiError:
    return ApiError(404, "NotFound", what)


def _invalid(rd: ResourceDef, name: str, causes: list[str]) -> ApiError:
    kind = f"{rd.kind}.{rd.group}" if rd.group else rd.kind
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: ' + ", ".join(causes))


def _conflict(rd: ResourceDef, name: str) -> ApiError:
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {rd.plural} "{name}": the object '
                    "has been modified; please apply your changes to the latest version and try again")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------------------------------------
# Patches
# ---------------------------------------------------------------------------------------------

# Strategic-merge list merge keys (the real ones come from the patchMergeKey of the Go types).
SMP_MERGE_KEYS = {"containers": "name", "initContainers": "name", "ephemeralContainers": "name",
                  "volumes": "name", "env": "name", "imagePullSecrets": "name",
                  "volumeMounts": "mountPath", "volumeDevices": "devicePath", "hostAliases": "ip",
                  "conditions": "type"}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 merge patch (``application/merge-patch+json``): ``null`` deletes, maps merge,
    everything else (lists included) replaces. kopf uses it for all but finalizers."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Strategic merge patch (``application/strategic-merge-patch+json``) for built-in kinds.

    It differs from a merge patch in lists of objects with a merge key: a patch naming one
    container changes that container and keeps the others. Without it, injecting a sidecar would
    replace the broker container, which is exactly the bug the operator's tests must catch.
    """
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue  # $setElementOrder/..., $retainKeys, $deleteFromPrimitiveList/...: not emulated
        merge_key = _smp_merge_key(key, value)
        if value is None or (isinstance(value, dict) and value.get("$patch") == "delete"):
            out.pop(key, None)
        elif merge_key:
            out[key] = _smp_merge_list(out.get(key) or [], value, merge_key)
        elif isinstance(value, dict):
            out[key] = strategic_merge_patch(out.get(key), value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _smp_merge_key(field: str, value: Any) -> str | None:
    if not (isinstance(value, list) and value and all(isinstance(i, dict) for i in value)):
        return None
    if field == "ports":  # container ports merge by containerPort, service ports by port
        return "containerPort" if any("containerPort" in i for i in value) else "port"
    return SMP_MERGE_KEYS.get(field)


def _smp_merge_list(current: list[Any], items: list[Obj], merge_key: str) -> list[Any]:
    if {"$patch": "replace"} in items:
        return [copy.deepcopy(i) for i in items if i != {"$patch": "replace"}]
    merged = [copy.deepcopy(c) for c in current]
    for item in items:
        index = next((i for i, c in enumerate(merged)
                      if isinstance(c, dict) and c.get(merge_key) == item.get(merge_key)), None)
        if item.get("$patch") == "delete":
            if index is not None:
                merged.pop(index)
        elif index is None:
            merged.append({k: copy.deepcopy(v) for k, v in item.items() if k != "$patch"})
        else:
            merged[index] = strategic_merge_patch(merged[index], item)
    return merged


def apply_patch(rd: ResourceDef, obj: Obj, media_type: str, patch: Any) -> Obj:
    """The object after ``patch``, by the rules of its media type (415 for the unsupported ones)."""
    if media_type == "application/json-patch+json":
        if not isinstance(patch, list):
            raise ApiError(400, "BadRequest", "a JSON patch must be a list of operations")
        try:
            return jsonpatch.apply_patch(obj, patch)
        except jsonpatch.InvalidJsonPatch as e:
            raise ApiError(400, "BadRequest", f"invalid JSON patch: {e}") from e
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
            raise ApiError(422, "Invalid", "the server rejected our request due to an error in our "
                           f"request: {e}") from e
    if media_type not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
        raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown "
                       f"format ({media_type!r}) - accepted media types include: "
                       "application/json-patch+json, application/merge-patch+json, "
                       "application/strategic-merge-patch+json (server-side apply is not emulated)")
    if not isinstance(patch, dict):
        raise ApiError(400, "BadRequest", "a merge patch must be a JSON object")
    if media_type == "application/merge-patch+json":
        return merge_patch(obj, patch)
    if rd.custom:
        raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                       "accepted media types include: application/json-patch+json, "
                       "application/merge-patch+json, application/apply-patch+yaml "
                       "(strategic merge patch is not supported for custom resources)")
    return strategic_merge_patch(obj, patch)


# ---------------------------------------------------------------------------------------------
# Structural schemas (CRDs)
# ---------------------------------------------------------------------------------------------


def prune_and_default(value: Any, schema: Mapping[str, Any]) -> Any:
    """Drop the fields a structural schema does not declare, drop non-nullable nulls, then apply
    ``default``s: what the real server does before validating a custom resource.

    It matters beyond tidiness: a ``status`` schema without
    ``x-kubernetes-preserve-unknown-fields`` silently loses whatever kopf writes there, on a real
    cluster and here alike.
    """
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune_and_default(v, schema["items"]) for v in value]
    if not isinstance(value, dict) or (schema.get("type") != "object" and "properties" not in schema):
        return value
    props: Mapping[str, Any] = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    keep_unknown = schema.get("x-kubernetes-preserve-unknown-fields") or extra is True
    embedded = ("apiVersion", "kind", "metadata") if schema.get("x-kubernetes-embedded-resource") else ()
    out: Obj = {}
    for key, item in value.items():
        sub = props.get(key, extra if isinstance(extra, dict) else None)
        if sub is None:
            if keep_unknown or key in embedded:
                out[key] = item
        elif item is None and not sub.get("nullable"):
            continue  # the real server prunes nulls of non-nullable fields (then defaults them)
        else:
            out[key] = prune_and_default(item, sub)
    for key, sub in props.items():
        if key not in out and "default" in sub:
            out[key] = prune_and_default(copy.deepcopy(sub["default"]), sub)
    return out


#: Keywords whose value is data (an instance), never a schema: left as they are.
_DATA_KEYWORDS = frozenset({"default", "enum", "example", "const"})
#: Keywords whose value maps names (of properties, of definitions) to schemas.
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "definitions", "$defs"})


def as_json_schema(node: Any) -> Any:
    """The Kubernetes dialect of OpenAPI v3 as plain JSON Schema (draft 7), recursively.

    Spelled out: ``nullable`` and ``x-kubernetes-int-or-string``, which JSON Schema does not
    know, and the draft-4 style boolean ``exclusiveMinimum``/``exclusiveMaximum`` of OpenAPI
    3.0 (``minimum: 0, exclusiveMinimum: true`` means "> 0"), which draft 7 spells as a number
    (``exclusiveMinimum: 0``). Left as a boolean, a draft-7 validator would read ``true`` as the
    number 1 (and ``false`` as 0), rejecting valid objects.
    """
    if isinstance(node, list):
        return [as_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out: Obj = {}
    for key, value in node.items():
        if key in _DATA_KEYWORDS:
            out[key] = value
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: as_json_schema(sub) for name, sub in value.items()}
        else:
            out[key] = as_json_schema(value)
    if out.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    if out.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        flag = out.get(exclusive)
        if not isinstance(flag, bool):
            continue  # absent, or already draft 7's number
        del out[exclusive]
        if flag and bound in out:
            out[exclusive] = out.pop(bound)
    return out


def schema_errors(body: Obj, schema: Mapping[str, Any]) -> list[str]:
    """Validation failures of ``body`` as ``path: message`` lines (empty when valid)."""
    validator = jsonschema.Draft7Validator(as_json_schema(dict(schema)))
    errors = sorted(validator.iter_errors(body), key=lambda e: list(map(str, e.absolute_path)))
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: Invalid value: {e.message}" for e in errors]


# ---------------------------------------------------------------------------------------------
# Metadata validation
# ---------------------------------------------------------------------------------------------

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def _name_errors(rd: ResourceDef, name: str) -> list[str]:
    if rd.group == "rbac.authorization.k8s.io":  # RBAC names are path segments ("system:...")
        ok = name not in (".", "..") and not set(name) & {"/", "%"}
    elif rd.key == NAMESPACES:
        ok = len(name) <= 63 and bool(_DNS_LABEL.fullmatch(name))
    elif rd.plural == "services":
        ok = len(name) <= 63 and bool(_DNS1035_LABEL.fullmatch(name))
    else:
        ok = len(name) <= 253 and bool(_DNS_SUBDOMAIN.fullmatch(name))
    return [] if ok else [f'metadata.name: Invalid value: "{name}": not a valid {rd.kind} name']


def _key_ok(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    return (len(name) <= 63 and bool(_QUALIFIED_NAME.fullmatch(name))
            and (not prefix or (len(prefix) <= 253 and bool(_DNS_SUBDOMAIN.fullmatch(prefix)))))


def _metadata_errors(rd: ResourceDef, meta: Obj) -> list[str]:
    """The checks the real server makes on every object's metadata (a subset). Labels too long or
    oddly spelled are a classic operator bug that only a real cluster would otherwise reveal."""
    errors = _name_errors(rd, str(meta.get("name", "")))
    labels = meta.get("labels") or {}
    for key, value in labels.items():
        if not _key_ok(key):
            errors.append(f'metadata.labels: Invalid value: "{key}": not a qualified name')
        if not isinstance(value, str) or len(value) > 63 or (value and not _QUALIFIED_NAME.fullmatch(value)):
            errors.append(f'metadata.labels: Invalid value: "{value}": not a valid label value')
    annotations = meta.get("annotations") or {}
    errors += [f'metadata.annotations: Invalid value: "{k}": not a qualified name'
               for k in annotations if not _key_ok(k)]
    if sum(len(k) + len(str(v)) for k, v in annotations.items()) > MAX_ANNOTATIONS_BYTES:
        errors.append(f"metadata.annotations: Too long: must have at most {MAX_ANNOTATIONS_BYTES} bytes")
    return errors


# ---------------------------------------------------------------------------------------------
# Selectors
# ---------------------------------------------------------------------------------------------

_SET_REQUIREMENT = re.compile(r"(?P<key>[^\s!=(),]+)\s+(?P<op>in|notin)\s+\((?P<values>[^()]*)\)")
_EQ_REQUIREMENT = re.compile(r"(?P<key>[^\s!=(),]+)\s*(?P<op>==|=|!=)\s*(?P<value>[^\s!=(),]*)")
_EXISTS_REQUIREMENT = re.compile(r"(?P<neg>!?)\s*(?P<key>[^\s!=(),]+)")


def _split_requirements(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    return [p for p in [*parts, current.strip()] if p]


def _label_requirement(text: str) -> Callable[[Mapping[str, str]], bool]:
    if m := _SET_REQUIREMENT.fullmatch(text):
        key, values = m["key"], {v.strip() for v in m["values"].split(",")}
        if m["op"] == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if m := _EQ_REQUIREMENT.fullmatch(text):
        key, value, negate = m["key"], m["value"], m["op"] == "!="
        return lambda labels: (labels.get(key) == value) != negate
    if m := _EXISTS_REQUIREMENT.fullmatch(text):
        key, negate = m["key"], bool(m["neg"])
        return lambda labels: (key in labels) != negate
    raise ApiError(400, "BadRequest", f"unable to parse requirement: {text!r}")


def label_selector(text: str | None) -> Callable[[Mapping[str, str]], bool]:
    """A predicate over labels for a selector string (``=``, ``==``, ``!=``, ``in``, ``notin``,
    ``key``, ``!key``); 400 for what the real server would not parse either."""
    requirements = [_label_requirement(r) for r in _split_requirements(text or "")]
    return lambda labels: all(req(labels) for req in requirements)


def _field_value(obj: Obj, path: str) -> str | None:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return None if value is None else str(value)


def field_selector(text: str | None, rd: ResourceDef) -> Callable[[Obj], bool]:
    """A predicate over objects for a field selector; 400 for fields the real server does not
    index, so an operator never relies on a selector that only works here."""
    requirements = []
    for req in filter(None, (text or "").split(",")):
        m = re.fullmatch(r"([^!=]+?)\s*(==|=|!=)\s*(.*)", req.strip())
        if not m:
            raise ApiError(400, "BadRequest", f"invalid field selector: {req!r}")
        path, op, value = m.groups()
        if path not in ("metadata.name", "metadata.namespace") and path not in SELECTABLE_FIELDS.get(
                rd.key, ()):
            raise ApiError(400, "BadRequest", f'field label not supported: "{path}"')
        requirements.append((path, value, op == "!="))
    return lambda obj: all(((_field_value(obj, p) or "") == v) != neg for p, v, neg in requirements)


# ---------------------------------------------------------------------------------------------
# Request info and the request log
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RequestInfo:
    """What the real server's RequestInfoResolver derives from a request, purely from its URL.

    RBAC authorizes on exactly these fields, so a test that checks the logged calls against a
    Role's rules checks what a real cluster would check. ``name`` includes the one a
    ``fieldSelector=metadata.name=X`` list or watch names, as on the real server.
    """

    is_resource_request: bool
    verb: str
    path: str
    group: str = ""
    version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""

    @property
    def rbac_resource(self) -> str:
        """``resource`` or ``resource/subresource``, as written in RBAC rules."""
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


_HTTP_VERBS = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch",
               "DELETE": "delete"}


def resolve_request(method: str, path: str, query: Mapping[str, str]) -> RequestInfo:
    """The RequestInfo of a call, following k8s.io/apiserver's RequestInfoFactory."""
    parts = [p for p in path.split("/") if p]
    if len(parts) < 3 or parts[0] not in ("api", "apis") or (parts[0] == "apis" and len(parts) < 4):
        return RequestInfo(False, method.lower(), path)
    group, rest = ("", parts[1:]) if parts[0] == "api" else (parts[1], parts[2:])
    version, rest = rest[0], rest[1:]
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in ("status", "finalize"):
            rest = rest[2:]
    resource, name, subresource = [*rest, "", "", ""][:3]
    verb = _HTTP_VERBS.get(method, "")
    if verb == "get" and not name:
        verb = "watch" if query.get("watch", "false").lower() not in ("0", "false") else "list"
        selected = re.search(r"(?:^|,)metadata\.name==?([^,]+)", query.get("fieldSelector", ""))
        name = selected.group(1) if selected else ""
    elif verb == "delete" and not name:
        verb = "deletecollection"
    return RequestInfo(True, verb, path, group, version, resource, subresource, namespace, name)


@dataclasses.dataclass
class RequestRecord:
    """One call as the server saw it; ``user`` is the bearer token (fakekube's stand-in for an
    authenticated user: give the operator and the test driver different tokens to tell their
    calls apart). ``status`` is the HTTP status, for watches that of the stream's start."""

    method: str
    path: str
    query: dict[str, str]
    content_type: str
    user: str
    user_agent: str
    info: RequestInfo
    status: int = 0


# ---------------------------------------------------------------------------------------------
# The server state
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Event:
    rv: int
    key: Key
    type: str
    obj: Obj


@dataclasses.dataclass(eq=False)
class Watch:
    """One open watch: its filter and the queue the store feeds (``None`` ends the stream)."""

    rd: ResourceDef
    namespace: str
    labels: Callable[[Mapping[str, str]], bool]
    fields: Callable[[Obj], bool]
    queue: asyncio.Queue[Obj | None] = dataclasses.field(default_factory=asyncio.Queue)

    def wants(self, key: Key, obj: Obj) -> bool:
        meta = obj.get("metadata", {})
        return (key == self.rd.key and (not self.namespace or meta.get("namespace") == self.namespace)
                and self.labels(meta.get("labels") or {}) and self.fields(obj))


def _bookmark(rd: ResourceDef, rv: int, annotations: Obj | None = None) -> Obj:
    meta: Obj = {"resourceVersion": str(rv)}
    if annotations:
        meta["annotations"] = annotations
    return {"type": "BOOKMARK", "object": {"kind": rd.kind, "apiVersion": rd.api_version, "metadata": meta}}


def _expired(rv: str, current: int) -> Obj:
    return {"type": "ERROR", "object": ApiError(410, "Expired",
                                                f"too old resource version: {rv} ({current})").status()}


_SYSTEM_METADATA = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                    "generation", "resourceVersion")
_GENERATE_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # the real server's, free of vowels


class FakeKube:
    """The emulated API server's state and verbs; ``make_app()`` puts HTTP in front of it.

    Mutations happen on the server's event loop; the inspection methods (``request_log``,
    ``objects``, ``read``) are safe to call from the test's thread.
    """

    def __init__(self, *, version: str | ServerVersion = "v1.33.0", bookmark_interval: float = 10.0,
                 history: int = 5000) -> None:
        self.version = ServerVersion.parse(version) if isinstance(version, str) else version
        self.bookmark_interval = bookmark_interval
        self._lock = threading.RLock()
        self._rv = 1000
        self._resources: dict[Key, ResourceDef] = {rd.key: rd for rd in BUILTINS}
        self._objects: dict[Key, dict[tuple[str, str], Obj]] = collections.defaultdict(dict)
        self._history: collections.deque[_Event] = collections.deque(maxlen=history)
        self._expired_through = 0  # the newest resourceVersion trimmed from the history
        self._watches: set[Watch] = set()
        self._requests: list[RequestRecord] = []
        for name in ("default", "kube-system"):
            self.create(self._resources[NAMESPACES], "", {"metadata": {"name": name}})

    # -- inspection (any thread) ---------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        return self._rv

    def request_log(self) -> list[RequestRecord]:
        """Every call so far, oldest first (a copy)."""
        with self._lock:
            return list(self._requests)

    def clear_request_log(self) -> None:
        with self._lock:
            self._requests.clear()

    def objects(self, api_version: str, plural: str, namespace: str | None = None) -> list[Obj]:
        """Copies of the stored objects of a resource (``"apps/v1", "statefulsets"``)."""
        group, _, version = api_version.rpartition("/")
        with self._lock:
            bucket = self._objects.get((group, version, plural), {})
            return [copy.deepcopy(o) for (ns, _), o in sorted(bucket.items())
                    if namespace is None or ns == namespace]

    def read(self, api_version: str, plural: str, name: str, namespace: str = "") -> Obj | None:
        """A copy of one stored object, or None."""
        group, _, version = api_version.rpartition("/")
        with self._lock:
            obj = self._objects.get((group, version, plural), {}).get((namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def record(self, entry: RequestRecord) -> None:
        with self._lock:
            self._requests.append(entry)

    # -- resources -----------------------------------------------------------------------------

    def resources(self) -> list[ResourceDef]:
        with self._lock:
            return sorted(self._resources.values(), key=lambda r: r.key)

    def resource(self, group: str, version: str, plural: str) -> ResourceDef:
        rd = self._resources.get((group, version, plural))
        if rd is None:
            raise _not_found()
        return rd

    def _crd_resources(self, crd: Obj) -> list[ResourceDef]:
        spec, names = crd["spec"], crd["spec"]["names"]
        return [ResourceDef(spec["group"], v["name"], names["plural"], names["kind"],
                            spec.get("scope", "Namespaced") == "Namespaced",
                            frozenset((v.get("subresources") or {}).keys()),
                            tuple(names.get("shortNames") or ()), tuple(names.get("categories") or ()),
                            custom=True, schema=json.dumps((v.get("schema") or {}).get("openAPIV3Schema") or {}),
                            singular=names.get("singular", ""))
                for v in spec.get("versions") or [] if v.get("served", True)]

    def _register_crd(self, crd: Obj, previous: Obj | None) -> None:
        for rd in self._crd_resources(previous) if previous else []:
            self._resources.pop(rd.key, None)
        for rd in self._crd_resources(crd):
            self._resources[rd.key] = rd

    def _unregister_crd(self, crd: Obj) -> None:
        """Delete the CRD's objects, then stop serving it (the real server does the same through
        a finalizer; here it is immediate and ignores the objects' own finalizers)."""
        for rd in self._crd_resources(crd):
            for obj in list(self._objects.get(rd.key, {}).values()):
                self._write(rd, obj, "DELETED")
            self._resources.pop(rd.key, None)

    @staticmethod
    def _crd_errors(crd: Obj) -> list[str]:
        spec = crd.get("spec") or {}
        names, versions = spec.get("names") or {}, spec.get("versions") or []
        errors = [f"spec.{f}: Required value" for f, v in (("group", spec.get("group")),
                  ("names.plural", names.get("plural")), ("names.kind", names.get("kind")),
                  ("versions", versions)) if not v]
        if not errors and crd["metadata"].get("name") != f"{names['plural']}.{spec['group']}":
            errors.append(f'metadata.name: Invalid value: "{crd["metadata"].get("name")}": must be '
                          "spec.names.plural+\".\"+spec.group")
        if versions and sum(bool(v.get("storage")) for v in versions) != 1:
            errors.append("spec.versions: Invalid value: must have exactly one version marked as storage version")
        errors += [f"spec.versions[{i}].schema.openAPIV3Schema: Required value"
                   for i, v in enumerate(versions) if not (v.get("schema") or {}).get("openAPIV3Schema")]
        return errors

    @staticmethod
    def _crd_status(crd: Obj) -> Obj:
        accepted = [("NamesAccepted", "NoConflicts", "no conflicts found"),
                    ("Established", "InitialNamesAccepted", "the initial names have been accepted")]
        return {"acceptedNames": crd["spec"]["names"],
                "storedVersions": [v["name"] for v in crd["spec"]["versions"] if v.get("storage")],
                "conditions": [{"type": t, "status": "True", "lastTransitionTime": _now(), "reason": r,
                                "message": m} for t, r, m in accepted]}

    # -- storage -------------------------------------------------------------------------------

    def _get(self, rd: ResourceDef, namespace: str, name: str) -> Obj:
        obj = self._objects.get(rd.key, {}).get((namespace if rd.namespaced else "", name))
        if obj is None:
            what = f"{rd.plural}.{rd.group}" if rd.group else rd.plural
            raise _not_found(f'{what} "{name}" not found')
        return obj

    def _write(self, rd: ResourceDef, obj: Obj, event_type: str, *, dry_run: bool = False) -> Obj:
        """Store (or remove) ``obj`` under a new resourceVersion and tell the watches."""
        if dry_run:
            return copy.deepcopy(obj)
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if event_type == "DELETED":
            self._objects[rd.key].pop(key, None)
        else:
            self._objects[rd.key][key] = obj
        event = _Event(self._rv, rd.key, event_type, copy.deepcopy(obj))
        if len(self._history) == self._history.maxlen:
            self._expired_through = self._history[0].rv
        self._history.append(event)
        for watch in list(self._watches):
            if watch.wants(rd.key, event.obj):
                watch.queue.put_nowait({"type": event_type, "object": event.obj})
        return copy.deepcopy(obj)

    def _admit(self, rd: ResourceDef, obj: Obj) -> Obj:
        """Validate metadata and, for custom resources, prune/default/validate against the schema."""
        meta = obj["metadata"]
        errors = _metadata_errors(rd, meta)
        if rd.custom and rd.schema:
            schema = json.loads(rd.schema)
            head = {k: obj[k] for k in ("apiVersion", "kind", "metadata") if k in obj}
            body = prune_and_default({k: v for k, v in obj.items() if k not in head}, schema)
            errors += schema_errors(body, schema)
            obj = head | body
        if rd.key == CRDS:
            errors += self._crd_errors(obj)
        if errors:
            raise _invalid(rd, str(meta.get("name", "")), errors)
        return obj

    # -- verbs ---------------------------------------------------------------------------------

    def get(self, rd: ResourceDef, namespace: str, name: str) -> Obj:
        with self._lock:
            return copy.deepcopy(self._get(rd, namespace, name))

    def listing(self, rd: ResourceDef, namespace: str, query: Mapping[str, str]) -> Obj:
        """A ``{Kind}List`` of the matching objects, paginated by key with ``limit``/``continue``."""
        labels, fields = label_selector(query.get("labelSelector")), field_selector(query.get("fieldSelector"), rd)
        try:
            after = json.loads(base64.urlsafe_b64decode(query["continue"])) if query.get("continue") else None
            limit = int(query.get("limit") or 0)
        except ValueError as e:
            raise ApiError(400, "BadRequest", f"invalid limit or continue: {e}") from e
        with self._lock:
            matching = [(key, obj) for key, obj in sorted(self._objects.get(rd.key, {}).items())
                        if (not namespace or key[0] == namespace) and (after is None or list(key) > after)
                        and labels(obj["metadata"].get("labels") or {}) and fields(obj)]
            page = matching[:limit] if limit else matching
            meta: Obj = {"resourceVersion": str(self._rv), "continue": ""}
            if len(page) < len(matching):
                meta["continue"] = base64.urlsafe_b64encode(json.dumps(list(page[-1][0])).encode()).decode()
                meta["remainingItemCount"] = len(matching) - len(page)
            return {"kind": f"{rd.kind}List", "apiVersion": rd.api_version, "metadata": meta,
                    "items": [copy.deepcopy(obj) for _, obj in page]}

    def create(self, rd: ResourceDef, namespace: str, body: Any, *, dry_run: bool = False) -> Obj:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body must be a JSON object")
        if body.get("kind") not in (None, rd.kind):
            raise ApiError(400, "BadRequest", f"kind {body.get('kind')!r} does not match the URL's {rd.kind}")
        with self._lock:
            obj = self._new_object(rd, namespace, copy.deepcopy(body))
            obj = self._admit(rd, obj)
            meta = obj["metadata"]
            if (meta.get("namespace", ""), meta["name"]) in self._objects.get(rd.key, {}):
                raise ApiError(409, "AlreadyExists", f'{rd.plural} "{meta["name"]}" already exists')
            if rd.key == CRDS:
                obj["status"] = self._crd_status(obj)
                if not dry_run:
                    self._register_crd(obj, None)
            return self._write(rd, obj, "ADDED", dry_run=dry_run)

    def _new_object(self, rd: ResourceDef, namespace: str, obj: Obj) -> Obj:
        meta = obj.setdefault("metadata", {})
        if rd.namespaced:
            if namespace and meta.get("namespace", namespace) != namespace:
                raise ApiError(400, "BadRequest", "the namespace of the provided object does not match "
                               "the namespace sent on the request")
            meta["namespace"] = namespace or meta.get("namespace") or "default"
            if ("", meta["namespace"]) not in self._objects[NAMESPACES]:
                raise _not_found(f'namespaces "{meta["namespace"]}" not found')
        else:
            meta.pop("namespace", None)
        for key in _SYSTEM_METADATA:
            meta.pop(key, None)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise _invalid(rd, "", ["metadata.name: Required value: name or generateName is required"])
            meta["name"] = self._generate_name(rd, meta)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
        obj["apiVersion"], obj["kind"] = rd.api_version, rd.kind
        if "status" in rd.subresources:
            obj.pop("status", None)
        if rd.key in INITIAL_STATUS:
            obj["status"] = copy.deepcopy(INITIAL_STATUS[rd.key])
        return obj

    def _generate_name(self, rd: ResourceDef, meta: Obj) -> str:
        while True:
            name = meta["generateName"] + "".join(random.choices(_GENERATE_NAME_ALPHABET, k=5))
            if (meta.get("namespace", ""), name) not in self._objects.get(rd.key, {}):
                return name

    def replace(self, rd: ResourceDef, namespace: str, name: str, body: Any, *, status_only: bool,
                dry_run: bool = False) -> Obj:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body must be a JSON object")
        with self._lock:
            old = self._get(rd, namespace, name)
            meta = body.get("metadata") or {}
            if meta.get("name", name) != name:
                raise ApiError(400, "BadRequest", f"the name of the object ({meta.get('name')}) does not "
                               f"match the name on the URL ({name})")
            if rd.custom and not meta.get("resourceVersion"):
                raise _invalid(rd, name, ["metadata.resourceVersion: Invalid value: 0x0: must be "
                                          "specified for an update"])
            self._check_precondition(rd, old, meta.get("resourceVersion"))
            return self._update(rd, old, copy.deepcopy(body), status_only=status_only, dry_run=dry_run)

    def patch(self, rd: ResourceDef, namespace: str, name: str, media_type: str, patch: Any, *,
              status_only: bool, dry_run: bool = False) -> Obj:
        with self._lock:
            old = self._get(rd, namespace, name)
            new = apply_patch(rd, copy.deepcopy(old), media_type, patch)
            if isinstance(patch, dict):
                self._check_precondition(rd, old, (patch.get("metadata") or {}).get("resourceVersion"))
            return self._update(rd, old, new, status_only=status_only, dry_run=dry_run)

    @staticmethod
    def _check_precondition(rd: ResourceDef, old: Obj, rv: str | None) -> None:
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise _conflict(rd, old["metadata"]["name"])

    def _update(self, rd: ResourceDef, old: Obj, new: Obj, *, status_only: bool, dry_run: bool) -> Obj:
        """The part every update and patch shares: system fields, the status split, admission,
        the finalizer rule, no-op detection, generation, and the delete a removed last
        finalizer completes."""
        new = self._split_status(rd, old, self._carry_system_fields(rd, old, new), status_only)
        new = self._admit(rd, new)
        meta, old_meta = new["metadata"], old["metadata"]
        if old_meta.get("deletionTimestamp") and set(meta.get("finalizers") or ()) - set(
                old_meta.get("finalizers") or ()):
            raise _invalid(rd, meta["name"], ["metadata.finalizers: Forbidden: no new finalizers can "
                                              "be added if the object is being deleted"])
        if _without_rv(new) == _without_rv(old):
            return copy.deepcopy(old)  # a no-op: no new resourceVersion, no event, like the real server
        if _generation_part(rd, new) != _generation_part(rd, old):
            meta["generation"] = old_meta.get("generation", 1) + 1
        if dry_run:
            return copy.deepcopy(new)
        if rd.key == CRDS:
            self._register_crd(new, old)
        result = self._write(rd, new, "MODIFIED")
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self._remove(rd, new)
        return result

    @staticmethod
    def _carry_system_fields(rd: ResourceDef, old: Obj, new: Obj) -> Obj:
        meta, old_meta = new.setdefault("metadata", {}), old["metadata"]
        for key in ("name", "namespace", *_SYSTEM_METADATA):
            if key in old_meta:
                meta[key] = old_meta[key]
            else:
                meta.pop(key, None)
        new["apiVersion"], new["kind"] = rd.api_version, rd.kind
        return new

    @staticmethod
    def _split_status(rd: ResourceDef, old: Obj, new: Obj, status_only: bool) -> Obj:
        """With a status subresource, the main endpoint cannot change ``status`` and ``/status``
        can change nothing else: this is what lets an operator and a user never clobber each other."""
        if "status" not in rd.subresources:
            return new
        base, source = (old, new) if status_only else (new, old)
        merged = {k: copy.deepcopy(v) for k, v in base.items() if k != "status"}
        if "status" in source:
            merged["status"] = copy.deepcopy(source["status"])
        return merged

    def delete(self, rd: ResourceDef, namespace: str, name: str, *, dry_run: bool = False) -> Obj:
        """Delete now, or, while finalizers remain, mark for deletion (``deletionTimestamp``, and a
        generation bump as on the real server) and leave the rest to whoever owns the finalizers."""
        with self._lock:
            old = self._get(rd, namespace, name)
            meta = old["metadata"]
            if not meta.get("finalizers"):
                return copy.deepcopy(old) if dry_run else self._remove(rd, old)
            if meta.get("deletionTimestamp"):
                return copy.deepcopy(old)
            new = copy.deepcopy(old)
            new["metadata"].update(deletionTimestamp=_now(), deletionGracePeriodSeconds=0,
                                   generation=meta.get("generation", 1) + 1)
            return self._write(rd, new, "MODIFIED", dry_run=dry_run)

    def delete_collection(self, rd: ResourceDef, namespace: str, query: Mapping[str, str]) -> Obj:
        with self._lock:
            listing = self.listing(rd, namespace, {k: v for k, v in query.items() if k != "limit"})
            for obj in listing["items"]:
                self.delete(rd, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
            return listing

    def _remove(self, rd: ResourceDef, obj: Obj) -> Obj:
        if rd.key == CRDS:
            self._unregister_crd(obj)
        return self._write(rd, copy.deepcopy(obj), "DELETED")

    # -- watch ---------------------------------------------------------------------------------

    def open_watch(self, rd: ResourceDef, namespace: str, query: Mapping[str, str]) -> tuple[Watch, list[Obj]]:
        """Register a watch and compute what it must send first, atomically (no event can fall in
        between): the current objects as ADDED when no resourceVersion is given or initial events
        are asked for, else the history after that version, or a 410 ERROR if it was trimmed."""
        watch = Watch(rd, namespace, label_selector(query.get("labelSelector")),
                      field_selector(query.get("fieldSelector"), rd))
        rv = query.get("resourceVersion", "")
        initial = query.get("sendInitialEvents") == "true"
        if rv and not rv.isdigit():
            raise ApiError(400, "BadRequest", f"invalid resourceVersion: {rv!r}")
        with self._lock:
            if initial or rv in ("", "0"):
                backlog = [{"type": "ADDED", "object": copy.deepcopy(o)}
                           for o in self._objects.get(rd.key, {}).values() if watch.wants(rd.key, o)]
                if initial:
                    backlog.append(_bookmark(rd, self._rv, {INITIAL_EVENTS_END: "true"}))
            elif int(rv) < self._expired_through:
                return watch, [_expired(rv, self._rv)]
            else:
                backlog = [{"type": e.type, "object": e.obj} for e in self._history
                           if e.rv > int(rv) and watch.wants(e.key, e.obj)]
            self._watches.add(watch)
        return watch, backlog

    def close_watch(self, watch: Watch) -> None:
        with self._lock:
            self._watches.discard(watch)

    def end_watches(self) -> None:
        """End every open watch stream (on the server's loop), so shutdown need not wait for them."""
        with self._lock:
            for watch in self._watches:
                watch.queue.put_nowait(None)

    def bookmark(self, rd: ResourceDef) -> Obj:
        return _bookmark(rd, self._rv)


def _without_rv(obj: Obj) -> Obj:
    return obj | {"metadata": {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}}


def _generation_part(rd: ResourceDef, obj: Obj) -> Obj:
    """What ``metadata.generation`` tracks: everything but metadata, and status if it is a subresource."""
    skip = {"metadata", "status"} if "status" in rd.subresources else {"metadata"}
    return {k: v for k, v in obj.items() if k not in skip}


# ---------------------------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------------------------


class HttpApi:
    """The REST surface: resolves each request as the real server would, logs it, and answers
    from a ``FakeKube``."""

    def __init__(self, kube: FakeKube) -> None:
        self.kube = kube

    async def handle(self, request: web.Request) -> web.StreamResponse:
        query = {k: request.query.get(k, "") for k in request.query}
        info = resolve_request(request.method, request.path, query)
        auth = request.headers.get("Authorization", "")
        entry = RequestRecord(request.method, request.path, query, request.headers.get("Content-Type", ""),
                              auth[7:] if auth.startswith("Bearer ") else "",
                              request.headers.get("User-Agent", ""), info)
        self.kube.record(entry)
        try:
            response = await (self._resource(request, info, query, entry) if info.is_resource_request
                              else self._non_resource(request))
        except ApiError as e:
            response = web.json_response(e.status(), status=e.code)
        except Exception as e:  # a fakekube bug: answer like the real server's 500, keep the trace
            log.exception("fakekube failed on %s %s", request.method, request.path_qs)
            error = ApiError(500, "InternalError", f"fakekube: {type(e).__name__}: {e}")
            response = web.json_response(error.status(), status=500)
        entry.status = entry.status or response.status
        log.debug("%s %s -> %s", request.method, request.path_qs, entry.status)
        return response

    # -- discovery and other non-resource paths ------------------------------------------------

    async def _non_resource(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        if request.method != "GET":
            raise ApiError(405, "MethodNotAllowed", f"{request.method} is not allowed on {request.path}")
        if not parts:
            return web.json_response({"paths": ["/api", "/api/v1", "/apis", "/healthz", "/version"]})
        if parts[0] in ("healthz", "livez", "readyz"):
            return web.Response(text="ok")
        if parts == ["version"]:
            return web.json_response(self.kube.version.document())
        if parts == ["api"]:
            return web.json_response({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": request.host}]})
        if parts == ["apis"]:
            return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": self._groups()})
        if parts[0] == "apis" and len(parts) == 2:
            group = next((g for g in self._groups() if g["name"] == parts[1]), None)
            if group is None:
                raise _not_found()
            return web.json_response({"kind": "APIGroup", "apiVersion": "v1", **group})
        if parts[0] == "api" and len(parts) == 2:
            return web.json_response(self._resource_list("", parts[1]))
        if parts[0] == "apis" and len(parts) == 3:
            return web.json_response(self._resource_list(parts[1], parts[2]))
        raise _not_found()

    def _groups(self) -> list[Obj]:
        versions: dict[str, set[str]] = collections.defaultdict(set)
        for rd in self.kube.resources():
            if rd.group:
                versions[rd.group].add(rd.version)
        groups = []
        for group, vs in sorted(versions.items()):
            entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in sorted(vs, reverse=True)]
            groups.append({"name": group, "versions": entries, "preferredVersion": entries[0]})
        return groups

    def _resource_list(self, group: str, version: str) -> Obj:
        """An APIResourceList. kopf needs ``singularName`` present, ``list``+``watch`` (else it
        will not serve the resource), ``patch``, and each subresource as its own entry."""
        resources = []
        for rd in self.kube.resources():
            if (rd.group, rd.version) != (group, version):
                continue
            resources.append({"name": rd.plural, "singularName": rd.singular_name, "namespaced": rd.namespaced,
                              "kind": rd.kind, "verbs": list(ALL_VERBS), "shortNames": list(rd.short_names),
                              "categories": list(rd.categories)})
            resources += [{"name": f"{rd.plural}/{sub}", "singularName": "", "namespaced": rd.namespaced,
                           "kind": rd.kind, "verbs": list(SUBRESOURCE_VERBS)} for sub in sorted(rd.subresources)]
        if not resources:
            raise _not_found()
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version, "resources": resources}

    # -- resources -----------------------------------------------------------------------------

    def _target(self, info: RequestInfo) -> tuple[ResourceDef, str]:
        """The resource a request addresses and the namespace it is scoped to (404 if none)."""
        rd = self.kube.resource(info.group, info.version, info.resource)
        if info.subresource and info.subresource not in rd.subresources:
            raise _not_found()
        if rd.key == NAMESPACES:
            return rd, ""
        if info.namespace and not rd.namespaced:
            raise _not_found()
        if rd.namespaced and info.name and not info.namespace and info.verb not in ("list", "watch"):
            raise _not_found()
        return rd, info.namespace

    async def _resource(self, request: web.Request, info: RequestInfo, query: Mapping[str, str],
                        entry: RequestRecord) -> web.StreamResponse:
        rd, namespace = self._target(info)
        kube, dry_run, status_only = self.kube, bool(query.get("dryRun")), info.subresource == "status"
        verb = info.verb
        if verb == "watch":
            return await self._watch(request, rd, namespace, query, entry)
        if verb == "list":
            return web.json_response(kube.listing(rd, namespace, query))
        if verb == "deletecollection":
            return web.json_response(kube.delete_collection(rd, namespace, query))
        if verb == "create" and not info.name:
            created = kube.create(rd, namespace, await _read_body(request), dry_run=dry_run)
            return web.json_response(created, status=201)
        if verb == "get":
            return web.json_response(kube.get(rd, namespace, info.name))
        if verb == "update":
            body = await _read_body(request)
            return web.json_response(kube.replace(rd, namespace, info.name, body, status_only=status_only,
                                                  dry_run=dry_run))
        if verb == "patch":
            media_type = _media_type(request)
            patch = await _read_body(request) if media_type.endswith("+json") else None
            return web.json_response(kube.patch(rd, namespace, info.name, media_type, patch,
                                                status_only=status_only, dry_run=dry_run))
        if verb == "delete" and not info.subresource:
            return web.json_response(kube.delete(rd, namespace, info.name, dry_run=dry_run))
        raise ApiError(405, "MethodNotAllowed", f"{request.method} is not supported on {request.path}")

    async def _watch(self, request: web.Request, rd: ResourceDef, namespace: str, query: Mapping[str, str],
                     entry: RequestRecord) -> web.StreamResponse:
        """A chunked stream of newline-separated events, bookmarks while idle (kopf reconnects
        after 70 s of silence), until ``timeoutSeconds``, the client leaves, or shutdown."""
        watch, backlog = self.kube.open_watch(rd, namespace, query)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        try:
            await response.prepare(request)
            entry.status = response.status
            for event in backlog:
                await _send(response, event)
            if not (backlog and backlog[-1]["type"] == "ERROR"):
                await self._stream(response, rd, watch, query)
        except ConnectionResetError:
            pass  # the client left
        finally:
            self.kube.close_watch(watch)
        return response

    async def _stream(self, response: web.StreamResponse, rd: ResourceDef, watch: Watch,
                      query: Mapping[str, str]) -> None:
        loop = asyncio.get_running_loop()
        timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None
        deadline = loop.time() + timeout if timeout is not None else None
        bookmarks = query.get("allowWatchBookmarks") == "true"
        while True:
            wait = self.kube.bookmark_interval
            if deadline is not None:
                wait = min(wait, deadline - loop.time())
                if wait <= 0:
                    return
            try:
                event = await asyncio.wait_for(watch.queue.get(), timeout=wait)
            except TimeoutError:
                if bookmarks and watch.queue.empty():
                    await _send(response, self.kube.bookmark(rd))
                continue
            if event is None:
                return
            await _send(response, event)


async def _send(response: web.StreamResponse, event: Obj) -> None:
    await response.write(json.dumps(event).encode() + b"\n")


def _media_type(request: web.Request) -> str:
    return request.headers.get("Content-Type", "").split(";")[0].strip().lower()


async def _read_body(request: web.Request) -> Any:
    """The request's JSON (or YAML) body. A missing Content-Type means JSON: the kubernetes client
    v37 sends none on POST/PUT, and the real server defaults to JSON too."""
    media_type = _media_type(request)
    raw = await request.read()
    try:
        if media_type in ("", "application/json", "*/*") or media_type.endswith("+json"):
            return json.loads(raw or b"null")
        if media_type == "application/yaml":
            return yaml.safe_load(raw)
    except (ValueError, yaml.YAMLError) as e:
        raise ApiError(400, "BadRequest", f"the request body could not be decoded: {e}") from e
    raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format "
                   f"({media_type!r}) - accepted media types include: application/json, application/yaml "
                   "(fakekube speaks no protobuf or CBOR)")


def make_app(kube: FakeKube | None = None) -> web.Application:
    """An aiohttp application serving ``kube`` (a fresh FakeKube if none)."""
    api = HttpApi(kube or FakeKube())
    app = web.Application(client_max_size=16 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", api.handle)
    return app


async def start_server(kube: FakeKube, host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, str]:
    """Serve ``kube`` on ``host:port`` (0: a free port) on the running loop; returns the runner
    (``await runner.cleanup()`` to stop) and the base URL."""
    runner = web.AppRunner(make_app(kube), handler_cancellation=True, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    await web.SockSite(runner, sock).start()
    return runner, f"http://{host}:{sock.getsockname()[1]}"


def write_kubeconfig(path: pathlib.Path, url: str, *, user: str = "fakekube", namespace: str = "default") -> None:
    """A kubeconfig for ``url`` whose bearer token is ``user`` (the name the request log shows)."""
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "fakekube", "preferences": {},
              "clusters": [{"name": "fakekube", "cluster": {"server": url}}],
              "users": [{"name": user, "user": {"token": user}}],
              "contexts": [{"name": "fakekube", "context": {"cluster": "fakekube", "user": user,
                                                           "namespace": namespace}}]}
    path.write_text(yaml.safe_dump(config, sort_keys=False))


# ---------------------------------------------------------------------------------------------
# In-process use
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class RunningFakeKube:
    """A FakeKube served on loopback from a background thread (see ``running_fakekube``)."""

    server: FakeKube
    url: str
    kubeconfig: pathlib.Path

    def api_client(self, user: str = "test") -> kubernetes.client.ApiClient:
        """A kubernetes ApiClient that calls as ``user``, independent of the global configuration
        (so a test's own calls are told apart from the operator's in the request log)."""
        config = kubernetes.client.Configuration(host=self.url, api_key={"authorization": user},
                                                 api_key_prefix={"authorization": "Bearer"})
        return kubernetes.client.ApiClient(config)


class _ServerThread:
    """An event loop of its own, in a daemon thread, serving one FakeKube."""

    def __init__(self, kube: FakeKube) -> None:
        self.kube = kube
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fakekube", daemon=True)
        self.runner: web.AppRunner | None = None

    def start(self) -> str:
        self.thread.start()
        self.runner, url = asyncio.run_coroutine_threadsafe(start_server(self.kube), self.loop).result(10)
        return url

    def stop(self) -> None:
        async def shutdown() -> None:
            self.kube.end_watches()
            if self.runner is not None:
                await self.runner.cleanup()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


@contextlib.contextmanager
def activated_kubeconfig(path: pathlib.Path) -> Iterator[None]:
    """Point every kubeconfig reader in this process at ``path``, and restore them afterwards.

    Setting ``$KUBECONFIG`` is not enough: the kubernetes client reads it once, at import, into
    ``KUBE_CONFIG_DEFAULT_LOCATION``, which kopf's login and a bare ``load_kube_config()`` use
    (K8S_TESTING.md §3, pitfall 2). The client's default Configuration is loaded too, so
    ``kubernetes.client.CoreV1Api()`` reaches the emulator.
    """
    kube_config, client = kubernetes.config.kube_config, kubernetes.client
    saved = (os.environ.get("KUBECONFIG"), kube_config.KUBE_CONFIG_DEFAULT_LOCATION,
             client.Configuration.get_default_copy())
    os.environ["KUBECONFIG"] = str(path)
    kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(path)
    kubernetes.config.load_kube_config(config_file=str(path))
    try:
        yield
    finally:
        if saved[0] is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = saved[0]
        kube_config.KUBE_CONFIG_DEFAULT_LOCATION = saved[1]
        client.Configuration.set_default(saved[2])


@contextlib.contextmanager
def running_fakekube(kube: FakeKube | None = None, *, kubeconfig: pathlib.Path | None = None,
                     user: str = "fakekube", activate: bool = True) -> Iterator[RunningFakeKube]:
    """Serve ``kube`` (a fresh FakeKube if none) on 127.0.0.1:<free port> from a background
    thread, with a kubeconfig (at ``kubeconfig``, else in a temporary directory) whose token is
    ``user``; with ``activate``, the process's kubeconfig readers point at it while inside."""
    kube = kube or FakeKube()
    with contextlib.ExitStack() as stack:
        if kubeconfig is None:
            kubeconfig = pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fakekube-")),
                                      "kubeconfig")
        server = _ServerThread(kube)
        url = server.start()
        stack.callback(server.stop)
        write_kubeconfig(kubeconfig, url, user=user)
        if activate:
            stack.enter_context(activated_kubeconfig(kubeconfig))
        yield RunningFakeKube(kube, url, kubeconfig)


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


async def _serve_forever(args: argparse.Namespace) -> None:
    kube = FakeKube(version=args.kube_version, bookmark_interval=args.bookmark_interval)
    runner, url = await start_server(kube, args.host, args.port)
    if args.kubeconfig:
        write_kubeconfig(pathlib.Path(args.kubeconfig), url)
    print(f"fakekube {kube.version.git_version} listening on {url}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        kube.end_watches()
        await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="In-memory Kubernetes API server emulator (for tests).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--kubeconfig", help="write a kubeconfig for the server here")
    parser.add_argument("--kube-version", default="v1.33.0", help="gitVersion that GET /version reports")
    parser.add_argument("--bookmark-interval", type=float, default=10.0)
    parser.add_argument("-v", "--verbose", action="store_true", help="log every request")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve_forever(args))


if __name__ == "__main__":
    main()
