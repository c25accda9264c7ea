"""Log dir patterns: ``--log-dir`` may hold shell wildcards (Strimzi names a broker's log
dir ``kafka-log<node id>``), expanded on every scan because the broker may create the
directory after the sidecar starts. A pattern matches only Kafka log dirs
(``is_kafka_log_dir``): the sidecar never scans, locks or writes anything else, and a log
dir the broker has not initialised yet counts as missing."""

from __future__ import annotations

import glob
from collections.abc import Iterable, Sequence
from pathlib import Path

from cleaner.storage.log_dir import LogDirectory, is_kafka_log_dir
from cleaner.storage.topic_partition import TopicPartition


def has_magic(pattern: str) -> bool:
    return glob.has_magic(pattern)


def expand_log_dirs(patterns: Sequence[str]) -> tuple[list[Path], list[str]]:
    """(Kafka log dirs, in pattern order then name order, without duplicates; patterns that
    match no Kafka log dir yet)."""
    found: list[Path] = []
    seen: set[Path] = set()
    missing: list[str] = []
    for pattern in patterns:
        candidates = [Path(p) for p in sorted(glob.glob(pattern))] if has_magic(pattern) else [Path(pattern)]
        matches = [p for p in candidates if is_kafka_log_dir(p)]
        if not matches:
            missing.append(pattern)
        for m in matches:
            resolved = m.absolute()
            if resolved not in seen:
                seen.add(resolved)
                found.append(resolved)
    return found, missing


def duplicate_partitions(log_dirs: Iterable[Path]) -> dict[TopicPartition, list[Path]]:
    """Partitions found in more than one log dir. Kafka refuses to start on such a broker
    ("Duplicate log directories"); the sidecar reports them and touches neither copy."""
    where: dict[TopicPartition, list[Path]] = {}
    for d in log_dirs:
        try:
            for tp in LogDirectory(d, read_only=True).partition_dirs():
                where.setdefault(tp, []).append(d)
        except OSError:
            continue
    return {tp: dirs for tp, dirs in where.items() if len(dirs) > 1}
