"""One cleaning round of one log (Kafka's ``Cleaner``, KAFKA_NOTES §9).

1. Build the offset map over the cleanable section [first dirty, first uncleanable),
   skipping aborted transactions; the round ends at the map's latest offset + 1 (less
   than the first uncleanable offset when the map fills up, §9.2).
2. Group every segment below that end offset (the clean tail too, §5) and rewrite each
   group into one ``.cleaned`` segment, batch by batch: batch retention (§9.6: aborted
   data, the last batch of each active producer, the last batch of the round), record
   retention (§9.5: latest value per key, tombstones until their delete horizon), the
   transaction-marker lifecycle (§9.7) and the exact re-encoding rules (§9.8: verbatim
   copy when nothing changes).
3. Swap the group in with the crash-safe protocol (§9.10) and report the end offset,
   which the manager writes to ``cleaner-offset-checkpoint``.

The work is columnar: a read chunk's records are decoded as columns, their keys hashed
and looked up in the map at once, and batches that keep every record are copied as
contiguous byte runs. Python loops over batches only where Kafka's rules are sequential
(the transaction state machine, batches that must be re-encoded).

Decisions where Kafka's behaviour left a choice, each safe in the direction of keeping
data:

- Legacy (v0/v1) batches are rewritten as v2, as Kafka 4.0 does (KAFKA-13093).
"""

from __future__ import annotations

import bisect
import copy
import logging
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from cleaner.clock import Time
from cleaner.errors import (
    CorruptDataError,
    CorruptRecordError,
    LogCleaningAbortedError,
    LogSegmentOffsetOverflowError,
    SwapIncompleteError,
    truncated_batch,
)
from cleaner.records.batch import INT32_MAX, LOG_OVERHEAD, TimestampType
from cleaner.records.builder import build_batch, build_empty_batch, rebuild_batches
from cleaner.records.columns import RecordColumns, decode_records
from cleaner.records.record import Record
from cleaner.records.scan import Batches, scan_batches
from cleaner.storage import page_cache
from cleaner.storage.index import AbortedTxn
from cleaner.storage.log import Log, cleaned_segment
from cleaner.storage.producer_state import ActiveProducer
from cleaner.storage.segment import LogSegment
from cleaner.storage.topic_partition import TopicPartition

from .grouping import group_segments_by_size
from .offset_map import OffsetMap, digest_keys
from .stats import CleanerStats
from .throttler import Throttler
from .transaction_summary import Summaries, compose
from .transactions import CleanedTransactionMetadata, control_types, run_transactions

log = logging.getLogger("cleaner.engine.cleaner")

MIN_READ_CHUNK = 4 << 20
"""Columnar decoding pays a fixed cost per chunk, so reads are at least this large even
when ``ioBufferSize / threads / 2`` is smaller (Kafka's default gives 256 KiB). Memory
stays bounded by configuration: one such buffer per thread. Kafka's growth rules
(``growBuffersOrFail``) still apply to batches larger than the buffer."""


Commit = Callable[[LogSegment, list[LogSegment], int], None]


class OffsetLookup(Protocol):
    """What the rewrite asks of an offset map: the round's latest offset and the mapped
    offset of each key (-1 if absent). ``OffsetMap`` in one process; a keep-list built by
    a distributed aggregation in the Spark job."""

    @property
    def latest_offset(self) -> int: ...

    def get_many(self, digests: np.ndarray) -> np.ndarray: ...

    def is_latest_many(self, offsets: np.ndarray) -> np.ndarray:
        """For records the map has seen (first dirty offset .. latest offset): whether
        each offset is its key's mapped offset (saves hashing those keys again)."""
        ...


@dataclass
class LogToClean:
    """A log chosen for cleaning and what the manager computed about it (§6.5)."""

    log: Log
    topic_partition: TopicPartition
    first_dirty_offset: int
    first_uncleanable_offset: int
    needs_compaction_now: bool = False
    clean_bytes: int = 0
    cleanable_bytes: int = 0
    delete_retention_ms: int = 86_400_000
    active_producers: dict[int, ActiveProducer] = field(default_factory=dict)
    hold_removals: str | None = None
    """Why no tombstone or transaction marker may be removed in this round, or None: a replica
    of the partition is out of sync, and would never receive what is removed above its log
    end (the compaction-replication race, docs/replica-divergence.md). Horizons are still
    stamped; only their passing is not acted on."""

    @property
    def total_bytes(self) -> int:
        return self.clean_bytes + self.cleanable_bytes

    @property
    def cleanable_ratio(self) -> float:
        return self.cleanable_bytes / self.total_bytes if self.total_bytes else 0.0


@dataclass
class Round:
    """What every group of a round shares."""

    ltc: LogToClean
    now: int
    end_offset: int
    legacy_delete_horizon_ms: int
    generation: int
    lookup: OffsetLookup
    stats: CleanerStats
    commit: Commit | None = None
    cleaned_dir: Path | None = None
    """Where ``.cleaned`` segments are written (default: the partition directory)."""

    @property
    def removal_now(self) -> int:
        """The time tombstones' and markers' delete horizons are judged against: ``now``, or a
        time before every horizon while the round holds removals (``LogToClean.hold_removals``)."""
        return self.now if self.ltc.hold_removals is None else -(2**63)

    def retains_legacy_deletes(self, segment_last_modified_ms: int) -> bool:
        """Whether v0/v1 tombstones of a segment are kept: its mtime is past the legacy horizon
        (§9.5), or the round holds removals."""
        return self.ltc.hold_removals is not None or segment_last_modified_ms > self.legacy_delete_horizon_ms


def legacy_delete_horizon(ltc: LogToClean) -> int:
    """The mtime-based horizon for v0/v1 tombstones (§9.5): the clean tail's last segment's
    mtime minus ``delete.retention.ms``, or 0 without a clean tail."""
    tail = [s for s in ltc.log.segments if s.base_offset < ltc.first_dirty_offset]
    return tail[-1].last_modified_ms - ltc.delete_retention_ms if tail else 0


def plan_groups(ltc: LogToClean, end_offset: int) -> list[list[LogSegment]]:
    """The segment groups a round ending at ``end_offset`` rewrites (§9.3)."""
    the_log = ltc.log
    segments = [s for s in the_log.segments if s.base_offset < end_offset]
    return group_segments_by_size(
        segments, the_log.config.segment_bytes, the_log.config.segment_index_bytes, ltc.first_uncleanable_offset
    )


class Cleaner:
    """The cleaning logic of one cleaner thread, with its own offset map and I/O buffers."""

    def __init__(
        self,
        cleaner_id: int,
        offset_map: OffsetMap,
        io_buffer_size: int,
        max_io_buffer_size: int,
        throttler: Throttler,
        time: Time,
        check_done: Callable[[TopicPartition], None] = lambda tp: None,
    ) -> None:
        self.id = cleaner_id
        self.offset_map = offset_map
        self.io_buffer_size = max(io_buffer_size, MIN_READ_CHUNK)
        self.max_io_buffer_size = max_io_buffer_size
        self.read_capacity = self.io_buffer_size
        self.throttler = throttler
        self.time = time
        self.check_done = check_done

    # -- the round --------------------------------------------------------------------------
    def clean(
        self, ltc: LogToClean, commit: Commit | None = None, *, cleaned_dir: Path | None = None
    ) -> tuple[int, CleanerStats]:
        return self.do_clean(ltc, self.time.milliseconds(), commit, cleaned_dir=cleaned_dir)

    def do_clean(
        self, ltc: LogToClean, now: int, commit: Commit | None = None, *, cleaned_dir: Path | None = None
    ) -> tuple[int, CleanerStats]:
        """One round. ``commit(cleaned, group, generation)`` puts each group's cleaned
        segment in place; by default the log's crash-safe swap (the sidecar's stage mode
        instead keeps the cleaned segments, written into ``cleaned_dir``, a directory the
        broker never reads, for a commit while the broker is stopped)."""
        the_log = ltc.log
        stats = CleanerStats(self.time)
        if ltc.first_dirty_offset >= ltc.first_uncleanable_offset:
            stats.index_done()
            stats.all_done()
            return ltc.first_dirty_offset, stats
        generation = the_log.generation
        log.info("Cleaner %d: Beginning cleaning of log %s", self.id, the_log.name)
        if ltc.hold_removals is not None:
            log.info(
                "Cleaner %d: keeping every tombstone and transaction marker of %s: %s",
                self.id,
                the_log.name,
                ltc.hold_removals,
            )
        legacy_delete_horizon_ms = legacy_delete_horizon(ltc)
        log.info("Cleaner %d: Building offset map for %s...", self.id, the_log.name)
        try:
            with page_cache.one_read_per_round():  # the rewrite reads what the map build read
                self.build_offset_map(ltc, stats)
                end_offset = self.offset_map.latest_offset + 1
                stats.index_done()
                rnd = Round(ltc, now, end_offset, legacy_delete_horizon_ms, generation, self.offset_map, stats, commit,
                            cleaned_dir)  # fmt: skip
                transactions = CleanedTransactionMetadata()
                for group in plan_groups(ltc, end_offset):
                    self.clean_segments(rnd, group, transactions)
        except (OSError, CorruptDataError) as e:
            # A truncation or retention under the clean (segments deleted, files cut short)
            # shows up as a failed read; it aborts the round, it does not make the partition
            # uncleanable (Kafka pauses cleaning around those, we notice them afterwards).
            if the_log.generation != generation:
                raise LogCleaningAbortedError(f"{the_log.name} changed during the clean ({e})") from e
            raise
        stats.buffer_utilization = self.offset_map.utilization
        stats.all_done()
        return end_offset, stats

    def dirty_segments(
        self, ltc: LogToClean, summaries: Summaries | None = None
    ) -> list[tuple[LogSegment, int, CleanedTransactionMetadata]]:
        """For the map-building phase run in parallel (the Spark job): each dirty segment,
        the base offset of the next one (or the first uncleanable offset), and the
        transaction state at its start as the sequential map build would have it: replayed
        from headers only (``LogSegment.transaction_batches``), or composed from the
        segments' ``summaries`` where given (``transaction_summary``: the Spark driver's
        tasks read them where the segments are).

        The sequential build holds every aborted transaction of the dirty section from the
        start; a batch of a segment consumes only those that begin at or before its last
        offset, below the next segment's base. So each segment's state gets the aborted
        transactions that begin before its end just before it is copied: the same decisions,
        and the states together hold each transaction about once, not once per segment
        (a plan of segments x aborted transactions, as it was, grows quadratically)."""
        start, end = ltc.first_dirty_offset, ltc.first_uncleanable_offset
        the_log = ltc.log
        dirty = the_log.segments_between(start, end)
        next_starts = [s.base_offset for s in dirty[1:]] + [end]
        state = CleanedTransactionMetadata()
        aborted = sorted(the_log.collect_aborted_transactions(start, end), key=lambda t: t.first_offset)
        added = 0
        out = []
        for segment, next_start in zip(dirty, next_starts, strict=True):
            reachable = bisect.bisect_left(aborted, next_start, lo=added, key=lambda t: t.first_offset)
            state.add_aborted_transactions(aborted[added:reachable])
            added = reachable
            out.append((segment, next_start, copy.deepcopy(state)))
            self._carry(state, [], the_log, segment, segment.lookup_position(start), summaries)
        return out

    def segment_keys(
        self, ltc: LogToClean, segment: LogSegment, transactions: CleanedTransactionMetadata
    ) -> tuple[np.ndarray, np.ndarray]:
        """(digests, offsets), in log order, of every key of ``segment`` the map building
        would put (keyed records at or after the first dirty offset, outside aborted
        transactions and control batches), given the transaction state at its start."""
        start = ltc.first_dirty_offset
        position = segment.lookup_position(start)
        digests: list[np.ndarray] = []
        offsets: list[np.ndarray] = []
        for chunk in self._chunks(segment, position, ltc.log.config.max_message_bytes):
            aborted = run_transactions(chunk, control_types(chunk), transactions)
            keys = _keyed_records(chunk, ~(aborted | chunk.is_control), start)
            digests.append(keys.digests)
            offsets.append(keys.offsets)
        if not offsets:
            return np.zeros((0, 16), dtype=np.uint8), np.zeros(0, dtype=np.int64)
        return np.concatenate(digests), np.concatenate(offsets)

    def transaction_states(
        self, ltc: LogToClean, groups: list[list[LogSegment]], summaries: Summaries | None = None
    ) -> list[CleanedTransactionMetadata]:
        """The transaction state at the start of each group, as the sequential rewrite
        would have it, from headers only or ``summaries`` (as ``dirty_segments``): lets groups
        be rewritten independently (the Spark job) with exactly the decisions of one
        sequential round."""
        the_log = ltc.log
        state = CleanedTransactionMetadata()
        out = []
        for group in groups:
            out.append(copy.deepcopy(state))
            for i, segment in enumerate(group):
                upper = group[i + 1].base_offset if i + 1 < len(group) else segment.read_next_offset()
                added = the_log.collect_aborted_transactions(segment.base_offset, upper)
                self._carry(state, added, the_log, segment, 0, summaries)
        return out

    def _carry(self, state: CleanedTransactionMetadata, added: list[AbortedTxn], the_log: Log,
               segment: LogSegment, position: int, summaries: Summaries | None) -> None:
        """``state`` carried over ``segment`` from ``position``, ``added`` the aborted
        transactions the sequential replay adds before it: by its summary where one was
        given and fits, else by replaying its headers here."""
        if summaries is not None:
            summary = summaries.get((segment.base_offset, position))
            if summary is not None and compose(state, added, summary):
                return
            why = ("no summary was made of it" if summary is None
                   else "its summary does not fit the aborted transactions of the .txnindex files")
            log.warning("%s: segment %d from position %d: %s; replaying its headers here",
                        the_log.dir, segment.base_offset, position, why)
        state.add_aborted_transactions(added)
        for chunk in segment.transaction_batches(position, self.throttler.maybe_throttle):
            run_transactions(chunk, control_types(chunk), state)

    # -- reading with Kafka's buffer rules ---------------------------------------------------
    def _chunks(self, segment: LogSegment, position: int, max_message_bytes: int) -> Iterator[Batches]:
        """The segment's complete batches from ``position``, one read buffer at a time.

        A buffer holding no complete batch grows per ``growBuffersOrFail`` (to the topic's
        max.message.bytes, then to the next batch's size - a batch larger than the topic
        limit is legal, KAFKA-6834 - and a batch running past the end of the segment is
        corruption); after the segment the buffers shrink back (``restoreBuffers``).
        """
        path = str(segment.log_path)
        try:
            while position < segment.size:
                buf = segment.read(position, self.read_capacity)
                result = scan_batches(buf, base_position=position, path=path)
                if len(result.batches) == 0:
                    self._grow_buffers_or_fail(segment, position, max_message_bytes, result.next_entry_size)
                    continue
                self.throttler.maybe_throttle(result.end)
                yield result.batches
                position += result.end
        finally:
            self.read_capacity = self.io_buffer_size

    def _grow_buffers_or_fail(
        self, segment: LogSegment, position: int, max_message_bytes: int, next_size: int | None
    ) -> None:
        where = f"log segment {segment.log_path} at position {position}"
        if self.read_capacity >= max_message_bytes:
            left = segment.size - position
            if next_size is None and left < LOG_OVERHEAD:  # not even a whole length field is left
                raise truncated_batch(segment.log_path, position, None, left)
            if next_size is None:
                raise CorruptRecordError(
                    f"could not determine the next batch size for {where}", path=segment.log_path, position=position
                )
            if next_size > left:  # checked first: a batch cut short by the end of the file
                raise truncated_batch(segment.log_path, position, next_size, left)
            if next_size <= self.read_capacity:
                raise CorruptRecordError(
                    f"batch of {next_size} bytes fits the buffer but was not read, {where}",
                    path=segment.log_path,
                    position=position,
                )
            target = next_size
        else:
            target = max_message_bytes
        limit = max(target, self.max_io_buffer_size)
        if self.read_capacity >= limit:
            raise CorruptRecordError(
                f"this log contains a message larger than the maximum allowable size of {limit}",
                path=segment.log_path,
                position=position,
            )
        new_size = min(self.read_capacity * 2, limit)
        log.info(
            "Cleaner %d: Growing cleaner I/O buffers from %d bytes to %d bytes.", self.id, self.read_capacity, new_size
        )
        self.read_capacity = new_size

    # -- phase 1: the offset map ------------------------------------------------------------
    def build_offset_map(self, ltc: LogToClean, stats: CleanerStats) -> None:
        start, end = ltc.first_dirty_offset, ltc.first_uncleanable_offset
        the_log = ltc.log
        dirty = the_log.segments_between(start, end)
        # No offset of the dirty segments reaches the next segment's base: a round of fewer
        # offsets than the map holds keys uses only the table they can fill.
        following = the_log.next_segment(dirty[-1]) if dirty else None
        self.offset_map.clear(start, following.base_offset if following is not None else None)
        next_starts = [s.base_offset for s in dirty[1:]] + [end]
        transactions = CleanedTransactionMetadata()
        transactions.add_aborted_transactions(the_log.collect_aborted_transactions(start, end))
        for segment, next_start in zip(dirty, next_starts, strict=True):
            self.check_done(ltc.topic_partition)
            if self._map_segment(ltc, segment, start, next_start, transactions, stats):
                log.debug(
                    "Cleaner %d: offset map is full; segment %d is partially mapped", self.id, segment.base_offset
                )
                return

    def _map_segment(
        self,
        ltc: LogToClean,
        segment: LogSegment,
        start: int,
        next_start: int,
        transactions: CleanedTransactionMetadata,
        stats: CleanerStats,
    ) -> bool:
        position = segment.lookup_position(start)
        max_message_bytes = ltc.log.config.max_message_bytes
        for chunk in self._chunks(segment, position, max_message_bytes):
            self.check_done(ltc.topic_partition)
            stats.map_bytes_read += int(chunk.sizes.sum())
            if self._map_chunk(chunk, start, transactions, stats):
                return True
        self.offset_map.update_latest_offset(next_start - 1)  # offset gaps (KAFKA-8764)
        return False

    def _map_chunk(
        self, chunk: Batches, start: int, transactions: CleanedTransactionMetadata, stats: CleanerStats
    ) -> bool:
        """Put the chunk's keys in the map in record order; True if the map filled up.

        Kafka's loop puts each key and, after each batch, sets the map's latest offset to
        the batch's last offset; when the map is full it stops at that key. So the latest
        offset ends as the largest of the puts and completed batches before the stop.
        """
        aborted = run_transactions(chunk, control_types(chunk), transactions)
        skipped = aborted | chunk.is_control
        stats.map_messages_read += int(chunk.records_counts[skipped].sum())
        keys = _keyed_records(chunk, ~skipped, start)
        omap = self.offset_map
        lasts = chunk.last_offsets
        # A key beyond what this round's map can address (32-bit relative offsets) ends
        # the round before it, exactly as a full map does.
        addressable = int(np.searchsorted(keys.offsets, omap.offset_limit, side="right"))
        put = omap.put_many(keys.digests[:addressable], keys.offsets[:addressable]) if addressable else 0
        if put == len(keys.offsets):
            stats.map_messages_read += int(chunk.records_counts[~skipped].sum())
            relevant = lasts[lasts >= start]
            if relevant.size:
                omap.update_latest_offset(max(omap.latest_offset, int(relevant.max())))
            return False
        stop_offset = int(keys.offsets[put])
        stats.map_messages_read += put
        completed = lasts[(lasts < stop_offset) & (lasts >= start)]
        latest = [omap.latest_offset]
        if put:
            latest.append(int(keys.offsets[put - 1]))
        if completed.size:
            latest.append(int(completed.max()))
        omap.update_latest_offset(max(latest))
        return True

    # -- phase 2: rewriting ----------------------------------------------------------------
    def clean_segments(self, rnd: Round, group: list[LogSegment], transactions: CleanedTransactionMetadata) -> None:
        """Rewrite one group into one ``.cleaned`` segment and commit it."""
        ltc = rnd.ltc
        the_log = ltc.log
        source_bytes = sum(s.size for s in group)
        if rnd.cleaned_dir is None:
            cleaned = the_log.new_cleaned_segment(group[0].base_offset, source_bytes=source_bytes)
        else:
            cleaned = cleaned_segment(rnd.cleaned_dir, group[0].base_offset, the_log.config, source_bytes)
        transactions.cleaned_index = cleaned.txn_index
        try:
            for i, segment in enumerate(group):
                upper = group[i + 1].base_offset if i + 1 < len(group) else segment.read_next_offset()
                transactions.add_aborted_transactions(the_log.collect_aborted_transactions(segment.base_offset, upper))
                retain_legacy_deletes = rnd.retains_legacy_deletes(segment.last_modified_ms)
                log.info(
                    "Cleaner %d: Cleaning %s in log %s into %d, %s deletes.",
                    self.id,
                    segment,
                    the_log.name,
                    cleaned.base_offset,
                    "retaining" if retain_legacy_deletes else "discarding",
                )
                try:
                    mapped_from = _first_mapped_offset(segment, ltc.first_dirty_offset, upper)
                    self._clean_into(rnd, segment, cleaned, transactions, retain_legacy_deletes, mapped_from)
                except LogSegmentOffsetOverflowError:
                    # §9.9: a source segment whose own offsets overflow (written by an old
                    # broker) is split, and the round is retried on the split segments.
                    if segment.read_next_offset() - 1 - segment.base_offset <= INT32_MAX or rnd.commit is not None:
                        raise
                    log.info("Cleaner %d: splitting overflowed segment %s of %s", self.id, segment, the_log.name)
                    the_log.split_overflowed_segment(segment)
                    raise LogCleaningAbortedError(
                        f"{the_log.name}: split overflowed segment {segment.base_offset}"
                    ) from None
            cleaned.on_become_inactive()
            cleaned.flush()
            cleaned.set_last_modified(group[-1].last_modified_ms)
            self.check_done(ltc.topic_partition)
            log.info(
                "Cleaner %d: Swapping in cleaned segment %s for segment(s) %s in log %s"
                if rnd.commit is None  # else stage mode: kept aside, swapped in by a later commit
                else "Cleaner %d: Staging cleaned segment %s for segment(s) %s of log %s (not swapped in yet)",
                self.id,
                cleaned,
                [s.base_offset for s in group],
                the_log.name,
            )
            if rnd.commit is None:
                the_log.replace_segments([cleaned], group, expected_generation=rnd.generation)
            else:
                rnd.commit(cleaned, group, rnd.generation)
            rnd.stats.segments_written += 1
            rnd.stats.groups.append(len(group))
        except SwapIncompleteError:
            raise  # committed: the cleaned segment is the log now
        except BaseException:
            # An abort, a shutdown, a full disk before the commit point: nothing of this
            # group may stay behind.
            cleaned.discard_uncommitted()
            raise

    def _clean_into(
        self,
        rnd: Round,
        source: LogSegment,
        cleaned: LogSegment,
        transactions: CleanedTransactionMetadata,
        retain_legacy_deletes: bool,
        mapped_from: int,
    ) -> None:
        ltc = rnd.ltc
        for chunk in self._chunks(source, 0, ltc.log.config.max_message_bytes):
            self.check_done(ltc.topic_partition)
            output = self._filter_chunk(rnd, chunk, transactions, retain_legacy_deletes, mapped_from)
            rnd.stats.bytes_read += int(chunk.sizes.sum())
            if output:
                data = b"".join(output)
                result = scan_batches(data)
                cleaned.append(data, result.batches)
                rnd.stats.bytes_written += len(data)
                self.throttler.maybe_throttle(len(data))

    def _filter_chunk(
        self,
        rnd: Round,
        chunk: Batches,
        transactions: CleanedTransactionMetadata,
        retain_legacy_deletes: bool,
        mapped_from: int,
    ) -> list[bytes | memoryview]:
        """Kafka's ``MemoryRecords.filterTo`` with the cleaner's filter, for a whole chunk."""
        ltc, now, stats, lookup = rnd.ltc, rnd.now, rnd.stats, rnd.lookup
        n = len(chunk)
        v2_rows = np.flatnonzero(chunk.is_v2)
        columns = decode_records(chunk.select(v2_rows)) if v2_rows.size else None
        types = control_types(chunk, columns, v2_rows)
        can_discard = run_transactions(chunk, types, transactions)

        # Batch retention (checkBatchRetention).
        has_horizon = chunk.has_delete_horizon
        horizon = np.where(has_horizon, chunk.headers["base_timestamp"], -1)
        is_control = chunk.is_control
        discard_records = np.where(is_control, can_discard & has_horizon & (horizon <= rnd.removal_now), can_discard)
        last_of_producer = _is_last_of_active_producer(chunk, ltc.active_producers)
        next_offsets = chunk.next_offsets
        # Kafka keeps an emptied batch only for an active producer's last batch or at the
        # round's end (KAFKA-17076: the batch ending at the first uncleanable offset), so
        # that the next round's first dirty offset still has a batch to start from.
        retain_empty = last_of_producer | (next_offsets == ltc.first_uncleanable_offset)
        delete = ~retain_empty & discard_records
        marker_for_empty_txn = can_discard & is_control

        # Record retention (shouldRetainRecord) for every record of the v2 batches at once.
        kept_count = np.zeros(n, dtype=np.int64)
        tombstone_kept = np.zeros(n, dtype=bool)
        keep_rows = None
        if columns is not None and len(columns):
            row_batch = v2_rows[columns.batch]
            keep_rows, invalid = _retained_rows(
                lookup,
                mapped_from,
                columns,
                row_batch,
                is_control,
                chunk.is_transactional,
                has_horizon,
                horizon,
                rnd.removal_now,
            )
            keep_rows &= ~discard_records[row_batch]
            counted = ~delete[row_batch]
            stats.messages_read += int(counted.sum())
            stats.invalid_messages_read += int((invalid & counted).sum())
            kept_count = np.bincount(row_batch[keep_rows], minlength=n)
            tombstone_kept = np.bincount(row_batch[keep_rows & (columns.value_length < 0)], minlength=n) > 0
            stats.tombstones_removed += int((counted & ~keep_rows & columns.is_tombstone).sum())

        legacy_kept: dict[int, list[Record]] = {}
        for i, entry in chunk.legacy.items():
            if delete[i]:
                continue
            records = entry.records()
            stats.messages_read += len(records)
            kept = _retained_legacy(lookup, records, retain_legacy_deletes, stats)
            legacy_kept[i] = kept
            kept_count[i] = len(kept)
            tombstone_kept[i] = any(r.value is None for r in kept)

        records_count = chunk.records_counts
        need_horizon = (tombstone_kept | marker_for_empty_txn) & ~has_horizon
        verbatim = chunk.is_v2 & ~delete & (kept_count > 0) & (kept_count == records_count) & ~need_horizon

        rebuild = ~verbatim & ~delete & (kept_count > 0)
        rebuilt = self._rebuild(
            chunk,
            columns,
            v2_rows,
            keep_rows,
            legacy_kept,
            rebuild,
            need_horizon,
            has_horizon,
            horizon,
            now + ltc.delete_retention_ms,
        )
        stats.messages_written += int(kept_count[verbatim | rebuild].sum())

        # Output in source order: runs of verbatim batches as single slices of the buffer.
        output: list[bytes | memoryview] = []
        view = memoryview(chunk.buffer)
        positions = chunk.positions.tolist()
        sizes = chunk.sizes.tolist()
        run_start = run_end = -1
        for i in range(n):
            if verbatim[i]:
                if run_end == positions[i]:
                    run_end += sizes[i]
                else:
                    if run_start >= 0:
                        output.append(view[run_start:run_end])
                    run_start, run_end = positions[i], positions[i] + sizes[i]
                continue
            if run_start >= 0:
                output.append(view[run_start:run_end])
                run_start = run_end = -1
            if rebuild[i]:
                output.append(rebuilt[i])
            elif retain_empty[i] and not delete[i]:
                # Kafka 4.x throws for an empty legacy batch here; an empty v2 header with
                # the entry's offsets keeps the log end offset just as well.
                output.append(build_empty_batch(chunk.header(i)))
        if run_start >= 0:
            output.append(view[run_start:run_end])
        return output

    @staticmethod
    def _rebuild(
        chunk: Batches,
        columns: RecordColumns | None,
        v2_rows: np.ndarray,
        keep_rows: np.ndarray | None,
        legacy_kept: dict[int, list[Record]],
        rebuild: np.ndarray,
        need_horizon: np.ndarray,
        has_horizon: np.ndarray,
        horizon: np.ndarray,
        new_horizon: int,
    ) -> dict[int, bytes]:
        """Every batch of the chunk that loses records or gains a horizon, re-encoded:
        v2 batches all at once (``rebuild_batches``), legacy entries one by one."""
        out: dict[int, bytes] = {}
        horizons = np.where(need_horizon, new_horizon, np.where(has_horizon, horizon, -1))
        targets = np.flatnonzero(rebuild & chunk.is_v2)
        if targets.size:
            assert columns is not None and keep_rows is not None
            v2_index = np.searchsorted(v2_rows, targets)
            wanted = np.zeros(len(v2_rows), dtype=bool)
            wanted[v2_index] = True
            rows = np.flatnonzero(keep_rows & wanted[columns.batch])
            for i, batch in zip(
                targets.tolist(), rebuild_batches(columns, v2_index, rows, horizons[targets]), strict=True
            ):
                out[i] = batch
        for i, kept in legacy_kept.items():
            if rebuild[i]:
                out[i] = _legacy_as_v2(chunk, i, kept, new_horizon if need_horizon[i] else None)
        return out


def _retained_rows(
    lookup: OffsetLookup,
    mapped_from: int,
    columns: RecordColumns,
    row_batch: np.ndarray,
    is_control: np.ndarray,
    transactional: np.ndarray,
    has_horizon: np.ndarray,
    horizon: np.ndarray,
    now: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Which records survive (before batch-level discards), and which are invalid
    (keyless records the map covers, which Kafka drops and counts)."""
    offsets = columns.offsets
    past = offsets > lookup.latest_offset
    control_row = is_control[row_batch]
    keyed = columns.has_key
    rows = np.flatnonzero(~past & keyed & ~control_row)
    keep = past | control_row
    if rows.size:
        row_offsets = offsets[rows]
        is_latest = np.empty(rows.size, dtype=bool)
        # A keyed record of a non-transactional batch the map build read (from
        # ``mapped_from`` up to the latest offset) was certainly put in the map: it is the
        # latest for its key iff its offset is a map value, no hashing needed. Every other
        # record is looked up by key, as Kafka does (a key the map lacks is kept): the clean
        # tail's, transactional batches' (the map build may have skipped them as aborted
        # where the rewrite does not, §9.2), and any the map build never read.
        seen = (row_offsets >= mapped_from) & ~transactional[row_batch[rows]]
        if seen.any():
            is_latest[seen] = lookup.is_latest_many(row_offsets[seen])
        tail = np.flatnonzero(~seen)
        if tail.size:
            starts, ends = columns.key_spans(rows[tail])
            is_latest[tail] = row_offsets[tail] >= lookup.get_many(digest_keys(columns.data, starts, ends))
        b = row_batch[rows]
        keep_deletes = ~has_horizon[b] | (now < horizon[b])
        keep[rows] = is_latest & ((columns.value_length[rows] >= 0) | keep_deletes)
    invalid = ~past & ~keyed & ~control_row
    return keep, invalid


def _retained_legacy(
    lookup: OffsetLookup, records: list[Record], retain_legacy_deletes: bool, stats: CleanerStats
) -> list[Record]:
    omap = lookup
    kept = []
    keyed = [r for r in records if r.key is not None and r.offset <= omap.latest_offset]
    found = {}
    if keyed:
        looked_up = omap.get_many(_digests_of([r.key for r in keyed])).tolist()
        found = {r.offset: o for r, o in zip(keyed, looked_up, strict=True)}
    for r in records:
        if r.offset > omap.latest_offset:
            kept.append(r)
        elif r.key is None:
            stats.invalid_messages_read += 1
        elif r.offset >= found[r.offset] and (r.value is not None or retain_legacy_deletes):
            kept.append(r)
    return kept


# -- helpers that follow Kafka's per-batch rules ------------------------------------------


@dataclass
class _Keys:
    digests: np.ndarray
    offsets: np.ndarray


def _digests_of(keys: list[bytes]) -> np.ndarray:
    data = b"".join(keys)
    ends = np.cumsum([len(k) for k in keys]).tolist()
    starts = [e - len(k) for e, k in zip(ends, keys, strict=True)]
    return digest_keys(data, starts, ends)


def _keyed_records(chunk: Batches, usable: np.ndarray, start: int) -> _Keys:
    """Digests and offsets, in log order, of the keyed records at or after ``start`` in
    the usable batches (neither aborted nor control)."""
    parts: list[tuple[np.ndarray, np.ndarray]] = []
    v2_rows = np.flatnonzero(usable & chunk.is_v2)
    if v2_rows.size:
        columns = decode_records(chunk.select(v2_rows))
        rows = np.flatnonzero(columns.has_key & (columns.offsets >= start))
        starts, ends = columns.key_spans(rows)
        parts.append((digest_keys(columns.data, starts, ends), columns.offsets[rows]))
    for i in np.flatnonzero(usable & ~chunk.is_v2).tolist():
        recs = [r for r in chunk.legacy[i].records() if r.key is not None and r.offset >= start]
        if recs:
            parts.append((_digests_of([r.key for r in recs]), np.array([r.offset for r in recs], dtype=np.int64)))
    if not parts:
        return _Keys(np.zeros((0, 16), dtype=np.uint8), np.zeros(0, dtype=np.int64))
    offsets = np.concatenate([p[1] for p in parts])
    digests = np.concatenate([p[0] for p in parts])
    if len(parts) > 1:  # legacy entries mixed in: back to log order
        order = np.argsort(offsets, kind="stable")
        offsets, digests = offsets[order], digests[order]
    return _Keys(digests, offsets)


def _is_last_of_active_producer(chunk: Batches, active: dict[int, ActiveProducer]) -> np.ndarray:
    """RETAIN_EMPTY for the batch holding an active producer's last data offset, or - when
    its last entry was an epoch-bumping marker - every control batch of that epoch (§9.6)."""
    out = np.zeros(len(chunk), dtype=bool)
    if not active:
        return out
    pids = chunk.producer_ids
    candidates = np.flatnonzero(np.isin(pids, np.fromiter(active.keys(), dtype=np.int64)))
    lasts = chunk.last_offsets
    epochs = chunk.headers["producer_epoch"]
    is_control = chunk.is_control
    for i in candidates.tolist():
        producer = active[int(pids[i])]
        if producer.last_data_offset is not None:
            out[i] = int(lasts[i]) == producer.last_data_offset
        else:
            out[i] = bool(is_control[i]) and int(epochs[i]) == producer.producer_epoch
    return out


def _first_mapped_offset(segment: LogSegment, first_dirty: int, upper: int) -> int:
    """The first offset of ``segment`` (whose offsets end before ``upper``) the map build
    read: it starts at the offset index's position for the first dirty offset, as
    ``_map_segment`` does. Normally that batch holds the first dirty offset or precedes it;
    an index entry that points past it (a damaged or foreign index) leaves records the map
    never saw, which must not be judged by the map's values."""
    if upper <= first_dirty or segment.base_offset >= first_dirty:
        return first_dirty  # the clean tail (never mapped), or a segment read from its start
    position = segment.lookup_position(first_dirty)
    header = segment.read(position, 8) if position < segment.size else b""
    if len(header) < 8:
        return sys.maxsize  # nothing read: every record is looked up by key
    return max(first_dirty, int.from_bytes(header, "big", signed=True))


def _legacy_as_v2(chunk: Batches, i: int, kept: list[Record], horizon_ms: int | None) -> bytes:
    """A legacy entry's kept records as one v2 batch (Kafka 4.0, KAFKA-13093): same codec,
    NO_TIMESTAMP_TYPE becomes CreateTime, LogAppendTime keeps the wrapper's time, no
    producer fields, base offset = first kept record."""
    entry = chunk.legacy[i]
    timestamp_type = entry.timestamp_type
    log_append = timestamp_type == TimestampType.LOG_APPEND_TIME
    return build_batch(
        kept,
        compression=entry.compression,
        timestamp_type=TimestampType.LOG_APPEND_TIME if log_append else TimestampType.CREATE_TIME,
        delete_horizon_ms=horizon_ms,
        max_timestamp=entry.timestamp if log_append else None,
    )


__all__ = ["Cleaner", "LogCleaningAbortedError", "LogToClean"]
