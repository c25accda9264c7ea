"""A real broker running as its own uid (1001, as Strimzi and Bitnami run it) starts on what
kafka-cleaner left in its log dir when kafka-cleaner ran as another uid (issue 27 item 1,
issue 21 item 1), per Kafka line (4.3.1 and 3.9.2):

1. ``kafka-cleaner clean`` run as root on the stopped broker's log dir: every file it wrote
   (the ``.lock``, ``cleaner-offset-checkpoint``, the rewritten segments and indexes) is the
   broker's; the broker starts, loads the cleaned log and serves every key's latest value.
   (It used to leave them root's, mode 0644: the broker exited with ``AccessDeniedException``.)
2. a commit's lock holder running as 65532 with the broker's group (the sidecar with the pod's
   fsGroup), SIGKILLed while holding the lock: the ``.lock`` it leaves is one the broker opens
   read-write and locks; the broker starts and serves. (It used to leave 65532's 0644 file.)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from kafka_broker import EACH_KAFKA_LINE, RealBroker
from run_as import killed_while_holding

from cleaner.cli import main
from cleaner.storage.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile

pytestmark = [
    pytest.mark.slow,
    EACH_KAFKA_LINE,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the broker as uid 1001"),
]

BROKER = (1001, 1001)
SIDECAR = 65532
TOPIC = "owned"
KEYS = 150
POLICY = f"mode: compact\ntopics:\n  - match: {TOPIC}\n    cleanupPolicy: compact\n    minCleanableDirtyRatio: 0.01\n"
WORDS = ("AccessDenied", "Permission denied", "offline", "Failed to acquire lock")


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory the broker's uid may traverse (pytest's tmp_path is root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="kafka-cleaner-owner-kafka-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _owned_broker(shared: Path, line: str) -> tuple[RealBroker, dict[bytes, bytes]]:
    """A broker running as 1001 with a compacted topic of several segments, stopped cleanly;
    every key's latest value."""
    broker = RealBroker(shared / "broker", line, user=BROKER).start()
    try:
        broker.create_topic(TOPIC, 1, {"cleanup.policy": "compact", "segment.bytes": str(1 << 20)})
        latest: dict[bytes, bytes] = {}
        records = []
        for n in range(5_000):
            key, value = b"key-%03d" % (n % KEYS), b"%06d:" % n + bytes(700)
            records.append((0, key, value))
            latest[key] = value
        broker.produce(TOPIC, records)
    finally:
        broker.stop()
    assert not (broker.log_dir / ".lock").exists(), "a clean shutdown deletes the .lock (FileLock.destroy)"
    segments = sorted((broker.log_dir / f"{TOPIC}-0").glob("*.log"))
    assert len(segments) >= 3, f"too few segments to clean: {segments}"
    return broker, latest


def _not_the_brokers(log_dir: Path) -> dict[str, tuple[int, int, str]]:
    out = {}
    for d, _dirs, names in os.walk(log_dir):
        for n in names:
            st = (Path(d) / n).lstat()
            if (st.st_uid, st.st_gid) != BROKER or st.st_mode & 0o600 != 0o600:
                out[str((Path(d) / n).relative_to(log_dir))] = (st.st_uid, st.st_gid, oct(st.st_mode & 0o7777))
    return out


def _starts_and_serves(broker: RealBroker, latest: dict[bytes, bytes]) -> None:
    broker.start(wait=False)
    broker.wait_ready()
    try:
        assert broker.consume(TOPIC, 1)[0] == latest
        assert broker.problems(WORDS) == [], broker.problems(WORDS)
    finally:
        broker.stop()


def test_a_clean_as_root_leaves_a_log_dir_the_brokers_uid_starts_on(shared: Path, line: str) -> None:
    broker, latest = _owned_broker(shared, line)
    assert _not_the_brokers(broker.log_dir) == {}
    policy = shared / "policy.yaml"
    policy.write_text(POLICY)

    result = CliRunner().invoke(main, ["clean", str(broker.log_dir), "--policy", str(policy), "--no-progress"])
    assert result.exit_code == 0, result.output
    cleaned = OffsetCheckpointFile(broker.log_dir / CLEANER_OFFSET_CHECKPOINT).read()
    assert cleaned and (broker.log_dir / ".lock").exists(), (cleaned, result.output)
    assert _not_the_brokers(broker.log_dir) == {}, "files the clean left that the broker cannot open"

    _starts_and_serves(broker, latest)


def test_a_commit_killed_as_another_uid_leaves_a_lock_the_broker_starts_on(shared: Path, line: str) -> None:
    broker, latest = _owned_broker(shared, line)
    broker.log_dir.chmod(0o2775)  # the fsGroup's: group-writable, set-group-ID
    killed_while_holding(broker.log_dir, SIDECAR, SIDECAR, [BROKER[1]])
    assert (broker.log_dir / ".lock").exists(), "the killed holder's .lock is gone: the test proves nothing"

    _starts_and_serves(broker, latest)
