"""Which directory and which file a scan is reading, next to a broker that moves partitions
between its log dirs and deletes, creates and renames segment files all the time (the soak's
findings, ``tests/soak``):

1. a partition moved to the other log dir (AlterReplicaLogDirs: Kafka copies it into
   ``<name>.<uuid>-future`` there, renames that into place and the old dir to ``-delete``)
   is scanned where it is now, not at the old path for as long as the sidecar runs;
2. a segment file replaced by a new one that got the old one's inode number (file systems
   hand a freed inode to the next new file at once) is read afresh: no stale facts, no
   lasting "corrupt" verdict;
3. a segment deleted by retention between a scan's listing and its read is "the file
   changed, look again", never a raw ENOENT or an uncleanable partition.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sidecar_helpers import NOW_MS, new_sidecar, next_scan, write_policy

from cleaner.clock import MockTime
from cleaner.config import load_policy
from cleaner.engine.manager import LogCleanerManager
from cleaner.records.builder import build_batch
from cleaner.records.record import Record
from cleaner.segment_facts import FactsCache
from cleaner.sidecar.facts import ScanFactsCache
from cleaner.sidecar.service import Sidecar
from cleaner.storage.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleaner.storage.log import Log, LogConfig
from cleaner.storage.log_dir import LogDirectory
from cleaner.storage.segment import LogSegment
from cleaner.storage.topic_partition import TopicPartition

MakeLogDir = Callable[..., Path]
TP = TopicPartition("topic-0", 0)


def _partitions(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{p['topic']}-{p['partition']}": p for p in doc["partitions"]}


def _statuses(sc: Sidecar) -> dict[str, Any]:
    assert sc.snapshot is not None
    return {str(s.report.topic_partition): s for s in sc.snapshot.statuses}


def _picture(sc: Sidecar) -> dict[str, tuple[Any, ...]]:
    """Every partition of the last scan: where, offsets, sizes, reason and record facts."""
    return {
        name: (
            Path(s.report.log_dir).name,
            s.report.log_start_offset,
            s.report.log_end_offset,
            s.report.size_bytes,
            s.report.reason,
            s.report.uncleanable_reason,
            s.facts,
        )
        for name, s in _statuses(sc).items()
    }


def _fresh_picture(policy: Path, dirs: list[Path]) -> dict[str, tuple[Any, ...]]:
    """What a sidecar started now sees (two scans: a first look is reported at once)."""
    sc = new_sidecar(policy, dirs)
    next_scan(sc)
    next_scan(sc)
    return _picture(sc)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def _empty_log_dir(path: Path, like: Path) -> Path:
    """A second log dir of the same broker (its meta.properties), holding no partition yet."""
    path.mkdir()
    shutil.copy(like / "meta.properties", path / "meta.properties")
    for name in ("recovery-point-offset-checkpoint", "replication-offset-checkpoint", "log-start-offset-checkpoint"):
        OffsetCheckpointFile(path / name).write({})
    return path


def _append(partition_dir: Path, n: int = 200) -> int:
    """The broker appends ``n`` records to the partition (in whatever dir it is); returns the
    new log end offset."""
    log = Log.open(partition_dir, LogConfig())
    base = log.log_end_offset
    records = [Record(base + i, NOW_MS + i, b"key-%04d" % (i % 50), b"moved-%d" % i) for i in range(n)]
    log.append(build_batch(records))
    log.close()
    return base + n


def _move(tp: TopicPartition, source: Path, target: Path, *, then_append: int = 200) -> int:
    """AlterReplicaLogDirs as Kafka does it: the partition copied into ``-future`` in the
    target dir (and kept up to date: records appended there), the future renamed into place,
    the cleaner checkpoint entry moved along (``alterCheckpointDir``), the old dir renamed to
    ``-delete`` and deleted. Returns the log end offset in the target dir."""
    future = target / f"{tp.dir_name}.{uuid.uuid4().hex}-future"
    shutil.copytree(source / tp.dir_name, future)
    leo = _append(future, then_append) if then_append else Log.open(future, read_only=True).log_end_offset
    os.rename(future, target / tp.dir_name)
    old = OffsetCheckpointFile(source / CLEANER_OFFSET_CHECKPOINT)
    entries = old.read() if old.exists() else {}
    entries.pop(tp, None)
    old.write(entries)
    new = OffsetCheckpointFile(target / CLEANER_OFFSET_CHECKPOINT)
    moved = new.read() if new.exists() else {}
    moved[tp] = leo  # cleaned up to its end in the new dir: above the old copy's end
    new.write(moved)
    doomed = source / f"{tp.dir_name}.{uuid.uuid4().hex}-delete"
    os.rename(source / tp.dir_name, doomed)
    shutil.rmtree(doomed)
    return leo


# -- 1. a partition moved to the other log dir ------------------------------------------------


def test_a_partition_moved_to_the_other_log_dir_is_scanned_where_it_is_now(
    tmp_path: Path, make_log_dir: MakeLogDir, caplog: pytest.LogCaptureFixture
) -> None:
    """Old code: the manager kept the log opened in ``kafka-logs-a`` (known by topic and
    partition only): ``cannot scan topic-0-0: [Errno 2] ... kafka-logs-a/topic-0-0/...`` on
    every scan, the partition uncleanable, and "The last checkpoint dirty offset ... is larger
    than the log end offset" (the old dir's log against the new dir's checkpoint)."""
    a = make_log_dir("kafka-logs-a")
    b = _empty_log_dir(tmp_path / "kafka-logs-b", a)
    policy = write_policy(tmp_path / "p.yaml", mode="observe")
    sc = new_sidecar(policy, [a, b])
    next_scan(sc)
    assert _picture(sc)[str(TP)][0] == "kafka-logs-a"

    leo = _move(TP, a, b)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            doc = next_scan(sc)
    entry = _partitions(doc)[str(TP)]
    assert Path(entry["logDir"]).name == "kafka-logs-b", entry
    assert entry["reason"] != "uncleanable", entry
    assert _statuses(sc)[str(TP)].report.log_end_offset == leo
    assert _picture(sc) == _fresh_picture(policy, [a, b])
    assert not [w for w in _warnings(caplog) if "topic-0-0" in w], _warnings(caplog)
    assert not [e for e in doc["errors"] if e["partition"] == str(TP)], doc["errors"]


def test_the_manager_reopens_a_partition_moved_away_and_back(tmp_path: Path, make_log_dir: MakeLogDir) -> None:
    """Moved a -> b -> a: the directory at ``a/topic-0-0`` is another one (another inode)
    than the one first opened there. Old code: the log first opened stayed, its segment
    files gone (its log end offset a cached stale one, or ENOENT)."""
    a = make_log_dir("kafka-logs-a")
    b = _empty_log_dir(tmp_path / "kafka-logs-b", a)
    policy = load_policy(write_policy(tmp_path / "p.yaml", mode="observe"))
    manager = LogCleanerManager(
        [LogDirectory(d, read_only=True) for d in (a, b)], policy, MockTime(NOW_MS), write_checkpoints=False
    )
    first = manager.logs()[TP].log
    assert first.log_end_offset > 0
    for source, target in ((a, b), (b, a)):
        leo = _move(TP, source, target)
        managed = manager.logs()[TP]
        st = os.stat(target / TP.dir_name)
        assert managed.log_dir.path == target
        assert managed.log.dir_identity == (st.st_dev, st.st_ino)
        assert managed.log.log_end_offset == leo
        assert [s.base_offset for s in managed.log.segments] == [
            s.base_offset for s in Log.open(target / TP.dir_name, read_only=True).segments
        ]
    # Unchanged since: the same object is kept (its caches with it).
    assert manager.logs()[TP].log is manager.logs()[TP].log


def test_while_a_move_is_in_flight_the_open_log_stays(tmp_path: Path, make_log_dir: MakeLogDir) -> None:
    """Kafka renames the ``-future`` dir into place before it renames the old one away: for
    a moment both log dirs hold the partition. The log already open stays (not the first dir
    in the list: no flip-flop), and is given up for the other only once its dir is gone."""
    b = make_log_dir("kafka-logs-b")
    a = _empty_log_dir(tmp_path / "kafka-logs-a", b)
    policy = load_policy(write_policy(tmp_path / "p.yaml", mode="observe"))
    manager = LogCleanerManager(
        [LogDirectory(d, read_only=True) for d in (a, b)], policy, MockTime(NOW_MS), write_checkpoints=False
    )
    opened = manager.logs()[TP]
    assert opened.log_dir.path == b
    shutil.copytree(b / TP.dir_name, a / TP.dir_name)  # the future, renamed into place in a
    assert manager.logs()[TP] is opened
    os.rename(b / TP.dir_name, b / f"{TP.dir_name}.{uuid.uuid4().hex}-delete")
    assert manager.logs()[TP].log_dir.path == a


# -- 2. a segment file replaced by a new one with the old one's inode --------------------------


def _reuse_inode(path: Path, data: bytes, mtime_ns: int) -> None:
    """Kafka's cleaner deleted the old file and created the new one (``data``), which got
    the freed inode number, and copied the last source segment's mtime onto it (here: the
    old file's). A file system cannot be asked for a given inode, so the old inode is written
    in place, which is what the reader sees of a reuse: same device and inode, another
    file. Its ctime is the new file's (later than anything the old file had)."""
    before = os.stat(path)
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write(data)
    os.utime(path, ns=(before.st_atime_ns, mtime_ns))
    while os.stat(path).st_ctime_ns == before.st_ctime_ns:  # a coarse clock: the next tick
        time.sleep(0.005)
        os.utime(path, ns=(before.st_atime_ns, mtime_ns))
    after = os.stat(path)
    assert (after.st_dev, after.st_ino, after.st_mtime_ns) == (before.st_dev, before.st_ino, before.st_mtime_ns)


def _clean_first_two_segments(partition_dir: Path) -> tuple[Path, list[Path]]:
    """What Kafka's cleaner leaves after cleaning the first two segments into one: the first
    segment's name holding both's batches (a reused inode), the second's files deleted."""
    logs = sorted(partition_dir.glob("*.log"))
    first, second = logs[0], logs[1]
    data = first.read_bytes() + second.read_bytes()
    mtime_ns = os.stat(first).st_mtime_ns  # the new file's mtime: the very same (see _reuse_inode)
    gone = [p for p in partition_dir.iterdir() if p.name.startswith(second.name.split(".")[0])]
    for p in gone:
        p.unlink()
    _reuse_inode(first, data, mtime_ns)
    return first, gone


def test_a_segment_replaced_under_a_reused_inode_is_read_afresh(
    tmp_path: Path, make_log_dir: MakeLogDir, caplog: pytest.LogCaptureFixture
) -> None:
    """Old code (FactsCache and LogSegment knew a file by device and inode): the new file
    kept the old one's facts, ``byte N: M bytes at the end of a closed segment do not parse
    as a record batch`` was reported, and the verdict was kept until the file changed again:
    the partition uncleanable."""
    data = make_log_dir()
    policy = write_policy(tmp_path / "p.yaml", mode="observe")
    sc = new_sidecar(policy, [data])
    next_scan(sc)
    next_scan(sc)
    _clean_first_two_segments(data / TP.dir_name)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            doc = next_scan(sc)
    assert _picture(sc) == _fresh_picture(policy, [data])
    entry = _partitions(doc)[str(TP)]
    assert entry["reason"] != "uncleanable", entry
    assert not [w for w in _warnings(caplog) if "do not parse" in w], _warnings(caplog)
    assert not [e for e in doc["errors"] if e["partition"] == str(TP)], doc["errors"]


def test_facts_and_segment_identity_follow_the_file_not_the_inode(make_log_dir: MakeLogDir) -> None:
    """The same at the level of the caches: ``FactsCache``, ``ScanFactsCache`` and
    ``LogSegment.same_file`` (which ``Log.refresh`` keeps segment objects by)."""
    pdir = make_log_dir() / TP.dir_name
    log = Log.open(pdir, read_only=True)
    seg = log.segments[0]
    plain, scan = FactsCache(), ScanFactsCache()
    before = (plain.facts(seg, active=False), scan.facts(seg, active=False))
    assert seg.same_file()
    first, _ = _clean_first_two_segments(pdir)
    assert not seg.same_file(), "another file under the name (a reused inode): not the same file"
    log.refresh()
    seg = log.segments[0]
    size = first.stat().st_size
    assert seg.size == size
    for cache, old in zip((plain, scan), before, strict=True):
        facts = cache.facts(seg, active=False)
        assert facts.bytes_scanned == size and facts.records > old.records
    # A growing (active) segment stays the same file while it only grows.
    active = log.segments[-1]
    assert active.same_file(growing=True)
    with open(active.log_path, "ab") as f:
        f.write(build_batch([Record(10**6, NOW_MS, b"k", b"v")]))
    assert active.same_file(growing=True)


def test_a_segment_swapped_between_the_listing_and_the_read_leaves_no_verdict(
    tmp_path: Path, make_log_dir: MakeLogDir, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Kafka's cleaner swaps a bigger segment in under the first segment's name after the
    scan listed the dir (the segment object's size is the old file's). Old code: the new file
    read only up to the old size, "bytes at the end of a closed segment do not parse", and
    that verdict cached under the new file's identity: reported again on the next scans."""
    data = make_log_dir()
    policy = write_policy(tmp_path / "p.yaml", mode="observe")
    sc = new_sidecar(policy, [data])
    next_scan(sc)
    next_scan(sc)
    pdir = data / TP.dir_name
    real_refresh = Sidecar._refresh_observed
    swapped: list[str] = []

    def refresh_then_swap(self: Sidecar, observer: Any) -> None:
        real_refresh(self, observer)
        if not swapped:
            logs = sorted(pdir.glob("*.log"))
            new = pdir / (logs[0].name + ".swap")
            new.write_bytes(logs[0].read_bytes() + logs[1].read_bytes())
            for p in pdir.glob(logs[1].name.split(".")[0] + ".*"):
                p.unlink()
            os.replace(new, logs[0])
            swapped.append(logs[0].name)

    monkeypatch.setattr(Sidecar, "_refresh_observed", refresh_then_swap)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            doc = next_scan(sc)
    assert swapped
    assert _picture(sc) == _fresh_picture(policy, [data])
    assert _partitions(doc)[str(TP)]["reason"] != "uncleanable"
    assert not [w for w in _warnings(caplog) if "do not parse" in w], _warnings(caplog)


# -- 3. a segment deleted by retention mid-scan -------------------------------------------------


def test_a_segment_deleted_by_retention_mid_scan_is_looked_at_again(
    tmp_path: Path, make_log_dir: MakeLogDir, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Retention renames the oldest segment to ``.deleted`` (and deletes it) after the scan
    listed the dir, on every scan (a retention of seconds). Old code: ``cannot scan
    topic-0-0: [Errno 2] No such file or directory`` on each, and the partition reported
    uncleanable (the second time in a row)."""
    data = make_log_dir()
    policy = write_policy(tmp_path / "p.yaml", mode="observe")
    sc = new_sidecar(policy, [data])
    next_scan(sc)
    pdir = data / TP.dir_name
    real_refresh = Sidecar._refresh_observed
    deleted: list[str] = []

    def refresh_then_retention(self: Sidecar, observer: Any) -> None:
        real_refresh(self, observer)
        oldest = sorted(pdir.glob("*.log"))[0]
        base = oldest.name.split(".")[0]
        for p in sorted(pdir.glob(base + ".*")):
            os.rename(p, p.with_name(p.name + ".deleted"))
        for p in pdir.glob("*.deleted"):
            p.unlink()
        deleted.append(oldest.name)

    monkeypatch.setattr(Sidecar, "_refresh_observed", refresh_then_retention)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            doc = next_scan(sc)
    assert len(deleted) == 3
    entry = _partitions(doc)[str(TP)]
    assert entry["reason"] != "uncleanable", entry
    assert _statuses(sc)[str(TP)].report.log_start_offset == int(sorted(pdir.glob("*.log"))[0].name.split(".")[0])
    assert not [w for w in _warnings(caplog) if "No such file" in w or "Errno" in w], _warnings(caplog)
    assert not [e for e in doc["errors"] if e["partition"] == str(TP)], doc["errors"]
    monkeypatch.undo()
    next_scan(sc)
    assert _picture(sc) == _fresh_picture(policy, [data])


def test_a_vanished_segment_is_a_typed_file_changed_error(make_log_dir: MakeLogDir) -> None:
    """Every reader of a segment the broker renamed away raises ``FileVanishedError``: a
    ``FileChangedError`` (the scan looks again) that is still a ``FileNotFoundError``."""
    from cleaner.errors import FileChangedError, FileVanishedError

    pdir = make_log_dir() / TP.dir_name
    log = Log.open(pdir, read_only=True)
    seg: LogSegment = log.segments[0]
    os.rename(seg.log_path, seg.log_path.with_name(seg.log_path.name + ".deleted"))
    for read in (
        lambda: FactsCache().facts(seg, active=False),
        lambda: seg.read(0, 10),
        lambda: next(seg.iter_batches()),
        lambda: LogSegment(pdir, seg.base_offset).size,
    ):
        with pytest.raises(FileVanishedError) as raised:
            read()
        assert isinstance(raised.value, FileChangedError) and isinstance(raised.value, FileNotFoundError)
        assert "vanished" in str(raised.value) and "Errno" not in str(raised.value)


def test_a_scan_cut_short_by_sigterm_warns_about_no_partition(
    tmp_path: Path, make_log_dir: MakeLogDir, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGTERM mid-scan stops the reads at once (the throttle raises ``ThreadShutdownError``).
    Old code: ``cannot scan <partition>: the sidecar is stopping``, a warning per partition
    (the soak counts every warning); the scan now just ends, its previous picture kept."""
    data = make_log_dir()
    policy = write_policy(tmp_path / "p.yaml", mode="observe")
    sc = new_sidecar(policy, [data])
    sc.stopping.set()  # before the first scan: every segment is still to be read
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        sc.time.advance(30_000)  # type: ignore[attr-defined]
        sc.tick()
    assert not [w for w in _warnings(caplog) if "stopping" in w], _warnings(caplog)
