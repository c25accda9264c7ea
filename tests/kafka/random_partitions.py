"""Random partitions for the randomized differential (``test_random_differential.py``).

A seed draws one ``PartitionSpec``: plain data (keys with skew, tombstones, headers, keyless
records, every codec mixed within the partition), idempotent and transactional producers
(transactions interleaved, committed, aborted, left hanging), legacy v0/v1 segments before the
v2 ones, an already-cleaned section (offset gaps, batches stamped with a delete horizon just
before, at or after either clock), segment, index and interval sizes that split the cleaner's
groups, and per-topic configs (dirty ratio, ``min``/``max.compaction.lag.ms`` and
``retention.ms`` exactly at a segment's timestamp or one millisecond off, ``delete.retention.ms``
around the gap between the two cleans, ``compact,delete``). The spec is plain data (lists of
batches of records) so that a shrinker can take pieces away and write it again; offsets,
producer sequences, ``.txnindex`` entries and last stable offsets are derived when it is
written, so every reduction is still a log a broker could have written.

``run_sweep`` puts many partitions (one topic each, its configs through ``per_topic``) into
one log dir per environment (the cleaner's globals: clean shutdown or not, offset map size),
cleans copies with Kafka's cleaner (one JVM per environment and clean) and kafka-cleaner, twice
(a first clean at ``T1`` with the high watermark part-way, a second at ``T2`` with the high
watermark at the log end), and compares partition by partition with ``kafka_oracle``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from differential_inputs import legacy_plain, legacy_wrapper, stamped_marker
from kafka_oracle import (
    CLEANER_CHECKPOINT,
    batch_byte_differences,
    describe_batch,
    kafka_clean_each,
    kafka_uncleanable,
    logical_view,
    our_clean,
    our_map_keys,
    our_uncleanable,
    segment_files,
    twin_copies,
)

from cleaner.records.batch import TimestampType
from cleaner.records.builder import build_batch, build_control_batch
from cleaner.records.compression import CompressionType
from cleaner.records.control import ControlRecordType
from cleaner.records.record import Record
from cleaner.storage.checkpoint import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
)
from cleaner.storage.index import AbortedTxn
from cleaner.storage.log import Log, LogConfig
from cleaner.storage.topic_partition import TopicPartition

T1 = 1_700_000_000_000
"""The first clean's clock."""
GAP_MS = 3_600_000
T2 = T1 + GAP_MS
"""The second clean's clock: ``delete.retention.ms`` of ``GAP_MS`` puts the horizons the
first clean stamps exactly at it."""
DAY_MS = 86_400_000

NONE, GZIP, SNAPPY, LZ4, ZSTD = (
    CompressionType.NONE,
    CompressionType.GZIP,
    CompressionType.SNAPPY,
    CompressionType.LZ4,
    CompressionType.ZSTD,
)


@dataclass(frozen=True)
class Env:
    """A partition's log dir (clean shutdown or not) and the harness run's offset map."""

    clean_shutdown: bool
    map_keys: int  # keys one round of either offset map holds (kafka-cleaner's for this buffer)
    dedupe_buffer_size: int


BIG_MAP = 64 * 1024  # ~3,000 keys: more than any drawn partition holds
SMALL_MAP = 1024  # 42 keys a round: several rounds

ENVS = (
    Env(True, our_map_keys(BIG_MAP), BIG_MAP),
    Env(True, our_map_keys(SMALL_MAP), SMALL_MAP),
    Env(False, our_map_keys(BIG_MAP), BIG_MAP),  # producer state rebuilt from the segments
    Env(False, our_map_keys(SMALL_MAP), SMALL_MAP),
)


# -- the spec: plain data ----------------------------------------------------------------


@dataclass
class Rec:
    key: str | None
    value: str | None  # None: a tombstone
    headers: list[list[str]] = field(default_factory=list)
    ts: int = 0  # relative to the batch's timestamp


@dataclass
class Batch:
    kind: str  # plain | idem | txn | commit | abort | legacy
    records: list[Rec] = field(default_factory=list)
    codec: int = 0
    pid: int = -1
    magic: int = 2  # legacy: 0 or 1
    ts: int = 0  # relative to T1
    log_append_time: bool = False
    horizon: int | None = None  # delete horizon relative to T1 (already cleaned once)
    gap: int = 0  # offsets skipped before this batch (a compacted log's holes)
    leader_epoch: int = -1


@dataclass
class PartitionSpec:
    seed: int
    env: int
    partition: int = 0
    segments: list[list[Batch]] = field(default_factory=list)  # the last one is the active segment
    config: dict = field(default_factory=dict)  # Kafka names; values or relative ("@...") forms
    hw1: float = 1.0  # the first clean's high watermark, a share of the log end offset
    checkpoint: list = field(default_factory=list)  # [] | ["segment", i] | ["offset", share]
    log_start: float = 0.0  # log start offset: a share of the first segment's offsets
    mtime_step: int = 1000  # ms between the .log files' modification times

    @property
    def topic(self) -> str:
        return f"r{self.seed}"

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(data: dict) -> PartitionSpec:
        segments = [
            [Batch(**{**b, "records": [Rec(**r) for r in b["records"]]}) for b in seg] for seg in data["segments"]
        ]
        return PartitionSpec(**{**data, "segments": segments})

    def size(self) -> tuple[int, int, int, int]:
        """What the shrinker minimizes: batches, records, segments, everything else."""
        batches = sum(len(s) for s in self.segments)
        records = sum(len(b.records) for s in self.segments for b in s)
        rest = sum(b.codec != NONE for s in self.segments for b in s) + len(self.config) + (self.hw1 < 1)
        rest += bool(self.checkpoint) + (self.log_start > 0)
        rest += sum(len(r.headers) for s in self.segments for b in s for r in b.records)
        rest += sum((b.gap > 0) + (b.horizon is not None) for s in self.segments for b in s)
        return (batches, records, len(self.segments), rest)


# -- drawing a spec from a seed ----------------------------------------------------------


def draw(seed: int, envs: Sequence[int] = range(len(ENVS))) -> PartitionSpec:
    """The spec of ``seed``; ``envs``: the environments it may be given (the same draw
    otherwise, so that a seed outside them is mapped onto one of them)."""
    rng = random.Random(seed)
    env = rng.randrange(len(ENVS))
    spec = PartitionSpec(seed=seed, env=env if env in envs else envs[env % len(envs)], partition=rng.randrange(3))
    keys = rng.choice([1, 2, 3, 5, 8, 20, 60, 200])
    skew = rng.choice([0.0, 0.7, 1.2, 2.0])
    tombstones = rng.choice([0.0, 0.05, 0.2, 0.5, 0.9])
    headers = rng.choice([0.0, 0.0, 0.1, 0.5])
    keyless = rng.choice([0.0, 0.0, 0.0, 0.02])
    codec_pool = rng.choice([[NONE], [NONE, GZIP, LZ4, ZSTD], [NONE, GZIP, SNAPPY, LZ4, ZSTD], [SNAPPY], [ZSTD, LZ4]])
    txn_rate = rng.choice([0.0, 0.2, 0.5, 0.8])
    idem_rate = rng.choice([0.0, 0.3])
    abort_rate = rng.choice([0.0, 0.3, 0.7])
    hanging = rng.random() < 0.2
    log_append_time = rng.random() < 0.1
    age = rng.choice([0, 60_000, GAP_MS, DAY_MS + GAP_MS, 7 * DAY_MS])
    legacy_segments = rng.choice([0, 0, 0, 0, 1, 2])
    n_segments = legacy_segments + rng.randint(1, 6)
    clean_segments = rng.choice([0, 0, 1, 2]) if n_segments > 1 else 0
    clean_segments = min(clean_segments, n_segments - 1)
    value_size = rng.choice([0, 3, 20, 200])
    ts = -age
    open_txns: set[int] = set()

    def key() -> str | None:
        if rng.random() < keyless:
            return None
        k = int(rng.paretovariate(skew)) - 1 if skew else rng.randrange(keys)
        return f"k{min(k, keys - 1)}"

    def records(n: int, legacy: bool = False) -> list[Rec]:
        out = []
        for _ in range(n):
            value = None if rng.random() < tombstones else "v" * rng.randint(0, value_size) + str(rng.randrange(999))
            hdrs = [["h", str(rng.randrange(99))]] if not legacy and rng.random() < headers else []
            out.append(Rec(key(), value, hdrs, rng.choice([0, 0, 1, 5, -3])))
        return out

    for s in range(n_segments):
        segment: list[Batch] = []
        legacy = s < legacy_segments
        cleaned = s < clean_segments
        for _ in range(rng.randint(1, 8)):
            ts += rng.choice([0, 1, 10, 1000, 60_000])
            gap = rng.choice([0, 0, 0, 1, 5]) if cleaned else 0
            if legacy:
                magic = rng.choice([0, 1])
                codec = rng.choice([NONE, NONE, GZIP, SNAPPY] + ([LZ4] if magic else []))
                n = 1 if codec == NONE else rng.randint(1, 5)
                segment.append(Batch("legacy", records(n, True), codec, magic=magic, ts=ts, gap=gap))
                continue
            codec = rng.choice(codec_pool)
            n = rng.choice([1, 1, 2, 3, 5, 10, 20])
            roll = rng.random()
            if open_txns and roll < 0.25:
                pid = rng.choice(sorted(open_txns))
                open_txns.discard(pid)
                kind = "abort" if rng.random() < abort_rate else "commit"
                segment.append(Batch(kind, pid=pid, ts=ts, gap=gap, horizon=_horizon(rng) if cleaned else None))
                continue
            if roll < 0.25 + txn_rate * 0.75:
                pid = 2000 + rng.randrange(3)
                open_txns.add(pid)
                batch = Batch("txn", records(n), codec, pid=pid, ts=ts, gap=gap)
            elif rng.random() < idem_rate:
                batch = Batch("idem", records(n), codec, pid=1000 + rng.randrange(3), ts=ts, gap=gap)
            else:
                batch = Batch("plain", records(n), codec, ts=ts, gap=gap)
            batch.log_append_time = log_append_time
            batch.leader_epoch = rng.choice([-1, -1, 0, 3])
            if cleaned and any(r.value is None for r in batch.records) and rng.random() < 0.7:
                batch.horizon = _horizon(rng)
            segment.append(batch)
        spec.segments.append(segment)
    if not hanging:  # end every transaction, in the last segment before the active one
        for pid in sorted(open_txns):
            ts += 1
            kind = "abort" if rng.random() < abort_rate else "commit"
            spec.segments[-1].append(Batch(kind, pid=pid, ts=ts))
    ts += rng.choice([1, 1000])
    spec.segments.append(
        [Batch("plain", records(rng.randint(1, 3)), rng.choice(codec_pool), ts=ts)] if rng.random() < 0.8 else []
    )
    spec.config = _draw_config(rng, len(spec.segments) - 1)
    spec.hw1 = rng.choice([1.0, 1.0, 0.3, 0.5, 0.8])
    if clean_segments:
        spec.checkpoint = ["segment", clean_segments]
    elif rng.random() < 0.1:
        spec.checkpoint = ["offset", rng.choice([0.2, 0.5, 2.0])]
    spec.log_start = rng.choice([0.0] * 9 + [0.5])
    spec.mtime_step = rng.choice([1000, GAP_MS - 1, GAP_MS, GAP_MS + 1, 0])
    return spec


def _horizon(rng: random.Random) -> int:
    """A delete horizon relative to T1: just before, at, just after either clean's clock."""
    return rng.choice([-1, 0, 1, GAP_MS - 1, GAP_MS, GAP_MS + 1, -DAY_MS, DAY_MS])


def _draw_config(rng: random.Random, segments: int) -> dict:
    config: dict = {}
    if rng.random() < 0.15:
        config["cleanup.policy"] = "compact,delete"
        if rng.random() < 0.5:
            config["retention.ms"] = f"@largest:{rng.randrange(max(segments, 1))}:{rng.choice([-1, 0, 1])}"
        if rng.random() < 0.3:
            config["retention.bytes"] = f"@bytes:{rng.choice([0.3, 0.6, 0.9])}"
    config["min.cleanable.dirty.ratio"] = rng.choice([0.01, 0.01, 0.1, 0.5, 0.99])
    if rng.random() < 0.6:
        config["segment.bytes"] = rng.choice([100, 300, 1000, 4096, 16384])
    if rng.random() < 0.3:
        config["segment.index.bytes"] = rng.choice([12, 24, 48, 120])
    if rng.random() < 0.3:
        config["index.interval.bytes"] = rng.choice([0, 1, 100, 4096])
    if rng.random() < 0.7:
        config["delete.retention.ms"] = rng.choice([0, GAP_MS - 1, GAP_MS, GAP_MS + 1, 10 * GAP_MS])
    if rng.random() < 0.25:
        config["min.compaction.lag.ms"] = f"@largest:{rng.randrange(max(segments, 1))}:{rng.choice([-1, 0, 1])}"
    if rng.random() < 0.2:
        config["max.compaction.lag.ms"] = f"@first:{rng.randrange(max(segments, 1))}:{rng.choice([-1, 0, 1])}"
    return config


# -- writing a spec ----------------------------------------------------------------------


@dataclass
class Written:
    leo: int
    hw1: int
    config: dict  # resolved: plain values only
    checkpoint: int | None
    log_start: int


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def write_partition(spec: PartitionSpec, directory: Path) -> Written:
    """Write ``spec`` as a broker's leader would have (offsets, sequences, markers, aborted
    transactions with the last stable offset of their moment) and set the .log files'
    modification times; returns the log end offset and the configs resolved against the
    segments written."""
    writer = LogConfig(
        segment_bytes=int(spec.config.get("segment.bytes", 1 << 30)),
        segment_index_bytes=int(spec.config.get("segment.index.bytes", 10 << 20)),
        index_interval_bytes=int(spec.config.get("index.interval.bytes", 4096)),
    )
    log = Log.create(directory, writer)
    o = 0
    seqs: dict[int, int] = {}
    open_txns: dict[int, int] = {}
    try:
        for s, segment in enumerate(spec.segments):
            active = log.active_segment
            if s and active is not None and active.size > 0:
                log.roll(o)
            for b in segment:
                o += b.gap
                t = T1 + b.ts
                if b.kind in ("commit", "abort"):
                    kind = ControlRecordType.ABORT if b.kind == "abort" else ControlRecordType.COMMIT
                    first = open_txns.pop(b.pid, o)
                    if b.horizon is not None:
                        log.append(stamped_marker(kind, o, b.pid, t, T1 + b.horizon))
                    else:
                        log.append(
                            build_control_batch(
                                kind, offset=o, producer_id=b.pid, producer_epoch=0, coordinator_epoch=1, timestamp=t
                            )
                        )
                    if kind == ControlRecordType.ABORT:
                        lso = min(open_txns.values(), default=o + 1)
                        log.active_segment.append_aborted_txn(AbortedTxn(b.pid, first, o, lso))
                    o += 1
                    continue
                if not b.records:
                    continue
                if b.kind == "legacy":
                    rows = [(o + i, max(t + r.ts, 0), _bytes(r.key), _bytes(r.value)) for i, r in enumerate(b.records)]
                    if b.codec == NONE:
                        for row in rows:
                            log.append(legacy_plain(b.magic, row))
                    else:
                        log.append(legacy_wrapper(b.magic, b.codec, rows))
                    o += len(rows)
                    continue
                recs = [
                    Record(
                        o + i,
                        max(t + r.ts, 0),
                        _bytes(r.key),
                        _bytes(r.value),
                        tuple((h, v.encode()) for h, v in r.headers),
                    )
                    for i, r in enumerate(b.records)
                ]
                fields: dict = {}
                if b.pid >= 0:
                    seq = seqs.get(b.pid, 0)
                    seqs[b.pid] = seq + len(recs)
                    fields = {"producer_id": b.pid, "producer_epoch": 0, "base_sequence": seq}
                if b.kind == "txn":
                    fields["is_transactional"] = True
                    open_txns.setdefault(b.pid, o)
                if b.log_append_time:
                    fields["timestamp_type"] = TimestampType.LOG_APPEND_TIME
                    fields["max_timestamp"] = t + 7
                if b.horizon is not None:
                    fields["delete_horizon_ms"] = T1 + b.horizon
                log.append(build_batch(recs, compression=b.codec, partition_leader_epoch=b.leader_epoch, **fields))
                o += len(recs)
        segments = [
            (seg.base_offset, seg.largest_timestamp, seg.first_batch_timestamp(), seg.size) for seg in log.segments
        ]
    finally:
        log.close()
    # The .log files' modification times (the legacy delete horizon is read from them).
    for i, (base, *_rest) in enumerate(segments):
        mtime_ms = T1 - DAY_MS + i * spec.mtime_step
        os.utime(directory / f"{base:020d}.log", ns=(mtime_ms * 1_000_000, mtime_ms * 1_000_000))
    return Written(
        leo=o,
        hw1=int(o * spec.hw1),
        config=_resolve(spec.config, segments[:-1] or segments),
        checkpoint=_checkpoint(spec, segments, o),
        log_start=int(segments[1][0] * spec.log_start) if len(segments) > 1 and spec.log_start else 0,
    )


def _checkpoint(spec: PartitionSpec, segments: list[tuple], leo: int) -> int | None:
    if not spec.checkpoint:
        return None
    how, what = spec.checkpoint
    if how == "segment":
        return segments[min(int(what), len(segments) - 1)][0]
    return int(leo * float(what))


def _resolve(config: dict, segments: list[tuple]) -> dict:
    """``@largest:i:d``: T1 - (segment i's largest timestamp) + d; ``@first:i:d`` the same with
    its first batch's timestamp; ``@bytes:share``: that share of the log's bytes."""
    out = {}
    for name, value in config.items():
        if isinstance(value, str) and value.startswith("@"):
            how, *args = value[1:].split(":")
            if how == "bytes":
                value = int(sum(s[3] for s in segments) * float(args[0]))
            else:
                seg = segments[min(int(args[0]), len(segments) - 1)]
                stamp = seg[1] if how == "largest" else seg[2]
                if stamp is None or stamp < 0:
                    continue
                value = max(T1 - stamp + int(args[1]), 1 if name == "max.compaction.lag.ms" else 0)
        out[name] = value
    if "min.compaction.lag.ms" in out and "max.compaction.lag.ms" in out:
        out["max.compaction.lag.ms"] = max(out["max.compaction.lag.ms"], out["min.compaction.lag.ms"])
    return out


# -- one sweep: many partitions, one JVM per environment and clean --------------------------

BASE_CONFIG = {"cleanup.policy": "compact"}
TIMINGS: dict[str, float] = {}
"""Seconds spent per step of the sweeps so far (write, kafka, ours, compare)."""


def _timed(step: str, started: float) -> float:
    now = time.perf_counter()
    TIMINGS[step] = TIMINGS.get(step, 0.0) + now - started
    return now


@dataclass
class Finding:
    spec: PartitionSpec
    phase: int
    differences: list[str]
    known: str | None = None  # the README deviation that explains it, if one does

    def describe(self) -> str:
        head = f"seed {self.spec.seed} ({self.spec.name}, env {self.spec.env}), clean {self.phase}"
        return head + (f" [known: {self.known}]" if self.known else "") + ":\n  " + "\n  ".join(self.differences)


def run_sweep(version: str, specs: Sequence[PartitionSpec], root: Path) -> list[Finding]:
    """Both cleans of every spec, each partition in a log dir of its own (nothing one
    partition's clean does reaches another's: Kafka's cleaner thread picks among the logs of
    a log dir, and runs retention on all of them after each clean), one harness run per
    offset-map size and clean; the findings (unexplained ones have ``known`` None). A
    partition that differs after the first clean is not compared after the second."""
    findings: list[Finding] = []
    by_map: dict[int, list[PartitionSpec]] = {}
    for spec in specs:
        by_map.setdefault(ENVS[spec.env].dedupe_buffer_size, []).append(spec)
    for size, group in sorted(by_map.items()):
        findings += _run_group(version, group, root / f"map{size}")
    return findings


def _write_log_dir(spec: PartitionSpec, log_dir: Path) -> Written:
    """A log dir holding the spec's partition, with what a broker leaves next to it."""
    w = write_partition(spec, log_dir / spec.name)
    tp = TopicPartition(spec.topic, spec.partition)
    OffsetCheckpointFile(log_dir / RECOVERY_POINT_OFFSET_CHECKPOINT).update(set={tp: w.leo})
    OffsetCheckpointFile(log_dir / REPLICATION_OFFSET_CHECKPOINT).update(set={tp: w.hw1})
    OffsetCheckpointFile(log_dir / LOG_START_OFFSET_CHECKPOINT).update(set={tp: w.log_start} if w.log_start else {})
    if w.checkpoint is not None:
        OffsetCheckpointFile(log_dir / CLEANER_CHECKPOINT).update(set={tp: w.checkpoint})
    if ENVS[spec.env].clean_shutdown:
        (log_dir / ".kafka_cleanshutdown").write_text('{"version":0,"broker_epoch":1}')
    return w


def _run_group(version: str, specs: Sequence[PartitionSpec], root: Path) -> list[Finding]:
    started = time.perf_counter()
    env = ENVS[specs[0].env]
    written: dict[str, Written] = {}
    per_topic: dict[str, dict] = {}
    dirs: dict[str, tuple[Path, Path]] = {}
    for spec in specs:
        source = root / "source" / str(spec.seed)
        written[spec.name] = w = _write_log_dir(spec, source)
        per_topic[spec.topic] = w.config
        dirs[spec.name] = twin_copies(source, root / str(spec.seed))
    started = _timed("write", started)
    findings: list[Finding] = []
    differing: set[str] = set()
    for phase, now in ((1, T1), (2, T2)):
        if phase == 2:
            for spec in specs:
                tp = TopicPartition(spec.topic, spec.partition)
                for log_dir in dirs[spec.name]:
                    OffsetCheckpointFile(log_dir / REPLICATION_OFFSET_CHECKPOINT).update(
                        set={tp: written[spec.name].leo}
                    )
        without_snapshots = _without_snapshots(specs, dirs, root) if phase == 2 else {}
        reports = kafka_clean_each(
            version, [dirs[s.name][1] for s in specs], now, BASE_CONFIG, map_keys=env.map_keys, per_topic=per_topic
        )
        started = _timed("kafka", started)
        outcomes = [
            our_clean(dirs[s.name][0], now, BASE_CONFIG, dedupe_buffer_size=env.dedupe_buffer_size, per_topic=per_topic)
            for s in specs
        ]
        started = _timed("ours", started)
        for spec, report, outcome in zip(specs, reports, outcomes, strict=True):
            name = spec.name
            if name in differing:
                continue
            ours, kafka = dirs[name]
            diffs = _differences(name, report, outcome, ours, kafka)
            if diffs:
                differing.add(name)
                known = explain(
                    version, spec, phase, diffs, ours / name, kafka / name, kafka_uncleanable(report).get(name)
                )
                findings.append(Finding(spec, phase, diffs, known))
        unexplained = {f.spec.name: f for f in findings if f.phase == phase and f.known is None}
        _explain_by_snapshots(version, specs, outcomes, unexplained, without_snapshots, env, per_topic, dirs)
        started = _timed("compare", started)
    return findings


RECOVERY_SNAPSHOT = "a producer snapshot Kafka's start-up wrote at the first clean"


def _without_snapshots(
    specs: Sequence[PartitionSpec], dirs: dict[str, tuple[Path, Path]], root: Path
) -> dict[str, Path]:
    """Before the second clean of a log dir with no clean shutdown: a copy of Kafka's log dir
    without the ``.snapshot`` files that Kafka's own load at the first clean wrote (its
    ``LogLoader`` recovers and snapshots the producer state; kafka-cleaner writes none), for
    ``_explain_by_snapshots``."""
    out: dict[str, Path] = {}
    for spec in specs:
        kafka = dirs[spec.name][1]
        if ENVS[spec.env].clean_shutdown or not any((kafka / spec.name).glob("*.snapshot")):
            continue
        copy = root / "without-snapshots" / str(spec.seed)
        shutil.copytree(kafka, copy)
        for path in (copy / spec.name).glob("*.snapshot"):
            path.unlink()
        out[spec.name] = copy
    return out


def _explain_by_snapshots(
    version: str,
    specs: Sequence[PartitionSpec],
    outcomes: Sequence,
    unexplained: dict[str, Finding],
    without_snapshots: dict[str, Path],
    env: Env,
    per_topic: dict[str, dict],
    dirs: dict[str, tuple[Path, Path]],
) -> None:
    """A second-clean difference that Kafka's cleaner does not make once the producer
    snapshots of its first load are gone (one more harness run for all of them): the
    README deviation ``RECOVERY_SNAPSHOT``."""
    names = [name for name in unexplained if name in without_snapshots]
    if not names:
        return
    reports = kafka_clean_each(
        version, [without_snapshots[n] for n in names], T2, BASE_CONFIG, map_keys=env.map_keys, per_topic=per_topic
    )
    outcome_of = {spec.name: outcome for spec, outcome in zip(specs, outcomes, strict=True)}
    for name, report in zip(names, reports, strict=True):
        if not _differences(name, report, outcome_of[name], dirs[name][0], without_snapshots[name]):
            unexplained[name].known = RECOVERY_SNAPSHOT


def _differences(name: str, report: dict, outcome, ours: Path, kafka: Path) -> list[str]:
    k_unclean, o_unclean = kafka_uncleanable(report), our_uncleanable(outcome)
    k_rounds = [r["endOffset"] for r in report["rounds"]]
    o_rounds = [r.end_offset for r in outcome.results]
    diffs = []
    if k_unclean or o_unclean:
        diffs.append(f"uncleanable: ours {o_unclean.get(name)!r} / Kafka's {k_unclean.get(name)!r}")
    if k_rounds != o_rounds:
        diffs.append(f"rounds' end offsets: ours {o_rounds} / Kafka's {k_rounds}")
    k_check, o_check = _cleaner_checkpoints(kafka), _cleaner_checkpoints(ours)
    if k_check != o_check:
        diffs.append(f"{CLEANER_CHECKPOINT}: ours {o_check.get(name)} / Kafka's {k_check.get(name)}")
    diffs += partition_view_differences(ours / name, kafka / name)
    diffs += partition_file_differences(ours / name, kafka / name)
    return diffs


def _cleaner_checkpoints(log_dir: Path) -> dict[str, int]:
    path = log_dir / CLEANER_CHECKPOINT
    return {str(tp): o for tp, o in OffsetCheckpointFile(path).read().items()} if path.exists() else {}


def partition_view_differences(ours: Path, kafka: Path, limit: int = 12) -> list[str]:
    """``kafka_oracle.view_differences`` of one partition."""
    a, b = logical_view(ours), logical_view(kafka)
    if a == b:
        return []
    out: list[str] = []
    a_by_base, b_by_base = {x[0]: x for x in a}, {x[0]: x for x in b}
    for base in sorted(set(a_by_base) | set(b_by_base)):
        x, y = a_by_base.get(base), b_by_base.get(base)
        if x == y:
            continue
        if x is None:
            out.append(f"only Kafka keeps {describe_batch(y)}")
        elif y is None:
            out.append(f"only kafka-cleaner keeps {describe_batch(x)}")
        elif x[:-1] != y[:-1]:
            out.append(f"batch differs: ours {describe_batch(x)} / Kafka {describe_batch(y)}")
        else:
            ox, oy = {r[0]: r for r in x[-1]}, {r[0]: r for r in y[-1]}
            changed = sorted(o for o in ox.keys() & oy.keys() if ox[o] != oy[o])
            out.append(
                f"records of {describe_batch(x)} differ: only ours {sorted(ox.keys() - oy.keys())}, "
                f"only Kafka's {sorted(oy.keys() - ox.keys())}, changed {changed}"
            )
        if len(out) >= limit:
            return [*out, "..."]
    if not out:  # same batches by base offset, in another order or repeated
        out.append(f"batch order differs: ours {[x[0] for x in a]} / Kafka's {[x[0] for x in b]}")
    return out


def partition_file_differences(ours: Path, kafka: Path) -> list[str]:
    """``kafka_oracle.file_differences`` of one partition (an empty ``.txnindex`` counts as
    absent)."""
    a = {k: v for k, v in segment_files(ours).items() if not (k.endswith(".txnindex") and not v)}
    b = {k: v for k, v in segment_files(kafka).items() if not (k.endswith(".txnindex") and not v)}
    out = [f"{f}: only kafka-cleaner wrote it" for f in sorted(a.keys() - b.keys())]
    out += [f"{f}: only Kafka wrote it" for f in sorted(b.keys() - a.keys())]
    out += [
        f"{f}: bytes differ ({len(a[f])} vs Kafka's {len(b[f])})" for f in sorted(a.keys() & b.keys()) if a[f] != b[f]
    ]
    return out


LAZY_INDEX = "the active segment's empty index Kafka's start-up creates"
_INDEX_ONLY_KAFKA = re.compile(r"(\d{20})\.(index|timeindex): only Kafka wrote it")


def explain(
    version: str, spec: PartitionSpec, phase: int, diffs: list[str], ours: Path, kafka: Path, kafka_error: str | None
) -> str | None:
    """The README deviation that explains a difference, or None."""
    batches = [b for seg in spec.segments for b in seg]
    if phase == 2 and _only_lazy_indexes(diffs, kafka):
        return LAZY_INDEX
    if (
        kafka_error
        and "Empty batches are only supported for magic v2" in kafka_error
        and any(b.kind == "legacy" for b in batches)
    ):
        return "an empty legacy entry at a round's end (Kafka throws)"
    if kafka_error and "Attempt to append to a full time index" in kafka_error:
        return "a cleaned segment's time index past segment.index.bytes (Kafka throws)"
    a, b = logical_view(ours), logical_view(kafka)
    only_file_diffs = all(": bytes differ" in d for d in diffs)
    if version.startswith("3.") and any(x[2] < 2 for x in b) and not kafka_error:
        kafka_v2 = [x for x in b if x[2] == 2]
        bases = {x[0] for x in kafka_v2}
        if _kept(a) == _kept(b) and kafka_v2 == [x for x in a if x[0] in bases]:
            return "Kafka 3.9 keeps legacy entries in their magic"
    if any(x.codec == SNAPPY for x in batches) and a == b and only_file_diffs:
        codecs = {codec for _, codec in batch_byte_differences(ours, kafka)}
        if codecs <= {SNAPPY}:
            return "rewritten snappy batches differ in bytes"
    return None


def _only_lazy_indexes(diffs: list[str], kafka: Path) -> bool:
    """Every difference is an empty ``.index``/``.timeindex`` of Kafka's active segment that
    only Kafka has: a segment rolled at the first clean (retention deleted every other one)
    has lazy indexes, no file until used; the second clean's load (``LogLoader.load``:
    ``resizeIndexes`` of the last segment) creates them, as any broker's start would."""
    active = max((p.name for p in kafka.glob("*.log")), default=None)
    for d in diffs:
        m = _INDEX_ONLY_KAFKA.fullmatch(d)
        if m is None or f"{m[1]}.log" != active or (kafka / f"{m[1]}.{m[2]}").stat().st_size:
            return False
    return bool(diffs)


def _kept(view: list[tuple]) -> list[tuple]:
    return [(r[0], r[2], r[3]) for batch in view if not batch[3] & 0x20 for r in batch[-1]]


# -- shrinking ---------------------------------------------------------------------------


def _candidates(spec: PartitionSpec) -> list[list[PartitionSpec]]:
    """Smaller specs, in tiers tried in turn: whole segments and batches, then records and
    configs, then simpler batches (no codec, no gap, no horizon, no headers)."""

    def edit(change: Callable[[PartitionSpec], object]) -> PartitionSpec:
        new = PartitionSpec.from_json(json.loads(json.dumps(spec.to_json())))
        change(new)
        return new

    segs = spec.segments
    tiers: list[list[PartitionSpec]] = [[]]
    for i in range(len(segs) - 1):
        tiers[0].append(edit(lambda s, i=i: s.segments.pop(i)))
    if segs and segs[-1]:
        tiers[0].append(edit(lambda s: s.segments[-1].clear()))
    for i in range(len(segs) - 1):
        tiers[0].append(edit(lambda s, i=i: s.segments[i].extend(s.segments.pop(i + 1))))
    # Runs of consecutive batches, halves first, then quarters, ... then single batches.
    places = [(i, j) for i, seg in enumerate(segs) for j in range(len(seg))]
    size = len(places) // 2
    while size >= 1:
        tier = []
        for start in range(0, len(places), size):
            gone = set(places[start : start + size])
            tier.append(
                edit(
                    lambda s, gone=gone: [
                        seg.__setitem__(slice(None), [b for j, b in enumerate(seg) if (i, j) not in gone])
                        for i, seg in enumerate(s.segments)
                    ]
                )
            )
        tiers.append(tier)
        size //= 2
    tiers += [[], []]
    for i, seg in enumerate(segs):
        for j, b in enumerate(seg):
            if len(b.records) > 1:
                half = len(b.records) // 2
                tiers[-2].append(edit(lambda s, i=i, j=j, h=half: s.segments[i][j].records.__delitem__(slice(h))))
                tiers[-2].append(edit(lambda s, i=i, j=j, h=half: s.segments[i][j].records.__delitem__(slice(h, None))))
                for k in range(len(b.records)):
                    tiers[-2].append(edit(lambda s, i=i, j=j, k=k: s.segments[i][j].records.pop(k)))
    for name in spec.config:
        tiers[-2].append(edit(lambda s, name=name: s.config.pop(name)))
    if spec.hw1 < 1:
        tiers[-2].append(edit(lambda s: setattr(s, "hw1", 1.0)))
    if spec.checkpoint:
        tiers[-2].append(edit(lambda s: setattr(s, "checkpoint", [])))
    if spec.log_start:
        tiers[-2].append(edit(lambda s: setattr(s, "log_start", 0.0)))
    for i, seg in enumerate(segs):
        for j, b in enumerate(seg):

            def simpler(s: PartitionSpec, i: int = i, j: int = j, **fields) -> None:
                for name, value in fields.items():
                    setattr(s.segments[i][j], name, value)

            if b.codec != NONE and b.kind != "legacy":
                tiers[-1].append(edit(lambda s, f=simpler: f(s, codec=NONE)))
            if b.gap:
                tiers[-1].append(edit(lambda s, f=simpler: f(s, gap=0)))
            if b.horizon is not None:
                tiers[-1].append(edit(lambda s, f=simpler: f(s, horizon=None)))
            if b.leader_epoch != -1 or b.log_append_time:
                tiers[-1].append(edit(lambda s, f=simpler: f(s, leader_epoch=-1, log_append_time=False)))
            if any(r.headers or r.ts for r in b.records):
                tiers[-1].append(edit(lambda s, i=i, j=j: [_plain(r) for r in s.segments[i][j].records]))
    return tiers


def signature(finding: Finding) -> tuple[int, str]:
    """What a shrunk case must keep showing: the clean and the kind of its first difference."""
    first = finding.differences[0]
    for kind in ("uncleanable", "rounds", "only kafka-cleaner keeps", "only Kafka keeps", "batch", "records"):
        if first.startswith(kind):
            return finding.phase, kind
    return finding.phase, "files"


def _plain(record: Rec) -> None:
    record.headers = []
    record.ts = 0


def shrink(
    version: str, spec: PartitionSpec, root: Path, *, max_sweeps: int = 60, log: Callable[[str], None] = print
) -> tuple[PartitionSpec, Finding]:
    """Greedy: each step cleans every candidate reduction of the current spec in one sweep
    (one JVM per clean) and keeps the smallest that still differs unexplained."""
    best = spec
    found = [f for f in run_sweep(version, [spec], root / "s0") if f.known is None]
    assert found, "the spec does not differ alone"
    best_finding = found[0]
    wanted = signature(best_finding)
    step = 0
    while step < max_sweeps:
        smaller = None
        for tier in _candidates(best):
            candidates = [c for c in tier if c.size() < best.size()]
            if not candidates:
                continue
            step += 1
            for n, c in enumerate(candidates):
                c.seed = spec.seed * 1000 + n  # a topic each
            work = root / f"s{step}"
            findings = {
                f.spec.seed: f
                for f in run_sweep(version, candidates, work)
                if f.known is None and signature(f) == wanted
            }
            shutil.rmtree(work, ignore_errors=True)
            failing = [c for c in candidates if c.seed in findings]
            if failing:
                smaller = min(failing, key=lambda c: c.size())
                best_finding = findings[smaller.seed]
                break
        if smaller is None:
            break
        best = smaller
        log(f"shrink step {step}: {best.size()}")
    best.seed = spec.seed
    best_finding.spec = best
    return best, best_finding
