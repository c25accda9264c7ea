"""The policy is reloaded without a restart: the ConfigMap mount is swapped through its
``..data`` symlink, ``policyGeneration`` follows, cleaner settings restart the cleaner
threads, and a mode change switches the controller."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from sidecar_helpers import ALWAYS, ConfigMapMount, finish_pass, new_sidecar, next_scan, status_of

from cleaner.engine.cleaner import Cleaner
from cleaner.sidecar import service

POLL_MS = service.POLICY_POLL_MS


def test_a_configmap_swap_is_picked_up(tmp_path: Path, make_log_dir) -> None:
    data = make_log_dir(topics=1, partitions=1)
    mount = ConfigMapMount(tmp_path / "policy", mode="observe", generation=1)
    sc = new_sidecar(mount.path, [data])
    sc.tick()
    assert status_of(sc)["policyGeneration"] == 1
    mount.update(mode="observe", generation=2, reporting={"topPartitions": 1})
    doc = next_scan(sc, POLL_MS)
    assert doc["policyGeneration"] == 2
    assert sc.metrics.registry.get_sample_value("kafka_cleaner_policy_generation") == 2
    # A broken file keeps the last good policy and says so.
    (tmp_path / "policy" / "..data" / "policy.yaml").write_text("spec: {mode: sideways}\n")
    doc = next_scan(sc, POLL_MS)
    assert doc["policyGeneration"] == 2 and doc["mode"] == "observe"
    assert any("spec.mode" in e["message"] for e in doc["errors"])
    mount.update(mode="observe", generation=3)
    assert next_scan(sc, POLL_MS)["policyGeneration"] == 3


def _long_clean(started: threading.Event):
    """A ``Cleaner.clean`` that runs until its thread is told to stop, checking in as the
    real round does before every chunk (``check_done``): a pass that is surely running."""

    def clean(cleaner: Cleaner, ltc, commit=None):
        started.set()
        while True:
            cleaner.check_done(ltc.topic_partition)
            threading.Event().wait(0.01)

    return clean


def test_cleaner_settings_restart_the_threads(tmp_path: Path, make_log_dir, monkeypatch: pytest.MonkeyPatch) -> None:
    data = make_log_dir(topics=2, partitions=2)
    started = threading.Event()
    monkeypatch.setattr(Cleaner, "clean", _long_clean(started))
    mount = ConfigMapMount(tmp_path / "policy", mode="compact", generation=1)
    sc = new_sidecar(mount.path, [data], scan_ms=1_000)
    sc.tick()
    assert started.wait(10)
    pool = sc._controller.pool
    before = list(pool.threads)
    assert len(before) == 1 and before[0].is_alive()

    # A topic rule changes: the cleaner threads go on.
    mount.update(mode="compact", generation=2, topics=[{"match": "topic-.*", "cleanupPolicy": "compact,delete"}])
    doc = next_scan(sc, POLL_MS)
    assert doc["policyGeneration"] == 2 and pool.threads == before and before[0].is_alive()

    # The cleaner settings change: the threads are replaced, with the new settings.
    mount.update(mode="compact", generation=3, cleaner={"threads": 2, "dedupeBufferSize": 8 * 1024 * 1024})
    doc = next_scan(sc, POLL_MS)
    assert doc["policyGeneration"] == 3 and doc["cleaner"]["threads"] == 2
    assert sc._controller.pool is pool and len(pool.threads) == 2
    assert not any(t in before for t in pool.threads) and not before[0].is_alive()
    assert pool.config.threads == 2 and pool.threads[0].cleaner.offset_map is not before[0].cleaner.offset_map
    monkeypatch.undo()
    sc.stop()


def test_a_mode_change_switches_the_controller(tmp_path: Path, make_log_dir) -> None:
    data = make_log_dir(topics=1, partitions=2)
    mount = ConfigMapMount(tmp_path / "policy", mode="observe", generation=1)
    sc = new_sidecar(mount.path, [data], scan_ms=1_000)
    sc.tick()
    assert type(sc._controller) is service._Controller and status_of(sc)["mode"] == "observe"

    mount.update(mode="compact", generation=2, compact=ALWAYS)
    doc = next_scan(sc, POLL_MS)
    assert type(sc._controller) is service._CompactController
    assert doc["mode"] == "compact" and doc["cleaner"]["state"] == "cleaning"
    finish_pass(sc)
    assert status_of(sc)["cleaner"]["bytesReclaimedTotal"] > 0

    mount.update(mode="stage", generation=3)
    doc = next_scan(sc, POLL_MS)
    assert type(sc._controller) is service._StageController and doc["mode"] == "stage"

    mount.update(mode="observe", generation=4)
    doc = next_scan(sc, POLL_MS)
    assert type(sc._controller) is service._Controller
    assert doc["mode"] == "observe" and doc["cleaner"]["state"] == "observing"


def test_stage_mode_rebuilds_its_cleaner_on_new_settings(tmp_path: Path, make_log_dir) -> None:
    data = make_log_dir(topics=1, partitions=2)
    mount = ConfigMapMount(tmp_path / "policy", mode="stage", generation=1)
    sc = new_sidecar(mount.path, [data])
    sc.tick()  # the start-up gate
    next_scan(sc)  # the first round
    first = sc._controller._cleaner
    assert first is not None
    mount.update(mode="stage", generation=2, cleaner={"dedupeBufferSize": 2 * 1024 * 1024})
    next_scan(sc, POLL_MS)
    assert sc._controller._cleaner is not first
    assert sc._controller._cleaner.offset_map.slots < first.offset_map.slots
