"""Compact mode: the cleaner runs only while the sidecar holds a log dir's ``.lock``, the
way a broker holds it; while the broker holds it nothing changes, and between passes the
lock is free for a broker to start."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from broker_lock import BrokerLock, lock_is_free_for_another_process
from kafka_logs import consumer_view, leftover_files, snapshot_dir
from sidecar_helpers import (
    ALWAYS,
    SimBroker,
    finish_pass,
    http_get,
    new_sidecar,
    next_scan,
    partition_entry,
    status_of,
    write_policy,
)

from cleaner.engine.manager import LogCleanerManager
from cleaner.storage.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile

EAGER = [{"match": "topic-.*", "cleanupPolicy": "compact", "minCleanableDirtyRatio": 0.01}]


def _views(log_dir: Path) -> dict[str, dict]:
    out = {}
    for pdir in sorted(p for p in log_dir.iterdir() if p.is_dir()):
        view = consumer_view(pdir)
        assert view.problems == [], view.problems
        out[pdir.name] = view.live
    return out


def _log_bytes(log_dir: Path) -> int:
    return sum(p.stat().st_size for p in log_dir.glob("*/*.log"))


def test_compact_waits_for_the_broker_cleans_between_its_runs(tmp_path: Path, make_log_dir) -> None:
    """A broker that starts, appends, rolls and stops again; the sidecar waits while the
    broker holds ``.lock`` (state waitingForBroker, nothing touched), cleans while the
    broker is down, and leaves the lock free between passes so the broker can start."""
    data = make_log_dir(topics=1, partitions=2, records=4_000, keys=150, transactions=0.1, idempotent=True)
    twin = tmp_path / "twin"  # the same broker life, never cleaned: the reference for the data
    shutil.copytree(data, twin)
    policy = write_policy(tmp_path / "policy.yaml", mode="compact", topics=EAGER, compact=ALWAYS)
    sc = new_sidecar(policy, [data], scan_ms=1_000)

    for run in range(3):
        # The broker runs: the sidecar waits and changes nothing.
        lock = BrokerLock(data).acquire()
        brokers = [SimBroker(data, seed=run), SimBroker(twin, seed=run)]
        before = snapshot_dir(data)
        for i in range(4):
            doc = next_scan(sc, 1_000)
            assert doc["cleaner"]["state"] == "waitingForBroker"
            assert doc["logDirs"][0]["lockHeldByBroker"] is True
            for b in brokers:
                for tp in sorted(b.logs, key=str):
                    b.append(tp, 30, tombstones=3)
                    if i == 2:
                        b.roll(tp)
        after_appends = snapshot_dir(data)
        next_scan(sc, 1_000)
        assert snapshot_dir(data) == after_appends, "the sidecar touched a directory the broker holds"
        assert after_appends != before
        for b in brokers:
            b.close()
        lock.release()

        # The broker is down: the sidecar takes the lock and cleans.
        size = _log_bytes(data)
        doc = next_scan(sc, 1_000)
        assert doc["cleaner"]["state"] == "cleaning"
        assert not lock_is_free_for_another_process(data), "cleaning without holding the lock"
        finish_pass(sc)
        doc = status_of(sc)
        assert doc["cleaner"]["state"] == "idle"
        assert lock_is_free_for_another_process(data), "the lock is still held between passes"
        assert leftover_files(data) == []
        assert _log_bytes(data) < size
        assert _views(data) == _views(twin)
        assert doc["cleaner"]["lastRunAt"] is not None and doc["cleaner"]["bytesReclaimedTotal"] > 0
        assert doc["errors"] == []
        cleaned = OffsetCheckpointFile(data / CLEANER_OFFSET_CHECKPOINT).read()
        assert {str(tp) for tp in cleaned} == {"topic-0-0", "topic-0-1"}
        for tp in cleaned:
            entry = partition_entry(doc, str(tp))
            assert entry is not None and entry["lastCleanedAt"] is not None
    assert sc.metrics.registry.get_sample_value("kafka_cleaner_cleanings_total", {"result": "success"}) >= 6


def test_compact_never_touches_a_log_dir_the_broker_holds(tmp_path: Path, make_log_dir) -> None:
    held = make_log_dir("held", topics=1, partitions=2)
    free = make_log_dir("free", topics=1, partitions=2, topic_prefix="orders")  # a partition lives in one dir
    free_views = _views(free)
    policy = write_policy(
        tmp_path / "policy.yaml", mode="compact", topics=[{"match": ".*", "cleanupPolicy": "compact"}], compact=ALWAYS
    )
    with BrokerLock(held):
        before = snapshot_dir(held)
        sc = new_sidecar(policy, [held, free], scan_ms=1_000)
        sc.tick()
        finish_pass(sc)
        for _ in range(3):
            doc = next_scan(sc, 2_000)
            finish_pass(sc)
        assert snapshot_dir(held) == before
        assert {d["path"]: d["lockHeldByBroker"] for d in doc["logDirs"]} == {str(held): True, str(free): False}
    assert leftover_files(free) == []
    assert _views(free) == free_views
    assert OffsetCheckpointFile(free / CLEANER_OFFSET_CHECKPOINT).read()
    assert (
        not (held / CLEANER_OFFSET_CHECKPOINT).exists()
        or not OffsetCheckpointFile(held / CLEANER_OFFSET_CHECKPOINT).read()
    )
    # Once the broker is gone, the other dir is cleaned too.
    next_scan(sc, 2_000)
    finish_pass(sc)
    assert OffsetCheckpointFile(held / CLEANER_OFFSET_CHECKPOINT).read()
    assert leftover_files(held) == []


def test_pause_releases_the_locks(tmp_path: Path, make_log_dir) -> None:
    """``spec.paused`` stops the cleaning and gives the log dirs back: a paused sidecar must
    not keep a broker from starting."""
    data = make_log_dir(topics=1, partitions=1)
    policy = write_policy(tmp_path / "policy.yaml", mode="compact", compact=ALWAYS)
    sc = new_sidecar(policy, [data], scan_ms=1_000)
    sc.tick()  # a pass starts and holds the lock
    assert not lock_is_free_for_another_process(data)
    write_policy(policy, mode="compact", paused=True, generation=2, compact=ALWAYS)
    doc = next_scan(sc, 2_000)
    assert doc["cleaner"]["state"] == "paused"
    assert lock_is_free_for_another_process(data)
    assert leftover_files(data) == []
    with BrokerLock(data):  # the broker can start
        pass
    doc = next_scan(sc, 2_000)
    assert doc["cleaner"]["state"] == "paused" and lock_is_free_for_another_process(data)


def test_a_dead_cleaner_thread_is_counted_and_never_fails_the_liveness_probe(
    tmp_path: Path, make_log_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cleaner thread that dies leaves /healthz at 200 (a restart of the sidecar would reset
    what KafkaCleanerDeadThreads reads), and kafka_cleaner_cleaner_thread_deaths_total keeps
    counting it after the next pass has new threads and the dead_threads gauge is back at 0."""
    data = make_log_dir(topics=1, partitions=2, records=2_000, keys=100)
    real = LogCleanerManager.grab_filthiest_compacted_log
    failures = {"left": 1}

    def flaky(self: LogCleanerManager, now: int, pre_stats: object = None) -> object:
        if failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("injected: not a partition's fault")
        return real(self, now, pre_stats)

    monkeypatch.setattr(LogCleanerManager, "grab_filthiest_compacted_log", flaky)
    policy = write_policy(tmp_path / "policy.yaml", mode="compact", topics=EAGER, compact=ALWAYS,
                          cleaner={"threads": 1})
    sc = new_sidecar(policy, [data], scan_ms=1_000)
    host, port = sc.serve()
    registry = sc.metrics.registry
    try:
        next_scan(sc, 1_000)  # the pass starts; its only thread dies
        finish_pass(sc)
        assert failures["left"] == 0
        assert status_of(sc)["cleaner"]["deadThreads"] == 1
        assert registry.get_sample_value("kafka_cleaner_dead_threads") == 1
        assert registry.get_sample_value("kafka_cleaner_cleaner_thread_deaths_total") == 1
        assert http_get(f"http://{host}:{port}/healthz")[0] == 200

        next_scan(sc, 60_000)  # past the back-off: a new pass, new threads, which clean
        finish_pass(sc)
        assert registry.get_sample_value("kafka_cleaner_cleanings_total", {"result": "success"}) >= 1
        assert registry.get_sample_value("kafka_cleaner_dead_threads") == 0
        assert registry.get_sample_value("kafka_cleaner_cleaner_thread_deaths_total") == 1
        assert http_get(f"http://{host}:{port}/healthz")[0] == 200
    finally:
        sc.stop()
