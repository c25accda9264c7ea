"""A partition directory (Kafka's ``UnifiedLog``/``LocalLog``): its segments, appends and
rolls (for the data generator and tests), truncation, and the crash-safe segment swap
the cleaner commits with.

Opening a log writable first completes any interrupted swap the way a broker's start-up
would (``cleaner.storage.loader``). Opening it read-only changes nothing: the segments
are those the broker will see after its start-up.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cleaner.errors import CorruptRecordError, FileVanishedError, LogCleaningAbortedError, SwapIncompleteError
from cleaner.records.batch import INT32_MAX
from cleaner.records.columns import decode_records
from cleaner.records.control import ControlRecordType, EndTxnMarker
from cleaner.records.scan import Batches, scan_batches
from cleaner.storage import files
from cleaner.storage.index import AbortedTxn
from cleaner.storage.loader import apply_startup_plan, offset_of, regular_files, startup_plan_for
from cleaner.storage.producer_state import (
    DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    ProducerStateManager,
    snapshot_file_name,
)
from cleaner.storage.segment import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    LOG_SUFFIX,
    SWAP_SUFFIX,
    LogSegment,
)
from cleaner.storage.topic_partition import TopicPartition, parse_partition_dir


@dataclass(frozen=True)
class LogConfig:
    """The topic configs the storage layer needs (names as Kafka's, defaults as Kafka's)."""

    segment_bytes: int = 1073741824
    segment_index_bytes: int = 10485760
    index_interval_bytes: int = 4096
    max_message_bytes: int = 1048588


def cleaned_segment(
    directory: str | os.PathLike[str], base_offset: int, config: LogConfig, source_bytes: int = 0
) -> LogSegment:
    """A new ``.cleaned`` segment sized for a group of ``source_bytes`` (see
    ``Log.new_cleaned_segment``)."""
    most_entries = source_bytes // max(config.index_interval_bytes + 1, 61) + 2
    return LogSegment.create(
        directory,
        base_offset,
        suffix=CLEANED_SUFFIX,
        index_interval_bytes=config.index_interval_bytes,
        max_index_size=max(config.segment_index_bytes, most_entries * 12),
    )


class Log:
    def __init__(
        self,
        directory: str | os.PathLike[str],
        segments: Sequence[LogSegment],
        config: LogConfig,
        *,
        log_start_offset: int,
        read_only: bool,
        pending_startup: list[str] | None = None,
        may_stage: bool = False,
    ) -> None:
        self.dir = Path(directory)
        self.topic_partition: TopicPartition | None = parse_partition_dir(self.dir.name)
        self.config = config
        self._segments: list[LogSegment] = sorted(segments, key=lambda s: s.base_offset)
        self.log_start_offset = log_start_offset
        self.read_only = read_only
        self.pending_startup = pending_startup or []
        """In a read-only log: what the broker's start-up still has to do to the directory."""
        self.may_stage = may_stage
        self.needs_reopen = False
        """Set when a committed swap could not finish: the files on disk are right, this
        object's segment list may not be; ``Log.open`` again."""
        """A read-only log that may still get new ``.cleaned`` segments written next to
        it (the sidecar's stage mode): no existing file is ever changed."""
        self.generation = 0
        self.truncations = 0
        """Bumped wherever bytes already read may have changed (a truncation, or another
        process changing the segment list, seen by ``refresh``); not by this process's
        cleans and retention, which leave the producer state a broker keeps in memory as it is."""
        self.dir_identity: tuple[int, int] | None = None
        """The partition dir's (st_dev, st_ino) when it was opened (``Log.open``): which
        directory this object's segments are from (``moved``)."""
        self.lock = threading.RLock()
        self._log_end_offset: int | None = None
        self.roll_listeners: list[Callable[[Log, int], None]] = []

    # -- opening ------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        config: LogConfig | None = None,
        *,
        log_start_offset: int | None = None,
        read_only: bool = False,
        may_stage: bool = False,
    ) -> Log:
        """Open a partition directory. ``log_start_offset`` is the value from the log dir's
        ``log-start-offset-checkpoint``, if any (the result is the max of it and the first
        segment's base offset, as in Kafka)."""
        config = config or LogConfig()
        d = Path(directory)
        # Before the listing: a dir renamed away and another created at its path after
        # this stat leaves an identity that no longer matches (``moved``), never the
        # reverse (the new dir's identity on the old dir's segments).
        dir_st = os.stat(d)
        plan = startup_plan_for(d)
        on_disk = regular_files(d)
        if not read_only and not plan.is_empty:
            apply_startup_plan(d, plan)
            on_disk = regular_files(d)
        names = plan.resulting_names(on_disk) if read_only else set(on_disk)
        pending_swaps = {new: old for old, new in plan.rename} if read_only else {}
        segments = []
        for name in sorted(names):
            if not name.endswith(LOG_SUFFIX):
                continue
            base = offset_of(name)
            if base is None:
                continue
            suffix = SWAP_SUFFIX if name in pending_swaps else ""
            segment = LogSegment(
                d,
                base,
                suffix=suffix,
                index_interval_bytes=config.index_interval_bytes,
                max_index_size=config.segment_index_bytes,
            )
            segment.same_file()  # remember which file it is
            segments.append(segment)
        first_base = segments[0].base_offset if segments else 0
        start = max(log_start_offset if log_start_offset is not None else first_base, first_base)
        log = cls(
            d,
            segments,
            config,
            log_start_offset=start,
            read_only=read_only,
            pending_startup=plan.notes if read_only else [],
            may_stage=may_stage,
        )
        log.dir_identity = (dir_st.st_dev, dir_st.st_ino)
        if not segments and not read_only:
            log._segments.append(log._new_segment(start))
        return log

    @classmethod
    def create(cls, directory: str | os.PathLike[str], config: LogConfig | None = None, *, base_offset: int = 0) -> Log:
        """A new, empty partition directory."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        config = config or LogConfig()
        log = cls(d, [], config, log_start_offset=base_offset, read_only=False)
        st = os.stat(d)
        log.dir_identity = (st.st_dev, st.st_ino)
        log._segments.append(log._new_segment(base_offset))
        return log

    def split_overflowed_segment(self, segment: LogSegment) -> list[LogSegment]:
        """Kafka's ``splitOverflowedSegment`` (KAFKA-6264): rewrite a segment whose offsets
        do not all fit its 32-bit relative range (old brokers wrote such segments) as
        several segments, each starting at the first batch that no longer fits, and swap
        them in. Batches are copied unchanged."""
        self._check_writable()
        new: list[LogSegment] = []
        current: LogSegment | None = None
        for chunk in segment.iter_batches():
            for i in range(len(chunk)):
                base, last = int(chunk.base_offsets[i]), int(chunk.last_offsets[i])
                if current is None or last - current.base_offset > INT32_MAX:
                    current = self._new_segment(base, CLEANED_SUFFIX)
                    new.append(current)
                current.append(bytes(chunk.entry_bytes(i)))
        for seg in new:
            seg.on_become_inactive()
            seg.flush()
            seg.set_last_modified(segment.last_modified_ms)
        if new:
            self.replace_segments(new, [segment])
        return new

    def _new_segment(self, base_offset: int, suffix: str = "") -> LogSegment:
        segment = LogSegment.create(
            self.dir,
            base_offset,
            suffix=suffix,
            index_interval_bytes=self.config.index_interval_bytes,
            max_index_size=self.config.segment_index_bytes,
        )
        segment.lazy_time_index = not suffix
        return segment

    def new_cleaned_segment(self, base_offset: int, *, source_bytes: int = 0) -> LogSegment:
        """An empty ``<base>.log.cleaned`` (stale files of that name are replaced).

        Its indexes may hold more entries than ``segment.index.bytes`` when a group of
        ``source_bytes`` is merged (each merged segment can add one entry under the
        per-batch index rule); Kafka maps an existing index file at its own length."""
        if not self.may_stage:
            self._check_writable()
        return cleaned_segment(self.dir, base_offset, self.config, source_bytes)

    # -- shape --------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.dir.name

    @property
    def segments(self) -> list[LogSegment]:
        return list(self._segments)

    def moved(self) -> bool:
        """Whether the partition dir this log was opened from is no longer at ``dir``: gone
        (a topic deletion's rename to ``-delete``, a move's to ``-delete`` or ``-stray``),
        or another directory in its place (a topic created again, a partition moved back
        from another log dir: Kafka renames the ``-future`` dir into place). Segments,
        offsets and caches of this object then describe a directory that is not the
        partition any more: open it again from where it is now."""
        if self.dir_identity is None:
            return False
        try:
            st = os.stat(self.dir)
        except (FileNotFoundError, NotADirectoryError):
            return True
        return (st.st_dev, st.st_ino) != self.dir_identity

    @property
    def active_segment(self) -> LogSegment | None:
        return self._segments[-1] if self._segments else None

    @property
    def log_end_offset(self) -> int:
        if self._log_end_offset is None:
            active = self.active_segment
            self._log_end_offset = active.read_next_offset() if active is not None else self.log_start_offset
        return self._log_end_offset

    def refresh(self) -> None:
        """See what another process (a live broker) did since the last look: segments
        rolled, deleted by retention or swapped in, the active segment grown. Segment
        objects whose files did not change are kept with everything they cached (loaded
        indexes, the end-offset scan position), so an unchanged closed segment costs no
        reads. Only for read-only logs; a writable log is changed through this object."""
        if not self.read_only:
            self._log_end_offset = None
            for seg in self._segments:
                seg.refresh_size()
            return
        try:
            plan = startup_plan_for(self.dir)
            names = plan.resulting_names(regular_files(self.dir))
        except FileVanishedError:
            raise  # a .swap file read for its next offset
        except FileNotFoundError as e:
            raise FileVanishedError(self.dir, "the partition dir was renamed away or deleted") from e
        # Checked after the listing: a directory replaced before it was listed fails here, and
        # one replaced later was listed as it was. This object's offsets, producer state and
        # checkpoint belong to the directory it opened; a new one under the name (the topic
        # created again, the partition moved back) is a new log, for the caller to open.
        if self.moved():
            raise FileVanishedError(self.dir, "the partition dir was replaced (deleted and created again, or moved)")
        pending_swaps = {new: old for old, new in plan.rename}
        current = {(s.base_offset, s.suffix): s for s in self._segments}
        segments = []
        logs = [name for name in sorted(names) if name.endswith(LOG_SUFFIX) and offset_of(name) is not None]
        for i, name in enumerate(logs):
            base = offset_of(name)
            assert base is not None
            suffix = SWAP_SUFFIX if name in pending_swaps else ""
            seg = current.get((base, suffix))
            # The last segment is the one the broker appends to: it grows (module doc of
            # ``LogSegment.same_file``); any other is the same file only while unchanged.
            if seg is None or not seg.same_file(growing=i == len(logs) - 1):
                seg = LogSegment(
                    self.dir,
                    base,
                    suffix=suffix,
                    index_interval_bytes=self.config.index_interval_bytes,
                    max_index_size=self.config.segment_index_bytes,
                )
                seg.same_file()
            else:
                seg.refresh_size()
            segments.append(seg)
        if [s.base_offset for s in segments] != [s.base_offset for s in self._segments]:
            self.generation += 1
            self.truncations += 1
        self._segments = segments
        self.pending_startup = plan.notes
        if segments:
            self.log_start_offset = max(self.log_start_offset, segments[0].base_offset)
        self._log_end_offset = None

    @property
    def size_in_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    def floor_segment(self, offset: int) -> LogSegment | None:
        """The segment with the largest base offset <= ``offset``."""
        bases = [s.base_offset for s in self._segments]
        i = int(np.searchsorted(bases, offset, side="right")) - 1
        return self._segments[i] if i >= 0 else None

    def segments_between(self, start: int, end: int) -> list[LogSegment]:
        """Kafka's ``logSegments(from, to)``: segments that may hold offsets in [from, to),
        starting with the floor segment of ``from``."""
        floor = self.floor_segment(start)
        first = floor.base_offset if floor is not None else start
        return [s for s in self._segments if first <= s.base_offset < end]

    def next_segment(self, segment: LogSegment) -> LogSegment | None:
        for s in self._segments:
            if s.base_offset > segment.base_offset:
                return s
        return None

    # -- appending (generator, tests, the simulated broker) -------------------------------
    def append(self, data: bytes | bytearray | memoryview, batches: Batches | None = None) -> None:
        """Append batches whose offsets are already assigned (as a follower appends):
        offsets must continue from the log end offset. Rolls like Kafka: when the segment
        would exceed ``segment.bytes``, an index is full, or an offset would not fit the
        segment's relative range."""
        self._check_writable()
        if batches is None:
            result = scan_batches(data)
            if result.end != len(data):
                raise CorruptRecordError("append of a partial batch", position=result.end)
            batches = result.batches
        if len(batches) == 0:
            return
        with self.lock:
            first = int(batches.base_offsets[0])
            if first < self.log_end_offset:
                raise ValueError(
                    f"{self.name}: append at offset {first} below the log end offset {self.log_end_offset}"
                )
            active = self.active_segment
            assert active is not None
            largest = int(batches.last_offsets.max())
            if active.size > 0 and (
                active.size + len(data) > self.config.segment_bytes
                or active.offset_index.is_full
                or active.time_index.is_full
                or largest - active.base_offset > INT32_MAX
            ):
                self.roll(first)
                active = self.active_segment
                assert active is not None
            active.append(data, batches)
            self._log_end_offset = int(batches.next_offsets[-1])

    def roll(self, new_base_offset: int | None = None) -> LogSegment:
        """Close the active segment (final time-index entry, indexes trimmed and written,
        fsync) and start a new one at ``new_base_offset`` (default: the log end offset)."""
        self._check_writable()
        with self.lock:
            base = self.log_end_offset if new_base_offset is None else new_base_offset
            active = self.active_segment
            if active is not None:
                active.on_become_inactive()
                active.flush()
                active.close()
            new = self._new_segment(base)
            self._segments.append(new)
            for listener in self.roll_listeners:
                listener(self, base)
            return new

    def flush(self) -> None:
        active = self.active_segment
        if active is not None and not self.read_only:
            active.flush()

    def close(self) -> None:
        """Like a broker's shutdown: the active segment gets its final time-index entry
        (``LogSegment.close``), everything is flushed and closed."""
        active = self.active_segment
        if not self.read_only and active is not None:
            active.on_become_inactive()
            self.flush()
        for seg in self._segments:
            seg.close()

    # -- truncation and retention --------------------------------------------------------
    def truncate_to(self, offset: int) -> None:
        """Remove everything at or above ``offset`` (a follower truncating after a leader
        change). Bumps ``generation``: a clean that started before fails its swap."""
        self._check_writable()
        with self.lock:
            self.generation += 1
            self.truncations += 1
            if offset >= self.log_end_offset:
                return
            keep = [s for s in self._segments if s.base_offset < offset]
            gone = [s for s in self._segments if s.base_offset >= offset]
            for seg in gone:
                seg.delete_files()
            if keep:
                keep[-1].truncate_to(offset)
                self._segments = keep
            else:
                self._segments = [self._new_segment(offset)]
                self.log_start_offset = offset
            for snap_offset, path in self._snapshots():
                if snap_offset > offset:
                    files.remove(path)
            self._log_end_offset = None
            files.fsync_dir(self.dir)

    def delete_segments(self, segments: Sequence[LogSegment]) -> None:
        """Retention: remove whole segments from the start of the log and move the log
        start offset to the first remaining one (a new empty segment if none remains)."""
        self._check_writable()
        with self.lock:
            doomed = {s.base_offset for s in segments}
            remaining = [s for s in self._segments if s.base_offset not in doomed]
            if not remaining:
                remaining = [self._new_segment(self.log_end_offset)]
            for seg in self._segments:
                if seg.base_offset in doomed:
                    seg.change_suffix(DELETED_SUFFIX)
            self._segments = remaining
            self.log_start_offset = max(self.log_start_offset, remaining[0].base_offset)
            files.fsync_dir(self.dir)
            for seg in segments:
                seg.delete_files()
                files.remove(self.dir / snapshot_file_name(seg.base_offset))
            self.generation += 1

    # -- the cleaner's swap ---------------------------------------------------------------
    def replace_segments(
        self,
        new_segments: Sequence[LogSegment],
        old_segments: Sequence[LogSegment],
        *,
        expected_generation: int | None = None,
    ) -> None:
        """Swap cleaned segments in for ``old_segments`` (KAFKA_NOTES §9.10, §14 step 8).

        Order, each step a rename (never a copy):
        1. new segments ``.cleaned`` -> ``.swap``, in descending base offset; the rename of
           the last ``.cleaned`` file is the commit point (before it, start-up deletes the
           new files; after it, start-up deletes the old ones), then fsync the directory;
        2. old segments -> ``.deleted``; fsync the directory;
        3. new segments ``.swap`` -> final names, in ascending base offset; fsync the directory;

        Kafka fsyncs the directory once, at the end: that is enough on file systems that
        persist renames in order (ext4, XFS), not on those that may not (POSIX, btrfs). The
        fsyncs between segments in steps 1 and 3 and after step 2 make the protocol hold there too
        (the crash checker's "reordered" model, docs/testing.md); the order is Kafka's.
        4. delete the ``.deleted`` files and the producer snapshots at the bases of replaced
           segments (the broker would do both itself).

        If the log was truncated since the clean started (``expected_generation``), the
        new segments are deleted and ``LogCleaningAbortedError`` is raised: nothing changed.
        """
        self._check_writable()
        new = sorted(new_segments, key=lambda s: s.base_offset)
        with self.lock:
            if expected_generation is not None and expected_generation != self.generation:
                for seg in new:
                    seg.delete_files()
                raise LogCleaningAbortedError(
                    f"{self.name}: the log changed (truncation or retention) while it was being cleaned"
                )
            missing = [str(seg.log_path) for seg in new if not seg.log_path.exists()]
            if missing:
                raise LogCleaningAbortedError(f"{self.name}: cleaned segment files are missing: {', '.join(missing)}")
            current = {s.base_offset: s for s in self._segments}
            old = [s for s in sorted(old_segments, key=lambda s: s.base_offset) if current.get(s.base_offset) is s]
            try:
                for i, seg in enumerate(reversed(new)):
                    if i:
                        # A barrier: the higher segments' .swap names are durable before a
                        # lower one is renamed, so a file system that persists renames out
                        # of order never shows a lower set committed and a higher .cleaned.
                        files.fsync_dir(self.dir)
                    seg.change_suffix(SWAP_SUFFIX)
                files.fsync_dir(self.dir)
            except BaseException:
                # Not committed: as long as one file of the set is still ``.cleaned``, a
                # broker's start-up discards the whole set; undo what we can and remove it.
                for seg in new:
                    seg.discard_uncommitted()
                raise
            try:
                for seg in old:
                    seg.change_suffix(DELETED_SUFFIX)
                # A barrier: the old names are gone durably before a new segment takes its
                # final name; otherwise a crash could keep a new segment under its final
                # name next to an old one start-up no longer sees as replaced (duplicates).
                files.fsync_dir(self.dir)
                for i, seg in enumerate(new):
                    if i:
                        # A barrier: start-up merges every .swap left into one range and
                        # deletes what else lies in it, so a segment may only take its
                        # final name once every lower one has.
                        files.fsync_dir(self.dir)
                    seg.change_suffix("")
                old_bases = {s.base_offset for s in old}
                new_bases = {s.base_offset for s in new}
                self._segments = sorted(
                    [s for s in self._segments if s.base_offset not in old_bases] + new, key=lambda s: s.base_offset
                )
                files.fsync_dir(self.dir)
                for seg in old:
                    seg.delete_files()
                for base in sorted(old_bases - new_bases):
                    files.remove(self.dir / snapshot_file_name(base))
            except BaseException as e:
                # Committed: the new segments are the log now, whatever failed after the
                # commit point. Never delete them; this object's view may be stale, so it
                # must be opened again (which completes the swap as a broker would).
                self.needs_reopen = True
                raise SwapIncompleteError(
                    f"{self.name}: the swap was committed but did not finish ({type(e).__name__}: {e}); "
                    f"opening the log again completes it"
                ) from e

    # -- transactions and producers ------------------------------------------------------
    def collect_aborted_transactions(self, start: int, upper: int) -> list[AbortedTxn]:
        """Aborted transactions that may overlap [start, upper): Kafka's
        ``UnifiedLog.collectAbortedTransactions``, which searches the txn indexes from
        the segment holding ``start`` onwards for entries with ``lastOffset >=
        logStartOffset`` (sic: not ``start``) and ``firstOffset < upper``."""
        out: list[AbortedTxn] = []
        floor = self.floor_segment(start)
        if floor is None:
            return out
        for seg in self._segments:
            if seg.base_offset < floor.base_offset:
                continue
            found, complete = seg.txn_index.collect_aborted_txns(self.log_start_offset, upper)
            out.extend(found)
            if complete:
                break
        return out

    def load_producer_state(
        self,
        now_ms: int,
        *,
        producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
        had_clean_shutdown: bool = False,
        recovered_at_start: bool = False,
    ) -> ProducerStateManager:
        """The broker's producer state at the log end offset (KAFKA_NOTES §3.3, §14 step 3):
        newest usable snapshot, then every batch after it replayed from headers (and the
        marker record of control batches).

        ``recovered_at_start`` (a broker down after an unclean shutdown): the broker's
        start-up recovers at least the active segment, takes a producer snapshot at its end
        and loads the state back from it (``recoverSegment`` then ``truncateAndReload``), so
        what the replay gave goes through a snapshot too: producers expired at ``now_ms``
        are dropped and transactions completed above the high watermark are forgotten
        (a snapshot holds neither)."""
        leo = self.log_end_offset
        psm = ProducerStateManager.load(
            self.dir,
            log_start_offset=self.log_start_offset,
            log_end_offset=leo,
            now_ms=now_ms,
            producer_id_expiration_ms=producer_id_expiration_ms,
            segment_base_offsets=[s.base_offset for s in self._segments],
            had_clean_shutdown=had_clean_shutdown,
        )
        if psm.replay_needed:
            for batches in self.iter_batches(psm.map_end_offset):
                replay_batches(psm, batches)
        psm.update_map_end_offset(leo)
        if recovered_at_start and self._segments:
            psm.load_snapshot_entries(psm.to_snapshot_entries(), snapshot_offset=leo, now_ms=now_ms)
        return psm

    def iter_batches(self, start_offset: int = 0) -> Iterator[Batches]:
        """Every batch from the one holding ``start_offset`` on, a chunk at a time.

        In a live broker's log (read-only here) the active segment may end in the first
        bytes of a batch being written: a ``write`` crossing a page boundary grows the file
        a page at a time, and the size looked at can cut the batch. Kafka's readers stop at
        the log end offset; so does this one, and leave that batch to the next look."""
        first = self.floor_segment(start_offset)
        active = self.active_segment
        for seg in self._segments:
            if first is not None and seg.base_offset < first.base_offset:
                continue
            if seg is first:
                hint = seg.position_hint(start_offset)
                position = hint if hint is not None else seg.lookup_position(start_offset)
            else:
                position = 0
            for chunk in seg.iter_batches(position, allow_truncated_tail=self.read_only and seg is active):
                keep = chunk.last_offsets >= start_offset
                if not keep.all():
                    chunk = chunk.select(keep)
                if len(chunk):
                    yield chunk

    def _snapshots(self) -> list[tuple[int, Path]]:
        out = []
        for name in regular_files(self.dir):
            if name.endswith(".snapshot"):
                o = offset_of(name)
                if o is not None:
                    out.append((o, self.dir / name))
        return sorted(out)

    def _check_writable(self) -> None:
        if self.read_only:
            raise PermissionError(f"{self.dir}: opened read-only")

    def __repr__(self) -> str:
        return f"Log({self.dir}, segments={len(self._segments)}, logStartOffset={self.log_start_offset})"


def replay_batches(psm: ProducerStateManager, batches: Batches) -> None:
    """Feed one chunk of batches to the producer state (headers only, plus each control
    batch's marker record)."""
    has_pid = batches.producer_ids > -1
    if not has_pid.any():
        return
    markers: dict[int, tuple[ControlRecordType, int, int]] = {}
    control = np.flatnonzero(has_pid & batches.is_control & (batches.records_counts > 0))
    if control.size:
        subset = batches.select(control)
        columns = decode_records(subset)
        for row in range(len(columns)):
            b = int(columns.batch[row])
            kind = ControlRecordType.parse_key(columns.key(row))
            if kind in (ControlRecordType.ABORT, ControlRecordType.COMMIT):
                marker = EndTxnMarker.parse(kind, columns.value(row))
                markers[int(control[b])] = (kind, marker.coordinator_epoch, int(columns.timestamps[row]))
    for i in np.flatnonzero(has_pid).tolist():
        header = batches.header(i)
        kind, epoch, ts = markers.get(i, (None, None, None))
        psm.update(header, kind, epoch, ts)
