"""Checkpoint framing and the offset checkpoint files: strict parsing, Kafka's exact text,
crash-safe rewrites, and every real Kafka checkpoint."""

from __future__ import annotations

import errno
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cleaner.errors import CorruptCheckpointError
from cleaner.storage import checkpoint as cp
from cleaner.storage import files
from cleaner.storage.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    OFFSET_CHECKPOINT_FILES,
    OffsetCheckpointFile,
    format_offset_checkpoint,
    parse_offset_checkpoint,
    split_fields,
)
from cleaner.storage.topic_partition import TopicPartition as TP

topics = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCXYZ0123456789._-", min_size=1, max_size=40)
offset_maps = st.dictionaries(st.builds(TP, topics, st.integers(0, 2**31 - 1)), st.integers(-1, 2**63 - 1), max_size=30)


def test_file_name_constants():
    assert OFFSET_CHECKPOINT_FILES == (
        "cleaner-offset-checkpoint",
        "recovery-point-offset-checkpoint",
        "log-start-offset-checkpoint",
        "replication-offset-checkpoint",
    )


def test_exact_text():
    data = format_offset_checkpoint({TP("orders", 1): 42, TP("__consumer_offsets", 17): 58, TP("orders", 0): 7})
    assert data == b"0\n3\n__consumer_offsets 17 58\norders 0 7\norders 1 42\n"
    assert format_offset_checkpoint({}) == b"0\n0\n"


@given(offset_maps)
def test_round_trip(entries):
    data = format_offset_checkpoint(entries)
    assert parse_offset_checkpoint(data) == entries
    assert format_offset_checkpoint(parse_offset_checkpoint(data)) == data


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", {}),  # an empty file: no entries
        (b"0\n", {}),  # version line only
        (b"0", {}),
        (b"0\n0\n", {}),
        (b"0\r\n1\r\nt 0 5\r\n", {TP("t", 0): 5}),  # BufferedReader.readLine accepts \r\n
        (b"0\n1\nt\t0   5  \n", {TP("t", 0): 5}),  # \s+ separators, trailing whitespace dropped by split
        (b"0\n1\nt +3 -1\n", {TP("t", 3): -1}),  # Integer.parseInt / Long.parseLong syntax
        (b"0\n2\nt 0 5\nt 0 9\n", {TP("t", 0): 9}),  # duplicates: the last line wins (HashMap.put)
        (b"0\n1\nmy.topic_with-chars 12 34", {TP("my.topic_with-chars", 12): 34}),
    ],
)
def test_parse_accepts_what_kafka_accepts(data, expected):
    assert parse_offset_checkpoint(data) == expected


@pytest.mark.parametrize(
    ("data", "line", "reason"),
    [
        (b"1\n0\n", 1, "unrecognised version 1"),
        (b"x\n0\n", 1, "malformed version"),
        (b"\n0\n", 1, "malformed version"),
        (b"0\nabc\n", 2, "malformed entry-count"),
        (b"0\n-1\n", 2, "negative entry count"),
        (b"0\n2\nt 0 5\n", 2, "expected 2 entries but found 1"),
        (b"0\n1\nt 0 5\nu 1 6\n", 2, "expected 1 entries but found 2"),
        (b"0\n1\nt 0\n", 3, "malformed line"),  # wrong field count
        (b"0\n1\nt 0 5 6\n", 3, "malformed line"),
        (b"0\n1\n t 0 5\n", 3, "malformed line"),  # leading whitespace: an empty first field
        (b"0\n2\nt 0 5\n\n", 4, "malformed line"),  # blank line
        (b"0\n1\nt x 5\n", 3, "partition"),  # non-numeric partition
        (b"0\n1\nt 0 5x\n", 3, "offset"),
        (b"0\n1\nt 2147483648 5\n", 3, "out of range"),  # partition is an int32
        (b"0\n1\nt 0 9223372036854775808\n", 3, "out of range"),
        (b"0\n1\nt 0 \xd9\xa3\n", 3, "not a number"),  # non-ASCII digits
        (b"0\n1\nt\xff 0 5\n", None, "UTF-8"),
    ],
)
def test_parse_rejects_bad_lines(tmp_path, data, line, reason):
    path = tmp_path / CLEANER_OFFSET_CHECKPOINT
    path.write_bytes(data)
    with pytest.raises(CorruptCheckpointError) as info:
        OffsetCheckpointFile(path).read()
    error = info.value
    assert error.path == str(path)
    assert reason in error.reason
    if line is not None:
        assert error.reason.startswith(f"line {line}:")
        # position is the byte offset of that line
        assert error.position == sum(len(x) + 1 for x in data.split(b"\n")[: line - 1])
    assert path.read_bytes() == data  # bad input is never modified


def test_split_fields_is_java_split():
    assert split_fields("a 1 2") == ["a", "1", "2"]
    assert split_fields("a 1 2  ") == ["a", "1", "2"]
    assert split_fields("  a 1") == ["", "a", "1"]
    assert split_fields("") == [""]
    assert split_fields("a\x0b1\x0c2") == ["a", "1", "2"]
    assert split_fields("a\u00a01 2") == ["a\u00a01", "2"]  # \s is ASCII whitespace only


def test_write_rejects_unwritable_topics(tmp_path):
    f = OffsetCheckpointFile(tmp_path / CLEANER_OFFSET_CHECKPOINT)
    with pytest.raises(ValueError):
        f.write({TP("has space", 0): 1})
    with pytest.raises(ValueError):
        f.write({TP("", 0): 1})
    assert not f.exists()


def test_read_missing_file_never_creates_it(tmp_path):
    f = OffsetCheckpointFile(tmp_path / CLEANER_OFFSET_CHECKPOINT)
    assert f.read() == {}
    assert not f.exists()


def test_write_and_update(tmp_path):
    f = OffsetCheckpointFile(tmp_path / CLEANER_OFFSET_CHECKPOINT)
    f.write({TP("a", 0): 5, TP("b", 1): 10, TP("c", 2): 20})
    written = f.update(set={TP("a", 0): 7, TP("d", 0): 1}, remove=[TP("b", 1)])
    assert written == {TP("a", 0): 7, TP("c", 2): 20, TP("d", 0): 1}
    assert (tmp_path / CLEANER_OFFSET_CHECKPOINT).read_bytes() == b"0\n3\na 0 7\nc 2 20\nd 0 1\n"
    # Kafka's updateCheckpoints keeps only loaded logs, then removes, then sets.
    written = f.update(set={TP("x", 0): 3}, keep_only=[TP("a", 0), TP("x", 0)])
    assert written == {TP("a", 0): 7, TP("x", 0): 3}
    assert f.read() == written
    assert sorted(os.listdir(tmp_path)) == [CLEANER_OFFSET_CHECKPOINT]


def test_update_of_corrupt_file_writes_nothing(tmp_path):
    path = tmp_path / CLEANER_OFFSET_CHECKPOINT
    path.write_bytes(b"0\n5\nt 0 1\n")
    with pytest.raises(CorruptCheckpointError):
        OffsetCheckpointFile(path).update(set={TP("t", 0): 2})
    assert path.read_bytes() == b"0\n5\nt 0 1\n"


@pytest.mark.parametrize("step", ["fsync_file", "rename"])
def test_failed_write_keeps_old_checkpoint(tmp_path, monkeypatch, step):
    path = tmp_path / CLEANER_OFFSET_CHECKPOINT
    f = OffsetCheckpointFile(path)
    f.write({TP("t", 0): 1, TP("u", 3): 99})
    old = path.read_bytes()

    def enospc(*_args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, step, enospc)
    with pytest.raises(OSError):
        f.update(set={TP("t", 0): 2})
    assert path.read_bytes() == old
    assert sorted(os.listdir(tmp_path)) == [CLEANER_OFFSET_CHECKPOINT]  # no .tmp left behind


def test_format_checkpoint_generic():
    assert cp.format_checkpoint(0, ["0 0", "3 1234"]) == b"0\n2\n0 0\n3 1234\n"


@pytest.mark.fixtures
def test_every_real_offset_checkpoint_parses(real_kafka_root):
    count = 0
    for name in OFFSET_CHECKPOINT_FILES:
        for path in sorted(real_kafka_root.rglob(name)):
            before = path.read_bytes()
            entries = OffsetCheckpointFile(path).read()
            assert all(isinstance(tp, TP) and isinstance(o, int) for tp, o in entries.items())
            if before:
                # Kafka's text, line for line (the order is the broker's HashMap order).
                lines = before.decode().splitlines()
                assert sorted(lines[2:]) == sorted(format_offset_checkpoint(entries).decode().splitlines()[2:])
                assert len(lines) - 2 == len(entries) == int(lines[1])
            assert path.read_bytes() == before
            count += 1
    assert count >= 20


@pytest.mark.parametrize(
    ("parse", "low", "high"),
    [(cp.parse_int32, -(2**31), 2**31 - 1), (cp.parse_int64, -(2**63), 2**63 - 1)],
    ids=["Integer.parseInt", "Long.parseLong"],
)
def test_java_number_parsing_takes_both_extremes_and_nothing_beyond(parse, low: int, high: int) -> None:
    """Java accepts MIN_VALUE and MAX_VALUE themselves (a checkpoint may hold -1 or a
    huge offset); one past either end is a NumberFormatException."""
    assert parse(str(low)) == low
    assert parse(f"+{high}") == high
    for outside in (low - 1, high + 1):
        with pytest.raises(ValueError, match="out of range"):
            parse(str(outside))
