"""The chart's alerts under the real promtool (Debian's prometheus package): the rule file the
chart renders passes ``promtool check rules``, every alert links its section of
docs/runbooks.md, and ``promtool test rules`` fires each alert on synthetic series of the
metric names the sidecar, the operator and kube-state-metrics export, after its ``for``, and
keeps it silent on healthy series and on the look-alikes that must not page anyone."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from compaction_operator import metrics as operator_metrics
from prometheus_client import CollectorRegistry

from cleaner.sidecar.metrics import CleanerGauges, SidecarMetrics
from cleaner.sidecar.report import LogDirInfo, ScanSnapshot

REPO = pathlib.Path(__file__).resolve().parents[2]
RUNBOOKS = REPO / "docs" / "runbooks.md"
Render = Callable[..., list[dict[str, Any]]]
MONITORING: dict[str, Any] = {"metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True},
                                          "prometheusRule": {"enabled": True}}, "webhook": {"enabled": True}}
#: What helm_template renders with: release kco in namespace default.
OPERATOR_JOB = 'job="kco-kafka-cleaner-operator",namespace="default"'
SIDECAR_JOB = 'job="default/kco-kafka-cleaner-operator-sidecars"'
ALL_ALERTS = {
    "KafkaCleanerDeadThreads", "KafkaCleanerUncleanablePartitions", "KafkaCleanerNotRunning",
    "KafkaCleanerCompactionDelay", "KafkaCleanerHangingTransaction", "KafkaCleanerStageDiskLow",
    "KafkaCleanerSidecarRestarts", "KafkaCleanerSidecarDown", "KafkaCleanerReportsStale",
    "KafkaCleanerReconcileErrors", "KafkaCleanerRolloutStalled", "KafkaCleanerReplicasDiverge",
    "KafkaCleanerReplicationRaceRisk",
    "KafkaCleanerOperatorDown", "KafkaCleanerLeaderCount", "KafkaCleanerSidecarFailing",
    "KafkaCleanerWebhookFailOpen",
}

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None,
                                reason="promtool not installed (Debian package prometheus)")


def rules(helm_template: Render, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The rendered PrometheusRule's groups."""
    [rule] = [o for o in helm_template(values or MONITORING) if o["kind"] == "PrometheusRule"]
    return rule["spec"]["groups"]


def rule_file(groups: list[dict[str, Any]], tmp_path: pathlib.Path, *, annotations: bool = True) -> pathlib.Path:
    if not annotations:  # the firing tests check labels and timing, not the wording
        groups = [{**g, "rules": [{k: v for k, v in r.items() if k != "annotations"} for r in g["rules"]]}
                  for g in groups]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    return path


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120)


def alerts(groups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in groups for r in g["rules"]}


def test_the_rules_pass_promtool_check(helm_template: Render, tmp_path: pathlib.Path) -> None:
    groups = rules(helm_template)
    result = promtool("check", "rules", str(rule_file(groups, tmp_path)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert set(alerts(groups)) == ALL_ALERTS


def test_every_alert_links_its_runbook_section(helm_template: Render) -> None:
    """runbook_url is the base URL plus the alert's heading anchor in docs/runbooks.md (GitHub
    makes "## KafkaCleanerDeadThreads" the anchor #kafkacleanerdeadthreads), and the base URL
    is a value."""
    headings = {h.lower() for h in re.findall(r"^## (\w+)$", RUNBOOKS.read_text(), re.MULTILINE)}
    base = "https://runbooks.example.com/kafka-cleaner.md"
    for values, expected_base in ((MONITORING, "https://github.com/kafka-cleaner/kafka-cleaner/blob/main/"
                                               "docs/runbooks.md"),
                                  ({"metrics": {**MONITORING["metrics"], "prometheusRule": {
                                      "enabled": True, "runbookBaseUrl": base}}}, base)):
        for name, rule in alerts(rules(helm_template, values)).items():
            url = rule["annotations"]["runbook_url"]
            assert url == f"{expected_base}#{name.lower()}", url
            assert name.lower() in headings, f"docs/runbooks.md has no section ## {name}"
    assert headings == {name.lower() for name in ALL_ALERTS}, "a runbook section without its alert"


#: Operator metrics the alerts read that other work adds (the rollout issue's stalled rollouts),
#: with the labels namespace and policy.
PENDING_OPERATOR_METRICS = {"kafka_cleaner_operator_rollout_stalled"}
KUBE_STATE_METRICS = {"kube_pod_container_status_restarts_total"}
API_SERVER_METRICS = {"apiserver_admission_webhook_fail_open_count"}


def exported_names(registry: CollectorRegistry) -> set[str]:
    names = set()
    for family in registry.collect():
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
        if family.type == "counter":
            names.add(family.name + "_total")
    return names


def test_every_metric_an_alert_reads_is_exported(helm_template: Render) -> None:
    """A misspelt metric name would make an alert silent forever: each name in the expressions
    is one the sidecar (stage mode, after a scan) or the operator exports, kube-state-metrics'
    restart counter, or one of the operator metrics other work adds."""
    gauges = CleanerGauges(policy_generation=1, stage_min_free_disk_ratio=0.2)
    snapshot = ScanSnapshot(scanned_at_ms=0, log_dirs=[LogDirInfo("/var/lib/kafka/data", free_bytes=1, total_bytes=4)])
    sidecar = SidecarMetrics(lambda: snapshot, lambda: gauges, lambda topic: False, lambda: 0)
    known = exported_names(sidecar.registry) | exported_names(operator_metrics.REGISTRY) | KUBE_STATE_METRICS
    assert {"kafka_cleaner_cleaner_thread_deaths_total", "kafka_cleaner_log_dir_free_ratio",
            "kafka_cleaner_stage_min_free_disk_ratio", "kafka_cleaner_operator_leader"} <= known
    read = {name for rule in alerts(rules(helm_template)).values()
            for name in re.findall(r"\b(kafka_cleaner_\w+|kube_\w+|apiserver_\w+)\b", rule["expr"])}
    assert read - known - API_SERVER_METRICS - PENDING_OPERATOR_METRICS == set()


def test_alerts_that_need_a_monitor_come_with_it(helm_template: Render) -> None:
    """The `up` alerts select the job the ServiceMonitor/PodMonitor makes: without the monitor
    they would fire forever (absent) or never."""
    only_rules = {"metrics": {"prometheusRule": {"enabled": True}}}
    names = set(alerts(rules(helm_template, only_rules)))
    assert not names & {"KafkaCleanerSidecarDown", "KafkaCleanerOperatorDown", "KafkaCleanerLeaderCount"}
    assert "KafkaCleanerDeadThreads" in names and "KafkaCleanerRolloutStalled" in names


def series(name: str, labels: str, values: str) -> dict[str, str]:
    return {"series": f"{name}{{{labels}}}", "values": values}


def fires(at: str, alert: str, *labels: dict[str, str]) -> dict[str, Any]:
    """An alert_rule_test: at ``at``, ``alert`` fires exactly for ``labels`` (none: silent)."""
    return {"eval_time": at, "alertname": alert, "exp_alerts": [{"exp_labels": dict(x)} for x in labels]}


def broker(pod: str, **more: str) -> dict[str, str]:
    return {"namespace": "kafka", "pod": pod, **more}


def test_alerts_fire_and_stay_silent(helm_template: Render, tmp_path: pathlib.Path) -> None:
    path = rule_file(rules(helm_template), tmp_path, annotations=False)
    crit, warn = {"severity": "critical"}, {"severity": "warning"}
    kafka0, kafka1, kafka2 = ('namespace="kafka",pod="kafka-0"', 'namespace="kafka",pod="kafka-1"',
                              'namespace="kafka",pod="kafka-2"')
    data = 'log_dir="/var/lib/kafka/data"'
    policy = 'namespace="kafka",policy="offsets"'
    sidecars = {"interval": "1m", "input_series": [
        # A thread dies at 11m on kafka-0. kafka-1 never loses one; kafka-2's sidecar restarts
        # (the counter resets from 3 to 0) without any death: increase() must not count that.
        series("kafka_cleaner_cleaner_thread_deaths_total", kafka0, "0x10 1x50"),
        series("kafka_cleaner_cleaner_thread_deaths_total", kafka1, "0x60"),
        series("kafka_cleaner_cleaner_thread_deaths_total", kafka2, "3x10 0x50"),
        series("kafka_cleaner_uncleanable_partitions", f"{kafka0},{data}", "2x20"),
        series("kafka_cleaner_time_since_last_run_seconds", kafka0, "90000x30"),
        series("kafka_cleaner_max_compaction_delay_seconds", kafka0, "0x30"),
        series("kafka_cleaner_lso_holder_age_seconds",
               f'{kafka0},topic="orders",partition="3",producer_id="4001",producer_epoch="2"', "600+60x20"),
        series("kafka_cleaner_lso_holder_age_seconds",
               f'{kafka0},topic="orders",partition="4",producer_id="4002",producer_epoch="0"', "60+60x20"),
        # Stage mode below its floor on kafka-0; above it on kafka-1; kafka-2 is an observe-mode
        # sidecar (no floor) on a nearly full disk: not stage mode's business.
        series("kafka_cleaner_log_dir_free_ratio", f"{kafka0},{data}", "0.15x30"),
        series("kafka_cleaner_stage_min_free_disk_ratio", kafka0, "0.2x30"),
        series("kafka_cleaner_log_dir_free_ratio", f"{kafka1},{data}", "0.5x30"),
        series("kafka_cleaner_stage_min_free_disk_ratio", kafka1, "0.2x30"),
        series("kafka_cleaner_log_dir_free_ratio", f"{kafka2},{data}", "0.05x30"),
        # kube-state-metrics: the sidecar of kafka-0 restarts 3 times in 4 minutes, kafka-1's
        # once; the broker container of kafka-2 restarts a lot (not the sidecar's alert).
        series("kube_pod_container_status_restarts_total", f'{kafka0},container="kafka-cleaner"', "0 0 1 2 3x60"),
        series("kube_pod_container_status_restarts_total", f'{kafka1},container="kafka-cleaner"', "0 0 1x60"),
        series("kube_pod_container_status_restarts_total", f'{kafka2},container="kafka"', "0+1x60"),
        series("up", f"{SIDECAR_JOB},{kafka0}", "0x10"),
        series("up", f"{SIDECAR_JOB},{kafka1}", "1x10"),
    ], "alert_rule_test": [
        fires("10m", "KafkaCleanerDeadThreads"),
        fires("12m", "KafkaCleanerDeadThreads"),  # for: 2m
        fires("13m", "KafkaCleanerDeadThreads", {**crit, **broker("kafka-0")}),
        fires("35m", "KafkaCleanerDeadThreads", {**crit, **broker("kafka-0")}),
        fires("45m", "KafkaCleanerDeadThreads"),  # 30 minutes without another death: resolved
        fires("9m", "KafkaCleanerUncleanablePartitions"),
        fires("11m", "KafkaCleanerUncleanablePartitions", {**warn, **broker("kafka-0", log_dir="/var/lib/kafka/data")}),
        fires("16m", "KafkaCleanerNotRunning", {**warn, **broker("kafka-0")}),
        fires("16m", "KafkaCleanerCompactionDelay"),
        # 600 s + 60 s a minute passes 900 s after 5 minutes, then 5 minutes "for": fires at 11m;
        # the young transaction (60 s at 0m) is at 900 s only at 14m.
        fires("10m", "KafkaCleanerHangingTransaction"),
        fires("11m", "KafkaCleanerHangingTransaction", {**warn, **broker(
            "kafka-0", topic="orders", partition="3", producer_id="4001", producer_epoch="2")}),
        fires("14m", "KafkaCleanerStageDiskLow"),
        fires("16m", "KafkaCleanerStageDiskLow", {**warn, **broker("kafka-0", log_dir="/var/lib/kafka/data")}),
        fires("2m", "KafkaCleanerSidecarRestarts"),
        fires("5m", "KafkaCleanerSidecarRestarts", {**warn, **broker("kafka-0", container="kafka-cleaner")}),
        fires("4m", "KafkaCleanerSidecarDown"),
        fires("6m", "KafkaCleanerSidecarDown", {**warn, **broker("kafka-0", job=SIDECAR_JOB[5:-1])}),
    ]}
    operator_metrics = {"interval": "1m", "input_series": [
        series("kafka_cleaner_operator_stale_brokers", policy, "1x10"),
        series("kafka_cleaner_operator_reconcile_errors_total", f'{policy},reason="ApiError"', "0+1x30"),
        series("kafka_cleaner_operator_reconcile_errors_total", 'namespace="kafka",policy="quiet",reason="ApiError"',
               "5x30"),
        # The rollout of "offsets" stalls at 2m; "payments" rolls fine.
        series("kafka_cleaner_operator_rollout_stalled", policy, "0 0 1x10"),
        series("kafka_cleaner_operator_rollout_stalled", 'namespace="kafka",policy="payments"', "0x12"),
        # Two brokers of "offsets" fail with their sidecar from 3m on; "payments" never does.
        series("kafka_cleaner_operator_sidecar_failing_pods", policy, "0 0 0 2x20"),
        series("kafka_cleaner_operator_sidecar_failing_pods", 'namespace="kafka",policy="payments"', "0x25"),
        series("kafka_cleaner_operator_diverging_partitions", policy, "0x5 2x30"),
        series("kafka_cleaner_operator_diverging_partitions", 'namespace="kafka",policy="payments"', "0x35"),
        # One replica, the leader, up until 5m; then it can no longer be scraped.
        series("up", f'{OPERATOR_JOB},pod="op-0"', "1x5 0x20"),
        series("kafka_cleaner_operator_leader", f'{OPERATOR_JOB},pod="op-0"', "1x5"),
        # The API server fails open twice at 3m (the operator down); another webhook fails open too.
        series("apiserver_admission_webhook_fail_open_count", 'name="inject-sidecar.kafkacleaner.io",type="admit"',
               "0 0 0 2x30"),
        series("apiserver_admission_webhook_fail_open_count", 'name="other.example.com",type="admit"', "0+1x30"),
    ], "alert_rule_test": [
        fires("2m", "KafkaCleanerWebhookFailOpen"),
        fires("4m", "KafkaCleanerWebhookFailOpen", {**warn, "name": "inject-sidecar.kafkacleaner.io"}),
        fires("14m", "KafkaCleanerWebhookFailOpen"),  # 10 minutes without another: resolved
        fires("6m", "KafkaCleanerReportsStale", {**warn, "namespace": "kafka", "policy": "offsets"}),
        fires("15m", "KafkaCleanerReconcileErrors"),
        fires("17m", "KafkaCleanerReconcileErrors",
              {**warn, "namespace": "kafka", "policy": "offsets", "reason": "ApiError"}),
        fires("2m", "KafkaCleanerRolloutStalled"),
        fires("4m", "KafkaCleanerRolloutStalled", {**crit, "namespace": "kafka", "policy": "offsets"}),
        fires("7m", "KafkaCleanerSidecarFailing"),
        fires("8m", "KafkaCleanerSidecarFailing", {**crit, "namespace": "kafka", "policy": "offsets"}),
        fires("19m", "KafkaCleanerReplicasDiverge"),
        fires("21m", "KafkaCleanerReplicasDiverge", {**warn, "namespace": "kafka", "policy": "offsets"}),
        fires("5m", "KafkaCleanerOperatorDown"),
        fires("9m", "KafkaCleanerOperatorDown"),
        fires("12m", "KafkaCleanerOperatorDown", crit),
        # The leader gauge of a replica that cannot be scraped goes stale: no "0 leaders" page
        # on top of KafkaCleanerOperatorDown.
        fires("4m", "KafkaCleanerLeaderCount"),
        fires("15m", "KafkaCleanerLeaderCount"),
    ]}
    two_replicas = {"interval": "1m", "input_series": [
        # Leader election: op-0 leads, op-1 stands by; op-1 cannot be scraped. Nothing fires.
        series("up", f'{OPERATOR_JOB},pod="op-0"', "1x20"),
        series("up", f'{OPERATOR_JOB},pod="op-1"', "0x20"),
        series("kafka_cleaner_operator_leader", f'{OPERATOR_JOB},pod="op-0"', "1x20"),
        series("kafka_cleaner_operator_leader", f'{OPERATOR_JOB},pod="op-1"', "0x20"),
        # Another release's operator in another namespace, down: not this chart's alert.
        series("up", 'job="kco-kafka-cleaner-operator",namespace="other",pod="op-0"', "0x20"),
    ], "alert_rule_test": [
        fires("10m", "KafkaCleanerOperatorDown"),
        fires("10m", "KafkaCleanerLeaderCount"),
    ]}
    split_brain = {"interval": "1m", "input_series": [
        # No `up` series at all (no endpoint), yet two replicas said they lead: both page.
        series("kafka_cleaner_operator_leader", f'{OPERATOR_JOB},pod="op-0"', "1x20"),
        series("kafka_cleaner_operator_leader", f'{OPERATOR_JOB},pod="op-1"', "0 0 1x18"),
    ], "alert_rule_test": [
        fires("4m", "KafkaCleanerOperatorDown"),
        fires("6m", "KafkaCleanerOperatorDown", crit),
        fires("6m", "KafkaCleanerLeaderCount"),
        fires("8m", "KafkaCleanerLeaderCount", warn),
    ]}
    tests = {"rule_files": [str(path)], "evaluation_interval": "1m",
             "tests": [sidecars, operator_metrics, two_replicas, split_brain]}
    test_path = tmp_path / "tests.yaml"
    test_path.write_text(yaml.safe_dump(tests))
    result = promtool("test", "rules", str(test_path))
    assert result.returncode == 0, result.stdout + result.stderr


# ---- KafkaCleanerDeletionDeadlineBreached (issue 25.2) ----------------------------------------

ALL_ALERTS.add("KafkaCleanerDeletionDeadlineBreached")


def test_the_deletion_deadline_alert_fires_with_its_cause_and_clears(
    helm_template: Render, tmp_path: pathlib.Path
) -> None:
    """A partition held back by its unrolled active segment breaches at 3m and pages at 8m (for:
    5m) naming the cause; after the roll and the clean at 20m its series is 0 (another label) and
    the alert clears once the old series is stale. A partition within its deadline never fires."""
    path = rule_file(rules(helm_template), tmp_path, annotations=False)
    gauge = "kafka_cleaner_partition_deletion_deadline_breached"
    held = 'namespace="kafka",pod="kafka-0",topic="users",partition="0",held_back_by="activeSegment"'
    cleared = 'namespace="kafka",pod="kafka-0",topic="users",partition="0",held_back_by=""'
    fine = 'namespace="kafka",pod="kafka-0",topic="users",partition="1",held_back_by=""'
    test = {"interval": "1m", "input_series": [
        series(gauge, held, "0 0 0 1x17 _x20"),
        series(gauge, cleared, "_x20 0x20"),
        series(gauge, fine, "0x40"),
    ], "alert_rule_test": [
        fires("7m", "KafkaCleanerDeletionDeadlineBreached"),
        fires("8m", "KafkaCleanerDeletionDeadlineBreached", {"severity": "warning", **broker(
            "kafka-0", topic="users", partition="0", held_back_by="activeSegment")}),
        fires("19m", "KafkaCleanerDeletionDeadlineBreached", {"severity": "warning", **broker(
            "kafka-0", topic="users", partition="0", held_back_by="activeSegment")}),
        fires("26m", "KafkaCleanerDeletionDeadlineBreached"),  # the old series: stale 5m after its last sample
    ]}
    tests_path = tmp_path / "deletion.yaml"
    tests_path.write_text(yaml.safe_dump({"rule_files": [str(path)], "evaluation_interval": "1m", "tests": [test]}))
    result = promtool("test", "rules", str(tests_path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_replication_race_alert_fires_hours_before_the_horizon_and_not_for_a_blip(
        helm_template: Render, tmp_path: pathlib.Path) -> None:
    """kafka_cleaner_operator_replication_race_seconds_left (issue 24): a series exists only while a
    replica is out of sync with something a cleaner may remove; the alert pages under 6 hours
    left, after 5 minutes (an ISR shrink of a minute pages nobody)."""
    path = rule_file(rules(helm_template), tmp_path, annotations=False)
    gauge = "kafka_cleaner_operator_replication_race_seconds_left"
    stopped = 'namespace="kafka",policy="offsets",topic="orders",partition="3",broker="2"'
    blip = 'namespace="kafka",policy="offsets",topic="orders",partition="4",broker="1"'
    far = 'namespace="kafka",policy="offsets",topic="orders",partition="5",broker="3"'
    race = {"interval": "1m", "input_series": [
        # Broker 2 stopped: 7 hours left at first, a minute less every minute (6 h at 60m).
        series(gauge, stopped, "25200-60x90"),
        # Broker 1 out of the ISR for two minutes with 1 hour left, then back: its series goes
        # (the operator removes it; Prometheus marks it stale at the next scrape).
        series(gauge, blip, "3600 3540 stale"),
        # Broker 3 out with a day left (an uncleaned tombstone, delete.retention.ms 24 h).
        series(gauge, far, "86400x90"),
    ], "alert_rule_test": [
        fires("60m", "KafkaCleanerReplicationRaceRisk"),
        fires("64m", "KafkaCleanerReplicationRaceRisk"),
        fires("66m", "KafkaCleanerReplicationRaceRisk", {"severity": "critical", "namespace": "kafka",
                                                          "policy": "offsets", "topic": "orders", "partition": "3",
                                                          "broker": "2"}),
        fires("5m", "KafkaCleanerReplicationRaceRisk"),
    ]}
    tests = {"rule_files": [str(path)], "evaluation_interval": "1m", "tests": [race]}
    test_path = tmp_path / "race-tests.yaml"
    test_path.write_text(yaml.safe_dump(tests))
    result = promtool("test", "rules", str(test_path))
    assert result.returncode == 0, result.stdout + result.stderr
