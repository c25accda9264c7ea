"""``cleaner.generate`` and ``kafka-cleaner generate``: the log dir it writes is what a broker
leaves after a clean shutdown, checked file by file against independent readers (our
decoders, kafka-python, a replay of the producer state, Kafka's LSO rule recomputed here)."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import cramjam
import numpy as np
import pytest
from click.testing import CliRunner

from cleaner.cli import main
from cleaner.generate import DEFAULT_NOW_MS, GenerateSummary, GeneratorConfig, estimate_log_bytes, generate
from cleaner.records.batch import TimestampType
from cleaner.records.columns import decode_records
from cleaner.records.compression import CompressionType
from cleaner.records.control import ControlRecordType
from cleaner.records.record import Record
from cleaner.storage.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
)
from cleaner.storage.index import AbortedTxn, OffsetIndex, TimeIndex
from cleaner.storage.log import Log, replay_batches
from cleaner.storage.metadata import (
    CLEAN_SHUTDOWN_FILE,
    EpochEntry,
    read_clean_shutdown,
    read_leader_epoch_checkpoint,
    read_meta_properties,
    read_partition_metadata,
)
from cleaner.storage.producer_state import ProducerStateManager, list_snapshots, read_snapshot
from cleaner.storage.topic_partition import TopicPartition

kafka_codec = pytest.importorskip("kafka.codec")
kafka_default = pytest.importorskip("kafka.record.default_records")

# Five topics: every codec once (mixed), topic 2 on LogAppendTime; small segments so that
# every partition rolls several times; enough transactions for aborts next to open ones.
CONFIG = GeneratorConfig(
    topics=5,
    partitions=2,
    records=2500,
    keys=200,
    value_bytes=60,
    tombstones=0.1,
    transactions=0.35,
    idempotent=True,
    segment_bytes=32 * 1024,
    batch_bytes=2048,
    seed=11,
)
SMALL = GeneratorConfig(topics=5, partitions=1, records=400, keys=50, transactions=0.3, segment_bytes=8192, seed=3)


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, GenerateSummary, int]:
    root = tmp_path_factory.mktemp("gen") / "data"
    written: list[int] = []
    summary = generate(root, CONFIG, progress=written.append)
    return root, summary, sum(written)


def partition_logs(root: Path, summary: GenerateSummary) -> Iterator[tuple[Path, Log]]:
    for p in summary.partitions:
        d = root / f"{p.topic}-{p.partition}"
        log = Log.open(d, read_only=True)
        try:
            yield d, log
        finally:
            log.close()


def all_batches(log: Log):
    for seg in log.segments:
        for chunk in seg.iter_batches(0):
            yield seg, chunk


# ---- layout ----------------------------------------------------------------------------------


def test_layout_and_log_dir_files(generated: tuple[Path, GenerateSummary, int]) -> None:
    root, summary, _ = generated
    names = {p.name for p in root.iterdir()}
    partition_dirs = {f"{p.topic}-{p.partition}" for p in summary.partitions}
    assert names == partition_dirs | {
        "meta.properties",
        RECOVERY_POINT_OFFSET_CHECKPOINT,
        REPLICATION_OFFSET_CHECKPOINT,
        LOG_START_OFFSET_CHECKPOINT,
        CLEAN_SHUTDOWN_FILE,
    }
    assert CLEANER_OFFSET_CHECKPOINT not in names  # absent = dirty from the start
    ends = {TopicPartition(p.topic, p.partition): p.log_end_offset for p in summary.partitions}
    assert OffsetCheckpointFile(root / RECOVERY_POINT_OFFSET_CHECKPOINT).read() == ends
    assert OffsetCheckpointFile(root / REPLICATION_OFFSET_CHECKPOINT).read() == ends
    assert (root / LOG_START_OFFSET_CHECKPOINT).read_bytes() == b"0\n0\n"
    meta = read_meta_properties(root)
    assert (meta.version, meta.node_id) == (1, 1)
    assert meta.cluster_id and meta.directory_id
    assert read_meta_properties(root).cluster_id == meta.cluster_id
    shutdown = json.loads((root / CLEAN_SHUTDOWN_FILE).read_bytes())
    assert list(shutdown) == ["broker_epoch", "version"] and shutdown["version"] == "0"
    assert int(shutdown["broker_epoch"]) > 0
    assert read_clean_shutdown(root) is not None
    topic_ids: dict[str, set[str]] = {}
    for p in summary.partitions:
        d = root / f"{p.topic}-{p.partition}"
        topic_ids.setdefault(p.topic, set()).add(read_partition_metadata(d).topic_id)
        assert read_leader_epoch_checkpoint(d) == [EpochEntry(0, 0)]
        assert (d / "leader-epoch-checkpoint").read_bytes() == b"0\n1\n0 0\n"
        assert not any(name.endswith((".tmp", ".cleaned", ".swap", ".deleted")) for name in os.listdir(d))
    assert all(len(ids) == 1 for ids in topic_ids.values())
    assert len({next(iter(ids)) for ids in topic_ids.values()}) == CONFIG.topics


def test_summary_shape(generated: tuple[Path, GenerateSummary, int]) -> None:
    root, summary, progress_bytes = generated
    assert len(summary.partitions) == CONFIG.topics * CONFIG.partitions
    assert {p.compression for p in summary.partitions} == {"none", "gzip", "snappy", "lz4", "zstd"}
    assert {p.timestamp_type for p in summary.partitions if p.topic == "topic-2"} == {"LogAppendTime"}
    assert summary.totals["records"] == CONFIG.records * len(summary.partitions)
    assert all(p.segments >= 2 for p in summary.partitions)
    assert summary.totals["transactions_aborted"] > 0 and summary.totals["transactions_committed"] > 0
    log_bytes = sum(f.stat().st_size for f in root.glob("*/*.log"))
    assert summary.totals["bytes"] == log_bytes == progress_bytes
    as_dict = json.loads(json.dumps(summary.to_dict()))
    assert as_dict["totals"]["records"] == summary.totals["records"]
    assert 0.3 < estimate_log_bytes(CONFIG) / log_bytes < 3


# ---- segments, indexes and records -----------------------------------------------------------


def test_segments_crc_indexes_and_records(generated: tuple[Path, GenerateSummary, int]) -> None:
    root, summary, _ = generated
    for (_, log), expect in zip(partition_logs(root, summary), summary.partitions, strict=True):
        assert not log.pending_startup
        assert len(log.segments) == expect.segments
        assert log.log_end_offset == expect.log_end_offset
        data_records: list[Record] = []
        next_offset = 0
        batches = 0
        for seg in log.segments:
            positions, lasts, max_ts = [], [], []
            assert seg.size <= CONFIG.segment_bytes
            for chunk in seg.iter_batches(0):
                assert chunk.verify_checksums() == []
                assert int(chunk.base_offsets[0]) == next_offset  # no gaps: every offset is used
                assert (chunk.base_offsets[1:] == chunk.next_offsets[:-1]).all()
                next_offset = int(chunk.next_offsets[-1])
                assert (chunk.headers["partition_leader_epoch"] == 0).all()
                assert (chunk.compression[~chunk.is_control] == CompressionType.from_name(expect.compression)).all()
                log_append = expect.timestamp_type == "LogAppendTime"
                assert (chunk.is_log_append_time == log_append).all()
                columns = decode_records(chunk)
                assert len(columns) == int(chunk.records_counts.sum())
                data_rows = ~chunk.is_control[columns.batch]
                data_records += [columns.record(i) for i in np.flatnonzero(data_rows)]
                positions += chunk.file_positions.tolist()
                lasts += chunk.last_offsets.tolist()
                max_ts += chunk.max_timestamps.tolist()
                batches += len(chunk)
            assert OffsetIndex.read(seg.index_path, seg.base_offset).verify_against(positions, lasts, exact=True) == []
            assert TimeIndex.read(seg.time_index_path, seg.base_offset).verify_against(lasts, max_ts, closed=True) == []
            assert seg.time_index.last_entry[0] == max(max_ts)
            for path in (seg.log_path, seg.index_path, seg.time_index_path):
                assert path.stat().st_mtime_ns // 1_000_000 == max(max_ts)
        assert next_offset == expect.log_end_offset
        assert batches == expect.batches
        assert len(data_records) == expect.records
        assert sum(r.value is None for r in data_records) == expect.tombstones
        assert len({r.key for r in data_records}) == expect.distinct_keys
        assert all(r.key is not None and r.key.isascii() for r in data_records)
        timestamps = [r.timestamp for r in data_records]
        assert DEFAULT_NOW_MS - CONFIG.span_ms - 100 <= min(timestamps) <= max(timestamps) <= DEFAULT_NOW_MS
        # Tombstones delete keys that exist.
        seen: set[bytes] = set()
        for r in data_records:
            if r.value is None:
                assert r.key in seen
            seen.add(r.key)
        # Keys are skewed: the hottest key is far above the mean.
        counts = Counter(r.key for r in data_records)
        assert counts.most_common(1)[0][1] > 5 * len(data_records) / len(counts)
        # Values look like JSON text.
        assert any(b'":"' in (r.value or b"") for r in data_records[:50])


def _kafka_python_records(data: bytes) -> tuple[object, list[Record]]:
    batch = kafka_default.DefaultRecordBatch(bytes(data))
    assert batch.validate_crc()
    return batch, [Record(r.offset, r.timestamp, r.key, r.value) for r in batch]


class _RawSnappy:
    @staticmethod
    def compress(data: bytes) -> bytes:
        return bytes(cramjam.snappy.compress_raw(bytes(data)))

    @staticmethod
    def decompress(data: bytes) -> bytes:
        return bytes(cramjam.snappy.decompress_raw(bytes(data)))


def test_kafka_python_reads_a_sample_identically(
    generated: tuple[Path, GenerateSummary, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    if not kafka_codec.has_snappy():
        monkeypatch.setattr(kafka_codec, "snappy", _RawSnappy())
    root, summary, _ = generated
    checked = 0
    for _, log in partition_logs(root, summary):
        for _, chunk in all_batches(log):
            for i in range(0, len(chunk), 5):
                one = chunk.select(slice(i, i + 1))
                header = one.header(0)
                peer, peer_records = _kafka_python_records(bytes(one.entry_bytes(0)))
                assert (peer.base_offset, peer.producer_id, peer.producer_epoch, peer.base_sequence) == (
                    header.base_offset,
                    header.producer_id,
                    header.producer_epoch,
                    header.base_sequence,
                )
                assert peer.is_transactional == header.is_transactional
                assert peer.is_control_batch == header.is_control
                assert peer.timestamp_type == int(header.timestamp_type)
                if not header.is_control:
                    assert peer_records == decode_records(one).records()
                checked += 1
    assert checked > 100


# ---- producers, transactions, snapshots ------------------------------------------------------


def test_sequences_are_consecutive_per_producer(generated: tuple[Path, GenerateSummary, int]) -> None:
    root, summary, _ = generated
    for _, log in partition_logs(root, summary):
        next_seq: dict[int, int] = {}
        producers = 0
        for _, chunk in all_batches(log):
            for h in chunk:
                if h.is_control:
                    assert h.base_sequence == -1 and h.records_count == 1 and h.is_transactional
                    continue
                assert h.producer_id >= 0  # --idempotent: every data batch has a producer
                assert h.base_sequence == next_seq.get(h.producer_id, 0)
                next_seq[h.producer_id] = h.last_sequence + 1
        producers = len(next_seq)
        assert producers >= 4


def test_txn_index_has_one_entry_per_abort_with_kafkas_lso(generated: tuple[Path, GenerateSummary, int]) -> None:
    """Recompute every aborted transaction's entry from the log alone: first offset = the
    producer's first transactional batch since its last marker, LSO = first offset of the
    earliest other open transaction at the marker, else marker + 1 (Kafka's
    ``lastStableOffset(completedTxn)``); it must sit in the segment holding the marker."""
    root, summary, _ = generated
    held_back = 0
    for (_, log), expect in zip(partition_logs(root, summary), summary.partitions, strict=True):
        open_first: dict[int, int] = {}
        expected: dict[int, list[AbortedTxn]] = {}
        commits = aborts = 0
        for seg, chunk in all_batches(log):
            control = decode_records(chunk.select(chunk.is_control)) if chunk.is_control.any() else None
            row = 0
            for h in chunk:
                if not h.is_control:
                    if h.is_transactional:
                        open_first.setdefault(h.producer_id, h.base_offset)
                    continue
                kind = ControlRecordType.parse_key(control.key(row))
                row += 1
                first = open_first.pop(h.producer_id)
                if kind == ControlRecordType.ABORT:
                    aborts += 1
                    others = [o for p, o in open_first.items() if p != h.producer_id]
                    lso = min(others) if others else h.base_offset + 1
                    held_back += lso != h.base_offset + 1
                    expected.setdefault(seg.base_offset, []).append(
                        AbortedTxn(h.producer_id, first, h.base_offset, lso)
                    )
                else:
                    assert kind == ControlRecordType.COMMIT
                    commits += 1
        assert not open_first  # every transaction ends before the shutdown
        got = {s.base_offset: s.txn_index.all_aborted_txns() for s in log.segments if s.txn_index.entries}
        assert got == expected
        for s in log.segments:
            assert s.txn_index_path.exists() == (s.base_offset in expected)
        assert (commits, aborts) == (expect.transactions_committed, expect.transactions_aborted)
    assert held_back > 0, "no abort was held back by another open transaction: the LSO rule went untested"


def test_snapshots_equal_a_replay_of_the_log(generated: tuple[Path, GenerateSummary, int]) -> None:
    root, summary, _ = generated
    open_at_roll = 0
    for d, log in partition_logs(root, summary):
        snapshots = list_snapshots(d)
        bases = [s.base_offset for s in log.segments]
        assert [o for o, _ in snapshots] == [*bases[1:], log.log_end_offset]
        for offset, path in snapshots:
            psm = ProducerStateManager()
            for chunk in log.iter_batches(0):
                before = chunk.select(chunk.next_offsets <= offset)
                if len(before):
                    replay_batches(psm, before)
            assert read_snapshot(path) == psm.to_snapshot_entries()
            open_at_roll += sum(e.current_txn_first_offset >= 0 for e in read_snapshot(path))
        # What the cleaner will load: the newest snapshot, nothing left to replay.
        state = log.load_producer_state(DEFAULT_NOW_MS, had_clean_shutdown=True)
        assert state.first_unstable_offset() is None
    assert open_at_roll > 0, "no snapshot holds an open transaction"


def test_log_append_time_topic(generated: tuple[Path, GenerateSummary, int]) -> None:
    root = generated[0]
    d = root / "topic-2-0"
    log = Log.open(d, read_only=True)
    previous = -1
    for chunk in log.iter_batches(0):
        columns = decode_records(chunk)
        assert (columns.timestamps == chunk.max_timestamps[columns.batch]).all()
        assert (chunk.headers["base_timestamp"] <= chunk.max_timestamps).all()
        # The broker's clock stamps append times in order.
        assert (np.diff(chunk.max_timestamps) >= 0).all() and int(chunk.max_timestamps[0]) >= previous
        previous = int(chunk.max_timestamps[-1])
        for h in chunk:
            assert h.timestamp_type == TimestampType.LOG_APPEND_TIME


# ---- determinism and options -----------------------------------------------------------------


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_deterministic_for_a_seed(tmp_path: Path) -> None:
    a = _tree_of(tmp_path / "a", SMALL)
    b = _tree_of(tmp_path / "b", SMALL)
    assert a == b
    c = _tree_of(tmp_path / "c", GeneratorConfig(**{**SMALL.__dict__, "seed": SMALL.seed + 1}))
    assert c.keys() != a.keys() or any(c[k] != a[k] for k in a)
    assert c["meta.properties"] != a["meta.properties"]
    assert a["topic-0-0/00000000000000000000.log"] != c["topic-0-0/00000000000000000000.log"]


def _tree_of(root: Path, config: GeneratorConfig) -> dict[str, bytes]:
    generate(root, config)
    return _tree(root)


def test_plain_producers_and_edge_sizes(tmp_path: Path) -> None:
    summary = generate(
        tmp_path / "d",
        GeneratorConfig(topics=1, partitions=1, records=300, keys=1, key_skew=0, value_bytes=0, compression="zstd"),
    )
    (p,) = summary.partitions
    assert p.distinct_keys == 1 and p.transactions_committed == 0
    log = Log.open(tmp_path / "d" / "topic-0-0", read_only=True)
    for chunk in log.iter_batches(0):
        assert (chunk.producer_ids == -1).all()
        values = decode_records(chunk).records()
        assert {r.value for r in values} <= {b"", None}
    empty = generate(tmp_path / "e", GeneratorConfig(topics=1, partitions=1, records=0))
    assert empty.partitions[0].log_end_offset == 0
    assert (tmp_path / "e" / "topic-0-0" / "00000000000000000000.log").stat().st_size == 0
    assert list_snapshots(tmp_path / "e" / "topic-0-0") == []  # Kafka snapshots only past the log start


def test_refuses_a_non_empty_dir_and_bad_options(tmp_path: Path) -> None:
    (tmp_path / "x").write_bytes(b"broker data")
    with pytest.raises(FileExistsError, match="not empty"):
        generate(tmp_path, SMALL)
    assert [p.name for p in tmp_path.iterdir()] == ["x"]
    assert (tmp_path / "x").read_bytes() == b"broker data"
    for bad, message in [
        ({"tombstones": 1.5}, "tombstones"),
        ({"topics": 0}, "topics"),
        ({"compression": "brotli"}, "compression"),
        ({"key_skew": -1.0}, "key-skew"),
        ({"topic_prefix": "a b"}, "topic-prefix"),
        ({"segment_bytes": 100}, "segment-bytes"),
    ]:
        with pytest.raises(ValueError, match=message):
            generate(tmp_path / "new", GeneratorConfig(**bad))
        assert not (tmp_path / "new").exists()


# ---- CLI -----------------------------------------------------------------------------------


def test_cli_json_summary(tmp_path: Path) -> None:
    target = tmp_path / "out"
    result = CliRunner().invoke(
        main,
        ["generate", str(target), "--topics", "2", "--partitions", "1", "--records", "300", "--keys", "40",
         "--transactions", "0.3", "--idempotent", "--segment-bytes", "4096", "--seed", "5", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["totals"]["records"] == 600
    assert doc["config"]["idempotent"] is True and doc["config"]["seed"] == 5
    assert [(p["topic"], p["partition"]) for p in doc["partitions"]] == [("topic-0", 0), ("topic-1", 0)]
    assert doc["partitions"][1]["compression"] == "lz4"
    assert sum(f.stat().st_size for f in target.glob("*/*.log")) == doc["totals"]["bytes"]


def test_cli_table_and_progress_lines(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["generate", str(tmp_path / "t"), "--topics", "1", "--records", "2000"])
    assert result.exit_code == 0, result.output
    assert "topic-0-1" in result.stdout and "MiB/s" in result.stdout
    assert "written" in result.stderr


def test_cli_refuses_non_empty_dir_and_bad_options(tmp_path: Path) -> None:
    (tmp_path / "meta.properties").write_text("version=1\n")
    result = CliRunner().invoke(main, ["generate", str(tmp_path), "--records", "10"])
    assert result.exit_code == 2
    assert "not empty" in result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["meta.properties"]
    bad = CliRunner().invoke(main, ["generate", str(tmp_path / "n"), "--tombstones", "2"])
    assert bad.exit_code == 2 and "--tombstones" in bad.stderr
    bad = CliRunner().invoke(main, ["generate", str(tmp_path / "n"), "--compression", "brotli"])
    assert bad.exit_code == 2
    assert not (tmp_path / "n").exists()


def test_the_cli_clock_is_today_unless_pinned(tmp_path: Path) -> None:
    """The quick start's ages read as on a broker's disk today (the library keeps its fixed
    clock for tests); --now-ms pins it."""
    today = CliRunner().invoke(main, ["generate", str(tmp_path / "a"), "--topics", "1", "--partitions", "1",
                                      "--records", "50", "--json"])
    assert today.exit_code == 0, today.output
    now_ms = json.loads(today.stdout)["config"]["now_ms"]
    assert 0 <= time.time() * 1000 - now_ms < 3_600_000 + 60_000 and now_ms % 3_600_000 == 0
    pinned = CliRunner().invoke(main, ["generate", str(tmp_path / "b"), "--topics", "1", "--partitions", "1",
                                       "--records", "50", "--json", "--now-ms", "1700000000000"])
    assert json.loads(pinned.stdout)["config"]["now_ms"] == 1_700_000_000_000
