"""Observe mode next to a live broker: /status follows what the broker does, the sidecar
changes nothing (an hour of scans under a mock clock, proven three ways), and scans are
incremental."""

from __future__ import annotations

import mmap
import os
import random
import shutil
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from broker_lock import BrokerLock
from kafka_logs import snapshot_dir
from run_as import as_user
from sidecar_helpers import (
    SCAN_MS,
    SimBroker,
    assert_status_matches,
    new_sidecar,
    next_scan,
    status_of,
    write_policy,
)

from cleaner.storage.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleaner.storage.topic_partition import parse_partition_dir


def _checkpoint_third_segments(log_dir: Path) -> None:
    """As if the broker's cleaner had cleaned every partition up to its third segment."""
    offsets = {}
    for entry in log_dir.iterdir():
        tp = parse_partition_dir(entry.name) if entry.is_dir() else None
        if tp is not None:
            offsets[tp] = sorted(int(p.name.split(".")[0]) for p in entry.glob("*.log"))[2]
    OffsetCheckpointFile(log_dir / CLEANER_OFFSET_CHECKPOINT).write(offsets)


def test_observe_follows_a_live_broker(tmp_path: Path, make_log_dir) -> None:
    data = make_log_dir(compression="mixed")
    _checkpoint_third_segments(data)
    policy = write_policy(tmp_path / "policy.yaml", mode="observe")
    broker = SimBroker(data, seed=1)
    tps = sorted(broker.logs, key=str)
    with BrokerLock(data) as lock:
        sc = new_sidecar(policy, [data])
        sc.tick()
        doc = status_of(sc)
        assert doc["mode"] == "observe" and doc["cleaner"]["state"] == "observing"
        assert doc["logDirs"] == [
            {
                "path": str(data),
                "partitions": 4,
                "lockHeldByBroker": True,
                "freeBytes": doc["logDirs"][0]["freeBytes"],
                "uncleanablePartitions": 0,
            }
        ]
        before = assert_status_matches(sc, doc, data)
        assert 0 < doc["cleaner"]["maxDirtyRatio"] < 1

        # The broker runs freely while the sidecar scans: appends, rolls, retention.
        def play() -> None:
            rng = random.Random(7)
            for i in range(150):
                tp = rng.choice(tps)
                broker.append(tp, rng.randint(1, 30), tombstones=rng.randint(0, 3))
                if i % 30 == 10:
                    broker.roll(tp)
                if i == 75:
                    broker.retention(tps[1], 1)

        scans = 0
        player = threading.Thread(target=play)
        player.start()
        while player.is_alive() or scans < 3:
            next_scan(sc)
            scans += 1
        player.join()
        doc = next_scan(sc)
        assert doc["errors"] == [], doc["errors"]
        after = assert_status_matches(sc, doc, data)
        assert sum(w["records"] for w in after.values()) > sum(w["records"] for w in before.values())

        # Step by step, each followed by a scan: the numbers follow.
        a, b = tps[0], tps[2]
        batch = broker.append(a, 20, tombstones=6)
        doc = next_scan(sc)
        now = assert_status_matches(sc, doc, data)
        assert now[str(a)]["tombstones"] == after[str(a)]["tombstones"] + 6
        assert now[str(a)]["records"] == after[str(a)]["records"] + 20
        assert now[str(a)]["size"] == after[str(a)]["size"] + len(batch)

        ratio = now[str(a)]["ratio"]
        broker.roll(a)  # the active segment becomes cleanable
        doc = next_scan(sc)
        now = assert_status_matches(sc, doc, data)
        assert now[str(a)]["ratio"] > ratio

        broker.retention(b, 1)  # below the cleaner checkpoint: clean bytes go down
        doc = next_scan(sc)
        assert assert_status_matches(sc, doc, data)[str(b)]["clean"] < now[str(b)]["clean"]

        for _ in range(5):
            broker.append(b, 5)
        records = assert_status_matches(sc, next_scan(sc), data)[str(b)]["records"]
        broker.truncate(b, broker.log_end_offset(b) - 12)  # a follower after a leader change
        doc = next_scan(sc)
        assert assert_status_matches(sc, doc, data)[str(b)]["records"] < records
        broker.append(b, 7)
        assert_status_matches(sc, next_scan(sc), data)

        lock.release()  # the broker stops
        doc = next_scan(sc)
        assert doc["logDirs"][0]["lockHeldByBroker"] is False
        lock.acquire()  # and starts again
        doc = next_scan(sc)
        assert doc["logDirs"][0]["lockHeldByBroker"] is True
        assert doc["errors"] == []
    broker.close()


# -- proof of read-only ------------------------------------------------------------------------

_WRITE_EVENTS = {
    "os.rename",
    "os.remove",
    "os.rmdir",
    "os.mkdir",
    "os.utime",
    "os.truncate",
    "os.chmod",
    "os.chown",
    "os.link",
    "os.symlink",
    "shutil.rmtree",
    "shutil.move",
    "shutil.copyfile",
}
_WRITABLE_MAPS = (mmap.ACCESS_WRITE, mmap.ACCESS_DEFAULT)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class WriteAudit:
    """Every file-system write a thread attempts while ``watching`` (Python audit events:
    opens with a write flag, renames, removals, utime, writable mmaps, ...). Audit hooks
    cannot be removed; this one does nothing unless watching."""

    _installed: WriteAudit | None = None

    def __init__(self) -> None:
        self.thread: int | None = None
        self.attempts: list[tuple[str, tuple]] = []

    @classmethod
    def get(cls) -> WriteAudit:
        if cls._installed is None:
            cls._installed = WriteAudit()
            sys.addaudithook(cls._installed._hook)
        audit = cls._installed
        audit.attempts = []
        return audit

    def _hook(self, event: str, args: tuple) -> None:
        if self.thread is None or threading.get_ident() != self.thread:
            return
        if event == "open":
            flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
            if flags & _WRITE_FLAGS:
                self.attempts.append((event, args))
        elif event in _WRITE_EVENTS or (
            event == "mmap.__new__" and args[0] != -1 and args[2] in (mmap.ACCESS_WRITE, mmap.ACCESS_DEFAULT)
        ):
            self.attempts.append((event, args))

    def watching(self) -> _Watching:
        return _Watching(self)


class _Watching:
    def __init__(self, audit: WriteAudit) -> None:
        self.audit = audit

    def __enter__(self) -> None:
        self.audit.thread = threading.get_ident()

    def __exit__(self, *exc: object) -> None:
        self.audit.thread = None


def _stats(directory: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for root, _, names in os.walk(directory):
        for name in names:
            st = (Path(root) / name).stat()
            out[str((Path(root) / name).relative_to(directory))] = (st.st_mtime_ns, st.st_size)
    return out


def test_an_hour_of_observe_scans_changes_nothing(tmp_path: Path, make_log_dir) -> None:
    """Snapshot every file's bytes and mtime, run an hour of scans (125 x 30 s of MockTime)
    while a broker appends, rolls and deletes: every difference is the broker's.

    Three proofs: (1) the directory equals, byte for byte and file for file, a twin that
    got the same broker writes without a sidecar; (2) every mtime is the one the broker
    left (the broker thread records the files it touched); (3) the sidecar's thread never
    opened a file for writing, renamed, removed, utime'd or mapped one writable (audit
    hook). For the second half the broker writes between scans only, and every single scan
    is checked to leave the directory exactly as it found it."""
    data = make_log_dir(compression="mixed")
    twin = tmp_path / "twin"
    shutil.copytree(data, twin)
    locks = [BrokerLock(data).acquire(), BrokerLock(twin).acquire()]
    policy = write_policy(tmp_path / "policy.yaml", mode="observe")
    start = snapshot_dir(data)
    assert {k: v[0] for k, v in start.items()} == {k: v[0] for k, v in snapshot_dir(twin).items()}
    brokers = [SimBroker(data, seed=3), SimBroker(twin, seed=3)]
    tps = sorted(brokers[0].logs, key=str)
    broker_mtimes = {name: mtime for name, (_, mtime) in start.items()}

    def broker_op(i: int, rng: random.Random) -> None:
        tp = rng.choice(tps)
        n, tombs = rng.randint(1, 20), rng.randint(0, 2)
        for b in brokers:
            b.append(tp, n, tombstones=tombs)
            if i % 17 == 5:
                b.roll(tp)
            if i in (40, 90):
                b.retention(tp, 1)
        broker_mtimes.update({k: m for k, (m, _) in _stats(data).items()})

    sc = new_sidecar(policy, [data])
    audit = WriteAudit.get()
    ticks = 0
    with audit.watching():
        sc.tick()
    ticks += 1

    # First half: the broker runs concurrently with the scans.
    def play() -> None:
        rng = random.Random(11)
        for i in range(60):
            broker_op(i, rng)

    player = threading.Thread(target=play)
    player.start()
    while player.is_alive() or ticks < 60:
        sc.time.advance(SCAN_MS)
        with audit.watching():
            sc.tick()
        ticks += 1
    player.join()

    # Second half: broker writes between scans; each scan leaves the directory untouched.
    rng = random.Random(12)
    while ticks < 125:
        broker_op(60 + ticks, rng)
        before = snapshot_dir(data)
        sc.time.advance(SCAN_MS)
        with audit.watching():
            sc.tick()
        ticks += 1
        assert snapshot_dir(data) == before, f"scan {ticks} changed the directory"

    assert sc.time.milliseconds() - 1_700_000_000_000 >= 3_600_000
    assert audit.attempts == []
    end, end_twin = snapshot_dir(data), snapshot_dir(twin)
    assert sorted(end) == sorted(end_twin), "the sidecar created or removed a file"
    changed = [name for name in end if end[name][0] != end_twin[name][0]]
    assert changed == [], f"bytes differ from the twin: {changed}"
    assert {name: mtime for name, (_, mtime) in end.items()} == {name: broker_mtimes[name] for name in end}
    assert any(end[n] != start.get(n) for n in end), "the broker changed nothing?"
    doc = status_of(sc)
    assert doc["errors"] == [] and doc["scannedAt"] is not None
    for lock in locks:
        lock.release()
    for b in brokers:
        b.close()


# -- incrementality ----------------------------------------------------------------------------


def _scan_bytes_metric(sc) -> float:
    return sc.metrics.registry.get_sample_value("kafka_cleaner_scan_bytes_read_total") or 0.0


def test_an_unchanged_segment_is_not_read_again(tmp_path: Path, make_log_dir) -> None:
    data = make_log_dir(compression="lz4")
    policy = write_policy(tmp_path / "policy.yaml")
    sc = new_sidecar(policy, [data])
    sc.tick()
    total = sum(p.stat().st_size for p in data.glob("*/*.log"))
    assert sc.facts.bytes_read == total == _scan_bytes_metric(sc)

    for _ in range(3):  # unchanged: nothing is read
        next_scan(sc)
        assert sc.facts.bytes_read == total == _scan_bytes_metric(sc)

    broker = SimBroker(data)
    appended = sum(len(broker.append(tp, 25, tombstones=2)) for tp in broker.logs)
    next_scan(sc)  # only the appended batches
    assert sc.facts.bytes_read - total == appended == _scan_bytes_metric(sc) - total
    next_scan(sc)
    assert sc.facts.bytes_read - total == appended
    broker.close()


def _thread_rchar() -> int:
    with open("/proc/thread-self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar"))


@pytest.mark.skipif(not Path("/proc/thread-self/io").exists(), reason="needs Linux's /proc/thread-self/io")
def test_a_scan_after_an_append_reads_little_more_than_the_appended_bytes(tmp_path: Path, make_log_dir) -> None:
    """What the thread really reads (``rchar``: every read(2)/pread(2)), not only what the
    facts cache counts: after an append, a scan reads the appended bytes a few times
    (end offset, producer state, facts) plus the checkpoint files, never the segment."""
    data = make_log_dir(topics=1, partitions=1, compression="none")
    policy = write_policy(tmp_path / "policy.yaml")
    sc = new_sidecar(policy, [data])
    sc.tick()
    broker = SimBroker(data)
    tp = next(iter(broker.logs))
    for _ in range(6):
        appended = sum(len(broker.append(tp, 40)) for _ in range(50))
        before = _thread_rchar()
        next_scan(sc)
        read = _thread_rchar() - before
        assert read <= 3 * appended + 32 * 1024, (read, appended, broker.logs[tp].active_segment.size)
    broker.close()


def test_a_rolled_segment_is_not_read_again(tmp_path: Path, make_log_dir) -> None:
    """The issue: 'a closed segment that has not changed since the last scan is not read
    again'. Rolling does not change the old active segment's .log file."""
    data = make_log_dir(topics=1, partitions=1, compression="none")
    policy = write_policy(tmp_path / "policy.yaml")
    sc = new_sidecar(policy, [data])
    broker = SimBroker(data)
    tp = next(iter(broker.logs))
    broker.append(tp, 30)
    sc.tick()
    read = sc.facts.bytes_read
    broker.roll(tp)
    next_scan(sc)
    assert sc.facts.bytes_read == read
    broker.close()


def test_facts_follow_a_truncation_and_regrowth_between_two_scans(tmp_path: Path, make_log_dir) -> None:
    data = make_log_dir(topics=1, partitions=1, compression="none")
    policy = write_policy(tmp_path / "policy.yaml")
    sc = new_sidecar(policy, [data])
    broker = SimBroker(data)
    tp = next(iter(broker.logs))
    for _ in range(10):
        broker.append(tp, 5)
    sc.tick()
    broker.truncate(tp, broker.log_end_offset(tp) - 30)
    for _ in range(12):
        broker.append(tp, 5, tombstones=5)
    doc = next_scan(sc)
    assert_status_matches(sc, doc, data)
    broker.close()


def test_observe_mode_reads_logs_it_cannot_write(make_log_dir, request: pytest.FixtureRequest) -> None:
    """The operator mounts the data volume read-only in observe mode: the scans work on a
    tree the sidecar may not write. As root (CI) the sidecar runs as uid 65534 on files of
    the broker's uid 1001 (directories 0755, files 0644); otherwise every write bit is
    dropped. Either way it reports every partition, no error, and nothing changes."""
    # Under a directory every uid may traverse (pytest's tmp_path is root's alone).
    shared = Path(tempfile.mkdtemp(prefix="kafka-cleaner-ro-"))
    shared.chmod(0o755)
    data = shutil.move(make_log_dir(topics=1, partitions=2), shared / "kafka-logs")
    policy = write_policy(shared / "policy.yaml")
    policy.chmod(0o644)
    tree = [Path(root) / n for root, dirs, names in os.walk(data) for n in [*dirs, *names]]
    modes = {p: p.stat().st_mode for p in [data, *tree]}

    def restore() -> None:
        for p, mode in modes.items():
            p.chmod(mode)
        shutil.rmtree(shared, ignore_errors=True)

    request.addfinalizer(restore)
    if os.geteuid() == 0:
        for p in [data, *tree]:
            os.chown(p, 1001, 1001)
            p.chmod(0o755 if p.is_dir() else 0o644)
    else:
        for p in sorted(modes, key=lambda p: -len(p.parts)):
            p.chmod(modes[p] & ~0o222)
    before = snapshot_dir(data)

    def observe() -> dict:
        assert not os.access(data / "topic-0-0", os.W_OK), "the scan would not prove anything"
        sc = new_sidecar(policy, [data])
        sc.tick()
        doc = status_of(sc)
        dirty = doc["topics"][0]["dirtyBytes"]
        return {"errors": doc["errors"], "partitions": len(sc.snapshot.statuses), "dirtyBytes": dirty}

    got = as_user(65534, 65534, [], observe) if os.geteuid() == 0 else observe()
    assert got["errors"] == [] and got["partitions"] == 2 and got["dirtyBytes"] > 0, got
    assert snapshot_dir(data) == before
