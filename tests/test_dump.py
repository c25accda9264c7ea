"""``kafka-cleaner dump``: Kafka's dump-log tool over every file of a log dir.

Real broker bytes (``../shared/fixtures/real-kafka``, read-only) must verify clean and
decode as kafka-python decodes them; generated segments check the exact output; damaged
copies check that every problem is listed with file, byte position and offset, and that
nothing is ever written.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import pathlib
import shutil
import struct
import subprocess
import sys
import types
import zlib

import cramjam
import crc32c
import pytest
from click.testing import CliRunner
from kafka import codec as kafka_codec
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.memory_records import MemoryRecords

import cleaner.dump as dump_module
from cleaner.cli import main
from cleaner.dump import NOT_KAFKA, classify
from cleaner.records.builder import assemble_batch, build_batch, build_control_batch
from cleaner.records.compression import CompressionType
from cleaner.records.control import ControlRecordType
from cleaner.records.record import Record
from cleaner.records.varint import encode_varint
from cleaner.storage.index import AbortedTxn, OffsetIndex, TimeIndex, TransactionIndex
from cleaner.storage.producer_state import ProducerSnapshotEntry, write_snapshot

KAFKA_CLEANER = pathlib.Path(sys.executable).parent / "kafka-cleaner"


def run(*args: str | os.PathLike[str]):
    result = CliRunner().invoke(main, ["dump", *map(str, args)])
    # Never a traceback: the only exception is click's own exit.
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def fingerprint(root: pathlib.Path) -> dict[str, tuple[str, float]]:
    return {
        str(p): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def seg(base: int) -> str:
    return f"{base:020d}"


def write_segment(directory: pathlib.Path, base: int, batches: list[bytes], *, name: str | None = None) -> pathlib.Path:
    """A segment as a broker leaves it: .log, an offset-index entry for every batch after the
    first, and a time index ending with the segment's max timestamp."""
    directory.mkdir(parents=True, exist_ok=True)
    stem = name or seg(base)
    log = directory / f"{stem}.log"
    log.write_bytes(b"".join(batches))
    index, time_index = OffsetIndex(base), TimeIndex(base)
    position, best = 0, -1
    for raw in batches:
        first, length = struct.unpack_from(">qi", raw)
        last = first + struct.unpack_from(">i", raw, 23)[0]
        max_ts = struct.unpack_from(">q", raw, 35)[0]
        if position:
            index.append(last, position)
        if max_ts > best:
            best = max_ts
            time_index.maybe_append(max_ts, last)
        position += length + 12
    index.write_to(directory / f"{stem}.index", fsync=False)
    time_index.write_to(directory / f"{stem}.timeindex", fsync=False)
    return log


def records(first: int, n: int, ts: int = 1_000, **kw) -> list[Record]:
    return [Record(first + i, ts + i, f"k{first + i}".encode(), b"v" * (i + 1), **kw) for i in range(n)]


def sample_batches() -> list[bytes]:
    """Offsets 0..14: plain, headers, gzip, a tombstone, a transaction + COMMIT, lz4 with a
    delete horizon, snappy, zstd."""
    return [
        build_batch([Record(0, 1000, b"k", b"v")], partition_leader_epoch=0),  # KAFKA_NOTES §1.6 (a)
        build_batch(
            [Record(1, 1001, b"h", b"x", (("trace", b"1"), ("span", None)))],
            producer_id=9,
            producer_epoch=2,
            base_sequence=5,
        ),
        build_batch(records(2, 3), compression=CompressionType.GZIP),
        build_batch([Record(5, 1005, b"k2", None)]),
        build_batch(records(6, 2), producer_id=7, producer_epoch=1, base_sequence=0, is_transactional=True),
        build_control_batch(
            ControlRecordType.COMMIT, offset=8, producer_id=7, producer_epoch=1, coordinator_epoch=3, timestamp=2000
        ),
        build_batch([Record(9, 1009, b"t", None)], compression=CompressionType.LZ4, delete_horizon_ms=90_000),
        build_batch(records(10, 2), compression=CompressionType.SNAPPY),
        build_batch(records(12, 3), compression=CompressionType.ZSTD),
    ]


@pytest.fixture
def partition(tmp_path: pathlib.Path) -> pathlib.Path:
    """Two segments (the second active), a txn index, a snapshot and the metadata files."""
    pdir = tmp_path / "logs" / "topic-0"
    write_segment(pdir, 0, sample_batches())
    write_segment(pdir, 15, [build_batch(records(15, 4, ts=5000)), build_batch(records(19, 2, ts=6000))])
    txn = TransactionIndex(0)
    txn.append(AbortedTxn(producer_id=7, first_offset=6, last_offset=8, last_stable_offset=6))
    txn.write_to(pdir / f"{seg(0)}.txnindex", fsync=False)
    write_snapshot(
        pdir / f"{seg(15)}.snapshot",
        [ProducerSnapshotEntry(7, 1, 1, 7, 1, 1007, 3, -1), ProducerSnapshotEntry(9, 2, 5, 1, 0, 1001, -1, 4)],
        fsync=False,
    )
    (pdir / "leader-epoch-checkpoint").write_text("0\n2\n0 0\n3 15\n")
    (pdir / "partition.metadata").write_text("version: 0\ntopic_id: qoTh4ps9TJW5spdsLJvqgw")
    root = tmp_path / "logs"
    (root / "cleaner-offset-checkpoint").write_text("0\n1\ntopic 0 15\n")
    (root / "meta.properties").write_text("#\n#Mon Dec 20 20:49:13 CST 2021\nversion=0\nbroker.id=3\n")
    (root / ".lock").write_bytes(b"")
    return pdir


# ---------------------------------------------------------------------------------------
# Real Kafka bytes


@pytest.mark.fixtures
def test_verify_passes_on_every_real_file_and_directory(real_kafka_root: pathlib.Path) -> None:
    before = fingerprint(real_kafka_root)
    paths = [real_kafka_root, *sorted(real_kafka_root.rglob("*"))]
    for path in paths:
        result = run(path, "--verify")
        if path.is_file() and classify(path.name).reason == NOT_KAFKA:  # PROVENANCE.md: nothing to verify
            assert result.exit_code == 2 and "nothing to dump" in result.stderr, f"{path}\n{result.stderr}"
            continue
        assert result.exit_code == 0, f"{path}\n{result.stderr}"
        assert "no problems found" in result.stderr
    assert len(paths) > 250
    assert fingerprint(real_kafka_root) == before


def _peer_batches(path: pathlib.Path) -> list[dict]:
    """Independent decode with kafka-python: per batch, its offsets and every record's sizes."""
    memory = MemoryRecords(path.read_bytes())
    out = []
    while (batch := memory.next_batch()) is not None:
        assert isinstance(batch, DefaultRecordBatch), path
        assert batch.validate_crc(), path
        recs = [(r.offset, -1 if r.key is None else len(r.key), -1 if r.value is None else len(r.value)) for r in batch]
        out.append({"base": batch.base_offset, "last": batch.last_offset, "crc": batch.crc, "records": recs})
    return out


@pytest.mark.fixtures
def test_deep_json_agrees_with_kafka_python_on_every_real_log(real_kafka_root: pathlib.Path, monkeypatch) -> None:
    if not kafka_codec.has_snappy():
        # kafka-python's snappy needs python-snappy (not installed): its own xerial reader runs
        # with cramjam's raw block codec standing in.
        stand_in = types.SimpleNamespace(
            compress=lambda data: bytes(cramjam.snappy.compress_raw(bytes(data))),
            decompress=lambda data: bytes(cramjam.snappy.decompress_raw(bytes(data))),
        )
        monkeypatch.setattr(kafka_codec, "snappy", stand_in)
    logs = sorted(real_kafka_root.rglob("*.log"))
    total = 0
    for log in logs:
        result = run(log, "--deep", "--json")
        assert result.exit_code == 0, result.stderr
        (doc,) = json.loads(result.stdout)
        ours = doc["batches"]
        theirs = _peer_batches(log)
        assert len(ours) == len(theirs) == doc["batchCount"], log
        for mine, peer in zip(ours, theirs, strict=True):
            assert (mine["baseOffset"], mine["lastOffset"], mine["crc"]) == (peer["base"], peer["last"], peer["crc"])
            assert mine["isValid"] is True
            assert mine["count"] == len(mine["records"]) == len(peer["records"]), log
            got = [(r["offset"], r["keySize"], r["valueSize"]) for r in mine["records"]]
            assert got == peer["records"], log
            total += len(got)
        assert doc["validBytes"] == doc["sizeInBytes"] == log.stat().st_size
    assert len(logs) > 40 and total > 40_000


# ---------------------------------------------------------------------------------------
# Generated files: exact output


BATCH_A = (
    "baseOffset: 0 lastOffset: 0 count: 1 baseSequence: -1 lastSequence: -1 producerId: -1 producerEpoch: -1 "
    "partitionLeaderEpoch: 0 isTransactional: false isControl: false deleteHorizonMs: OptionalLong.empty "
    "position: 0 CreateTime: 1000 size: 70 magic: 2 compresscodec: none crc: 1902797193 isvalid: true"
)


def test_log_lines_like_kafka(partition: pathlib.Path) -> None:
    log = partition / f"{seg(0)}.log"
    result = run(log, "--deep")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"Dumping {log}"
    assert lines[1] == "Log starting offset: 0"
    assert lines[2] == BATCH_A
    assert lines[3] == "| offset: 0 CreateTime: 1000 keySize: 1 valueSize: 1 sequence: -1 headerKeys: []"
    assert lines[4].startswith("baseOffset: 1 lastOffset: 1 count: 1 baseSequence: 5 lastSequence: 5 producerId: 9 ")
    assert lines[5] == "| offset: 1 CreateTime: 1001 keySize: 1 valueSize: 1 sequence: 5 headerKeys: [trace,span]"
    assert " compresscodec: gzip " in lines[6]
    assert "| offset: 5 CreateTime: 1005 keySize: 2 valueSize: -1 sequence: -1 headerKeys: []" in lines
    commit = next(line for line in lines if "isControl: true" in line)
    assert commit.startswith("baseOffset: 8 lastOffset: 8 count: 1 baseSequence: -1 lastSequence: -1 producerId: 7 ")
    assert " isTransactional: true isControl: true " in commit and " size: 78 " in commit
    assert (
        "| offset: 8 CreateTime: 2000 keySize: 4 valueSize: 6 sequence: -1 headerKeys: [] "
        "endTxnMarker: COMMIT coordinatorEpoch: 3"
    ) in lines
    horizon = next(line for line in lines if line.startswith("baseOffset: 9 "))
    assert " deleteHorizonMs: OptionalLong[90000] " in horizon and " compresscodec: lz4 " in horizon
    assert sum(line.startswith("baseOffset: ") for line in lines) == 9
    assert sum(line.startswith("| offset: ") for line in lines) == 15
    # Without --deep: batch lines only.
    shallow = run(log).stdout.splitlines()
    assert shallow[2] == BATCH_A and not any(line.startswith("|") for line in shallow)


def test_log_json_fields(partition: pathlib.Path) -> None:
    result = run(partition / f"{seg(0)}.log", "--deep", "--json")
    assert result.exit_code == 0
    (doc,) = json.loads(result.stdout)
    assert doc["type"] == "log" and doc["baseOffset"] == 0 and doc["problems"] == []
    assert doc["batchCount"] == 9 and doc["recordCount"] == 15 and doc["trailingBytes"] == 0
    first = doc["batches"][0]
    assert first == {
        "baseOffset": 0,
        "lastOffset": 0,
        "count": 1,
        "baseSequence": -1,
        "lastSequence": -1,
        "producerId": -1,
        "producerEpoch": -1,
        "partitionLeaderEpoch": 0,
        "isTransactional": False,
        "isControl": False,
        "deleteHorizonMs": None,
        "position": 0,
        "timestampType": "CreateTime",
        "maxTimestamp": 1000,
        "size": 70,
        "magic": 2,
        "compressCodec": "none",
        "crc": 1902797193,
        "isValid": True,
        "records": [
            {
                "offset": 0,
                "timestamp": 1000,
                "keySize": 1,
                "valueSize": 1,
                "sequence": -1,
                "headerKeys": [],
                "isTombstone": False,
                "control": None,
                "isValid": None,
                "crc": None,
            }
        ],
    }
    by_base = {b["baseOffset"]: b for b in doc["batches"]}
    assert [b["compressCodec"] for b in doc["batches"]] == [
        "none", "none", "gzip", "none", "none", "none", "lz4", "snappy", "zstd",
    ]  # fmt: skip
    assert by_base[5]["records"][0]["isTombstone"] is True
    assert by_base[8]["records"][0]["control"] == {"type": "COMMIT", "coordinatorEpoch": 3}
    assert by_base[9]["deleteHorizonMs"] == 90_000 and by_base[9]["records"][0]["timestamp"] == 1009
    assert [r["offset"] for r in by_base[12]["records"]] == [12, 13, 14]
    positions = [b["position"] for b in doc["batches"]]
    assert positions == sorted(positions) and positions[0] == 0


def test_index_files_snapshot_and_checkpoints(partition: pathlib.Path) -> None:
    root = partition.parent
    index = OffsetIndex.read(partition / f"{seg(0)}.index", 0)
    lines = run(partition / f"{seg(0)}.index").stdout.splitlines()
    assert lines[1:] == [f"offset: {o} position: {p}" for o, p in zip(index.offsets, index.positions, strict=True)]
    assert lines[1] == "offset: 1 position: 70"
    assert run(partition / f"{seg(15)}.timeindex").stdout.splitlines()[1:] == [
        "timestamp: 5003 offset: 18",
        "timestamp: 6001 offset: 20",
    ]
    assert run(partition / f"{seg(0)}.txnindex").stdout.splitlines()[1:] == [
        "version: 0 producerId: 7 firstOffset: 6 lastOffset: 8 lastStableOffset: 6"
    ]
    assert run(partition / f"{seg(15)}.snapshot").stdout.splitlines()[1:] == [
        "producerId: 7 producerEpoch: 1 coordinatorEpoch: 3 currentTxnFirstOffset: OptionalLong.empty "
        "lastTimestamp: 1007 firstSequence: 0 lastSequence: 1 lastOffset: 7 offsetDelta: 1 timestamp: 1007",
        "producerId: 9 producerEpoch: 2 coordinatorEpoch: -1 currentTxnFirstOffset: OptionalLong[4] "
        "lastTimestamp: 1001 firstSequence: 5 lastSequence: 5 lastOffset: 1 offsetDelta: 0 timestamp: 1001",
    ]
    assert run(partition / "leader-epoch-checkpoint").stdout.splitlines()[1:] == [
        "version: 0",
        "epoch: 0 startOffset: 0",
        "epoch: 3 startOffset: 15",
    ]
    assert run(root / "cleaner-offset-checkpoint").stdout.splitlines()[1:] == [
        "version: 0",
        "topic: topic partition: 0 offset: 15",
    ]
    assert run(root / "meta.properties").stdout.splitlines()[1:] == ["version: 0 broker.id: 3"]
    assert run(partition / "partition.metadata").stdout.splitlines()[1:] == [
        "version: 0 topic_id: qoTh4ps9TJW5spdsLJvqgw"
    ]
    lock = run(root / ".lock")
    assert lock.exit_code == 0 and lock.stdout == f"Skipping {root / '.lock'}: the log dir lock file\n"
    (doc,) = json.loads(run(partition / f"{seg(15)}.snapshot", "--json").stdout)
    assert doc["entries"][1]["currentTxnFirstOffset"] == 4 and doc["entryCount"] == 2


def test_verify_a_whole_log_dir_and_json_document(partition: pathlib.Path) -> None:
    root = partition.parent
    before = fingerprint(root)
    result = run(root, "--verify", "--deep", "--json")
    assert result.exit_code == 0, result.stderr
    docs = json.loads(result.stdout)
    names = [pathlib.Path(d["path"]).name for d in docs]
    # Sorted, with each .log before its indexes.
    assert names.index(f"{seg(0)}.log") < names.index(f"{seg(0)}.index") < names.index(f"{seg(15)}.log")
    types = {pathlib.Path(d["path"]).name: d["type"] for d in docs}
    assert types[".lock"] == "skipped" and types["meta.properties"] == "meta-properties"
    for d in docs:
        assert {"path", "type", "notes", "problems"} <= d.keys() and d["problems"] == []
    index_doc = next(d for d in docs if d["path"].endswith(f"{seg(0)}.index"))
    assert index_doc["notes"] == [f"verified against {seg(0)}.log: ok"] and index_doc["active"] is False
    assert next(d for d in docs if d["path"].endswith(f"{seg(15)}.timeindex"))["active"] is True
    assert fingerprint(root) == before


def test_console_script_on_a_partition_directory(partition: pathlib.Path) -> None:
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    proc = subprocess.run(
        [str(KAFKA_CLEANER), "dump", str(partition), "--verify", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    docs = json.loads(proc.stdout)
    assert sum(d["type"] == "log" for d in docs) == 2
    bad = partition / f"{seg(15)}.log"
    data = bytearray(bad.read_bytes())
    data[-1] ^= 0xFF
    bad.write_bytes(bytes(data))
    proc = subprocess.run([str(KAFKA_CLEANER), "dump", str(bad)], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"{bad}: byte " in proc.stderr and "record is corrupt (stored crc = " in proc.stderr


def test_large_batches_and_small_read_buffer_give_the_same_dump(tmp_path: pathlib.Path, monkeypatch) -> None:
    big = [Record(i, 1000 + i, f"key{i}".encode(), bytes([i]) * 300) for i in range(20)]
    shifted = [Record(50 + r.offset, r.timestamp, r.key, r.value) for r in big]
    batches = [build_batch(big), build_batch(records(20, 30)), build_batch(shifted)]  # 6 KiB, 1 KiB, 6 KiB
    log = write_segment(tmp_path / "p-0", 0, batches)
    reads: list[int] = []
    real_pread = dump_module._pread

    def spy(fd: int, n: int, position: int) -> bytes:
        reads.append(n)
        return real_pread(fd, n, position)

    monkeypatch.setattr(dump_module, "_pread", spy)
    small = run(log, "--deep", "--verify", "--read-buffer-bytes", "1024")
    assert small.exit_code == 0, small.stderr
    assert max(reads) <= max(len(b) for b in batches) and len(reads) > 3
    reads.clear()
    default = run(log, "--deep", "--verify")
    assert default.stdout == small.stdout and len(reads) == 1


def test_legacy_message_sets(tmp_path: pathlib.Path) -> None:
    def message(offset: int, magic: int, key: bytes | None, value: bytes | None, ts: int, attributes: int = 0) -> bytes:
        body = struct.pack(">bb", magic, attributes) + (struct.pack(">q", ts) if magic == 1 else b"")
        for field in (key, value):
            body += struct.pack(">i", -1) if field is None else struct.pack(">i", len(field)) + field
        msg = struct.pack(">I", zlib.crc32(body)) + body
        return struct.pack(">qi", offset, len(msg)) + msg

    inner = message(0, 1, b"a", b"1", 500) + message(1, 1, b"b", None, 501)  # relative inner offsets
    wrapper = message(4, 1, None, gzip.compress(inner), 501, attributes=1)  # offset = last inner offset
    data = message(0, 0, b"x", b"yy", -1) + message(1, 1, b"k", b"v", 400) + wrapper
    log = tmp_path / "old-0" / f"{seg(0)}.log"
    log.parent.mkdir()
    log.write_bytes(data)
    result = run(log, "--deep", "--verify")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[2] == f"no {seg(0)}.index next to this segment (a broker rebuilds a missing offset index)"
    del lines[2]
    assert lines[2].startswith("offset: 0 position: 0 NoTimestampType: -1 size: 29 magic: 0 compresscodec: none crc: ")
    assert lines[3].startswith("| offset: 0 NoTimestampType: -1 keySize: 1 valueSize: 2 isValid: true crc: ")
    assert lines[4].startswith("offset: 1 position: 29 CreateTime: 400 size: 36 magic: 1 compresscodec: none ")
    assert lines[6].startswith("offset: 4 position: 65 CreateTime: 501 ") and " compresscodec: gzip " in lines[6]
    assert lines[7].startswith("| offset: 3 CreateTime: 500 keySize: 1 valueSize: 1 isValid: true")
    assert lines[8].startswith("| offset: 4 CreateTime: 501 keySize: 1 valueSize: -1 isValid: true")


def test_temp_suffixes_and_kraft_snapshots_are_dumped_as_their_inner_type(tmp_path: pathlib.Path) -> None:
    pdir = tmp_path / "t-0"
    write_segment(pdir, 0, [build_batch(records(0, 2))])
    for name in (f"{seg(0)}.log", f"{seg(0)}.index"):
        shutil.copy(pdir / name, pdir / f"{name}.swap")
    shutil.copy(pdir / f"{seg(0)}.log", pdir / f"{seg(2)}-{1:010d}.checkpoint")
    swap = run(pdir / f"{seg(0)}.log.swap", "--verify", "--json")
    assert swap.exit_code == 0, swap.stderr
    (doc,) = json.loads(swap.stdout)
    assert doc["type"] == "log" and doc["batchCount"] == 1
    assert doc["notes"] == [f"{seg(0)}.index.swap verified against this log: ok"]
    assert json.loads(run(pdir / f"{seg(0)}.index.swap", "--json").stdout)[0]["type"] == "offset-index"
    kraft = run(pdir / f"{seg(2)}-{1:010d}.checkpoint", "--verify")
    assert kraft.exit_code == 0 and "Snapshot end offset: 2, epoch: 1" in kraft.stdout
    assert run(tmp_path / "missing").exit_code == 2


def test_active_segment_preallocated_index_tail(tmp_path: pathlib.Path) -> None:
    pdir = tmp_path / "p-0"
    write_segment(pdir, 0, [build_batch(records(0, 2)), build_batch(records(2, 2))])
    write_segment(pdir, 4, [build_batch(records(4, 2)), build_batch(records(6, 2))])
    for base in (0, 4):  # a live broker's active index: 10 MiB preallocated, zeros after the entries
        for ext, size in ((".index", 8), (".timeindex", 12)):
            path = pdir / f"{seg(base)}{ext}"
            path.write_bytes(path.read_bytes() + bytes(size * 100))
    result = run(pdir, "--verify")
    assert result.exit_code == 1
    problem_files = {line.split(":")[0] for line in result.stderr.splitlines() if line.startswith(str(pdir))}
    # Only the closed segment's zero tails are problems; the active one's are noted.
    assert problem_files == {str(pdir / f"{seg(0)}.index"), str(pdir / f"{seg(0)}.timeindex")}
    assert "zero-filled entries after entry 0 ignored" in run(pdir / f"{seg(4)}.index").stdout


# ---------------------------------------------------------------------------------------
# Damaged copies: every problem listed, nothing written


def damaged_copy(partition: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    copy = tmp_path / "copy" / partition.name
    shutil.copytree(partition, copy)
    return copy


def problems(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if not line.startswith(("verified ", "1 problem", "2 problem"))]


def positions_of(log: pathlib.Path) -> list[int]:
    (doc,) = json.loads(run(log, "--json").stdout)
    return [b["position"] for b in doc["batches"]]


def test_flipped_bytes_in_two_batches_are_both_listed(partition: pathlib.Path, tmp_path: pathlib.Path) -> None:
    pdir = damaged_copy(partition, tmp_path)
    log = pdir / f"{seg(0)}.log"
    pos = positions_of(log)
    data = bytearray(log.read_bytes())
    data[pos[2] + 75] ^= 0x55  # inside the deflate stream of the gzip batch at offset 2
    data[pos[7] + 40] ^= 0x01  # maxTimestamp of the snappy batch at offset 10
    log.write_bytes(bytes(data))
    before = fingerprint(pdir)
    result = run(log, "--verify")
    assert result.exit_code == 1
    found = problems(result)
    assert f"{log}: byte {pos[2]}, offset 2: record is corrupt (stored crc = " in found[0]
    assert any(p.startswith(f"{log}: byte {pos[2]}, offset 2: cannot decompress batch") for p in found)
    assert any(p.startswith(f"{log}: byte {pos[7]}, offset 10: record is corrupt") for p in found)
    # The scan went on: every batch is still printed, the bad ones marked.
    assert result.stdout.count("isvalid: false") == 2 and result.stdout.count("baseOffset: ") == 9
    assert result.stderr.splitlines()[-1].endswith("found in 1 of 1 file(s)")
    assert fingerprint(pdir) == before
    # Without --verify the CRC problems are still errors (exit 1), never a traceback.
    plain = run(log)
    assert plain.exit_code == 1 and plain.stdout.count("isvalid: false") == 2


def test_structurally_bad_record_with_valid_crc(tmp_path: pathlib.Path) -> None:
    good = build_batch(records(0, 2))
    body = encode_varint(50) + b"\x00\x00\x00\x02k1\x02v\x00"  # declared length 50, 9 bytes follow
    bad = assemble_batch(
        base_offset=2,
        last_offset_delta=0,
        attributes=0,
        base_timestamp=1000,
        max_timestamp=1000,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        records_count=1,
        records=body,
    )
    outside = bytearray(build_batch([Record(7, 1000, b"a", b"b")], base_offset=4, last_offset_delta=3))
    struct.pack_into(">i", outside, 23, 1)  # lastOffsetDelta 1: the record at delta 3 lies outside
    struct.pack_into(">I", outside, 17, crc32c.crc32c(bytes(outside[21:])))
    outside = bytes(outside)
    log = write_segment(tmp_path / "p-0", 0, [good, bad, outside, build_batch(records(8, 1))])
    result = run(log, "--verify")
    assert result.exit_code == 1
    found = problems(result)
    # An uncompressed batch's record problem points at the record itself (61 bytes into the batch).
    assert found[0] == f"{log}: byte {len(good) + 61}, offset 2: record of 50 bytes extends beyond its batch"
    assert found[1] == f"{log}: byte {len(good) + len(bad)}, offset 7: record offset 7 lies outside its batch [4, 5]"
    assert len(found) == 2 and result.stdout.count("baseOffset: ") == 4
    deep = run(log, "--deep")  # --deep decodes too: the bad batch is reported, the others printed
    assert deep.exit_code == 1 and "| offset: 8 " in deep.stdout


def test_truncated_and_zero_filled_tails(partition: pathlib.Path, tmp_path: pathlib.Path) -> None:
    pdir = damaged_copy(partition, tmp_path)
    log = pdir / f"{seg(15)}.log"
    data = log.read_bytes()
    pos = positions_of(log)
    log.write_bytes(data[:-10])
    result = run(log, "--verify")
    assert result.exit_code == 1
    missing = len(data) - 10 - pos[1]
    assert problems(result)[0] == (
        f"{log}: byte {pos[1]}, offset 19: truncated batch: the file ends {missing} byte(s) into it "
        f"of the {len(data) - pos[1]} the batch needs"
    )
    assert f"Found {missing} invalid bytes at the end of {log.name}" in result.stdout
    # The index entry that pointed at the lost batch is now beyond the log.
    assert any(p.startswith(f"{pdir / seg(15)}.index: byte 0, offset 20: ") and "beyond the log" in p
               for p in problems(result))  # fmt: skip
    log.write_bytes(data + bytes(4096))
    result = run(log, "--verify")
    assert problems(result)[0] == (
        f"{log}: byte {len(data)}, offset 0: record size 0 is smaller than the minimum record overhead (14)"
    )
    assert "zero-filled tail: the 4096 bytes from position" in problems(result)[1]
    assert result.stdout.count("baseOffset: ") == 2


def test_bad_magic_stops_the_scan_but_keeps_what_came_before(partition: pathlib.Path, tmp_path: pathlib.Path) -> None:
    pdir = damaged_copy(partition, tmp_path)
    log = pdir / f"{seg(0)}.log"
    pos = positions_of(log)
    data = bytearray(log.read_bytes())
    data[pos[4] + 16] = 7
    log.write_bytes(bytes(data))
    result = run(log, "--json")
    assert result.exit_code == 1
    (doc,) = json.loads(result.stdout)
    assert len(doc["batches"]) == 4 and doc["validBytes"] == pos[4]
    assert doc["problems"][0] == {"path": str(log), "position": pos[4], "offset": 6, "reason": "invalid magic byte 7"}
    assert doc["problems"][1]["reason"].startswith(f"the {len(data) - pos[4]} bytes from position {pos[4]}")


def test_offsets_and_file_name_checks(tmp_path: pathlib.Path) -> None:
    log = tmp_path / "p-0" / f"{seg(6)}.log"  # named for base offset 6, but the first batch starts at 5
    log.parent.mkdir()
    log.write_bytes(build_batch(records(5, 3)) + build_batch(records(7, 2)) + build_batch(records(9, 1)))
    result = run(log, "--verify")
    found = problems(result)
    assert result.exit_code == 1
    assert found[0].startswith(f"{log}: byte 0, offset 5: the first batch's base offset 5 is below the segment's")
    assert any("offset 7: offsets not increasing: batch baseOffset 7 follows lastOffset 7" in p for p in found)
    assert run(log).exit_code == 0  # these are --verify checks


def test_index_pointing_beyond_the_log_or_inside_a_batch(partition: pathlib.Path, tmp_path: pathlib.Path) -> None:
    pdir = damaged_copy(partition, tmp_path)
    log = pdir / f"{seg(0)}.log"
    pos = positions_of(log)
    index = OffsetIndex(0)
    index.append(1, pos[1])
    index.append(2, pos[2] + 5)  # not a batch start
    index.append(40, pos[8])  # beyond the log's last offset (14)
    index.write_to(pdir / f"{seg(0)}.index", fsync=False)
    time_index = TimeIndex(0)
    time_index.maybe_append(1001, 1)  # closed segment: the last entry should carry 2000
    time_index.write_to(pdir / f"{seg(0)}.timeindex", fsync=False)
    before = fingerprint(pdir)
    for target in (pdir / f"{seg(0)}.index", log, pdir):
        result = run(target, "--verify")
        assert result.exit_code == 1
        found = problems(result)
        idx = pdir / f"{seg(0)}.index"
        assert f"{idx}: byte 8, offset 2: entry 1: position {pos[2] + 5} is not the start of a batch" in found
        assert any(p.startswith(f"{idx}: byte 16, offset 40: entry 2: offset 40 is beyond the log") for p in found)
        if target != idx:
            tidx = pdir / f"{seg(0)}.timeindex"
            assert any(p.startswith(f"{tidx}: byte 0, offset 1: last entry has timestamp 1001") for p in found)
    assert fingerprint(pdir) == before
    # Without --verify the index alone is still checked for its own consistency only.
    assert run(pdir / f"{seg(0)}.index").exit_code == 0


def test_corrupt_snapshot_checkpoint_and_index_files(partition: pathlib.Path, tmp_path: pathlib.Path) -> None:
    pdir = damaged_copy(partition, tmp_path)
    snap = pdir / f"{seg(15)}.snapshot"
    data = bytearray(snap.read_bytes())
    data[20] ^= 0xFF
    snap.write_bytes(bytes(data))
    result = run(snap)
    assert result.exit_code == 1
    assert problems(result)[0].startswith(f"{snap}: byte 2: Snapshot is corrupt (CRC is no longer valid)")
    epochs = pdir / "leader-epoch-checkpoint"
    epochs.write_text("0\n2\n0 0\n3\n")
    assert problems(run(epochs))[0] == f"{epochs}: byte 8: line 4: malformed line '3'"
    index = pdir / f"{seg(0)}.index"
    index.write_bytes(index.read_bytes() + b"\x00\x00\x00")
    result = run(index, "--json")
    assert result.exit_code == 1
    (doc,) = json.loads(result.stdout)
    assert "not a multiple of 8" in doc["problems"][0]["reason"] and doc["entryCount"] > 0
    # A directory with every damage: all listed, one line each, exit 1, nothing changed.
    before = fingerprint(pdir)
    result = run(pdir, "--verify", "--json")
    assert result.exit_code == 1
    docs = json.loads(result.stdout)
    assert sorted(pathlib.Path(p["path"]).name for d in docs for p in d["problems"]) == sorted(
        [snap.name, epochs.name, index.name]
    )
    assert fingerprint(pdir) == before
