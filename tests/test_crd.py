"""The CompactionPolicy CRD (crds/compactionpolicy.yaml) and its agreement with cleaner/config.py.

There is no API server here, so the tests emulate what it does with a custom resource, in its
order: prune nulls, apply the schema's defaults, validate against the structural schema (with
strict field validation, as ``kubectl apply`` does), then evaluate the CEL rules. The schema is
turned into a JSON schema for the ``jsonschema`` library; the few CEL rules are translated to
Python expressions. The tests then check that this emulated API server and ``parse_policy``
give the same verdict, on the examples, on bad resources, and on random specs.
"""

from __future__ import annotations

import copy
import dataclasses
import pathlib
import re
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cleaner import config
from cleaner.config import API_GROUP, KIND, Policy, parse_policy, spec_fields
from cleaner.errors import PolicyError
from cleaner.windows import CRON_PATTERN

REPO = pathlib.Path(__file__).resolve().parent.parent
CRD = yaml.safe_load((REPO / "crds" / "compactionpolicy.yaml").read_text())
VERSION = CRD["spec"]["versions"][0]
ROOT = VERSION["schema"]["openAPIV3Schema"]
SPEC = ROOT["properties"]["spec"]
STATUS = ROOT["properties"]["status"]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

#: The only objects allowed to keep unknown fields, and why (see the CRD's descriptions).
FREE_FORM = {"status.kopf"}  # kopf's own bookkeeping; its shape belongs to kopf


# ---------------------------------------------------------------------------------------------
# Walking the schema
# ---------------------------------------------------------------------------------------------


def schema_nodes(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node with its path: ``.name`` for properties, ``[]`` for items, ``.*`` for map values."""
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from schema_nodes(sub, f"{path}.{name}")
    if "items" in node:
        yield from schema_nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from schema_nodes(node["additionalProperties"], f"{path}.*")


def instances(node: dict[str, Any], value: Any, path: str) -> Iterator[tuple[str, dict[str, Any], Any]]:
    """Every (path, schema node, value) of a document, paths as PolicyError spells them."""
    yield path, node, value
    if isinstance(value, dict):
        for name, sub in node.get("properties", {}).items():
            if name in value:
                yield from instances(sub, value[name], f"{path}.{name}")
        if isinstance(node.get("additionalProperties"), dict):
            for key, item in value.items():
                yield from instances(node["additionalProperties"], item, f"{path}.{key}")
    if isinstance(value, list) and "items" in node:
        for index, item in enumerate(value):
            yield from instances(node["items"], item, f"{path}[{index}]")


# ---------------------------------------------------------------------------------------------
# An emulated API server: prune nulls, default, validate, CEL
# ---------------------------------------------------------------------------------------------


def prune_nulls(node: dict[str, Any], value: Any) -> Any:
    """Drop null values of non-nullable properties (the API server does this before defaulting)."""
    if isinstance(value, dict) and "properties" in node:
        out = {}
        for key, item in value.items():
            sub = node["properties"].get(key)
            if item is None and sub is not None and not sub.get("nullable"):
                continue
            out[key] = prune_nulls(sub, item) if sub is not None else item
        return out
    if isinstance(value, list) and "items" in node:
        return [prune_nulls(node["items"], item) for item in value]
    return value


def apply_defaults(node: dict[str, Any], value: Any) -> Any:
    """Structural defaulting: a missing property with a default gets it, then defaults below apply."""
    if isinstance(value, dict):
        value = dict(value)
        for name, sub in node.get("properties", {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = apply_defaults(sub, value[name])
        if isinstance(node.get("additionalProperties"), dict):
            for key in value:
                value[key] = apply_defaults(node["additionalProperties"], value[key])
    elif isinstance(value, list) and "items" in node:
        value = [apply_defaults(node["items"], item) for item in value]
    return value


def prune_unknown(node: dict[str, Any], value: Any) -> Any:
    """Structural pruning: unknown fields are dropped unless x-kubernetes-preserve-unknown-fields."""
    if isinstance(value, dict):
        if node.get("x-kubernetes-preserve-unknown-fields"):
            return value
        if "properties" in node:
            props = node["properties"]
            return {key: prune_unknown(props[key], item) for key, item in value.items() if key in props}
        if isinstance(node.get("additionalProperties"), dict):
            return {key: prune_unknown(node["additionalProperties"], item) for key, item in value.items()}
    if isinstance(value, list) and "items" in node:
        return [prune_unknown(node["items"], item) for item in value]
    return value


def to_jsonschema(node: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI v3 structural schema as Draft 7 JSON schema, with strict field validation."""
    if node.get("x-kubernetes-int-or-string"):
        string: dict[str, Any] = {"type": "string"}
        if "pattern" in node:
            string["pattern"] = node["pattern"]
        return {"anyOf": [{"type": "integer"}, string]}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {name: to_jsonschema(sub) for name, sub in value.items()}
        elif key == "items":
            out[key] = to_jsonschema(value)
        elif key == "additionalProperties":
            out[key] = to_jsonschema(value) if isinstance(value, dict) else value
        elif key in ("description", "default", "nullable", "exclusiveMinimum") or key.startswith("x-"):
            continue
        else:
            out[key] = value
    if node.get("exclusiveMinimum") is True:  # OpenAPI 3.0's boolean form
        out["exclusiveMinimum"] = out.pop("minimum")
    if node.get("type") == "integer" and node.get("format") == "int64":  # what JSON decoding allows
        out.setdefault("minimum", INT64_MIN)
        out.setdefault("maximum", INT64_MAX)
    if node.get("x-kubernetes-list-type") == "set":
        out["uniqueItems"] = True
    if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False  # kubectl's strict field validation
    if node.get("nullable"):
        out["type"] = [out["type"], "null"]
    return out


# Integers are integers: 1.0 is rejected (JSON schema would accept it), as parse_policy does.
StrictValidator = jsonschema.validators.extend(
    jsonschema.Draft7Validator,
    type_checker=jsonschema.Draft7Validator.TYPE_CHECKER.redefine(
        "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool)
    ),
)
SPEC_VALIDATOR = StrictValidator(to_jsonschema(SPEC))
ROOT_VALIDATOR = StrictValidator(to_jsonschema(ROOT))


class CelObject:
    """A CEL map/object: fields by attribute, missing ones raise (has() catches that)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getattr__(self, name: str) -> Any:
        try:
            return cel_value(self._data[name])
        except KeyError:
            raise AttributeError(name) from None

    def __len__(self) -> int:
        return len(self._data)


class CelString(str):
    def startsWith(self, prefix: str) -> bool:  # CEL's method name
        return self.startswith(prefix)

    def matches(self, regex: str) -> bool:
        return re.search(regex, self) is not None  # RE2 and Python agree on the rules' regexes


def cel_value(value: Any) -> Any:
    if isinstance(value, dict):
        return CelObject(value)
    if isinstance(value, str):
        return CelString(value)
    if isinstance(value, list):
        return [cel_value(item) for item in value]
    return value


def _has(getter: Any) -> bool:
    try:
        getter()
    except AttributeError:
        return False
    return True


#: A macro call of the CEL subset: ``<list>.all|exists|exists_one(<var>, <body>)`` on a field
#: path or a list literal.
_MACRO = re.compile(r"([\w.]+|\[[^\[\]]*\])\.(all|exists_one|exists)\((\w+),\s*")


def _macros(expr: str) -> str:
    """The list macros as Python generator expressions (innermost bodies translated too)."""
    while (match := _MACRO.search(expr)) is not None:
        depth, end = 1, match.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(expr[end], 0)
            end += 1
        receiver, name, var = match.groups()
        body = _macros(expr[match.end():end - 1])
        fn = {"all": "all", "exists": "any", "exists_one": "_one"}[name]
        expr = f"{expr[:match.start()]}{fn}(({body}) for {var} in {receiver}){expr[end:]}"
    return expr


def cel_to_python(rule: str) -> str:
    """Translate the CEL subset the CRD uses (has, size, &&, ||, !, ==, <=, *, methods, and the
    ``all``, ``exists`` and ``exists_one`` macros of lists) to Python."""
    expr = _macros(" ".join(rule.split()))
    expr = re.sub(r"has\(([\w.]+)\)", r"_has(lambda: \1)", expr)
    expr = expr.replace("&&", " and ").replace("||", " or ").replace(".startsWith(", ".startswith(")
    expr = re.sub(r"!(?!=)", " not ", expr)
    return re.sub(r"\bsize\(", "len(", expr)


def cel_holds(rule: str, value: Any) -> bool:
    try:
        scope = {"_has": _has, "len": len, "_one": lambda items: sum(1 for item in items if item) == 1,
                 "self": cel_value(value)}
        return bool(eval(cel_to_python(rule), scope))  # the CRD's own rules, translated
    except Exception:  # a runtime error fails the rule, as in the API server
        return False


def cel_errors(node: dict[str, Any], value: Any, path: str) -> list[str]:
    """Paths (with the rule's fieldPath) of the CEL rules that fail on a defaulted, valid object."""
    failed = []
    for where, sub, item in instances(node, value, path):
        for rule in sub.get("x-kubernetes-validations", []):
            if not cel_holds(rule["rule"], item):
                failed.append(where + rule.get("fieldPath", ""))
    return failed


def admit(spec: Any, *, path: str = "spec") -> list[str]:
    """What the emulated API server says about a spec: [] when admitted, else error paths."""
    spec = apply_defaults(SPEC, prune_nulls(SPEC, spec))
    errors = [
        path + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        + ("".join(f".{name}" for name in re.findall(r"'(\w+)' is a required property", error.message)))
        for error in SPEC_VALIDATOR.iter_errors(spec)
    ]
    # The server runs the CEL rules too and reports everything (a rule on a value of the wrong
    # type fails here, where the server would skip it: only extra paths, never a lost one).
    return errors + cel_errors(SPEC, spec, path)


def admit_manifest(document: dict[str, Any]) -> list[str]:
    """The same for a whole resource (metadata is ObjectMeta, which the server checks on its own)."""
    body = {key: value for key, value in document.items() if key != "metadata"}
    errors = [error.message for error in ROOT_VALIDATOR.iter_errors(apply_defaults(ROOT, prune_nulls(ROOT, body)))]
    return errors or admit(document.get("spec", {}))


def python_error(spec: Any) -> PolicyError | None:
    try:
        parse_policy(spec)
    except PolicyError as error:
        return error
    return None


# ---------------------------------------------------------------------------------------------
# The resource definition itself
# ---------------------------------------------------------------------------------------------


def test_names_scope_and_version() -> None:
    assert CRD["apiVersion"] == "apiextensions.k8s.io/v1" and CRD["kind"] == "CustomResourceDefinition"
    assert CRD["metadata"]["name"] == f"compactionpolicies.{API_GROUP}"
    spec = CRD["spec"]
    assert (spec["group"], spec["scope"]) == (API_GROUP, "Namespaced")
    assert spec["names"] == {
        "kind": KIND,
        "listKind": f"{KIND}List",
        "plural": "compactionpolicies",
        "singular": "compactionpolicy",
        "shortNames": ["cpol"],
    }
    assert [(v["name"], v["served"], v["storage"]) for v in spec["versions"]] == [("v1alpha1", True, True)]
    assert (VERSION["name"], config.API_VERSION) == ("v1alpha1", f"{API_GROUP}/v1alpha1")
    assert VERSION["subresources"] == {"status": {}}


@pytest.mark.parametrize("version", ["1.28.0", "1.37.0"])
def test_the_crd_is_a_valid_kubernetes_object(version: str) -> None:
    """Against Kubernetes' own OpenAPI schema, strictly; 1.28 is the oldest that knows CEL's fieldPath."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kubernetes_validate.validate(copy.deepcopy(CRD), version, strict=True)


def test_printer_columns() -> None:
    columns = {c["name"]: (c["type"], c["jsonPath"]) for c in VERSION["additionalPrinterColumns"]}
    assert columns["Mode"] == ("string", ".spec.mode")
    assert columns["Ready"] == ("string", '.status.conditions[?(@.type=="Ready")].status')
    assert columns["Reason"] == ("string", '.status.conditions[?(@.type=="Ready")].reason')
    assert columns["Max Dirty"] == ("number", ".status.summary.maxDirtyRatio")
    assert columns["Uncleanable"] == ("integer", ".status.summary.uncleanablePartitions")
    assert columns["Brokers"] == ("string", ".status.summary.brokers")
    assert columns["Age"] == ("date", ".metadata.creationTimestamp")
    # Every column points at a field the schema declares.
    for name, (kind, json_path) in columns.items():
        if json_path.startswith(".metadata"):
            continue
        node = ROOT
        for part in re.sub(r"\[\?.*?\]", "[]", json_path).strip(".").split("."):
            part, _, rest = part.partition("[")
            node = node["properties"][part]
            if rest:
                node = node["items"]
        assert node["type"] == kind, name


def test_schema_is_structural() -> None:
    """Every node has a type; no free-form objects except the documented one; no bare anyOf."""
    for path, node in schema_nodes(ROOT, ""):
        path = path.lstrip(".")
        if node.get("x-kubernetes-int-or-string"):
            assert "type" not in node, path
            continue
        assert "type" in node, path
        assert node.get("additionalProperties") is not True, path
        assert not ({"properties", "additionalProperties"} <= node.keys()), path
        assert not {"anyOf", "oneOf", "allOf", "not", "$ref"} & node.keys(), path
        if node["type"] == "object" and path:
            free = "properties" not in node and "additionalProperties" not in node
            preserves = node.get("x-kubernetes-preserve-unknown-fields", False)
            assert (free or preserves) == (path in FREE_FORM), path
            if path in FREE_FORM:
                assert preserves and "description" in node, path
        if node["type"] == "array":
            assert "items" in node, path
        assert "default" not in node or not path.startswith("status"), path
    assert "x-kubernetes-preserve-unknown-fields" not in ROOT
    assert "x-kubernetes-preserve-unknown-fields" not in STATUS


def test_status_is_declared() -> None:
    props = STATUS["properties"]
    assert {"observedGeneration", "conditions", "summary", "brokers", "topPartitions", "paused", "kopf"} <= set(
        props
    )
    conditions = props["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert set(conditions["items"]["properties"]) == {
        "type", "status", "reason", "message", "lastTransitionTime", "observedGeneration",
    }
    assert set(props["summary"]["properties"]) >= {
        "maxDirtyRatio", "uncleanablePartitions", "cleanableBytes", "stagedBytes",
        "brokersReporting", "brokersExpected", "brokers",
    }
    broker = props["brokers"]["additionalProperties"]
    assert broker["type"] == "object" and "reportedAt" in broker["properties"]
    assert props["topPartitions"]["maxItems"] == 200
    assert props["topPartitions"]["maxItems"] >= SPEC["properties"]["reporting"]["properties"][
        "topPartitions"]["maximum"]


def test_a_status_the_operator_would_write_is_valid() -> None:
    status = {
        "observedGeneration": 4,
        "paused": False,
        "conditions": [{"type": "Ready", "status": "True", "reason": "AllBrokersReporting", "message": "3/3",
                        "lastTransitionTime": "2025-01-01T00:00:00Z", "observedGeneration": 4}],
        "summary": {"maxDirtyRatio": 0.62, "uncleanablePartitions": 0, "cleanableBytes": 10, "stagedBytes": 0,
                    "brokersReporting": 3, "brokersExpected": 3, "brokers": "3/3"},
        "brokers": {"kafka-0": {"reportedAt": "2025-01-01T00:00:00Z", "policyGeneration": 4, "mode": "observe",
                                "state": "observing", "maxDirtyRatio": 0.62, "lastRunAt": None}},
        "topPartitions": [{"broker": "kafka-0", "topic": "orders", "partition": 3, "cleanableRatio": 0.62,
                           "eligible": True, "reason": None, "uncleanableReason": None}],
        "kopf": {"progress": {"reconcile": {"retries": 1}}, "dummy": "x"},
    }
    document = {"apiVersion": config.API_VERSION, "kind": KIND, "metadata": {"name": "p"}, "status": status}
    assert admit_manifest(document) == []
    assert prune_unknown(ROOT, document)["status"] == status  # nothing of it is pruned


# ---------------------------------------------------------------------------------------------
# The CRD and the Python model describe the same fields
# ---------------------------------------------------------------------------------------------

CONSTRAINTS = (
    "type", "format", "minimum", "maximum", "exclusiveMinimum", "enum", "pattern", "minLength",
    "maxLength", "minItems", "maxItems", "maxProperties", "nullable", "x-kubernetes-int-or-string",
    "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
)


def compare_kind(kind: Any, node: dict[str, Any], path: str, *, nullable: bool = False) -> None:
    python = dict(kind.openapi())
    if nullable:
        python["nullable"] = True
    crd = {key: node[key] for key in CONSTRAINTS if key in node}
    assert crd == python, path
    if hasattr(kind, "item"):
        compare_kind(kind.item, node["items"], f"{path}[]")
    elif hasattr(kind, "value"):
        compare_kind(kind.value, node["additionalProperties"], f"{path}.*")
    elif hasattr(kind, "cls"):
        compare_model(kind.cls, node, path)


def compare_model(cls: type, node: dict[str, Any], path: str) -> None:
    fields = spec_fields(cls)
    assert [spec.key for _f, spec in fields] == list(node["properties"]), f"{path}: fields differ"
    required = sorted(spec.key for _f, spec in fields if spec.required)
    assert required == sorted(node.get("required", [])), f"{path}: required fields differ"
    for f, spec in fields:
        sub = node["properties"][spec.key]
        compare_kind(spec.kind, sub, f"{path}.{spec.key}", nullable=spec.nullable)
        dumped = None if f.default is dataclasses.MISSING or f.default is None else spec.kind.dump(f.default)
        if dumped is not None and not (spec.omit_empty and not f.default):
            assert "default" in sub, f"{path}.{spec.key}: the CRD has no default"
            expected = dumped if not isinstance(dumped, dict) else {}
            assert sub["default"] == expected, f"{path}.{spec.key}"
            assert type(sub["default"]) is type(expected), f"{path}.{spec.key}: {sub['default']!r}"
        else:
            assert "default" not in sub, f"{path}.{spec.key}: the model has no default"
        if spec.kafka:
            assert spec.kafka in sub["description"], f"{path}.{spec.key}: name Kafka's {spec.kafka}"


def test_every_model_field_is_in_the_crd_and_the_other_way_round() -> None:
    """Same names, order, types, formats, bounds, enums, patterns, required fields and defaults."""
    compare_model(Policy, SPEC, "spec")


def test_crd_defaults_equal_the_python_defaults() -> None:
    """Defaulting an empty resource gives exactly the model's canonical dump of an empty spec."""
    assert apply_defaults(SPEC, {}) == parse_policy({}).to_spec_dict()
    rule = {"match": "orders"}
    assert apply_defaults(SPEC, {"topics": [rule]}) == parse_policy({"topics": [rule]}).to_spec_dict()
    assert apply_defaults(ROOT, {})["spec"] == parse_policy({}).to_spec_dict()
    assert apply_defaults(SPEC, {"sidecar": {"image": "x"}})["sidecar"] == {"image": "x", "port": 9410}


def test_every_spec_field_has_a_description() -> None:
    for path, node in schema_nodes(SPEC, "spec"):
        if path.count(".") <= 2 and not path.endswith((".*", "[]")) and "securityContext." not in path:
            assert node.get("description"), path


# ---------------------------------------------------------------------------------------------
# CEL rules: present where the cross-field checks are, and the same verdict as parse_policy
# ---------------------------------------------------------------------------------------------

TARGET = {"statefulSet": "kafka", "dataVolume": "data", "mountPath": "/var/lib/kafka", "logDirs": ["data"]}
SELECTED = {"dataVolume": "data", "mountPath": "/var/lib/kafka", "logDirs": ["data"],
            "podSelector": {"matchLabels": {"app": "kafka"}}}


def selector(**fields: Any) -> dict[str, Any]:
    return {"target": {**SELECTED, "podSelector": fields}}


def expressions(*entries: dict[str, Any]) -> dict[str, Any]:
    return selector(matchExpressions=list(entries))


def security(**fields: Any) -> dict[str, Any]:
    return {"sidecar": {"securityContext": fields}}


SC = "spec.sidecar.securityContext"
#: The data mounts stay clear of the sidecar's own paths (cleaner.config.RESERVED_MOUNT_PATHS).
RESERVED_MOUNT_RULE = ("!['/etc/kafka-cleaner', '/opt/kafka-cleaner', '/var/run/secrets/kubernetes.io/serviceaccount']"
                       ".exists(r, self == r || self.startsWith(r + '/') || r.startsWith(self + '/'))")

#: (schema location, rule, valid spec, invalid spec, the field both report for the invalid one)
CEL_RULES = [
    (
        "spec",
        "self.mode != 'stage' || !has(self.target) || has(self.target.injection)",
        {"mode": "stage", "target": {**TARGET, "injection": "statefulSet"}},
        {"mode": "stage", "target": TARGET},
        "spec.target.injection",
    ),
    (
        "spec.topics[]",
        "self.minCompactionLagMs <= self.maxCompactionLagMs",
        {"topics": [{"match": "a", "minCompactionLagMs": 5, "maxCompactionLagMs": 5}]},
        {"topics": [{"match": "a"}, {"match": "b", "minCompactionLagMs": 6, "maxCompactionLagMs": 5}]},
        "spec.topics[1].minCompactionLagMs",
    ),
    (
        "spec.cleaner",
        "!has(self.dedupeBufferSize) || !has(self.threads) || self.dedupeBufferSize >= self.threads * 1024",
        {"cleaner": {"threads": 2, "dedupeBufferSize": 2048}},
        {"cleaner": {"threads": 3, "dedupeBufferSize": 2048}},
        "spec.cleaner.dedupeBufferSize",
    ),
    (
        "spec.target",
        "has(self.statefulSet) != has(self.podSelector)",
        {"target": SELECTED},
        {"target": {**SELECTED, "statefulSet": "kafka"}},
        "spec.target",
    ),
    (
        "spec.target",
        "!has(self.additionalDataVolumes) || self.additionalDataVolumes.all(v, v.name != self.dataVolume && "
        "v.mountPath != self.mountPath)",
        {"target": {**TARGET, "additionalDataVolumes": [{"name": "data-1", "mountPath": "/var/lib/kafka-1"}]}},
        {"target": {**TARGET, "additionalDataVolumes": [{"name": "data-1", "mountPath": "/var/lib/kafka-1"},
                                                        {"name": "data-2", "mountPath": "/var/lib/kafka"}]}},
        "spec.target.additionalDataVolumes",
    ),
    # What the sidecar itself needs: its policy volume's name, its mounts and its program.
    (
        "spec.target.dataVolume",
        "self != 'kafka-cleaner-policy'",
        {"target": {**TARGET, "dataVolume": "kafka-cleaner-policy-data"}},
        {"target": {**TARGET, "dataVolume": "kafka-cleaner-policy"}},
        "spec.target.dataVolume",
    ),
    (
        "spec.target.mountPath",
        RESERVED_MOUNT_RULE,
        {"target": {**TARGET, "mountPath": "/etc/kafka-cleaner-data"}},
        {"target": {**TARGET, "mountPath": "/var/run/secrets"}},
        "spec.target.mountPath",
    ),
    (
        "spec.target.additionalDataVolumes",
        "self.all(v, self.exists_one(w, w.mountPath == v.mountPath))",
        {"target": {**TARGET, "additionalDataVolumes": [{"name": "d1", "mountPath": "/d/1"},
                                                        {"name": "d2", "mountPath": "/d/2"}]}},
        {"target": {**TARGET, "additionalDataVolumes": [{"name": "d1", "mountPath": "/d/1"},
                                                        {"name": "d2", "mountPath": "/d/1"}]}},
        "spec.target.additionalDataVolumes",
    ),
    (
        "spec.target.additionalDataVolumes[].name",
        "self != 'kafka-cleaner-policy'",
        {"target": {**TARGET, "additionalDataVolumes": [{"name": "d1", "mountPath": "/d/1"}]}},
        {"target": {**TARGET, "additionalDataVolumes": [{"name": "d1", "mountPath": "/d/1"},
                                                        {"name": "kafka-cleaner-policy", "mountPath": "/d/2"}]}},
        "spec.target.additionalDataVolumes[1].name",
    ),
    (
        "spec.target.additionalDataVolumes[].mountPath",
        RESERVED_MOUNT_RULE,
        {"target": {**TARGET, "additionalDataVolumes": [{"name": "d1", "mountPath": "/opt/kafka"}]}},
        {"target": {**TARGET, "additionalDataVolumes": [{"name": "d1", "mountPath": "/opt/kafka-cleaner/x"}]}},
        "spec.target.additionalDataVolumes[0].mountPath",
    ),
    (
        "spec.target",
        "!has(self.injection) || self.injection != 'statefulSet' || has(self.statefulSet)",
        {"target": {**TARGET, "injection": "statefulSet"}},
        {"target": {**SELECTED, "injection": "statefulSet"}},
        "spec.target.injection",
    ),
    (
        "spec.target.podSelector",
        "(has(self.matchLabels) && size(self.matchLabels) > 0) || "
        "(has(self.matchExpressions) && size(self.matchExpressions) > 0)",
        selector(matchExpressions=[{"key": "app", "operator": "Exists"}]),
        selector(matchLabels={}),
        "spec.target.podSelector",
    ),
    (
        "spec.target.podSelector.matchExpressions[]",
        "(self.operator == 'In' || self.operator == 'NotIn') == (has(self.values) && size(self.values) > 0)",
        expressions({"key": "a", "operator": "NotIn", "values": ["x"]}, {"key": "b", "operator": "DoesNotExist"}),
        expressions({"key": "a", "operator": "In", "values": ["x"]}, {"key": "b", "operator": "In", "values": []}),
        "spec.target.podSelector.matchExpressions[1].values",
    ),
    (
        "spec.target.logDirs[]",
        "!self.startsWith('/') && !self.matches('(^|/)[.][.](/|$)')",
        {"target": {**TARGET, "logDirs": [".", "kafka-log*", "a..b/c", "..d"]}},
        {"target": {**TARGET, "logDirs": ["data", "x/../y"]}},
        "spec.target.logDirs[1]",
    ),
    # The sidecar's securityContext, held to Pod Security "restricted" (one rule per field).
    (f"{SC}.allowPrivilegeEscalation", "!self", security(allowPrivilegeEscalation=False),
     security(allowPrivilegeEscalation=True), f"{SC}.allowPrivilegeEscalation"),
    (f"{SC}.appArmorProfile.type", "self != 'Unconfined'",
     security(appArmorProfile={"type": "Localhost", "localhostProfile": "k8s-kafka"}),
     security(appArmorProfile={"type": "Unconfined"}), f"{SC}.appArmorProfile.type"),
    (f"{SC}.capabilities.add[]", "self == 'NET_BIND_SERVICE'", security(capabilities={"add": ["NET_BIND_SERVICE"]}),
     security(capabilities={"add": ["NET_BIND_SERVICE", "SYS_ADMIN"]}), f"{SC}.capabilities.add[1]"),
    (f"{SC}.capabilities.drop", "size(self) == 0 || 'ALL' in self", security(capabilities={"drop": ["NET_RAW", "ALL"]}),
     security(capabilities={"drop": ["NET_RAW"]}), f"{SC}.capabilities.drop"),
    (f"{SC}.privileged", "!self", security(privileged=False), security(privileged=True), f"{SC}.privileged"),
    (f"{SC}.procMount", "self == 'Default'", security(procMount="Default"), security(procMount="Unmasked"),
     f"{SC}.procMount"),
    (f"{SC}.runAsNonRoot", "self", security(runAsNonRoot=True, runAsUser=1001), security(runAsNonRoot=False),
     f"{SC}.runAsNonRoot"),
    (f"{SC}.runAsUser", "self != 0", security(runAsUser=1000, runAsGroup=0), security(runAsUser=0),
     f"{SC}.runAsUser"),
    (f"{SC}.seLinuxOptions.user", "self == ''", security(seLinuxOptions={"user": "", "level": "s0:c1,c2"}),
     security(seLinuxOptions={"user": "system_u"}), f"{SC}.seLinuxOptions.user"),
    (f"{SC}.seLinuxOptions.role", "self == ''", security(seLinuxOptions={"role": ""}),
     security(seLinuxOptions={"role": "system_r"}), f"{SC}.seLinuxOptions.role"),
    (f"{SC}.seLinuxOptions.type", "self in ['', 'container_t', 'container_init_t', 'container_kvm_t']",
     security(seLinuxOptions={"type": "container_init_t"}), security(seLinuxOptions={"type": "spc_t"}),
     f"{SC}.seLinuxOptions.type"),
    (f"{SC}.seccompProfile.type", "self != 'Unconfined'", security(seccompProfile={"type": "RuntimeDefault"}),
     security(seccompProfile={"type": "Unconfined"}), f"{SC}.seccompProfile.type"),
]


def crd_rules() -> set[tuple[str, str]]:
    return {
        (path, " ".join(rule["rule"].split()))
        for path, node in schema_nodes(SPEC, "spec")
        for rule in node.get("x-kubernetes-validations", [])
    }


def test_the_cel_rules_are_the_cross_field_checks() -> None:
    assert crd_rules() == {(where, rule) for where, rule, *_ in CEL_RULES}
    for _path, node in schema_nodes(ROOT, ""):
        for rule in node.get("x-kubernetes-validations", []):
            assert rule.get("message"), rule


@pytest.mark.parametrize(("where", "rule", "valid", "invalid", "field"), CEL_RULES,
                         ids=[f"{r[0]}:{r[4]}" for r in CEL_RULES])
def test_cel_rule_and_parse_policy_agree(
    where: str, rule: str, valid: dict[str, Any], invalid: dict[str, Any], field: str
) -> None:
    assert admit(valid) == []
    assert python_error(valid) is None
    assert admit(invalid) == [field]
    error = python_error(invalid)
    assert error is not None and error.field == field


def test_cel_rules_are_bounded_for_the_cost_estimator() -> None:
    """Kubernetes rejects CEL rules whose cost it cannot bound: lists, maps and strings they reach need limits."""
    for path, node in schema_nodes(SPEC, "spec"):
        if not node.get("x-kubernetes-validations"):
            continue
        for sub_path, sub in schema_nodes(node, path):
            kind = sub.get("type")
            if kind == "string":
                assert "maxLength" in sub or "enum" in sub, sub_path
            elif kind == "array":
                assert "maxItems" in sub, sub_path
            elif kind == "object" and "additionalProperties" in sub:
                assert "maxProperties" in sub, sub_path


def test_the_python_only_checks_are_the_regex_and_the_cron_semantics() -> None:
    """The API server cannot compile Python regexes nor parse cron expressions (it checks
    their shape), nor compare a request with its limit: the places where the verdicts differ."""
    for spec in ({"topics": [{"match": "("}]}, {"compact": {"windows": ["* * 25 ? * *"]}},
                 # CEL's quantity() is not there for new CRDs on Kubernetes 1.28 (the chart's oldest)
                 {"sidecar": {"resources": {"requests": {"memory": "1Gi"}, "limits": {"memory": "512Mi"}}}}):
        assert admit(spec) == []
        assert python_error(spec) is not None


# ---------------------------------------------------------------------------------------------
# Examples and bad resources
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_valid_resources(path: pathlib.Path) -> None:
    document = yaml.safe_load(path.read_text())
    if "apiVersion" in document:
        assert document["kind"] == KIND and document["metadata"]["name"]
        assert admit_manifest(document) == []
    else:
        assert admit(document) == []  # a bare spec, for the CLI
    assert python_error(document) is None
    # Defaulting by the API server and by the model agree on the example too.
    spec = document.get("spec", document) if "apiVersion" in document else document
    assert parse_policy(apply_defaults(SPEC, spec)) == parse_policy(document)


def test_there_are_the_examples_the_readme_lists() -> None:
    names = {p.name for p in EXAMPLES}
    assert names == {"observe-cluster.yaml", "compact-consumer-offsets-offline.yaml",
                     "stage-one-topic.yaml", "policy-local.yaml"}
    readme = (REPO / "examples" / "README.md").read_text()
    assert all(name in readme for name in names)
    modes = {p.name: parse_policy(yaml.safe_load(p.read_text())).mode for p in EXAMPLES}
    assert modes["observe-cluster.yaml"] == "observe"
    assert modes["stage-one-topic.yaml"] == "stage"
    assert modes["compact-consumer-offsets-offline.yaml"] == "compact"


BAD_RESOURCES = [
    ({"mode": "fast"}, "spec.mode"),
    ({"mode": "Observe"}, "spec.mode"),
    ({"topics": [{"match": "a", "minCleanableDirtyRatio": -0.5}]}, "spec.topics[0].minCleanableDirtyRatio"),
    ({"topics": [{"match": "a", "minCleanableDirtyRatio": 2}]}, "spec.topics[0].minCleanableDirtyRatio"),
    ({"topics": [{"match": "a", "cleanupPolicy": "compacted"}]}, "spec.topics[0].cleanupPolicy"),
    ({"topics": [{"match": "a", "segmentBytes": "1Gi"}]}, "spec.topics[0].segmentBytes"),
    ({"topics": [{"match": "a", "segmentBytes": 1.0e9}]}, "spec.topics[0].segmentBytes"),
    ({"topics": [{"match": "a", "segmentBytes": 2**31}]}, "spec.topics[0].segmentBytes"),
    ({"topics": [{"match": "a", "retentionMs": -2}]}, "spec.topics[0].retentionMs"),
    ({"topics": [{"match": "a", "maxCompactionLagMs": 2**63}]}, "spec.topics[0].maxCompactionLagMs"),
    ({"topics": [{"match": "a", "perPartitionMetrics": "true"}]}, "spec.topics[0].perPartitionMetrics"),
    ({"topics": [{"cleanupPolicy": "compact"}]}, "spec.topics[0].match"),
    ({"topics": "orders"}, "spec.topics"),
    ({"cleaner": {"threads": True}}, "spec.cleaner.threads"),
    ({"cleaner": {"dedupeBufferLoadFactor": 0}}, "spec.cleaner.dedupeBufferLoadFactor"),
    ({"cleaner": {"maxIoBytesPerSecond": -1}}, "spec.cleaner.maxIoBytesPerSecond"),
    ({"stage": {"minFreeDiskRatio": 1.5}}, "spec.stage.minFreeDiskRatio"),
    ({"sidecar": {"port": 0}}, "spec.sidecar.port"),
    ({"sidecar": {"resources": {"requests": {"memory": "a lot"}}}}, "spec.sidecar.resources.requests.memory"),
    ({"reporting": {"topPartitions": 500}}, "spec.reporting.topPartitions"),
    ({"target": {**TARGET, "injection": "sidecar"}}, "spec.target.injection"),
    ({"target": {**TARGET, "logDirs": []}}, "spec.target.logDirs"),
    ({"target": {**TARGET, "logDirs": ["a", "a"]}}, "spec.target.logDirs"),
    ({"target": {**TARGET, "mountPath": "data"}}, "spec.target.mountPath"),
    ({"target": {**TARGET, "mountPath": "/var/lib/kafka/"}}, "spec.target.mountPath"),
    ({"target": {**TARGET, "mountPath": "/var/lib/./kafka"}}, "spec.target.mountPath"),
    ({"target": {**TARGET, "mountPath": "/etc/kafka-cleaner"}}, "spec.target.mountPath"),
    ({"target": {**TARGET, "mountPath": "/etc"}}, "spec.target.mountPath"),
    ({"target": {**TARGET, "additionalDataVolumes": [{"name": "a", "mountPath": "/x"},
                                                    {"name": "b", "mountPath": "/x"}]}},
     "spec.target.additionalDataVolumes"),
    ({"sidecar": {"resources": {"limits": {"cpu": "-1"}}}}, "spec.sidecar.resources.limits.cpu"),
    ({"target": {k: v for k, v in TARGET.items() if k != "dataVolume"}}, "spec.target.dataVolume"),
    ({"paused": "no"}, "spec.paused"),
    # Unknown fields: rejected under strict field validation (kubectl apply), pruned otherwise.
    ({"foo": 1}, "spec"),
    ({"topics": [{"match": "a", "minCleanableRatio": 0.1}]}, "spec.topics[0]"),
    ({"cleaner": {"numThreads": 2}}, "spec.cleaner"),
    ({"sidecar": {"securityContext": {"windowsOptions": {}}}}, "spec.sidecar.securityContext"),
]


@pytest.mark.parametrize(("spec", "field"), BAD_RESOURCES, ids=[f"{i}:{b[1]}" for i, b in enumerate(BAD_RESOURCES)])
def test_bad_resources_are_rejected_by_both(spec: dict[str, Any], field: str) -> None:
    errors = admit(spec)
    assert errors, "the CRD accepted it"
    assert any(e == field or e.startswith(field + "[") for e in errors), errors
    error = python_error(spec)
    assert error is not None, "parse_policy accepted it"
    assert error.field == field or error.field.startswith((field + ".", field + "[")), (error.field, field)
    document = {"apiVersion": config.API_VERSION, "kind": KIND, "metadata": {"name": "p"}, "spec": spec}
    assert admit_manifest(document)


def test_unknown_fields_are_pruned_without_strict_validation() -> None:
    document = {"mode": "compact", "foo": 1, "topics": [{"match": "a", "bar": 2}], "cleaner": {"x": 1},
                "sidecar": {"securityContext": {"runAsUser": 1, "windowsOptions": {"hostProcess": True}}}}
    pruned = prune_unknown(SPEC, document)
    assert pruned == {"mode": "compact", "topics": [{"match": "a"}], "cleaner": {},
                      "sidecar": {"securityContext": {"runAsUser": 1}}}
    assert admit(pruned) == []
    with pytest.raises(PolicyError, match="unknown field 'foo'"):
        parse_policy(document)


def test_the_emulated_server_is_strict_about_integers_like_the_model() -> None:
    assert admit({"cleaner": {"threads": 2.0}}) == ["spec.cleaner.threads"]
    assert python_error({"cleaner": {"threads": 2.0}}) is not None


# ---------------------------------------------------------------------------------------------
# Property: on random near-valid specs, the emulated API server and parse_policy agree
# ---------------------------------------------------------------------------------------------

PATTERN_EXAMPLES: dict[str, list[str]] = {
    config.DNS1123_SUBDOMAIN: ["kafka", "kafka-controller", "a.b", "Kafka", "-x", "", "a_b"],
    config.DNS1123_LABEL: ["data", "data-0", "Data", "a.b", ""],
    config.LABEL_VALUE: ["true", "my-cluster", "", "-bad", "a" * 63, "a b"],
    config.CLEANUP_POLICY_PATTERN: ["compact", "delete", "compact,delete", "Delete, COMPACT", "compact,compact",
                                    "nope", "compact;delete", "", "compact,delete,compact"],
    config.MOUNT_PATH_PATTERN: ["/bitnami/kafka", "/", "relative", "/x", "/var/lib/kafka/", "/a//b", "/a/./b",
                                "/a/..", "/.hidden", "/..x", "/etc/kafka-cleaner", "/var/run", "/opt/kafka-cleaner/b"],
    # Only expressions both accept or both reject: the cron semantics are Python-only.
    CRON_PATTERN: ["* * 0-1 ? * SUN,MON,TUE,WED,THU,FRI,SAT", "0 0/15 * ? * MON-FRI", "0 0 2 1 * ? 2030",
                   "x", "* * * ? *", "* * * ? * * * *", "* * 0-1 ? * MON;TUE", ""],
}
STRING_EXAMPLES: dict[str, list[str]] = {
    "spec.topics[].match": ["orders-.*", "a|ab", ".*", "__consumer_offsets", ""],
    "spec.target.logDirs[]": ["data", ".", "kafka-log*", "/abs", "../x", "a/../b", "a..b", "", "a/b", "..."],
}
BORING_STRINGS = ["x", "RuntimeDefault", "In", "", "ALL"]


def mostly(good: st.SearchStrategy[Any], odd: list[Any]) -> st.SearchStrategy[Any]:
    """Usually ``good``; one draw in eight from the boundary and wrong-typed ``odd`` values."""
    return st.integers(0, 7).flatmap(lambda n: st.sampled_from(odd) if n == 0 else good)


def values(node: dict[str, Any], path: str) -> st.SearchStrategy[Any]:
    """Mostly valid values of a schema node, with boundary and wrong-typed ones mixed in."""
    if node.get("x-kubernetes-int-or-string"):
        return mostly(st.sampled_from(["500m", "1Gi", "2", 3, "1.5"]), [-1, "bogus", 1.5, True, None, "1 Gi"])
    kind = node["type"]
    if kind == "integer":
        low, high = node.get("minimum"), node.get("maximum")
        bounds = [v for v in (low, high) if v is not None]
        inside = st.integers(low if low is not None else -(2**63), high if high is not None else 2**63 - 1)
        edges = [*bounds, *(b - 1 for b in bounds), *(b + 1 for b in bounds), 0, 1, 2**31, 2**63 - 1, 2**63]
        return mostly(st.one_of(inside, st.sampled_from(bounds or [0])), [*edges, True, 1.5, 3.0, "7", None])
    if kind == "number":
        inside = st.floats(node.get("minimum", -1e12), node.get("maximum", 1e12), allow_nan=False)
        return mostly(inside, [0, 1, 0.5, -0.1, 1.1, 1e9, True, "0.5", None])
    if kind == "boolean":
        return mostly(st.booleans(), [1, "true", None])
    if kind == "string":
        if "enum" in node:
            return mostly(st.sampled_from(node["enum"]), ["bogus", node["enum"][0].upper(), 1, None])
        examples = PATTERN_EXAMPLES.get(node.get("pattern", ""), STRING_EXAMPLES.get(path, BORING_STRINGS))
        odd: list[Any] = [5, None]
        if "maxLength" in node and node["maxLength"] < 100:
            odd.append("a" * (node["maxLength"] + 1))
        return mostly(st.sampled_from(examples), odd)
    if kind == "array":
        return mostly(st.lists(values(node["items"], f"{path}[]"), max_size=3), ["x", None])
    if "properties" in node:
        props = {name: values(sub, f"{path}.{name}") for name, sub in node["properties"].items()}
        required = {name: props.pop(name) for name in node.get("required", [])}  # may still draw null
        return mostly(st.fixed_dictionaries(required, optional=props), [[], None, "x"])
    keys = st.sampled_from(["app", "strimzi.io/cluster", "cpu", "memory"])
    return mostly(st.dictionaries(keys, values(node["additionalProperties"], f"{path}.*"), max_size=3), [[]])


@settings(max_examples=400)
@given(values(SPEC, "spec").filter(lambda spec: isinstance(spec, dict)))
@example(  # a Python-only error first, and type errors the server reports instead (a CI flake)
    spec={"mode": "observe", "paused": 1, "rollout": [], "reporting": [],
          "sidecar": {"resources": {"limits": {"cpu": -1}, "requests": {"cpu": "500m"}}}},
)
def test_api_server_and_parse_policy_agree_on_random_specs(spec: dict[str, Any]) -> None:
    server = admit(spec)
    error = python_error(spec)
    if error is not None and "is above the limit" in error.message:
        # Python only (test_the_python_only_checks_are_the_regex_and_the_cron_semantics): the
        # server admits the spec or refuses it for another field; nothing here to compare.
        return
    assert (server == []) == (error is None), (server, error)
    if error is not None:
        # The model reports its first error; the server reports all: the first is among them.
        assert any(error.field == e or error.field.startswith(e) or e.startswith(error.field) for e in server), (
            error.field, server,
        )
