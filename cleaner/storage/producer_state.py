"""Producer state: the ``.snapshot`` file format and the replay that rebuilds a broker's
in-memory producer map (KAFKA_NOTES §3.3, §9.6, §14 step 3).

Kafka sources: ``ProducerStateManager.java`` (snapshot schema, ``readSnapshot``,
``writeSnapshot``, ``truncateAndReload``, ``loadFromSnapshot``, ``isProducerExpired``,
``removeStraySnapshots``, ``firstUnstableOffset``, ``completeTxn``), ``ProducerAppendInfo.java``
(``append``, ``appendDataBatch``, ``appendEndTxnMarker``), ``ProducerStateEntry.java``
(``addBatch``, ``maybeUpdateProducerEpoch``, ``update``; 5 batches kept), and
``LogLoader.rebuildProducerState`` / ``loadProducersFromRecords`` (replay with origin
REPLICATION: no epoch, sequence or coordinator-epoch validation).

Snapshot layout (all big-endian)::

    int16 version = 1 | uint32 crc (CRC-32C over bytes [6, end)) | int32 count
    count x { int64 producerId, int16 epoch, int32 lastSequence, int64 lastOffset,
              int32 offsetDelta, int64 timestamp, int32 coordinatorEpoch,
              int64 currentTxnFirstOffset }                                  (46 bytes)

The manager needs no record decoding: the caller passes each batch's header and, for a
control batch with a record, the marker's type, coordinator epoch and record timestamp.
"""

from __future__ import annotations

import os
import re
import struct
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from cleaner import _native
from cleaner.errors import CorruptDataError, CorruptSnapshotError
from cleaner.records.batch import BatchHeader
from cleaner.records.control import ControlRecordType
from cleaner.storage import files

PathLike = str | os.PathLike[str]

PRODUCER_SNAPSHOT_VERSION = 1
SNAPSHOT_SUFFIX = ".snapshot"
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000  # producer.id.expiration.ms
NUM_BATCHES_TO_RETAIN = 5  # ProducerStateEntry.NUM_BATCHES_TO_RETAIN
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_TIMESTAMP = -1

_HEADER = struct.Struct(">hIi")  # version, crc, entry count
_ENTRY = struct.Struct(">qhiqiqiq")
_CRC_START = 6
assert _ENTRY.size == 46

_SNAPSHOT_NAME = re.compile(r"(?P<offset>[0-9]+)\.snapshot")


class InvalidTxnStateError(CorruptDataError):
    """A non-transactional batch from a producer with an open transaction
    (Kafka: InvalidTxnStateException, which also stops a broker's replay)."""


# ---------------------------------------------------------------------------------------
# The .snapshot file


@dataclass(frozen=True, slots=True)
class ProducerSnapshotEntry:
    """One producer in a snapshot. ``last_offset`` is -1 when the producer has no batch
    metadata (its last entry was a marker that changed the epoch); ``current_txn_first_offset``
    is -1 when no transaction is open."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_offset: int
    offset_delta: int
    timestamp: int
    coordinator_epoch: int
    current_txn_first_offset: int

    def pack(self) -> bytes:
        return _ENTRY.pack(
            self.producer_id,
            self.producer_epoch,
            self.last_sequence,
            self.last_offset,
            self.offset_delta,
            self.timestamp,
            self.coordinator_epoch,
            self.current_txn_first_offset,
        )


def encode_snapshot(entries: Iterable[ProducerSnapshotEntry]) -> bytes:
    """The bytes of a snapshot holding ``entries``, in the order given."""
    body = bytearray(_HEADER.pack(PRODUCER_SNAPSHOT_VERSION, 0, 0))
    count = 0
    for entry in entries:
        body += entry.pack()
        count += 1
    struct.pack_into(">i", body, _CRC_START, count)
    struct.pack_into(">I", body, 2, _native.crc32c(body[_CRC_START:]))
    return bytes(body)


def decode_snapshot(
    data: bytes | bytearray | memoryview, *, path: PathLike | None = None
) -> list[ProducerSnapshotEntry]:
    """Decode a snapshot the way ``readSnapshot`` does: the schema first (a truncated header,
    a negative count or fewer bytes than ``count`` entries need is a schema error), then the
    version, then the CRC. Bytes after the last entry are covered by the CRC and otherwise
    ignored, as in Kafka. Every failure is a CorruptSnapshotError."""
    buf = bytes(data)

    def corrupt(reason: str, position: int | None = None) -> CorruptSnapshotError:
        return CorruptSnapshotError(reason, path=path, position=position)

    if len(buf) < _HEADER.size:
        raise corrupt(
            f"Snapshot failed schema validation: {len(buf)} bytes, shorter than the {_HEADER.size}-byte header", 0
        )
    version, crc, count = _HEADER.unpack_from(buf)
    if count < 0:
        raise corrupt(f"Snapshot failed schema validation: array size {count} cannot be negative", _CRC_START)
    if count * _ENTRY.size > len(buf) - _HEADER.size:
        raise corrupt(
            f"Snapshot failed schema validation: {count} entries need {count * _ENTRY.size} bytes, "
            f"{len(buf) - _HEADER.size} remain (truncated?)",
            _HEADER.size,
        )
    if version != PRODUCER_SNAPSHOT_VERSION:
        raise corrupt(f"Snapshot contained an unknown file version {version}", 0)
    computed = _native.crc32c(memoryview(buf)[_CRC_START:])
    if crc != computed:
        raise corrupt(f"Snapshot is corrupt (CRC is no longer valid). Stored crc: {crc}. Computed crc: {computed}", 2)
    return [ProducerSnapshotEntry(*_ENTRY.unpack_from(buf, _HEADER.size + i * _ENTRY.size)) for i in range(count)]


def read_snapshot(path: PathLike) -> list[ProducerSnapshotEntry]:
    with open(path, "rb") as f:
        return decode_snapshot(f.read(), path=path)


def write_snapshot(path: PathLike, entries: Iterable[ProducerSnapshotEntry], *, fsync: bool = True) -> None:
    """Write a snapshot in place and fsync it, as Kafka does (CREATE+WRITE, ``force``; no tmp file:
    a torn snapshot fails its CRC and the broker falls back to an older one)."""
    files.write_file(path, encode_snapshot(entries), fsync=fsync)


def snapshot_file_name(offset: int) -> str:
    """``<20-digit offset>.snapshot``."""
    return f"{offset:020d}{SNAPSHOT_SUFFIX}"


def list_snapshots(partition_dir: PathLike) -> list[tuple[int, str]]:
    """``(offset, path)`` of the regular ``*.snapshot`` files of a partition dir, by offset.

    ``.snapshot.deleted`` files and names whose prefix is not a number are not snapshots."""
    found: list[tuple[int, str]] = []
    with os.scandir(partition_dir) as it:
        for e in it:
            m = _SNAPSHOT_NAME.fullmatch(e.name)
            if m and e.is_file(follow_symlinks=False):
                found.append((int(m["offset"]), e.path))
    found.sort()
    return found


# ---------------------------------------------------------------------------------------
# In-memory state


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    last_seq: int
    last_offset: int
    offset_delta: int
    timestamp: int

    @property
    def first_offset(self) -> int:
        return self.last_offset - self.offset_delta


@dataclass(slots=True)
class ProducerStateEntry:
    """A producer's state (``ProducerStateEntry.java``); the last 5 data batches are kept."""

    producer_id: int
    producer_epoch: int = NO_PRODUCER_EPOCH
    coordinator_epoch: int = -1
    last_timestamp: int = NO_TIMESTAMP
    current_txn_first_offset: int | None = None
    batch_metadata: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=NUM_BATCHES_TO_RETAIN))

    @property
    def is_empty(self) -> bool:
        return not self.batch_metadata

    @property
    def last_seq(self) -> int:
        return self.batch_metadata[-1].last_seq if self.batch_metadata else NO_SEQUENCE

    @property
    def last_data_offset(self) -> int:
        return self.batch_metadata[-1].last_offset if self.batch_metadata else -1

    @property
    def last_offset_delta(self) -> int:
        return self.batch_metadata[-1].offset_delta if self.batch_metadata else 0

    def maybe_update_producer_epoch(self, epoch: int) -> bool:
        """A new epoch clears the batch metadata."""
        if self.producer_epoch != epoch:
            self.batch_metadata.clear()
            self.producer_epoch = epoch
            return True
        return False

    def add_batch(self, epoch: int, last_seq: int, last_offset: int, offset_delta: int, timestamp: int) -> None:
        self.maybe_update_producer_epoch(epoch)
        self.batch_metadata.append(BatchMetadata(last_seq, last_offset, offset_delta, timestamp))
        self.last_timestamp = timestamp

    def to_snapshot_entry(self) -> ProducerSnapshotEntry:
        """What ``writeSnapshot`` stores for this producer."""
        return ProducerSnapshotEntry(
            self.producer_id,
            self.producer_epoch,
            self.last_seq,
            self.last_data_offset,
            self.last_offset_delta,
            self.last_timestamp,
            self.coordinator_epoch,
            -1 if self.current_txn_first_offset is None else self.current_txn_first_offset,
        )

    @classmethod
    def from_snapshot_entry(cls, e: ProducerSnapshotEntry) -> ProducerStateEntry:
        entry = cls(
            e.producer_id,
            e.producer_epoch,
            e.coordinator_epoch,
            e.timestamp,
            e.current_txn_first_offset if e.current_txn_first_offset >= 0 else None,
        )
        if e.last_offset >= 0:
            entry.batch_metadata.append(BatchMetadata(e.last_sequence, e.last_offset, e.offset_delta, e.timestamp))
        return entry


@dataclass(frozen=True, slots=True)
class ActiveProducer:
    """What the cleaner needs of an active producer (Kafka's ``LastRecord``, §9.6)."""

    last_data_offset: int | None
    producer_epoch: int


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction ended by a marker at ``last_offset``. ``last_stable_offset`` is what a
    broker appending this marker would put in the txn index (``lastStableOffset``): the first
    offset of the earliest transaction of another producer still open, else ``last_offset + 1``."""

    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool
    last_stable_offset: int


@dataclass(frozen=True, slots=True)
class SkippedSnapshot:
    path: str
    offset: int
    error: CorruptSnapshotError


class ProducerStateManager:
    """The producer map a broker holds for a partition, rebuilt offline.

    Typical use (§14 step 3)::

        psm = ProducerStateManager.load(pdir, log_start_offset=lso, log_end_offset=leo,
                                        now_ms=time.milliseconds(),
                                        segment_base_offsets=bases, had_clean_shutdown=clean)
        if psm.replay_needed:
            for header, marker in batches_from(psm.map_end_offset):   # up to the LEO
                psm.update(header, ...)
        psm.update_map_end_offset(leo)
        psm.active_producers(); psm.first_unstable_offset(high_watermark)
    """

    def __init__(
        self, *, producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS, map_end_offset: int = 0
    ) -> None:
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self.map_end_offset = map_end_offset
        self.snapshot_offset: int | None = None
        self.skipped_snapshots: list[SkippedSnapshot] = []
        self.replay_needed = True
        self._producers: dict[int, ProducerStateEntry] = {}
        self._ongoing: dict[int, int] = {}  # first offset -> producer id (Kafka's ongoingTxns)
        self._unreplicated: dict[int, tuple[int, int]] = {}  # first offset -> (producer id, marker offset)

    # -- loading --------------------------------------------------------------------
    @classmethod
    def load(
        cls,
        partition_dir: PathLike,
        *,
        log_start_offset: int,
        log_end_offset: int,
        now_ms: int,
        producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
        segment_base_offsets: Iterable[int] | None = None,
        had_clean_shutdown: bool = False,
    ) -> ProducerStateManager:
        """Load the state a broker would start from, reading only (no snapshot is deleted).

        1. With ``segment_base_offsets``, snapshots ``removeStraySnapshots`` would delete are
           ignored: those not at a segment base, except the largest stray one if it is above
           the largest base.
        2. With ``had_clean_shutdown`` and no snapshot left, the broker skips the replay and
           starts with an empty map: ``replay_needed`` is then False and ``map_end_offset`` is
           the LEO.
        3. ``truncateAndReload``: only snapshots with ``log_start_offset < offset <=
           log_end_offset`` count; the newest that decodes is loaded, corrupt ones are
           skipped (``skipped_snapshots``; the broker deletes them); expired producers (no open
           transaction and ``now - timestamp >= producer_id_expiration_ms``) are dropped.
           ``map_end_offset`` is the snapshot's offset, or ``log_start_offset`` without one.
        The caller then replays every batch from ``map_end_offset`` up to the LEO.
        """
        psm = cls(producer_id_expiration_ms=producer_id_expiration_ms, map_end_offset=log_start_offset)
        snapshots = list_snapshots(partition_dir)
        if segment_base_offsets is not None:
            snapshots = _without_strays(snapshots, set(segment_base_offsets))
        if had_clean_shutdown and not snapshots:
            psm.replay_needed = False
            psm.map_end_offset = log_end_offset
            return psm
        usable = [(o, p) for o, p in snapshots if log_start_offset < o <= log_end_offset]
        for offset, path in reversed(usable):
            try:
                entries = read_snapshot(path)
            except CorruptSnapshotError as e:
                psm.skipped_snapshots.append(SkippedSnapshot(path, offset, e))
                continue
            psm.load_snapshot_entries(entries, snapshot_offset=offset, now_ms=now_ms)
            break
        return psm

    def load_snapshot_entries(
        self, entries: Iterable[ProducerSnapshotEntry], *, snapshot_offset: int, now_ms: int
    ) -> None:
        """Replace the state with a snapshot's unexpired entries (``loadFromSnapshot``)."""
        self._producers.clear()
        self._ongoing.clear()
        self._unreplicated.clear()
        for e in entries:
            entry = ProducerStateEntry.from_snapshot_entry(e)
            if self._is_expired(entry, now_ms):
                continue
            self._producers[entry.producer_id] = entry
            if entry.current_txn_first_offset is not None:
                self._ongoing[entry.current_txn_first_offset] = entry.producer_id
        self.snapshot_offset = snapshot_offset
        self.map_end_offset = snapshot_offset

    def _is_expired(self, entry: ProducerStateEntry, now_ms: int) -> bool:
        return (
            entry.current_txn_first_offset is None and now_ms - entry.last_timestamp >= self.producer_id_expiration_ms
        )

    def remove_expired_producers(self, now_ms: int) -> list[int]:
        """Drop expired producers (the broker's periodic ``removeExpiredProducers``); returns their ids.

        Not part of loading: producers seen in the replay stay until the broker's next
        expiration check, so the cleaner treats them as active (keeping extra headers is safe)."""
        gone = [pid for pid, e in self._producers.items() if self._is_expired(e, now_ms)]
        for pid in gone:
            del self._producers[pid]
        return gone

    # -- replay ---------------------------------------------------------------------
    def update(
        self,
        batch: BatchHeader,
        marker: ControlRecordType | None = None,
        coordinator_epoch: int | None = None,
        marker_timestamp: int | None = None,
    ) -> CompletedTxn | None:
        """Apply one batch (``ProducerAppendInfo.append`` with origin REPLICATION, then
        ``ProducerStateManager.update`` / ``completeTxn``). Returns the transaction a marker ends.

        - batches without a producer id (and legacy v0/v1 entries) change nothing;
        - batches wholly below ``map_end_offset`` are skipped, as the broker's replay reads a
          segment from the batch holding its start offset;
        - a control batch with no records (emptied by the cleaner) only registers the
          producer if it was unknown (an empty entry with epoch -1 and timestamp -1, as Kafka's
          ``update`` inserts the untouched entry);
        - a control batch with a record needs ``marker`` (ABORT or COMMIT),
          ``coordinator_epoch`` and ``marker_timestamp`` (the record's timestamp);
        - a data batch, including an empty one kept as a RETAIN_EMPTY header, is applied from
          its header fields: epoch change clears the metadata, (lastSequence, lastOffset,
          offsetDelta, maxTimestamp) is pushed, a transactional batch opens a transaction at
          its base offset if none is open.
        """
        if batch.magic < 2 or batch.producer_id <= NO_PRODUCER_ID:
            return None
        if batch.last_offset < self.map_end_offset:
            return None
        pid = batch.producer_id
        entry = self._producers.get(pid)
        if entry is None:
            entry = ProducerStateEntry(pid)
        completed: CompletedTxn | None = None
        if batch.is_control:
            if batch.records_count > 0:
                completed = self._apply_marker(entry, batch, marker, coordinator_epoch, marker_timestamp)
        else:
            self._apply_data(entry, batch)
        self._producers[pid] = entry
        self.map_end_offset = max(self.map_end_offset, batch.next_offset)
        return completed

    def _apply_data(self, entry: ProducerStateEntry, batch: BatchHeader) -> None:
        first_offset, last_offset = batch.base_offset, batch.last_offset
        if entry.current_txn_first_offset is not None and not batch.is_transactional:
            raise InvalidTxnStateError(
                f"Expected transactional write from producer {entry.producer_id} (transaction open since "
                f"offset {entry.current_txn_first_offset})",
                offset=first_offset,
            )
        entry.add_batch(
            batch.producer_epoch, batch.last_sequence, last_offset, last_offset - first_offset, batch.max_timestamp
        )
        if entry.current_txn_first_offset is None and batch.is_transactional:
            entry.current_txn_first_offset = first_offset
            self._ongoing[first_offset] = entry.producer_id

    def _apply_marker(
        self,
        entry: ProducerStateEntry,
        batch: BatchHeader,
        marker: ControlRecordType | None,
        coordinator_epoch: int | None,
        marker_timestamp: int | None,
    ) -> CompletedTxn | None:
        if marker not in (ControlRecordType.ABORT, ControlRecordType.COMMIT):
            # EndTransactionMarker.deserialize rejects any other control type.
            raise ValueError(
                f"control batch at offset {batch.base_offset} of producer {entry.producer_id} needs an "
                f"ABORT or COMMIT marker, got {marker!r}"
            )
        if coordinator_epoch is None or marker_timestamp is None:
            raise ValueError("a transaction marker needs its coordinator epoch and record timestamp")
        completed = None
        marker_offset = batch.base_offset
        first = entry.current_txn_first_offset
        # ProducerStateEntry.update(epoch, coordinatorEpoch, timestamp): new epoch clears the
        # metadata, the transaction is closed, the marker's timestamp becomes the last timestamp.
        entry.maybe_update_producer_epoch(batch.producer_epoch)
        entry.coordinator_epoch = coordinator_epoch
        entry.current_txn_first_offset = None
        entry.last_timestamp = marker_timestamp
        if first is not None:
            self._ongoing.pop(first, None)
            self._unreplicated[first] = (entry.producer_id, marker_offset)
            others = [o for o, p in self._ongoing.items() if p != entry.producer_id]
            lso = min(others) if others else marker_offset + 1
            completed = CompletedTxn(entry.producer_id, first, marker_offset, marker == ControlRecordType.ABORT, lso)
        return completed

    def update_map_end_offset(self, offset: int) -> None:
        self.map_end_offset = offset

    def on_log_start_offset_incremented(self, log_start_offset: int) -> None:
        """Retention moved the log start (``onLogStartOffsetIncremented``): completed
        transactions whose marker is now below it are forgotten; open ones stay, whatever
        their first offset (the first unstable offset is then the log start)."""
        self._unreplicated = {f: v for f, v in self._unreplicated.items() if v[1] >= log_start_offset}
        self.map_end_offset = max(self.map_end_offset, log_start_offset)

    # -- results --------------------------------------------------------------------
    @property
    def producers(self) -> Mapping[int, ProducerStateEntry]:
        return self._producers

    def active_producers(self) -> dict[int, ActiveProducer]:
        """``UnifiedLog.lastRecordsOfActiveProducers``: pid -> (last data offset or None, epoch)."""
        return {
            pid: ActiveProducer(e.last_data_offset if e.last_data_offset >= 0 else None, e.producer_epoch)
            for pid, e in self._producers.items()
        }

    @property
    def ongoing_transactions(self) -> dict[int, int]:
        """Open transactions as producer id -> first offset, by first offset."""
        return {pid: first for first, pid in sorted(self._ongoing.items())}

    def first_unstable_offset(self, high_watermark: int | None = None) -> int | None:
        """The smallest first offset of an open transaction (``firstUndecidedOffset``).

        With ``high_watermark``, Kafka's ``firstUnstableOffset``: transactions completed during
        the replay whose marker is at or above the high watermark still count (a broker drops
        them from ``unreplicatedTxns`` only once the HW passes the marker). LSO = min(this, HW).
        """
        candidates = list(self._ongoing)
        if high_watermark is not None:
            candidates += [first for first, (_, last) in self._unreplicated.items() if last >= high_watermark]
        return min(candidates) if candidates else None

    def lso_holder(self, high_watermark: int | None = None) -> tuple[int, int, int] | None:
        """(producer id, producer epoch, first offset) of the transaction that sets
        ``first_unstable_offset``: the one a person aborts with ``kafka-transactions.sh``."""
        first = self.first_unstable_offset(high_watermark)
        if first is None:
            return None
        pid = self._ongoing.get(first)
        if pid is None:
            pid = self._unreplicated[first][0]
        entry = self._producers.get(pid)
        return pid, entry.producer_epoch if entry is not None else -1, first

    def to_snapshot_entries(self) -> list[ProducerSnapshotEntry]:
        """The state as snapshot entries, by producer id (Kafka writes HashMap order; any order reads the same)."""
        return [self._producers[pid].to_snapshot_entry() for pid in sorted(self._producers)]

    def write_snapshot(self, partition_dir: PathLike, offset: int | None = None) -> str:
        """Write ``<offset>.snapshot`` (default: ``map_end_offset``) into ``partition_dir``; returns its path."""
        path = os.path.join(partition_dir, snapshot_file_name(self.map_end_offset if offset is None else offset))
        write_snapshot(path, self.to_snapshot_entries())
        return path


def _without_strays(snapshots: Sequence[tuple[int, str]], bases: set[int]) -> list[tuple[int, str]]:
    """What survives ``removeStraySnapshots``: snapshots at segment base offsets, plus the
    largest stray one when it is not below the largest base offset."""
    strays = [s for s in snapshots if s[0] not in bases]
    kept = [s for s in snapshots if s[0] in bases]
    if strays:
        largest = strays[-1]
        if not bases or largest[0] >= max(bases):
            kept.append(largest)
    return sorted(kept)
