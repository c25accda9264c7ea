"""Samples for the operator's pure modules: policies, sidecar reports, and the CRD's status
schema as a strict JSON schema (what the API server would accept, minus pruning: an unknown
field is an error here, where the server would drop it silently)."""

from __future__ import annotations

import copy
import pathlib
import re
from typing import Any

import jsonschema
import yaml

from cleaner.config import Policy, parse_policy

REPO = pathlib.Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((REPO / "crds" / "compactionpolicy.yaml").read_text())
STATUS_SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]

_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


def strict_json_schema(node: Any) -> Any:
    """The Kubernetes dialect of OpenAPI v3 as a strict draft-7 JSON schema."""
    if isinstance(node, list):
        return [strict_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: (v if k in ("default", "enum", "example") else strict_json_schema(v))
           for k, v in node.items() if not k.startswith("x-kubernetes-") and k not in ("description", "nullable")}
    if node.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    if node.get("exclusiveMinimum") is True:
        out["exclusiveMinimum"] = out.pop("minimum")
    if (out.get("type") == "object" and "properties" in out and "additionalProperties" not in out
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


FORMATS = jsonschema.FormatChecker()


@FORMATS.checks("date-time")
def _is_date_time(value: object) -> bool:
    return not isinstance(value, str) or bool(_RFC3339.match(value))


def status_errors(status: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(strict_json_schema(STATUS_SCHEMA), format_checker=FORMATS)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(status)]


def make_policy(name: str = "offsets", namespace: str = "kafka", generation: int = 3, **spec: Any) -> Policy:
    spec.setdefault("target", {"statefulSet": "kafka", "dataVolume": "data", "mountPath": "/var/lib/kafka",
                               "logDirs": ["data"]})
    return parse_policy({"apiVersion": "kafkacleaner.io/v1alpha1", "kind": "CompactionPolicy",
                         "metadata": {"name": name, "namespace": namespace, "generation": generation},
                         "spec": spec})


REPORT: dict[str, Any] = {
    "version": 1, "broker": "kafka-0", "mode": "observe", "policyGeneration": 3,
    "scannedAt": "2026-11-21T10:00:00Z",
    "logDirs": [{"path": "/var/lib/kafka/data", "partitions": 120, "lockHeldByBroker": True,
                 "freeBytes": 10_000_000, "uncleanablePartitions": 1}],
    "cleaner": {"threads": 1, "deadThreads": 0, "lastRunAt": None, "maxDirtyRatio": 0.62,
                "maxCompactionDelaySeconds": 12.5, "bytesReclaimedTotal": 1000, "stagedBytes": 50,
                "state": "observing"},
    "topics": [{"topic": "orders", "partitions": 12, "dirtyBytes": 100, "cleanableBytes": 400, "cleanBytes": 600,
                "maxDirtyRatio": 0.4, "tombstones": 3, "oldestTombstoneAgeSeconds": 10.0},
               {"topic": "__consumer_offsets", "partitions": 50, "dirtyBytes": 10, "cleanableBytes": 20,
                "cleanBytes": 30, "maxDirtyRatio": 0.62, "tombstones": 0, "oldestTombstoneAgeSeconds": None}],
    "partitions": [
        {"topic": "__consumer_offsets", "partition": 7, "logDir": "/var/lib/kafka/data", "firstDirtyOffset": 10,
         "cleanableRatio": 0.62, "cleanableBytes": 20, "eligible": True, "reason": "ratio",
         "lastCleanedAt": "2026-11-21T09:00:00+00:00", "uncleanableReason": None},
        {"topic": "orders", "partition": 3, "logDir": "/var/lib/kafka/data", "firstDirtyOffset": 0,
         "cleanableRatio": 0.4, "cleanableBytes": 400, "eligible": False, "reason": "uncleanable",
         "lastCleanedAt": None, "uncleanableReason": "corrupt batch at offset 17"},
    ],
    "errors": [{"at": "2026-11-21T09:59:00Z", "logDir": "/var/lib/kafka/data", "partition": "orders-3",
                "message": "corrupt batch at offset 17"}],
}


def make_report(broker: str = "kafka-0", *, partitions: int | None = None, **changes: Any) -> dict[str, Any]:
    """A valid v1 /status document; ``cleaner__state="error"`` changes a nested field."""
    report = copy.deepcopy(REPORT)
    report["broker"] = broker
    if partitions is not None:
        report["partitions"] = [
            {"topic": f"topic-{i % 50}", "partition": i, "logDir": "/var/lib/kafka/data", "firstDirtyOffset": i,
             "cleanableRatio": round((i % 997) / 997, 6), "cleanableBytes": i * 1000, "eligible": True,
             "reason": "ratio", "lastCleanedAt": "2026-11-21T09:00:00Z", "uncleanableReason": None}
            for i in range(partitions)]
    for key, value in changes.items():
        target = report
        *path, last = key.split("__")
        for part in path:
            target = target[part]
        target[last] = value
    return report
