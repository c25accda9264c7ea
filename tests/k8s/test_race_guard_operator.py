"""The race guard as the operator runs it (issue 24, item 3; ``compaction_operator.race_guard``):
the real kopf operator on the real control plane, two real Kafka brokers with Kafka's own
cleaner on, and a real ``kafka-cleaner sidecar`` per broker over its live log dirs (the test
is the pods' kubelet: ``broker_pods``).

Broker 2 stops. Its peer's sidecar reads the metadata on broker 1's disk and reports broker 2
out of the ISR; the operator, scraping it, writes ``status.raceGuard`` (the topic's own
``min.cleanable.dirty.ratio`` 0.01 and no ``max.compaction.lag.ms``), then holds the topic
through the Admin API and says so (``RaceGuardHolding``). Kafka's cleaner leaves the key's
value and tombstone while the leader takes dirty segments. Broker 2 back: every report is in
sync; the operator sets back exactly what was there, empties ``status.raceGuard``
(``RaceGuardReleased``), and Kafka's cleaner cleans again. Without the guard (the baseline,
``test_compaction_replication_race_kafka.py``) the cleaner removes both within a second.
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Callable

import kubernetes
import pytest
from broker_pods import broker_pods, run_pods_at
from compaction_operator.race_guard import HOLD, AdminTopicConfigs
from control_plane import ControlPlane, activated_kubeconfig, available, missing_reason
from kafka_broker import KAFKA_LINES, RealBroker, create_topic, two_broker_cluster, wait_until
from kafka_broker import available as kafka_available
from operator_helpers import ApiCluster, running_operator, wait_for
from ports import free_port

from cleaner.config import parse_policy_text
from cleaner.where import DEFAULT_POLICY, where

LINE = KAFKA_LINES[0]
pytestmark = [
    pytest.mark.skipif(not available(), reason=missing_reason()),
    pytest.mark.skipif(not kafka_available(LINE), reason=f"run make setup (Kafka {LINE})"),
    pytest.mark.xdist_group("control-plane"),
    pytest.mark.slow,
]

NS = "race-guard"
TOPIC, KEY, VALUE = "profiles", b"user-42", b"date-of-birth:1990-01-01"
BROKER_SETTINGS = {"broker.heartbeat.interval.ms": "500", "min.insync.replicas": "1", "log.cleaner.backoff.ms": "200"}
TOPIC_CONFIGS = {"cleanup.policy": "compact", "delete.retention.ms": "1000", "min.cleanable.dirty.ratio": "0.01",
                 "segment.bytes": str(1 << 20)}
RULES = [{"match": TOPIC, "cleanupPolicy": "compact"}]
SIDECAR_POLICY = "reporting:\n  intervalSeconds: 1\ntopics:\n  - match: profiles\n    cleanupPolicy: compact\n"
KEYS = list(HOLD)
TIMEOUT = 90.0
#: The Events the guard's work makes kopf log at WARNING, and kopf's own at the operator's stop.
EXPECTED = ("RaceGuardHolding", "ReplicationRaceRisk", "Daemon 'report' is cancelled")


def _records_of_key(broker: RealBroker) -> list[str]:
    sightings, _ = where([broker.log_dir], parse_policy_text(DEFAULT_POLICY), KEY, TOPIC, int(time.time() * 1000),
                         partition=0)
    return [s.kind for s in sightings]


def _filler(n: int, tag: int) -> list[tuple[int, bytes, bytes | None]]:
    return [(0, b"other-%04d" % (i % 300), b"%d:" % tag + b"x" * 900) for i in range(n)]


def test_the_operator_holds_kafkas_cleaner_while_a_replica_is_away(
        control_plane: ControlPlane, install_chart: Callable[..., pathlib.Path], tmp_path: pathlib.Path) -> None:
    plane = control_plane
    chart = install_chart()
    with two_broker_cluster(tmp_path / "kafka", LINE, extra=BROKER_SETTINGS, cleaner_enable=True) as (_, one, two):
        create_topic(one, TOPIC, {0: [1, 2]}, TOPIC_CONFIGS)
        wait_until(lambda: one.partition_state(TOPIC) == {"leader": 1, "isr": [1, 2]}, "both replicas in sync")
        one.produce(TOPIC, [(0, KEY, VALUE), *_filler(50, 0)])
        wait_until(lambda: _records_of_key(two) == ["value"], "the value on broker 2's disk")
        dirs = {"broker-1": [one.log_dir, one.metadata_dir], "broker-2": [two.log_dir, two.metadata_dir]}
        admin = AdminTopicConfigs(one.bootstrap)
        with broker_pods(plane, tmp_path, NS, dirs, sidecar_policy=SIDECAR_POLICY,
                         policy_spec={"topics": RULES, "reporting": {"intervalSeconds": 1}}) as sidecars, \
                activated_kubeconfig(chart), \
                running_operator(race_guard_bootstrap=one.bootstrap, expected_warnings=EXPECTED,
                                 # the pods' policy injects by webhook (one listening is enough here)
                                 webhook_enabled=True, webhook_insecure=True, webhook_addr="127.0.0.1",
                                 webhook_port=free_port()):  # fmt: skip
            run_pods_at(plane, NS, sidecars, "127.0.0.1")
            cluster = ApiCluster(kubernetes.config.new_client_from_config(config_file=str(plane.kubeconfig)), NS)
            wait_for(lambda: cluster.status("orders").get("summary", {}).get("brokersReporting") == 2,
                     timeout=TIMEOUT, what="both sidecars reporting")  # fmt: skip
            assert not cluster.status("orders").get("raceGuard", {}).get("held"), "nothing to hold while in sync"

            two.stop()
            held = wait_for(lambda: cluster.status("orders").get("raceGuard", {}).get("held", {}).get(TOPIC),
                            timeout=TIMEOUT, what="status.raceGuard holding the topic")  # fmt: skip
            assert held["restore"] == {"min.cleanable.dirty.ratio": "0.01"}  # and no max.compaction.lag.ms
            assert "replica 2 is" in held["why"]
            wait_for(lambda: admin.overrides(TOPIC, KEYS) == HOLD, timeout=TIMEOUT, what="the topic held")
            assert "Kafka's cleaner held off" in cluster.wait_for_event("CompactionPolicy", "RaceGuardHolding")

            one.produce(TOPIC, [(0, KEY, None), *_filler(1_500, 1)])
            for tag in range(2, 10):
                one.produce(TOPIC, _filler(1_200, tag))
                time.sleep(0.25)  # longer than the cleaner's 200 ms backoff: a round it could have taken
            assert _records_of_key(one) == ["value", "tombstone"], "Kafka's cleaner cleaned a held topic"

            two.start()
            wait_for(lambda: not cluster.status("orders").get("raceGuard", {}).get("held"), timeout=TIMEOUT,
                     what="status.raceGuard empty again")  # fmt: skip
            wait_for(lambda: admin.overrides(TOPIC, KEYS) == {"min.cleanable.dirty.ratio": "0.01",
                                                            "max.compaction.lag.ms": None},
                     timeout=TIMEOUT, what="the topic's own configs back (on whichever broker answers)")  # fmt: skip
            assert "set back" in cluster.wait_for_event("CompactionPolicy", "RaceGuardReleased")
            wait_until(lambda: "value" not in _records_of_key(one), "Kafka's cleaner to clean again")
            plane.kubectl("delete", "-n", NS, "compactionpolicy", "orders", "--wait=true", f"--timeout={int(TIMEOUT)}s")
        admin.close()
