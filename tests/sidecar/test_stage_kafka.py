"""Stage mode next to a real Apache Kafka broker, on both Kafka lines (4.3.1 and 3.9.2).

The broker is the judge: it loads the partition dirs with its own ``LogLoader``, serves a
consumer, and reports what it found wrong in its log. The claims:

- staging while the broker serves produce traffic changes nothing the broker reads, and
  restarting the broker in place (the sidecar keeps running) commits nothing;
- a pod restart (the broker stopped, the sidecar's termination or the next gate commits,
  the broker started) commits the sets, and consumers see every latest value, with the
  same earliest and latest offsets;
- a stale set is deleted at the gate: retention deleted a source segment (after the topic's
  policy changed to delete: without its own cleaner, a broker applies no retention to a
  compacted topic), the broker compacted the partition itself;
- a sidecar SIGKILLed at random points of staging leaves a log the broker starts on and
  serves in full (killed inside the commit: ``test_stage_kill_mid_commit_kafka.py``);
- a broker start raced with a commit: the lock decides, never both;
- with the cluster's metadata log on the same disk, the real topic config (compact) makes
  stage refuse the partition: the broker's own cleaner compacts it.

(A truncation needs a second broker: ``test_stage_truncation_kafka.py`` runs a small cluster
for it. A leader change inside a staged range that leaves the sources as they were is shown
with the simulated broker in ``test_stage.py``.)
"""

from __future__ import annotations

import random
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from faults import StepFaults
from kafka_broker import EACH_KAFKA_LINE, RealBroker, partition_files
from sidecar_helpers import KAFKA_CLEANER, new_sidecar, next_scan, status_of, write_policy

from cleaner.clock import MockTime
from cleaner.sidecar import stage
from cleaner.storage.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleaner.storage.loader import startup_plan_for
from cleaner.storage.lock import LogDirLock

pytestmark = [
    pytest.mark.slow,
    EACH_KAFKA_LINE,
]

TOPIC = "orders"
PARTITIONS = 2
POLICY_TOPICS = [{"match": "orders", "cleanupPolicy": "compact", "minCleanableDirtyRatio": 0.01}]
SEGMENT_BYTES = 1 << 20  # Kafka 4's smallest segment.bytes


class Workload:
    """Records produced through the broker, and every key's latest value (None: a tombstone)."""

    def __init__(self, broker: RealBroker, seed: int = 7) -> None:
        self.broker = broker
        self.rng = random.Random(seed)
        self.latest: dict[int, dict[bytes, bytes | None]] = {p: {} for p in range(PARTITIONS)}
        self.sent = 0

    def produce(self, n: int, keys: int = 300, value_bytes: int = 900) -> None:
        records = []
        for _ in range(n):
            p = self.rng.randrange(PARTITIONS)
            key = b"key-%05d" % self.rng.randrange(keys)
            value = None if self.rng.random() < 0.05 else b"%d:" % self.sent + b"x" * value_bytes
            records.append((p, key, value))
            self.latest[p][key] = value
            self.sent += 1
        self.broker.produce(TOPIC, records)


def _start(tmp_path: Path, line: str, **kwargs: object) -> tuple[RealBroker, Workload]:
    broker = RealBroker(tmp_path / "broker", line, **kwargs).start()  # type: ignore[arg-type]
    broker.create_topic(
        TOPIC,
        PARTITIONS,
        {"cleanup.policy": "compact,delete", "segment.bytes": str(SEGMENT_BYTES), "retention.ms": "-1"},
    )
    work = Workload(broker)
    work.produce(6_000)
    return broker, work


def _sidecar(tmp_path: Path, broker: RealBroker, **policy: object):
    path = write_policy(tmp_path / "policy.yaml", mode="stage", topics=POLICY_TOPICS, **policy)
    return new_sidecar(path, [broker.log_dir], MockTime(int(time.time() * 1000)), scan_ms=1_000)


def _sets(broker: RealBroker) -> dict[str, stage.StagedSet]:
    return {p.name: s for p in sorted(broker.log_dir.glob(f"{TOPIC}-*")) if (s := stage.load(p)) is not None}


def _assert_invisible(broker: RealBroker) -> None:
    for pdir in broker.log_dir.glob(f"{TOPIC}-*"):
        plan = startup_plan_for(pdir)
        assert plan.is_empty, (pdir.name, plan.notes)


def _stage_while_serving(sc, broker: RealBroker, work: Workload) -> dict[str, stage.StagedSet]:
    """Tick (producing between ticks) until every partition has a set."""
    for _ in range(15):
        next_scan(sc)
        _assert_invisible(broker)
        if len(_sets(broker)) == PARTITIONS:
            return _sets(broker)
        work.produce(600)  # a segment of each partition rolls every few turns
    raise AssertionError(f"not every partition was staged: {status_of(sc).get('stage')}")


def _serves_everything(broker: RealBroker, work: Workload, offsets: dict | None = None) -> None:
    assert broker.consume(TOPIC, PARTITIONS) == work.latest
    if offsets is not None:
        assert broker.offsets(TOPIC, PARTITIONS) == offsets
    assert broker.problems([TOPIC]) == [], broker.problems([TOPIC])


def test_stage_serve_restart_in_place_then_a_pod_restart_commits(tmp_path: Path, line: str) -> None:
    broker, work = _start(tmp_path, line)
    sc = _sidecar(tmp_path, broker)
    sets = _stage_while_serving(sc, broker, work)
    _serves_everything(broker, work)

    # The broker restarts in place; the sidecar keeps running (and the lock is free a while).
    broker.stop()
    files = partition_files(broker.log_dir, TOPIC)
    for _ in range(3):
        next_scan(sc)
    assert partition_files(broker.log_dir, TOPIC) == files, "committed while the broker restarted in place"
    broker.start()
    offsets = broker.offsets(TOPIC, PARTITIONS)
    _serves_everything(broker, work)
    next_scan(sc)  # a new leader epoch, beginning above the sets: they stay valid
    assert _sets(broker) == sets

    # The pod restarts: the broker exits, the sidecar's SIGTERM commits, the broker starts.
    broker.stop()
    size = sum(p.stat().st_size for p in broker.log_dir.glob(f"{TOPIC}-*/*.log"))
    sc.stop()
    assert [c["committed"] for c in sc._controller.commits] == [sorted(sets)]
    assert _sets(broker) == {}
    assert sum(p.stat().st_size for p in broker.log_dir.glob(f"{TOPIC}-*/*.log")) < size
    broker.start()
    _serves_everything(broker, work, offsets)
    work.produce(500)  # and it goes on
    _serves_everything(broker, work)

    # Once more through the next pod's start-up gate.
    sc = _sidecar(tmp_path, broker)
    _stage_while_serving(sc, broker, work)
    broker.stop()
    offsets_before = None
    sc = _sidecar(tmp_path, broker)
    sc.tick()
    gate = status_of(sc)["gate"]
    assert gate["committed"] == PARTITIONS and gate["deleted"] == 0, gate
    broker.start()
    offsets_before = broker.offsets(TOPIC, PARTITIONS)
    _serves_everything(broker, work, offsets_before)
    broker.stop()


def _set_config(broker: RealBroker, **configs: str) -> None:
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, TOPIC, configs=configs)])
    finally:
        admin.close()


def _wait(predicate, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_the_gate_deletes_a_set_made_stale_by_retention(tmp_path: Path, line: str) -> None:
    broker, work = _start(tmp_path, line)
    sc = _sidecar(tmp_path, broker)
    sets = _stage_while_serving(sc, broker, work)
    first = {name: min(p.name for p in (broker.log_dir / name).glob("*.log")) for name in sets}
    # Without its own cleaner a broker applies no retention to a compacted topic
    # (LogManager.cleanupLogs skips them): the topic's policy changes to delete for a while,
    # as an operator's config change would, and the broker's retention deletes old segments.
    _set_config(broker, **{"cleanup.policy": "delete", "retention.ms": "1000"})
    _wait(
        lambda: any(min(p.name for p in (broker.log_dir / n).glob("*.log")) != first[n] for n in sets),
        "the broker's retention",
    )
    _set_config(broker, **{"cleanup.policy": "compact,delete", "retention.ms": "-1"})
    served = broker.consume(TOPIC, PARTITIONS)
    offsets = broker.offsets(TOPIC, PARTITIONS)
    broker.stop()
    sc = _sidecar(tmp_path, broker)
    sc.tick()
    doc = status_of(sc)
    assert doc["gate"]["deleted"] >= 1, doc["gate"]
    assert any("the first segment is now" in e["message"] for e in doc["errors"]), doc["errors"]
    broker.start()
    assert broker.consume(TOPIC, PARTITIONS) == served and broker.offsets(TOPIC, PARTITIONS) == offsets
    assert broker.problems([TOPIC]) == []
    broker.stop()


def test_the_gate_deletes_a_set_the_broker_compacted_itself(tmp_path: Path, line: str) -> None:
    broker, work = _start(tmp_path, line)
    sc = _sidecar(tmp_path, broker)
    _stage_while_serving(sc, broker, work)
    broker.stop()
    broker.reconfigure(**{"log.cleaner.enable": "true"})
    broker.start()
    _set_config(broker, **{"min.cleanable.dirty.ratio": "0.01"})
    checkpoint = OffsetCheckpointFile(broker.log_dir / CLEANER_OFFSET_CHECKPOINT)
    _wait(lambda: checkpoint.exists() and len(checkpoint.read()) == PARTITIONS, "the broker's own cleaner")
    broker.stop()
    sc = _sidecar(tmp_path, broker)
    sc.tick()
    doc = status_of(sc)
    assert doc["gate"]["deleted"] == PARTITIONS and doc["gate"]["committed"] == 0, doc["gate"]
    assert _sets(broker) == {}
    broker.start()
    _serves_everything(broker, work)
    next_scan(sc)  # from now on stage mode refuses these partitions
    refused = {f"{r['topic']}-{r['partition']}": r["reason"] for r in status_of(sc)["stage"]["refused"]}
    assert all("cleaner-offset-checkpoint" in refused[f"{TOPIC}-{p}"] for p in range(PARTITIONS)), refused
    broker.stop()


def test_sigkill_while_staging(tmp_path: Path, line: str) -> None:
    """(A kill inside the commit, at each of its intermediate states:
    ``test_stage_kill_mid_commit_kafka.py``.)"""
    broker, work = _start(tmp_path, line)
    policy = write_policy(
        tmp_path / "policy.yaml",
        mode="stage",
        topics=POLICY_TOPICS,
        cleaner={"maxIoBytesPerSecond": 3_000_000},
    )
    rng = random.Random(11)
    # Staging: kill -9 at random moments; the broker keeps serving and sees nothing.
    for _ in range(3):
        proc = subprocess.Popen(
            [
                str(KAFKA_CLEANER),
                "sidecar",
                "--policy",
                str(policy),
                "--log-dir",
                str(broker.log_dir),
                "--listen",
                "127.0.0.1:0",
                "--scan-interval-ms",
                "200",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(1.0, 4.0))
        proc.kill()
        proc.wait()
        _assert_invisible(broker)
        work.produce(200)
        _serves_everything(broker, work)
    broker.stop()


def test_a_broker_start_raced_with_a_commit_the_lock_decides(tmp_path: Path, line: str) -> None:
    broker, work = _start(tmp_path, line)
    # Each way round, deterministically: the lock the commit takes keeps the real broker
    # from starting, and the broker's lock keeps the commit out.
    broker.stop()
    with LogDirLock(broker.log_dir):
        broker.start(wait=False)
        assert broker.exited(timeout_s=60) is not None, "the broker started while the commit's lock was held"
        assert "lock" in broker.log_since_start().lower(), broker.log_tail()
    broker.start()
    _stage_while_serving(_sidecar(tmp_path, broker), broker, work)
    out = subprocess.run(
        [str(KAFKA_CLEANER), "stage", "commit", str(broker.log_dir), "--policy", str(tmp_path / "policy.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 4 and len(_sets(broker)) == PARTITIONS, (out.stdout, out.stderr)
    # And raced, at random-ish moments: whoever locks first wins, never both.
    for delay in (0.0, 0.8):
        sc = _sidecar(tmp_path, broker)
        _stage_while_serving(sc, broker, work)
        offsets = broker.offsets(TOPIC, PARTITIONS)
        broker.stop()
        commit = subprocess.Popen(
            [str(KAFKA_CLEANER), "stage", "commit", str(broker.log_dir), "--policy", str(tmp_path / "policy.yaml")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(delay)
        broker.start(wait=False)
        out, err = commit.communicate(timeout=120)
        if commit.returncode == 4:  # the broker locked first: nothing was committed
            assert "holds" in err and len(_sets(broker)) == PARTITIONS
            broker.wait_ready()
        else:
            assert commit.returncode == 0, (out, err)
            assert _sets(broker) == {}
            try:
                broker.wait_ready()
            except AssertionError:  # it started while the commit held the lock, and gave up
                assert broker.exited(timeout_s=30) is not None
                assert "lock" in broker.log_since_start().lower(), broker.log_tail()
                broker.start()
        _serves_everything(broker, work, offsets)
    broker.stop()


def test_a_real_topic_config_of_compact_is_refused(tmp_path: Path, line: str) -> None:
    """The metadata log in the same log dir: the sidecar reads the cluster's topic config,
    which says compact, so the broker's own cleaner owns the partition."""
    broker, work = _start(tmp_path, line, separate_metadata=False)
    sc = _sidecar(tmp_path, broker)
    for _ in range(3):
        next_scan(sc)
    refused = {f"{r['topic']}-{r['partition']}": r["reason"] for r in status_of(sc)["stage"]["refused"]}
    assert all("cleanup.policy=compact" in refused[f"{TOPIC}-{p}"] for p in range(PARTITIONS)), refused
    assert not any(stage.area(p).exists() for p in broker.log_dir.glob(f"{TOPIC}-*"))
    _serves_everything(broker, work)
    broker.stop()


def test_a_commit_interrupted_at_random_steps_then_the_real_broker_starts(
    tmp_path: Path, line: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate's commit dies (an I/O error) at a durable step drawn at random; the real
    broker then starts on what is left and serves every latest value, with the same
    offsets. The in-process version of ``test_stage.py`` covers every step."""
    broker, work = _start(tmp_path, line)
    sc = _sidecar(tmp_path, broker)
    _stage_while_serving(sc, broker, work)
    offsets = broker.offsets(TOPIC, PARTITIONS)
    broker.stop()
    backup = tmp_path / "backup"
    shutil.copytree(broker.log_dir, backup)
    names = ("rename", "write_file", "atomic_write", "remove", "fsync_dir")
    counting = StepFaults(None, names=names).install(monkeypatch)
    _sidecar(tmp_path, broker).tick()
    monkeypatch.undo()
    assert counting.calls >= 10 and _sets(broker) == {}
    for at in sorted(random.Random(line).sample(range(1, counting.calls + 1), 4)):
        shutil.rmtree(broker.log_dir)
        shutil.copytree(backup, broker.log_dir)
        _same_files(broker.log_dir)
        faults = StepFaults(at, names=names).install(monkeypatch)
        _sidecar(tmp_path, broker).tick()
        monkeypatch.undo()
        broker.start()
        assert broker.consume(TOPIC, PARTITIONS) == work.latest, f"killed at step {at}: {faults.log[at - 1]}"
        assert broker.offsets(TOPIC, PARTITIONS) == offsets
        assert broker.problems([TOPIC]) == [], broker.problems([TOPIC])
        broker.stop()


def _same_files(log_dir: Path) -> None:
    """A copy holds the same bytes and mtimes in new inodes: tell its sets so."""
    for pdir in sorted(log_dir.glob(f"{TOPIC}-*")):
        s = stage.load(pdir)
        if s is not None:
            s.sources = [stage.SourceFile.of(pdir / src.name) for src in s.sources]
            (stage.set_dir(pdir) / stage.MANIFEST).write_bytes(s.to_json())
