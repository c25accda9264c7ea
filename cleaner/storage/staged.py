"""Segments cleaned somewhere else, swapped into a partition directory with Kafka's protocol.

Both the Spark jobs and the sidecar's stage mode clean into a directory the broker never
reads, and later bring the result in. This is the one implementation of that step: the
staged files enter the partition directory as ``.cleaned`` files (hard links where the file
system allows: a staged file is never written again), which a broker's start-up deletes, so
they are invisible until the swap's commit point, the rename of the last ``.cleaned`` file
in ``Log.replace_segments`` (KAFKA_NOTES §9.10).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from cleaner.storage import files
from cleaner.storage.loader import offset_of
from cleaner.storage.log import Log
from cleaner.storage.producer_state import snapshot_file_name
from cleaner.storage.segment import CLEANED_SUFFIX, SEGMENT_FILE_SUFFIXES, LogSegment, file_name

StagedSegment = tuple[int, dict[str, Path]]
"""A new segment: base offset and, per file kind (``.log``, ``.index``, ...), its staged file."""


def staged_segments(directory: Path, bases: Iterable[int] | None = None) -> list[StagedSegment]:
    """The segments in a staging directory (files named ``<base><kind>`` or
    ``<base><kind>.cleaned``), optionally only those with the given bases."""
    wanted = set(bases) if bases is not None else None
    found: dict[int, dict[str, Path]] = {}
    for name in sorted(os.listdir(directory)):
        plain = name[: -len(CLEANED_SUFFIX)] if name.endswith(CLEANED_SUFFIX) else name
        kind = next((k for k in SEGMENT_FILE_SUFFIXES if plain.endswith(k) and plain.count(".") == 1), None)
        base = offset_of(plain)
        if kind is None or base is None or (wanted is not None and base not in wanted):
            continue
        found.setdefault(base, {})[kind] = directory / name
    return sorted(found.items())


def link_or_copy(src: Path, dst: Path) -> None:
    """``dst`` with ``src``'s bytes and mtime: a hard link where possible (same file
    system; the staged file is never written again), else a copy the broker owns, fsynced."""
    files.remove(dst)
    try:
        files.link(src, dst)
    except OSError:
        tmp = dst.with_name(dst.name + files.TMP_SUFFIX)
        files.copy_file(src, tmp)
        files.rename(tmp, dst)


def swap_in(log: Log, staged: list[StagedSegment], replaced: Iterable[int]) -> None:
    """Kafka's swap of the staged segments for the replaced ones, in one
    ``replace_segments``."""
    replaced = set(replaced)
    current = {s.base_offset: s for s in log.segments}
    missing = sorted(replaced - set(current))
    if missing:
        raise FileNotFoundError(f"{log.dir}: segments {missing[:5]} to replace are not in the log")
    for base, kinds in staged:
        for kind, src in kinds.items():
            link_or_copy(src, log.dir / file_name(base, kind + CLEANED_SUFFIX))
    files.fsync_dir(log.dir)
    new = [
        LogSegment(
            log.dir,
            base,
            suffix=CLEANED_SUFFIX,
            index_interval_bytes=log.config.index_interval_bytes,
            max_index_size=log.config.segment_index_bytes,
        )
        for base, _ in staged
    ]
    old = [current[b] for b in sorted(replaced)]
    log.replace_segments(new, old, expected_generation=log.generation)


def assemble(source: Path, target: Path, staged: list[StagedSegment], replaced: Iterable[int],
             copy_all: Callable[[list[tuple[Path, Path]]], None] | None = None) -> None:
    """In ``target``, a directory no broker reads, the partition ``source`` as ``swap_in``
    would leave it, without copying what the swap replaces: every file of ``source`` but the
    replaced segments' and the producer snapshots at their bases (``replace_segments``
    deletes those), and the staged segments under their final names. ``source`` must hold no
    leftover of an interrupted swap (the caller opens it read-only first). Fsynced.
    ``copy_all``: copies (source, target) pairs with ``files.copy_file`` elsewhere (a Spark
    job's executors); by default here, one after the other."""
    replaced = set(replaced)
    new_bases = {base for base, _ in staged}
    gone = {file_name(b, kind) for b in replaced for kind in SEGMENT_FILE_SUFFIXES}
    gone |= {snapshot_file_name(b) for b in replaced - new_bases}
    target.mkdir(parents=True, exist_ok=True)
    with os.scandir(source) as it:
        copies = [(Path(entry.path), target / entry.name) for entry in it
                  if entry.name not in gone and entry.is_file(follow_symlinks=False)]  # fmt: skip
    if copy_all is not None:
        copy_all(copies)
    else:
        for src, dst in copies:
            files.copy_file(src, dst)
    for base, kinds in staged:
        for kind, src in kinds.items():
            link_or_copy(src, target / file_name(base, kind))
    files.fsync_dir(target)
