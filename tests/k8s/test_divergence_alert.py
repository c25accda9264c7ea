"""The chart's KafkaCleanerReplicasDiverge alert, rendered by the real helm and tested by the
real promtool on the gauge the operator exports (kafka_cleaner_operator_diverging_partitions)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from compaction_operator import metrics
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
ALERT = "KafkaCleanerReplicasDiverge"
GAUGE = "kafka_cleaner_operator_diverging_partitions"


def _rule(helm_template: Callable[..., list[dict[str, Any]]], tmp_path: pathlib.Path) -> tuple[pathlib.Path, dict]:
    [rule] = [o for o in helm_template({"metrics": {"prometheusRule": {"enabled": True}}})
              if o and o["kind"] == "PrometheusRule"]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    [alert] = [r for g in rule["spec"]["groups"] for r in g["rules"] if r.get("alert") == ALERT]
    return path, alert


def test_the_alert_reads_the_gauge_the_operator_exports(helm_template: Callable[..., list[dict[str, Any]]],
                                                        tmp_path: pathlib.Path) -> None:
    _, alert = _rule(helm_template, tmp_path)
    assert GAUGE in alert["expr"]
    assert alert["annotations"]["runbook_url"].endswith("/docs/runbooks.md#kafkacleanerreplicasdiverge")
    metrics.DIVERGING_PARTITIONS.labels("kafka", "offsets").set(2)
    try:
        families = {f.name: f for f in text_string_to_metric_families(
            generate_latest(metrics.REGISTRY).decode())}
        [sample] = [s for s in families[GAUGE].samples if s.labels == {"namespace": "kafka", "policy": "offsets"}]
        assert sample.value == 2
    finally:
        metrics.forget_policy("kafka", "offsets")
    runbooks = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "runbooks.md").read_text()
    assert f"## {ALERT}\n" in runbooks


@pytest.mark.skipif(not pathlib.Path(PROMTOOL).exists(), reason="promtool not installed (Debian package prometheus)")
def test_promtool_fires_after_15_minutes_of_divergence_and_not_for_a_blip(
        helm_template: Callable[..., list[dict[str, Any]]], tmp_path: pathlib.Path) -> None:
    path, _ = _rule(helm_template, tmp_path)
    offsets = 'namespace="kafka",policy="offsets"'
    payments = 'namespace="kafka",policy="payments"'
    tests = {"rule_files": [str(path)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [
            # offsets: agree for 5 minutes, then 2 partitions diverge for good.
            {"series": f"{GAUGE}{{{offsets}}}", "values": "0x5 2x30"},
            # payments: one round of divergence (a replica caught mid-truncation), then agreement.
            {"series": f"{GAUGE}{{{payments}}}", "values": "0x3 1x5 0x30"},
        ],
        "alert_rule_test": [
            {"eval_time": "19m", "alertname": ALERT, "exp_alerts": []},
            {"eval_time": "21m", "alertname": ALERT, "exp_alerts": [{
                "exp_labels": {"severity": "warning", "namespace": "kafka", "policy": "offsets"},
                "exp_annotations": {
                    "summary": "Replicas of a partition diverge",
                    "runbook_url": "https://github.com/kafka-cleaner/kafka-cleaner/blob/main/docs/runbooks.md"
                                   "#kafkacleanerreplicasdiverge",
                    "description": "2 partition(s) of CompactionPolicy kafka/offsets have replicas whose sidecar "
                                   "reports disagree beyond what the dirty section explains; the policy's "
                                   "status.divergingPartitions names them, with the brokers and the kind "
                                   "(divergentBatch, staleLso, logStartSkew, cleanSkew).",
                }}]},
        ]}]}
    test_path = tmp_path / "tests.yaml"
    test_path.write_text(yaml.safe_dump(tests))
    result = subprocess.run([PROMTOOL, "test", "rules", str(test_path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
