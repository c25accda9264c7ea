"""``kafka-cleaner dump``: Kafka's ``kafka-dump-log.sh`` (``DumpLogSegments``) for every file of a log dir.

What it prints follows Kafka's tool line for line where Kafka has one (batch lines, ``--deep``
record lines, index, time index, txn index and producer snapshot entries), so output can be
compared with a broker's own tool; checkpoints and metadata files get the same ``name: value``
style. ``--json`` writes one JSON document instead (a list with one object per file).

Problems are printed to stderr as they are found, one per line
(``path: byte N, offset M: reason``), and make the exit status 1. Without ``--verify`` a file
is checked only as far as dumping it needs (framing, CRCs, the records with ``--deep``, the
index/checkpoint/snapshot formats); ``--verify`` decodes every record, checks offsets across
batches and against the segment's name, and verifies ``.index``/``.timeindex`` against their
``.log``. Every problem is listed, not only the first: a bad batch is reported and the scan
continues with the next one whenever the batch framing allows it.

The tool is safe on a live broker's log dir: files are only opened for reading, a ``.log`` is
read in bounded chunks (never whole), output is streamed, and the preallocated (zero-filled)
index tail of an active segment is recognised instead of being reported as corruption.
"""

from __future__ import annotations

import base64
import bisect
import json
import os
import re
import struct
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import click
import numpy as np

from cleaner.errors import CorruptDataError, CorruptIndexError, CorruptRecordError, KafkaCleanerError, truncated_batch
from cleaner.partition_filter import PartitionFilter, filter_options, partition_filter
from cleaner.records.batch import (
    INT32_MAX,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    MIN_LEGACY_ENTRY_LENGTH,
    RECORD_BATCH_OVERHEAD,
    TimestampType,
    increment_sequence,
)
from cleaner.records.columns import RecordColumns, decode_records
from cleaner.records.compression import CompressionType
from cleaner.records.control import ControlRecordType, EndTxnMarker
from cleaner.records.scan import Batches, scan_batches
from cleaner.storage.checkpoint import parse_checkpoint, parse_int32, parse_int64, split_fields
from cleaner.storage.index import OffsetIndex, TimeIndex, TransactionIndex
from cleaner.storage.metadata import (
    CLEAN_SHUTDOWN_FILE,
    LEADER_EPOCH_CHECKPOINT,
    META_PROPERTIES,
    PARTITION_METADATA,
    parse_leader_epoch_checkpoint,
    parse_meta_properties,
    parse_partition_metadata,
    read_clean_shutdown,
)
from cleaner.storage.producer_state import decode_snapshot
from cleaner.storage.topic_partition import parse_partition_dir

__all__ = ["DEFAULT_READ_BUFFER_BYTES", "Problem", "dump", "run_dump"]

DEFAULT_READ_BUFFER_BYTES = 8 * 1024 * 1024
DECODE_SLICE_BYTES = 256 * 1024  # records of at most this many batch bytes are decoded at once
_OUTPUT_FLUSH_CHARS = 64 * 1024
_INT64_MIN = np.iinfo(np.int64).min

TEMP_SUFFIXES = (".deleted", ".cleaned", ".swap")
_SEGMENT_KINDS = {
    ".log": "log",
    ".index": "offset-index",
    ".timeindex": "time-index",
    ".txnindex": "txn-index",
    ".snapshot": "producer-snapshot",
}
_KRAFT_SNAPSHOT = re.compile(r"(?P<offset>[0-9]{20})-(?P<epoch>[0-9]{10})\.checkpoint")
NOT_KAFKA = "not a Kafka log-dir file"
_SKIPPED = {
    ".lock": "the log dir lock file",
    "quorum-state": "KRaft quorum state (JSON, not a log file)",
    "bootstrap.checkpoint": "KRaft bootstrap metadata (not a partition log file)",
}
# Kafka's TimestampType.toString, used as the label of a timestamp.
_TIMESTAMP_LABEL = {
    TimestampType.NO_TIMESTAMP_TYPE: "NoTimestampType",
    TimestampType.CREATE_TIME: "CreateTime",
    TimestampType.LOG_APPEND_TIME: "LogAppendTime",
}


# ---------------------------------------------------------------------------------------
# Problems and output


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a file: where (file, byte position, offset) and why."""

    path: str
    reason: str
    position: int | None = None
    offset: int | None = None

    @classmethod
    def of(cls, error: CorruptDataError, path: str) -> Problem:
        return cls(error.path or path, error.reason, error.position, error.offset)

    def __str__(self) -> str:
        where = []
        if self.position is not None:
            where.append(f"byte {self.position}")
        if self.offset is not None:
            where.append(f"offset {self.offset}")
        prefix = f"{self.path}: {', '.join(where)}" if where else self.path
        return f"{prefix}: {self.reason}"

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "position": self.position, "offset": self.offset, "reason": self.reason}


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _optional_long(value: int | None) -> str:
    """Java's ``OptionalLong.toString``."""
    return "OptionalLong.empty" if value is None else f"OptionalLong[{value}]"


def _codec_name(codec: int) -> str:
    try:
        return CompressionType(codec).kafka_name
    except ValueError:
        return f"unknown({codec})"


_PRINTED_PER_FILE = 20
"""Problems of one file printed on stderr; the count and ``--json`` have them all."""


class _Output:
    """Streams text lines or one JSON document to stdout and problems to stderr.

    JSON is written piece by piece (``[``, then each file object, whose item list is written
    item by item), so memory stays bounded by one batch, whatever the size of the log.
    """

    def __init__(self, *, as_json: bool, summary: bool = False) -> None:
        self.as_json = as_json
        self.summary = summary
        """``--verify --summary``: no dump lines; each damaged file's first problem, then the count."""
        self.printed_per_file = 1 if summary else _PRINTED_PER_FILE
        self._buf: list[str] = []
        self._size = 0
        self._files = 0
        self._items_open = False
        self._first_item = True
        self._notes: list[str] = []
        self._problems: list[Problem] = []
        self._in_file = False
        self._items_key: str | None = None
        self._items_written = False
        self._summary: dict[str, Any] = {}
        self.problem_count = 0
        self.files_with_problems = 0
        self.files_seen = 0
        self.files_skipped = 0
        if as_json:
            self._write("[")

    # -- raw writing ------------------------------------------------------------------
    def _write(self, text: str) -> None:
        self._buf.append(text)
        self._size += len(text)
        if self._size >= _OUTPUT_FLUSH_CHARS:
            self.flush()

    def flush(self) -> None:
        if self._buf:
            click.echo("".join(self._buf), nl=False)
            self._buf.clear()
            self._size = 0

    def line(self, text: str) -> None:
        """A line of the text dump (ignored in JSON mode)."""
        if not self.as_json and not self.summary:
            self._write(text + "\n")

    # -- file results -----------------------------------------------------------------
    @property
    def in_file(self) -> bool:
        return self._in_file

    def begin_file(
        self,
        path: str,
        kind: str,
        *,
        head: dict[str, Any] | None = None,
        items: str | None = None,
        summary: dict[str, Any] | None = None,
    ) -> None:
        """Start a file's result. ``items`` names its list (``batches``/``entries``) and
        ``summary`` gives the defaults of the fields ``end_file`` writes, so a file whose
        dump stops early still has every key of its type."""
        self.files_seen += 1
        self._in_file = True
        self._notes = []
        self._problems = []
        self._items_key = items
        self._items_written = False
        self._summary = dict(summary or {})
        if self.as_json:
            head = json.dumps({"path": path, "type": kind, **(head or {})})
            self._write(("\n" if self._files == 0 else ",\n") + head[:-1])
        elif kind == "skipped" or self.summary:
            pass
        else:
            self._write(f"Dumping {path}\n")
        self._files += 1

    def open_items(self) -> None:
        self._items_written = True
        if self.as_json:
            self._write(f", {json.dumps(self._items_key)}: [")
            self._items_open = True
            self._first_item = True

    def item(self, obj: dict[str, Any], text: str | None) -> None:
        if self.as_json:
            self._write(("\n  " if self._first_item else ",\n  ") + json.dumps(obj))
            self._first_item = False
        elif text is not None and not self.summary:
            self._write(text + "\n")

    def close_items(self) -> None:
        if self.as_json and self._items_open:
            self._write("]")
            self._items_open = False

    def note(self, text: str) -> None:
        self._notes.append(text)
        self.line(text)

    def problem(self, problem: Problem) -> None:
        """Printed to stderr at once (after the stdout lines written so far), the first
        ``_PRINTED_PER_FILE`` of a file; every one is counted and is in the JSON."""
        self._problems.append(problem)
        self.problem_count += 1
        if len(self._problems) <= self.printed_per_file:
            self.flush()
            click.echo(str(problem), err=True)

    def end_file(self, **fields: Any) -> None:
        if not self._in_file:
            return
        self.close_items()
        if self._items_key is not None and not self._items_written:
            self.open_items()
            self.close_items()
        if self._problems:
            self.files_with_problems += 1
        if len(self._problems) > self.printed_per_file:
            self.flush()
            click.echo(
                f"{self._problems[0].path}: {len(self._problems) - self.printed_per_file} more problem(s) not shown "
                "(--json lists every one)",
                err=True,
            )
        if self.as_json:
            self._summary.update(fields)
            parts = [f", {json.dumps(k)}: {json.dumps(v)}" for k, v in self._summary.items()]
            parts.append(f', "notes": {json.dumps(self._notes)}')
            parts.append(f', "problems": {json.dumps([p.to_json() for p in self._problems])}}}')
            self._write("".join(parts))
        self._in_file = False

    def close(self) -> None:
        if self.as_json:
            self._write("\n]\n")
        self.flush()


# ---------------------------------------------------------------------------------------
# File names


@dataclass(frozen=True, slots=True)
class _Name:
    kind: str  # log, offset-index, ..., or "skipped"
    temp_suffix: str = ""  # .deleted / .cleaned / .swap, or ""
    stem: str = ""  # name up to the first dot
    reason: str = ""  # why it is skipped


def classify(name: str) -> _Name:
    """What a file is, from its name, the way a broker tells its files apart (§2, §4)."""
    inner, temp = name, ""
    for suffix in TEMP_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            inner, temp = name[: -len(suffix)], suffix
            break
    stem = inner.split(".", 1)[0]
    for ext, kind in _SEGMENT_KINDS.items():
        if inner.endswith(ext) and len(inner) > len(ext):
            return _Name(kind, temp, stem)
    if _KRAFT_SNAPSHOT.fullmatch(inner):
        return _Name("kraft-snapshot", temp, stem)
    if temp:
        return _Name("skipped", reason=f"unknown file type with a {temp} suffix")
    if name in _SKIPPED:
        return _Name("skipped", reason=_SKIPPED[name])
    if name == LEADER_EPOCH_CHECKPOINT:
        return _Name("leader-epoch-checkpoint")
    if name == META_PROPERTIES:
        return _Name("meta-properties")
    if name == PARTITION_METADATA:
        return _Name("partition-metadata")
    if name == CLEAN_SHUTDOWN_FILE:
        return _Name("clean-shutdown")
    if name.endswith(".tmp"):
        return _Name("skipped", reason="temporary file of an interrupted atomic write")
    if name.endswith("-checkpoint"):
        return _Name("offset-checkpoint")
    return _Name("skipped", reason=NOT_KAFKA)


def _base_offset(stem: str) -> int | None:
    """``Long.parseLong(name[:name.indexOf('.')])``, or None when the name has no offset."""
    try:
        return parse_int64(stem, "base offset")
    except ValueError:
        return None


def _sibling(path: str, name: _Name, ext: str) -> str:
    return os.path.join(os.path.dirname(path), f"{name.stem}{ext}{name.temp_suffix}")


# ---------------------------------------------------------------------------------------
# The run


def _utf8(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


#: ``--decoder``: how ``--print-data-log`` shows keys and values (Kafka's own default is a
#: string decoder, UTF-8).
DECODERS: dict[str, Callable[[bytes], str]] = {
    "utf8": _utf8,
    "hex": bytes.hex,
    "base64": lambda data: base64.b64encode(data).decode("ascii"),
}


@dataclass
class _Options:
    deep: bool
    verify: bool
    read_buffer_bytes: int = DEFAULT_READ_BUFFER_BYTES
    decoder: Callable[[bytes], str] | None = None
    """``--print-data-log``: keys and values are printed, decoded by this."""
    offsets: tuple[int, int] | None = None
    """``--offsets FROM:TO``: only the batches and records within [FROM, TO] are printed."""


@dataclass
class _Run:
    options: _Options
    out: _Output
    dir_mode: bool = False
    # Index problems found while verifying a .log, reported when the index itself is dumped.
    pending: dict[str, list[Problem]] = field(default_factory=dict)
    _active: dict[str, int | None] = field(default_factory=dict)

    def active_base(self, directory: str) -> int | None:
        """Base offset of the partition directory's active segment: its last ``.log``."""
        if directory not in self._active:
            bases = []
            try:
                names = os.listdir(directory or ".")
            except OSError:
                names = []
            for n in names:
                if n.endswith(".log"):
                    base = _base_offset(n[: -len(".log")])
                    if base is not None and n == f"{n.split('.', 1)[0]}.log":
                        bases.append(base)
            self._active[directory] = max(bases) if bases else None
        return self._active[directory]

    def is_active(self, path: str, name: _Name) -> bool:
        if name.temp_suffix:
            return False
        base = _base_offset(name.stem)
        return base is not None and base == self.active_base(os.path.dirname(path))


def run_dump(
    path: str,
    *,
    deep: bool = False,
    verify: bool = False,
    as_json: bool = False,
    read_buffer_bytes: int = DEFAULT_READ_BUFFER_BYTES,
    only: PartitionFilter | None = None,
    decoder: str | None = None,
    offsets: tuple[int, int] | None = None,
    summary: bool = False,
) -> int:
    """Dump ``path`` (a file, a partition directory or a whole log dir); returns the exit status.
    ``only`` (``--topic``/``--partition``) keeps the files of the partition dirs it accepts."""
    out = _Output(as_json=as_json, summary=summary)
    options = _Options(deep or decoder is not None, verify, max(read_buffer_bytes, RECORD_BATCH_OVERHEAD),
                       DECODERS[decoder] if decoder is not None else None, offsets)
    run = _Run(options, out)
    try:
        if os.path.isdir(path):
            run.dir_mode = True
            walk_errors: list[OSError] = []
            for file_path in _walk(path, walk_errors):
                if only is None or _in_partition(file_path, only):
                    _dump_file(run, file_path)
            for e in walk_errors:  # an unreadable directory is a problem, not a silent gap
                where = e.filename if isinstance(e.filename, str) else path
                out.begin_file(where, "directory")
                out.problem(Problem(where, f"cannot list the directory: {e.strerror or e}"))
                out.end_file()
        else:
            _dump_file(run, path)
    finally:
        out.close()
    kafka_files = out.files_seen - out.files_skipped  # Kafka's lock file and temporaries included
    if out.problem_count:
        click.echo(
            f"{out.problem_count} problem(s) found in {out.files_with_problems} of {kafka_files} file(s)", err=True
        )
        return 1
    if kafka_files == 0 and only is not None:
        click.echo(f"kafka-cleaner: nothing to dump: no partition dir in {path} matches --topic/--partition", err=True)
        return 2
    if kafka_files == 0:
        click.echo(
            f"kafka-cleaner: nothing to dump: {path} holds no file Kafka writes ({out.files_skipped} skipped)", err=True
        )
        return 2
    if verify:
        click.echo(f"verified {kafka_files} file(s): no problems found", err=True)
    return 0


def _in_partition(file_path: str, only: PartitionFilter) -> bool:
    tp = parse_partition_dir(os.path.basename(os.path.dirname(file_path)))
    return tp is not None and only(tp)


def _sort_key(name: str) -> tuple[str, str, int, str]:
    """Sorted by name, except that a segment's ``.log`` comes before its index files, so the
    log's verification can hand its findings to them."""
    n = classify(name)
    rank = 0 if n.kind in ("log", "kraft-snapshot") else 1
    return (n.stem or name, n.temp_suffix, rank, name)


def _walk(root: str, errors: list[OSError]) -> Iterator[str]:
    for dirpath, dirnames, filenames in os.walk(root, onerror=errors.append):
        dirnames.sort()
        for name in sorted(filenames, key=_sort_key):
            yield os.path.join(dirpath, name)


def _dump_file(run: _Run, path: str) -> None:
    name = classify(os.path.basename(path))
    out = run.out
    if name.kind == "skipped":
        out.files_skipped += name.reason == NOT_KAFKA
        out.begin_file(path, "skipped")
        out.note(f"Skipping {path}: {name.reason}")
        out.end_file()
        return
    handler = _HANDLERS[name.kind]
    try:
        handler(run, path, name)
    except BrokenPipeError:
        raise
    except FileNotFoundError:
        # A live broker deletes .deleted files and old segments while we read.
        if not out.in_file:
            out.begin_file(path, name.kind)
        out.note(f"{path} disappeared while it was being read")
    except OSError as e:
        if not out.in_file:
            out.begin_file(path, name.kind)
        out.problem(Problem(path, f"cannot read the file: {e.strerror or e}"))
    except KafkaCleanerError as e:
        if not out.in_file:
            out.begin_file(path, name.kind)
        if isinstance(e, CorruptDataError):
            out.problem(Problem.of(e, path))
        else:
            out.problem(Problem(path, str(e)))
    except Exception as e:  # a bug here must not hide the rest of the dump behind a traceback
        if not out.in_file:
            out.begin_file(path, name.kind)
        out.problem(Problem(path, f"internal error while dumping ({type(e).__name__}: {e}); please report it"))
    finally:
        out.end_file()


def _read_small(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# ---------------------------------------------------------------------------------------
# .log: reading in bounded chunks


def _pread(fd: int, n: int, position: int) -> bytes:
    parts = []
    while n > 0:
        part = os.pread(fd, n, position)
        if not part:
            break
        parts.append(part)
        n -= len(part)
        position += len(part)
    return b"".join(parts)


def _framed_size(buf: bytes, at: int) -> int | None:
    """Size of the entry at ``at`` if its framing (length, magic) is sound, else None."""
    if len(buf) - at < MAGIC_OFFSET + 1:
        return None
    _, length = struct.unpack_from(">qi", buf, at)
    magic = buf[at + MAGIC_OFFSET]
    size = length + LOG_OVERHEAD
    if length < MIN_LEGACY_ENTRY_LENGTH or magic > 2 or (magic == 2 and size < RECORD_BATCH_OVERHEAD):
        return None
    return size


@dataclass
class _ScanEnd:
    """How the scan of a log ended: ``valid_bytes`` framed, then ``trailing`` unread bytes."""

    valid_bytes: int = 0
    trailing: int = 0


def _scan_log(
    fd: int, size: int, path: str, chunk_bytes: int, report: Callable[[Problem], None], end: _ScanEnd
) -> Iterator[Batches]:
    """The batches of a log file, chunk by chunk (each chunk one ``Batches`` with file positions).

    Reads ``chunk_bytes`` at a time, more only for a single batch larger than that. An entry
    whose content is corrupt but whose framing is sound (a legacy message that does not
    decode) is reported and stepped over; a framing error (bad length or magic) ends the scan,
    as it ends Kafka's, since nothing after it can be located.
    """
    pos = 0
    want = chunk_bytes
    while pos < size:
        asked = min(want, size - pos)
        buf = _pread(fd, asked, pos)
        if len(buf) < asked:
            size = pos + len(buf)  # the file shrank under us
        if not buf:
            break
        stop = len(buf)
        first_error: CorruptRecordError | None = None
        while True:
            try:
                res = scan_batches(buf, 0, stop, base_position=pos, path=path)
                break
            except CorruptRecordError as e:
                at = (e.position if e.position is not None else pos) - pos
                first_error, stop = e, max(min(at, stop - 1), 0)
        if len(res.batches):
            yield res.batches
        if first_error is not None:
            at = res.end  # the start of the bad entry (a decoder may point inside it)
            report(Problem.of(first_error, path))
            skip = _framed_size(buf, at)
            if skip is not None and pos + at + skip <= size:
                pos += at + skip
                end.valid_bytes = pos
                want = chunk_bytes
                continue
            end.valid_bytes = pos + at
            end.trailing = size - (pos + at)
            _report_unreadable_rest(fd, size, pos + at, path, report)
            return
        if res.end == 0:
            remaining = size - pos
            need = res.next_entry_size
            if need is not None and need <= remaining and need > len(buf):
                want = need  # one batch larger than the read buffer: grow for it
                continue
            offset = struct.unpack_from(">q", buf, 0)[0] if len(buf) >= 8 else None
            report(Problem(path, truncated_batch(path, pos, need, remaining).reason, pos, offset))
            end.valid_bytes = pos
            end.trailing = remaining
            return
        pos += res.end
        end.valid_bytes = pos
        want = chunk_bytes


def _report_unreadable_rest(fd: int, size: int, start: int, path: str, report: Callable[[Problem], None]) -> None:
    """After a framing error: say what the rest of the file is, which tells a zero-filled
    (preallocated, never trimmed) tail from garbage."""
    pos = start
    while pos < size:
        block = _pread(fd, min(DEFAULT_READ_BUFFER_BYTES, size - pos), pos)
        if not block or block.count(0) != len(block):
            break
        pos += len(block)
    rest = size - start
    if pos >= size:
        report(
            Problem(
                path,
                f"zero-filled tail: the {rest} bytes from position {start} to the end of the file are zeros "
                "(a preallocated segment that was never trimmed?)",
                start,
            )
        )
    else:
        report(Problem(path, f"the {rest} bytes from position {start} to the end of the file cannot be read", start))


# ---------------------------------------------------------------------------------------
# Index verification against a log, without keeping every batch


class _IndexWitness:
    """Just the batches ``OffsetIndex.verify_against`` / ``TimeIndex.verify_against`` look at,
    gathered chunk by chunk, so verifying the indexes of a huge segment does not need every
    batch's columns at once.

    Offset index: the batches at the entries' positions, the batch before each of them (the
    lookup invariant) and the last batch. Time index: the batch holding each entry's offset,
    carrying the running maximum timestamp up to it, and the last batch with the segment's
    maximum. On these subsets both checks give exactly the answers they give on all batches.
    """

    def __init__(self, index: OffsetIndex | None, time_index: TimeIndex | None) -> None:
        self.index = index
        self.time_index = time_index
        self._want = np.unique(index.positions) if index is not None else None
        self._time_offsets = time_index.offsets if time_index is not None else None
        self._time_done = np.zeros(len(self._time_offsets), dtype=bool) if time_index is not None else None
        self._held: tuple[int, int] | None = None
        self._off: list[tuple[np.ndarray, np.ndarray]] = []
        self._time: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._carry = _INT64_MIN
        self._final: tuple[int, int, int] | None = None

    def feed(self, positions: np.ndarray, lasts: np.ndarray, max_timestamps: np.ndarray) -> None:
        if not len(positions):
            return
        if self._want is not None:
            pos, last = positions, lasts
            if self._held is not None:
                pos = np.concatenate(([self._held[0]], pos))
                last = np.concatenate(([self._held[1]], last))
            nxt = np.concatenate((pos[1:], [-1]))
            keep = np.isin(pos, self._want) | np.isin(nxt, self._want)
            keep[-1] = False  # held back: whether it precedes an indexed batch shows in the next chunk
            self._off.append((pos[keep], last[keep]))
            self._held = (int(pos[-1]), int(last[-1]))
        running = np.maximum.accumulate(np.concatenate(([self._carry], max_timestamps)))[1:]
        self._carry = int(running[-1])
        if self._time_offsets is not None:
            todo = np.flatnonzero(~self._time_done)
            if len(todo):
                k = np.searchsorted(lasts, self._time_offsets[todo], side="left")
                hit = k < len(lasts)
                ks = np.unique(k[hit])
                self._time.append((positions[ks], lasts[ks], running[ks]))
                self._time_done[todo[hit]] = True
        self._final = (int(positions[-1]), int(lasts[-1]), self._carry)

    def offset_problems(self) -> list[str]:
        assert self.index is not None
        pos = [p for p, _ in self._off]
        last = [la for _, la in self._off]
        if self._held is not None:
            pos.append(np.array([self._held[0]], dtype=np.int64))
            last.append(np.array([self._held[1]], dtype=np.int64))
        starts = np.concatenate(pos) if pos else np.zeros(0, np.int64)
        lasts = np.concatenate(last) if last else np.zeros(0, np.int64)
        return self.index.verify_against(starts, lasts)

    def time_problems(self, *, closed: bool) -> list[str]:
        assert self.time_index is not None
        pos = [p for p, _, _ in self._time]
        last = [la for _, la, _ in self._time]
        maxts = [m for _, _, m in self._time]
        if self._final is not None and not (pos and len(pos[-1]) and int(pos[-1][-1]) == self._final[0]):
            pos.append(np.array([self._final[0]], dtype=np.int64))
            last.append(np.array([self._final[1]], dtype=np.int64))
            maxts.append(np.array([self._final[2]], dtype=np.int64))
        lasts = np.concatenate(last) if last else np.zeros(0, np.int64)
        running = np.concatenate(maxts) if maxts else np.zeros(0, np.int64)
        return self.time_index.verify_against(lasts, running, closed=closed)


_ENTRY_PROBLEM = re.compile(r"entr(?:y|ies) (\d+)\b")


def _index_problems(
    messages: list[str], path: str, entry_size: int, offsets: np.ndarray, entries: int
) -> list[Problem]:
    """``verify_against`` messages as located problems (byte position and offset of the entry)."""
    problems = []
    for text in messages:
        m = _ENTRY_PROBLEM.match(text)
        if m:
            i = int(m.group(1))
        elif text.startswith("last entry") and entries:
            i = entries - 1
        else:
            problems.append(Problem(path, text))
            continue
        offset = int(offsets[i]) if 0 <= i < len(offsets) else None
        problems.append(Problem(path, text, i * entry_size, offset))
    return problems


def _load_index(
    cls: type[OffsetIndex] | type[TimeIndex], path: str, base: int, *, active: bool
) -> tuple[OffsetIndex | TimeIndex, list[str]]:
    """Read an index the way a broker opens it (every whole entry), except for the active
    segment's preallocated zero entries after the first, which a broker also never reads as
    entries while it runs (it knows its own entry count). Returns the index and notes."""
    data = _read_small(path)
    notes = []
    size = cls.ENTRY_SIZE
    if active and len(data) >= 2 * size:
        n = len(data) // size
        keep = n
        zero = bytes(size)
        while keep > 1 and data[(keep - 1) * size : keep * size] == zero:
            keep -= 1
        if keep < n:
            data = data[: keep * size]
            notes.append(
                f"{n - keep} zero-filled entries after entry {keep - 1} ignored: the preallocated tail of the "
                "active segment's index"
            )
    return cls.from_bytes(data, base, path=path, strict=False), notes


def _check_index_alone(index: OffsetIndex | TimeIndex, path: str, *, order: bool) -> list[Problem]:
    """Kafka's ``sanityCheck`` (length, last offset) and, when no log is there to verify
    against, the ordering every broker-written index has."""
    problems = []
    checks = [index.sanity_check]
    if order:
        checks.append(index.check_order)
    for check in checks:
        try:
            check()
        except CorruptIndexError as e:
            problems.append(Problem.of(e, path))
    return problems


# ---------------------------------------------------------------------------------------
# .log: one chunk of batches


@dataclass
class _LogState:
    segment_base: int | None
    deep: bool
    check: bool  # the offset checks of --verify
    decode: bool  # decode the records (--deep or --verify)
    prev_last: int | None = None
    first: bool = True
    batches: int = 0
    records: int = 0


def _slices(batches: Batches, max_bytes: int) -> Iterator[Batches]:
    """Consecutive runs of batches of about ``max_bytes`` (at least one batch each): records
    are decoded, checked and printed a slice at a time, which bounds the memory per-record
    output needs."""
    n = len(batches)
    if n == 0:
        return
    cum = np.cumsum(batches.sizes)
    start = 0
    while start < n:
        limit = (int(cum[start - 1]) if start else 0) + max_bytes
        stop = max(int(np.searchsorted(cum, limit, side="right")), start + 1)
        yield batches if (start, stop) == (0, n) else batches.select(slice(start, stop))
        start = stop


def _decode_bisect(
    batches: Batches, rows: np.ndarray, errors: list[CorruptRecordError]
) -> list[tuple[RecordColumns, np.ndarray]]:
    """Decode the records of ``rows``; when that fails, halve until every bad batch is found,
    so one corrupt batch does not hide the records (or the problems) of the others."""
    try:
        return [(decode_records(batches.select(rows)), rows)]
    except CorruptRecordError as e:
        if len(rows) == 1:
            errors.append(e)
            return []
    mid = len(rows) // 2
    return _decode_bisect(batches, rows[:mid], errors) + _decode_bisect(batches, rows[mid:], errors)


class _RecordRows:
    """The decoded records of one v2 batch: rows ``start..stop`` of ``cols``."""

    __slots__ = ("cols", "lists", "start", "stop")

    def __init__(self, cols: RecordColumns, lists: dict[str, list[int]], start: int, stop: int) -> None:
        self.cols = cols
        self.lists = lists
        self.start = start
        self.stop = stop


def _column_lists(cols: RecordColumns) -> dict[str, list[int]]:
    return {
        "offset": cols.offsets.tolist(),
        "offset_delta": cols.offset_delta.tolist(),
        "timestamp": cols.timestamps.tolist(),
        "key_length": cols.key_length.tolist(),
        "value_length": cols.value_length.tolist(),
        "headers_count": cols.headers_count.tolist(),
    }


def _data(obj: dict[str, Any], key: bytes | None, value: bytes | None, decoder: Callable[[bytes], str]) -> str:
    """``--print-data-log``'s part of a record line (Kafka's " key: ... payload: ...", each only
    when present), and the same as ``key``/``value`` in the JSON form."""
    obj["key"] = None if key is None else decoder(key)
    obj["value"] = None if value is None else decoder(value)
    key_text = f" key: {obj['key']}" if key is not None else ""
    return key_text + (f" payload: {obj['value']}" if value is not None else "")


def _v2_record(
    rows: _RecordRows,
    r: int,
    base_sequence: int,
    is_control: bool,
    label: str,
    where: tuple[str, int],
    decoder: Callable[[bytes], str] | None = None,
) -> tuple[dict[str, Any], str, Problem | None]:
    """One v2 record as Kafka's ``printRecordMetadata`` shows it (and its JSON form)."""
    lists = rows.lists
    offset = lists["offset"][r]
    sequence = -1 if base_sequence < 0 else increment_sequence(base_sequence, lists["offset_delta"][r])
    header_keys = [k for k, _ in rows.cols.headers(r)] if lists["headers_count"][r] else []
    key_size, value_size = lists["key_length"][r], lists["value_length"][r]
    control, control_text, problem = None, "", None
    if is_control:
        try:
            key = rows.cols.key(r)
            ctype = ControlRecordType.parse_key(key)
            if ctype in (ControlRecordType.ABORT, ControlRecordType.COMMIT):
                marker = EndTxnMarker.parse(ctype, rows.cols.value(r))
                control = {"type": ctype.name, "coordinatorEpoch": marker.coordinator_epoch}
                control_text = f" endTxnMarker: {ctype.name} coordinatorEpoch: {marker.coordinator_epoch}"
            else:
                assert key is not None
                control = {"type": ctype.name, "coordinatorEpoch": None}
                control_text = f" controlType: {ctype.name}({struct.unpack_from('>h', key, 2)[0]})"
        except CorruptRecordError as e:
            problem = Problem(where[0], f"control record: {e.reason}", where[1], offset)
    obj = {
        "offset": offset,
        "timestamp": lists["timestamp"][r],
        "keySize": key_size,
        "valueSize": value_size,
        "sequence": sequence,
        "headerKeys": header_keys,
        "isTombstone": value_size < 0 <= key_size,
        "control": control,
        "isValid": None,
        "crc": None,
    }
    text = (
        f"| offset: {offset} {label}: {obj['timestamp']} keySize: {key_size} valueSize: {value_size} "
        f"sequence: {sequence} headerKeys: [{','.join(header_keys)}]{control_text}"
    )
    if decoder is not None and not is_control:  # as Kafka's DumpLogSegments: no contents of markers
        text += _data(obj, rows.cols.key(r), rows.cols.value(r), decoder)
    return obj, text, problem


def _legacy_records(
    entry: Any, path: str, position: int, problems: list[Problem], decoder: Callable[[bytes], str] | None = None
) -> list[tuple[dict[str, Any], str]]:
    """The records of a v0/v1 entry, each with Kafka's ``isValid``/``crc`` of its message."""
    label = _TIMESTAMP_LABEL[entry.timestamp_type]
    try:
        inner = entry.inner_entries() if entry.is_compressed else [entry]
        records = entry.records()
    except CorruptRecordError as e:
        problems.append(Problem(path, e.reason, position, e.offset))
        return []
    out = []
    for message, record in zip(inner, records, strict=True):
        valid = message.is_valid_crc()
        if not valid:
            reason = f"inner message is corrupt (stored crc = {message.crc}, computed crc = {message.computed_crc()})"
            problems.append(Problem(path, reason, position, record.offset))
        key_size = -1 if record.key is None else len(record.key)
        value_size = -1 if record.value is None else len(record.value)
        obj = {
            "offset": record.offset,
            "timestamp": record.timestamp,
            "keySize": key_size,
            "valueSize": value_size,
            "sequence": None,
            "headerKeys": None,
            "isTombstone": record.is_tombstone,
            "control": None,
            "isValid": valid,
            "crc": message.crc,
        }
        text = (
            f"| offset: {record.offset} {label}: {record.timestamp} keySize: {key_size} valueSize: {value_size} "
            f"isValid: {_bool(valid)} crc: {message.crc}"
        )
        if decoder is not None:
            text += _data(obj, record.key, record.value, decoder)
        out.append((obj, text))
    return out


def _offset_problems(batches: Batches, state: _LogState, path: str) -> list[Problem]:
    """``--verify``'s batch-level offset checks: offsets strictly increasing across batches,
    lastOffsetDelta >= 0, the file name's base offset <= the first batch's, and every offset
    within the segment's int32 relative range."""
    problems = []
    positions = batches.file_positions.tolist()
    deltas = batches.headers["last_offset_delta"].tolist()
    for i, (base, last) in enumerate(zip(batches.base_offsets.tolist(), batches.last_offsets.tolist(), strict=True)):
        at = positions[i]
        if state.first and state.segment_base is not None and base < state.segment_base:
            reason = (
                f"the first batch's base offset {base} is below the segment's base offset {state.segment_base} "
                "(from the file name)"
            )
            problems.append(Problem(path, reason, at, base))
        state.first = False
        if deltas[i] < 0:
            problems.append(Problem(path, f"negative lastOffsetDelta {deltas[i]}", at, base))
        if state.prev_last is not None and base <= state.prev_last:
            reason = f"offsets not increasing: batch baseOffset {base} follows lastOffset {state.prev_last}"
            problems.append(Problem(path, reason, at, base))
        if state.segment_base is not None and last - state.segment_base > INT32_MAX:
            reason = (
                f"lastOffset {last} does not fit the segment's relative offset range "
                f"(base offset {state.segment_base} + {INT32_MAX})"
            )
            problems.append(Problem(path, reason, at, base))
        state.prev_last = last if state.prev_last is None else max(state.prev_last, last)
    return problems


def _batch_view(batches: Batches, i: int, valid: bool) -> tuple[dict[str, Any], str]:
    """Batch ``i`` as Kafka's ``printBatchLevel`` prints it, and its JSON form."""
    h = batches.header(i)
    position = h.position
    if h.magic >= 2:
        label = _TIMESTAMP_LABEL[h.timestamp_type]
        max_ts, crc = h.max_timestamp, h.crc
        base_seq, last_seq = h.base_sequence, h.last_sequence
        horizon = h.delete_horizon_ms
    else:
        entry = batches.legacy[i]
        label = _TIMESTAMP_LABEL[entry.timestamp_type]
        max_ts, crc = entry.timestamp, entry.crc
        base_seq = last_seq = -1
        horizon = None
    codec = _codec_name(h.compression)
    obj: dict[str, Any] = {
        "baseOffset": h.base_offset,
        "lastOffset": h.last_offset,
        "count": h.records_count,
        "baseSequence": base_seq,
        "lastSequence": last_seq,
        "producerId": h.producer_id,
        "producerEpoch": h.producer_epoch,
        "partitionLeaderEpoch": h.partition_leader_epoch,
        "isTransactional": h.is_transactional,
        "isControl": h.is_control,
        "deleteHorizonMs": horizon,
        "position": position,
        "timestampType": label,
        "maxTimestamp": max_ts,
        "size": h.size_in_bytes,
        "magic": h.magic,
        "compressCodec": codec,
        "crc": crc,
        "isValid": valid,
        "records": None,
    }
    tail = (
        f"position: {position} {label}: {max_ts} size: {h.size_in_bytes} magic: {h.magic} compresscodec: {codec} "
        f"crc: {crc} isvalid: {_bool(valid)}"
    )
    if h.magic < 2:
        return obj, f"offset: {h.last_offset} {tail}"
    text = (
        f"baseOffset: {h.base_offset} lastOffset: {h.last_offset} count: {h.records_count} "
        f"baseSequence: {base_seq} lastSequence: {last_seq} producerId: {h.producer_id} "
        f"producerEpoch: {h.producer_epoch} partitionLeaderEpoch: {h.partition_leader_epoch} "
        f"isTransactional: {_bool(h.is_transactional)} isControl: {_bool(h.is_control)} "
        f"deleteHorizonMs: {_optional_long(horizon)} {tail}"
    )
    return obj, text


def _process_chunk(run: _Run, path: str, batches: Batches, state: _LogState) -> None:
    for part in _slices(batches, DECODE_SLICE_BYTES):
        _process_slice(run, path, part, state)


def _process_slice(run: _Run, path: str, batches: Batches, state: _LogState) -> None:
    """Check and print a run of batches; each problem comes right after the line of the
    batch it concerns."""
    out = run.out
    positions = batches.file_positions.tolist()
    problems: list[Problem] = []
    bad_crc: set[int] = set()
    for e in batches.verify_checksums():
        bad_crc.add(int(e.position))
        problems.append(Problem.of(e, path))

    record_rows: dict[int, _RecordRows] = {}
    legacy_out: dict[int, list[tuple[dict[str, Any], str]]] = {}
    if state.decode:
        errors: list[CorruptRecordError] = []
        for cols, rows in _decode_bisect(batches, np.flatnonzero(batches.is_v2), errors):
            lists = _column_lists(cols)
            starts = cols.batch_record_starts.tolist()
            for j, b in enumerate(rows.tolist()):
                record_rows[b] = _RecordRows(cols, lists, starts[j], starts[j + 1])
            if state.check:
                problems.extend(_record_offset_problems(cols, rows, batches, path))
        problems.extend(Problem.of(e, path) for e in errors)
        for i, entry in batches.legacy.items():
            legacy_out[i] = _legacy_records(entry, path, positions[i], problems, run.options.decoder)
    if state.check:
        problems.extend(_offset_problems(batches, state, path))

    by_batch: dict[int, list[Problem]] = {}
    for p in problems:
        i = max(bisect.bisect_right(positions, p.position if p.position is not None else -1) - 1, 0)
        by_batch.setdefault(i, []).append(p)

    span = run.options.offsets
    for i in range(len(batches)):
        obj, text = _batch_view(batches, i, positions[i] not in bad_crc)
        lines: list[tuple[dict[str, Any], str]] = []
        rows = record_rows.get(i)
        if rows is not None and (state.deep or obj["isControl"]):
            # Control records are parsed under --verify too (their key and marker value).
            base_seq, is_control, label = obj["baseSequence"], obj["isControl"], obj["timestampType"]
            for r in range(rows.start, rows.stop):
                record, line, problem = _v2_record(
                    rows, r, base_seq, is_control, label, (path, positions[i]), run.options.decoder
                )
                lines.append((record, line))
                if problem is not None:
                    by_batch.setdefault(i, []).append(problem)
        elif i in legacy_out:
            lines = legacy_out[i]
        if span is not None:
            shown = obj["lastOffset"] >= span[0] and obj["baseOffset"] <= span[1]
            lines = [(record, line) for record, line in lines if span[0] <= record["offset"] <= span[1]]
            if not shown:  # outside the range: only its problems are reported
                for p in by_batch.get(i, ()):
                    out.problem(p)
                continue
        if state.deep:
            obj["records"] = [record for record, _ in lines]
            state.records += len(lines)
        else:
            state.records += obj["count"]
        if out.as_json:
            out.item(obj, None)
        else:
            out.line(text)
            if state.deep:
                for _, line in lines:
                    out.line(line)
        for p in by_batch.get(i, ()):
            out.problem(p)
    state.batches += len(batches)


def _record_offset_problems(cols: RecordColumns, rows: np.ndarray, batches: Batches, path: str) -> list[Problem]:
    """Every record's offset inside [baseOffset, lastOffset] of its batch, increasing within it."""
    if not len(cols):
        return []
    sub = cols.batch
    delta = cols.offset_delta
    last_delta = batches.headers["last_offset_delta"][rows][sub]
    bad_range = (delta < 0) | (delta > last_delta)
    same = np.zeros(len(delta), dtype=bool)
    same[1:] = sub[1:] == sub[:-1]
    not_increasing = np.zeros(len(delta), dtype=bool)
    not_increasing[1:] = same[1:] & (delta[1:] <= delta[:-1])
    problems = []
    for r in np.flatnonzero(bad_range | not_increasing).tolist():
        b = int(rows[sub[r]])
        base = int(batches.base_offsets[b])
        position = int(batches.file_positions[b])
        offset = base + int(delta[r])
        if bad_range[r]:
            reason = f"record offset {offset} lies outside its batch [{base}, {int(batches.last_offsets[b])}]"
        else:
            reason = f"record offset {offset} does not follow the previous record's {base + int(delta[r - 1])}"
        problems.append(Problem(path, reason, position, offset))
    return problems


# ---------------------------------------------------------------------------------------
# Handlers, one per file type


_LOG_SUMMARY = {"sizeInBytes": 0, "validBytes": 0, "trailingBytes": 0, "batchCount": 0, "recordCount": 0}


def _dump_log(run: _Run, path: str, name: _Name) -> None:
    out = run.out
    opts = run.options
    kraft = name.kind == "kraft-snapshot"
    base = None if kraft else _base_offset(name.stem)
    out.begin_file(path, name.kind, head={"baseOffset": base}, items="batches", summary=_LOG_SUMMARY)
    if kraft:
        m = _KRAFT_SNAPSHOT.fullmatch(os.path.basename(path).removesuffix(name.temp_suffix))
        assert m is not None
        out.line(f"Snapshot end offset: {int(m['offset'])}, epoch: {int(m['epoch'])}")
    elif base is None:
        reason = "the file name does not start with a base offset (a broker cannot load it)"
        if opts.verify:
            out.problem(Problem(path, reason))
        else:
            out.note(f"{path}: {reason}")
    else:
        out.line(f"Log starting offset: {base}")

    active = False
    witness = None
    index_paths: dict[str, str] = {}
    if opts.verify and base is not None:
        active = run.is_active(path, name)
        witness, index_paths = _load_siblings(run, path, name, base, active)

    state = _LogState(segment_base=base, deep=opts.deep, check=opts.verify, decode=opts.deep or opts.verify)
    end = _ScanEnd()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        out.open_items()
        scan_problems: list[Problem] = []
        for batches in _scan_log(f.fileno(), size, path, opts.read_buffer_bytes, scan_problems.append, end):
            for p in scan_problems:
                out.problem(p)
            scan_problems.clear()
            if witness is not None:
                witness.feed(batches.file_positions, batches.last_offsets, batches.max_timestamps)
            _process_chunk(run, path, batches, state)
        out.close_items()
        for p in scan_problems:
            out.problem(p)
    if end.trailing:
        out.line(f"Found {end.trailing} invalid bytes at the end of {os.path.basename(path)}")
    if witness is not None:
        _report_index_verification(run, witness, index_paths, active)
    out.end_file(
        sizeInBytes=size,
        validBytes=end.valid_bytes,
        trailingBytes=end.trailing,
        batchCount=state.batches,
        recordCount=state.records,
    )


def _load_siblings(
    run: _Run, path: str, name: _Name, base: int, active: bool
) -> tuple[_IndexWitness | None, dict[str, str]]:
    """The segment's ``.index`` and ``.timeindex`` (when present), ready to be verified
    against the batches of the log as it is scanned."""
    index = time_index = None
    paths = {}
    for ext in (".index", ".timeindex"):
        p = _sibling(path, name, ext)
        if not os.path.isfile(p):
            if ext == ".index" and not name.temp_suffix:
                run.out.note(
                    f"no {os.path.basename(p)} next to this segment (a broker rebuilds a missing offset index)"
                )
            continue
        try:
            if ext == ".index":
                index, _ = _load_index(OffsetIndex, p, base, active=active)
            else:
                time_index, _ = _load_index(TimeIndex, p, base, active=active)
        except OSError as e:
            run.out.problem(Problem(p, f"cannot read the file: {e.strerror or e}"))
            continue
        paths[ext] = p
    if index is None and time_index is None:
        return None, paths
    return _IndexWitness(index, time_index), paths


def _report_index_verification(run: _Run, witness: _IndexWitness, index_paths: dict[str, str], active: bool) -> None:
    """Report what verifying the indexes against the log found: at once when only the log is
    dumped, else with the index file's own dump (the log comes first in a directory)."""
    out = run.out
    for ext, p in index_paths.items():
        index: OffsetIndex | TimeIndex | None
        if ext == ".index":
            index = witness.index
            messages = witness.offset_problems()
        else:
            index = witness.time_index
            messages = witness.time_problems(closed=not active)
        assert index is not None
        located = _index_problems(messages, p, index.ENTRY_SIZE, index.offsets, len(index))
        if run.dir_mode:
            run.pending[p] = located
            continue
        for problem in _check_index_alone(index, p, order=False) + located:
            out.problem(problem)
        if not located:
            out.note(f"{os.path.basename(p)} verified against this log: ok")


def _verify_index_standalone(
    run: _Run, path: str, name: _Name, index: OffsetIndex | TimeIndex, base: int, active: bool
) -> list[Problem] | None:
    """Verify one index file against its ``.log`` (when the index is dumped without its log
    having been verified in this run). None when there is no log to verify against."""
    log_path = _sibling(path, name, ".log")
    if not os.path.isfile(log_path):
        return None
    is_offset = isinstance(index, OffsetIndex)
    witness = _IndexWitness(index if is_offset else None, None if is_offset else index)
    log_problems: list[Problem] = []
    with open(log_path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        chunks = _scan_log(f.fileno(), size, log_path, run.options.read_buffer_bytes, log_problems.append, _ScanEnd())
        for batches in chunks:
            witness.feed(batches.file_positions, batches.last_offsets, batches.max_timestamps)
    if log_problems:
        run.out.note(f"{log_path} has problems of its own (dump it); the index was checked against its readable part")
    messages = witness.offset_problems() if is_offset else witness.time_problems(closed=not active)
    problems = _index_problems(messages, path, index.ENTRY_SIZE, index.offsets, len(index))
    if not problems:
        run.out.note(f"verified against {os.path.basename(log_path)}: ok")
    return problems


def _dump_fixed_index(run: _Run, path: str, name: _Name) -> None:
    out = run.out
    is_offset = name.kind == "offset-index"
    cls: type[OffsetIndex] | type[TimeIndex] = OffsetIndex if is_offset else TimeIndex
    base = _base_offset(name.stem)
    out.begin_file(
        path, name.kind, head={"baseOffset": base}, items="entries", summary={"entryCount": 0, "active": False}
    )
    if base is None:
        out.problem(Problem(path, "the file name does not start with a base offset"))
        return
    active = run.is_active(path, name)
    index, notes = _load_index(cls, path, base, active=active)
    for text in notes:
        out.note(text)
    out.open_items()
    if len(index) == 0:
        out.line(f"{path} is empty.")
    if isinstance(index, OffsetIndex):
        for offset, position in zip(index.offsets.tolist(), index.positions.tolist(), strict=True):
            out.item({"offset": offset, "position": position}, f"offset: {offset} position: {position}")
    else:
        for timestamp, offset in zip(index.timestamps.tolist(), index.offsets.tolist(), strict=True):
            out.item({"timestamp": timestamp, "offset": offset}, f"timestamp: {timestamp} offset: {offset}")
    out.close_items()
    if path in run.pending:  # verified against its log earlier in this run
        cross: list[Problem] | None = run.pending.pop(path)
        if not cross:
            out.note(f"verified against {name.stem}.log{name.temp_suffix}: ok")
    elif run.options.verify:
        cross = _verify_index_standalone(run, path, name, index, base, active)
        if cross is None:
            out.note(f"no {name.stem}.log{name.temp_suffix} next to this index: not verified against a log")
    else:
        cross = None
    for p in _check_index_alone(index, path, order=cross is None) + (cross or []):
        out.problem(p)
    out.end_file(entryCount=len(index), active=active)


def _dump_txn_index(run: _Run, path: str, name: _Name) -> None:
    out = run.out
    base = _base_offset(name.stem)
    out.begin_file(
        path, name.kind, head={"baseOffset": base}, items="entries", summary={"entryCount": 0, "trailingBytes": 0}
    )
    if base is None:
        out.problem(Problem(path, "the file name does not start with a base offset"))
        return
    data = _read_small(path)
    index = TransactionIndex.from_bytes(data, base, path=path, strict=False)
    txns = index.all_aborted_txns()
    out.open_items()
    for t in txns:
        out.item(
            {
                "version": t.version,
                "producerId": t.producer_id,
                "firstOffset": t.first_offset,
                "lastOffset": t.last_offset,
                "lastStableOffset": t.last_stable_offset,
            },
            f"version: {t.version} producerId: {t.producer_id} firstOffset: {t.first_offset} "
            f"lastOffset: {t.last_offset} lastStableOffset: {t.last_stable_offset}",
        )
    out.close_items()
    partial = len(data) % TransactionIndex.ENTRY_SIZE
    if partial:
        out.note(f"{partial} trailing bytes after the last whole entry (ignored by a broker)")
    try:
        index.sanity_check()
    except CorruptIndexError as e:
        out.problem(Problem.of(e, path))
    if run.options.verify:
        previous = None
        for i, t in enumerate(txns):
            at = i * TransactionIndex.ENTRY_SIZE
            if t.first_offset > t.last_offset:
                out.problem(
                    Problem(
                        path, f"firstOffset {t.first_offset} is above lastOffset {t.last_offset}", at, t.last_offset
                    )
                )
            if previous is not None and t.last_offset <= previous:
                out.problem(
                    Problem(
                        path, f"lastOffset {t.last_offset} does not increase (previous {previous})", at, t.last_offset
                    )
                )
            previous = t.last_offset
    out.end_file(entryCount=len(txns), trailingBytes=partial)


def _decrement_sequence(sequence: int, decrement: int) -> int:
    """``DefaultRecordBatch.decrementSequence`` (int32 wrap), for a snapshot's firstSequence."""
    if sequence < decrement:
        return INT32_MAX - (decrement - sequence) + 1
    return sequence - decrement


def _dump_snapshot(run: _Run, path: str, name: _Name) -> None:
    out = run.out
    out.begin_file(
        path, name.kind, head={"offset": _base_offset(name.stem)}, items="entries", summary={"entryCount": 0}
    )
    entries = decode_snapshot(_read_small(path), path=path)
    out.open_items()
    for e in entries:
        txn_first = e.current_txn_first_offset if e.current_txn_first_offset >= 0 else None
        obj: dict[str, Any] = {
            "producerId": e.producer_id,
            "producerEpoch": e.producer_epoch,
            "coordinatorEpoch": e.coordinator_epoch,
            "currentTxnFirstOffset": txn_first,
            "lastTimestamp": e.timestamp,
            "firstSequence": None,
            "lastSequence": None,
            "lastOffset": None,
            "offsetDelta": None,
            "timestamp": None,
        }
        text = (
            f"producerId: {e.producer_id} producerEpoch: {e.producer_epoch} coordinatorEpoch: "
            f"{e.coordinator_epoch} currentTxnFirstOffset: {_optional_long(txn_first)} lastTimestamp: {e.timestamp}"
        )
        if e.last_offset >= 0:  # Kafka keeps batch metadata only for a real last offset
            first_seq = _decrement_sequence(e.last_sequence, e.offset_delta)
            obj.update(
                firstSequence=first_seq,
                lastSequence=e.last_sequence,
                lastOffset=e.last_offset,
                offsetDelta=e.offset_delta,
                timestamp=e.timestamp,
            )
            text += (
                f" firstSequence: {first_seq} lastSequence: {e.last_sequence} lastOffset: {e.last_offset} "
                f"offsetDelta: {e.offset_delta} timestamp: {e.timestamp}"
            )
        out.item(obj, text)
    out.close_items()
    out.end_file(entryCount=len(entries))


def _parse_offset_line(line: str) -> tuple[str, int, int] | None:
    parts = split_fields(line)
    if len(parts) != 3:
        return None
    return parts[0], parse_int32(parts[1], "partition"), parse_int64(parts[2], "offset")


def _dump_offset_checkpoint(run: _Run, path: str, name: _Name) -> None:
    out = run.out
    out.begin_file(path, name.kind, items="entries", summary={"version": None, "entryCount": 0})
    data = _read_small(path)
    entries = parse_checkpoint(data, version=0, parse_entry=_parse_offset_line, path=path)
    out.line("version: 0" if data else "(empty file: no entries)")
    out.open_items()
    for topic, partition, offset in entries:
        out.item(
            {"topic": topic, "partition": partition, "offset": offset},
            f"topic: {topic} partition: {partition} offset: {offset}",
        )
    out.close_items()
    out.end_file(version=0 if data else None, entryCount=len(entries))


def _dump_leader_epochs(run: _Run, path: str, name: _Name) -> None:
    out = run.out
    out.begin_file(path, name.kind, items="entries", summary={"version": None, "entryCount": 0})
    data = _read_small(path)
    entries = parse_leader_epoch_checkpoint(data, path=path)
    out.line("version: 0" if data else "(empty file: no entries)")
    out.open_items()
    for e in entries:
        out.item({"epoch": e.epoch, "startOffset": e.start_offset}, f"epoch: {e.epoch} startOffset: {e.start_offset}")
    out.close_items()
    out.end_file(version=0 if data else None, entryCount=len(entries))


def _dump_meta_properties(run: _Run, path: str, name: _Name) -> None:
    out = run.out
    out.begin_file(
        path,
        name.kind,
        summary={"version": None, "clusterId": None, "nodeId": None, "directoryId": None, "properties": None},
    )
    meta = parse_meta_properties(_read_small(path), path=path)
    out.line(" ".join(f"{k}: {v}" for k, v in meta.to_properties().items()))
    out.end_file(
        version=meta.version,
        clusterId=meta.cluster_id,
        nodeId=meta.node_id,
        directoryId=meta.directory_id,
        properties=dict(meta.properties),
    )


def _dump_partition_metadata(run: _Run, path: str, name: _Name) -> None:
    out = run.out
    out.begin_file(path, name.kind, summary={"version": None, "topicId": None})
    pm = parse_partition_metadata(_read_small(path), path=path)
    out.line(f"version: {pm.version} topic_id: {pm.topic_id}")
    out.end_file(version=pm.version, topicId=pm.topic_id)


def _dump_clean_shutdown(run: _Run, path: str, name: _Name) -> None:
    out = run.out
    out.begin_file(path, name.kind, summary={"brokerEpoch": None})
    marker = read_clean_shutdown(os.path.dirname(path) or ".")
    epoch = marker.broker_epoch if marker is not None else None
    out.line(f"clean shutdown marker, brokerEpoch: {epoch if epoch is not None else 'unknown (empty or unreadable)'}")
    out.end_file(brokerEpoch=epoch)


_HANDLERS: dict[str, Callable[[_Run, str, _Name], None]] = {
    "log": _dump_log,
    "kraft-snapshot": _dump_log,
    "offset-index": _dump_fixed_index,
    "time-index": _dump_fixed_index,
    "txn-index": _dump_txn_index,
    "producer-snapshot": _dump_snapshot,
    "offset-checkpoint": _dump_offset_checkpoint,
    "leader-epoch-checkpoint": _dump_leader_epochs,
    "meta-properties": _dump_meta_properties,
    "partition-metadata": _dump_partition_metadata,
    "clean-shutdown": _dump_clean_shutdown,
}


# ---------------------------------------------------------------------------------------
# The command


def _offset_range(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, int] | None:
    """``FROM:TO``, ``FROM:`` or ``:TO`` (inclusive) as a pair of offsets."""
    if value is None:
        return None
    low, sep, high = value.partition(":")
    try:
        if not sep:
            raise ValueError
        span = (int(low) if low else 0, int(high) if high else 2**63 - 1)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not FROM:TO (offsets, e.g. 100:200, 100: or :200)") from None
    if span[0] > span[1]:
        raise click.BadParameter(f"{value!r}: FROM is above TO")
    return span


@click.command("dump")
@click.argument("path", type=click.Path(exists=True, dir_okay=True, readable=True))
@click.option("--deep", is_flag=True, help="Also print every record of every batch.")
@click.option(
    "--verify",
    is_flag=True,
    help="Check everything: CRCs, every record, offsets, and each .index/.timeindex against its .log; "
    "list every problem on stderr and exit 1 if there is any.",
)
@click.option(
    "--summary",
    is_flag=True,
    help="With --verify: print no dump, only each damaged file's first problem and how many more it has, "
    "and the count of problems and files (on stderr).",
)
@click.option("--json", "as_json", is_flag=True, help="Write one JSON document (a list of file results) to stdout.")
@click.option(
    "--read-buffer-bytes",
    type=click.IntRange(min=RECORD_BATCH_OVERHEAD),
    default=DEFAULT_READ_BUFFER_BYTES,
    show_default=True,
    hidden=True,
    help="Bytes of a .log read at a time (grown only for a larger batch).",
)
@click.option(
    "--print-data-log",
    "print_data",
    is_flag=True,
    help="Also print each record's key and value (implies --deep), as kafka-dump-log.sh does.",
)
@click.option(
    "--decoder",
    type=click.Choice(sorted(DECODERS)),
    default="utf8",
    show_default=True,
    help="How --print-data-log shows keys and values.",
)
@click.option(
    "--offsets",
    "offset_range",
    callback=_offset_range,
    default=None,
    metavar="FROM:TO",
    help="Print only the batches and records with offsets in [FROM, TO] (either side may be left out).",
)
@filter_options
def dump(
    path: str,
    deep: bool,
    verify: bool,
    summary: bool,
    as_json: bool,
    read_buffer_bytes: int,
    print_data: bool,
    decoder: str,
    offset_range: tuple[int, int] | None,
    topic: str | None,
    partitions: tuple[int, ...],
) -> None:
    """Print the contents of a Kafka log file, partition directory or log dir (like kafka-dump-log.sh).

    PATH may be a .log, .index, .timeindex, .txnindex or .snapshot file (also with a .deleted,
    .cleaned or .swap suffix), a checkpoint, meta.properties or partition.metadata, or a
    directory, whose recognised files are dumped in sorted order. Files are only read.

    Problems go to stderr, one per line (path: byte N, offset M: reason). Exit status: 0 when
    no problem was found, 1 when any was (a bad CRC or an unreadable file also without
    --verify), 2 for usage errors.
    """
    if summary and (not verify or as_json):
        raise click.UsageError("--summary goes with --verify (and not --json, which lists every problem)")
    try:
        status = run_dump(
            path,
            deep=deep,
            verify=verify,
            as_json=as_json,
            read_buffer_bytes=read_buffer_bytes,
            only=partition_filter(topic, partitions),
            decoder=decoder if print_data else None,
            offsets=offset_range,
            summary=summary,
        )
    except BrokenPipeError:
        # `dump ... | head`: stop quietly, and keep Python from complaining at exit.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        sys.exit(1)
    sys.exit(status)
