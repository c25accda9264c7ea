"""Every log segment written by a real broker (Kafka 2.1 .. 3.7, Confluent 7.6, plus two
CodeCrafters tester files) against what its PROVENANCE.md says it holds.

For each ``*.log`` (and ``.log.deleted`` / ``.cleaned`` / ``.swap``, if any) under
``../shared/fixtures/real-kafka``:

- ``scan_batches`` consumes the whole file (a truncated tail only where PROVENANCE says so),
  ``verify_checksums()`` is empty, ``decode_records`` (and the legacy decoder for magic < 2)
  decodes every record;
- batch count, record count, first..last offset, codec counts, magic, batches with a producer
  id, tombstones, offset gaps, control record types, LogAppendTime, leader epochs and the file's
  sha256 equal what the PROVENANCE table states for that file;
- kafka-python and aiokafka (C) decode the same bytes to the same batch headers and records;
- every batch round-trips through ``rebuild_batch`` with all its rows and its own delete horizon:
  byte for byte for uncompressed batches (Kafka's verbatim copy of an unchanged batch) and for
  compressed CreateTime batches (our codecs write Java's bytes); a compressed LogAppendTime batch
  is re-based on its append time, as Kafka's ``MemoryRecordsBuilder`` does, and decodes to the
  same records.

The fixtures are read-only: files are only ever read into memory.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import json
import pathlib
import re
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import cramjam
import numpy as np
import pytest

from cleaner.records.builder import rebuild_batch
from cleaner.records.columns import RecordColumns, decode_records
from cleaner.records.compression import CompressionType, decompress
from cleaner.records.control import ControlRecordType
from cleaner.records.record import Record
from cleaner.records.scan import Batches, scan_batches

kafka_codec = pytest.importorskip("kafka.codec")
kafka_memory = pytest.importorskip("kafka.record.memory_records")
aiokafka_memory = pytest.importorskip("aiokafka.record.memory_records")

pytestmark = pytest.mark.fixtures

# Where the fixtures live, for collecting one test per file; the tests themselves take the
# ``real_kafka_root`` fixture, which skips with a reason when ../shared is absent.
_ROOT = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "real-kafka"
_LOG_NAME = re.compile(r"\.log(\.(deleted|cleaned|swap))?$")


def _log_files(root: pathlib.Path) -> list[pathlib.Path]:
    if not root.is_dir():
        return []
    return sorted(p for p in root.rglob("*") if p.is_file() and _LOG_NAME.search(p.name))


# Without ../shared, one parameter that skips with the reason (pytest's own "got empty
# parameter set" would hide that some 130 cases did not run, and why).
LOG_FILES = [p.relative_to(_ROOT).as_posix() for p in _log_files(_ROOT)] or [
    pytest.param("-", marks=pytest.mark.skip(reason=f"real Kafka fixtures not found at {_ROOT} (../shared): "
                                             "one case per real .log file did not run"))
]


# ---- PROVENANCE.md -------------------------------------------------------------------------------


@dataclass
class Expected:
    """One row of a PROVENANCE table ("what it is" column), parsed."""

    text: str
    sha256: str
    size: int
    batches: int
    records: int
    first_offset: int | None
    last_offset: int | None
    magics: set[int]
    codecs: dict[str, int]
    producer_batches: int = 0
    tombstones: int = 0
    offset_gaps: int = 0
    control_types: dict[str, int] = field(default_factory=dict)
    log_append_time: bool = False
    leader_epochs: set[int] = field(default_factory=set)
    truncated: bool = False


_COUNTS = re.compile(r"(\d+) batches, (\d+) records, offsets (None|-?\d+)\.\.(None|-?\d+)")


def _parse_description(text: str, sha256: str, size: int) -> Expected:
    m = _COUNTS.search(text)
    assert m, f"cannot parse PROVENANCE description: {text!r}"
    offsets = [None if g == "None" else int(g) for g in m.group(3, 4)]
    facts = [part.strip() for part in text.split(";")]
    expected = Expected(
        text=text, sha256=sha256, size=size, batches=int(m.group(1)), records=int(m.group(2)),
        first_offset=offsets[0], last_offset=offsets[1], magics=set(), codecs={},
    )
    for fact in facts[1:]:
        if fact.startswith("magic"):
            expected.magics = {int(x) for x in re.findall(r"\d+", fact)}
        elif fact.startswith("codec "):
            expected.codecs = {name: int(n) for name, n in re.findall(r"([a-z0-9]+):(\d+)", fact)}
        elif m := re.fullmatch(r"(\d+) batches with producer id", fact):
            expected.producer_batches = int(m.group(1))
        elif m := re.fullmatch(r"(\d+) tombstones?", fact):
            expected.tombstones = int(m.group(1))
        elif m := re.match(r"(\d+) offset gaps?", fact):
            expected.offset_gaps = int(m.group(1))
        elif m := re.match(r"control records (\{.*?\})", fact):
            expected.control_types = json.loads(m.group(1))
        elif fact == "LogAppendTime":
            expected.log_append_time = True
        elif fact.startswith("leader epochs"):
            expected.leader_epochs = {int(x) for x in re.findall(r"-?\d+", fact)}
        elif "truncated" in fact:
            expected.truncated = True
        elif fact in ("empty",) or fact.startswith("CRC OK"):
            pass
        else:
            raise AssertionError(f"unknown fact {fact!r} in PROVENANCE description {text!r}: teach the parser")
    return expected


def _provenance(root: pathlib.Path) -> dict[str, Expected]:
    """Every ``.log`` row of every PROVENANCE.md, keyed by the path relative to ``root``."""
    table: dict[str, Expected] = {}
    for provenance in sorted(root.glob("*/PROVENANCE.md")):
        for line in provenance.read_text(encoding="utf-8").splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) != 4 or not _LOG_NAME.search(cells[0]):
                continue
            name, size, sha256, what = cells
            path = (provenance.parent / name).relative_to(root).as_posix()
            table[path] = _parse_description(what, sha256, int(size))
    return table


@pytest.fixture(scope="module")
def provenance(real_kafka_root: pathlib.Path) -> dict[str, Expected]:
    return _provenance(real_kafka_root)


def test_every_log_file_is_described_and_every_described_log_exists(
    real_kafka_root: pathlib.Path, provenance: dict[str, Expected]
) -> None:
    present = {p.relative_to(real_kafka_root).as_posix() for p in _log_files(real_kafka_root)}
    assert present, "no log files in the fixtures"
    assert set(provenance) == present
    assert set(LOG_FILES) == present


def test_provenance_parser_reads_every_fact() -> None:
    e = _parse_description(
        "3 batches, 3 records, offsets 4..17; magic 2; codec none:2, lz4:1; 2 batches with producer id; "
        "1 tombstones; 1 offset gaps (compacted); control records {\"type0\": 1}; LogAppendTime; leader epochs 0, 3; "
        "CRC OK (kafka-python+aiokafka+own)", "ab", 10,
    )
    assert (e.batches, e.records, e.first_offset, e.last_offset) == (3, 3, 4, 17)
    assert e.codecs == {"none": 2, "lz4": 1} and e.magics == {2}
    assert (e.producer_batches, e.tombstones, e.offset_gaps) == (2, 1, 1)
    assert e.control_types == {"type0": 1} and e.log_append_time and e.leader_epochs == {0, 3}
    empty = _parse_description("0 batches, 0 records, offsets None..None; magic ; empty; CRC OK (x)", "", 0)
    assert (empty.first_offset, empty.magics, empty.codecs) == (None, set(), {})
    with pytest.raises(AssertionError, match="unknown fact"):
        _parse_description("1 batches, 1 records, offsets 0..0; magic 2; something new", "", 0)


# ---- what the bytes hold -------------------------------------------------------------------------


@dataclass
class Decoded:
    batches: Batches
    columns: RecordColumns
    records: list[Record]  # every record of the file in order, v2 and legacy


def _decode_file(buf: bytes, path: str) -> Decoded:
    batches = scan_batches(buf, path=path).batches
    columns = decode_records(batches)
    v2_records = iter(columns.records())
    starts = columns.batch_record_starts
    records: list[Record] = []
    v2_index = 0
    for i in range(len(batches)):
        if batches.magic[i] >= 2:
            n = int(starts[v2_index + 1] - starts[v2_index])
            records.extend(next(v2_records) for _ in range(n))
            v2_index += 1
        else:
            records.extend(batches.legacy[i].records(verify_crc=True))
    return Decoded(batches, columns, records)


@contextmanager
def _kafka_python_snappy() -> Iterator[None]:
    """kafka-python's snappy needs python-snappy (not installed): its own xerial reader runs
    with cramjam's raw block decoder standing in."""
    if kafka_codec.has_snappy():
        yield
        return
    stand_in = types.SimpleNamespace(
        compress=lambda data: bytes(cramjam.snappy.compress_raw(bytes(data))),
        decompress=lambda data: bytes(cramjam.snappy.decompress_raw(bytes(data))),
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kafka_codec, "snappy", stand_in)
        yield


def _peer_view(batch: object) -> tuple[tuple, list[Record]]:
    header = (
        batch.base_offset, batch.magic, getattr(batch, "compression_type", None),
        getattr(batch, "timestamp_type", None),
    )
    if batch.magic >= 2:
        header += (
            batch.last_offset_delta, batch.first_timestamp, batch.max_timestamp, batch.producer_id,
            batch.producer_epoch, batch.base_sequence, bool(batch.is_transactional), bool(batch.is_control_batch),
        )
    records = [
        Record(r.offset, -1 if r.timestamp is None else r.timestamp, r.key, r.value,
               tuple((k, v) for k, v in r.headers))
        for r in batch
    ]
    return header, records


def _our_view(batches: Batches, i: int, records: list[Record]) -> tuple[tuple, list[Record]]:
    h = batches.header(i)
    if h.magic < 2:
        entry = batches.legacy[i]
        header = (entry.offset, h.magic, h.compression, None if h.magic == 0 else int(h.timestamp_type))
        return header, records
    header = (
        h.base_offset, h.magic, h.compression, int(h.timestamp_type), h.last_offset_delta, h.base_timestamp,
        h.max_timestamp, h.producer_id, h.producer_epoch, h.base_sequence, h.is_transactional, h.is_control,
    )
    return header, records


def _records_per_batch(decoded: Decoded) -> list[list[Record]]:
    out, pos = [], 0
    counts = decoded.batches.records_counts.tolist()
    for n in counts:
        out.append(decoded.records[pos : pos + n])
        pos += n
    assert pos == len(decoded.records)
    return out


@pytest.mark.parametrize("name", LOG_FILES)
def test_real_segment_matches_its_provenance(
    real_kafka_root: pathlib.Path, provenance: dict[str, Expected], name: str
) -> None:
    path = real_kafka_root / name
    buf = path.read_bytes()  # read-only
    want = provenance[name]
    assert len(buf) == want.size and hashlib.sha256(buf).hexdigest() == want.sha256

    result = scan_batches(buf, path=path)
    if want.truncated:
        assert result.end < len(buf)
    else:
        assert result.end == len(buf), f"{name}: {len(buf) - result.end} bytes left unscanned"
        assert result.next_entry_size is None
    assert "CRC OK" in want.text
    assert result.batches.verify_checksums() == []

    decoded = _decode_file(buf, str(path))
    batches, columns, records = decoded.batches, decoded.columns, decoded.records
    offsets = [r.offset for r in records]

    assert len(batches) == want.batches
    assert len(records) == want.records == int(batches.records_counts.sum())
    assert (offsets[0] if offsets else None, offsets[-1] if offsets else None) == (
        want.first_offset, want.last_offset,
    )
    assert set(batches.magic.tolist()) == want.magics
    codecs = collections.Counter(CompressionType(c).kafka_name for c in batches.compression.tolist())
    assert dict(codecs) == want.codecs
    assert int((batches.producer_ids >= 0).sum()) == want.producer_batches
    assert sum(r.is_tombstone for r in records) == want.tombstones
    legacy_tombstones = sum(r.is_tombstone for i in batches.legacy for r in batches.legacy[i].records())
    assert int(columns.is_tombstone.sum()) + legacy_tombstones == want.tombstones  # the columnar view agrees
    assert sum(b - a != 1 for a, b in itertools.pairwise(offsets)) == want.offset_gaps
    assert all(b > a for a, b in itertools.pairwise(offsets)), "offsets must increase"
    assert bool(batches.is_log_append_time.any()) == want.log_append_time
    assert set(batches.headers["partition_leader_epoch"][batches.is_v2].tolist()) == want.leader_epochs

    control_rows = np.flatnonzero(batches.is_control[columns.batch]) if len(columns) else np.zeros(0, dtype=int)
    control_types = collections.Counter(
        f"type{int(ControlRecordType.parse_key(columns.key(int(r))))}" for r in control_rows
    )
    assert dict(control_types) == want.control_types

    # Batch offsets frame the records: each batch's records lie within [base, last].
    per_batch = _records_per_batch(decoded)
    for i, recs in enumerate(per_batch):
        if recs:
            assert int(batches.base_offsets[i]) <= recs[0].offset
            assert recs[-1].offset <= int(batches.last_offsets[i])


@pytest.mark.parametrize("name", LOG_FILES)
def test_real_segment_reads_the_same_in_kafka_python_and_aiokafka(real_kafka_root: pathlib.Path, name: str) -> None:
    path = real_kafka_root / name
    buf = path.read_bytes()
    decoded = _decode_file(buf, str(path))
    ours = [_our_view(decoded.batches, i, recs) for i, recs in enumerate(_records_per_batch(decoded))]

    with _kafka_python_snappy():
        theirs = []
        for batch in kafka_memory.MemoryRecords(buf):
            assert batch.validate_crc()
            theirs.append(_peer_view(batch))
    assert theirs == ours

    records = aiokafka_memory.MemoryRecords(buf)
    theirs = []
    while records.has_next():
        batch = records.next_batch()
        assert batch.validate_crc()
        theirs.append(_peer_view(batch))
    assert theirs == ours


@pytest.mark.parametrize("name", LOG_FILES)
def test_real_batches_round_trip_through_rebuild(real_kafka_root: pathlib.Path, name: str) -> None:
    path = real_kafka_root / name
    buf = path.read_bytes()
    batches = scan_batches(buf, path=path).batches
    v2 = np.flatnonzero(batches.is_v2)
    columns = decode_records(batches)
    starts = columns.batch_record_starts
    cb = columns.batches  # the v2 batches, in order
    verbatim = compressed = 0
    for j in range(len(cb)):
        h = cb.header(j)
        rows = np.arange(starts[j], starts[j + 1], dtype=np.int64)
        rebuilt = rebuild_batch(columns, j, rows, delete_horizon_ms=h.delete_horizon_ms)
        original = bytes(cb.entry_bytes(j))
        log_append = bool(cb.is_log_append_time[j])
        if h.compression == CompressionType.NONE or not log_append:
            assert rebuilt == original, f"{name}: batch at byte {h.position} (offset {h.base_offset}) changed"
            verbatim += 1
            continue
        # A compressed LogAppendTime batch: re-based on the append time, same records.
        again = scan_batches(rebuilt).batches
        assert again.verify_checksums() == []
        g = again.header(0)
        assert g.base_timestamp == h.max_timestamp
        same = ("base_offset", "partition_leader_epoch", "attributes", "last_offset_delta", "max_timestamp",
                "producer_id", "producer_epoch", "base_sequence", "records_count")
        assert [getattr(g, f) for f in same] == [getattr(h, f) for f in same]
        assert decode_records(again).records() == [columns.record(int(r)) for r in rows]
        section = decompress(h.compression, original[61:])
        rebuilt_section = decompress(g.compression, rebuilt[61:])
        assert len(rebuilt_section) <= len(section)  # only timestamp deltas change (to 0)
        compressed += 1
    assert verbatim + compressed == len(v2)
