"""The HTTP endpoints: /healthz, /readyz, /metrics (Prometheus text) and /status (the
operator's contract, validated against docs/sidecar-status-v1.schema.json) - in process
under a mock clock, and through the real command line in every mode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sidecar_helpers import (
    http_get,
    new_sidecar,
    sidecar_process,
    validate_status,
    write_policy,
)


def _families(body: bytes) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def test_endpoints_in_process(tmp_path: Path, make_log_dir) -> None:
    data = make_log_dir(topics=1, partitions=2)
    policy_path = tmp_path / "policy.yaml"  # not there yet
    sc = new_sidecar(policy_path, [data])
    host, port = sc.serve()
    url = f"http://{host}:{port}"
    try:
        assert http_get(url + "/healthz")[0] == 200
        assert http_get(url + "/readyz")[0] == 503  # no policy, no scan
        sc.tick()  # the policy file is missing: still not ready, and it says why
        assert http_get(url + "/readyz")[0] == 503
        code, body, ctype = http_get(url + "/status")
        assert code == 200 and ctype == "application/json"
        doc = validate_status(json.loads(body))
        assert doc["scannedAt"] is None and any("policy" in e["message"] for e in doc["errors"])

        write_policy(policy_path, generation=7)
        sc.time.advance(2_000)
        sc._poll_policy()  # the policy alone does not make it ready
        assert sc.policy is not None and http_get(url + "/readyz")[0] == 503
        sc.tick()  # the first scan
        assert http_get(url + "/readyz")[0] == 200
        doc = validate_status(json.loads(http_get(url + "/status")[1]))
        assert doc["policyGeneration"] == 7 and doc["broker"] == "kafka-0" and doc["scannedAt"]

        code, body, ctype = http_get(url + "/metrics")
        assert code == 200 and ctype.startswith("text/plain")
        families = _families(body)
        assert families["kafka_cleaner_policy_generation"].samples[0].value == 7
        assert families["kafka_cleaner_max_dirty_ratio"].samples[0].value == pytest.approx(
            doc["cleaner"]["maxDirtyRatio"]
        )
        for name in (
            "kafka_cleaner_max_buffer_utilization_ratio",
            "kafka_cleaner_recopy_ratio",
            "kafka_cleaner_max_clean_time_seconds",
            "kafka_cleaner_max_compaction_delay_seconds",
            "kafka_cleaner_dead_threads",
            "kafka_cleaner_time_since_last_run_seconds",
            "kafka_cleaner_uncleanable_partitions",
            "kafka_cleaner_uncleanable_bytes",
            "kafka_cleaner_bytes_read",
            "kafka_cleaner_bytes_written",
            "kafka_cleaner_records_removed",
            "kafka_cleaner_tombstones_removed",
            "kafka_cleaner_cleanings",
            "kafka_cleaner_clean_duration_seconds",
            "kafka_cleaner_topic_dirty_bytes",
            "kafka_cleaner_topic_cleanable_bytes",
            "kafka_cleaner_topic_clean_bytes",
            "kafka_cleaner_topic_tombstones",
            "kafka_cleaner_topic_oldest_tombstone_age_seconds",
            "kafka_cleaner_topic_oldest_dirty_timestamp_seconds",
            "kafka_cleaner_topic_staged_bytes",
        ):
            assert name in families, name
        for name in ("kafka_cleaner_bytes_read", "kafka_cleaner_cleanings", "kafka_cleaner_records_removed"):
            assert families[name].type == "counter"
        assert families["kafka_cleaner_clean_duration_seconds"].type == "histogram"
        cleanable = {s.labels["topic"]: s.value for s in families["kafka_cleaner_topic_cleanable_bytes"].samples}
        assert cleanable == {t["topic"]: t["cleanableBytes"] for t in doc["topics"]}
        assert http_get(url + "/nope")[0] == 404
    finally:
        sc.stop()


def test_per_partition_series_only_where_a_rule_asks_and_capped(tmp_path: Path, make_log_dir) -> None:
    data = make_log_dir(topics=3, partitions=2)
    topics = [
        {"match": "topic-0", "cleanupPolicy": "compact", "perPartitionMetrics": True},
        {"match": "topic-.*", "cleanupPolicy": "compact"},
    ]
    sc = new_sidecar(write_policy(tmp_path / "p.yaml", topics=topics, reporting={"maxPartitionSeries": 1}), [data])
    host, port = sc.serve()
    try:
        sc.tick()
        families = _families(http_get(f"http://{host}:{port}/metrics")[1])
        samples = families["kafka_cleaner_partition_cleanable_ratio"].samples
        assert [(s.labels["topic"], s.labels["partition"]) for s in samples] == [("topic-0", "0")]
    finally:
        sc.stop()


@pytest.mark.parametrize("mode", ["observe", "compact", "stage"])
def test_the_command_serves_a_valid_status_in_every_mode(tmp_path: Path, make_log_dir, mode: str) -> None:
    data = make_log_dir(topics=1, partitions=2)
    policy = write_policy(tmp_path / "policy.yaml", mode=mode, generation=3)
    with sidecar_process(
        policy, [data], "--scan-interval-ms", "200", "--now-ms", "1700000000000", log_file=tmp_path / "sidecar.log"
    ) as proc:
        assert proc.get("/healthz")[0] == 200
        doc = proc.wait_for(lambda d: d["scannedAt"] is not None, what="the first scan")
        assert proc.get("/readyz")[0] == 200
        assert doc["mode"] == mode and doc["policyGeneration"] == 3 and doc["broker"] == "kafka-0"
        if mode != "observe":  # it cleans (compact) or stages: wait for it to show
            doc = proc.wait_for(
                lambda d: d["cleaner"]["lastRunAt"] is not None and d["cleaner"]["state"] == "idle",
                what="a cleaning round",
            )
            assert doc["cleaner"]["bytesReclaimedTotal"] > 0 or doc["cleaner"]["stagedBytes"] > 0
        code, body, ctype = proc.get("/metrics")
        assert code == 200 and ctype.startswith("text/plain")
        families = _families(body)
        assert families["kafka_cleaner_policy_generation"].samples[0].value == 3
        assert proc.terminate()[0] == 0


def _ipv6_loopback() -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this host")
def test_serves_on_ipv6(tmp_path: Path, make_log_dir) -> None:
    """IPv6-only clusters: ``--listen [::]:9410`` must work (the stdlib server is IPv4 only)."""
    data = make_log_dir(topics=1, partitions=1)
    sc = new_sidecar(write_policy(tmp_path / "policy.yaml"), [data])
    sc.options.listen = ("::1", 0)
    host, port = sc.serve()
    try:
        assert http_get(f"http://[{host}]:{port}/healthz")[0] == 200
    finally:
        sc.stop()
