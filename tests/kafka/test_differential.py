"""Kafka's own cleaner as the oracle (issue 9): the same log dir is copied twice, one copy
is cleaned by Kafka's ``LogCleanerManager`` + ``Cleaner`` (4.3.1 and 3.9.2, through
``scripts/kafka-clean-once.sh``), the other by kafka-cleaner, with the same topic configs and
the same fixed clock. Both must leave the same batches and records (aiokafka's view: offsets,
keys, values, headers, control markers, delete horizons, producer fields) and the same bytes
in every ``.log``, ``.index``, ``.timeindex`` and ``.txnindex``, and the same
``cleaner-offset-checkpoint``.

Inputs: log dirs written by real brokers (``../shared/fixtures/real-kafka``, rolled so that
their data is cleanable), ``kafka-cleaner generate`` data and ``kafka_logs.generate_partition``
data, over several seeds and shapes.

Deviations (README, "How it maps to Kafka") are pinned by their own tests here:
- the offset map holds more keys per round for the same ``dedupeBufferSize`` (so where a round
  ends differs; with an equal key capacity the outputs are identical);
- a rewritten snappy batch is recompressed by another snappy implementation than Kafka's;
- Kafka 3.9 keeps legacy v0/v1 entries in their magic (kafka-cleaner and Kafka 4 write v2);
- an empty legacy entry at a round's end makes both Kafka lines throw (kafka-cleaner keeps
  an empty v2 header).

Cost: each Kafka run is a JVM start (~0.5-2 s with the test JVM flags; shapes that need
different topic configs share one through ``per_topic``); 46 cases, ~3 min for both lines
on 2 busy cores.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest
from differential_inputs import (
    empty_legacy_entry_at_the_rounds_end,
    finish_log_dir,
    hanging_transaction,
    horizons_at_the_clock,
    legacy_then_v2,
)
from kafka_logs import generate_partition, write_high_watermarks
from kafka_oracle import (
    CLEANER_CHECKPOINT,
    KAFKA_LINES,
    batch_byte_differences,
    file_differences,
    kafka_clean,
    kafka_uncleanable,
    latest_values,
    logical_view,
    our_clean,
    our_map_keys,
    our_uncleanable,
    partition_dirs,
    rolled_log_dir,
    twin_copies,
    view_differences,
)
from metadata_logs import topic_record, write_metadata_log

from cleaner.generate import GeneratorConfig, generate
from cleaner.records.compression import CompressionType
from cleaner.storage.checkpoint import (
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
)
from cleaner.storage.log import Log, LogConfig
from cleaner.storage.topic_partition import TopicPartition, parse_partition_dir

pytestmark = pytest.mark.slow

NOW_MS = 1_700_000_000_000
DAY_MS = 86_400_000


@pytest.fixture(params=KAFKA_LINES)
def kafka_version(request: pytest.FixtureRequest) -> str:
    return request.param


def assert_same_as_kafka(ours: Path, kafka: Path) -> None:
    """Same records and batches, then the same bytes in every segment file."""
    assert view_differences(ours, kafka) == []
    assert file_differences(ours, kafka) == []


def clean_both(
    version: str,
    source: Path,
    root: Path,
    config: dict,
    *,
    now_ms: int = NOW_MS,
    map_keys: int | None = None,
    dedupe_buffer_size: int | None = None,
    per_topic: dict[str, dict] | None = None,
) -> tuple[Path, Path, dict]:
    ours, kafka = twin_copies(source, root)
    report = kafka_clean(version, kafka, now_ms, config, map_keys=map_keys, per_topic=per_topic)
    outcome = our_clean(ours, now_ms, config, dedupe_buffer_size=dedupe_buffer_size, per_topic=per_topic)
    assert kafka_uncleanable(report) == {}
    assert our_uncleanable(outcome) == {}
    assert [r.end_offset for r in outcome.results], "kafka-cleaner cleaned nothing"
    assert sorted((str(r.topic_partition), r.end_offset) for r in outcome.results) == sorted(
        (r["topicPartition"], r["endOffset"]) for r in report["rounds"]
    )
    return ours, kafka, report


def generated(root: Path, **options) -> Path:
    source = root / "source"
    generate(source, GeneratorConfig(**options))
    return source


# -- data written by real brokers --------------------------------------------------------

REAL_COMPACTED = {
    # Confluent Platform 7.6 (Apache Kafka 3.6), KRaft: consumer offsets, Connect's topics, schemas.
    "flink-on-prem/data": (
        "__consumer_offsets-36",
        "__consumer_offsets-34",
        "connect-offsets-8",
        "connect-configs-0",
        "connect-status-0",
        "_schemas-0",
    ),
    # Apache Kafka 3.7 and 2.x ZooKeeper-mode brokers: their consumer offsets.
    "LDI-POC": ("__consumer_offsets-6",),
    "kafka-VolodymyrZee": ("__consumer_offsets-32", "__consumer_offsets-12", "__consumer_offsets-18"),
    "kafka-logs": ("__consumer_offsets-2", "__consumer_offsets-26", "__consumer_offsets-46"),
    # Apache Kafka 2.7.1 and 2.1: partitions with several segments, some cleaned by the broker before.
    "kafka-2.7.1/kafka-logs": (
        "__consumer_offsets-17",
        "__consumer_offsets-28",
        "__consumer_offsets-33",
        "__consumer_offsets-39",
        "__consumer_offsets-8",
    ),
    "kafka-source-code/kafka-logs": ("__consumer_offsets-17",),
}


@pytest.mark.fixtures
@pytest.mark.parametrize("fixture", sorted(REAL_COMPACTED))
def test_real_broker_partitions_clean_as_kafka_cleans_them(
    real_kafka_root: Path, tmp_path: Path, kafka_version: str, fixture: str
) -> None:
    """__consumer_offsets traffic and Connect/schema-registry topics as brokers wrote them."""
    source = rolled_log_dir(real_kafka_root / fixture, tmp_path / "source", REAL_COMPACTED[fixture])
    config = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.01}
    ours, kafka, _ = clean_both(kafka_version, source, tmp_path, config)
    assert_same_as_kafka(ours, kafka)


# -- generated shapes --------------------------------------------------------------------

SHAPES = {
    # Mixed codecs, idempotent and transactional producers (10% of transactions abort),
    # tombstones, LogAppendTime topics; single-segment groups.
    "mixed": dict(
        topics=3,
        partitions=1,
        records=6_000,
        keys=1_500,
        tombstones=0.1,
        transactions=0.2,
        idempotent=True,
        segment_bytes=256 * 1024,
    ),
    # Consumer-offsets-like: few hot keys rewritten over and over, small values, many segments.
    "offsets-like": dict(
        topics=1,
        partitions=2,
        records=20_000,
        keys=60,
        key_skew=0.3,
        value_bytes=40,
        tombstones=0.02,
        compression="none",
        segment_bytes=64 * 1024,
        batch_bytes=512,
    ),
    # Transactions (half the batches) in segments small enough that they span segment boundaries.
    "transactions-across-segments": dict(
        topics=1,
        partitions=1,
        records=8_000,
        keys=800,
        transactions=0.5,
        idempotent=True,
        tombstones=0.05,
        compression="lz4",
        segment_bytes=16 * 1024,
        batch_bytes=2048,
    ),
}


# (shape, seed): every shape twice, with different random data.
GENERATED_CASES = [
    ("mixed", 1),
    ("mixed", 2),
    ("offsets-like", 1),
    ("offsets-like", 2),
    ("transactions-across-segments", 1),
    ("transactions-across-segments", 2),
]


@pytest.mark.parametrize(("shape", "seed"), GENERATED_CASES)
def test_generated_shapes_clean_as_kafka_cleans_them(tmp_path: Path, kafka_version: str, shape: str, seed: int) -> None:
    options = SHAPES[shape]
    source = generated(tmp_path, seed=seed, **options)
    config = {"cleanup.policy": "compact", "segment.bytes": options["segment_bytes"]}
    ours, kafka, _ = clean_both(kafka_version, source, tmp_path, config)
    assert_same_as_kafka(ours, kafka)


def aborted_transactions_across_segments(root: Path, codecs: tuple[int, ...]) -> Path:
    """``generate_partition``: up to two transactions open at once, 40% of them aborted,
    headers, 2 KiB segments so that transactions and their markers sit in different segments."""
    source = root / "source"
    config = LogConfig(segment_bytes=2048)
    leo = generate_partition(
        source / "txn-0", seed=7, records=3_000, keys=300, transactional_rate=0.5, config=config, codecs=codecs
    )
    tp = TopicPartition("txn", 0)
    write_high_watermarks(source, {tp: leo})
    OffsetCheckpointFile(source / RECOVERY_POINT_OFFSET_CHECKPOINT).update(set={tp: leo})
    (source / ".kafka_cleanshutdown").write_text('{"version":0,"broker_epoch":1}')
    return source


def test_aborted_transactions_across_segments(tmp_path: Path, kafka_version: str) -> None:
    codecs = (CompressionType.NONE, CompressionType.GZIP, CompressionType.LZ4, CompressionType.ZSTD)
    source = aborted_transactions_across_segments(tmp_path, codecs)
    ours, kafka, _ = clean_both(kafka_version, source, tmp_path, {"cleanup.policy": "compact", "segment.bytes": 2048})
    assert_same_as_kafka(ours, kafka)


def test_deviation_rewritten_snappy_batches_differ_in_bytes(tmp_path: Path, kafka_version: str) -> None:
    """Deliberate deviation: a snappy batch that loses records is recompressed by cramjam's
    snappy (Rust), Kafka's by snappy-java (Google's C++ snappy); both are valid snappy with
    the same records, but the compressed bytes differ. Everything else is Kafka's exactly:
    the same batches with the same headers and records (the whole logical view, not a share
    of it: a batch one side drops is a difference), the same segment files, the same
    ``.index``, ``.timeindex`` and ``.txnindex`` bytes and checkpoint, and only snappy
    batches differ in bytes."""
    source = aborted_transactions_across_segments(tmp_path, (CompressionType.SNAPPY,))
    ours, kafka, _ = clean_both(kafka_version, source, tmp_path, {"cleanup.policy": "compact", "segment.bytes": 2048})
    assert view_differences(ours, kafka) == []
    assert file_differences(ours, kafka, (".index", ".timeindex", ".txnindex")) == []
    log_differences = file_differences(ours, kafka, (".log",))
    assert all(": bytes differ " in d for d in log_differences), log_differences  # no segment on one side only
    differing = batch_byte_differences(ours / "txn-0", kafka / "txn-0")
    assert differing, "snappy output is now byte-identical: drop this deviation from the README"
    assert {codec for _, codec in differing} == {CompressionType.SNAPPY}


def test_more_keys_than_the_dedupe_buffer_holds(tmp_path: Path, kafka_version: str) -> None:
    """Several rounds, each ending where the map fills up. Kafka's map is given the key
    capacity of kafka-cleaner's (they differ for the same buffer size: see the next test)."""
    dedupe = 64 * 1024
    source = generated(
        tmp_path,
        seed=3,
        topics=1,
        partitions=1,
        records=30_000,
        keys=20_000,
        key_skew=0.0,
        tombstones=0.05,
        compression="none",
        segment_bytes=128 * 1024,
    )
    config = {"cleanup.policy": "compact", "segment.bytes": 128 * 1024, "min.cleanable.dirty.ratio": 0.01}
    ours, kafka, report = clean_both(
        kafka_version, source, tmp_path, config, map_keys=our_map_keys(dedupe), dedupe_buffer_size=dedupe
    )
    assert len(report["rounds"]) >= 3
    assert_same_as_kafka(ours, kafka)


def test_deviation_offset_map_holds_more_keys_per_round(tmp_path: Path, kafka_version: str) -> None:
    """Deliberate deviation: with the same dedupeBufferSize, kafka-cleaner's map (19-20 bytes
    a slot) holds more keys than Kafka's SkimpyOffsetMap (24 with MD5), so its first round
    reaches further and the whole clean needs no more rounds than Kafka's."""
    dedupe = 64 * 1024
    source = generated(
        tmp_path,
        seed=4,
        topics=1,
        partitions=1,
        records=20_000,
        keys=15_000,
        key_skew=0.0,
        tombstones=0.0,
        compression="none",
        segment_bytes=128 * 1024,
    )
    config = {"cleanup.policy": "compact", "segment.bytes": 128 * 1024, "min.cleanable.dirty.ratio": 0.01}
    ours, kafka = twin_copies(source, tmp_path)
    report = kafka_clean(kafka_version, kafka, NOW_MS, config, dedupe_buffer_size=dedupe)
    outcome = our_clean(ours, NOW_MS, config, dedupe_buffer_size=dedupe)
    assert report["mapMaxKeys"] < our_map_keys(dedupe)
    assert outcome.results[0].end_offset > report["rounds"][0]["endOffset"]
    assert len(outcome.results) <= len(report["rounds"])
    # What survives is the same: the latest value of every key.
    for partition in partition_dirs(ours):
        assert latest_values(partition) == latest_values(kafka / partition.name)


@pytest.mark.parametrize("after_horizon", [False, True])
def test_tombstones_and_markers_before_and_after_their_horizon(
    tmp_path: Path, kafka_version: str, after_horizon: bool
) -> None:
    """Two cleans: the first, with the high watermark half-way, stamps delete horizons on the
    tombstones and transaction markers it keeps; the second, with the high watermark at the
    log end, runs before or after that horizon (delete.retention.ms later)."""
    source = generated(
        tmp_path,
        seed=5,
        topics=1,
        partitions=1,
        records=8_000,
        keys=1_000,
        tombstones=0.3,
        transactions=0.3,
        idempotent=True,
        compression="none",
        segment_bytes=32 * 1024,
    )
    checkpoint = OffsetCheckpointFile(source / REPLICATION_OFFSET_CHECKPOINT)
    leo = checkpoint.read()
    checkpoint.update(set={tp: end // 2 for tp, end in leo.items()})
    retention = DAY_MS
    config = {
        "cleanup.policy": "compact",
        "segment.bytes": 32 * 1024,
        "delete.retention.ms": retention,
        "min.cleanable.dirty.ratio": 0.01,
    }
    ours, kafka, _ = clean_both(kafka_version, source, tmp_path, config)
    for log_dir in (ours, kafka):
        OffsetCheckpointFile(log_dir / REPLICATION_OFFSET_CHECKPOINT).update(set=leo)
    later = NOW_MS + (retention + 1 if after_horizon else retention // 2)
    report = kafka_clean(kafka_version, kafka, later, config)
    outcome = our_clean(ours, later, config)
    assert [r.end_offset for r in outcome.results] == [r["endOffset"] for r in report["rounds"]]
    assert_same_as_kafka(ours, kafka)


# -- shapes the generators do not write (issue 23) -----------------------------------------


def one_partition(root: Path, name: str, build, start_ms: int, *, clean_shutdown: bool = True) -> Path:
    """A log dir holding the partition ``build`` writes (``differential_inputs``)."""
    source = root / "source"
    source.mkdir()
    tp = parse_partition_dir(name)
    assert tp is not None
    leo = build(source / name, start_ms)
    return finish_log_dir(source, {tp: leo}, clean_shutdown=clean_shutdown)


def kept_records(view: list[tuple]) -> list[tuple]:
    """(offset, key, value) of every data record of a logical view."""
    return [(r[0], r[2], r[3]) for batch in view if not batch[3] & 0x20 for r in batch[-1]]


def test_legacy_entries_before_v2_batches(tmp_path: Path, kafka_version: str) -> None:
    """Legacy v0/v1 segments (plain messages, gzip/snappy/lz4 wrappers, LogAppendTime,
    legacy tombstones) before v2 ones. Kafka 4.x rewrites every kept legacy entry as v2
    (KAFKA-13093), as kafka-cleaner does: the same bytes. Deviation on 3.9.2: Kafka keeps
    them in their own magic (a wrapper rebuilt in magic 0/1), kafka-cleaner writes v2; the
    same records survive at the same offsets, and the v2 batches are Kafka's exactly."""
    name = "legacy-0"
    source = one_partition(tmp_path, name, legacy_then_v2, NOW_MS - DAY_MS)
    ours, kafka, _ = clean_both(kafka_version, source, tmp_path, {"cleanup.policy": "compact"})
    if kafka_version.startswith("4."):
        assert_same_as_kafka(ours, kafka)
        return
    a, b = logical_view(ours / name), logical_view(kafka / name)
    assert {batch[2] for batch in a} == {2}
    assert {batch[2] for batch in b} == {0, 1, 2}, "Kafka 3.9 now writes v2 too: drop this deviation"
    assert kept_records(a) == kept_records(b)
    assert [batch for batch in b if batch[2] == 2] == [batch for batch in a if batch[0] >= 19]


def test_deviation_an_empty_legacy_entry_at_a_rounds_end(tmp_path: Path, kafka_version: str) -> None:
    """Deviation on both lines: the round's last entry (KAFKA-17076 keeps it, empty, so that
    the next round starts on a batch) is a legacy message that keeps no record. Kafka's
    ``MemoryRecords.filterTo`` throws ("Empty batches are only supported for magic v2 and
    above"), its cleaner thread marks the partition uncleanable and changes nothing;
    kafka-cleaner keeps a 61-byte empty v2 header over the entry's offset and goes on."""
    name = "lone-0"
    source = one_partition(tmp_path, name, empty_legacy_entry_at_the_rounds_end, NOW_MS - DAY_MS)
    config = {"cleanup.policy": "compact"}
    ours, kafka = twin_copies(source, tmp_path)
    report = kafka_clean(kafka_version, kafka, NOW_MS, config)
    outcome = our_clean(ours, NOW_MS, config)
    error = kafka_uncleanable(report).get(name, "")
    assert "IllegalStateException" in error and "magic v2" in error, report["uncleanable"]
    assert report["rounds"] == []
    assert logical_view(kafka / name) == logical_view(source / name)
    assert our_uncleanable(outcome) == {}
    assert [(b[0], b[1], b[2], b[9]) for b in logical_view(ours / name)] == [(1, 1, 2, 1), (2, 2, 2, 0), (3, 3, 2, 1)]


def test_a_hanging_transaction(tmp_path: Path, kafka_version: str) -> None:
    """A transaction never ended holds the last stable offset at its first offset (producer
    state rebuilt from the segments: no clean-shutdown marker, no snapshot): only what is
    below it is cleaned, the same on both sides."""
    name = "hanging-0"
    source = one_partition(tmp_path, name, hanging_transaction, NOW_MS - DAY_MS, clean_shutdown=False)
    config = {"cleanup.policy": "compact", "segment.bytes": 600, "min.cleanable.dirty.ratio": 0.01}
    ours, kafka, report = clean_both(kafka_version, source, tmp_path, config)
    assert all(r["firstUncleanableOffset"] < 40 for r in report["rounds"]), report["rounds"]
    assert_same_as_kafka(ours, kafka)


def test_batches_with_their_horizon_exactly_at_the_clock(tmp_path: Path, kafka_version: str) -> None:
    """Tombstones (plain and transactional) and transaction markers a first clean stamped
    with a delete horizon one millisecond before, exactly at and one millisecond after the
    cleaner's clock. Next to the partition: the KRaft metadata log, a ``-delete`` directory
    and tiered storage's index cache, which LogManager never gives the cleaner: both sides
    leave them as they were."""
    name = "horizon-0"
    source = one_partition(tmp_path, name, lambda d, _: horizons_at_the_clock(d, NOW_MS), NOW_MS)
    metadata = source / "__cluster_metadata-0"
    metadata.mkdir()
    write_metadata_log(metadata / f"{0:020d}.log", [topic_record(f"topic-{i}", uuid.UUID(int=i)) for i in range(9)])
    shutil.copytree(source / name, source / f"horizon-1.{uuid.UUID(int=7).hex}-delete")
    (source / "remote-log-index-cache").mkdir()
    (source / "remote-log-index-cache" / f"{0:020d}.index").write_bytes(bytes(24))
    skipped = ("__cluster_metadata-0", f"horizon-1.{uuid.UUID(int=7).hex}-delete", "remote-log-index-cache")
    untouched = {p.relative_to(source): p.read_bytes() for d in skipped for p in (source / d).rglob("*") if p.is_file()}
    ours, kafka, _ = clean_both(kafka_version, source, tmp_path, {"cleanup.policy": "compact"})
    assert_same_as_kafka(ours, kafka)
    view = logical_view(ours / name)
    # Offsets 0-4, 5-9, 10-14: horizon one millisecond before, at, after the clock. A tombstone
    # goes at its horizon, a marker too (its own offset), and only after it are both kept.
    assert [b[0] for b in view if b[9] == 1 and b[-1][0][3] is None] == [10, 12]
    assert [b[0] for b in view if b[3] & 0x20 and b[0] in (1, 6, 11)] == [11]
    for log_dir in (ours, kafka):
        left = {
            p.relative_to(log_dir): p.read_bytes() for d in skipped for p in (log_dir / d).rglob("*") if p.is_file()
        }
        assert left == untouched, f"{log_dir.name} changed {sorted(set(left.items()) ^ set(untouched.items()))}"


# snappy batches rebuilt differ in bytes (the deviation above)
NOT_SNAPPY = (CompressionType.NONE, CompressionType.GZIP, CompressionType.LZ4, CompressionType.ZSTD)


def test_topic_configs_that_decide_what_is_cleaned(tmp_path: Path, kafka_version: str) -> None:
    """One log dir, one JVM, a topic per config (``--topic-config``): ``min.compaction.lag.ms``
    exactly at a segment's largest timestamp; ``max.compaction.lag.ms`` forcing a clean below
    ``min.cleanable.dirty.ratio`` (due, exactly due, not due); ``compact,delete`` with
    ``retention.ms`` exactly at a segment's largest timestamp; a ``segment.index.bytes``
    small enough to split the segment groups."""
    source = tmp_path / "source"
    config = LogConfig(segment_bytes=4096)
    start = NOW_MS - DAY_MS
    ends: dict[TopicPartition, int] = {}
    for i, topic in enumerate(("minlag", "maxlag-due", "maxlag-exact", "maxlag-not-due", "retention", "small-index")):
        tp = TopicPartition(topic, 0)
        ends[tp] = generate_partition(
            source / str(tp),
            seed=20 + i,
            records=1_500,
            keys=150,
            config=config,
            start_timestamp=start,
            transactional_rate=0.1,
            codecs=NOT_SNAPPY,
        )
    finish_log_dir(source, ends)

    def segments(topic: str) -> list:
        log = Log.open(source / f"{topic}-0", config)
        try:
            return [(s.base_offset, s.largest_timestamp, logical_view_first_ts(s)) for s in log.segments]
        finally:
            log.close()

    def logical_view_first_ts(segment) -> int:  # LogSegment.getFirstBatchTimestamp
        return segment.first_batch_timestamp()

    cleaned_to = {}
    for topic in ("maxlag-due", "maxlag-exact", "maxlag-not-due"):
        cleaned_to[TopicPartition(topic, 0)] = segments(topic)[-3][0]  # two dirty segments below the active one
    OffsetCheckpointFile(source / CLEANER_CHECKPOINT).update(set=cleaned_to)
    first_dirty_ts = {t: segments(t)[-3][2] for t in ("maxlag-due", "maxlag-exact", "maxlag-not-due")}
    per_topic = {
        "minlag": {"min.compaction.lag.ms": NOW_MS - segments("minlag")[3][1]},
        "maxlag-due": {
            "min.cleanable.dirty.ratio": 0.99,
            "max.compaction.lag.ms": NOW_MS - first_dirty_ts["maxlag-due"] - 1,
        },
        "maxlag-exact": {
            "min.cleanable.dirty.ratio": 0.99,
            "max.compaction.lag.ms": NOW_MS - first_dirty_ts["maxlag-exact"],
        },
        "maxlag-not-due": {
            "min.cleanable.dirty.ratio": 0.99,
            "max.compaction.lag.ms": NOW_MS - first_dirty_ts["maxlag-not-due"] + 1,
        },
        "retention": {"cleanup.policy": "compact,delete", "retention.ms": NOW_MS - segments("retention")[2][1]},
        "small-index": {"segment.index.bytes": 48},
    }
    ours, kafka, report = clean_both(
        kafka_version, source, tmp_path, {"cleanup.policy": "compact", "segment.bytes": 4096}, per_topic=per_topic
    )
    assert_same_as_kafka(ours, kafka)
    cleaned = {r["topicPartition"] for r in report["rounds"]}
    # max.compaction.lag.ms exactly reached is not due yet (Kafka: earliest < now - lag).
    assert cleaned == {"maxlag-due-0", "minlag-0", "retention-0", "small-index-0"}, cleaned
    minlag = [r for r in report["rounds"] if r["topicPartition"] == "minlag-0"]
    assert minlag[0]["firstUncleanableOffset"] == segments("minlag")[4][0]  # the segment at the lag is cleaned
    # retention.ms: the segments older than it are gone, the one exactly at it stays.
    assert min(int(p.stem) for p in (kafka / "retention-0").glob("*.log")) == segments("retention")[2][0]
