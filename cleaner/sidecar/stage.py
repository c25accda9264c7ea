"""Stage mode: clean next to a live broker where the broker never looks, and commit the
result in one fenced step while the broker is stopped.

**Where staged output lives.** ``<partition dir>/.kafka-cleaner-stage/``. Kafka's
``LogLoader`` (3.9's Scala one and 4.x's Java one) reads only the *regular files* of a
partition dir (``dir.listFiles`` filtered by ``isFile`` in every pass), producer snapshots
are found by their ``.snapshot`` suffix, and ``LogManager.loadLogs`` only looks at the
directories of the log dir's *root* (where a name that is not a topic-partition would make
Kafka refuse the whole log dir). A subdirectory inside the partition dir is therefore never
read, renamed or deleted by a broker, except with the partition itself (topic deletion and
replica moves delete the partition dir recursively). It is on the same file system as the
segments, so a commit moves files with hard links and renames, never copies. No ``.swap``,
``.cleaned`` or ``.deleted`` name ever appears in a partition dir while the broker may run.

The area holds::

    work/            the round being staged: the engine's .cleaned segments (deleted at
                     the start of every round and by every validation: never a set)
    set/             the one complete staged set: the segment files under their final
                     names and manifest.json, written last (work/ is renamed to set/
                     only after the manifest is durable)
    cleaned-to       the end offset of the last committed round: this partition's own
                     cleaner checkpoint (the broker's cleaner-offset-checkpoint is never
                     written, so the broker's own cleaner is not confused)

**A round** (``stage_partition``) opens the partition dir once and never creates it: the
area and ``work/`` are made inside the opened directory, and before every write (each chunk
of cleaned output, each step of the publication) the paths must still lead to the opened
directories, and free space must be at or above ``stage.minFreeDiskRatio`` (``fstatvfs`` on
the handle: the broker keeps appending and cannot see staged bytes). A partition dir Kafka
renamed away (a topic deletion's ``-delete``, ``-stray``, a move to another log dir) or a
disk that crossed the floor stops the round (``PartitionMoved``, ``DiskFloorReached``), and
what it staged is deleted through the handles, from the renamed dir too, touching nothing
of Kafka's.

**The commit** (``commit_log_dir``) runs only under the log dir's ``.lock`` (so never while
a broker runs, and a broker that starts meanwhile fails to lock and retries: the lock
decides, never both). Every set is validated against the directory as it is now
(``validate``); a stale one is deleted (it was never visible to Kafka: always safe); a valid
one is swapped in with the engine's crash-safe ``.cleaned`` -> ``.swap`` -> ``.deleted``
protocol (``cleaner.storage.staged.swap_in`` -> ``Log.replace_segments``). A crash at any
point leaves either the old segments, or a committed swap that Kafka's start-up completes.
The commit is bounded by a deadline: sets not reached in time stay staged (still
validated at the next commit), none is half-committed. Each set is also asked, before the
lock is taken and again right before its swap, whether the policy and the cluster's topic
config in force still want it (``wanted``: ``guards.CommitCheck``); one they do not is
discarded, never committed.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cleaner.clock import Time
from cleaner.config import TopicRule
from cleaner.effective_config import EffectiveRule
from cleaner.engine.cleaner import Cleaner, LogToClean
from cleaner.engine.manager import ManagedLog
from cleaner.errors import (
    FileVanishedError,
    KafkaCleanerError,
    LogDirLockedError,
    SwapIncompleteError,
    ThreadShutdownError,
)
from cleaner.storage import files
from cleaner.storage.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
)
from cleaner.storage.loader import apply_startup_plan, offset_of, regular_files, startup_plan_for
from cleaner.storage.lock import LogDirLock
from cleaner.storage.log import Log, LogConfig
from cleaner.storage.metadata import read_leader_epoch_checkpoint
from cleaner.storage.ownership import Owner, make_usable_by
from cleaner.storage.ownership import groups as _groups
from cleaner.storage.segment import (
    CLEANED_SUFFIX,
    LOG_SUFFIX,
    SWAP_SUFFIX,
    LogSegment,
    file_name,
)
from cleaner.storage.staged import staged_segments, swap_in
from cleaner.storage.topic_partition import TopicPartition, parse_partition_dir

log = logging.getLogger(__name__)

STAGE_DIR = ".kafka-cleaner-stage"
SET_DIR = "set"
WORK_DIR = "work"
MANIFEST = "manifest.json"
CLEANED_TO = "cleaned-to"
MANIFEST_VERSION = 2


@dataclass(frozen=True)
class SourceFile:
    """A ``.log`` file a staged set replaces, as it was when the set was staged."""

    name: str
    size: int
    mtime_ns: int
    inode: int
    last_batch_crc: int | None

    @classmethod
    def of(cls, path: Path) -> SourceFile:
        st = path.stat()
        return cls(path.name, st.st_size, st.st_mtime_ns, st.st_ino, last_batch_crc(path))


def last_batch_crc(log_path: Path) -> int | None:
    """The stored CRC of a segment file's last batch (None when empty). Read from the last
    offset-index entry on: a few KiB, however large the segment."""
    base = offset_of(log_path.name)
    seg = LogSegment(log_path.parent, base if base is not None else 0)
    crc = None
    for chunk in seg.iter_batches(seg.lookup_position(2**63 - 1), allow_truncated_tail=True):
        crc = int(chunk.headers["crc"][-1])
    return crc


@dataclass
class StagedSet:
    """What a staged set replaces and what the partition looked like when it was staged:
    everything ``validate`` compares with the directory at commit time."""

    partition: str
    base_offset: int
    next_offset: int
    end_offset: int
    """The round's end offset: the partition's ``cleaned-to`` once committed."""
    files: dict[str, int]
    """Staged file name -> size."""
    replaced: list[int]
    """Base offsets of the segments the set replaces."""
    sources: list[SourceFile]
    first_segment_base: int
    log_start_checkpoint: int | None
    """This partition's entry in ``log-start-offset-checkpoint`` (Kafka writes one only
    when the log start is above the first segment, or for tiered logs)."""
    high_watermark: int
    leader_epochs: list[tuple[int, int]]
    """``leader-epoch-checkpoint`` entries (epoch, start offset) that begin below ``next_offset``."""
    log_config: dict[str, int]
    created_at_ms: int
    source_bytes: int = 0
    staged_bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    cleaned_under: dict[str, Any] = field(default_factory=dict)
    """The topic's effective config the set was cleaned under (``cleaned_under_of``): a commit
    compares it with the config in force (``RESULT_KEYS``). Empty: not recorded (a set staged
    by an older version), which no commit trusts."""

    def to_json(self) -> bytes:
        data = asdict(self)
        data["version"] = MANIFEST_VERSION
        return json.dumps(data, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> StagedSet:
        raw = json.loads(data)
        if raw.pop("version", None) != MANIFEST_VERSION:
            raise ValueError("unknown manifest version")
        raw["sources"] = [SourceFile(**f) for f in raw["sources"]]
        raw["leader_epochs"] = [tuple(e) for e in raw["leader_epochs"]]
        return cls(**raw)


# -- the area ---------------------------------------------------------------------------------


def area(partition_dir: Path) -> Path:
    return partition_dir / STAGE_DIR


def set_dir(partition_dir: Path) -> Path:
    return area(partition_dir) / SET_DIR


def load(partition_dir: Path) -> StagedSet | None:
    """The partition's complete staged set, if any. A set whose manifest cannot be read is
    returned as an unreadable set (``validate`` calls it stale)."""
    path = set_dir(partition_dir) / MANIFEST
    try:
        return StagedSet.from_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as e:
        why = f"the stage manifest {path} is unreadable ({type(e).__name__}: {e})"
        return StagedSet(partition_dir.name, 0, 0, 0, {}, [], [], 0, None, 0, [], {}, 0, extra={"unreadable": why})


def staged_partitions(log_dir: Path) -> dict[TopicPartition, Path]:
    """Partition dirs of ``log_dir`` that hold a stage area (a set, work or a checkpoint)."""
    out = {}
    with contextlib.suppress(FileNotFoundError), os.scandir(log_dir) as it:
        for entry in it:
            tp = parse_partition_dir(entry.name) if entry.is_dir(follow_symlinks=False) else None
            if tp is not None and os.path.isdir(os.path.join(entry.path, STAGE_DIR)):
                out[tp] = Path(entry.path)
    return dict(sorted(out.items()))


def _rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    if path.exists():  # what ignore_errors hid: say it
        shutil.rmtree(path)


def delete_set(partition_dir: Path) -> None:
    """Delete the partition's staged set and any unfinished round. Kafka never read them,
    so this is safe at any moment, with or without the broker."""
    a = area(partition_dir)
    for name in (SET_DIR, WORK_DIR):
        _rmtree(a / name)
    with contextlib.suppress(FileNotFoundError):
        files.fsync_dir(a)


def delete_area(partition_dir: Path) -> None:
    """Everything kafka-cleaner keeps in the partition dir (a deleted stage-mode policy)."""
    _rmtree(area(partition_dir))


def staged_bytes(partition_dir: Path) -> int:
    total = 0
    for sub in (SET_DIR, WORK_DIR):
        with contextlib.suppress(FileNotFoundError), os.scandir(area(partition_dir) / sub) as it:
            for entry in it:
                with contextlib.suppress(FileNotFoundError):
                    total += entry.stat(follow_symlinks=False).st_size
    return total


def cleaned_to(partition_dir: Path) -> int | None:
    """The end offset of the last committed round (this partition's first dirty offset)."""
    try:
        return int((area(partition_dir) / CLEANED_TO).read_text().strip())
    except (OSError, ValueError):
        return None


# -- staging ----------------------------------------------------------------------------------


def uid_refusal(partition_dir: Path) -> str | None:
    """Why files this process would stage in ``partition_dir`` could not be opened read-write
    by the broker (the owner of the segments), before anything is written; None if they
    could. Root hands staged files to the owner; another uid needs the owner's group on
    them: as a member of it (Kubernetes adds the pod's fsGroup to every container), or from
    a set-group-ID directory."""
    owner = Owner.of(partition_dir)
    euid = os.geteuid()
    if euid in (0, owner.uid):
        return None
    parent = area(partition_dir) if area(partition_dir).is_dir() else partition_dir
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"the sidecar's uid {euid} may not write {parent} (owner uid {owner.uid})"
    if owner.gid in _groups():
        return None
    st = parent.stat()
    gid = st.st_gid if st.st_mode & stat.S_ISGID else os.getegid()
    if gid != owner.gid:
        return (
            f"the sidecar's uid {euid} is not the owner ({owner.uid}) of the broker's files, and the files it would "
            f"write get group {gid}, not the broker's group {owner.gid}: the broker could not open them "
            "(run the sidecar as the broker's uid, or with the broker's group, e.g. the pod's fsGroup)"
        )
    return None


def stage_partition(
    cleaner: Cleaner,
    managed: ManagedLog,
    ltc: LogToClean,
    *,
    high_watermark: int,
    now_ms: int,
    min_free_ratio: float = 0.0,
) -> StagedSet | None:
    """Clean ``ltc`` into ``work/``, then publish it as the partition's set. None when the
    round produced nothing or the log changed under it (retention, truncation, a roll).

    The partition dir is opened once and never created (``_Round``). Before every write of
    cleaned output (each chunk the engine writes, each step here) and at the publication,
    the partition dir and ``work/`` must still be the ones opened, and free space at or
    above ``min_free_ratio``; otherwise the round stops (``PartitionMoved``,
    ``DiskFloorReached``) and everything it staged is deleted through the handles, where
    it still is (in a renamed dir too), touching nothing of Kafka's.

    Raises ``StageRefused`` when the broker could not open what would be staged (uid), and
    its ``StageStopped`` subclasses when the round stopped."""
    the_log = managed.log
    pdir = the_log.dir
    rnd = _Round(pdir, min_free_ratio, the_log.segments)
    outer_check = cleaner.check_done

    def check_done(tp: TopicPartition) -> None:
        outer_check(tp)
        rnd.check()

    written: list[tuple[LogSegment, list[LogSegment]]] = []

    def collect(cleaned: LogSegment, group: list[LogSegment], generation: int) -> None:
        written.append((cleaned, group))

    cleaner.check_done = check_done
    try:
        owner = Owner.of(pdir)
        for fd in (rnd.area_fd, rnd.work_fd):
            refused = make_usable_by(fd, owner)
            if refused is not None:
                raise StageRefused(refused)
        rnd.check()
        before = {s.log_path.name: _quick_facts(s.log_path) for s in the_log.segments}
        end_offset, _ = cleaner.clean(ltc, commit=collect, cleaned_dir=rnd.work)
        if not written:
            rnd.discard()
            return None
        replaced = [s for _, group in written for s in group]
        # The broker must not have changed what the round read (retention, truncation).
        if any(_quick_facts(s.log_path) != before.get(s.log_path.name) for s in replaced):
            rnd.discard()
            return None
        new = sorted((c for c, _ in written), key=lambda s: s.base_offset)
        sizes: dict[str, int] = {}
        for seg in new:
            rnd.check()
            seg.change_suffix("")
            for name in sorted(os.listdir(rnd.work_fd)):
                if offset_of(name) == seg.base_offset:
                    rnd.check()
                    refused = make_usable_by(rnd.work / name, owner)
                    if refused is not None:
                        raise StageRefused(refused)
                    sizes[name] = os.stat(name, dir_fd=rnd.work_fd, follow_symlinks=False).st_size
        base = new[0].base_offset
        next_offset = max(s.read_next_offset() for s in new)
        starts = OffsetCheckpointFile(pdir.parent / LOG_START_OFFSET_CHECKPOINT).read()
        tp = managed.topic_partition
        staged = StagedSet(
            partition=pdir.name,
            base_offset=base,
            next_offset=next_offset,
            end_offset=end_offset,
            files=sizes,
            replaced=sorted(s.base_offset for s in replaced),
            sources=[SourceFile.of(s.log_path) for s in sorted(replaced, key=lambda s: s.base_offset)],
            first_segment_base=the_log.segments[0].base_offset,
            log_start_checkpoint=starts.get(tp),
            high_watermark=high_watermark,
            leader_epochs=_epochs_below(pdir, next_offset),
            log_config={
                "segment_bytes": the_log.config.segment_bytes,
                "segment_index_bytes": the_log.config.segment_index_bytes,
                "index_interval_bytes": the_log.config.index_interval_bytes,
                "max_message_bytes": the_log.config.max_message_bytes,
            },
            created_at_ms=now_ms,
            source_bytes=sum(s.size for s in replaced),
            staged_bytes=sum(sizes.values()),
            cleaned_under=cleaned_under_of(managed.rule, managed.config),
        )
        if any((src.size, src.mtime_ns, src.inode) != before.get(src.name) for src in staged.sources):
            rnd.discard()
            return None
        # What was read above (checkpoints, sources, epochs) came from this partition dir
        # only if it is still the one opened.
        rnd.check()
        files.atomic_write(rnd.work / MANIFEST, staged.to_json())
        rnd.check()
        make_usable_by(rnd.work / MANIFEST, owner)
        rnd.publish()
        return staged
    except BaseException as e:
        stopped = rnd.stopped(e)
        if stopped is e:
            raise
        raise stopped from e
    finally:
        cleaner.check_done = outer_check
        rnd.close()


class StageRefused(KafkaCleanerError):
    """Staging this partition would leave something the broker cannot use."""


class StageStopped(StageRefused):
    """A round stopped before its set was published; everything it staged was deleted."""


class PartitionMoved(StageStopped):
    """The partition dir was renamed away or replaced under the round: a topic deletion
    (``<dir>.<id>-delete``), a stray replica at a KRaft broker's start (``-stray``), a move
    to another log dir (the ``-future`` copy replaces it), a re-created topic."""


class DiskFloorReached(StageStopped):
    """Free space fell below ``stage.minFreeDiskRatio`` while the round wrote (the broker
    keeps appending, and cannot see what is staged)."""


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_GONE = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)
"""A path that no longer leads to a directory (``O_NOFOLLOW``: a symlink put in its place)."""


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _ignore_missing(func: Any, path: str, exc_info: Any) -> None:
    if not isinstance(exc_info[1], FileNotFoundError):
        raise exc_info[1]


def _rmtree_at(dir_fd: int, name: str) -> None:
    """Remove ``name`` (a file or a tree) in the directory ``dir_fd``, never through a path
    a rename could lead elsewhere. What is already gone is no error."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, onerror=_ignore_missing, dir_fd=dir_fd)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)


class _Round:
    """The directories of one staging round, opened once.

    The partition dir is opened (``O_DIRECTORY``), never created: the stage area and a
    fresh ``work/`` are made relative to that handle, so a partition dir Kafka renamed away
    (a topic deletion, a stray, a log dir move) is never brought back under its old name.
    The engine writes ``work/`` through its path (``work``): under a renamed partition dir
    that path leads nowhere and nothing is created there (no parent is ever made), and
    ``check`` compares, before every write, what the paths lead to with the handles (and
    free space with the floor: ``fstatvfs`` on the handle). ``discard`` deletes the round's
    output through the handles: in a renamed partition dir what the round wrote is still
    reached and removed, and nothing else there is touched."""

    def __init__(self, pdir: Path, min_free_ratio: float, segments: list[LogSegment]) -> None:
        self.pdir = pdir
        self.work = area(pdir) / WORK_DIR
        self.min_free_ratio = min_free_ratio
        self.pdir_fd = self.area_fd = self.work_fd = -1
        self.area_created = False
        try:
            self.pdir_fd = os.open(pdir, _DIR_FLAGS)
        except OSError as e:
            if e.errno in _GONE:
                raise self._moved("is gone") from e
            raise
        self._pdir_id = _identity(os.fstat(self.pdir_fd))
        self._work_id = (-1, -1)
        try:
            self._check_path(pdir, self._pdir_id)
            self._check_segments(segments)
            try:
                os.mkdir(STAGE_DIR, dir_fd=self.pdir_fd)
                self.area_created = True
            except FileExistsError:
                pass
            self.area_fd = os.open(STAGE_DIR, _DIR_FLAGS, dir_fd=self.pdir_fd)
            _rmtree_at(self.area_fd, WORK_DIR)
            os.mkdir(WORK_DIR, dir_fd=self.area_fd)
            self.work_fd = os.open(WORK_DIR, _DIR_FLAGS, dir_fd=self.area_fd)
            self._work_id = _identity(os.fstat(self.work_fd))
            self._check_path(self.work, self._work_id)
        except BaseException as e:
            try:
                stopped = self.stopped(e)
            finally:
                self.close()
            if stopped is e:
                raise
            raise stopped from e

    def _check_segments(self, segments: list[LogSegment]) -> None:
        """The opened dir must hold the segments of the log the round will read, at least
        as long as when they were read (a segment only grows until retention or a truncation
        removes it): else it is not that log's dir any more (the topic deleted and created
        again, a replica removed and fetched anew) or the log changed, and the round does
        not begin."""
        for seg in segments:
            known = seg._size  # as read when the round was planned (None: never read, nothing to compare)
            if known is None:
                continue
            try:
                size = os.stat(seg.log_path.name, dir_fd=self.pdir_fd, follow_symlinks=False).st_size
            except FileNotFoundError:
                size = -1
            if size < known:
                raise StageStopped(
                    f"the partition dir {self.pdir.name} no longer holds the log read a moment ago (segment "
                    f"{seg.base_offset} is {'gone' if size < 0 else 'shorter'}): Kafka replaced the directory (a "
                    "re-created topic) or changed the log (retention, a truncation); the round did not begin"
                )

    def _moved(self, how: str) -> PartitionMoved:
        return PartitionMoved(
            f"the partition dir {self.pdir.name} {how}: Kafka renamed it away or replaced it (a topic deletion, a "
            "reassignment, a move to another log dir); the round stopped, nothing more is written there, and what it "
            "had staged was deleted"
        )

    def _check_path(self, path: Path, identity: tuple[int, int]) -> None:
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError as e:
            if e.errno in _GONE:
                raise self._moved("is gone") from e
            raise
        if _identity(st) != identity:
            raise self._moved("is another directory now")

    def check(self) -> None:
        """Before a write: the partition dir and ``work/`` are still the ones opened, and
        free space is at or above the floor. Raises ``PartitionMoved``, ``DiskFloorReached``."""
        self._check_path(self.pdir, self._pdir_id)
        self._check_path(self.work, self._work_id)
        if self.min_free_ratio > 0:
            free, total = _disk(self.pdir_fd)
            if total > 0 and free < self.min_free_ratio * total:
                raise self._disk_floor(free / total)

    def _disk_floor(self, free_ratio: float | None) -> DiskFloorReached:
        fell = f"fell to {free_ratio:.1%}" if free_ratio is not None else "ran out"
        return DiskFloorReached(
            f"the round stopped at {self.staged_bytes()} bytes staged: free disk {fell}, below "
            f"stage.minFreeDiskRatio ({self.min_free_ratio:.0%}); what it staged was deleted"
        )

    def staged_bytes(self) -> int:
        """The disk space the round's output takes now (allocated blocks: an index is
        sparse while it is written)."""
        if self.work_fd < 0:
            return 0
        total = 0
        with contextlib.suppress(OSError):
            for name in os.listdir(self.work_fd):
                with contextlib.suppress(FileNotFoundError):
                    total += os.stat(name, dir_fd=self.work_fd, follow_symlinks=False).st_blocks * 512
        return total

    def publish(self) -> None:
        """``work/`` becomes the partition's set (renamed through the area's handle, after
        a last check); a partition dir renamed in that very instant takes the set with it,
        and the set is deleted there."""
        os.fsync(self.work_fd)
        self.check()
        _rmtree_at(self.area_fd, SET_DIR)
        os.rename(WORK_DIR, SET_DIR, src_dir_fd=self.area_fd, dst_dir_fd=self.area_fd)
        os.fsync(self.area_fd)
        try:
            self._check_path(self.pdir, self._pdir_id)
        except PartitionMoved:
            _rmtree_at(self.area_fd, SET_DIR)
            raise

    def moved(self) -> bool:
        try:
            self._check_path(self.pdir, self._pdir_id)
        except PartitionMoved:
            return True
        return False

    def discard(self) -> None:
        """Delete the round's output (``work/``) through the handles; in a partition dir
        that moved, also the stage area when this round created it (and it is empty)."""
        if self.area_fd < 0:
            return
        _rmtree_at(self.area_fd, WORK_DIR)
        with contextlib.suppress(OSError):
            os.fsync(self.area_fd)
        if self.area_created and self.moved():
            with contextlib.suppress(OSError):
                os.rmdir(STAGE_DIR, dir_fd=self.pdir_fd)

    def stopped(self, e: BaseException) -> BaseException:
        """Delete the round's output after ``e`` ended the round, and say what to raise: a
        partition dir that moved explains any failure (a path that led nowhere), a disk
        that filled under a floor is the floor."""
        out: BaseException = e
        failed = isinstance(e, (OSError, KafkaCleanerError)) and not isinstance(e, (StageStopped, ThreadShutdownError))
        if failed and self.pdir_fd >= 0 and self.moved():
            out = self._moved("moved during the round")
        elif isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) and self.min_free_ratio > 0:
            out = self._disk_floor(None)
        elif (
            type(e) is FileNotFoundError
            and e.filename is not None
            and os.path.dirname(os.fspath(e.filename)) == os.fspath(self.pdir)
        ):
            # A segment the round planned from was renamed away by the broker before the round
            # opened it (retention, a DeleteRecords breach): no failure; the next pass plans
            # from the log as it now is (found by the soak beside a busy broker).
            out = FileVanishedError(e.filename, "renamed or deleted by the broker during the round")
        try:
            self.discard()
        except OSError as cleanup:
            log.warning("%s: could not delete the stopped round's output: %s", self.pdir, cleanup)
        return out

    def close(self) -> None:
        for name in ("work_fd", "area_fd", "pdir_fd"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)


def _quick_facts(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def _epochs_below(partition_dir: Path, next_offset: int) -> list[tuple[int, int]]:
    return [
        (e.epoch, e.start_offset) for e in read_leader_epoch_checkpoint(partition_dir) if e.start_offset < next_offset
    ]


# -- validation and the commit ----------------------------------------------------------------


RESULT_KEYS = ("delete.retention.ms", "min.compaction.lag.ms")
"""Effective topic configs that change what a clean produces (when tombstones and markers go,
which records are old enough to compact): a set cleaned under other values than those in
force at commit time is not committed. ``min.cleanable.dirty.ratio`` and
``max.compaction.lag.ms`` only decide *when* a clean runs; the segment shape is in
``log_config``, which the commit uses as staged."""


def cleaned_under_of(rule: TopicRule, config: EffectiveRule | None) -> dict[str, Any]:
    """What a set records of the effective config it is cleaned under (``rule`` is the
    effective rule: the policy's merged with the cluster's, ``cleaner.effective_config``)."""
    return {
        "cleanup.policy": str(rule.cleanup_policy),
        "delete.retention.ms": rule.delete_retention_ms,
        "min.compaction.lag.ms": rule.min_compaction_lag_ms,
        "clusterConfig": bool(config is not None and config.cluster_known),
    }


@dataclass(frozen=True)
class Unwanted:
    """Why the policy or the cluster's topic config in force no longer wants a staged set."""

    code: str
    """A short name for the metric's ``reason`` label (``policyGone``, ``notStageMode``,
    ``paused``, ``noRule``, ``notCompacted``, ``brokerCompacts``, ``tiered``,
    ``configChanged``, ``notRecorded``)."""
    message: str


WantedCheck = Callable[[TopicPartition, "StagedSet"], "Unwanted | None"]
"""Asked right before each set is committed: None to commit it, else why to discard it."""


def validate(staged: StagedSet, partition_dir: Path) -> str | None:
    """None if ``staged`` may replace its sources in the directory as it is now, else why
    it is stale. Every check compares with what the set recorded when it was staged."""
    if unreadable := staged.extra.get("unreadable"):
        return str(unreadable)
    sdir = set_dir(partition_dir)
    for name, size in sorted(staged.files.items()):
        try:
            if (sdir / name).stat().st_size != size:
                return f"the staged file {name} changed size"
        except FileNotFoundError:
            return f"the staged file {name} is missing"
    names = regular_files(partition_dir)
    busy = sorted(n for n in names if n.endswith((CLEANED_SUFFIX, SWAP_SUFFIX)))
    if busy:
        return f"the partition dir holds an unfinished swap ({busy[0]}): the broker's own cleaner works on it"
    logs = sorted((o, n) for n in names if n.endswith(LOG_SUFFIX) and (o := offset_of(n)) is not None)
    if not logs or logs[0][0] != staged.first_segment_base:
        first = logs[0][0] if logs else None
        return f"the first segment is now {first}, was {staged.first_segment_base} (retention or a log start move)"
    tp = parse_partition_dir(partition_dir.name)
    if tp is None:
        return f"{partition_dir.name} is not a partition directory"
    log_dir = partition_dir.parent
    start = OffsetCheckpointFile(log_dir / LOG_START_OFFSET_CHECKPOINT).read().get(tp)
    if start != staged.log_start_checkpoint:
        return f"the log start offset checkpoint moved from {staged.log_start_checkpoint} to {start}"
    in_range = sorted(n for o, n in logs if staged.base_offset <= o < staged.next_offset)
    if in_range != sorted(s.name for s in staged.sources):
        return (
            f"the segments in [{staged.base_offset}, {staged.next_offset}) are not the staged set's sources "
            "(a roll, a truncation or retention)"
        )
    for src in staged.sources:
        try:
            now = SourceFile.of(partition_dir / src.name)
        except FileNotFoundError:
            return f"the source segment {src.name} was deleted (retention or truncation)"
        except KafkaCleanerError as e:
            return f"the source segment {src.name} cannot be read: {e}"
        if now != src:
            what = [f for f in ("size", "mtime_ns", "inode", "last_batch_crc") if getattr(now, f) != getattr(src, f)]
            return f"the source segment {src.name} changed ({', '.join(what)})"
    hw = OffsetCheckpointFile(log_dir / REPLICATION_OFFSET_CHECKPOINT).read().get(tp)
    if hw is None or hw < staged.high_watermark:
        return f"the high watermark went back from {staged.high_watermark} to {hw} (a truncation)"
    epochs = _epochs_below(partition_dir, staged.next_offset)
    if epochs != staged.leader_epochs:
        return (
            f"the leader epochs beginning below offset {staged.next_offset} changed (a leader change inside the "
            f"staged range: records there may have been replaced): {staged.leader_epochs[-3:]} -> {epochs[-3:]}"
        )
    if tp in OffsetCheckpointFile(log_dir / CLEANER_OFFSET_CHECKPOINT).read():
        return "the broker compacted this partition itself (it is in cleaner-offset-checkpoint)"
    return None


def commit_set(staged: StagedSet, partition_dir: Path) -> None:
    """Swap a validated set in (caller holds the log dir's ``.lock``), then record its end
    offset as the partition's ``cleaned-to`` and delete the set."""
    log = Log.open(partition_dir, LogConfig(**staged.log_config), log_start_offset=staged.log_start_checkpoint)
    segments = staged_segments(set_dir(partition_dir))
    try:
        swap_in(log, segments, staged.replaced)
    except SwapIncompleteError:
        raise  # committed: Kafka's start-up (or the next commit's) completes it
    except BaseException:
        # Not committed: remove what was linked in (Kafka's start-up would delete it too).
        for base, kinds in segments:
            for kind in kinds:
                with contextlib.suppress(OSError):
                    os.unlink(partition_dir / file_name(base, kind + CLEANED_SUFFIX))
        raise
    finally:
        for seg in log.segments:  # never Log.close(): it would write to the active segment
            seg.close()
    files.atomic_write(area(partition_dir) / CLEANED_TO, b"%d\n" % staged.end_offset)
    delete_set(partition_dir)


@dataclass
class CommitReport:
    """What one commit of a log dir did."""

    log_dir: str
    locked: bool = True
    """False: the broker (or another process) holds ``.lock``: nothing was done."""
    committed: list[tuple[str, int]] = field(default_factory=list)
    """(partition, bytes reclaimed)."""
    deleted: list[tuple[str, str]] = field(default_factory=list)
    """(partition, why the set was stale)."""
    discarded: list[tuple[str, Unwanted]] = field(default_factory=list)
    """(partition, why the policy or the cluster's config in force no longer wants it)."""
    left: list[str] = field(default_factory=list)
    """Partitions whose valid sets were not reached before the deadline (still staged)."""
    errors: list[tuple[str, str]] = field(default_factory=list)
    refused: str | None = None
    """Why this process's uid may not commit in the log dir at all (``uid_refusal``: it could
    not take ``.lock`` or leave files the broker opens); nothing was done. Also in ``errors``,
    under the log dir's name, where the sidecar reports errors."""

    def as_status(self) -> dict[str, Any]:
        return {
            "logDir": self.log_dir,
            "locked": self.locked,
            "committed": [p for p, _ in self.committed],
            "bytesReclaimed": sum(b for _, b in self.committed),
            "deleted": [{"partition": p, "reason": r} for p, r in self.deleted],
            "discarded": [{"partition": p, "reason": u.message, "code": u.code} for p, u in self.discarded],
            "timedOut": list(self.left),
            "errors": [{"partition": p, "message": m} for p, m in self.errors],
        }


def commit_log_dir(log_dir: Path, time: Time, deadline_ns: int, *, wanted: WantedCheck) -> CommitReport:
    """The fenced commit of every staged set in ``log_dir`` (see the module docstring).
    Takes no lock when nothing is staged. ``deadline_ns`` is on ``time.nanoseconds()``.

    ``wanted`` (``guards.CommitCheck``: the policy file and the cluster's topic config as they
    are now) is asked for each set first without the lock, and again right before the set is
    committed: a set it no longer wants is discarded (deleting a set is always safe, the
    broker never read it), never committed."""
    report = CommitReport(str(log_dir))
    staged = staged_partitions(log_dir)
    for tp, pdir in staged.items():  # no deadline: a read of the policy and metadata per set
        s = load(pdir)
        why = wanted(tp, s) if s is not None else None
        if why is not None:
            _discard(report, tp, pdir, why)
    if not any((area(p) / SET_DIR).exists() or (area(p) / WORK_DIR).exists() for p in staged.values()):
        return report
    # Another uid than the broker's, without write access to the log dir or the broker's
    # group, could neither take .lock nor leave files the broker opens: say so, touch nothing.
    report.refused = uid_refusal(log_dir)
    if report.refused is not None:
        report.errors.append((str(log_dir), f"nothing committed: {report.refused}"))
        return report
    lock = LogDirLock(log_dir)
    try:
        lock.acquire()
    except LogDirLockedError:
        report.locked = False
        return report
    try:
        for tp, pdir in staged.items():
            _rmtree(area(pdir) / WORK_DIR)  # an unfinished round is never a set
            s = load(pdir)
            if s is None:
                continue
            if time.nanoseconds() >= deadline_ns:
                report.left.append(str(tp))
                continue
            try:
                # What a broker's start-up would do first (an interrupted commit of ours,
                # the broker's own interrupted clean), done now under the same lock.
                plan = startup_plan_for(pdir)
                if not plan.is_empty:
                    apply_startup_plan(pdir, plan)
                reason = validate(s, pdir)
                if reason is not None:
                    delete_set(pdir)
                    report.deleted.append((str(tp), reason))
                    continue
                why = wanted(tp, s)  # the policy in force at this very moment
                if why is not None:
                    _discard(report, tp, pdir, why)
                    continue
                commit_set(s, pdir)
                report.committed.append((str(tp), max(s.source_bytes - s.staged_bytes, 0)))
            except (KafkaCleanerError, OSError) as e:
                report.errors.append((str(tp), f"{type(e).__name__}: {e}"))
    finally:
        lock.release()
    return report


def _discard(report: CommitReport, tp: TopicPartition, pdir: Path, why: Unwanted) -> None:
    delete_set(pdir)
    report.discarded.append((str(tp), why))
    log.warning("%s: discarded the staged set, not committed: %s", pdir, why.message)


def _disk(where: Path | int) -> tuple[int, int]:
    """(bytes free for unprivileged writers, total bytes) of the file system of ``where``, a
    path or an open directory's descriptor (a round's handle: the disk the partition is on
    even once Kafka renamed it). The one reading of free space: the pre-round check, the
    in-round floor and the eviction all see the same figure."""
    st = os.fstatvfs(where) if isinstance(where, int) else os.statvfs(where)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def free_ratio(path: Path) -> float:
    free, total = _disk(path)
    return free / total if total else 0.0


def free_disk_allows(path: Path, needed_bytes: int, min_free_ratio: float) -> bool:
    """Whether writing ``needed_bytes`` more keeps free space at or above the ratio."""
    free, total = _disk(path)
    return total > 0 and (free - needed_bytes) / total >= min_free_ratio


def evict_for_disk(log_dir: Path, min_free_ratio: float) -> list[tuple[str, int]]:
    """While free space is below ``min_free_ratio``, delete staged sets, largest first.
    Returns (partition, bytes) of each deleted set."""
    gone = []
    sizes = sorted(((staged_bytes(p), str(tp), p) for tp, p in staged_partitions(log_dir).items()), reverse=True)
    for size, tp, pdir in sizes:
        if free_ratio(log_dir) >= min_free_ratio or size == 0:
            break
        delete_set(pdir)
        gone.append((tp, size))
    return gone
