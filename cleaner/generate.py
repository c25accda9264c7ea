"""``kafka-cleaner generate``: a realistic Kafka broker log dir, for the demo, tests and
benchmarks of the cleaner.

What gets written is what a KRaft broker leaves behind after a clean shutdown (KAFKA_NOTES
§2-§4)::

    <data_dir>/
      meta.properties                     version=1, cluster.id, node.id=1, directory.id
      recovery-point-offset-checkpoint    every partition at its log end offset
      replication-offset-checkpoint       every partition at its log end offset (the HW)
      log-start-offset-checkpoint         no entries (log start = first segment base)
      .kafka_cleanshutdown                {"broker_epoch":"N","version":"0"}
      <topic>-<p>/
        <base>.log .index .timeindex      rolled by segment.bytes, Kafka's index rule
        <base>.txnindex                   in each segment that holds an ABORT marker
        <base>.snapshot                   producer state at every roll and at the LEO
        partition.metadata                the topic id
        leader-epoch-checkpoint           epoch 0 from offset 0

No ``cleaner-offset-checkpoint`` is written (absent = every partition dirty from its
start), and no ``.lock`` (a broker deletes it at shutdown).

The data is made for compaction: keys drawn from a Zipf-like law over ``keys`` distinct
keys per partition, tombstones (null values) only for keys already written, values of
varying size that compress like JSON, timestamps increasing with a little producer clock
jitter (CreateTime; every third topic is LogAppendTime), several producers: plain or
idempotent ones (producer id, epoch, sequence numbers), and transactional ones whose
transactions (at most two open at a time, so a transaction's last stable offset is
sometimes held back by another's) end in a COMMIT or, one time in ten, an ABORT marker.

Determinism: the same configuration gives byte-identical files. Segment files (``.log``,
``.index``, ``.timeindex``) get their segment's largest timestamp as mtime, which a broker
would not do (it leaves the time of the last write) but which keeps mtime-based retention
and legacy tombstone clocks reproducible; other files keep the time they were written.

Speed: records are encoded by ``cleaner.records.bulk`` about 1 MiB at a time (one numpy
pass per field); value bytes cost nothing per byte (they are a tiled JSON-like text, see
``bulk.encode_records``). Python runs once per batch (header, codec, CRC, producer state),
never once per record. Appends, rolls (with their fsyncs) and producer snapshots run on one
writer thread a few chunks behind the encoder, so disk waits overlap with encoding; the
order of everything written is fixed, so the thread changes no byte.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import click
import numpy as np

from cleaner.output import ByteProgress, binary_bytes
from cleaner.records.batch import TimestampType
from cleaner.records.builder import build_batch, build_control_batch
from cleaner.records.bulk import Spans, build_batches
from cleaner.records.compression import CompressionType, compress
from cleaner.records.control import ControlRecordType, EndTxnMarker
from cleaner.records.record import Record
from cleaner.records.scan import scan_batches
from cleaner.storage import files
from cleaner.storage.checkpoint import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
    format_checkpoint,
)
from cleaner.storage.index import AbortedTxn
from cleaner.storage.log import Log, LogConfig
from cleaner.storage.metadata import (
    CLEAN_SHUTDOWN_FILE,
    LEADER_EPOCH_CHECKPOINT,
    MetaProperties,
    encode_uuid,
    write_meta_properties,
    write_partition_metadata,
)
from cleaner.storage.producer_state import ProducerStateManager
from cleaner.storage.topic_partition import TopicPartition

__all__ = [
    "DEFAULT_NOW_MS",
    "GenerateSummary",
    "GeneratorConfig",
    "PartitionSummary",
    "estimate_log_bytes",
    "generate",
    "generate_command",
]

DEFAULT_NOW_MS = 1_700_000_000_000
HOUR_MS = 3_600_000
"""The clock when none is given: a fixed instant, so output never depends on when it ran."""

COMPRESSION_CHOICES = ("none", "gzip", "snappy", "lz4", "zstd", "mixed")
MIXED_CYCLE = ("none", "lz4", "zstd", "snappy", "gzip")
"""``--compression mixed``: topic t gets ``MIXED_CYCLE[t % 5]``."""

LOG_APPEND_TIME_EVERY = 3
"""Topic t uses LogAppendTime when ``t % 3 == 2`` (the others CreateTime)."""

IDEMPOTENT_PRODUCERS = 3  # per topic; each writes to every partition of its topic
TRANSACTIONAL_PRODUCERS = 3  # per topic
MAX_OPEN_TRANSACTIONS = 2  # per partition at any time
ABORT_RATIO = 0.1
MAX_BATCHES_PER_TRANSACTION = 4  # data batches a transaction writes to one partition
PARTITION_LEADER_EPOCH = 0
CLOCK_JITTER_MS = 25  # producers' clocks disagree a little: a batch's CreateTimes shift by up to this
APPEND_DELAY_MS = 5  # a batch reaches the broker up to this long after its last CreateTime
ENCODE_CHUNK_BYTES = 1 << 20  # records encoded per bulk call (keeps temporaries in cache)
PIPELINE_DEPTH = 8  # encoded chunks waiting for the writer thread
KEY_TABLE_MAX = 1 << 21  # up to this many keys are formatted once per partition, not per chunk
BACKGROUND_BYTES = 256 * 1024 + 37  # the JSON-like text that values are cut from
NODE_ID = 1
MAX_KEYS = 10_000_000  # per-partition key tables cost ~40 bytes per key
MAX_VALUE_BYTES = 512 * 1024  # 1.5 x this stays under Kafka's default max.message.bytes
MAX_BATCH_BYTES = 1_000_000  # Kafka's max.message.bytes default is 1048588
SEQUENCE_WRAP = 2**31  # a producer's sequence goes from Int.MAX back to 0
T = TypeVar("T")
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]+")
_MAX_TOPIC_NAME = 249

_SCHEMAS = ("orders", "payments", "users", "inventory", "sessions")
_KEY_PREFIX = {"orders": b"order-", "payments": b"pay-", "users": b"user-", "inventory": b"sku-", "sessions": b"sess-"}


# ---------------------------------------------------------------------------------------
# Configuration and results


@dataclass(frozen=True)
class GeneratorConfig:
    """Every option of ``kafka-cleaner generate`` (same names, ``_`` for ``-``)."""

    topics: int = 3
    partitions: int = 2
    """Per topic."""
    records: int = 100_000
    """Data records per partition (transaction markers come on top)."""
    keys: int = 10_000
    """Distinct keys per partition to draw from."""
    key_skew: float = 1.1
    """Zipf exponent s: key of rank k has weight 1/k**s; 0 = uniform."""
    value_bytes: int = 100
    """Mean value size; each value is uniform in [0.5, 1.5] x this."""
    tombstones: float = 0.05
    """Share of records that are tombstones (null values of keys written before)."""
    compression: str = "mixed"
    transactions: float = 0.0
    """Share of data batches written by transactional producers."""
    idempotent: bool = False
    """Non-transactional batches come from idempotent producers (else from plain ones)."""
    segment_bytes: int = 8 * 1024 * 1024
    batch_bytes: int = 16384
    """The producers' batch.size: a batch holds up to about this many (uncompressed) bytes."""
    seed: int = 0
    now_ms: int | None = None
    """The clock: record timestamps end at it. None = ``DEFAULT_NOW_MS``."""
    hours: float = 6.0
    """Record timestamps span this many hours before ``now_ms``."""
    topic_prefix: str = "topic"
    """Topics are named ``<prefix>-0``, ``<prefix>-1``, ..."""

    @property
    def clock_ms(self) -> int:
        return DEFAULT_NOW_MS if self.now_ms is None else self.now_ms

    def validate(self) -> None:
        """Raise ValueError naming the first bad option."""

        def need(ok: bool, option: str, rule: str, value: object) -> None:
            if not ok:
                raise ValueError(f"{option} {rule} (got {value!r})")

        need(self.topics >= 1, "topics", "must be at least 1", self.topics)
        need(self.partitions >= 1, "partitions", "must be at least 1", self.partitions)
        need(self.records >= 0, "records", "cannot be negative", self.records)
        need(self.keys >= 1, "keys", "must be at least 1", self.keys)
        need(self.keys <= MAX_KEYS, "keys", f"must be at most {MAX_KEYS}", self.keys)
        need(math.isfinite(self.key_skew) and self.key_skew >= 0, "key-skew", "must be >= 0", self.key_skew)
        need(
            0 <= self.value_bytes <= MAX_VALUE_BYTES,
            "value-bytes",
            f"must be in [0, {MAX_VALUE_BYTES}]",
            self.value_bytes,
        )
        need(0.0 <= self.tombstones <= 1.0, "tombstones", "must be a ratio in [0, 1]", self.tombstones)
        need(
            self.compression in COMPRESSION_CHOICES,
            "compression",
            f"must be one of {', '.join(COMPRESSION_CHOICES)}",
            self.compression,
        )
        need(0.0 <= self.transactions <= 1.0, "transactions", "must be a ratio in [0, 1]", self.transactions)
        need(self.segment_bytes >= 1024, "segment-bytes", "must be at least 1024", self.segment_bytes)
        need(self.segment_bytes <= 2**31 - 1, "segment-bytes", "must fit an int32 (Kafka's limit)", self.segment_bytes)
        need(
            64 <= self.batch_bytes <= MAX_BATCH_BYTES,
            "batch-bytes",
            f"must be in [64, {MAX_BATCH_BYTES}]",
            self.batch_bytes,
        )
        need(self.seed >= 0, "seed", "cannot be negative", self.seed)
        need(0 < self.hours <= 24 * 365 and math.isfinite(self.hours), "hours", "must be in (0, 8760]", self.hours)
        need(
            self.clock_ms >= self.span_ms, "now-ms", f"must be at least the time span ({self.span_ms} ms)", self.now_ms
        )
        longest = f"{self.topic_prefix}-{self.topics - 1}"
        need(
            bool(_TOPIC_NAME.fullmatch(self.topic_prefix)),
            "topic-prefix",
            "may only hold [A-Za-z0-9._-]",
            self.topic_prefix,
        )
        need(
            len(longest) <= _MAX_TOPIC_NAME,
            "topic-prefix",
            f"makes topic names longer than {_MAX_TOPIC_NAME}",
            self.topic_prefix,
        )

    @property
    def span_ms(self) -> int:
        return int(self.hours * HOUR_MS)

    def topic_names(self) -> list[str]:
        return [f"{self.topic_prefix}-{t}" for t in range(self.topics)]

    def codec_of(self, topic_index: int) -> CompressionType:
        name = MIXED_CYCLE[topic_index % len(MIXED_CYCLE)] if self.compression == "mixed" else self.compression
        return CompressionType.from_name(name)

    @staticmethod
    def timestamp_type_of(topic_index: int) -> TimestampType:
        if topic_index % LOG_APPEND_TIME_EVERY == LOG_APPEND_TIME_EVERY - 1:
            return TimestampType.LOG_APPEND_TIME
        return TimestampType.CREATE_TIME


@dataclass(frozen=True)
class PartitionSummary:
    topic: str
    partition: int
    compression: str
    timestamp_type: str
    segments: int
    bytes: int
    batches: int
    records: int
    """Data records (markers not counted)."""
    distinct_keys: int
    tombstones: int
    transactions_committed: int
    transactions_aborted: int
    log_end_offset: int


@dataclass(frozen=True)
class GenerateSummary:
    data_dir: str
    config: GeneratorConfig
    partitions: tuple[PartitionSummary, ...]
    elapsed_seconds: float
    totals: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        keys = ("segments", "bytes", "batches", "records", "distinct_keys", "tombstones")
        totals = {k: sum(getattr(p, k) for p in self.partitions) for k in keys}
        totals["transactions_committed"] = sum(p.transactions_committed for p in self.partitions)
        totals["transactions_aborted"] = sum(p.transactions_aborted for p in self.partitions)
        totals["partitions"] = len(self.partitions)
        object.__setattr__(self, "totals", totals)

    @property
    def megabytes_per_second(self) -> float:
        return self.totals["bytes"] / 1e6 / self.elapsed_seconds if self.elapsed_seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "data_dir": self.data_dir,
            "config": asdict(self.config),
            "partitions": [asdict(p) for p in self.partitions],
            "totals": dict(self.totals),
            "elapsed_seconds": round(self.elapsed_seconds, 3),
            "megabytes_per_second": round(self.megabytes_per_second, 1),
        }


# ---------------------------------------------------------------------------------------
# Deterministic identities


def _rng(config: GeneratorConfig, *path: int) -> np.random.Generator:
    """An independent stream per purpose and partition (``SeedSequence`` over the path)."""
    return np.random.default_rng([config.seed, *path])


def _random_uuid(rng: np.random.Generator) -> bytes:
    """``Uuid.randomUuid``: a version-4 UUID, redrawn while it is the zero or metadata-topic
    id or its base64 form starts with '-' (KIP-516)."""
    while True:
        raw = bytearray(rng.bytes(16))
        raw[6] = (raw[6] & 0x0F) | 0x40
        raw[8] = (raw[8] & 0x3F) | 0x80
        uuid = bytes(raw)
        if uuid not in (bytes(16), bytes(15) + b"\x01") and not encode_uuid(uuid).startswith("-"):
            return uuid


# ---------------------------------------------------------------------------------------
# Values: JSON-like text


def _background(config: GeneratorConfig, topic_index: int) -> np.ndarray:
    """The text values are cut from: JSON documents of the topic's schema, with the
    repetition (field names, enums, ids from small ranges) that codecs find in real data."""
    schema = _SCHEMAS[topic_index % len(_SCHEMAS)]
    rng = _rng(config, 2, topic_index)
    now_s = config.clock_ms // 1000
    docs: list[str] = []
    size = 0
    statuses = ("NEW", "PAID", "SHIPPED", "DELIVERED", "CANCELLED", "REFUNDED")
    currencies = ("EUR", "USD", "GBP", "CHF", "JPY")
    countries = ("DE", "FR", "US", "GB", "NL", "ES", "IT", "JP", "BR")
    while size < BACKGROUND_BYTES:
        n = rng.integers(0, 2**31, size=8).tolist()
        when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now_s - n[0] % 86_400))
        when = f"{when}.{n[1] % 1000:03d}Z"
        if schema == "orders":
            items = ",".join(
                f'{{"sku":"SKU-{(n[2] + i * 7919) % 50_000:05d}","qty":{1 + (n[3] >> i) % 5},'
                f'"price":{(n[4] >> i) % 20_000 / 100:.2f}}}'
                for i in range(1 + n[5] % 4)
            )
            doc = (
                f'{{"order_id":"o-{n[6] % 10**9:09d}","customer":"user-{n[7] % 100_000:06d}",'
                f'"status":"{statuses[n[2] % 6]}","currency":"{currencies[n[3] % 5]}","items":[{items}],'
                f'"created_at":"{when}"}}'
            )
        elif schema == "payments":
            doc = (
                f'{{"payment_id":"p-{n[2] % 10**10:010d}","order_id":"o-{n[3] % 10**9:09d}",'
                f'"amount":{n[4] % 1_000_000 / 100:.2f},"currency":"{currencies[n[5] % 5]}",'
                f'"method":"{("card", "sepa", "paypal", "invoice")[n[6] % 4]}","status":"{statuses[n[7] % 6]}",'
                f'"captured_at":"{when}"}}'
            )
        elif schema == "users":
            doc = (
                f'{{"user_id":"user-{n[2] % 100_000:06d}","name":"user {n[3] % 100_000}",'
                f'"email":"user{n[3] % 100_000}@example.com","country":"{countries[n[4] % 9]}",'
                f'"tier":"{("free", "pro", "enterprise")[n[5] % 3]}","marketing_opt_in":{str(n[6] % 2 == 0).lower()},'
                f'"updated_at":"{when}"}}'
            )
        elif schema == "inventory":
            doc = (
                f'{{"sku":"SKU-{n[2] % 50_000:05d}","warehouse":"WH-{countries[n[3] % 9]}-{n[4] % 12:02d}",'
                f'"on_hand":{n[5] % 5000},"reserved":{n[6] % 200},"updated_at":"{when}"}}'
            )
        else:
            doc = (
                f'{{"session_id":"{n[2]:08x}{n[3]:08x}","user_id":"user-{n[4] % 100_000:06d}",'
                f'"page":"/{("home", "search", "product", "cart", "checkout")[n[5] % 5]}",'
                f'"duration_ms":{n[6] % 600_000},"ts":"{when}"}}'
            )
        docs.append(doc)
        size += len(doc)
    return np.frombuffer("".join(docs).encode("ascii"), dtype=np.uint8)[:BACKGROUND_BYTES].copy()


def _key_matrix(prefix: bytes, ids: np.ndarray, digits: int) -> np.ndarray:
    """Keys ``<prefix><id zero-padded to digits>`` as an (n, len(prefix) + digits) matrix."""
    n = ids.shape[0]
    out = np.empty((n, len(prefix) + digits), dtype=np.uint8)
    out[:, : len(prefix)] = np.frombuffer(prefix, dtype=np.uint8)
    powers = 10 ** np.arange(digits - 1, -1, -1, dtype=np.int64)
    out[:, len(prefix) :] = (ids[:, None] // powers) % 10 + ord("0")
    return out


def _record_size_estimate(config: GeneratorConfig, topic_index: int) -> float:
    prefix = _KEY_PREFIX[_SCHEMAS[topic_index % len(_SCHEMAS)]]
    key = len(prefix) + len(str(config.keys - 1))
    return config.value_bytes * (1 - config.tombstones) + key + 10


def estimate_log_bytes(config: GeneratorConfig) -> int:
    """About how many bytes ``generate`` will write (for a progress bar): record sizes from
    the configuration, each topic's codec ratio measured on a sample of its values."""
    total = 0.0
    for t in range(config.topics):
        codec = config.codec_of(t)
        per_partition = config.records * _record_size_estimate(config, t)
        if codec != CompressionType.NONE and config.value_bytes:
            sample = _background(config, t)[: min(config.batch_bytes * 2, BACKGROUND_BYTES)].tobytes()
            per_partition *= len(compress(codec, sample)) / len(sample)
        total += per_partition * config.partitions
    return int(total)


# ---------------------------------------------------------------------------------------
# One partition


class _Pipeline:
    """One writer thread that runs submitted jobs in order, at most ``depth`` behind the
    caller: encoding (numpy, codecs) overlaps with appends, fsyncs at rolls and the page
    cache's write-back, which would otherwise leave the CPU idle about half the time.

    After a job fails, later jobs are skipped (nothing more is written), and the next
    ``submit`` or the exit of the ``with`` block raises the error.
    """

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="generate-writer")
        self._pending: deque[Future[Any]] = deque()
        self._error: BaseException | None = None

    def _run(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        if self._error is not None:
            raise self._error
        try:
            return fn(*args)
        except BaseException as e:
            self._error = e
            raise

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        if self._error is not None:
            raise self._error
        while len(self._pending) >= self.depth:
            self._pending.popleft().result()
        future = self._executor.submit(self._run, fn, args)
        self._pending.append(future)
        return future

    def __enter__(self) -> _Pipeline:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            if exc_type is None:
                while self._pending:
                    self._pending.popleft().result()
            else:
                for future in self._pending:
                    future.cancel()
        finally:
            self._executor.shutdown(wait=True)


@dataclass
class _Producer:
    producer_id: int
    epoch: int
    coordinator_epoch: int = -1
    next_sequence: int = 0


@dataclass
class _Txn:
    producer: _Producer
    remaining: int
    abort: bool


@dataclass
class _Marker:
    txn: _Txn
    offset: int = -1
    timestamp: int = -1

    @property
    def kind(self) -> ControlRecordType:
        return ControlRecordType.ABORT if self.txn.abort else ControlRecordType.COMMIT


class _PartitionWriter:
    """Writes one partition: plans batches and producers, encodes a chunk of batches at a
    time, appends them like a follower (offsets assigned), and keeps the producer state
    (snapshots at rolls, txn-index entries for aborts) the way a broker does."""

    def __init__(
        self,
        data_dir: Path,
        config: GeneratorConfig,
        topic_index: int,
        partition: int,
        topic_id: bytes,
        background: np.ndarray,
        progress: Callable[[int], None] | None,
        pipeline: _Pipeline,
    ) -> None:
        self.config = config
        self.pipeline = pipeline
        self.topic_index = topic_index
        self.topic = config.topic_names()[topic_index]
        self.partition = partition
        self.codec = config.codec_of(topic_index)
        self.timestamp_type = config.timestamp_type_of(topic_index)
        self.background = background
        self.topic_id = topic_id
        self.progress = progress
        self.rng = _rng(config, 3, topic_index, partition)
        self.dir = data_dir / TopicPartition(self.topic, partition).dir_name
        self.log = Log.create(self.dir, LogConfig(segment_bytes=config.segment_bytes))
        self.psm = ProducerStateManager()
        self.log.roll_listeners.append(self._on_roll)

        schema = _SCHEMAS[topic_index % len(_SCHEMAS)]
        self.key_prefix = _KEY_PREFIX[schema]
        self.key_digits = len(str(config.keys - 1))
        # Zipf-like key law: rank r (1-based) has weight r**-s; ranks map to key ids by a
        # fixed random permutation, so the hot keys are not simply the smallest ids.
        weights = np.arange(1, config.keys + 1, dtype=np.float64) ** -config.key_skew
        self.key_cdf = np.cumsum(weights)
        self.key_cdf /= self.key_cdf[-1]
        self.key_of_rank = self.rng.permutation(config.keys)
        # Guide table (Chen & Asau): the first rank whose CDF passes j/G, so a draw starts
        # its search there and takes a step or two instead of a binary search.
        self.guide_size = min(4 * config.keys, 1 << 22)
        self.key_guide = np.searchsorted(
            self.key_cdf, np.arange(self.guide_size, dtype=np.float64) / self.guide_size, side="right"
        )
        self.seen = np.zeros(config.keys, dtype=bool)
        self.key_table = (
            _key_matrix(self.key_prefix, np.arange(config.keys, dtype=np.int64), self.key_digits)
            if config.keys <= KEY_TABLE_MAX
            else None
        )

        base = 1000 + 20 * topic_index
        self.idempotent = [_Producer(base + i, 0) for i in range(IDEMPOTENT_PRODUCERS)]
        self.txn_producers = [
            _Producer(base + 10 + j, 2 * j, coordinator_epoch=1 + (topic_index + j) % 3)
            for j in range(TRANSACTIONAL_PRODUCERS)
        ]
        self.open_txns: list[_Txn] = []
        self.last_snapshot = 0  # takeSnapshot writes only past the last one (the log start at first)

        self.next_offset = 0
        self.next_record = 0
        self.broker_time = config.clock_ms - config.span_ms
        self.batches = 0
        self.tombstones = 0
        self.committed = 0
        self.aborted = 0

    # -- broker behaviour ---------------------------------------------------------------
    def _on_roll(self, log: Log, new_base_offset: int) -> None:
        """A broker snapshots its producer state at every roll, named by the new segment's base."""
        self.psm.update_map_end_offset(new_base_offset)
        self.psm.write_snapshot(log.dir, new_base_offset)
        self.last_snapshot = new_base_offset

    # -- planning -----------------------------------------------------------------------
    def _batch_counts(self) -> np.ndarray:
        """Records per data batch: producers fill batches up to batch.size under load and
        send partial ones when linger.ms expires; compressed batches hold more records
        (the producer sizes them by its compression-ratio estimate)."""
        total = self.config.records
        if total == 0:
            return np.zeros(0, dtype=np.int64)
        per_record = _record_size_estimate(self.config, self.topic_index)
        full = self.config.batch_bytes / per_record * (2.0 if self.codec != CompressionType.NONE else 1.0)
        # Even uncompressed, a batch stays under the broker's default max.message.bytes.
        full = max(1.0, min(full, MAX_BATCH_BYTES / (per_record * 1.5)))
        parts: list[np.ndarray] = []
        have = 0
        while have < total:
            draw = int((total - have) / (full * 0.6)) + 16
            fill = np.where(self.rng.random(draw) < 0.7, self.rng.uniform(0.8, 1.0, draw), self.rng.random(draw))
            counts = np.maximum(1, np.ceil(full * fill)).astype(np.int64)
            parts.append(counts)
            have += int(counts.sum())
        counts = np.concatenate(parts)
        ends = np.cumsum(counts)
        m = int(np.searchsorted(ends, total)) + 1
        counts = counts[:m]
        counts[-1] -= int(ends[m - 1]) - total
        return counts

    def run(self) -> Future[PartitionSummary]:
        """Plan and encode here; appending (and the producer state that goes with it)
        happens on the pipeline's writer thread, in order. The future's summary is ready
        once the partition is closed."""
        counts = self._batch_counts()
        m = counts.shape[0]
        transactional = self.rng.random(m) < self.config.transactions
        per_record = _record_size_estimate(self.config, self.topic_index)
        chunk_records = max(1, int(ENCODE_CHUNK_BYTES / per_record))
        ends = np.cumsum(counts)
        b = 0
        while b < m:
            e = max(b + 1, int(np.searchsorted(ends, ends[b] - counts[b] + chunk_records)))
            e = min(e, m)
            self._write_chunk(counts[b:e], transactional[b:e])
            b = e
        if self.open_txns:
            items = []
            for txn in list(self.open_txns):
                items.append(self._marker_batch(self._end_txn(txn)))
            self.pipeline.submit(self._append, items)
        return self.pipeline.submit(self._finish)

    def _end_txn(self, txn: _Txn) -> _Marker:
        self.open_txns.remove(txn)
        marker = _Marker(txn, self.next_offset, self._tick(1 + int(self.rng.integers(0, APPEND_DELAY_MS))))
        self.next_offset += 1
        return marker

    def _tick(self, delay: int) -> int:
        """The broker's clock moves forward (never past ``now``)."""
        self.broker_time = min(self.config.clock_ms, self.broker_time + delay)
        return self.broker_time

    def _draw_ranks(self, u: np.ndarray) -> np.ndarray:
        """``searchsorted(cdf, u, side="right")`` (the 0-based rank whose CDF step holds u),
        by a forward search from the guide table: same result, a few times faster."""
        size = self.guide_size
        ranks = self.key_guide[np.minimum((u * size).astype(np.int64), size - 1)]
        cdf = self.key_cdf
        more = np.flatnonzero(cdf[ranks] <= u)
        while more.size:
            ranks[more] += 1
            more = more[cdf[ranks[more]] <= u[more]]
        return ranks

    # -- one chunk of data batches ---------------------------------------------------------
    def _write_chunk(self, counts: np.ndarray, transactional: np.ndarray) -> None:
        config, rng = self.config, self.rng
        m = counts.shape[0]
        n = int(counts.sum())
        first = np.cumsum(counts) - counts  # chunk-relative record index of each batch's first record

        # Per-record columns.
        key_ids = self.key_of_rank[self._draw_ranks(rng.random(n))]
        # A tombstone deletes a key that exists: one written in an earlier chunk, or earlier
        # in this one (a partition of one chunk, the common small case, gets its share too).
        _, first_in_chunk, which = np.unique(key_ids, return_index=True, return_inverse=True)
        eligible = self.seen[key_ids] | (first_in_chunk[which] < np.arange(n))
        wanted = config.tombstones * (self.next_record + n) - self.tombstones
        share = wanted / max(int(eligible.sum()), 1)
        tombstone = eligible & (rng.random(n) < min(max(share, 0.0), 1.0))
        self.seen[key_ids] = True
        lo, hi = (config.value_bytes + 1) // 2, config.value_bytes * 3 // 2
        value_lengths = rng.integers(lo, hi + 1, size=n)
        value_lengths[tombstone] = -1
        global_index = self.next_record + np.arange(n, dtype=np.int64)
        start_ms = config.clock_ms - config.span_ms
        create = start_ms + (global_index * config.span_ms) // max(config.records, 1)
        jitter = rng.integers(-CLOCK_JITTER_MS, CLOCK_JITTER_MS + 1, size=m)
        create = np.clip(create + np.repeat(jitter, counts), 0, config.clock_ms)
        batch_max_create = np.maximum.reduceat(create, first)
        delays = rng.integers(0, APPEND_DELAY_MS + 1, size=m)

        # Per-batch producers, offsets and the transaction markers between batches.
        pick = rng.integers(0, 1 << 30, size=m)
        producer_ids = np.full(m, -1, dtype=np.int64)
        epochs = np.full(m, -1, dtype=np.int64)
        sequences = np.full(m, -1, dtype=np.int64)
        if config.idempotent:
            which = pick % len(self.idempotent)
            for k, producer in enumerate(self.idempotent):
                mine = np.flatnonzero((which == k) & ~transactional)
                mine_counts = counts[mine]
                producer_ids[mine] = producer.producer_id
                epochs[mine] = producer.epoch
                sequences[mine] = (producer.next_sequence + np.cumsum(mine_counts) - mine_counts) % SEQUENCE_WRAP
                producer.next_sequence = (producer.next_sequence + int(mine_counts.sum())) % SEQUENCE_WRAP
        ended: dict[int, _Txn] = {}  # data batch index -> transaction its marker ends, right after it
        txn_rows = np.flatnonzero(transactional)
        if txn_rows.size:
            coin = rng.random(txn_rows.size).tolist()
            lengths = rng.integers(1, MAX_BATCHES_PER_TRANSACTION + 1, size=txn_rows.size).tolist()
            aborts = (rng.random(txn_rows.size) < ABORT_RATIO).tolist()
            picks = pick[txn_rows].tolist()
            counts_list = counts.tolist()
            for j, i in enumerate(txn_rows.tolist()):
                open_txns = self.open_txns
                if not open_txns or (len(open_txns) < MAX_OPEN_TRANSACTIONS and coin[j] < 0.5):
                    free = [p for p in self.txn_producers if all(t.producer is not p for t in open_txns)]
                    txn = _Txn(free[picks[j] % len(free)], lengths[j], aborts[j])
                    open_txns.append(txn)
                else:
                    txn = open_txns[picks[j] % len(open_txns)]
                producer = txn.producer
                producer_ids[i] = producer.producer_id
                epochs[i] = producer.epoch
                sequences[i] = producer.next_sequence
                producer.next_sequence = (producer.next_sequence + counts_list[i]) % SEQUENCE_WRAP
                txn.remaining -= 1
                if txn.remaining == 0:
                    open_txns.remove(txn)
                    ended[i] = txn
        marker_after = np.zeros(m, dtype=np.int64)
        marker_rows = np.fromiter(ended, dtype=np.int64, count=len(ended))
        marker_after[marker_rows] = 1
        slots = counts + marker_after
        bases = self.next_offset + np.cumsum(slots) - slots
        self.next_offset += int(slots.sum())
        # The broker's clock at each append: a batch arrives a few ms after its last
        # CreateTime, a marker a few ms after the batch before it; never backwards, never
        # past now. Events in log order: batch i sits at i + (markers before it).
        event_of_batch = np.arange(m, dtype=np.int64) + np.cumsum(marker_after) - marker_after
        candidate = np.empty(m + marker_rows.size, dtype=np.int64)
        candidate[event_of_batch] = batch_max_create + delays
        marker_events = event_of_batch[marker_rows] + 1
        candidate[marker_events] = candidate[marker_events - 1] + 1 + rng.integers(0, APPEND_DELAY_MS, marker_rows.size)
        candidate[0] = max(int(candidate[0]), self.broker_time)
        event_times = np.minimum(np.maximum.accumulate(candidate), config.clock_ms)
        self.broker_time = int(event_times[-1])
        append_times = event_times[event_of_batch]
        markers = {
            i: _Marker(txn, int(bases[i] + counts[i]), int(event_times[event_of_batch[i] + 1]))
            for i, txn in ended.items()
        }
        order: list[int | _Marker] = []  # data batch index or marker, in log order
        for i in range(m):
            order.append(i)
            if i in markers:
                order.append(markers[i])

        offsets = np.repeat(bases - first, counts) + np.arange(n, dtype=np.int64)
        if self.key_table is not None:
            keys = Spans.from_matrix(self.key_table[key_ids])
        else:
            keys = Spans.from_matrix(_key_matrix(self.key_prefix, key_ids, self.key_digits))
        shift = int(rng.integers(0, self.background.shape[0]))
        background = np.concatenate((self.background[shift:], self.background[:shift]))
        log_append = self.timestamp_type == TimestampType.LOG_APPEND_TIME
        data = build_batches(
            counts,
            offsets,
            create,
            keys,
            value_lengths,
            background=background,
            base_offsets=bases,
            compression=int(self.codec),
            timestamp_type=self.timestamp_type,
            producer_ids=producer_ids,
            producer_epochs=epochs,
            base_sequences=sequences,
            is_transactional=transactional,
            partition_leader_epoch=PARTITION_LEADER_EPOCH,
            max_timestamps=append_times if log_append else None,
        )
        self.next_record += n
        self.batches += m
        self.tombstones += int(tombstone.sum())
        items = [(data[item], None) if isinstance(item, int) else self._marker_batch(item) for item in order]
        self.pipeline.submit(self._append, items)

    def _marker_batch(self, marker: _Marker) -> tuple[bytes, _Marker]:
        """The marker as the partition leader writes it (on a LogAppendTime topic the broker
        also stamps the marker batch with LogAppendTime, its own clock)."""
        producer = marker.txn.producer
        self.batches += 1
        if self.timestamp_type == TimestampType.LOG_APPEND_TIME:
            record = Record(
                marker.offset,
                marker.timestamp,
                marker.kind.key_bytes(),
                EndTxnMarker(marker.kind, producer.coordinator_epoch).value_bytes(),
            )
            data = build_batch(
                [record],
                timestamp_type=TimestampType.LOG_APPEND_TIME,
                max_timestamp=marker.timestamp,
                producer_id=producer.producer_id,
                producer_epoch=producer.epoch,
                is_transactional=True,
                is_control=True,
                partition_leader_epoch=PARTITION_LEADER_EPOCH,
            )
        else:
            data = build_control_batch(
                marker.kind,
                offset=marker.offset,
                producer_id=producer.producer_id,
                producer_epoch=producer.epoch,
                coordinator_epoch=producer.coordinator_epoch,
                timestamp=marker.timestamp,
                partition_leader_epoch=PARTITION_LEADER_EPOCH,
            )
        return data, marker

    # -- appending ------------------------------------------------------------------------
    def _append(self, items: list[tuple[bytes, _Marker | None]]) -> None:
        """Append batches in groups that each fit the active segment, so the log rolls
        exactly where a broker appending one produce request at a time would."""
        segment_bytes = self.config.segment_bytes
        active = self.log.active_segment
        assert active is not None
        size = active.size
        group: list[tuple[bytes, _Marker | None]] = []
        for item in items:
            n = len(item[0])
            if size > 0 and size + n > segment_bytes and group:
                self._append_group(group)
                group = []
            if size > 0 and size + n > segment_bytes:
                size = 0
            group.append(item)
            size += n
        if group:
            self._append_group(group)

    def _append_group(self, group: list[tuple[bytes, _Marker | None]]) -> None:
        data = b"".join(item[0] for item in group)
        batches = scan_batches(data).batches
        self.log.append(data, batches)
        segment = self.log.active_segment
        assert segment is not None
        for i in np.flatnonzero(batches.producer_ids > -1).tolist():
            marker = group[i][1]
            header = batches.header(i)
            if marker is None:
                self.psm.update(header)
                continue
            done = self.psm.update(header, marker.kind, marker.txn.producer.coordinator_epoch, marker.timestamp)
            if done is None:
                continue
            if done.is_aborted:
                self.aborted += 1
                # The ABORT marker's segment indexes the transaction (§2.4), with the LSO the
                # broker computed when the abort completed.
                segment.append_aborted_txn(
                    AbortedTxn(done.producer_id, done.first_offset, done.last_offset, done.last_stable_offset)
                )
            else:
                self.committed += 1
        self.psm.update_map_end_offset(int(batches.next_offsets[-1]))
        if self.progress is not None:
            self.progress(len(data))

    # -- shutdown -------------------------------------------------------------------------
    def _finish(self) -> PartitionSummary:
        log = self.log
        leo = log.log_end_offset
        self.psm.update_map_end_offset(leo)
        if leo > self.last_snapshot:  # clean shutdown: a snapshot at the log end (none for an empty log)
            self.psm.write_snapshot(self.dir, leo)
        active = log.active_segment
        assert active is not None
        active.on_become_inactive()  # a closing segment gets its final time-index entry
        log.close()
        for segment in log.segments:
            largest = segment.max_timestamp_so_far
            if largest >= 0:
                segment.set_last_modified(largest)
        files.atomic_write(self.dir / LEADER_EPOCH_CHECKPOINT, format_checkpoint(0, [f"{PARTITION_LEADER_EPOCH} 0"]))
        write_partition_metadata(self.dir, self.topic_id)
        return PartitionSummary(
            topic=self.topic,
            partition=self.partition,
            compression=self.codec.kafka_name,
            timestamp_type="LogAppendTime" if self.timestamp_type == TimestampType.LOG_APPEND_TIME else "CreateTime",
            segments=len(log.segments),
            bytes=log.size_in_bytes,
            batches=self.batches,
            records=self.next_record,
            distinct_keys=int(self.seen.sum()),
            tombstones=self.tombstones,
            transactions_committed=self.committed,
            transactions_aborted=self.aborted,
            log_end_offset=leo,
        )


# ---------------------------------------------------------------------------------------
# The log dir


def _check_empty(data_dir: Path) -> None:
    if data_dir.exists():
        if not data_dir.is_dir():
            raise FileExistsError(f"{data_dir} exists and is not a directory")
        if any(data_dir.iterdir()):
            raise FileExistsError(
                f"{data_dir} is not empty; refusing to write into it (it could be a broker's data): "
                "give an empty or absent directory"
            )


def generate(
    data_dir: str | os.PathLike[str],
    config: GeneratorConfig | None = None,
    *,
    progress: Callable[[int], None] | None = None,
) -> GenerateSummary:
    """Write a broker log dir into ``data_dir`` (absent or empty; anything else raises
    FileExistsError before a byte is written) and return what was written. Bad options
    raise ValueError.

    ``progress`` is called with the number of bytes just appended to a partition's log
    (an increment; the increments add up to ``summary.totals["bytes"]``). It is called from
    the writer thread, one call at a time.
    """
    config = config or GeneratorConfig()
    config.validate()
    root = Path(data_dir)
    _check_empty(root)
    started = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)

    results: list[Future[PartitionSummary]] = []
    with _Pipeline(PIPELINE_DEPTH) as pipeline:
        for t in range(config.topics):
            topic_id = _random_uuid(_rng(config, 1, t))
            background = _background(config, t)
            for p in range(config.partitions):
                results.append(_PartitionWriter(root, config, t, p, topic_id, background, progress, pipeline).run())
    summaries = [r.result() for r in results]

    ids = _rng(config, 0)
    cluster_id, directory_id = _random_uuid(ids), _random_uuid(ids)
    broker_epoch = int(ids.integers(10, 10_000))
    write_meta_properties(
        root,
        MetaProperties(1, encode_uuid(cluster_id), NODE_ID, encode_uuid(directory_id)),
        now_ms=config.clock_ms,
    )
    ends = {TopicPartition(s.topic, s.partition): s.log_end_offset for s in summaries}
    OffsetCheckpointFile(root / RECOVERY_POINT_OFFSET_CHECKPOINT).write(ends)
    OffsetCheckpointFile(root / REPLICATION_OFFSET_CHECKPOINT).write(ends)
    # Entries only where the log start offset is above the first segment's base: none here.
    OffsetCheckpointFile(root / LOG_START_OFFSET_CHECKPOINT).write({})
    # CleanShutdownFileHandler.write: a Jackson-serialised HashMap<String, String>, keys in
    # HashMap order, values as strings, then fsync. Written last, as at a broker's shutdown.
    files.write_file(
        root / CLEAN_SHUTDOWN_FILE,
        json.dumps({"broker_epoch": str(broker_epoch), "version": "0"}, separators=(",", ":")).encode(),
    )
    files.fsync_dir(root)
    return GenerateSummary(str(root), config, tuple(summaries), time.perf_counter() - started)


# ---------------------------------------------------------------------------------------
# CLI


def _print_table(summary: GenerateSummary) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Generated {summary.data_dir}", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    columns = ("partition", "codec", "segs", "size", "records", "keys", "tombst.", "txn c/a", "LEO")
    for name in columns:
        table.add_column(name, justify="left" if name in ("partition", "codec") else "right")
    for p in summary.partitions:
        table.add_row(
            f"{p.topic}-{p.partition}",
            p.compression + ("/LAT" if p.timestamp_type == "LogAppendTime" else ""),
            str(p.segments),
            binary_bytes(p.bytes),
            str(p.records),
            str(p.distinct_keys),
            str(p.tombstones),
            f"{p.transactions_committed}/{p.transactions_aborted}",
            str(p.log_end_offset),
        )
    t = summary.totals
    table.add_section()
    table.add_row(
        "total",
        "",
        str(t["segments"]),
        binary_bytes(t["bytes"]),
        str(t["records"]),
        str(t["distinct_keys"]),
        str(t["tombstones"]),
        f"{t['transactions_committed']}/{t['transactions_aborted']}",
        "",
    )
    table.caption = "LAT = LogAppendTime (others CreateTime); txn c/a = transactions committed/aborted"
    # Off a terminal (a pipe, a CI log) rich would wrap at 80 columns and squeeze the table.
    console = Console() if sys.stdout.isatty() else Console(width=200)
    console.print(table)
    rate = t["bytes"] / 1048576 / summary.elapsed_seconds if summary.elapsed_seconds > 0 else 0.0
    console.print(f"{binary_bytes(t['bytes'])} in {summary.elapsed_seconds:.2f} s ({rate:.0f} MiB/s)")


@click.command("generate")
@click.argument("data_dir", type=click.Path(file_okay=False, dir_okay=True, writable=True))
@click.option("--topics", type=int, default=GeneratorConfig.topics, show_default=True, help="Number of topics.")
@click.option(
    "--partitions", type=int, default=GeneratorConfig.partitions, show_default=True, help="Partitions per topic."
)
@click.option(
    "--records", type=int, default=GeneratorConfig.records, show_default=True, help="Data records per partition."
)
@click.option(
    "--keys",
    type=int,
    default=GeneratorConfig.keys,
    show_default=True,
    help="Distinct keys per partition to draw from.",
)
@click.option(
    "--key-skew",
    type=float,
    default=GeneratorConfig.key_skew,
    show_default=True,
    help="Zipf exponent of the key law (0 = uniform).",
)
@click.option(
    "--value-bytes",
    type=int,
    default=GeneratorConfig.value_bytes,
    show_default=True,
    help="Mean value size (each value is 0.5x to 1.5x this).",
)
@click.option(
    "--tombstones",
    type=float,
    default=GeneratorConfig.tombstones,
    show_default=True,
    help="Share of records that delete a key written before.",
)
@click.option(
    "--compression",
    type=click.Choice(COMPRESSION_CHOICES),
    default=GeneratorConfig.compression,
    show_default=True,
    help="Codec of every topic; mixed = none, lz4, zstd, snappy, gzip by topic.",
)
@click.option(
    "--transactions",
    type=float,
    default=GeneratorConfig.transactions,
    show_default=True,
    help="Share of batches written by transactional producers (10% of transactions abort).",
)
@click.option("--idempotent", is_flag=True, help="Other batches come from idempotent producers.")
@click.option(
    "--segment-bytes",
    type=int,
    default=GeneratorConfig.segment_bytes,
    show_default=True,
    help="segment.bytes: roll a segment at this size.",
)
@click.option(
    "--batch-bytes", type=int, default=GeneratorConfig.batch_bytes, show_default=True, help="The producers' batch.size."
)
@click.option("--seed", type=int, default=GeneratorConfig.seed, show_default=True, help="Same seed, same bytes.")
@click.option(
    "--now-ms",
    type=int,
    default=None,
    help="The clock (epoch ms): record timestamps end at it. Default: the start of the current hour, so "
    "ages read as on a broker's disk today; give it for the same bytes on another day.",
)
@click.option(
    "--hours",
    type=float,
    default=GeneratorConfig.hours,
    show_default=True,
    help="Record timestamps span this many hours before the clock.",
)
@click.option(
    "--topic-prefix",
    default=GeneratorConfig.topic_prefix,
    show_default=True,
    help="Topics are named PREFIX-0, PREFIX-1, ...",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON instead of a table.")
def generate_command(data_dir: str, as_json: bool, **options: Any) -> None:
    """Write a realistic Kafka broker log dir into DATA_DIR (empty or absent).

    Segments with their indexes, transaction indexes, producer snapshots, checkpoints and
    metadata, as a KRaft broker leaves them after a clean shutdown. Deterministic: the same
    options and --now-ms give the same bytes.
    """
    if options["now_ms"] is None:  # the library's default is fixed (tests); a person's is today
        options["now_ms"] = time.time_ns() // 1_000_000 // HOUR_MS * HOUR_MS
    config = GeneratorConfig(**options)
    try:
        config.validate()
    except ValueError as e:
        raise click.UsageError(f"--{e}") from None
    try:
        _check_empty(Path(data_dir))
    except FileExistsError as e:
        raise click.UsageError(str(e)) from None

    if sys.stderr.isatty() and not as_json:
        with ByteProgress("generating", max(1, estimate_log_bytes(config))).shown_while() as bar:
            summary = generate(data_dir, config, progress=bar.advance)
    else:
        total = max(1, estimate_log_bytes(config))
        state = {"written": 0, "next": 0.1}

        def log_line(n: int) -> None:
            state["written"] += n
            if state["written"] >= state["next"] * total:
                click.echo(f"generate: {binary_bytes(state['written'])} written", err=True)
                while state["next"] * total <= state["written"]:
                    state["next"] += 0.1

        summary = generate(data_dir, config, progress=log_line)
    if as_json:
        click.echo(json.dumps(summary.to_dict(), indent=2))
    else:
        _print_table(summary)
    sys.stdout.flush()
