"""The ``replicas`` section of the sidecar's ``/status`` (issue 14, item 5), on generated log
dirs: offsets and section sizes as the files say, probes that are the batches the log holds
at those offsets and only in the dirty section below the high watermark, the same probes from
a byte copy of the log dir (another in-sync replica), and the 64 KiB bound."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sidecar_helpers import NOW_MS, new_sidecar, next_scan, write_policy

from cleaner.cleaning import PartitionStatus, clean
from cleaner.clock import MockTime
from cleaner.config import load_policy
from cleaner.engine.manager import PartitionReport
from cleaner.replica_facts import PROBE_ALIGNMENT, BatchProbe, ReplicaFacts, replica_facts
from cleaner.sidecar.report import MAX_REPLICA_BYTES, MAX_STATUS_BYTES, replica_section
from cleaner.storage.log import Log
from cleaner.storage.topic_partition import TopicPartition

MakeLogDir = Callable[..., Path]


def _batches(partition_dir: Path) -> list[tuple[int, int, int]]:
    log = Log.open(partition_dir)
    try:
        return [(int(b), int(last), int(crc)) for chunk in log.iter_batches(0)
                for b, last, crc in zip(chunk.base_offsets, chunk.last_offsets, chunk.headers["crc"], strict=True)]
    finally:
        log.close()


def _expected_probes(partition_dir: Path, first_dirty: int, hw: int) -> list[list[int]]:
    batches = _batches(partition_dir)
    wanted = sorted({o for o in (hw - 1, (hw - 1) // PROBE_ALIGNMENT * PROBE_ALIGNMENT) if o >= first_dirty})
    out: list[list[int]] = []
    for offset in wanted:
        batch = next(b for b in batches if b[1] >= offset)
        if list(batch) not in out and batch[1] < hw:
            out.append(list(batch))
    return out


def _replicas(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{e['topic']}-{e['partition']}": e for e in doc["replicas"]["partitions"]}


def test_replica_facts_are_what_the_files_say(tmp_path: Path, make_log_dir: MakeLogDir) -> None:
    data = make_log_dir(records=4_000)
    policy = write_policy(tmp_path / "p.yaml", mode="observe")
    # One partition cleaned (a clean section below its checkpoint), the others never.
    clean([data], load_policy(policy), MockTime(NOW_MS), only=lambda tp: tp == TopicPartition("topic-0", 1))
    doc = next_scan(new_sidecar(policy, [data]))

    replicas = _replicas(doc)
    assert sorted(replicas) == ["topic-0-0", "topic-0-1", "topic-1-0", "topic-1-1"]
    assert doc["replicas"]["omitted"] == 0
    for name, entry in replicas.items():
        partition_dir = data / name
        batches = _batches(partition_dir)
        size = sum(f.stat().st_size for f in partition_dir.glob("*.log"))
        assert entry["logStartOffset"] == batches[0][0]
        assert entry["logEndOffset"] == entry["highWatermark"] == batches[-1][1] + 1
        assert entry["cleanBytes"] + entry["dirtyBytes"] == size
        assert entry["batches"] == _expected_probes(partition_dir, entry["firstDirtyOffset"], entry["highWatermark"])
        assert entry["batches"], name  # each generated partition has a dirty section with batches
    cleaned, dirty = replicas["topic-0-1"], replicas["topic-0-0"]
    assert cleaned["firstDirtyOffset"] > 0 and cleaned["cleanBytes"] > 0
    assert all(b[0] >= cleaned["firstDirtyOffset"] for b in cleaned["batches"])
    assert (dirty["firstDirtyOffset"], dirty["cleanBytes"]) == (0, 0)


def test_a_byte_copy_of_the_log_dir_reports_the_same_probes(tmp_path: Path, make_log_dir: MakeLogDir) -> None:
    """Two in-sync replicas hold the leader's batches byte for byte: a copy is one."""
    data = make_log_dir(records=2_000)
    copy = tmp_path / "replica-2"
    shutil.copytree(data, copy)
    policy = write_policy(tmp_path / "p.yaml", mode="observe")
    one = _replicas(next_scan(new_sidecar(policy, [data])))
    two = _replicas(next_scan(new_sidecar(policy, [copy])))
    assert one == two


def _status(topic: str, partition: int) -> PartitionStatus:
    report = PartitionReport("/data", TopicPartition(topic, partition), compacted=True)
    facts = ReplicaFacts(0, 10**9, 10**9, 10**8, 10**10, 10**10,
                         (BatchProbe(10**9 - 1024, 10**9 - 1, 2**32 - 1), BatchProbe(999_999_488, 999_999_500, 7)))
    return PartitionStatus(report, None, NOW_MS, replica=facts)


def test_the_section_is_bounded_and_brokers_pick_the_same_partitions() -> None:
    """Thousands of compacted partitions: the section keeps to its share, and two brokers that
    hold overlapping sets of partitions mostly pick the partitions they share alike."""
    first = [_status(f"orders-{t}", p) for t in range(40) for p in range(50)]
    second = [_status(f"orders-{t}", p) for t in range(20, 60) for p in range(50)]
    a = replica_section(first, NOW_MS, MAX_REPLICA_BYTES)
    b = replica_section(second, NOW_MS, MAX_REPLICA_BYTES)
    assert len(json.dumps(a, separators=(",", ":"))) <= MAX_REPLICA_BYTES
    assert a["omitted"] == len(first) - len(a["partitions"]) > 0
    names = [{(e["topic"], e["partition"]) for e in s["partitions"]} for s in (a, b)]
    shared = {(f"orders-{t}", p) for t in range(20, 40) for p in range(50)}
    picked_by_one = (names[0] | names[1]) & shared
    assert len(names[0] & names[1] & shared) >= 0.5 * len(picked_by_one)
    # The next rotation picks others.
    later = replica_section(first, NOW_MS + 10 * 60 * 1000, MAX_REPLICA_BYTES)
    assert {(e["topic"], e["partition"]) for e in later["partitions"]} != names[0]


def test_the_whole_document_stays_under_64_kib(tmp_path: Path, make_log_dir: MakeLogDir) -> None:
    data = make_log_dir(topics=60, partitions=4, records=60, keys=20, segment_bytes=1024 * 1024)
    doc = next_scan(new_sidecar(write_policy(tmp_path / "p.yaml", mode="observe"), [data]))
    assert len(json.dumps(doc, separators=(",", ":"))) <= MAX_STATUS_BYTES
    assert len(doc["replicas"]["partitions"]) + doc["replicas"]["omitted"] == 240
    assert doc["replicas"]["omitted"] > 0


def _thread_rchar() -> int:
    with open("/proc/thread-self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar"))


@pytest.mark.skipif(not Path("/proc/thread-self/io").exists(), reason="needs Linux's /proc/thread-self/io")
def test_probes_read_a_few_hundred_bytes_even_next_to_a_live_brokers_preallocated_index(
        make_log_dir: MakeLogDir) -> None:
    """A live broker's active ``.index`` is preallocated (10 MiB of zeros after the entries):
    the probes binary-search it and walk batch headers, and find the same batches."""
    data = make_log_dir(topics=1, partitions=1, records=6_000, segment_bytes=256 * 1024)
    partition_dir = data / "topic-0-0"
    report = PartitionReport(str(data), TopicPartition("topic-0", 0), compacted=True, log_end_offset=6_000,
                             high_watermark=6_000, size_bytes=1)
    log = Log.open(partition_dir)
    try:
        assert len(log.segments) > 2
        before = replica_facts(log, report).probes
        with open(log.segments[-1].index_path, "r+b") as f:
            f.truncate(10 * 1024 * 1024)
        started = _thread_rchar()
        after = replica_facts(log, report).probes
        read = _thread_rchar() - started
    finally:
        log.close()
    assert after == before and len(after) == 2
    assert [list(p.as_status()) for p in after] == _expected_probes(partition_dir, 0, 6_000)
    assert read < 4096, read
