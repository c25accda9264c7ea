"""What stage mode refuses, each with its reason in ``/status``, and nothing written for it:
a partition the broker compacts itself, a tiered log (``__cluster_metadata`` is never considered), files the
broker's uid could not open, and disk pressure (which also deletes the largest staged sets
first)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from broker_lock import BrokerLock
from run_as import as_user
from sidecar_helpers import (
    KAFKA_CLEANER,
    new_sidecar,
    next_scan,
    write_policy,
)

from cleaner.clock import MockTime
from cleaner.config import parse_policy
from cleaner.effective_config import effective_rule
from cleaner.engine.manager import LogCleanerManager
from cleaner.sidecar import stage
from cleaner.sidecar.guards import stage_refusal
from cleaner.storage.checkpoint import CLEANER_OFFSET_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleaner.storage.cluster_metadata import ConfigValue
from cleaner.storage.log_dir import LogDirectory
from cleaner.storage.topic_partition import TopicPartition

ALL = [{"match": ".*", "cleanupPolicy": "compact"}]
GENERATED = {"topics": 1, "partitions": 3, "records": 3_000, "keys": 1_000}


def _areas(log_dir: Path) -> set[str]:
    return {p.name for p in log_dir.iterdir() if p.is_dir() and stage.area(p).exists()}


def _refused(doc: dict) -> dict[str, str]:
    return {f"{r['topic']}-{r['partition']}": r["reason"] for r in doc["stage"]["refused"]}


def test_broker_compacted_and_tiered_refused_metadata_never_considered(tmp_path: Path, make_log_dir) -> None:
    data = make_log_dir(**GENERATED)
    compacted, tiered, free = (TopicPartition("topic-0", p) for p in range(3))
    OffsetCheckpointFile(data / CLEANER_OFFSET_CHECKPOINT).write({compacted: 50})
    # Kafka writes a log start entry at the first segment only for a remote-storage log.
    OffsetCheckpointFile(data / LOG_START_OFFSET_CHECKPOINT).write({tiered: 0})
    shutil.copytree(data / free.dir_name, data / "__cluster_metadata-0")
    with BrokerLock(data):
        sc = new_sidecar(write_policy(tmp_path / "policy.yaml", mode="stage", topics=ALL), [data])
        for _ in range(4):
            doc = next_scan(sc)
        refused = _refused(doc)
        assert "cleaner-offset-checkpoint" in refused[str(compacted)]
        assert "tiered" in refused[str(tiered)]
        assert "__cluster_metadata-0" not in refused, "the metadata log is never even considered"
        assert str(free) not in refused and doc["stage"]["refusedPartitions"] == 2
        assert _areas(data) == {free.dir_name}, "something was written for a refused partition"
        assert stage.load(data / free.dir_name) is not None


def test_disk_pressure_refuses_staging_and_writes_nothing(tmp_path: Path, make_log_dir) -> None:
    data = make_log_dir(**GENERATED)
    with BrokerLock(data):
        policy = write_policy(tmp_path / "policy.yaml", mode="stage", topics=ALL, stage={"minFreeDiskRatio": 1.0})
        sc = new_sidecar(policy, [data])
        for _ in range(3):
            doc = next_scan(sc)
        assert any("stage.minFreeDiskRatio" in why for why in _refused(doc).values()), doc["stage"]
        assert _areas(data) == set()
        assert doc["cleaner"]["state"] != "error"
        # What the KafkaCleanerStageDiskLow alert compares: the log dir's free ratio (the scan's
        # statvfs) against the policy's floor.
        registry = sc.metrics.registry
        assert registry.get_sample_value("kafka_cleaner_stage_min_free_disk_ratio") == 1.0
        usage = shutil.disk_usage(data)
        free_ratio = registry.get_sample_value("kafka_cleaner_log_dir_free_ratio", {"log_dir": str(data)})
        assert free_ratio == pytest.approx(doc["logDirs"][0]["freeBytes"] / usage.total)
        assert 0.0 <= free_ratio < 1.0


class FakeDisk:
    """statvfs of a small volume whose free space is ``capacity`` minus what is staged (a
    simulation: a real full disk cannot be had in a test without privileges)."""

    def __init__(self, log_dir: Path, capacity: int) -> None:
        self.log_dir = log_dir
        self.capacity = capacity

    def used(self) -> int:
        return sum(stage.staged_bytes(p) for p in stage.staged_partitions(self.log_dir).values())

    def free_ratio(self, path: Path) -> float:
        return (self.capacity - self.used()) / self.capacity


def test_when_free_disk_falls_the_largest_staged_sets_go_first(
    tmp_path: Path, make_log_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = make_log_dir(**{**GENERATED, "partitions": 3, "records": 6_000})
    with BrokerLock(data):
        policy = write_policy(tmp_path / "policy.yaml", mode="stage", topics=ALL)
        sc = new_sidecar(policy, [data])
        for _ in range(5):
            next_scan(sc)
        sizes = {name: stage.staged_bytes(data / name) for name in _areas(data)}
        assert len(sizes) == 3 and all(sizes.values())
        order = sorted(sizes, key=lambda n: -sizes[n])
        staged = sum(sizes.values())
        # Free space now just under 1 - (staged - smallest/2) / capacity: deleting the two
        # largest sets is needed, and enough.
        capacity = 10 * staged
        disk = FakeDisk(data, capacity)
        monkeypatch.setattr(stage, "free_ratio", disk.free_ratio)
        ratio = 1 - (sizes[order[2]] * 1.5) / capacity
        write_policy(policy, mode="stage", topics=ALL, stage={"minFreeDiskRatio": ratio}, paused=True, generation=2)
        doc = next_scan(sc, 60_000)
        left = {name for name in _areas(data) if stage.load(data / name) is not None}
        assert left == {order[2]}, (sizes, left)
        messages = [e["message"] for e in doc["errors"] if "free disk is below" in e["message"]]
        assert len(messages) == 2


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the sidecar as another uid")
def test_a_uid_the_broker_files_do_not_belong_to_is_refused(make_log_dir, request: pytest.FixtureRequest) -> None:
    """The broker's files belong to uid/gid 1001 (Strimzi, Bitnami). A sidecar running as
    65532 without the broker's group is refused, and nothing is written. With the broker's
    group as a supplementary group (what Kubernetes does with the pod's fsGroup) it stages,
    and everything it stages is the broker's group's to read, write and delete."""
    # Under a directory every uid may traverse (pytest's tmp_path is root's alone).
    shared = Path(tempfile.mkdtemp(prefix="kafka-cleaner-uid-"))
    shared.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(shared, ignore_errors=True))
    data = shutil.move(make_log_dir(**{**GENERATED, "partitions": 2}), shared / "kafka-logs")
    for root, dirs, names in os.walk(data):
        for n in dirs + names:
            os.chown(Path(root) / n, 1001, 1001)
        os.chmod(root, 0o775)
    os.chown(data, 1001, 1001)
    policy = write_policy(shared / "policy.yaml", mode="stage", topics=ALL)
    policy.chmod(0o644)
    before = broker_view_of(data)

    def run_sidecar() -> dict:
        sc = new_sidecar(policy, [data])
        for _ in range(4):
            doc = next_scan(sc)
        doc["partitionRefusals"] = {p.name: stage.uid_refusal(p) for p in data.iterdir() if p.is_dir()}
        return doc

    with BrokerLock(data):
        os.chmod(data / "topic-0-0", 0o777)  # writable, but the files would not be the broker's group's
        doc = as_user(65532, 65532, [], run_sidecar)
        # The whole mode is refused at start-up (guards.mode_refusal, with this very check on
        # the dir's first partition), and each partition would be refused on its own too.
        assert doc["cleaner"]["state"] == "error" and doc["stage"]["sets"] == 0, json.dumps(doc["stage"], indent=1)
        [warning] = doc["warnings"]
        assert warning.startswith("stage mode refused") and "uid 65532" in warning and "group 65532" in warning
        refused = doc["partitionRefusals"]
        assert "uid 65532" in refused["topic-0-0"] and "group 65532" in refused["topic-0-0"]
        assert "may not write" in refused["topic-0-1"]
        assert broker_view_of(data) == before, "written for a refused partition"
        assert not any(stage.area(p).exists() for p in data.iterdir() if p.is_dir())

        os.chmod(data / "topic-0-0", 0o775)
        doc = as_user(65532, 65532, [1001], run_sidecar)
    assert doc["stage"]["refused"] == [] and doc["stage"]["sets"] == 2, json.dumps(doc["stage"], indent=1)
    for pdir in (p for p in data.iterdir() if p.is_dir()):
        for d in (stage.area(pdir), stage.set_dir(pdir)):
            st = d.stat()
            assert st.st_gid == 1001 and st.st_mode & 0o070 == 0o070, (d, oct(st.st_mode))
        for f in stage.set_dir(pdir).iterdir():  # the broker opens segments read-write
            st = f.stat()
            assert st.st_uid == 65532 and st.st_gid == 1001 and st.st_mode & 0o060 == 0o060, (f, oct(st.st_mode))


def broker_view_of(log_dir: Path) -> dict[str, list[str]]:
    return {p.name: sorted(os.listdir(p)) for p in log_dir.iterdir() if p.is_dir()}


def test_the_stage_cli_commits_discards_and_reports(tmp_path: Path, make_log_dir) -> None:
    """``kafka-cleaner stage status|commit|discard``: the same commit as the sidecar's gate,
    for a broker run without Kubernetes (systemd's ExecStartPre), and the discard a deleted
    stage-mode policy needs."""
    data = make_log_dir(**GENERATED)
    OffsetCheckpointFile(data / CLEANER_OFFSET_CHECKPOINT).write({TopicPartition("topic-0", 2): 10})
    policy = write_policy(tmp_path / "policy.yaml", mode="stage", topics=ALL)
    with BrokerLock(data):
        sc = new_sidecar(policy, [data])
        for _ in range(4):
            next_scan(sc)
        assert len([p for p in _areas(data) if stage.load(data / p)]) == 2

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [str(KAFKA_CLEANER), "stage", *args], capture_output=True, text=True, timeout=120, check=False
            )

        out = cli("status", str(data), "--policy", str(policy), "--json")
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        assert {p["partition"]: p["state"] for p in report["partitions"]} == {
            "topic-0-0": "staged",
            "topic-0-1": "staged",
            "topic-0-2": "refused",
        }
        assert (
            "cleaner-offset-checkpoint"
            in next(p for p in report["partitions"] if p["partition"] == "topic-0-2")["reason"]
        )
        out = subprocess.run(
            [str(KAFKA_CLEANER), "status", str(data), "--policy", str(policy)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert out.returncode == 0, out.stderr
        assert "stage: topic-0-2: refused (the broker compacts this partition itself" in out.stdout, out.stdout
        assert "stage: topic-0-0: staged" in out.stdout
        out = cli("commit", str(data), "--policy", str(policy))
        assert out.returncode == 4 and "holds" in out.stderr, (out.returncode, out.stdout, out.stderr)
    out = cli("commit", str(data), "--policy", str(policy), "--max-seconds", "30")
    assert out.returncode == 0, out.stderr
    assert "committed 2" in out.stdout
    assert all(stage.load(data / p) is None for p in _areas(data))
    # Discard: everything kafka-cleaner keeps in partition dirs goes (a deleted policy).
    with BrokerLock(data):
        sc = new_sidecar(policy, [data])
        for _ in range(4):
            next_scan(sc)
        assert _areas(data)
        out = cli("discard", str(data))
        assert out.returncode == 0, out.stderr
        assert _areas(data) == set()
    not_a_log_dir = tmp_path / "etc"
    (not_a_log_dir / "dbus-1").mkdir(parents=True)
    out = cli("commit", str(not_a_log_dir), "--policy", str(policy))
    assert out.returncode == 2 and "not a Kafka log dir" in out.stderr
    assert sorted(os.listdir(not_a_log_dir)) == ["dbus-1"]


def test_a_remote_storage_topic_is_refused(tmp_path: Path, make_log_dir) -> None:
    """``remote.storage.enable=true`` in the cluster's config (what the KRaft metadata reader
    reports as ``remote_storage``) is a tiered log."""
    data = make_log_dir(**{**GENERATED, "partitions": 1})
    policy = parse_policy({"mode": "stage", "topics": ALL})
    manager = LogCleanerManager([LogDirectory(data, read_only=True)], policy, MockTime(), write_checkpoints=False)
    managed = next(iter(manager.logs().values()))
    managed = dataclasses.replace(
        managed,
        config=effective_rule(managed.rule, {"remote.storage.enable": ConfigValue("true", "topic")}),
    )
    why = stage_refusal(managed, cleaner_checkpoint={}, log_start_checkpoint={})
    assert why is not None and "remote.storage.enable" in why
