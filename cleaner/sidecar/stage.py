"""Stage mode: clean next to a live broker by leaving complete ``.swap`` sets that the
broker's own start-up commits (KAFKA_NOTES §4), for topics the broker does not compact
itself.

A staged set is written exactly as Kafka's cleaner writes a swap: every file as
``.cleaned`` first, then renamed ``.cleaned`` -> ``.swap`` in descending base offset, so
that until the last rename the broker's start-up deletes the whole set. The broker's own
files are never renamed, changed or deleted, and ``cleaner-offset-checkpoint`` is never
written. Nothing is staged at or above the high watermark or the last stable offset.

A manifest (``kafka-cleaner.stage.json``, a name the broker ignores) records what the
set replaces: every source segment's name, size, mtime and inode, the log start offset
and the high watermark. It is written *before* the renames, so a sidecar that restarts
can always re-validate its set. Before and after each round and on every scan the set is
checked against the directory; anything changed, truncated, deleted or newly swapped
discards it. A discard first puts a ``.cleaned`` guard at the set's base offset, which
by Kafka's start-up rules voids every ``.swap`` at or above it, so a crash in the middle
of a discard cannot let the broker commit half a set.

What stage mode relies on (README): that the broker does not compact these topics itself
(its cleaner would use the same ``.cleaned`` names), and that a stale set is discarded
before the broker restarts: between a change (retention deleting a source segment, a
truncation) and the next validation scan, a broker restart would commit the stale set.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cleaner.engine.cleaner import Cleaner, LogToClean
from cleaner.engine.manager import ManagedLog
from cleaner.storage import files
from cleaner.storage.loader import offset_of, regular_files
from cleaner.storage.segment import (
    CLEANED_SUFFIX,
    LOG_SUFFIX,
    SEGMENT_FILE_SUFFIXES,
    SWAP_SUFFIX,
    LogSegment,
    file_name,
)

MANIFEST = "kafka-cleaner.stage.json"
MANIFEST_VERSION = 1


@dataclass
class FileFacts:
    name: str
    size: int
    mtime_ns: int
    inode: int

    @classmethod
    def of(cls, path: Path) -> FileFacts:
        st = path.stat()
        return cls(path.name, st.st_size, st.st_mtime_ns, st.st_ino)


@dataclass
class StagedSet:
    partition: str
    base_offset: int
    next_offset: int
    staged: list[str]
    """Final (``.swap``) names of the staged files."""
    sources: list[FileFacts]
    """Every live segment file the broker's start-up will delete for this set."""
    log_start_offset: int
    high_watermark: int
    created_at_ms: int
    staged_log_inode: int = 0
    source_bytes: int = 0
    staged_bytes: int = 0
    end_offset: int = 0
    extra: dict = field(default_factory=dict)

    def to_json(self) -> bytes:
        data = asdict(self)
        data["version"] = MANIFEST_VERSION
        return json.dumps(data, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> StagedSet:
        raw = json.loads(data)
        raw.pop("version", None)
        raw["sources"] = [FileFacts(**f) for f in raw["sources"]]
        return cls(**raw)


def load_manifest(partition_dir: Path) -> StagedSet | None:
    path = partition_dir / MANIFEST
    try:
        return StagedSet.from_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except (ValueError, TypeError, KeyError):
        # A manifest we cannot read: treat the set as stale (the caller discards it).
        return StagedSet(partition_dir.name, 0, 0, [], [], 0, 0, 0, extra={"unreadable": True})


def validate(staged: StagedSet, partition_dir: Path, log_start_offset: int, high_watermark: int | None) -> str | None:
    """None if the staged set is still exactly what the broker's start-up should commit,
    "committed" if the broker already did, else why it is stale."""
    if staged.extra.get("unreadable"):
        return "the stage manifest is unreadable"
    names = set(regular_files(partition_dir))
    present = [n for n in staged.staged if n in names]
    final_log = file_name(staged.base_offset, LOG_SUFFIX)
    if not present:
        try:
            if (partition_dir / final_log).stat().st_ino == staged.staged_log_inode:
                return "committed"
        except FileNotFoundError:
            pass
        return "the staged files are gone"
    if len(present) != len(staged.staged):
        return "some staged files are missing"
    for src in staged.sources:
        try:
            now = FileFacts.of(partition_dir / src.name)
        except FileNotFoundError:
            return f"source {src.name} was deleted (retention or truncation)"
        if now != src:
            return f"source {src.name} changed (size, mtime or inode)"
    recorded = {s.name for s in staged.sources if s.name.endswith(LOG_SUFFIX)}
    for name in names:
        if name.endswith(LOG_SUFFIX):
            o = offset_of(name)
            if o is not None and staged.base_offset <= o < staged.next_offset and name not in recorded:
                return f"a new segment {name} appeared inside the staged range"
    if log_start_offset > staged.base_offset:
        return f"the log start offset moved to {log_start_offset}, past the staged set's base {staged.base_offset}"
    if high_watermark is not None and high_watermark < staged.high_watermark:
        return f"the high watermark went back from {staged.high_watermark} to {high_watermark} (truncation)"
    ours = set(staged.staged)
    for name in names:
        if (name.endswith(SWAP_SUFFIX) and name not in ours) or name.endswith(CLEANED_SUFFIX):
            return f"another swap operation is in progress ({name})"
    return None


def discard(staged: StagedSet, partition_dir: Path) -> None:
    """Remove a staged set safely next to a live broker (see the module docstring).

    The guard is our own ``<base>.log.swap`` renamed to ``.log.cleaned`` when it is there:
    one rename voids the whole set and needs no free space (a stale set must also go on a
    full disk); otherwise an empty ``.cleaned`` file is written. The manifest goes last, so
    that a sidecar restarted after a crash anywhere in here still knows the leftovers are
    its own and finishes the discard."""
    guard = partition_dir / file_name(staged.base_offset, LOG_SUFFIX + CLEANED_SUFFIX)
    base_swap = partition_dir / file_name(staged.base_offset, LOG_SUFFIX + SWAP_SUFFIX)
    if base_swap.name in staged.staged and base_swap.exists():
        files.rename(base_swap, guard)
    else:
        files.write_file(guard, b"")
    files.fsync_dir(partition_dir)
    for name in staged.staged:
        files.remove(partition_dir / name)
        cleaned = partition_dir / (name[: -len(SWAP_SUFFIX)] + CLEANED_SUFFIX)
        if cleaned != guard:
            files.remove(cleaned)
    files.remove(guard)  # no .swap of the set is left for it to void
    files.fsync_dir(partition_dir)
    files.remove(partition_dir / MANIFEST)
    files.fsync_dir(partition_dir)


def staged_bytes(staged: StagedSet, partition_dir: Path) -> int:
    total = 0
    for name in staged.staged:
        with contextlib.suppress(FileNotFoundError):
            total += (partition_dir / name).stat().st_size
    return total


def stage_partition(
    cleaner: Cleaner,
    managed: ManagedLog,
    ltc: LogToClean,
    *,
    high_watermark: int,
    now_ms: int,
) -> StagedSet | None:
    """Clean ``ltc`` into ``.cleaned`` segments, then publish them as one ``.swap`` set.
    Returns None when the round produced nothing to stage."""
    the_log = managed.log
    pdir = the_log.dir
    written: list[tuple[LogSegment, list[LogSegment]]] = []

    def collect(cleaned: LogSegment, group: list[LogSegment], generation: int) -> None:
        written.append((cleaned, group))

    sources_before = {s.log_path.name: FileFacts.of(s.log_path) for s in the_log.segments}
    try:
        end_offset, _ = cleaner.clean(ltc, commit=collect)
    except BaseException:
        for cleaned, _ in written:
            cleaned.delete_files()
        raise
    if not written:
        return None
    new = sorted((c for c, _ in written), key=lambda s: s.base_offset)
    replaced = [s for _, group in written for s in group]
    base = new[0].base_offset
    next_offset = max(s.read_next_offset() for s in new)
    sources: list[FileFacts] = []
    for name in sorted(regular_files(pdir)):
        o = offset_of(name)
        if o is None or not base <= o < next_offset or name.endswith((SWAP_SUFFIX, CLEANED_SUFFIX)):
            continue
        sources.append(FileFacts.of(pdir / name))
    # The log must not have changed while the round ran (retention, truncation, a roll
    # into the range): compare every replaced segment with what it was at the start.
    for seg in replaced:
        now = FileFacts.of(seg.log_path) if seg.log_path.exists() else None
        if now != sources_before.get(seg.log_path.name):
            for cleaned in new:
                cleaned.delete_files()
            return None
    staged_names = [
        file_name(s.base_offset, kind + SWAP_SUFFIX)
        for s in new
        for kind in SEGMENT_FILE_SUFFIXES
        if s.path(kind).exists()
    ]
    staged = StagedSet(
        partition=pdir.name,
        base_offset=base,
        next_offset=next_offset,
        staged=staged_names,
        sources=sources,
        log_start_offset=the_log.log_start_offset,
        high_watermark=high_watermark,
        created_at_ms=now_ms,
        staged_log_inode=new[0].log_path.stat().st_ino,
        source_bytes=sum(s.size for s in replaced),
        staged_bytes=sum(s.size for s in new),
        end_offset=end_offset,
    )
    # Manifest first: from here on a restarted sidecar knows this set is its own.
    files.atomic_write(pdir / MANIFEST, staged.to_json())
    for seg in sorted(new, key=lambda s: s.base_offset, reverse=True):
        seg.change_suffix(SWAP_SUFFIX)
    files.fsync_dir(pdir)
    return staged


def free_disk_allows(path: Path, needed_bytes: int, min_free_ratio: float) -> bool:
    st = os.statvfs(path)
    total = st.f_blocks * st.f_frsize
    free = st.f_bavail * st.f_frsize
    return total > 0 and (free - needed_bytes) / total >= min_free_ratio
