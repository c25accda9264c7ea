"""Constants of the Spark tests' inputs, and comparisons of the Spark jobs' output with the
single-node engine's."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from kafka_logs import snapshot_dir

from cleaner.config import Policy
from cleaner.storage.checkpoint import CLEANER_OFFSET_CHECKPOINT, REPLICATION_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleaner.storage.log_dir import LogDirectory
from cleaner.storage.topic_partition import TopicPartition

NOW = 1_700_000_000_000
DAY = 86_400_000
LARGE_TP = TopicPartition("big-0", 0)

FLEET_POLICY = """\
topics:
  - match: topic-3
    cleanupPolicy: delete
  - match: 'topic-.*'
    cleanupPolicy: compact
    segmentBytes: 131072
    deleteRetentionMs: 86400000
"""
LARGE_POLICY = """\
topics:
  - match: 'big-.*'
    cleanupPolicy: compact
    segmentBytes: 131072
    deleteRetentionMs: 86400000
"""


MTIME_KINDS = (".log", ".index", ".timeindex")
"""The files whose mtime the cleaner sets (and Kafka's retention and legacy horizons read)."""


def partition_state(directory: Path) -> dict[str, tuple[bytes, int | None]]:
    """Every file's bytes, and the mtime of the segment files the cleaner stamps."""
    return {
        name: (data, mtime if name.endswith(MTIME_KINDS) else None)
        for name, (data, mtime) in snapshot_dir(directory).items()
    }


def differences(a: Path, b: Path) -> list[str]:
    sa, sb = partition_state(a), partition_state(b)
    out = []
    for name in sorted(set(sa) | set(sb)):
        if name not in sa or name not in sb:
            out.append(f"{name}: only in {'b' if name not in sa else 'a'}")
        elif sa[name][0] != sb[name][0]:
            out.append(f"{name}: bytes differ ({len(sa[name][0])} vs {len(sb[name][0])})")
        elif sa[name][1] != sb[name][1]:
            out.append(f"{name}: mtime differs")
    return out


def compacted(root: Path, policy: Policy) -> list[TopicPartition]:
    return [
        tp
        for tp in LogDirectory(root).partition_dirs()
        if (rule := policy.rule_for(tp.topic)) is not None and rule.compact
    ]


def checkpoint(root: Path) -> dict[TopicPartition, int]:
    return OffsetCheckpointFile(root / CLEANER_OFFSET_CHECKPOINT).read()


def assert_same_partitions(expected_root: Path, actual_root: Path, tps: list[TopicPartition]) -> None:
    problems = {str(tp): differences(expected_root / tp.dir_name, actual_root / tp.dir_name) for tp in tps}
    problems = {k: v for k, v in problems.items() if v}
    assert not problems, problems


def log_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if p.name.endswith(".log"))


def tree(directory: Path) -> list[str]:
    out = []
    for root, _, names in os.walk(directory):
        out.extend(str((Path(root) / n).relative_to(directory)) for n in names)
    return sorted(out)


def set_high_watermark(root: Path, tp: TopicPartition, offset: int) -> None:
    OffsetCheckpointFile(root / REPLICATION_OFFSET_CHECKPOINT).update(set={tp: offset})


def copy_of(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst
