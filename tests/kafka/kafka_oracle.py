"""Kafka's own cleaner as the oracle: run it and kafka-cleaner on two copies of one log dir,
then compare what each left behind.

``kafka_clean`` runs ``scripts/kafka-clean-once.sh`` (Kafka's ``LogCleanerManager`` and
``Cleaner``, see ``tests/kafka/harness``); ``our_clean`` runs ``cleaning.clean``, what
``kafka-cleaner clean`` runs, with the same topic configs and the same fixed clock.

``logical_view`` decodes a partition with aiokafka, a decoder independent of ours, into what
a reader sees: every batch header (offsets, attributes with the delete-horizon and control
bits, base timestamp = the delete horizon when that bit is set, producer fields, record
count) and every record (offset, timestamp, key, value, headers). ``file_differences``
compares the bytes of every segment file (``.log``, ``.index``, ``.timeindex``,
``.txnindex``) and ``cleaner-offset-checkpoint``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from aiokafka.record.memory_records import MemoryRecords

from cleaner import cleaning
from cleaner.clock import FixedTime
from cleaner.config import parse_policy
from cleaner.engine.offset_map import OffsetMap
from cleaner.storage.checkpoint import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
)
from cleaner.storage.log import Log, LogConfig
from cleaner.storage.topic_partition import TopicPartition, parse_partition_dir

REPO = Path(__file__).resolve().parents[2]
HARNESS = REPO / "scripts" / "kafka-clean-once.sh"
KAFKA_LINES = ("4.3.1", "3.9.2")
SEGMENT_SUFFIXES = (".log", ".index", ".timeindex", ".txnindex")
CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"


def kafka_clean(
    version: str,
    log_dir: Path,
    now_ms: int,
    topic_config: Mapping[str, str | int | float],
    *,
    map_keys: int | None = None,
    dedupe_buffer_size: int | None = None,
    topics: str = ".*",
    jvm_opts: str | None = None,
    per_topic: Mapping[str, Mapping[str, str | int | float]] | None = None,
) -> dict:
    """Kafka ``version``'s cleaner on ``log_dir`` until nothing is eligible; its JSON report
    (``rounds``, and ``uncleanable``: the partitions its cleaner thread marked uncleanable,
    each with the exception). ``map_keys`` sizes Kafka's SkimpyOffsetMap to hold exactly that
    many keys per round. ``per_topic``: configs of single topics, over ``topic_config``."""
    args = [str(HARNESS), version, "--log-dir", str(log_dir), "--now-ms", str(now_ms), "--topics", topics]
    return json.loads(_run_harness(version, args, topic_config, map_keys, dedupe_buffer_size, jvm_opts, per_topic)[-1])


def kafka_clean_each(
    version: str,
    log_dirs: Sequence[Path],
    now_ms: int,
    topic_config: Mapping[str, str | int | float],
    *,
    map_keys: int | None = None,
    dedupe_buffer_size: int | None = None,
    per_topic: Mapping[str, Mapping[str, str | int | float]] | None = None,
) -> list[dict]:
    """``kafka_clean`` of every log dir, each alone (its own ``LogCleanerManager``), one
    after the other in one JVM (the harness's ``--log-dir-list``); their reports in order."""
    listing = Path(log_dirs[0]).parent / f".log-dirs-{os.getpid()}"
    listing.write_text("".join(f"{d}\n" for d in log_dirs))
    args = [str(HARNESS), version, "--log-dir-list", str(listing), "--now-ms", str(now_ms)]
    try:
        lines = _run_harness(version, args, topic_config, map_keys, dedupe_buffer_size, None, per_topic)
    finally:
        listing.unlink()
    reports = [json.loads(line) for line in lines if line.startswith("{")]
    assert [r["logDir"] for r in reports] == [str(d) for d in log_dirs], "the harness skipped a log dir"
    return reports


def _run_harness(
    version: str,
    args: list[str],
    topic_config: Mapping[str, str | int | float],
    map_keys: int | None,
    dedupe_buffer_size: int | None,
    jvm_opts: str | None,
    per_topic: Mapping[str, Mapping[str, str | int | float]] | None,
) -> list[str]:
    for name, value in topic_config.items():
        args += ["--config", f"{name}={value}"]
    for topic, config in (per_topic or {}).items():
        for name, value in config.items():
            args += ["--topic-config", f"{topic}:{name}={value}"]
    if map_keys is not None:
        args += ["--map-keys", str(map_keys)]
    if dedupe_buffer_size is not None:
        args += ["--dedupe-buffer-size", str(dedupe_buffer_size)]
    env = dict(os.environ)
    if jvm_opts is not None:
        env["KAFKA_HARNESS_JVM_OPTS"] = jvm_opts
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        raise AssertionError(f"Kafka {version}'s cleaner failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return done.stdout.strip().splitlines()


def policy_rule(topic_config: Mapping[str, str | int | float], topics: str = ".*") -> dict:
    """The policy rule that says what ``topic_config`` (Kafka's names) says."""
    rule: dict = {"match": topics}
    for name, value in topic_config.items():
        if name == "file.delete.delay.ms":
            continue
        head, *rest = name.split(".")
        rule[head + "".join(p.capitalize() for p in rest)] = value
    return rule


def our_clean(
    log_dir: Path,
    now_ms: int,
    topic_config: Mapping[str, str | int | float],
    *,
    dedupe_buffer_size: int | None = None,
    topics: str = ".*",
    per_topic: Mapping[str, Mapping[str, str | int | float]] | None = None,
) -> cleaning.CleanOutcome:
    """kafka-cleaner's clean with the same configs as ``kafka_clean``: a policy rule per topic
    of ``per_topic`` (its configs over ``topic_config``), then one for every other topic."""
    rules = [policy_rule({**topic_config, **config}, re.escape(topic)) for topic, config in (per_topic or {}).items()]
    spec: dict = {"mode": "compact", "topics": [*rules, policy_rule(topic_config, topics)]}
    if dedupe_buffer_size is not None:
        spec["cleaner"] = {"dedupeBufferSize": dedupe_buffer_size}
    return cleaning.clean([log_dir], parse_policy(spec), FixedTime(now_ms))


def our_map_keys(dedupe_buffer_size: int, load_factor: float = 0.9) -> int:
    """How many keys one round of kafka-cleaner's offset map holds with this buffer."""
    return OffsetMap(dedupe_buffer_size, load_factor).max_keys


def partition_dirs(log_dir: Path) -> list[Path]:
    return sorted(p for p in log_dir.iterdir() if p.is_dir() and parse_partition_dir(p.name) is not None)


def kafka_uncleanable(report: dict) -> dict[str, str]:
    """The partitions Kafka's cleaner thread marked uncleanable, each with its exception."""
    return {u["topicPartition"]: u["error"] for u in report["uncleanable"]}


def our_uncleanable(outcome: cleaning.CleanOutcome) -> dict[str, str]:
    return {str(tp): reason for tps in outcome.uncleanable.values() for tp, reason in tps.items()}


def logical_view(partition_dir: Path) -> list[tuple]:
    """Every batch of the partition, in offset order, with its records, as aiokafka reads them.
    A legacy (v0/v1) entry is one batch whose base offset is its first record's, attributes
    its own, first timestamp its wrapper's (-1 for v0), no producer fields."""
    out: list[tuple] = []
    for segment in sorted(partition_dir.glob("*.log")):
        data = segment.read_bytes()
        position = 0
        while position + 17 <= len(data):
            size = int.from_bytes(data[position + 8 : position + 12], "big", signed=True)
            entry = data[position : position + 12 + size]
            magic = entry[16]
            # Each entry alone: aiokafka checks a legacy CRC wrongly past a buffer's start.
            batch = MemoryRecords(entry).next_batch()
            assert batch.validate_crc(), f"{segment}: bad CRC in the entry at byte {position}"
            recs = tuple((r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in batch)
            if magic >= 2:
                header = (
                    batch.base_offset,
                    batch.next_offset - 1,
                    magic,
                    batch.attributes,
                    batch.first_timestamp,
                    batch.max_timestamp,
                    batch.producer_id,
                    batch.producer_epoch,
                    batch.base_sequence,
                )
            else:
                timestamp = int.from_bytes(entry[18:26], "big", signed=True) if magic == 1 else -1
                header = (recs[0][0], batch.next_offset - 1, magic, entry[17], timestamp, timestamp, -1, -1, -1)
            out.append((*header, len(recs), recs))
            position += 12 + size
    return out


def latest_values(partition_dir: Path) -> dict[bytes, bytes | None]:
    """Each key's last value (None for a tombstone) among the data records, as a consumer
    reading the partition from its start would conclude (control batches excluded)."""
    out: dict[bytes, bytes | None] = {}
    for batch in logical_view(partition_dir):
        if not batch[3] & 0x20:
            for _, _, key, value, _ in batch[-1]:
                out[key] = value
    return out


def describe_batch(batch: tuple) -> str:
    base, last, magic, attributes, first_ts, _, pid, epoch, _, count, _ = batch
    flags = [
        name for bit, name in ((0x10, "transactional"), (0x20, "control"), (0x40, "deleteHorizon")) if attributes & bit
    ]
    return (
        f"[{base}..{last}] v{magic} codec={attributes & 7} {'+'.join(flags) or 'plain'} "
        f"{'horizon' if attributes & 0x40 else 'baseTs'}={first_ts} pid={pid}/{epoch} records={count}"
    )


def view_differences(ours: Path, kafka: Path) -> list[str]:
    """Batch- and record-level differences of every partition, readable, first ones only."""
    out: list[str] = []
    for name in sorted({p.name for p in partition_dirs(ours)} | {p.name for p in partition_dirs(kafka)}):
        a, b = logical_view(ours / name), logical_view(kafka / name)
        if a == b:
            continue
        a_by_base = {x[0]: x for x in a}
        b_by_base = {x[0]: x for x in b}
        for base in sorted(set(a_by_base) | set(b_by_base)):
            x, y = a_by_base.get(base), b_by_base.get(base)
            if x == y:
                continue
            if x is None:
                assert y is not None
                out.append(f"{name}: only Kafka keeps {describe_batch(y)}")
            elif y is None:
                out.append(f"{name}: only kafka-cleaner keeps {describe_batch(x)}")
            elif x[:-1] != y[:-1]:
                out.append(f"{name}: batch differs: ours {describe_batch(x)} / Kafka {describe_batch(y)}")
            else:
                ox, oy = {r[0]: r for r in x[-1]}, {r[0]: r for r in y[-1]}
                changed = sorted(o for o in ox.keys() & oy.keys() if ox[o] != oy[o])
                out.append(
                    f"{name}: records of {describe_batch(x)} differ: only ours {sorted(ox.keys() - oy.keys())}, "
                    f"only Kafka's {sorted(oy.keys() - ox.keys())}, changed {changed}"
                )
            if len(out) >= 20:
                return [*out, "..."]
    return out


def batch_byte_differences(ours: Path, kafka: Path) -> list[tuple[int, int]]:
    """(base offset, codec) of every batch both partitions hold at the same place of the
    same segment whose bytes differ."""
    out = []
    for segment in sorted(ours.glob("*.log")):
        other = kafka / segment.name
        if not other.exists():
            continue
        a, b = MemoryRecords(segment.read_bytes()), MemoryRecords(other.read_bytes())
        while a.has_next() and b.has_next():
            x, y = a.next_batch(), b.next_batch()
            if not (hasattr(x, "base_offset") and hasattr(y, "base_offset")):
                continue  # a legacy (v0/v1) entry: aiokafka's has no base offset, and no snappy rewrite applies
            if x.base_offset == y.base_offset and x.crc != y.crc:
                out.append((x.base_offset, x.attributes & 7))
    return out


def segment_files(partition_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(partition_dir.iterdir()) if p.suffix in SEGMENT_SUFFIXES}


def file_differences(ours: Path, kafka: Path, suffixes: Iterable[str] = SEGMENT_SUFFIXES) -> list[str]:
    """Segment files present on one side only or with different bytes, and any difference of
    ``cleaner-offset-checkpoint``. A ``.txnindex`` with no entry counts as absent (Kafka
    creates one lazily; either is what the broker reads as no aborted transaction)."""
    wanted = tuple(suffixes)
    out: list[str] = []
    for name in sorted({p.name for p in partition_dirs(ours)} | {p.name for p in partition_dirs(kafka)}):
        a = {k: v for k, v in segment_files(ours / name).items() if k.endswith(wanted) and _present(k, v)}
        b = {k: v for k, v in segment_files(kafka / name).items() if k.endswith(wanted) and _present(k, v)}
        out += [f"{name}/{f}: only kafka-cleaner wrote it" for f in sorted(a.keys() - b.keys())]
        out += [f"{name}/{f}: only Kafka wrote it" for f in sorted(b.keys() - a.keys())]
        out += [
            f"{name}/{f}: bytes differ ({len(a[f])} vs Kafka's {len(b[f])})"
            for f in sorted(a.keys() & b.keys())
            if a[f] != b[f]
        ]
    ca, cb = _cleaner_checkpoint(ours), _cleaner_checkpoint(kafka)
    if ca != cb:
        out.append(f"{CLEANER_CHECKPOINT}: ours {ca} / Kafka's {cb}")
    return out


def _present(name: str, data: bytes) -> bool:
    return not (name.endswith(".txnindex") and not data)


def _cleaner_checkpoint(log_dir: Path) -> dict[TopicPartition, int]:
    path = log_dir / CLEANER_CHECKPOINT
    return OffsetCheckpointFile(path).read() if path.exists() else {}


def twin_copies(source: Path, root: Path) -> tuple[Path, Path]:
    """Two copies of a log dir: (ours, Kafka's)."""
    ours, kafka = root / "ours", root / "kafka"
    for dest in (ours, kafka):
        shutil.copytree(source, dest)
        for path in [dest, *dest.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
    return ours, kafka


def rolled_log_dir(source: Path, dest: Path, partitions: Iterable[str]) -> Path:
    """A log dir holding copies of ``partitions`` of a real broker's log dir, each rolled as
    a broker rolls a segment (a new empty active segment at the log end offset) so that the
    data the broker wrote becomes cleanable, with the high watermark at the log end offset
    and a clean-shutdown marker."""
    dest.mkdir(parents=True)
    watermarks: dict[TopicPartition, int] = {}
    for name in partitions:
        target = dest / name
        shutil.copytree(source / name, target)
        for path in [target, *target.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        tp = parse_partition_dir(name)
        assert tp is not None
        leo = Log.open(target, LogConfig()).log_end_offset
        for suffix in (".log", ".index", ".timeindex"):
            (target / f"{leo:020d}{suffix}").touch()
        watermarks[tp] = leo
    for checkpoint in (REPLICATION_OFFSET_CHECKPOINT, RECOVERY_POINT_OFFSET_CHECKPOINT):
        OffsetCheckpointFile(dest / checkpoint).update(set=watermarks)
    OffsetCheckpointFile(dest / LOG_START_OFFSET_CHECKPOINT).update(set={})
    (dest / ".kafka_cleanshutdown").write_text('{"version":0,"broker_epoch":1}')
    return dest
