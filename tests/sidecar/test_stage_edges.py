"""Stage mode at the edges of a broker's life (issue 21 items 2 and 4): the partition dir
renamed away under a round (a topic deletion renames it ``<dir>.<id>-delete``, KRaft's
start-up ``-stray``, a JBOD move replaces it), and a disk that really fills while a round
writes (a fixed-size tmpfs, mounted as root).

The claims:
- the sidecar never creates a partition dir, and after a rename at any instant of a round
  the old path does not exist, the renamed dir holds exactly what Kafka had in it (the
  round's partial output is discarded from it), and the round is reported as stopped;
- when free space falls below ``stage.minFreeDiskRatio`` while a round writes, the round
  stops at once, its output is deleted (free space is back above the floor), the broker's
  files are byte-identical, and the stop is reported with the bytes the round had staged.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from broker_lock import BrokerLock
from sidecar_helpers import NOW_MS, new_sidecar, next_scan, scan_until, write_policy

from cleaner.generate import GeneratorConfig, generate
from cleaner.sidecar import stage
from cleaner.storage import files
from cleaner.storage.segment import LogSegment

ALL = [{"match": ".*", "cleanupPolicy": "compact"}]
PARTITION = "topic-0-0"
MAX_SCANS = 6
"""Scans after which a round must have run (the gate, a scan, the round): a bound, not a wait."""


def tree(directory: Path) -> dict[str, bytes | None]:
    """Every entry under ``directory``, directories too (None), files with their bytes: a
    directory created, or a file written, anywhere shows."""
    out: dict[str, bytes | None] = {}
    for root, dirs, names in os.walk(directory):
        for d in dirs:
            out[str((Path(root) / d).relative_to(directory)) + "/"] = None
        for n in names:
            p = Path(root) / n
            out[str(p.relative_to(directory))] = p.read_bytes()
    return out


def kafka_tree(log_dir: Path) -> dict[str, bytes | None]:
    """What the broker owns in the log dir: everything but the stage areas and ``.lock``."""
    return {k: v for k, v in tree(log_dir).items() if stage.STAGE_DIR not in Path(k).parts and k != ".lock"}


def _refused(doc: dict[str, Any]) -> dict[str, str]:
    return {f"{r['topic']}-{r['partition']}": r["reason"] for r in doc["stage"]["refused"]}


def _messages(doc: dict[str, Any]) -> list[str]:
    return [e["message"] for e in doc["errors"]]


# -- the partition dir renamed away under a round ----------------------------------------------


class Rename:
    """Renames the partition dir as Kafka does (``<dir>.<uuid without dashes>-<kind>``) the
    first time ``hook`` is called, then lets the call go on: the rename lands at that exact
    instant of the round. Records what the dir held at that instant."""

    def __init__(self, pdir: Path, kind: str) -> None:
        self.pdir = pdir
        self.kind = kind
        self.target = pdir.with_name(f"{pdir.name}.{uuid.uuid4().hex}-{'delete' if kind == 'recreated' else kind}")
        self.fired = False
        self.new: dict[str, bytes | None] = {}

    def _rename(self) -> None:
        os.rename(self.pdir, self.target)
        if self.kind == "recreated":
            # The topic deleted and created again at once: a new, empty partition dir
            # under the old name (what a JBOD move's ``-future`` renamed into place is too).
            self.pdir.mkdir()
            (self.pdir / "partition.metadata").write_bytes(b"version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA\n")
            (self.pdir / "00000000000000000000.log").write_bytes(b"")
            self.new = tree(self.pdir)

    def wrap(self, real: Callable[..., Any], *, after_calls: int = 0) -> Callable[..., Any]:
        calls = 0

        def hook(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if not self.fired and calls > after_calls and self.pdir.exists():
                self.fired = True
                self._rename()
            return real(*args, **kwargs)

        return hook


INSTANTS = {
    # (what is patched, how many calls go by before the rename)
    "before the round": lambda m, r: m.setattr(stage, "stage_partition", r.wrap(stage.stage_partition)),
    "at the first cleaned file": lambda m, r: m.setattr(files, "write_file", r.wrap(files.write_file)),
    "while writing cleaned output": lambda m, r: m.setattr(
        LogSegment, "append", r.wrap(LogSegment.append, after_calls=3)
    ),
    "while naming the staged files": lambda m, r: m.setattr(
        LogSegment, "change_suffix", r.wrap(LogSegment.change_suffix)
    ),
    "before the manifest": lambda m, r: m.setattr(files, "atomic_write", r.wrap(files.atomic_write)),
}


@pytest.mark.parametrize("kind", ["delete", "stray", "recreated"])
@pytest.mark.parametrize("instant", list(INSTANTS))
def test_a_partition_dir_renamed_under_a_round_is_never_recreated_nor_written(
    tmp_path: Path, make_log_dir, monkeypatch: pytest.MonkeyPatch, instant: str, kind: str
) -> None:
    data = make_log_dir(topics=1, partitions=1, records=6_000, keys=2_000, segment_bytes=16 * 1024)
    pdir = data / PARTITION
    kafka_before = tree(pdir)
    assert not any(stage.STAGE_DIR in k for k in kafka_before)
    rename = Rename(pdir, kind)
    INSTANTS[instant](monkeypatch, rename)
    with BrokerLock(data):
        sc = new_sidecar(write_policy(tmp_path / "policy.yaml", mode="stage", topics=ALL), [data])
        for _ in range(MAX_SCANS):
            doc = next_scan(sc)
            if rename.fired:
                break
        assert rename.fired, f"no staging round reached the instant '{instant}' in {MAX_SCANS} scans"
        assert tree(pdir) == rename.new if rename.new else not pdir.exists(), (
            f"the sidecar re-created {pdir.name} after Kafka renamed it away, or wrote into its new incarnation"
        )
        assert tree(rename.target) == kafka_before, (
            "the renamed partition dir holds something Kafka did not put there: "
            f"{sorted(set(tree(rename.target)) ^ set(kafka_before))}"
        )
        said = " ".join([*_refused(doc).values(), *_messages(doc)])
        assert "renamed" in said or "moved" in said or "replaced" in said, doc["stage"]
        # The next scans neither bring the directory back nor fail.
        for _ in range(2):
            doc = next_scan(sc)
        assert tree(pdir) == rename.new if rename.new else not pdir.exists()
        assert tree(rename.target) == kafka_before
        assert doc["cleaner"]["state"] != "error"
    dirs = sorted(p.name for p in data.iterdir() if p.is_dir())
    assert dirs == sorted([rename.target.name, *([pdir.name] if rename.new else [])])


# -- a disk that really fills ------------------------------------------------------------------


@pytest.fixture
def small_fs(request: pytest.FixtureRequest) -> Iterator[Callable[[int], Path]]:
    """``small_fs(bytes)``: a fresh tmpfs of that size (its usage is exact: no reserved
    blocks, no metadata blocks), unmounted at teardown."""
    if os.geteuid() != 0:
        pytest.skip("mounting a fixed-size tmpfs needs root")
    mounts: list[Path] = []

    def make(size: int) -> Path:
        where = Path(tempfile.mkdtemp(prefix="kafka-cleaner-smallfs-"))
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            where.rmdir()
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
        mounts.append(where)
        return where

    yield make
    for where in mounts:
        if subprocess.run(["umount", str(where)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)
        shutil.rmtree(where, ignore_errors=True)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def total_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize


def fill(path: Path, size: int) -> None:
    """A file of ``size`` real bytes (tmpfs allocates what is written)."""
    chunk = b"\xa5" * (1 << 20)
    with open(path, "ab") as f:
        left = size
        while left > 0:
            f.write(chunk[: min(left, len(chunk))])
            left -= min(left, len(chunk))
        f.flush()
        os.fsync(f.fileno())


MiB = 1 << 20


def test_a_round_stops_when_the_broker_fills_the_disk_below_the_floor(
    tmp_path: Path, small_fs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 48 MiB tmpfs, a floor of 25% (12 MiB). The log dir holds ~10 MiB of mostly distinct
    keys (the cleaned output is nearly as large), and free space lets the round start (the
    pre-round check: free minus the estimate stays above the floor). When the round creates
    its first cleaned file, the "broker" appends until only 2 MiB are left above the floor:
    the round must stop once its output crosses the floor, long before it has written its
    ~10 MiB, and leave nothing behind."""
    mnt = small_fs(48 * MiB)
    data = mnt / "kafka-logs"
    generate(
        data,
        GeneratorConfig(
            now_ms=NOW_MS,
            topics=1,
            partitions=1,
            records=10_000,
            keys=10_000,
            key_skew=0.0,
            value_bytes=1_000,
            tombstones=0.0,
            compression="none",
            segment_bytes=1 * MiB,
        ),
    )
    size = sum(p.stat().st_size for p in (data / PARTITION).iterdir())
    assert 8 * MiB < size < 14 * MiB, size
    total = total_bytes(mnt)
    ratio = 0.25
    floor = int(total * ratio)
    margin = 2 * MiB
    # Before the round: room for the estimate (the whole partition) plus 1 MiB above the floor.
    fill(mnt / "other-volume-user", free_bytes(mnt) - (floor + size + MiB))
    kafka_before = kafka_tree(data)
    broker_appends = mnt / "broker-appends"
    seen: dict[str, int] = {}

    real_write_file = files.write_file

    def write_file(path: Any, data_: Any, **kwargs: Any) -> None:
        if not seen and stage.STAGE_DIR in str(path):
            seen["free_at_round_start"] = free_bytes(mnt)
            fill(broker_appends, free_bytes(mnt) - (floor + margin))
        real_write_file(path, data_, **kwargs)

    monkeypatch.setattr(files, "write_file", write_file)
    policy = write_policy(
        tmp_path / "policy.yaml",
        mode="stage",
        topics=ALL,
        stage={"minFreeDiskRatio": ratio},
        cleaner={"ioBufferSize": 256 * 1024},
    )
    with BrokerLock(data):
        sc = new_sidecar(policy, [data])
        for _ in range(MAX_SCANS):
            doc = next_scan(sc)
            if seen:
                break
        assert seen, f"no staging round began in {MAX_SCANS} scans: {doc['stage']}"
        assert seen["free_at_round_start"] > floor + margin
        after = free_bytes(mnt)
        assert stage.load(data / PARTITION) is None, "a set was staged below the disk floor"
        assert stage.staged_bytes(data / PARTITION) == 0, "the stopped round's output was left behind"
        assert after >= floor + margin - 64 * 1024, (after, floor)
        assert kafka_tree(data) == kafka_before, "a file of the broker's changed"
        said = [why for why in [*_refused(doc).values(), *_messages(doc)] if "minFreeDiskRatio" in why]
        assert said and any("stopped" in why for why in said), doc["stage"]
        # The report says how far the round got: it stopped near the floor, not at the end.
        stops = [int(m[1]) for why in said if (m := re.search(r"stopped at (\d+) bytes staged", why))]
        assert stops, said
        staged_when_stopped = stops[0]
        assert margin <= staged_when_stopped < margin + 2 * MiB, said


# -- the round's handles, one step at a time ---------------------------------------------------


def _round(pdir: Path, ratio: float = 0.0) -> stage._Round:
    return stage._Round(pdir, ratio, [])


def test_the_round_checks_the_partition_dir_before_every_write(tmp_path: Path) -> None:
    """Renamed away, replaced by a new directory, or by a symlink: ``check`` stops the round,
    ``discard`` removes what it wrote from the renamed dir (and the stage area it created),
    and the old name is never created again."""
    for how in ("renamed", "replaced", "symlink"):
        log_dir = tmp_path / how
        pdir = log_dir / PARTITION
        pdir.mkdir(parents=True)
        (pdir / "00000000000000000000.log").write_bytes(b"kafka's")
        rnd = _round(pdir)
        try:
            rnd.check()
            (rnd.work / "00000000000000000000.log.cleaned").write_bytes(b"ours")
            away = log_dir / f"{PARTITION}.{uuid.uuid4().hex}-delete"
            os.rename(pdir, away)
            if how == "replaced":
                pdir.mkdir()
            elif how == "symlink":
                pdir.symlink_to(away.name)
            with pytest.raises(stage.PartitionMoved):
                rnd.check()
            assert rnd.moved()
            rnd.discard()
        finally:
            rnd.close()
        assert tree(away) == {"00000000000000000000.log": b"kafka's"}, how
        if how == "renamed":
            assert not pdir.exists()
        elif how == "replaced":
            assert tree(pdir) == {}
        else:
            assert pdir.is_symlink()


def test_the_round_never_opens_a_partition_dir_that_is_gone_or_not_the_logs(tmp_path: Path, make_log_dir) -> None:
    data = make_log_dir(topics=1, partitions=1, records=500, keys=100)
    with pytest.raises(stage.PartitionMoved):
        _round(data / "topic-0-9")
    assert not (data / "topic-0-9").exists()
    from cleaner.storage.log import Log, LogConfig

    log = Log.open(data / PARTITION, LogConfig(), read_only=True)
    try:
        segments = list(log.segments)
        assert all(seg.size > 0 for seg in segments)  # what planning the round reads
    finally:
        for seg in log.segments:
            seg.close()
    os.rename(data / PARTITION, data / "gone")
    (data / PARTITION).mkdir()  # the topic created again: a new, empty partition dir
    (data / PARTITION / segments[0].log_path.name).write_bytes(b"")
    with pytest.raises(stage.StageStopped, match="no longer holds the log"):
        stage._Round(data / PARTITION, 0.0, segments)
    assert sorted(os.listdir(data / PARTITION)) == [segments[0].log_path.name]


def test_the_floor_is_checked_on_the_partition_dirs_own_file_system(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pdir = tmp_path / PARTITION
    pdir.mkdir()
    rnd = _round(pdir, ratio=0.5)
    try:
        real = os.fstatvfs
        looked: list[int] = []

        def fstatvfs(fd: int) -> os.statvfs_result:
            looked.append(fd)
            st = real(fd)
            # 40% free: below the floor
            return os.statvfs_result((*st[:2], 1000, 400, 400, *st[5:]))

        monkeypatch.setattr(os, "fstatvfs", fstatvfs)
        (rnd.work / "00000000000000000000.log.cleaned").write_bytes(b"x" * 10_000)
        with pytest.raises(stage.DiskFloorReached, match=r"stopped at \d+ bytes staged: free disk fell to 40.0%"):
            rnd.check()
        assert looked == [rnd.pdir_fd]
        rnd.discard()
        assert not rnd.work.exists()
    finally:
        rnd.close()


# -- a source segment deleted under a round ------------------------------------------------------


def test_a_segment_retention_deletes_under_a_round_stops_it_quietly(
    tmp_path: Path, make_log_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention (or the broker's own cleaner) deletes a segment the round is reading: the
    round stops, leaves nothing, and it is no failure (found by the soak: "staging failed:
    FileVanishedError" in /status errors); the next pass stages from the log as it now is."""
    data = make_log_dir(topics=1, partitions=1, records=6_000, keys=2_000, segment_bytes=16 * 1024)
    pdir = data / PARTITION
    real = LogSegment.iter_batches
    fired: list[Path] = []

    def iter_batches(segment: LogSegment, *args: Any, **kwargs: Any) -> Any:
        if not fired and stage.STAGE_DIR not in str(segment.log_path) and segment.log_path.exists():
            segments = sorted(pdir.glob("*.log"))
            if segment.log_path == segments[1]:  # the round is about to read it: retention deletes it
                segment.log_path.rename(segment.log_path.with_name(segment.log_path.name + ".deleted"))
                fired.append(segment.log_path)
        return real(segment, *args, **kwargs)

    with BrokerLock(data):
        sc = new_sidecar(write_policy(tmp_path / "policy.yaml", mode="stage", topics=ALL), [data])
        monkeypatch.setattr(LogSegment, "iter_batches", iter_batches)
        doc = scan_until(sc, lambda: fired, MAX_SCANS, "no round read the second segment")
        assert not any("staging failed" in m for m in _messages(doc)), _messages(doc)
        assert not (pdir / stage.STAGE_DIR / stage.WORK_DIR).exists()
        monkeypatch.setattr(LogSegment, "iter_batches", real)
        # The deleted segment gone for good (Kafka's asynchronous delete), the next passes stage.
        for deleted in pdir.glob("*.deleted"):
            for twin in pdir.glob(deleted.name.split(".")[0] + ".*"):
                twin.unlink()
        for _ in range(MAX_SCANS):
            doc = next_scan(sc)
            if stage.load(pdir) is not None:
                break
        assert stage.load(pdir) is not None, doc["stage"]
        assert not any("staging failed" in m for m in _messages(doc)), _messages(doc)
