"""The driver's commit: staged segments swapped into a partition with Kafka's protocol
(``Log.replace_segments``, KAFKA_NOTES §9.10), cleaner checkpoints, and the root files of
an output log dir.

Staged segments are swapped in by ``cleaner.storage.staged.swap_in`` (shared with the
sidecar's stage mode): all of a partition's new segments go through one
``replace_segments``, so a round's groups are committed together.

A run's id comes from what it was planned from (names, sizes and mtimes of the files, the
checkpoints' contents), and ``cp -a`` gives all of those back: a restore of dirty data at a
path a run cleaned has that run's id. So a commit also records what it left
(``commit_identity``), and a rerun trusts its ``COMMITTED`` marker only while the paths still
hold that (``holds_commit``); otherwise the data is not the committed result and is planned
again.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

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

from .plan import dir_fingerprint, root_fingerprint


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


def commit_identity(
    roots: Iterable[str | os.PathLike[str]], partition_dirs: Iterable[str | os.PathLike[str]]
) -> dict[str, Any]:
    """What a commit left at its paths: the log dirs' root files the cleaner reads and every
    file of the partitions (name, size, mtime), as the plan's identity sees them. A commit
    that changed a partition or a checkpoint leaves something different from what it was
    planned from, so a restore of the planned state is told apart from the committed one.
    JSON-shaped, to be stored in the run's ``COMMITTED`` marker."""
    identity = {
        "roots": {os.fspath(r): root_fingerprint(r) for r in roots},
        "partitions": {os.fspath(d): dir_fingerprint(d) if Path(d).is_dir() else None for d in partition_dirs},
    }
    return json.loads(json.dumps(identity))


def holds_commit(identity: Mapping[str, Any] | None) -> bool:
    """Whether the paths still hold what the commit recorded in ``identity`` left there (a
    marker without one, written before commits recorded it, is trusted)."""
    if not identity:
        return True
    return commit_identity(identity["roots"], identity["partitions"]) == identity
