"""Checkpoint files: Kafka's ``CheckpointFile`` text framing and the four offset checkpoints.

Framing (KAFKA_NOTES §3.1; Kafka ``server-common/.../CheckpointFile.java``)::

    <version>\\n
    <N>\\n
    <entry line>\\n   (N times)

Parsing mirrors ``CheckpointReadBuffer`` and the entry formatters exactly, and raises
``CorruptCheckpointError`` (file, byte position of the line, ``line K:`` in the reason) for
everything a broker rejects, including what it rejects with a NumberFormatException rather
than an IOException:

- an empty file has no entries; so has a file with only the version line;
- the version and count lines must be Java ints (``Integer.parseInt``: optional sign, ASCII
  digits, int32 range); a version other than the expected one is an error;
- every entry line must split (Java ``\\s+``) into exactly the formatter's fields; a blank
  line is malformed; trailing whitespace is accepted (Java's ``split`` drops trailing empty
  strings) but leading whitespace is not;
- the number of entry lines must equal N;
- lines end in ``\\n``, ``\\r\\n`` or ``\\r`` (``BufferedReader.readLine``); the file must be UTF-8.

A broker that hits an IOException here marks the whole log dir offline (§3.1), which is why
a writer must produce exactly this text: version, count, ``topic partition offset`` with
single spaces, ``\\n`` line ends, via tmp + fsync + rename + directory fsync
(``files.atomic_write``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from cleaner.errors import CorruptCheckpointError
from cleaner.storage import files
from cleaner.storage.topic_partition import TopicPartition

PathLike = str | os.PathLike[str]
T = TypeVar("T")

CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
RECOVERY_POINT_OFFSET_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
OFFSET_CHECKPOINT_FILES = (
    CLEANER_OFFSET_CHECKPOINT,
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
)
OFFSET_CHECKPOINT_VERSION = 0

_JAVA_INT = re.compile(r"[+-]?[0-9]+")
# java.util.regex \s: [ \t\n\x0B\f\r]
_JAVA_WHITESPACE = re.compile(r"[ \t\n\x0b\f\r]+")
_LINE_END = re.compile(r"\r\n|\r|\n")
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)


def _parse_java_int(text: str, bounds: tuple[int, int], what: str) -> int:
    if not _JAVA_INT.fullmatch(text):
        raise ValueError(f"{what} {text!r} is not a number")
    value = int(text)
    if not bounds[0] <= value <= bounds[1]:
        raise ValueError(f"{what} {text!r} is out of range")
    return value


def parse_int32(text: str, what: str = "value") -> int:
    """``Integer.parseInt``: optional sign, ASCII digits, int32 range; else ValueError."""
    return _parse_java_int(text, _INT32, what)


def parse_int64(text: str, what: str = "value") -> int:
    """``Long.parseLong``: optional sign, ASCII digits, int64 range; else ValueError."""
    return _parse_java_int(text, _INT64, what)


def split_fields(line: str) -> list[str]:
    """Java ``Pattern.compile("\\\\s+").split(line)``: trailing empty strings dropped, a leading
    one kept (so a line starting with whitespace has an empty first field)."""
    parts = _JAVA_WHITESPACE.split(line)
    while len(parts) > 1 and parts[-1] == "":
        parts.pop()
    return parts


def _read_lines(text: str) -> list[tuple[str, int]]:
    """``BufferedReader.readLine`` over ``text``: (line, byte position of its start) pairs."""
    lines: list[tuple[str, int]] = []
    start = 0
    for m in _LINE_END.finditer(text):
        lines.append((text[start : m.start()], start))
        start = m.end()
    if start < len(text):
        lines.append((text[start:], start))
    return lines


def parse_checkpoint(
    data: bytes,
    *,
    version: int,
    parse_entry: Callable[[str], T | None],
    path: PathLike | None = None,
) -> list[T]:
    """Parse the CheckpointFile framing. ``parse_entry`` returns None for a line with the wrong
    shape and raises ValueError for a bad number; both become CorruptCheckpointError."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorruptCheckpointError(f"not valid UTF-8 ({e.reason})", path=path, position=e.start) from None
    lines = _read_lines(text)
    # Positions are byte positions: recompute from the UTF-8 prefix when the text is not ASCII.
    ascii_only = len(text) == len(data)

    def fail(line_no: int, reason: str) -> CorruptCheckpointError:
        char_pos = lines[line_no - 1][1]
        pos = char_pos if ascii_only else len(text[:char_pos].encode("utf-8"))
        return CorruptCheckpointError(f"line {line_no}: {reason}", path=path, position=pos)

    if not lines:
        return []
    try:
        read_version = parse_int32(lines[0][0], "version")
    except ValueError:
        raise fail(1, f"malformed version line {lines[0][0]!r}") from None
    if read_version != version:
        raise fail(1, f"unrecognised version {read_version}, expected version {version}")
    if len(lines) == 1:
        return []
    try:
        expected = parse_int32(lines[1][0], "count")
    except ValueError:
        raise fail(2, f"malformed entry-count line {lines[1][0]!r}") from None
    if expected < 0:
        raise fail(2, f"negative entry count {expected}")
    entries: list[T] = []
    for i, (line, _) in enumerate(lines[2:], start=3):
        try:
            entry = parse_entry(line)
        except ValueError as e:
            raise fail(i, f"malformed line {line!r}: {e}") from None
        if entry is None:
            raise fail(i, f"malformed line {line!r}")
        entries.append(entry)
    if len(entries) != expected:
        raise fail(2, f"expected {expected} entries but found {len(entries)}")
    return entries


def read_checkpoint(path: PathLike, *, version: int, parse_entry: Callable[[str], T | None]) -> list[T]:
    """Read and parse a checkpoint file (never creates it; a missing file raises FileNotFoundError)."""
    with open(path, "rb") as f:
        data = f.read()
    return parse_checkpoint(data, version=version, parse_entry=parse_entry, path=path)


def format_checkpoint(version: int, lines: Iterable[str]) -> bytes:
    """The exact bytes ``CheckpointWriteBuffer`` writes (``BufferedWriter.newLine`` is ``\\n``)."""
    body = list(lines)
    out = [str(version), str(len(body)), *body]
    return ("\n".join(out) + "\n").encode("utf-8")


# ---------------------------------------------------------------------------------------
def _parse_offset_entry(line: str) -> tuple[TopicPartition, int] | None:
    parts = split_fields(line)
    if len(parts) != 3:
        return None
    topic, partition, offset = parts
    return TopicPartition(topic, parse_int32(partition, "partition")), parse_int64(offset, "offset")


def _offset_line(tp: TopicPartition, offset: int) -> str:
    if not tp.topic or _JAVA_WHITESPACE.search(tp.topic):
        raise ValueError(f"topic name {tp.topic!r} cannot be written to a checkpoint (empty or contains whitespace)")
    return f"{tp.topic} {int(tp.partition)} {int(offset)}"


def format_offset_checkpoint(entries: Mapping[TopicPartition, int]) -> bytes:
    """Kafka's text for an offset checkpoint, entries sorted by (topic, partition).

    Kafka writes in HashMap iteration order, which nothing depends on (the reader builds a
    map), so any order is valid; sorting makes our output deterministic.
    """
    items = sorted(entries.items(), key=lambda kv: (kv[0][0], kv[0][1]))
    return format_checkpoint(OFFSET_CHECKPOINT_VERSION, (_offset_line(TopicPartition(*tp), off) for tp, off in items))


def parse_offset_checkpoint(data: bytes, *, path: PathLike | None = None) -> dict[TopicPartition, int]:
    """Parse an offset checkpoint. A partition listed twice keeps its last value (Kafka puts
    every line into a HashMap; the count check counts lines)."""
    result: dict[TopicPartition, int] = {}
    for tp, offset in parse_checkpoint(
        data, version=OFFSET_CHECKPOINT_VERSION, parse_entry=_parse_offset_entry, path=path
    ):
        result[tp] = offset
    return result


class OffsetCheckpointFile:
    """One of the log-dir offset checkpoints (``OffsetCheckpointFile`` on ``CheckpointFile``).

    Unlike Kafka's constructor, this never creates the file: reading a missing file gives no
    entries, and only ``write``/``update`` create it.
    """

    def __init__(self, path: PathLike) -> None:
        self.path = os.fspath(path)

    def exists(self) -> bool:
        return os.path.exists(self.path)

    def read(self) -> dict[TopicPartition, int]:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return {}
        return parse_offset_checkpoint(data, path=self.path)

    def write(self, entries: Mapping[TopicPartition, int]) -> None:
        """Replace the file with ``entries`` (tmp + fsync + rename + directory fsync)."""
        files.atomic_write(self.path, format_offset_checkpoint(entries))

    def update(
        self,
        *,
        set: Mapping[TopicPartition, int] | None = None,
        remove: Iterable[TopicPartition] = (),
        keep_only: Iterable[TopicPartition] | None = None,
    ) -> dict[TopicPartition, int]:
        """Kafka's ``LogCleanerManager.updateCheckpoints``: re-read the file, keep only the
        partitions in ``keep_only`` (Kafka: the logs currently loaded; None keeps every line,
        which is what an offline tool must do, §3.1), remove ``remove``, then set ``set``,
        and rewrite. Returns what was written. A corrupt file raises before anything is written.
        """
        current = self.read()
        if keep_only is not None:
            keep = {TopicPartition(*tp) for tp in keep_only}
            current = {tp: off for tp, off in current.items() if tp in keep}
        for tp in remove:
            current.pop(TopicPartition(*tp), None)
        for tp, off in (set or {}).items():
            current[TopicPartition(*tp)] = int(off)
        self.write(current)
        return current

    def __repr__(self) -> str:
        return f"OffsetCheckpointFile({self.path!r})"
