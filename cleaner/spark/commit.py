"""The driver's commit: staged segments swapped into a partition with Kafka's protocol
(``Log.replace_segments``, KAFKA_NOTES §9.10), cleaner checkpoints, and the root files of
an output log dir.

Staged segments are swapped in by ``cleaner.storage.staged.swap_in`` (shared with the
sidecar's stage mode): all of a partition's new segments go through one
``replace_segments``, so a round's groups are committed together.
"""

from __future__ import annotations

import filecmp
import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from cleaner.config import TopicRule
from cleaner.engine.manager import log_config_for
from cleaner.storage import files
from cleaner.storage.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleaner.storage.lock import LOCK_FILE
from cleaner.storage.log import Log
from cleaner.storage.log_dir import LogDirectory
from cleaner.storage.segment import LOG_SUFFIX, SEGMENT_FILE_SUFFIXES, file_name
from cleaner.storage.staged import StagedSegment
from cleaner.storage.topic_partition import TopicPartition


def open_for_commit(partition_dir: Path, rule: TopicRule, log_start_offset: int | None) -> Log:
    """The partition, writable: opening it completes or rolls back an interrupted swap as a
    broker's start-up would."""
    return Log.open(partition_dir, log_config_for(rule), log_start_offset=log_start_offset)


def swap_applied(partition_dir: Path, staged: list[StagedSegment], replaced: Iterable[int]) -> bool:
    """Whether the partition already holds exactly the staged segments in place of the
    replaced ones (a commit that finished before a crash)."""
    new_bases = {base for base, _ in staged}
    for base, kinds in staged:
        for kind in SEGMENT_FILE_SUFFIXES:
            final = partition_dir / file_name(base, kind)
            if kind in kinds:
                if not final.exists() or not filecmp.cmp(kinds[kind], final, shallow=False):
                    return False
            elif final.exists():
                return False
    return all(not (partition_dir / file_name(b, LOG_SUFFIX)).exists() for b in set(replaced) - new_bases)


def update_cleaner_checkpoint(root: str | os.PathLike[str], updates: Mapping[TopicPartition, int]) -> None:
    """Kafka's ``updateCheckpoints`` for a log dir: keep the partitions the dir has, set
    the new values, rewrite atomically."""
    if not updates:
        return
    log_dir = LogDirectory(root)
    log_dir.cleaner_checkpoint.update(set=dict(updates), keep_only=set(log_dir.partition_dirs()))


def write_output_root(out_root: Path, src_root: str | os.PathLike[str], updates: Mapping[TopicPartition, int]) -> None:
    """The root files of an output log dir: the source's (checkpoints, ``meta.properties``,
    ``.kafka_cleanshutdown``; never ``.lock``), and its ``cleaner-offset-checkpoint``
    updated as the source's would be (the source's partitions kept, the new values set)."""
    out_root.mkdir(parents=True, exist_ok=True)
    src = Path(src_root)
    with os.scandir(src) as it:
        for entry in it:
            if not entry.is_file(follow_symlinks=False) or entry.name in (LOCK_FILE, CLEANER_OFFSET_CHECKPOINT):
                continue
            tmp = out_root / (entry.name + files.TMP_SUFFIX)
            shutil.copy2(entry.path, tmp)
            files.fsync_file(tmp)
            files.rename(tmp, out_root / entry.name)
    out_cp = OffsetCheckpointFile(out_root / CLEANER_OFFSET_CHECKPOINT)
    src_cp = OffsetCheckpointFile(src / CLEANER_OFFSET_CHECKPOINT)
    if not updates and not src_cp.exists() and not out_cp.exists():
        files.fsync_dir(out_root)
        return
    current = out_cp.read() if out_cp.exists() else src_cp.read()
    keep = set(LogDirectory(src).partition_dirs())
    entries = {tp: off for tp, off in current.items() if tp in keep}
    entries.update(updates)
    out_cp.write(entries)
