"""Kafka's start-up of one partition directory, as an independent model for the crash checker.

Written from Kafka 4.x ``LogLoader.load`` (``removeTempFilesAndCollectSwapFiles``, the swap
range pass, the rename pass, ``loadSegmentFiles``, ``recoverLog``) and ``LogSegment.recover``,
not from ``cleaner.storage.loader``: a bug shared by the project's swap and the project's
recovery must not cancel out. Batches are framed here and decoded with kafka-python (a
peer codec), so the project's record decoder is not the judge either.

It works on a directory image, ``{file name: bytes}``, and returns the log a broker would
serve after an unclean shutdown with no recovery point (every segment is recovered, the
strictest case): per segment, the records that survive recovery.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass, field

from kafka.record.default_records import DefaultRecordBatch

DELETED = ".deleted"
CLEANED = ".cleaned"
SWAP = ".swap"
SNAPSHOT_DELETE = ".checkpoint.deleted"
INDEX_KINDS = (".index", ".timeindex", ".txnindex")
LOG_OVERHEAD = 12  # baseOffset int64 + length int32
V2_HEADER = 61


def offset_from_file(name: str) -> int | None:
    """``LogFileUtils.offsetFromFile``: ``Long.parseLong`` of the name up to the first dot;
    None where Java throws (callers skip such files)."""
    dot = name.find(".")
    if dot <= 0:
        return None
    try:
        value = int(name[:dot], 10)
    except ValueError:
        return None
    if name[0] == "_" or not -(2**63) <= value < 2**63:
        return None
    return value


@dataclass(frozen=True)
class Rec:
    """One record as a consumer sees it (control records are markers: key and value None)."""

    offset: int
    key: bytes | None
    value: bytes | None
    control: bool = False


@dataclass
class Batch:
    base_offset: int
    last_offset: int
    records: list[Rec]


@dataclass
class Loaded:
    """The partition after start-up: segments (base offset, batches) ascending, the files
    left, and what start-up did (for failure messages)."""

    segments: list[tuple[int, list[Batch]]]
    files: dict[str, bytes]
    actions: list[str] = field(default_factory=list)

    @property
    def records(self) -> list[Rec]:
        return [r for _, batches in self.segments for b in batches for r in b.records]

    @property
    def batch_ranges(self) -> list[tuple[int, int]]:
        return [(b.base_offset, b.last_offset) for _, batches in self.segments for b in batches]


@functools.lru_cache(maxsize=4096)
def valid_batches(data: bytes, base_offset: int) -> tuple[list[Batch], int]:
    """``LogSegment.recover``: batches up to the first one that is cut short, fails its CRC
    or whose offsets do not fit the segment (``ensureOffsetInRange``); returns them and the
    valid byte count. Kafka checks neither the order of offsets nor duplicates here."""
    out: list[Batch] = []
    pos = 0
    while pos + LOG_OVERHEAD <= len(data):
        first, length = struct.unpack_from(">qi", data, pos)
        end = pos + LOG_OVERHEAD + length
        if length < V2_HEADER - LOG_OVERHEAD or end > len(data):
            break
        raw = bytes(data[pos:end])
        if raw[16] != 2:  # magic: the checker's logs are v2 only
            break
        batch = DefaultRecordBatch(raw)
        if not batch.validate_crc():
            break
        last = first + struct.unpack_from(">i", raw, 23)[0]
        if first < base_offset or last - base_offset > 2**31 - 1:
            break
        records = [Rec(r.offset, r.key, r.value, batch.is_control_batch) for r in batch]
        out.append(Batch(first, last, records))
        pos = end
    return out, pos


def next_offset(data: bytes, base_offset: int) -> int:
    """``LogSegment.readNextOffset`` of a swap segment: its last batch's next offset, or its
    base offset when it has none."""
    batches, _ = valid_batches(data, base_offset)
    return batches[-1].last_offset + 1 if batches else base_offset


def start_up(image: dict[str, bytes]) -> Loaded:
    """``LogLoader.load`` on a directory image after an unclean shutdown."""
    files = dict(image)
    actions: list[str] = []

    def delete(name: str, why: str) -> None:
        if files.pop(name, None) is not None:
            actions.append(f"delete {name} ({why})")

    # removeTempFilesAndCollectSwapFiles
    swaps, cleaned, min_cleaned = [], [], None
    for name in list(files):
        if name.endswith(DELETED) and not name.endswith(SNAPSHOT_DELETE):
            delete(name, "stray .deleted")
        elif name.endswith(CLEANED):
            o = offset_from_file(name)
            min_cleaned = o if min_cleaned is None else min(min_cleaned, o)
            cleaned.append(name)
        elif name.endswith(SWAP):
            swaps.append(name)
    valid_swaps = []
    for name in swaps:
        if min_cleaned is not None and offset_from_file(name) >= min_cleaned:
            delete(name, f"swap at or above the lowest .cleaned {min_cleaned}")
        else:
            valid_swaps.append(name)
    for name in cleaned:
        delete(name, "stray .cleaned")

    # The swap range: every valid .log.swap from its base to its next offset.
    lo, hi = None, None
    for name in valid_swaps:
        if not name[: -len(SWAP)].endswith(".log"):
            continue
        base = offset_from_file(name)
        lo = base if lo is None else min(lo, base)
        n = next_offset(files[name], base)
        hi = n if hi is None else max(hi, n)
    if lo is not None:
        for name in list(files):
            o = offset_from_file(name)
            if not name.endswith(SWAP) and o is not None and lo <= o < hi:
                delete(name, f"compacted into the swap range [{lo}, {hi})")
    for name in sorted(files):
        if name.endswith(SWAP):
            files[name[: -len(SWAP)]] = files.pop(name)
            actions.append(f"rename {name}")

    # loadSegmentFiles: orphaned indexes go; every .log is a segment.
    for name in list(files):
        if name.endswith(INDEX_KINDS):
            o = offset_from_file(name)
            if o is not None and f"{name[: name.index('.')]}.log" not in files:
                delete(name, "orphaned index")
    logs = sorted((offset_from_file(n), n) for n in files if n.endswith(".log") and offset_from_file(n) is not None)

    # recoverLog (no clean shutdown, recovery point 0): recover each segment in order; the
    # first one that loses bytes takes every later segment with it.
    segments: list[tuple[int, list[Batch]]] = []
    for i, (base, name) in enumerate(logs):
        batches, valid = valid_batches(files[name], base)
        segments.append((base, batches))
        if valid < len(files[name]):
            files[name] = files[name][:valid]
            actions.append(f"truncate {name} to {valid} bytes")
            for _, later in logs[i + 1 :]:
                delete(later, "after a truncated segment")
            break
    return Loaded(segments, files, actions)


def read_offset_checkpoint(data: bytes) -> dict[tuple[str, int], int]:
    """``CheckpointFile`` read of an offset checkpoint (version 0): Kafka fails on anything
    malformed (``IOException: Malformed line``), so this raises ``ValueError`` then."""
    lines = data.decode("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) < 2 or lines[0] != "0":
        raise ValueError(f"bad checkpoint header: {lines[:2]!r}")
    count = int(lines[1])
    entries = lines[2:]
    if len(entries) != count:
        raise ValueError(f"checkpoint says {count} entries, has {len(entries)}")
    out = {}
    for line in entries:
        topic, partition, offset = line.split(" ")
        out[(topic, int(partition))] = int(offset)
    return out
