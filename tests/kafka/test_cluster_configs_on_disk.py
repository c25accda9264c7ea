"""Topic configs a real broker wrote to ``__cluster_metadata-0`` (issue 14, item 1), per Kafka
line (4.3.1 and 3.9.2): set with the Admin API (create, alter, a cluster-wide dynamic default,
a deleted topic), then read back from the broker's disk by kafka-cleaner, and merged with a
policy by ``kafka-cleaner status`` (the console script, as a user runs it).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from broker_workload import CLI
from kafka_broker import EACH_KAFKA_LINE, RealBroker

from cleaner.storage.cluster_metadata import ConfigValue, read_cluster_metadata

pytestmark = [pytest.mark.slow, EACH_KAFKA_LINE]

HOUR_MS = 3_600_000
POLICY = """\
mode: compact
topics:
  - match: "orders|audit"
    cleanupPolicy: compact
    deleteRetentionMs: 60000
    minCleanableDirtyRatio: 0.4
"""


def _alter_topic(broker: RealBroker, name: str, configs: dict[str, str]) -> None:
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=30_000)
    try:
        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, name, configs=configs)])
    finally:
        admin.close()


def _delete_topic(broker: RealBroker, name: str) -> None:
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=30_000)
    try:
        admin.delete_topics([name])
    finally:
        admin.close()


def test_configs_set_through_the_admin_api_are_read_back_from_the_brokers_disk(tmp_path: Path, line: str) -> None:
    broker = RealBroker(tmp_path / "broker", line, separate_metadata=False).start()
    try:
        broker.create_topic("orders", 1, {"cleanup.policy": "compact", "delete.retention.ms": str(HOUR_MS)})
        broker.create_topic("audit", 1, {"cleanup.policy": "delete"})
        broker.create_topic("gone", 1, {"cleanup.policy": "compact"})
        # alter_configs replaces the topic's whole set of dynamic configs (the legacy
        # AlterConfigs API): what is not named again is removed.
        _alter_topic(broker, "orders", {"cleanup.policy": "compact", "delete.retention.ms": str(2 * HOUR_MS),
                                           "min.cleanable.dirty.ratio": "0.2"})  # fmt: skip
        # A cluster-wide dynamic default (kafka-python cannot name the default broker resource;
        # Kafka's own kafka-configs can).
        broker.run_tool("kafka.admin.ConfigCommand", "--bootstrap-server", broker.bootstrap, "--entity-type",
                        "brokers", "--entity-default", "--alter", "--add-config",
                        "log.cleaner.min.compaction.lag.ms=60000")  # fmt: skip
        _delete_topic(broker, "gone")
        metadata_dir = broker.log_dir / "__cluster_metadata-0"

        def read() -> dict[str, dict[str, ConfigValue]] | None:
            state = read_cluster_metadata(metadata_dir)
            if "gone" in state.topics or "min.compaction.lag.ms" not in state.topic("orders"):
                return None
            return {name: state.topic(name, broker_id=1) for name in ("orders", "audit")}

        deadline = time.monotonic() + 30
        while (topics := read()) is None:
            assert time.monotonic() < deadline, "the broker's metadata log never showed the Admin API's changes"
            time.sleep(0.2)
        orders, audit = topics["orders"], topics["audit"]
        assert orders["cleanup.policy"] == ConfigValue("compact", "topic")
        assert orders["delete.retention.ms"] == ConfigValue(str(2 * HOUR_MS), "topic")  # the later value
        assert orders["min.cleanable.dirty.ratio"] == ConfigValue("0.2", "topic")
        assert orders["min.compaction.lag.ms"] == ConfigValue("60000", "cluster-default")
        assert audit["cleanup.policy"] == ConfigValue("delete", "topic")
        assert audit["min.compaction.lag.ms"] == ConfigValue("60000", "cluster-default")
        assert "delete.retention.ms" not in audit  # nothing set it: Kafka's default stands

        policy = tmp_path / "policy.yaml"
        policy.write_text(POLICY)
        done = subprocess.run([str(CLI), "status", str(broker.log_dir), "--policy", str(policy), "-o", "json"],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        views = {v["topic"]: v for v in json.loads(done.stdout)}
        assert set(views) == {"orders", "audit"}, views.keys()
        # The cluster says audit is not compacted: the policy's compact gives way.
        assert views["audit"]["reason"] == "notCompacted" and not views["audit"]["compacted"]
        assert views["audit"]["configSources"]["cleanup.policy"] == "cluster"
        view = views["orders"]
        assert view["compacted"] and view["reason"] != "notCompacted"
        assert view["clusterConfig"] is True
        # The policy may not shorten the cluster's delete.retention.ms, nor its (cluster-wide)
        # min.compaction.lag.ms; its own dirty ratio stands.
        assert view["configSources"]["delete.retention.ms"] == "cluster"
        assert view["configSources"]["min.compaction.lag.ms"] == "cluster"
        assert view["configSources"]["min.cleanable.dirty.ratio"] == "policy"
        assert view["minCleanableRatio"] == 0.4
        assert any("delete.retention.ms" in note for note in view["configNotes"]), view["configNotes"]
    finally:
        broker.stop()
