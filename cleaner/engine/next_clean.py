"""What the next clean of a log would meet, estimated from one read of its records.

Kafka tells an operator that the offset map was too small only after the fact, as
"Buffer utilization: 90%" in a log line, and nothing tells what a clean would free.
Both answers come from the key digests of one read-only pass over the log:

- **Distinct keys of the dirty section**: a HyperLogLog (Flajolet et al., 2007; 2^12
  registers of the digest's low 64 bits, standard error 1.6%). From it, the passes the
  offset map needs (``ceil(keys / capacity)``) for Kafka's ``SkimpyOffsetMap`` and for
  this engine's map, and the ``log.cleaner.dedupe.buffer.size`` that makes it one pass.
- **Bytes the next round frees**: a coordinated sample of keys (every key whose digest
  falls below a threshold, the same threshold in both sections, so a sampled key is seen
  wherever it occurs). For each sampled key the round's effect is exact: in the dirty
  section every record but the key's latest goes; in the clean section every record of a
  key the dirty section holds again goes. The sum over the sample, divided by the
  sampling rate, estimates the whole. The threshold halves whenever the sample exceeds
  ``max_sampled_keys``, so memory is bounded by that setting, never by the log.

Record bytes are on-disk bytes: a record's share of its batch in proportion to its
uncompressed size. A batch that keeps a tombstone and has no delete horizon yet is
rewritten with one (KIP-534): its base timestamp becomes the horizon, so every record's
timestamp delta grows, and the estimate subtracts that growth (in full: those bytes barely
compress). Not modelled: tombstones
and markers passing their horizon, aborted transactions, and the batches Kafka keeps for
producer state (all small next to superseded values in a log that needs cleaning).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cleaner.records.columns import RecordColumns, decode_records
from cleaner.storage.log import Log

from .offset_map import digest_keys, kafka_offset_map_capacity, offset_map_capacity

HLL_PRECISION = 12
_M = 1 << HLL_PRECISION
_ALPHA = 0.7213 / (1 + 1.079 / _M)
MAX_SAMPLED_KEYS = 8192


class DistinctKeys:
    """A HyperLogLog of 64-bit key hashes."""

    def __init__(self) -> None:
        self.registers = np.zeros(_M, dtype=np.uint8)

    def add(self, hashes: np.ndarray) -> None:
        index = (hashes >> np.uint64(64 - HLL_PRECISION)).astype(np.intp)
        rest = hashes & np.uint64((1 << (64 - HLL_PRECISION)) - 1)
        rank = (64 - HLL_PRECISION) - _bit_length(rest) + 1
        np.maximum.at(self.registers, index, rank.astype(np.uint8))

    def estimate(self) -> float:
        raw = _ALPHA * _M * _M / float(np.sum(np.ldexp(1.0, -self.registers.astype(np.int64))))
        zeros = int(np.count_nonzero(self.registers == 0))
        if raw <= 2.5 * _M and zeros:
            return _M * math.log(_M / zeros)  # linear counting for small cardinalities
        return raw


def _bit_length(values: np.ndarray) -> np.ndarray:
    """Bit length of each uint64, exactly (float64 holds every 32-bit half exactly)."""
    high = (values >> np.uint64(32)).astype(np.float64)
    low = (values & np.uint64(0xFFFFFFFF)).astype(np.float64)
    return np.where(high > 0, 32 + np.frexp(high)[1], np.frexp(low)[1]).astype(np.int64)


@dataclass(frozen=True)
class NextCleanEstimate:
    dirty_records: int
    dirty_distinct_keys: int
    bytes_freed: int
    kafka_passes: int
    """Rounds Kafka's cleaner needs for the dirty section with this dedupe buffer."""
    passes: int
    """Rounds this engine needs (its map holds more keys in the same memory)."""
    one_pass_dedupe_buffer_size: int
    """The smallest ``log.cleaner.dedupe.buffer.size`` (all threads) that makes Kafka clean
    the dirty section in one pass."""
    sampled_keys: int
    sampling_rate: float


class _Sample:
    """Keys whose hash is below ``threshold``, with what a round would do to their bytes.

    Two unbiased estimates of the bytes a round frees come from the same sample, and the one
    that swings less on this log is trusted more (each weighted by the inverse of its variance,
    itself estimated from the sample):

    - *superseded*: each sampled key's superseded bytes, scaled by the sampling rate. Steady on
      logs of mostly distinct keys, but on a skewed (Zipf) log a few hot keys hold most of
      those bytes, and whether they fell in the sample moved the estimate by 25-30% once the
      sample had to halve, past 8,192 keys;
    - *kept*: every dirty record's bytes, counted exactly, less what stays of them (one latest
      record per key, sampled). A hot key weighs one record here, but on a log of distinct
      keys the small difference of two large numbers swings.

    The clean section, compacted before, holds at most one record per key: what a key the
    dirty section holds again had there goes in both."""

    def __init__(self, max_keys: int) -> None:
        self.max_keys = max_keys
        self.threshold = np.uint64(2**64 - 1)
        self.clean_bytes: dict[int, float] = {}
        self.dirty: dict[int, tuple[int, float, float]] = {}  # hash -> (latest offset, its bytes, all bytes)
        self.dirty_bytes = 0.0
        """Every dirty record's bytes, sampled or not."""

    def add(self, hashes: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, *, dirty: bool) -> None:
        if dirty:
            self.dirty_bytes += float(sizes.sum())
        take = hashes < self.threshold
        for h, offset, size in zip(hashes[take].tolist(), offsets[take].tolist(), sizes[take].tolist(), strict=True):
            if not dirty:
                self.clean_bytes[h] = self.clean_bytes.get(h, 0.0) + size
                continue
            latest, latest_size, total = self.dirty.get(h, (-1, 0.0, 0.0))
            if offset > latest:
                latest, latest_size = offset, size
            self.dirty[h] = (latest, latest_size, total + size)
        while len(self.clean_bytes) + len(self.dirty) > self.max_keys:
            self.threshold = np.uint64(int(self.threshold) >> 1)
            limit = int(self.threshold)
            self.clean_bytes = {h: b for h, b in self.clean_bytes.items() if h < limit}
            self.dirty = {h: v for h, v in self.dirty.items() if h < limit}

    @property
    def rate(self) -> float:
        return int(self.threshold) / 2**64 if int(self.threshold) < 2**64 - 1 else 1.0

    def bytes_freed(self) -> float:
        superseded = np.array([total - latest_size + self.clean_bytes.get(h, 0.0)
                               for h, (_, latest_size, total) in self.dirty.items()])
        kept = np.array([latest_size - self.clean_bytes.get(h, 0.0) for h, (_, latest_size, _) in self.dirty.items()])
        by_superseded = float(superseded.sum()) / self.rate
        by_kept = self.dirty_bytes - float(kept.sum()) / self.rate
        if self.rate >= 1.0 or not len(kept):
            return by_superseded  # every key seen: exact
        # Var(sum over a Bernoulli(r) sample / r) = (1 - r) / r * sum of squares, the sum
        # itself estimated from the sample (/ r again).
        var_superseded = float(np.square(superseded).sum())
        var_kept = float(np.square(kept).sum())
        if var_superseded == 0.0 or var_kept == 0.0:
            return by_superseded if var_superseded <= var_kept else by_kept
        w_superseded, w_kept = 1.0 / var_superseded, 1.0 / var_kept
        return (w_superseded * by_superseded + w_kept * by_kept) / (w_superseded + w_kept)


def estimate_next_clean(
    the_log: Log,
    first_dirty_offset: int,
    first_uncleanable_offset: int,
    *,
    dedupe_buffer_per_thread: int,
    load_factor: float = 0.9,
    threads: int = 1,
    now_ms: int,
    delete_retention_ms: int,
    max_sampled_keys: int = MAX_SAMPLED_KEYS,
    throttle: Callable[[int], None] | None = None,
) -> NextCleanEstimate:
    """Read ``the_log`` below ``first_uncleanable_offset`` once, without changing it.
    ``throttle`` is called with the bytes of each chunk read (``maxIoBytesPerSecond``)."""
    distinct = DistinctKeys()
    sample = _Sample(max_sampled_keys)
    dirty_records = 0
    growth = 0.0
    for batches in the_log.iter_batches(the_log.log_start_offset):
        if throttle is not None:
            throttle(batches.total_bytes)
        keep = (batches.base_offsets < first_uncleanable_offset) & ~batches.is_control & batches.is_v2
        if not keep.any():
            if int(batches.base_offsets.min()) >= first_uncleanable_offset:
                break
            continue
        chosen = batches.select(keep)
        cols = decode_records(chosen)
        rows = np.flatnonzero(cols.has_key & (cols.offsets < first_uncleanable_offset))
        if len(rows) == 0:
            continue
        starts, ends = cols.key_spans(rows)
        digests = digest_keys(cols.data, starts, ends)
        hashes = np.ascontiguousarray(digests[:, 8:16]).view(">u8").ravel().astype(np.uint64)
        offsets = cols.offsets[rows]
        share = _on_disk_share(cols)
        sizes = ((cols.end - cols.start) * share)[rows]
        growth += _horizon_growth(cols, now_ms + delete_retention_ms)
        dirty = offsets >= first_dirty_offset
        if dirty.any():
            distinct.add(hashes[dirty])
            dirty_records += int(np.count_nonzero(dirty))
            sample.add(hashes[dirty], offsets[dirty], sizes[dirty], dirty=True)
        if not dirty.all():
            sample.add(hashes[~dirty], offsets[~dirty], sizes[~dirty], dirty=False)
    keys = round(distinct.estimate()) if dirty_records else 0
    keys = min(keys, dirty_records)
    kafka_capacity = max(kafka_offset_map_capacity(dedupe_buffer_per_thread, load_factor), 1)
    capacity = max(offset_map_capacity(dedupe_buffer_per_thread, load_factor), 1)
    return NextCleanEstimate(
        dirty_records=dirty_records,
        dirty_distinct_keys=keys,
        bytes_freed=max(round(sample.bytes_freed() - growth), 0),
        kafka_passes=math.ceil(keys / kafka_capacity),
        passes=math.ceil(keys / capacity),
        one_pass_dedupe_buffer_size=math.ceil(keys / load_factor) * 24 * threads,
        sampled_keys=len(sample.dirty) + len(sample.clean_bytes),
        sampling_rate=sample.rate,
    )


class NextCleanCache:
    """Estimates kept per partition while the section they describe is unchanged: the
    sidecar rescans every interval, but the cleanable section changes only when a segment
    rolls, a clean runs or retention deletes a segment."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[object, tuple[tuple, NextCleanEstimate]] = {}

    def get(self, key: object, shape: tuple) -> NextCleanEstimate | None:
        with self._lock:
            entry = self._entries.get(key)
        return entry[1] if entry is not None and entry[0] == shape else None

    def put(self, key: object, shape: tuple, estimate: NextCleanEstimate) -> None:
        with self._lock:
            self._entries[key] = (shape, estimate)

    def retain(self, keys: set[object]) -> None:
        """Forget partitions that are gone (memory follows the partitions on disk)."""
        with self._lock:
            self._entries = {k: v for k, v in self._entries.items() if k in keys}


def section_shape(the_log: Log, first_dirty_offset: int, first_uncleanable_offset: int) -> tuple:
    """What an estimate depends on: the section's bounds and its segments' identities."""
    segments = tuple(
        (s.base_offset, s.size, s.last_modified_ms)
        for s in the_log.segments
        if s.base_offset < first_uncleanable_offset
    )
    return (the_log.log_start_offset, first_dirty_offset, first_uncleanable_offset, segments)


def _on_disk_share(cols: RecordColumns) -> np.ndarray:
    """Per record: on-disk bytes per uncompressed byte of its batch (1 when uncompressed,
    less in a compressed batch)."""
    record_sizes = (cols.end - cols.start).astype(np.float64)
    per_batch = np.bincount(cols.batch, weights=record_sizes, minlength=len(cols.batches))
    batch_sizes = cols.batches.sizes.astype(np.float64)
    share = np.divide(batch_sizes, per_batch, out=np.ones_like(batch_sizes), where=per_batch > 0)
    return share[cols.batch]


def _horizon_growth(cols: RecordColumns, horizon_ms: int) -> float:
    """On-disk bytes that setting a delete horizon adds to the batches that will get one.

    Counted in full even in compressed batches: the added bytes are the high-order bytes of
    timestamp deltas that now span the distance to the horizon, and they differ from record
    to record, so the codec shrinks them far less than the batch's average (scaling them by
    the batch's compression ratio underestimated the growth by ~15% on an lz4 log whose
    batches nearly all hold a tombstone)."""
    batches = cols.batches
    gets_horizon = np.zeros(len(batches), dtype=bool)
    gets_horizon[cols.batch[cols.is_tombstone]] = True
    gets_horizon &= ~batches.has_delete_horizon
    rows = np.flatnonzero(gets_horizon[cols.batch])
    if len(rows) == 0:
        return 0.0
    old = cols.timestamp_delta[rows].astype(np.int64)
    new = cols.timestamps[rows].astype(np.int64) - np.int64(horizon_ms)
    return float(np.sum(_varint_size(new) - _varint_size(old)))


def _varint_size(values: np.ndarray) -> np.ndarray:
    zigzag = ((values << np.int64(1)) ^ (values >> np.int64(63))).astype(np.uint64)
    return np.maximum((_bit_length(zigzag) + 6) // 7, 1)
