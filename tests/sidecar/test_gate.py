"""The start-up gate and compact mode's maintenance windows.

In a pod the native sidecar starts before the broker, and its startupProbe (``/startupz``)
holds the broker until the gate is open. Before that the sidecar takes no lock and changes
no file; compact mode's gate runs one pass bounded by ``compact.maxGateSeconds``; after the
gate compact mode holds ``.lock`` only inside a maintenance window."""

from __future__ import annotations

import datetime
import logging
import time
from pathlib import Path

import pytest
from broker_lock import BrokerLock, lock_is_free_for_another_process
from kafka_logs import leftover_files, snapshot_dir
from sidecar_helpers import (
    SimBroker,
    finish_pass,
    http_get,
    new_sidecar,
    next_scan,
    status_of,
    write_policy,
)

from cleaner.clock import MockTime
from cleaner.storage.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleaner.storage.topic_partition import TopicPartition

EAGER = [{"match": "topic-.*", "cleanupPolicy": "compact", "minCleanableDirtyRatio": 0.01}]


def _ms(*args: int) -> int:
    return int(datetime.datetime(*args, tzinfo=datetime.UTC).timestamp() * 1000)


@pytest.mark.parametrize("mode", ["observe", "compact", "stage"])
def test_startupz_is_503_until_the_gate_is_open_and_nothing_changes_before(
    tmp_path: Path, make_log_dir, mode: str
) -> None:
    data = make_log_dir(topics=1, partitions=2)
    before = snapshot_dir(data)
    sc = new_sidecar(write_policy(tmp_path / "policy.yaml", mode=mode), [data])
    host, port = sc.serve()
    try:
        code, body, _ = http_get(f"http://{host}:{port}/startupz")
        assert code == 503 and b"pending" in body
        assert snapshot_dir(data) == before and not (data / ".lock").exists()
        sc.tick()
        if mode == "compact":
            finish_pass(sc)
        assert http_get(f"http://{host}:{port}/startupz")[0] == 200
        assert status_of(sc)["gate"]["state"] == "open"
    finally:
        sc.stop()


def test_the_compact_gate_cleans_then_compact_never_takes_the_lock_outside_a_window(
    tmp_path: Path, make_log_dir
) -> None:
    data = make_log_dir(topics=1, partitions=2, records=3_000, keys=150)
    policy = write_policy(tmp_path / "policy.yaml", mode="compact", topics=EAGER)
    sc = new_sidecar(policy, [data], scan_ms=1_000)
    sc.tick()
    assert status_of(sc)["gate"]["state"] == "running" and not lock_is_free_for_another_process(data)
    finish_pass(sc)
    doc = status_of(sc)
    assert doc["gate"]["state"] == "open" and doc["gate"]["compacted"] == 2 and not doc["gate"]["timedOut"]
    assert {str(tp) for tp in OffsetCheckpointFile(data / CLEANER_OFFSET_CHECKPOINT).read()} == {
        "topic-0-0",
        "topic-0-1",
    }
    assert lock_is_free_for_another_process(data), "the gate still holds the .lock"
    # The broker starts, writes, stops; the sidecar, outside any window, never takes the lock.
    with BrokerLock(data):
        broker = SimBroker(data, seed=1)
        for tp in broker.logs:
            broker.append(tp, 50, tombstones=5)
            broker.roll(tp)
        broker.close()
    before = snapshot_dir(data)
    for _ in range(5):
        doc = next_scan(sc, 5_000)
        assert doc["cleaner"]["state"] == "idle" and doc["compact"] == {"windows": [], "inWindow": False}
        assert lock_is_free_for_another_process(data)
    assert snapshot_dir(data) == before


class ThrottledClock(MockTime):
    """The wall clock is the test's (``set``/``advance``); a throttled cleaner's sleep takes
    real time (2 ms a call, whatever it asks: the sidecar sleeps in 100 ms slices) and moves
    only the monotonic clock. A throttled pass then takes a second or so of real time: really
    in flight when the test looks, without waiting out real throttle times."""

    def sleep(self, ms: float) -> None:
        if ms > 0:
            time.sleep(0.002)
            with self._changed:
                self._nanos += int(ms * 1_000_000)


class WorkingClock(ThrottledClock):
    """A ``ThrottledClock`` whose monotonic clock also moves as the work reads it (50 ms a
    read), as a real one moves while a cleaner works. Kafka's throttler first checks the rate
    300 ms into a pass: on a clock nothing else moves, it never checks, and a small pass runs
    unthrottled in a fraction of a second (a fresh-clone CI run finished the whole pass while
    the test started the lock probe's Python process, then waited 120 s for a ``.cleaned``
    file). Here the check comes a few reads into the pass, which is throttled from then on,
    whatever the scheduling."""

    def nanoseconds(self) -> int:
        with self._changed:
            self._nanos += 50_000_000
            return self._nanos


def _wait_for_a_clean_in_flight(data: Path, clock: ThrottledClock | None = None) -> None:
    """Until a ``.cleaned`` file exists. On a clock that moves (``clock`` below, or a
    ``WorkingClock``) the map pass before it takes some 1000 throttle sleeps of 2 ms real time
    each: a few seconds alone, several times that on a loaded 2-core CI machine. With
    ``clock``, the clock moves on meanwhile (20 ms a poll), as a wall clock would: a cleaner
    thread whose first round found nothing to take backs off ``backoffMs`` on it, and would
    otherwise wait for a clock that nothing moves; the moving clock also lets the throttle go
    faster, so a clean that already finished (its checkpoint written) counts too."""
    deadline = time.monotonic() + 120
    checkpoint = data / CLEANER_OFFSET_CHECKPOINT
    while not any(p.name.endswith(".cleaned") for p in data.glob("*/*")):
        if clock is not None and checkpoint.exists() and OffsetCheckpointFile(checkpoint).read():
            return
        assert time.monotonic() < deadline, "no clean started"
        time.sleep(0.001)
        if clock is not None:
            clock.advance(20)


SLOW = {"maxIoBytesPerSecond": 2_000}


def test_the_compact_gate_is_bounded_and_a_broker_holding_the_lock_opens_it_at_once(
    tmp_path: Path, make_log_dir
) -> None:
    data = make_log_dir(topics=1, partitions=2, records=3_000, keys=150)
    policy = write_policy(
        tmp_path / "policy.yaml",
        mode="compact",
        topics=EAGER,
        compact={"maxGateSeconds": 5},
        cleaner={"maxIoBytesPerSecond": 10_000},  # ~2 s of real time to the first .cleaned
    )
    with BrokerLock(data):
        before = snapshot_dir(data)
        sc = new_sidecar(policy, [data])
        sc.tick()
        doc = status_of(sc)
        assert doc["gate"]["state"] == "open" and doc["gate"]["lockHeldByBroker"] == [str(data)]
        assert snapshot_dir(data) == before
    # A gate whose time runs out aborts its (throttled) pass and gives the lock back.
    clock = WorkingClock()
    sc = new_sidecar(policy, [data], clock)
    sc.tick()
    assert sc.gate.state == "running"
    _wait_for_a_clean_in_flight(data)
    # (Asked only now: the probe is a new Python process, which a loaded machine may take a
    # second or more to start, while the pass goes on.)
    assert not lock_is_free_for_another_process(data)
    clock.advance(5_000)
    sc.tick()
    doc = status_of(sc)
    assert doc["gate"]["state"] == "open" and doc["gate"]["timedOut"] is True
    assert lock_is_free_for_another_process(data) and leftover_files(data) == []
    # One partition's clean was cut short: its checkpoint (if the aborted clean wrote one, as
    # Kafka's doneCleaning does at shutdown) stays at its first dirty offset, 0.
    cleaned_to = OffsetCheckpointFile(data / CLEANER_OFFSET_CHECKPOINT).read()
    assert min(cleaned_to.get(TopicPartition("topic-0", p), 0) for p in (0, 1)) == 0, "the pass was not aborted"


def test_compact_takes_the_lock_only_inside_a_window_and_gives_it_back_when_it_closes(
    tmp_path: Path, make_log_dir
) -> None:
    data = make_log_dir(topics=1, partitions=2, records=3_000, keys=150)
    # 00:00:00-00:59:59 UTC every day; a throttled pass that outlives the window.
    policy = write_policy(
        tmp_path / "policy.yaml",
        mode="compact",
        topics=EAGER,
        compact={"windows": ["* * 0 ? * *"], "maxGateSeconds": 0},
        cleaner=SLOW,
    )
    clock = ThrottledClock(_ms(2024, 1, 1, 23, 58))
    sc = new_sidecar(policy, [data], clock, scan_ms=1_000)
    sc.tick()
    assert status_of(sc)["gate"]["skipped"] == "compact.maxGateSeconds is 0"
    for _ in range(3):  # 23:58 .. 23:59: outside
        doc = next_scan(sc, 30_000)
        assert doc["cleaner"]["state"] == "idle" and lock_is_free_for_another_process(data)
    clock.set(_ms(2024, 1, 2, 0, 0, 5))
    sc.tick()
    assert status_of(sc)["compact"]["inWindow"] and status_of(sc)["cleaner"]["state"] == "cleaning"
    assert not lock_is_free_for_another_process(data)
    _wait_for_a_clean_in_flight(data, clock)  # well inside the window (it closes at 01:00)
    clock.set(_ms(2024, 1, 2, 1, 0, 0))  # the window closes while the pass is in flight
    sc.tick()
    assert sc._controller.pool is None and lock_is_free_for_another_process(data)
    assert leftover_files(data) == [] and status_of(sc)["cleaner"]["state"] == "idle"
    # (Whether the pass was still in flight when the window closed depends on the machine's
    # speed: the bounded gate's test above checks the abort itself.)


def test_errors_reach_the_log_state_names_the_mode_and_a_local_policy_has_a_generation(
    tmp_path: Path, make_log_dir, caplog: pytest.LogCaptureFixture
) -> None:
    data = make_log_dir(topics=1, partitions=1)
    policy = tmp_path / "policy.yaml"
    policy.write_text("mode: stage\ntopics: [{match: 'topic-.*', cleanupPolicy: compact}]\n")  # a bare local spec
    sc = new_sidecar(policy, [data])
    with caplog.at_level(logging.WARNING, logger="cleaner.sidecar"):
        sc.tick()
        doc = status_of(sc)
        assert doc["policyGeneration"] == 1 and doc["cleaner"]["state"] in ("idle", "staging")
        policy.write_text("mode: [broken\n")
        doc = next_scan(sc, 60_000)
    assert doc["policyGeneration"] == 1  # the last good policy stays
    assert any(e["message"].startswith("policy:") for e in doc["errors"])
    assert any("policy:" in r.getMessage() for r in caplog.records), "a reload failure did not reach the log"
    policy.write_text("mode: observe\n")
    doc = next_scan(sc, 60_000)
    assert doc["policyGeneration"] == 2 and doc["cleaner"]["state"] == "observing"


def test_a_partition_in_two_log_dirs_is_an_error_and_neither_copy_is_touched(tmp_path: Path, make_log_dir) -> None:
    one = make_log_dir("one", topics=1, partitions=2)
    two = make_log_dir("two", topics=1, partitions=1)  # topic-0-0 again
    before = {d: snapshot_dir(d) for d in (one, two)}
    policy = write_policy(tmp_path / "policy.yaml", mode="compact", topics=EAGER, compact={"windows": ["* * * ? * *"]})
    sc = new_sidecar(policy, [one, two], scan_ms=1_000)
    for _ in range(3):
        doc = next_scan(sc, 2_000)
        finish_pass(sc)
    assert any(e["partition"] == "topic-0-0" and "more than one log dir" in e["message"] for e in doc["errors"]), doc[
        "errors"
    ]
    assert {d: snapshot_dir(d) for d in (one, two)} == before
