"""``kafka-cleaner where``'s parts: Kafka's default partitioner and the key search.

The partitioner is checked against Kafka's own test vectors (``UtilsTest.testMurmur2``) and
against kafka-python's implementation for random keys; the search against a plain decode of
every record of generated segments with every codec, so the digest filter can neither miss a
record of the key nor report another key's.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from cleaner.generate import GeneratorConfig, generate
from cleaner.partitioner import murmur2, partition_for_key
from cleaner.records.columns import decode_records
from cleaner.storage.segment import iter_file_batches
from cleaner.where import find_in_file, where_command

KAFKA_MURMUR2 = {  # org.apache.kafka.common.utils.UtilsTest.testMurmur2
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize(("key", "expected"), KAFKA_MURMUR2.items())
def test_murmur2_is_kafkas(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=1000))
def test_the_partition_is_kafka_pythons(key: bytes, partitions: int) -> None:
    from kafka.partitioner.default import murmur2 as peer

    assert partition_for_key(key, partitions) == (peer(key) & 0x7FFFFFFF) % partitions


def _every_record(path: Path) -> dict[bytes, list[tuple[int, bool]]]:
    out: dict[bytes, list[tuple[int, bool]]] = defaultdict(list)
    for batches in iter_file_batches(path):
        data = batches.select(batches.is_v2 & ~batches.is_control)
        if not len(data):
            continue
        cols = decode_records(data)
        for i in range(len(cols)):
            key = cols.key(i)
            if key is not None:
                out[key].append((int(cols.offsets[i]), bool(cols.is_tombstone[i])))
    return out


def test_the_search_finds_exactly_the_records_of_the_key(tmp_path: Path) -> None:
    generate(tmp_path / "logs", GeneratorConfig(topics=1, partitions=1, records=20_000, keys=500,
                                                segment_bytes=256 << 10, transactions=0.2, seed=7))
    segments = sorted((tmp_path / "logs" / "topic-0-0").glob("*.log"))
    assert len(segments) > 2
    for segment in segments[:3]:
        truth = _every_record(segment)
        assert any(tombstone for records in truth.values() for _, tombstone in records)
        for key in [*sorted(truth)[:40], b"no-such-key", b""]:
            found = [(f.offset, f.tombstone) for f in find_in_file(segment, key)]
            assert found == truth.get(key, []), key


def test_where_names_what_it_needs_and_exits_1_when_nothing_is_found(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    generate(logs, GeneratorConfig(topics=1, partitions=2, records=2_000, seed=3))
    runner = CliRunner()
    unknown = runner.invoke(where_command, [str(logs), "--topic", "topic-0", "--key", "k"])
    assert unknown.exit_code == 2 and "--partitions N or --partition P" in unknown.output
    twice = runner.invoke(where_command, [str(logs), "--topic", "topic-0", "--key", "k", "--key-hex", "6b"])
    assert twice.exit_code == 2 and "give the key once" in twice.output
    none = runner.invoke(where_command, [str(logs), "--topic", "topic-0", "--key", "no-such-key",
                                         "--partitions", "2"])
    assert none.exit_code == 1 and "no record of the key" in none.output


def test_the_table_is_summed_up_for_a_person_on_call(tmp_path: Path) -> None:
    """A hot key has thousands of rows (8,571 for one key of the quick start's data): a line on
    stderr counts them, says what the latest is and how many wait on the active segment, and
    the counts agree with the rows (stdout stays the table alone)."""
    logs = tmp_path / "logs"
    generate(logs, GeneratorConfig(topics=1, partitions=1, records=20_000, keys=50, tombstones=0.1,
                                   segment_bytes=128 << 10, seed=5))
    key = sorted(_every_record(max((logs / "topic-0-0").glob("*.log"))))[0]
    result = CliRunner().invoke(where_command, [str(logs), "--topic", "topic-0", "--key", key.decode(),
                                                "--partitions", "1", "-o", "tsv"])
    assert result.exit_code == 0, result.output
    header, *rows = [line.split("\t") for line in result.stdout.splitlines()]
    assert header[:8] == ["partition", "file", "offset", "timestamp", "kind", "latest", "where", "gone"]
    [line] = [line for line in result.stderr.splitlines() if "record(s) of the key" in line]
    kinds = [(row[4], row[5], row[6]) for row in rows]  # kind, latest, where
    older_values = sum(1 for kind, latest, _ in kinds if kind == "value" and latest == "no")
    older_tombstones = sum(1 for kind, latest, _ in kinds if kind == "tombstone" and latest == "no")
    active = sum(1 for *_, place in kinds if place == "active segment")
    [latest] = [kind for kind, latest, _ in kinds if latest == "yes"]
    assert older_values and older_tombstones and active, kinds
    assert line == (f"where: {len(rows):,} record(s) of the key; the latest a {latest}; "
                    f"{older_values:,} older value(s), {older_tombstones:,} older tombstone(s); "
                    f"{active:,} in the active segment")
