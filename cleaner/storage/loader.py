"""What a Kafka broker does with a partition directory's leftover files at start-up
(``LogLoader.load``, KAFKA_NOTES §4), as a plan that can be inspected or applied.

Writable opens apply the plan, exactly as the broker would; read-only callers (``status``,
the sidecar's observe mode) only look at it, so they see the segments the broker will
see without touching a file. The crash-safety tests use the same plan as their model of
"what Kafka's start-up makes of this directory".

1. ``*.deleted`` files are removed (except ``*.checkpoint.deleted``: KRaft snapshots);
   every ``*.cleaned`` is removed, and with it every ``*.swap`` at or above the smallest
   ``.cleaned`` offset (an interrupted replace: new segments are renamed ``.cleaned`` ->
   ``.swap`` in descending offset order, so a remaining ``.cleaned`` marks the set as not
   committed).
2. The remaining (valid) ``.log.swap`` files span ``[min base, max next offset)``; every
   other file whose name parses to an offset in that range is removed (the replaced
   segments and their producer snapshots).
3. Every ``*.swap`` is renamed to its name without ``.swap``.
4. Index files without a ``.log`` are removed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cleaner.storage import files
from cleaner.storage.segment import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SWAP_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
)

_JAVA_LONG = re.compile(r"[+-]?[0-9]+")
_INDEX_KINDS = (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)


def offset_of(name: str) -> int | None:
    """``Long.parseLong(name.substring(0, name.indexOf('.')))``, or None where Java throws."""
    dot = name.find(".")
    if dot < 0:
        return None
    head = name[:dot]
    if not _JAVA_LONG.fullmatch(head):
        return None
    value = int(head)
    return value if -(2**63) <= value < 2**63 else None


@dataclass
class StartupPlan:
    """The file operations of a broker's start-up, in order, and why."""

    delete: list[str] = field(default_factory=list)
    """Passes 1 and 2, before any rename."""
    rename: list[tuple[str, str]] = field(default_factory=list)
    """Pass 3."""
    delete_orphans: list[str] = field(default_factory=list)
    """Pass 4, names as they are after the renames."""
    notes: list[str] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not (self.delete or self.rename or self.delete_orphans)

    def resulting_names(self, names: Iterable[str]) -> set[str]:
        """The directory's file names after the plan ran."""
        out = set(names) - set(self.delete)
        for old, new in self.rename:
            out.discard(old)
            out.add(new)
        return out - set(self.delete_orphans)


def plan_startup(names: Iterable[str], next_offset_of_swap_log: Callable[[str], int]) -> StartupPlan:
    """Kafka's start-up passes over the regular files ``names`` of one partition directory.

    ``next_offset_of_swap_log(name)`` returns the next offset of a ``.log.swap`` file (its
    last batch's offset + 1, or its base offset when empty); it is the only pass that must
    read a file.
    """
    names = sorted(names)
    plan = StartupPlan()
    alive = set(names)

    def drop(name: str, why: str) -> None:
        if name in alive:
            alive.discard(name)
            plan.delete.append(name)
            plan.notes.append(f"delete {name}: {why}")

    for name in names:
        if name.endswith(DELETED_SUFFIX) and not name.endswith(".checkpoint" + DELETED_SUFFIX):
            drop(name, "left over from a segment deletion")
    cleaned = [n for n in names if n.endswith(CLEANED_SUFFIX)]
    min_cleaned = min((o for o in map(offset_of, cleaned) if o is not None), default=None)
    swaps = [n for n in names if n.endswith(SWAP_SUFFIX)]
    for name in swaps:
        o = offset_of(name)
        if min_cleaned is not None and o is not None and o >= min_cleaned:
            drop(name, f"incomplete replace (a .cleaned file at offset {min_cleaned} remains)")
    for name in cleaned:
        drop(name, "uncommitted cleaned segment")

    valid_swap_logs = [n for n in swaps if n in alive and n[: -len(SWAP_SUFFIX)].endswith(LOG_SUFFIX)]
    if valid_swap_logs:
        bases = [offset_of(n) for n in valid_swap_logs]
        min_swap = min(b for b in bases if b is not None)
        max_swap = max(next_offset_of_swap_log(n) for n in valid_swap_logs)
        for name in sorted(alive):
            if name.endswith(SWAP_SUFFIX):
                continue
            o = offset_of(name)
            if o is not None and min_swap <= o < max_swap:
                drop(name, f"replaced by the swap segments covering [{min_swap}, {max_swap})")
        for swap_log in valid_swap_logs:
            for kind in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
                index = swap_log[: -len(LOG_SUFFIX + SWAP_SUFFIX)] + kind + SWAP_SUFFIX
                if index not in alive:
                    plan.notes.append(
                        f"{index} is missing: Kafka would create it zero-filled and trust it (KAFKA_NOTES §4)"
                    )
    for name in sorted(alive):
        if name.endswith(SWAP_SUFFIX):
            target = name[: -len(SWAP_SUFFIX)]
            plan.rename.append((name, target))
            plan.notes.append(f"rename {name} -> {target}: complete the replace")
    after = plan.resulting_names(names)
    logs = {n[: -len(LOG_SUFFIX)] for n in after if n.endswith(LOG_SUFFIX)}
    for name in sorted(after):
        for kind in _INDEX_KINDS:
            if name.endswith(kind) and name[: -len(kind)] not in logs:
                plan.delete_orphans.append(name)
                plan.notes.append(f"delete {name}: index without a log")
    return plan


def regular_files(directory: str | os.PathLike[str]) -> list[str]:
    with os.scandir(directory) as it:
        return [e.name for e in it if e.is_file(follow_symlinks=False)]


def swap_log_next_offset(directory: Path) -> Callable[[str], int]:
    """``readNextOffset`` of a ``.log.swap`` file, read from the file itself."""
    from cleaner.storage.segment import LogSegment

    def next_offset(name: str) -> int:
        base = offset_of(name)
        assert base is not None
        return LogSegment(directory, base, suffix=SWAP_SUFFIX).read_next_offset()

    return next_offset


def apply_startup_plan(directory: str | os.PathLike[str], plan: StartupPlan) -> None:
    """Run the plan's file operations in order, then fsync the directory."""
    d = Path(directory)
    for name in plan.delete:
        files.remove(d / name)
    for old, new in plan.rename:
        files.rename(d / old, d / new)
    for name in plan.delete_orphans:
        files.remove(d / name)
    files.fsync_dir(d)


def startup_plan_for(directory: str | os.PathLike[str]) -> StartupPlan:
    d = Path(directory)
    return plan_startup(regular_files(d), swap_log_next_offset(d))
