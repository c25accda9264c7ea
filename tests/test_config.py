"""The CompactionPolicy model (cleaner/config.py): defaults, rule matching, validation, round trips."""

from __future__ import annotations

import copy
import dataclasses
import pathlib
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from cleaner.config import (
    API_VERSION,
    KIND,
    CleanerConfig,
    CleanupPolicy,
    FrozenMap,
    Injection,
    Mode,
    Policy,
    ReportingConfig,
    SidecarConfig,
    StageConfig,
    TopicRule,
    load_policy,
    parse_policy,
    parse_policy_text,
    sidecar_memory_needed,
    spec_fields,
    walk_model,
)
from cleaner.errors import PolicyError

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
LONG_MAX = 9223372036854775807

TARGET = {"statefulSet": "kafka", "dataVolume": "data", "mountPath": "/var/lib/kafka", "logDirs": ["data"]}


def rule(**fields: Any) -> dict[str, Any]:
    return {"match": "t", **fields}


def error_of(spec: Any) -> PolicyError:
    with pytest.raises(PolicyError) as info:
        parse_policy(spec)
    return info.value


# ---------------------------------------------------------------------------------------------
# Defaults: Kafka's
# ---------------------------------------------------------------------------------------------


def test_empty_spec_has_kafka_defaults() -> None:
    policy = parse_policy({})
    assert policy.mode is Mode.OBSERVE
    assert policy.topics == ()
    assert policy.target is None
    assert policy.paused is False
    cleaner = policy.cleaner
    assert (cleaner.threads, cleaner.dedupe_buffer_size, cleaner.dedupe_buffer_load_factor) == (1, 134217728, 0.9)
    assert (cleaner.io_buffer_size, cleaner.max_io_bytes_per_second) == (524288, None)
    assert (cleaner.backoff_ms, cleaner.producer_id_expiration_ms) == (15000, 86400000)
    assert policy.stage.min_free_disk_ratio == 0.2
    assert policy.sidecar == SidecarConfig(image=None, resources=None, port=9410, security_context=None)
    assert policy.reporting == ReportingConfig(interval_seconds=30, top_partitions=20, max_partition_series=1000)


def test_topic_rule_has_kafka_topic_defaults() -> None:
    (topic,) = parse_policy({"topics": [{"match": "orders"}]}).topics
    assert topic.cleanup_policy is CleanupPolicy.DELETE
    assert (topic.compact, topic.delete) == (False, True)
    assert topic.min_cleanable_dirty_ratio == 0.5
    assert topic.delete_retention_ms == 86_400_000
    assert topic.min_compaction_lag_ms == 0
    assert topic.max_compaction_lag_ms == LONG_MAX
    assert topic.segment_bytes == 1_073_741_824
    assert topic.segment_index_bytes == 10_485_760
    assert topic.index_interval_bytes == 4096
    assert topic.max_message_bytes == 1_048_588
    assert topic.retention_ms == 604_800_000
    assert topic.retention_bytes == -1
    assert topic.per_partition_metrics is False


def test_cleaner_per_thread_sizes_follow_kafka() -> None:
    cleaner = CleanerConfig(threads=4, dedupe_buffer_size=400 * 2**20, io_buffer_size=2**20)
    assert cleaner.dedupe_buffer_per_thread == 100 * 2**20
    assert cleaner.io_buffer_per_thread == 2**20 // 4 // 2
    # Kafka caps one thread's offset map at Int.MaxValue bytes.
    assert CleanerConfig(dedupe_buffer_size=2**40).dedupe_buffer_per_thread == 2**31 - 1


def model_classes(cls: type = Policy) -> list[type]:
    """Policy and every model class reachable from it."""
    found = [cls]
    for _f, spec in spec_fields(cls):
        kind = spec.kind
        while hasattr(kind, "item") or hasattr(kind, "value"):
            kind = getattr(kind, "item", None) or kind.value
        if hasattr(kind, "cls") and kind.cls not in found:
            found += [c for c in model_classes(kind.cls) if c not in found]
    return found


def test_model_attribute_names_are_the_snake_case_of_the_keys() -> None:
    classes = model_classes()
    assert {TopicRule, CleanerConfig, StageConfig, SidecarConfig, ReportingConfig} <= set(classes)
    for cls in classes:
        for f, spec in spec_fields(cls):
            assert f.name == "".join(f"_{c.lower()}" if c.isupper() else c for c in spec.key), spec.key


def test_walk_model_lists_every_field_once() -> None:
    paths = [path for path, _spec, _default in walk_model()]
    assert len(paths) == len(set(paths))
    assert "spec.topics[].minCleanableDirtyRatio" in paths
    assert "spec.target.podSelector.matchExpressions[].values" in paths
    assert "spec.sidecar.securityContext.seccompProfile.type" in paths


# ---------------------------------------------------------------------------------------------
# Rule matching: first whole-name match wins; unmatched topics are never touched
# ---------------------------------------------------------------------------------------------

RULES = {
    "topics": [
        {"match": "orders", "cleanupPolicy": "compact", "minCleanableDirtyRatio": 0.1},
        {"match": "orders-.*", "cleanupPolicy": "compact", "minCleanableDirtyRatio": 0.2},
        {"match": "orders-eu|.*-changelog", "minCleanableDirtyRatio": 0.3},
        {"match": "__consumer_offsets", "cleanupPolicy": "compact", "minCleanableDirtyRatio": 0.4},
    ]
}


@pytest.mark.parametrize(
    ("topic", "ratio"),
    [
        ("orders", 0.1),
        ("orders-us", 0.2),
        ("orders-eu", 0.2),  # rule 2 matches first; rule 3 also would
        ("app-changelog", 0.3),
        ("__consumer_offsets", 0.4),
        ("order", None),  # no partial match of "orders"
        ("orders2", None),  # "orders" must match the whole name
        ("xorders-1", None),  # nor a suffix
        ("app-changelog-x", None),
        ("__consumer_offsets_", None),
        ("", None),
    ],
)
def test_rule_for_takes_the_first_whole_name_match(topic: str, ratio: float | None) -> None:
    found = parse_policy(RULES).rule_for(topic)
    assert (found.min_cleanable_dirty_ratio if found else None) == ratio


def test_alternation_matches_whole_name_not_first_branch() -> None:
    # re.match("a|ab", "ab") would stop at "a"; fullmatch tries the other branch.
    policy = parse_policy({"topics": [{"match": "a|ab"}]})
    assert policy.rule_for("ab") is not None
    assert policy.topics[0].matches("a") and not policy.topics[0].matches("abc")


def test_no_rules_touch_nothing() -> None:
    assert parse_policy({}).rule_for("anything") is None


# ---------------------------------------------------------------------------------------------
# cleanupPolicy: Kafka's list, normalised
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "canonical", "compact", "delete"),
    [
        ("compact", "compact", True, False),
        ("delete", "delete", False, True),
        ("compact,delete", "compact,delete", True, True),
        ("delete,compact", "compact,delete", True, True),
        ("Delete, COMPACT", "compact,delete", True, True),
        ("  compact  ", "compact", True, False),
        ("COMPACT , delete", "compact,delete", True, True),
        ("compact,compact", "compact", True, False),
    ],
)
def test_cleanup_policy_is_normalised(written: str, canonical: str, compact: bool, delete: bool) -> None:
    (topic,) = parse_policy({"topics": [rule(cleanupPolicy=written)]}).topics
    assert topic.cleanup_policy == canonical
    assert (topic.compact, topic.delete) == (compact, delete)
    assert topic.to_dict()["cleanupPolicy"] == canonical


# ---------------------------------------------------------------------------------------------
# Bad values: the error names the field (dotted path) and what is allowed
# ---------------------------------------------------------------------------------------------

BAD = [
    # (spec, field, fragment of the message)
    ({"mode": "Observe"}, "spec.mode", "must be one of observe, compact, stage, got 'Observe'"),
    ({"mode": 1}, "spec.mode", "must be a string, got integer 1"),
    ({"modes": "observe"}, "spec.modes", "unknown field 'modes' (did you mean 'mode'?"),
    ({"foo": 1}, "spec.foo", "unknown field 'foo' (allowed: mode, topics, cleaner, stage, compact, target"),
    ({"topics": {"match": "x"}}, "spec.topics", "must be a list, got a mapping"),
    ({"topics": ["x"]}, "spec.topics[0]", "must be a mapping, got string 'x'"),
    ({"topics": [{}]}, "spec.topics[0].match", "is required"),
    ({"topics": [{"match": None}]}, "spec.topics[0].match", "is required"),
    ({"topics": [{"match": ""}]}, "spec.topics[0].match", "must not be empty"),
    ({"topics": [{"match": "("}]}, "spec.topics[0].match", "is not a valid Python regular expression"),
    ({"topics": [{"match": "a"}, {"match": "[z-a]"}]}, "spec.topics[1].match", "bad character range"),
    ({"topics": [rule(foo=1)]}, "spec.topics[0].foo", "unknown field 'foo'"),
    ({"topics": [rule(minCleanableRatio=0.5)]}, "spec.topics[0].minCleanableRatio",
     "did you mean 'minCleanableDirtyRatio'?"),
    ({"topics": [rule(cleanupPolicy="compacted")]}, "spec.topics[0].cleanupPolicy",
     "must be one of compact, compact,delete, delete"),
    ({"topics": [rule(cleanupPolicy="compact;delete")]}, "spec.topics[0].cleanupPolicy", "compact,delete"),
    ({"topics": [rule(cleanupPolicy="")]}, "spec.topics[0].cleanupPolicy", "must be one of"),
    ({"topics": [rule(cleanupPolicy=["compact"])]}, "spec.topics[0].cleanupPolicy", "must be a string"),
    ({"topics": [rule(minCleanableDirtyRatio=1.5)]}, "spec.topics[0].minCleanableDirtyRatio",
     "must be between 0 and 1 (inclusive), got 1.5"),
    ({"topics": [rule(minCleanableDirtyRatio=-0.1)]}, "spec.topics[0].minCleanableDirtyRatio", "got -0.1"),
    ({"topics": [rule(minCleanableDirtyRatio="0.5")]}, "spec.topics[0].minCleanableDirtyRatio",
     "must be a number, got string '0.5'"),
    ({"topics": [rule(minCleanableDirtyRatio=True)]}, "spec.topics[0].minCleanableDirtyRatio",
     "must be a number, got boolean true"),
    ({"topics": [rule(minCleanableDirtyRatio=float("nan"))]}, "spec.topics[0].minCleanableDirtyRatio",
     "finite"),
    ({"topics": [rule(deleteRetentionMs=-1)]}, "spec.topics[0].deleteRetentionMs", "must be >= 0, got -1"),
    ({"topics": [rule(deleteRetentionMs=True)]}, "spec.topics[0].deleteRetentionMs",
     "must be an integer, got boolean true"),
    ({"topics": [rule(deleteRetentionMs=1.5)]}, "spec.topics[0].deleteRetentionMs", "must be an integer"),
    ({"topics": [rule(deleteRetentionMs=8.64e7)]}, "spec.topics[0].deleteRetentionMs", "write 86400000"),
    ({"topics": [rule(deleteRetentionMs="1e9")]}, "spec.topics[0].deleteRetentionMs", "YAML reads as a string"),
    ({"topics": [rule(minCompactionLagMs=-5)]}, "spec.topics[0].minCompactionLagMs", "must be >= 0"),
    ({"topics": [rule(maxCompactionLagMs=0)]}, "spec.topics[0].maxCompactionLagMs", "must be >= 1, got 0"),
    ({"topics": [rule(maxCompactionLagMs=LONG_MAX + 1)]}, "spec.topics[0].maxCompactionLagMs",
     "between 1 and 9223372036854775807 (inclusive)"),
    ({"topics": [rule(segmentBytes=13)]}, "spec.topics[0].segmentBytes",
     "must be between 14 and 2147483647 (inclusive), got 13"),
    ({"topics": [rule(segmentBytes=2**31)]}, "spec.topics[0].segmentBytes", "got 2147483648"),
    ({"topics": [rule(segmentIndexBytes=3)]}, "spec.topics[0].segmentIndexBytes", "between 4 and"),
    ({"topics": [rule(indexIntervalBytes=-1)]}, "spec.topics[0].indexIntervalBytes", "between 0 and"),
    ({"topics": [rule(maxMessageBytes=-1)]}, "spec.topics[0].maxMessageBytes", "between 0 and"),
    ({"topics": [rule(retentionMs=-2)]}, "spec.topics[0].retentionMs", "must be >= -1, got -2"),
    ({"topics": [rule(retentionBytes=-2)]}, "spec.topics[0].retentionBytes", "must be >= -1, got -2"),
    ({"topics": [rule(perPartitionMetrics="yes")]}, "spec.topics[0].perPartitionMetrics",
     "must be true or false, got string 'yes'"),
    ({"topics": [rule(perPartitionMetrics=1)]}, "spec.topics[0].perPartitionMetrics", "got integer 1"),
    ({"topics": [rule(minCompactionLagMs=10, maxCompactionLagMs=9)]}, "spec.topics[0].minCompactionLagMs",
     "must be <= maxCompactionLagMs (9), got 10"),
    ({"topics": [{"match": f"t{i}"} for i in range(257)]}, "spec.topics", "at most 256 items"),
    ({"cleaner": []}, "spec.cleaner", "must be a mapping, got a list"),
    ({"cleaner": {"threads": 0}}, "spec.cleaner.threads", "between 1 and 2147483647"),
    ({"cleaner": {"threads": True}}, "spec.cleaner.threads", "got boolean true"),
    ({"cleaner": {"dedupeBufferSize": 1023}}, "spec.cleaner.dedupeBufferSize", "must be >= 1024"),
    ({"cleaner": {"threads": 4, "dedupeBufferSize": 4095}}, "spec.cleaner.dedupeBufferSize",
     "at least 1024 bytes per cleaner thread (>= 4096 for 4 threads)"),
    ({"cleaner": {"dedupeBufferLoadFactor": 0}}, "spec.cleaner.dedupeBufferLoadFactor", "> 0 and <= 1, got 0"),
    ({"cleaner": {"dedupeBufferLoadFactor": 1.01}}, "spec.cleaner.dedupeBufferLoadFactor", "> 0 and <= 1"),
    ({"cleaner": {"ioBufferSize": -1}}, "spec.cleaner.ioBufferSize", "between 0 and"),
    ({"cleaner": {"maxIoBytesPerSecond": 0}}, "spec.cleaner.maxIoBytesPerSecond", "must be > 0, got 0"),
    ({"cleaner": {"maxIoBytesPerSecond": float("inf")}}, "spec.cleaner.maxIoBytesPerSecond", "finite"),
    ({"cleaner": {"maxIoBytesPerSecond": 10**400}}, "spec.cleaner.maxIoBytesPerSecond", "finite"),
    ({"cleaner": {"backoffMs": -1}}, "spec.cleaner.backoffMs", "must be >= 0"),
    ({"cleaner": {"producerIdExpirationMs": 0}}, "spec.cleaner.producerIdExpirationMs", "between 1 and"),
    ({"cleaner": {"logCleanerThreads": 2}}, "spec.cleaner.logCleanerThreads", "unknown field"),
    ({"stage": {"minFreeDiskRatio": 2}}, "spec.stage.minFreeDiskRatio", "between 0 and 1"),
    ({"stage": {"minFreeDisk": 0.1}}, "spec.stage.minFreeDisk", "did you mean 'minFreeDiskRatio'?"),
    ({"paused": "false"}, "spec.paused", "must be true or false"),
    ({"reporting": {"intervalSeconds": 0}}, "spec.reporting.intervalSeconds", "between 1 and 3600"),
    ({"reporting": {"topPartitions": 201}}, "spec.reporting.topPartitions", "between 1 and 200"),
    ({"reporting": {"maxPartitionSeries": -1}}, "spec.reporting.maxPartitionSeries", "between 0 and"),
    ({"sidecar": {"port": 0}}, "spec.sidecar.port", "between 1 and 65535"),
    ({"sidecar": {"port": 70000}}, "spec.sidecar.port", "between 1 and 65535"),
    ({"sidecar": {"image": ""}}, "spec.sidecar.image", "must not be empty"),
    ({"sidecar": {"resources": {"limits": {"memory": "lots"}}}}, "spec.sidecar.resources.limits.memory",
     "must be a Kubernetes quantity"),
    ({"sidecar": {"resources": {"limits": {"cpu": 0.5}}}}, "spec.sidecar.resources.limits.cpu",
     "got number 0.5"),
    ({"sidecar": {"resources": {"limit": {}}}}, "spec.sidecar.resources.limit", "did you mean 'limits'?"),
    ({"sidecar": {"securityContext": {"runAsUser": -1}}}, "spec.sidecar.securityContext.runAsUser", ">= 0"),
    ({"sidecar": {"securityContext": {"runAsUser": 0}}}, "spec.sidecar.securityContext.runAsUser",
     "must not be 0, root (Pod Security restricted)"),
    ({"sidecar": {"securityContext": {"runAsNonRoot": False}}}, "spec.sidecar.securityContext.runAsNonRoot",
     "must not be false"),
    ({"sidecar": {"securityContext": {"privileged": True}}}, "spec.sidecar.securityContext.privileged",
     "must not be true"),
    ({"sidecar": {"securityContext": {"allowPrivilegeEscalation": True}}},
     "spec.sidecar.securityContext.allowPrivilegeEscalation", "must not be true"),
    ({"sidecar": {"securityContext": {"procMount": "Unmasked"}}}, "spec.sidecar.securityContext.procMount",
     "must be Default"),
    ({"sidecar": {"securityContext": {"seccompProfile": {}}}},
     "spec.sidecar.securityContext.seccompProfile.type", "is required"),
    ({"sidecar": {"securityContext": {"seccompProfile": {"type": "runtimeDefault"}}}},
     "spec.sidecar.securityContext.seccompProfile.type", "must be one of RuntimeDefault, Unconfined, Localhost"),
    ({"sidecar": {"securityContext": {"windowsOptions": {}}}}, "spec.sidecar.securityContext.windowsOptions",
     "unknown field"),
    ({"sidecar": {"securityContext": {"capabilities": {"drop": "ALL"}}}},
     "spec.sidecar.securityContext.capabilities.drop", "must be a list"),
    # A cleaning sidecar whose memory limit cannot hold its offset map: OOM-killed at every clean.
    ({"mode": "compact", "target": TARGET, "cleaner": {"dedupeBufferSize": 512 * 2**20}},
     "spec.sidecar.resources.limits.memory", "512Mi cannot hold the cleaner: cleaner.dedupeBufferSize 536870912 "
     "bytes with 1 thread(s) needs at least 704Mi"),
    ({"mode": "stage", "target": {**TARGET, "injection": "statefulSet"}, "cleaner": {"threads": 8},
      "sidecar": {"resources": {"limits": {"memory": "400Mi"}}}},
     "spec.sidecar.resources.limits.memory", "needs at least 544Mi"),
    ({"target": {**TARGET, "statefulSet": None}}, "spec.target",
     "exactly one of statefulSet or podSelector must be set, got neither"),
    ({"target": {**TARGET, "podSelector": {"matchLabels": {"app": "kafka"}}}}, "spec.target",
     "exactly one of statefulSet or podSelector must be set, got both"),
    ({"target": {**TARGET, "statefulSet": "Kafka"}}, "spec.target.statefulSet", "DNS-1123"),
    ({"target": {**TARGET, "dataVolume": None}}, "spec.target.dataVolume", "is required"),
    ({"target": {**TARGET, "dataVolume": "data_0"}}, "spec.target.dataVolume", "DNS-1123 label"),
    ({"target": {**TARGET, "mountPath": "var/lib"}}, "spec.target.mountPath", "an absolute path"),
    ({"target": {**TARGET, "mountPath": "/"}}, "spec.target.mountPath", "an absolute path other than /"),
    ({"target": {**TARGET, "logDirs": []}}, "spec.target.logDirs", "at least 1 item"),
    ({"target": {**TARGET, "logDirs": "data"}}, "spec.target.logDirs", "must be a list"),
    ({"target": {**TARGET, "logDirs": ["/data"]}}, "spec.target.logDirs[0]", "relative to target.mountPath"),
    ({"target": {**TARGET, "logDirs": ["a", "x/../../etc"]}}, "spec.target.logDirs[1]", "'..'"),
    ({"target": {**TARGET, "logDirs": [".."]}}, "spec.target.logDirs[0]", "'..'"),
    ({"target": {**TARGET, "logDirs": ["a", "a"]}}, "spec.target.logDirs[1]", "duplicate entry 'a'"),
    ({"target": {**TARGET, "injection": "patch"}}, "spec.target.injection",
     "must be one of statefulSet, webhook"),
    ({"target": {**TARGET, "statefulSet": None, "podSelector": {"matchLabels": {"a": "b"}},
                 "injection": "statefulSet"}}, "spec.target.injection", "use webhook"),
    ({"target": {**TARGET, "statefulSet": None, "podSelector": {}}}, "spec.target.podSelector",
     "must not be empty"),
    ({"target": {**TARGET, "statefulSet": None, "podSelector": {"matchLabels": {}, "matchExpressions": []}}},
     "spec.target.podSelector", "would select every pod"),
    ({"target": {**TARGET, "statefulSet": None, "podSelector": {"matchLabels": {"a": "-b"}}}},
     "spec.target.podSelector.matchLabels.a", "a label value"),
    ({"target": {**TARGET, "statefulSet": None, "podSelector": {"matchLabels": {"a": 1}}}},
     "spec.target.podSelector.matchLabels.a", "must be a string, got integer 1"),
    ({"target": {**TARGET, "statefulSet": None,
                 "podSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}},
     "spec.target.podSelector.matchExpressions[0].values", "must not be empty for operator In"),
    ({"target": {**TARGET, "statefulSet": None,
                 "podSelector": {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}}},
     "spec.target.podSelector.matchExpressions[0].values", "must be empty for operator Exists"),
    ({"target": {**TARGET, "statefulSet": None,
                 "podSelector": {"matchExpressions": [{"key": "a", "operator": "in", "values": ["x"]}]}}},
     "spec.target.podSelector.matchExpressions[0].operator", "In, NotIn, Exists, DoesNotExist"),
    ({"mode": "stage", "target": TARGET}, "spec.target.injection", "must be set explicitly"),
]


@pytest.mark.parametrize(("spec", "field", "fragment"), BAD, ids=[f"{i}:{b[1]}" for i, b in enumerate(BAD)])
def test_bad_values_name_the_field_and_the_allowed_values(spec: dict[str, Any], field: str, fragment: str) -> None:
    error = error_of(spec)
    assert error.field == field
    assert fragment in error.message
    assert str(error).startswith(f"{field}: ")


def test_errors_name_the_source() -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy({"mode": "fast"}, source="policies/prod.yaml")
    assert info.value.message.endswith("(in policies/prod.yaml)")


def test_stage_without_a_target_is_fine_and_with_injection_too() -> None:
    assert parse_policy({"mode": "stage"}).mode is Mode.STAGE
    staged = parse_policy({"mode": "stage", "target": {**TARGET, "injection": "statefulSet"}})
    assert staged.target is not None and staged.target.injection is Injection.STATEFUL_SET


def test_injection_is_derived_from_the_target_when_unset() -> None:
    by_set = parse_policy({"target": TARGET}).target
    assert by_set is not None and by_set.injection is None
    assert by_set.effective_injection is Injection.STATEFUL_SET
    selector = {**TARGET, "statefulSet": None, "podSelector": {"matchLabels": {"app": "kafka"}}}
    by_labels = parse_policy({"target": selector}).target
    assert by_labels is not None and by_labels.effective_injection is Injection.WEBHOOK


def test_null_means_absent_as_the_api_server_prunes_it() -> None:
    policy = parse_policy({"mode": None, "topics": [rule(minCleanableDirtyRatio=None)], "cleaner": None})
    assert policy == parse_policy({"topics": [rule()]})
    assert parse_policy({"cleaner": {"maxIoBytesPerSecond": None}}).cleaner.max_io_bytes_per_second is None


def test_integers_are_accepted_for_number_fields() -> None:
    policy = parse_policy({"topics": [rule(minCleanableDirtyRatio=1)], "cleaner": {"maxIoBytesPerSecond": 1000}})
    ratio = policy.topics[0].min_cleanable_dirty_ratio
    assert ratio == 1.0 and isinstance(ratio, float)
    assert isinstance(policy.cleaner.max_io_bytes_per_second, float)


def test_small_segments_for_tests_are_allowed() -> None:
    """segment.bytes keeps Kafka 3.x's minimum of 14 (not 4.0's 1 MiB): engine tests use KiB segments."""
    assert parse_policy({"topics": [rule(segmentBytes=14)]}).topics[0].segment_bytes == 14


# ---------------------------------------------------------------------------------------------
# Whole manifest or bare spec
# ---------------------------------------------------------------------------------------------

SPEC = {"mode": "compact", "topics": [{"match": "orders-.*", "cleanupPolicy": "compact"}]}


def manifest(spec: Any = SPEC, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": "p", "namespace": "kafka", "generation": 7, "uid": "x", "labels": {"a": "b"}},
        "spec": spec,
        **extra,
    }


def test_manifest_and_bare_spec_give_the_same_policy() -> None:
    from_manifest = parse_policy(manifest())
    from_spec = parse_policy(SPEC)
    assert from_manifest == from_spec
    assert (from_manifest.name, from_manifest.namespace, from_manifest.policy_generation) == ("p", "kafka", 7)
    assert (from_spec.name, from_spec.namespace, from_spec.policy_generation) == (None, None, None)


def test_manifest_status_is_ignored_and_missing_spec_is_all_defaults() -> None:
    assert parse_policy(manifest(status={"anything": [1, 2]})) == parse_policy(SPEC)
    no_spec = manifest()
    del no_spec["spec"]
    assert parse_policy(no_spec) == parse_policy({})
    assert parse_policy({"spec": SPEC}) == parse_policy(SPEC)  # the issue's `spec:`-only form


@pytest.mark.parametrize(
    ("document", "field", "fragment"),
    [
        (manifest(apiVersion="kafkacleaner.io/v1"), "apiVersion", "must be kafkacleaner.io/v1alpha1"),
        (manifest(kind="Kafka"), "kind", "must be CompactionPolicy, got string 'Kafka'"),
        ({"kind": KIND, "spec": SPEC}, "apiVersion", "got null"),
        ({"apiVersion": API_VERSION, "spec": SPEC}, "kind", "got null"),
        (manifest(extra=1), "extra", "unknown field 'extra' (allowed: apiVersion, kind, metadata, spec, status)"),
        ({"spec": SPEC, "mode": "observe"}, "mode", "unknown field 'mode'"),
        (manifest(metadata=[]), "metadata", "must be a mapping"),
        (manifest(metadata={"generation": "7"}), "metadata.generation", "must be an integer"),
        (manifest(metadata={"name": 5}), "metadata.name", "must be a string"),
        (manifest(spec=[]), "spec", "must be a mapping, got a list"),
        (manifest(spec={"mode": "x"}), "spec.mode", "must be one of"),
        ([SPEC], "", "a policy must be a mapping"),
        ("mode: observe", "", "a policy must be a mapping"),
    ],
)
def test_bad_manifests(document: Any, field: str, fragment: str) -> None:
    error = error_of(document)
    assert (error.field, fragment in error.message) == (field, True), error


def test_to_manifest_carries_name_and_generation() -> None:
    policy = parse_policy(manifest())
    written = policy.to_manifest()
    assert written["apiVersion"] == API_VERSION and written["kind"] == KIND
    assert written["metadata"] == {"name": "p", "namespace": "kafka", "generation": 7}
    again = parse_policy(written)
    assert again == policy and again.policy_generation == 7


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------


def test_load_policy_reads_yaml(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(manifest()))
    assert load_policy(path).policy_generation == 7
    assert load_policy(str(path)) == parse_policy(SPEC)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "the policy is empty"),
        ("# only a comment\n", "the policy is empty"),
        ("mode: [observe\n", "invalid YAML at line 2"),
        ("mode: observe\nmode: compact\n", "at line 2, column 1: duplicate key 'mode'"),
        ("topics:\n  - match: a\n    match: b\n", "duplicate key 'match'"),
        ("- mode: observe\n", "a policy must be a mapping"),
        ("just text\n", "a policy must be a mapping"),
        ("---\nmode: observe\n---\nmode: compact\n", "invalid YAML"),
    ],
)
def test_bad_files(tmp_path: pathlib.Path, text: str, fragment: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert fragment in info.value.message
    assert str(path) in info.value.message


def test_unreadable_file(tmp_path: pathlib.Path) -> None:
    with pytest.raises(PolicyError, match="cannot read policy file"):
        load_policy(tmp_path / "missing.yaml")
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00mode")
    with pytest.raises(PolicyError, match="not UTF-8"):
        load_policy(binary)


def test_yaml_exponent_integers_are_strings_and_rejected() -> None:
    with pytest.raises(PolicyError, match="YAML reads as a string"):
        parse_policy_text("topics:\n  - match: t\n    segmentBytes: 1e9\n")
    with pytest.raises(PolicyError, match="write 1000000000"):
        parse_policy_text("topics:\n  - match: t\n    segmentBytes: 1.0e+9\n")


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_examples_load_and_round_trip(path: pathlib.Path) -> None:
    policy = load_policy(path)
    assert parse_policy(policy.to_spec_dict()) == policy
    assert parse_policy(yaml.safe_load(yaml.safe_dump(policy.to_manifest()))) == policy


# ---------------------------------------------------------------------------------------------
# The model is immutable and hashable; to_spec_dict is canonical
# ---------------------------------------------------------------------------------------------


def test_policy_is_frozen_and_hashable() -> None:
    policy = load_policy(EXAMPLES / "stage-one-topic.yaml")
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.mode = Mode.COMPACT  # type: ignore[misc]
    assert hash(policy) == hash(load_policy(EXAMPLES / "stage-one-topic.yaml"))
    assert isinstance(policy.target.pod_selector.match_labels, FrozenMap)  # type: ignore[union-attr]
    with pytest.raises(TypeError):
        policy.target.pod_selector.match_labels["x"] = "y"  # type: ignore[index, union-attr]


def test_to_spec_dict_fills_defaults_and_leaves_out_unset_optionals() -> None:
    written = parse_policy({"topics": [rule()]}).to_spec_dict()
    assert written["topics"][0]["maxCompactionLagMs"] == LONG_MAX
    assert written["cleaner"]["dedupeBufferSize"] == 134217728
    assert "maxIoBytesPerSecond" not in written["cleaner"]
    assert "target" not in written and "image" not in written["sidecar"]
    assert set(written) == {"mode", "topics", "cleaner", "stage", "compact", "sidecar", "reporting", "rollout",
                            "paused"}
    # Plain YAML types only (the operator writes this into a ConfigMap).
    assert yaml.safe_load(yaml.safe_dump(written)) == written


def test_parse_does_not_modify_its_input() -> None:
    document = manifest(spec={"topics": [rule(cleanupPolicy="Delete, COMPACT")], "target": TARGET})
    before = copy.deepcopy(document)
    parse_policy(document)
    assert document == before


# ---------------------------------------------------------------------------------------------
# Property: every valid spec round-trips through to_spec_dict
# ---------------------------------------------------------------------------------------------

INT64 = st.integers(0, LONG_MAX)
RATIO = st.floats(0, 1, allow_nan=False)
NAMES = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?", fullmatch=True)


@st.composite
def topic_rules(draw: st.DrawFn) -> dict[str, Any]:
    lag_min, lag_max = sorted([draw(INT64), draw(st.integers(1, LONG_MAX))])
    out: dict[str, Any] = {
        "match": draw(st.sampled_from(["orders-.*", "__consumer_offsets", "a|ab", ".*", r"t\d+", "x[-_]y"])),
        "cleanupPolicy": draw(st.sampled_from(["compact", "delete", "compact,delete", "Delete , Compact"])),
        "minCleanableDirtyRatio": draw(RATIO),
        "deleteRetentionMs": draw(INT64),
        "minCompactionLagMs": lag_min,
        "maxCompactionLagMs": max(lag_max, 1),
        "segmentBytes": draw(st.integers(14, 2**31 - 1)),
        "segmentIndexBytes": draw(st.integers(4, 2**31 - 1)),
        "indexIntervalBytes": draw(st.integers(0, 2**31 - 1)),
        "maxMessageBytes": draw(st.integers(0, 2**31 - 1)),
        "retentionMs": draw(st.integers(-1, LONG_MAX)),
        "retentionBytes": draw(st.integers(-1, LONG_MAX)),
        "perPartitionMetrics": draw(st.booleans()),
    }
    keep = draw(st.sets(st.sampled_from(sorted(out))))
    return {key: value for key, value in out.items() if key in keep or key == "match"}


@st.composite
def targets(draw: st.DrawFn) -> dict[str, Any]:
    out: dict[str, Any] = {
        "dataVolume": draw(NAMES),
        "mountPath": "/" + draw(st.from_regex(r"[a-z]{1,8}(/[a-z0-9-]{1,8}){0,2}", fullmatch=True)),
        "logDirs": draw(st.lists(st.sampled_from([".", "data", "kafka-log*", "a/b", "d-0"]), min_size=1,
                                 max_size=3, unique=True)),
    }
    if draw(st.booleans()):
        out["statefulSet"] = draw(NAMES)
        out["injection"] = draw(st.sampled_from(["statefulSet", "webhook"]))
    else:
        labels = draw(st.dictionaries(st.sampled_from(["app", "strimzi.io/cluster"]), NAMES, max_size=2))
        expressions = [
            {"key": "k", "operator": op, **({"values": ["v"]} if op in ("In", "NotIn") else {})}
            for op in draw(st.lists(st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]), max_size=2))
        ]
        if not labels and not expressions:
            labels = {"app": "kafka"}
        out["podSelector"] = {"matchLabels": labels, "matchExpressions": expressions}
        out["injection"] = "webhook"
    return out


@st.composite
def valid_specs(draw: st.DrawFn) -> dict[str, Any]:
    threads = draw(st.integers(1, 64))
    dedupe = draw(st.integers(1024 * threads, LONG_MAX))
    spec: dict[str, Any] = {
        "mode": draw(st.sampled_from(["observe", "compact", "stage"])),
        "topics": draw(st.lists(topic_rules(), max_size=4)),
        "cleaner": {
            "threads": threads,
            "dedupeBufferSize": dedupe,
            "dedupeBufferLoadFactor": draw(st.floats(0, 1, exclude_min=True)),
            "ioBufferSize": draw(st.integers(0, 2**31 - 1)),
            "maxIoBytesPerSecond": draw(st.none() | st.floats(1, 1e12) | st.integers(1, 2**40)),
            "backoffMs": draw(INT64),
            "producerIdExpirationMs": draw(st.integers(1, 2**31 - 1)),
        },
        "stage": {"minFreeDiskRatio": draw(RATIO)},
        "sidecar": {
            "port": draw(st.integers(1, 65535)),
            "image": draw(st.sampled_from(["ghcr.io/example/kafka-cleaner:0.1.0", "kafka-cleaner"])),
            # As much memory as the cleaner needs, or more (a smaller limit is refused: see above).
            "resources": {"limits": {"memory": str(sidecar_memory_needed(CleanerConfig(
                threads=threads, dedupe_buffer_size=dedupe)) + draw(st.integers(0, 2**30))), "cpu": 2},
                "requests": {"cpu": "100m"}},
            "securityContext": {"runAsUser": draw(st.integers(1, 2**31)), "capabilities": {"drop": ["ALL"]},
                                "seccompProfile": {"type": "RuntimeDefault"}},
        },
        "reporting": {
            "intervalSeconds": draw(st.integers(1, 3600)),
            "topPartitions": draw(st.integers(1, 200)),
            "maxPartitionSeries": draw(st.integers(0, 2**31 - 1)),
        },
        "paused": draw(st.booleans()),
    }
    if draw(st.booleans()):
        spec["target"] = draw(targets())
    keep = draw(st.sets(st.sampled_from(sorted(spec))))
    if {"target", "cleaner"} <= keep and spec["mode"] != "observe" and "mode" in keep:
        keep.add("sidecar")  # the default 512Mi may not hold the drawn offset map
    return {key: value for key, value in spec.items() if key in keep}


@given(valid_specs())
def test_valid_specs_round_trip(spec: dict[str, Any]) -> None:
    policy = parse_policy(spec)
    written = policy.to_spec_dict()
    assert parse_policy(written) == policy
    assert parse_policy(written).to_spec_dict() == written  # canonical: a fixed point
    assert parse_policy(yaml.safe_load(yaml.safe_dump(written))) == policy
    assert hash(parse_policy(written)) == hash(policy)


def test_the_memory_bound_is_the_operators_and_a_tolerant_reader_loads_the_policy() -> None:
    """The operator refuses a compact-mode policy whose sidecar limit cannot hold the offset map
    (above); the sidecar, reading what an operator wrote (``unknown_fields``), loads it as it is:
    refusing its own policy would leave it on an old generation or none."""
    spec = {"mode": "compact", "target": TARGET, "cleaner": {"dedupeBufferSize": 512 * 2**20, "threads": 2}}
    with pytest.raises(PolicyError, match="needs at least 736Mi"):
        parse_policy(spec)
    assert parse_policy(spec, unknown_fields=[]).cleaner.dedupe_buffer_size == 512 * 2**20
    enough = {**spec, "sidecar": {"resources": {"limits": {"memory": "736Mi"}}}}
    assert parse_policy(enough).sidecar.memory_limit == "736Mi"
    assert parse_policy({**spec, "mode": "observe"}).mode is Mode.OBSERVE  # no offset map to hold
    assert parse_policy({k: v for k, v in spec.items() if k != "target"}).target is None  # the CLI's
