"""``kafka-cleaner-operator where`` on the real control plane: one command asks every broker
of a policy where a key still is, through each broker's real ``kafka-cleaner sidecar``
(``GET /where``), and the answer is each broker's own ``kafka-cleaner where``.

Three broker pods of a podSelector policy, on a node of the test's own that no kwok plays:
the test is their kubelet (a real sidecar process per pod, the pod's status Running with its
address). Two are replicas of the partition asked about, the third holds no replica of it.
Reached directly at the pods' addresses (as from the operator's pod, with the chart's
ServiceAccount: its RBAC suffices) and through the API server's pod proxy (as from a laptop:
the admin may, the chart's ServiceAccount may not ``get pods/proxy``); the API server refuses
to proxy to loopback addresses, so that part needs this machine's own non-loopback address.
A broker that does not answer makes the answer incomplete (exit 3), naming it. The last test
does it over the live log dirs of two real brokers replicating a topic.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from broker_pods import BrokerSidecar, broker_pods, run_pods_at
from control_plane import ControlPlane, available, missing_reason
from kafka_broker import KAFKA_LINES, create_topic, two_broker_cluster, wait_until
from kafka_broker import available as kafka_available

from cleaner.generate import GeneratorConfig, generate

pytestmark = [
    pytest.mark.skipif(not available(), reason=missing_reason()),
    pytest.mark.xdist_group("control-plane"),
]

NS = "where"
TOPIC = "topic-0"
OPERATOR_CLI = pathlib.Path(sys.executable).with_name("kafka-cleaner-operator")
KAFKA_CLEANER = pathlib.Path(sys.executable).with_name("kafka-cleaner")
SIDECAR_POLICY = "topics:\n  - match: 'topic-.*'\n    cleanupPolicy: compact\n"
NOW_MS = 1_700_000_000_000
REAL_LINE = KAFKA_LINES[0]


def _own_address() -> str | None:
    """This machine's address on its default route (no packet is sent), if not loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 9))
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if address.startswith("127.") else address


def _where(kubeconfig: pathlib.Path, *args: str, topic: str = TOPIC,
           partition: int = 1) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    return subprocess.run([str(OPERATOR_CLI), "where", "-n", NS, "--policy", "orders", "--topic", topic,
                           "--partition", str(partition), "--kubeconfig", str(kubeconfig), "-o", "json", *args],
                          capture_output=True, text=True, timeout=120, env=env, check=False)  # fmt: skip


def _local(broker: BrokerSidecar, key: bytes, topic: str = TOPIC, partition: int = 1) -> list[dict[str, Any]]:
    done = subprocess.run([str(KAFKA_CLEANER), "where", str(broker.log_dir), "--topic", topic, "--key-hex",
                           key.hex(), "--partition", str(partition), "--now-ms", str(NOW_MS), "-o", "json"],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def brokers(control_plane: ControlPlane, tmp_path: pathlib.Path) -> Iterator[list[BrokerSidecar]]:
    """Generated log dirs: broker-0 and broker-1 replicas of topic-0's partitions, broker-2 with
    no replica of topic-0-1."""
    generate(tmp_path / "replica", GeneratorConfig(topics=1, partitions=2, records=4_000, keys=200,
                                                   tombstones=0.2, segment_bytes=64 << 10, now_ms=NOW_MS, seed=11))
    for name in ("broker-0", "broker-1"):
        shutil.copytree(tmp_path / "replica", tmp_path / name)
    generate(tmp_path / "broker-2", GeneratorConfig(topics=1, partitions=1, records=500, now_ms=NOW_MS, seed=12))
    with broker_pods(control_plane, tmp_path, NS, {n: [tmp_path / n] for n in ("broker-0", "broker-1", "broker-2")},
                     sidecar_policy=SIDECAR_POLICY, now_ms=NOW_MS) as running:
        yield running


def _keys(log_dir: pathlib.Path) -> list[bytes]:
    from cleaner.records.columns import decode_records
    from cleaner.storage.segment import iter_file_batches

    keys: set[bytes] = set()
    for segment in sorted((log_dir / f"{TOPIC}-1").glob("*.log")):
        for batches in iter_file_batches(segment):
            data = batches.select(batches.is_v2 & ~batches.is_control)
            if len(data):
                cols = decode_records(data)
                keys |= {k for i in range(len(cols)) if (k := cols.key(i)) is not None}
    return sorted(keys)


def test_one_command_asks_every_broker_of_the_policy(control_plane: ControlPlane, brokers: list[BrokerSidecar],
                                                       install_chart: Callable[..., pathlib.Path]) -> None:
    plane = control_plane
    chart = install_chart()  # the operator's ServiceAccount: what `kubectl exec` into its pod has
    run_pods_at(plane, NS, brokers, "127.0.0.1")
    key = _keys(brokers[0].log_dir)[3]

    done = _where(chart, "--key-hex", key.hex(), "--via", "direct")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert sorted(answer) == ["broker-0", "broker-1", "broker-2"]
    for b in brokers[:2]:
        assert answer[b.name]["sightings"] == _local(b, key) and answer[b.name]["sightings"], b.name
    assert answer["broker-2"]["sightings"] == [] and "holds no replica" in answer["broker-2"]["notes"][0]
    assert "asking 3 broker(s) of where/orders (direct)" in done.stderr
    assert "on 2 of 3 broker(s) that answered" in done.stderr, done.stderr

    missing = _where(chart, "--key", "no-such-key", "--via", "direct")
    assert missing.returncode == 1 and "no record of the key in topic-0 on the 3 broker(s)" in missing.stderr

    # A broker that does not answer: the answer is incomplete, and says which.
    brokers[1].stop()
    incomplete = _where(chart, "--key-hex", key.hex(), "--via", "direct", "-o", "tsv")
    assert incomplete.returncode == 3, incomplete.stderr
    assert "broker-1: no answer" in incomplete.stderr
    assert "incomplete: 1 broker(s) did not answer (broker-1)" in incomplete.stderr
    rows = [line.split("\t") for line in incomplete.stdout.splitlines()]
    assert rows[0][:2] == ["broker", "partition"] and {r[0] for r in rows[1:]} == {"broker-0"}


def test_through_the_api_servers_pod_proxy(control_plane: ControlPlane, brokers: list[BrokerSidecar],
                                           install_chart: Callable[..., pathlib.Path]) -> None:
    address = _own_address()
    if address is None:
        pytest.skip("no non-loopback IPv4 address on this machine: the API server proxies to none other")
    plane = control_plane
    chart = install_chart()
    run_pods_at(plane, NS, brokers, address)
    key = _keys(brokers[0].log_dir)[5]
    done = _where(plane.kubeconfig, "--key-hex", key.hex(), "--via", "proxy")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    for b in brokers[:2]:
        assert answer[b.name]["sightings"] == _local(b, key) and answer[b.name]["sightings"], b.name
    assert "holds no replica" in answer["broker-2"]["notes"][0]

    # The sidecar's own refusal comes back through the proxy as the sidecar said it.
    oversized = _where(plane.kubeconfig, "--key-hex", "00" * 20_000, "--via", "proxy")
    assert oversized.returncode == 3 and "HTTP 400: the key is 20,000 bytes" in oversized.stderr, oversized.stderr

    # The chart's ServiceAccount may not get pods/proxy: refused by the real authorizer.
    refused = _where(chart, "--key-hex", key.hex(), "--via", "proxy")
    assert refused.returncode == 3 and "the API server's proxy: HTTP 403" in refused.stderr, refused.stderr


@pytest.mark.slow
@pytest.mark.skipif(not kafka_available(REAL_LINE), reason=f"run make setup (Kafka {REAL_LINE})")
def test_every_replica_of_a_real_cluster(control_plane: ControlPlane, tmp_path: pathlib.Path,
                                         install_chart: Callable[..., pathlib.Path]) -> None:
    """Two real brokers, a topic of replication factor 2: a key written, overwritten and
    deleted through the leader, among keys that roll segments. The sidecars read each live
    broker's log dir (observe mode, lock-free); one command finds the key's three records on
    both replicas, each answer the broker's own ``kafka-cleaner where``, and a third broker
    (generated, without the topic) holds no replica of it."""
    chart = install_chart()
    with two_broker_cluster(tmp_path / "kafka", REAL_LINE) as (_, one, two):
        create_topic(one, "users", {0: [1, 2]}, {"cleanup.policy": "compact", "segment.bytes": str(1 << 20)})
        filler = [(0, b"other-%04d" % i, b"x" * 900) for i in range(1_200)]
        one.produce("users", [(0, KEY, b"email:a@example.com"), *filler])
        one.produce("users", [(0, KEY, b"email:b@example.com"), *filler])
        one.produce("users", [(0, KEY, None), *filler[:100]])
        wait_until(lambda: all(len(_on_disk(b.log_dir)) == 3 for b in (one, two)), "the key's three records on both")
        generate(tmp_path / "broker-3", GeneratorConfig(topics=1, partitions=1, records=100, now_ms=NOW_MS, seed=3))
        dirs = {"broker-1": [one.log_dir], "broker-2": [two.log_dir], "broker-3": [tmp_path / "broker-3"]}
        with broker_pods(control_plane, tmp_path, NS, dirs, sidecar_policy=SIDECAR_POLICY, now_ms=NOW_MS) as running:
            run_pods_at(control_plane, NS, running, "127.0.0.1")
            done = _where(chart, "--key-hex", KEY.hex(), "--via", "direct", topic="users", partition=0)
            assert done.returncode == 0, done.stderr
            answer = json.loads(done.stdout)
            for b in running[:2]:
                kinds = [s["kind"] for s in answer[b.name]["sightings"]]
                assert kinds == ["value", "value", "tombstone"], (b.name, kinds)
                assert answer[b.name]["sightings"] == _local(b, KEY, "users", 0), b.name
            assert "holds no replica" in answer["broker-3"]["notes"][0]
            assert "6 record(s) of the key; the latest a tombstone" in done.stderr, done.stderr


KEY = b"user-42@example.com"


def _on_disk(log_dir: pathlib.Path) -> list[str]:
    from cleaner.config import parse_policy_text
    from cleaner.where import DEFAULT_POLICY, where

    sightings, _ = where([log_dir], parse_policy_text(DEFAULT_POLICY), KEY, "users", NOW_MS, partition=0)
    return [s.kind for s in sightings]
