"""One Kafka log directory (``log.dirs`` entry): its partition directories and the files
in its root - the four offset checkpoints, ``meta.properties``, ``.lock`` and
``.kafka_cleanshutdown``."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from cleaner.storage.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    OFFSET_CHECKPOINT_FILES,
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
)
from cleaner.storage.lock import LogDirLock, is_locked_by_other_process
from cleaner.storage.log import Log, LogConfig
from cleaner.storage.segment import LOG_SUFFIX
from cleaner.storage.topic_partition import TopicPartition, parse_partition_dir

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"

_scan = threading.local()


@contextmanager
def checkpoints_read_once() -> Iterator[None]:
    """Within this block, on this thread, each log dir's broker-written checkpoints (high
    watermarks, log start offsets, recovery points) are read once and that state is the
    answer after. A scan looks at every partition, and each look asked for them: a scan of N
    partitions read and parsed N files of N lines (minutes a scan beside a broker with 2,000
    partitions). One scan then sees one state of each file, as it sees one listing of the
    partitions; the next scan reads them again. Blocks nest; other threads read afresh."""
    outer = getattr(_scan, "read", None)
    if outer is None:
        _scan.read = {}
    try:
        yield
    finally:
        if outer is None:
            _scan.read = None


class LogDirectory:
    def __init__(self, path: str | os.PathLike[str], *, read_only: bool = False, may_stage: bool = False) -> None:
        self.path = Path(path).absolute()
        self.read_only = read_only
        self.may_stage = may_stage

    def __str__(self) -> str:
        return str(self.path)

    def exists(self) -> bool:
        return self.path.is_dir()

    def partition_dirs(self) -> dict[TopicPartition, Path]:
        """Partition directories, listed afresh (``-delete``/``-future``/``-stray``
        directories and anything that is not a partition are skipped). A ``name-N``
        directory without a segment file (``.log``, or one of its swap, cleaned or deleted
        forms) is not a partition Kafka holds: it is left alone, so that opening it never
        creates a segment there."""
        out: dict[TopicPartition, Path] = {}
        with os.scandir(self.path) as it:
            for entry in it:
                if not entry.is_dir(follow_symlinks=False):
                    continue
                tp = parse_partition_dir(entry.name)
                if tp is not None and _has_segment_file(entry.path):
                    out[tp] = Path(entry.path)
        return dict(sorted(out.items()))

    def checkpoint(self, name: str) -> OffsetCheckpointFile:
        return OffsetCheckpointFile(self.path / name)

    @property
    def cleaner_checkpoint(self) -> OffsetCheckpointFile:
        return self.checkpoint(CLEANER_OFFSET_CHECKPOINT)

    def high_watermarks(self) -> Mapping[TopicPartition, int]:
        return self._broker_checkpoint(REPLICATION_OFFSET_CHECKPOINT)

    def log_start_offsets(self) -> Mapping[TopicPartition, int]:
        return self._broker_checkpoint(LOG_START_OFFSET_CHECKPOINT)

    def recovery_points(self) -> Mapping[TopicPartition, int]:
        return self._broker_checkpoint(RECOVERY_POINT_OFFSET_CHECKPOINT)

    def _broker_checkpoint(self, name: str) -> Mapping[TopicPartition, int]:
        """A checkpoint only the broker writes: read now, or once in ``checkpoints_read_once``."""
        read = getattr(_scan, "read", None)
        if read is None:
            return self.checkpoint(name).read()
        key = (self.path, name)
        if key not in read:
            read[key] = self.checkpoint(name).read()
        return read[key]

    @property
    def had_clean_shutdown(self) -> bool:
        return (self.path / CLEAN_SHUTDOWN_FILE).exists()

    @property
    def recovered_at_next_start(self) -> bool:
        """The broker is down and did not shut down cleanly: its next start recovers the
        active segment, snapshots the producer state it replayed and loads it back
        (``LogLoader``), which drops expired producers and forgets transactions completed
        above the high watermark. Not while a broker holds the dir: a running broker keeps
        what it replayed until its periodic expiration check."""
        return not self.had_clean_shutdown and not self.is_locked_by_broker()

    def open_log(self, tp: TopicPartition, config: LogConfig, *, log_start_offset: int | None = None) -> Log:
        return Log.open(
            self.path / tp.dir_name,
            config,
            log_start_offset=log_start_offset,
            read_only=self.read_only,
            may_stage=self.may_stage,
        )

    def lock(self) -> LogDirLock:
        """The broker's ``.lock``; hold it for as long as files are being changed."""
        return LogDirLock(self.path)

    def is_locked_by_broker(self) -> bool:
        return is_locked_by_other_process(self.path)

    def free_bytes(self) -> int:
        return shutil.disk_usage(self.path).free

    def total_bytes(self) -> int:
        return shutil.disk_usage(self.path).total


def is_kafka_log_dir(path: str | os.PathLike[str]) -> bool:
    """Whether Kafka has used ``path`` as a log dir: its ``meta.properties`` (which every
    broker writes at its first start), or Kafka's offset checkpoint files next to at least
    one partition dir (a copied or pre-KRaft log dir). Nothing else is ever scanned, locked
    or written to: a directory of ``name-N`` subdirectories is not a log dir."""
    p = Path(path)
    if not p.is_dir():
        return False
    if (p / "meta.properties").is_file():
        return True
    if not any((p / name).is_file() for name in OFFSET_CHECKPOINT_FILES):
        return False
    with os.scandir(p) as it:
        return any(e.is_dir(follow_symlinks=False) and parse_partition_dir(e.name) is not None for e in it)


def _has_segment_file(partition_dir: str) -> bool:
    try:
        with os.scandir(partition_dir) as it:
            return any(LOG_SUFFIX in e.name and e.is_file(follow_symlinks=False) for e in it)
    except (FileNotFoundError, NotADirectoryError):
        return False  # renamed away since the listing (a topic deletion's -delete, a move)
