"""Crash, then start a real broker (issue 9): ``kafka-cleaner clean`` is SIGKILLed at 20
seeded random points per Kafka line, and a real broker (4.3.1, 3.9.2) starts on whatever it
left and serves every key's latest committed value at the same offsets, without a WARN or
ERROR about the topic. Every fourth time the broker is itself SIGKILLed during its start-up
on those leftovers first, then started again.

The kill points are spread over the clean itself (after the interpreter's start, measured
on an uninterrupted run), and the test checks that they landed mid-clean often enough to
mean something: ``.cleaned``/``.swap`` files left, or some partitions cleaned and others not.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from broker_workload import CLI, PARTITIONS, POLICY, TOPIC, live, produce_workload, read_all
from kafka_broker import EACH_KAFKA_LINE, RealBroker

from cleaner.storage.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile

pytestmark = [
    pytest.mark.slow,
    EACH_KAFKA_LINE,
    # The suite's 600 s is a guard against a hang; this test is 22 cleans and 25 broker starts
    # whose every step has its own deadline: 160 s alone, 453-623 s in loaded fresh-clone runs
    # (two or three suites at once on 2 cores), too near 600 s or past it for a guard.
    pytest.mark.timeout(1800),
]

KILLS = 20


def _clean_process(log_dir: Path, policy: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(CLI), "clean", str(log_dir), "--policy", str(policy)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def _timed_clean(log_dir: Path, policy: Path) -> tuple[float, float]:
    """How long a whole clean takes, and how long it runs after its first file is written."""
    started = time.monotonic()
    cleaner = _clean_process(log_dir, policy)
    _until_a_clean_writes(log_dir, cleaner)
    writing = time.monotonic()
    assert cleaner.wait(120) == 0
    ended = time.monotonic()
    return ended - started, ended - writing


def _until_a_clean_writes(log_dir: Path, cleaner: subprocess.Popen[bytes]) -> None:
    """Until a ``.cleaned`` (or ``.swap``) file of the topic exists, or the cleaner has exited."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and cleaner.poll() is None:
        if any(p.name.endswith((".cleaned", ".swap")) for p in log_dir.glob(f"{TOPIC}-*/*")):
            return
        time.sleep(0.002)


def _state(log_dir: Path) -> str:
    leftovers = [p.name for p in log_dir.glob(f"{TOPIC}-*/*") if p.name.endswith((".cleaned", ".swap", ".deleted"))]
    cleaned = OffsetCheckpointFile(log_dir / CLEANER_OFFSET_CHECKPOINT).read()
    done = sum(1 for tp in cleaned if tp.topic == TOPIC)
    if leftovers or 0 < done < PARTITIONS:
        return "mid-clean"
    return "done" if done == PARTITIONS else "not started"


def test_a_broker_starts_on_whatever_a_killed_clean_left(tmp_path: Path, line: str) -> None:
    broker = RealBroker(tmp_path / "broker", line, separate_metadata=False).start()
    try:
        broker.create_topic(TOPIC, PARTITIONS, {"cleanup.policy": "compact", "segment.bytes": str(1 << 20)})
        for seed in (1, 2):  # two rounds of versions: several segments to rewrite per partition
            produce_workload(broker, seed=seed)
        expected = live(read_all(broker, "read_committed"))
        offsets = broker.offsets(TOPIC, PARTITIONS)
    finally:
        broker.stop()
    pristine = tmp_path / "pristine"
    shutil.copytree(broker.log_dir, pristine)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    # The kills are timed from a clean measured here: the faster of two, since the first run of
    # a fresh clone's CLI pays for cold imports and caches (an inflated time made 12 of 20 kills
    # land after the clean had finished, in a fresh-clone CI run).
    started = time.monotonic()
    assert subprocess.run([str(CLI), "--version"], capture_output=True, check=False).returncode == 0
    start_up = time.monotonic() - started
    timings = []
    for n in range(2):
        probe = tmp_path / f"probe-{n}"
        shutil.copytree(pristine, probe)
        timings.append(_timed_clean(probe, policy))
        shutil.rmtree(probe)
    whole = min(t for t, _ in timings)
    writing = min(w for _, w in timings)

    rng = random.Random(int(line.replace(".", "")))
    states: dict[str, int] = {}
    for kill in range(KILLS):
        shutil.rmtree(broker.log_dir)
        shutil.copytree(pristine, broker.log_dir)
        cleaner = _clean_process(broker.log_dir, policy)
        if kill % 2:  # at a random time of the whole clean
            time.sleep(rng.uniform(start_up * 0.8, whole))
        else:  # once its files are on disk, while it writes: mid-clean on a machine of any speed
            # (a quarter of the whole clean was too long once lz4 and zstd moved into the core:
            # 16 of 20 kills found the clean done)
            _until_a_clean_writes(broker.log_dir, cleaner)
            time.sleep(rng.uniform(0, writing))
        cleaner.send_signal(signal.SIGKILL)
        cleaner.wait(30)
        state = _state(broker.log_dir)
        states[state] = states.get(state, 0) + 1
        if kill % 4 == 3:  # the broker dies while it loads the leftovers
            # Killed only once the metadata quorum has its leader: Kafka 3.9's single voter,
            # killed between persisting its vote for itself and persisting its leadership,
            # can never start again (KafkaRaftClient.initialize becomes leader, then calls
            # transitionToCandidate: IllegalStateException; reworked in 4.0 by KAFKA-17642).
            # That is Kafka's own quorum-state file, not ours; the logs load after this point.
            broker.start(wait=False)
            broker.wait_for_log("Completed transition to Leader")
            time.sleep(rng.uniform(0.0, 1.0))
            broker.stop(kill=True)
        broker.start()
        try:
            where = f"kill {kill} ({state}, {sorted(os.listdir(broker.log_dir / f'{TOPIC}-0'))})"
            assert live(read_all(broker, "read_committed")) == expected, where
            assert broker.offsets(TOPIC, PARTITIONS) == offsets, where
            assert broker.problems([TOPIC]) == [], (where, broker.problems([TOPIC]))
        finally:
            broker.stop(kill=True)
    assert states.get("mid-clean", 0) >= KILLS // 4, f"too few kills landed mid-clean: {states}"
