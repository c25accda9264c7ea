"""``LogSegment.first_batch_timestamp`` (Kafka's ``getFirstBatchTimestamp``) drives the max
compaction lag: the manager asks it of every dirty segment in every scan and every plan. Kafka
loads only a v2 batch's header for it; so must we, and give the same answer as the whole batch."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import pytest

from cleaner.errors import CorruptRecordError
from cleaner.generate import GeneratorConfig, generate
from cleaner.records.batch import MAGIC_OFFSET, RECORD_BATCH_OVERHEAD
from cleaner.storage.log import Log
from cleaner.storage.log_dir import LogDirectory
from cleaner.storage.segment import LogSegment

NOW_MS = 1_700_000_000_000


def _segments(root: Path) -> list[LogSegment]:
    out = []
    for d in sorted(LogDirectory(root, read_only=True).partition_dirs().values()):
        out.extend(Log.open(d, read_only=True).segments)
    return out


def _partition_segments(partition: Path) -> list[LogSegment]:
    return Log.open(partition, read_only=True).segments


def _timestamps_and_reads(segments: list[LogSegment], monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    read = os.pread
    counted = [0]

    def counting(fd: int, size: int, position: int) -> bytes:
        data = read(fd, size, position)
        counted[0] += len(data)
        return data

    out = []
    with monkeypatch.context() as m:
        m.setattr(os, "pread", counting)
        for s in segments:
            counted[0] = 0
            out.append((s.first_batch_timestamp(), counted[0]))
    return out


def test_a_v2_segment_is_read_as_far_as_its_first_header(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "kafka-logs"
    # Every codec, first batches of several KiB (values of 2 KiB), transactional ones among them.
    generate(root, GeneratorConfig(now_ms=NOW_MS, topics=5, partitions=1, records=1_500, keys=300, value_bytes=2_000,
                                   compression="mixed", transactions=0.3, segment_bytes=64 * 1024, seed=5))
    segments = _segments(root)
    assert len(segments) > 20
    whole = [s.first_batch() for s in segments]
    assert sum(int(b.sizes[0]) for b in whole) > 10 * RECORD_BATCH_OVERHEAD * len(whole)  # more than headers
    got = _timestamps_and_reads(segments, monkeypatch)
    assert [ts for ts, _ in got] == [int(b.max_timestamps[0]) for b in whole]
    assert {n for _, n in got} == {RECORD_BATCH_OVERHEAD}


def test_what_real_brokers_wrote_has_the_whole_first_batchs_timestamp(real_kafka_root: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Every segment of the real brokers' dirs, legacy message formats among them (read whole, as before)."""
    segments = [s for root in sorted(p.parent for p in real_kafka_root.rglob("*.log") if p.parent.name[-1].isdigit())
                for s in _partition_segments(root)]
    assert len(segments) > 10
    expected = [int(b.max_timestamps[0]) if (b := s.first_batch()) is not None and len(b) else 2**63 - 1
                for s in segments]
    assert [ts for ts, _ in _timestamps_and_reads(segments, monkeypatch)] == expected


def test_a_truncated_first_batch_is_judged_by_the_reader_as_before(tmp_path: Path) -> None:
    root = tmp_path / "kafka-logs"
    generate(root, GeneratorConfig(now_ms=NOW_MS, topics=1, partitions=1, records=200, keys=50, value_bytes=500,
                                   compression="none", segment_bytes=1 << 20, seed=1))
    (segment,) = _segments(root)
    first = segment.first_batch()
    os.truncate(segment.log_path, int(first.sizes[0]) - 1)
    cut = LogSegment(segment.log_path.parent, segment.base_offset)
    with pytest.raises(Exception, match="truncated"):
        cut.first_batch_timestamp()


def test_a_legacy_entry_gives_its_own_timestamp(tmp_path: Path) -> None:
    """Message format v1 (brokers before 0.11): no batch header to read, the entry is read whole."""
    partition = tmp_path / "legacy-0"
    partition.mkdir()
    entries = b""
    for offset, ts in ((0, NOW_MS - 5), (1, NOW_MS)):
        body = struct.pack(">bbq", 1, 0, ts) + struct.pack(">i", -1) + struct.pack(">i", 3) + b"abc"
        message = struct.pack(">I", zlib.crc32(body)) + body
        entries += struct.pack(">qi", offset, len(message)) + message
    (partition / "00000000000000000000.log").write_bytes(entries)
    (segment,) = _partition_segments(partition)
    assert segment.first_batch_timestamp() == NOW_MS - 5


def test_an_unknown_magic_is_refused_as_before(tmp_path: Path) -> None:
    root = tmp_path / "kafka-logs"
    generate(root, GeneratorConfig(now_ms=NOW_MS, topics=1, partitions=1, records=200, keys=50, value_bytes=500,
                                   compression="none", segment_bytes=1 << 20, seed=1))
    (segment,) = _segments(root)
    with open(segment.log_path, "r+b") as f:
        f.seek(MAGIC_OFFSET)
        f.write(b"\x03")
    with pytest.raises(CorruptRecordError, match="magic"):
        LogSegment(segment.log_path.parent, segment.base_offset).first_batch_timestamp()
