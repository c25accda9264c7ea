"""``spark compact-large``: one partition's rounds, each in two distributed phases,
byte-identical to the single-node engine's on the same input and clock - also when the
offset map fills up (all rounds in one invocation), and in a later round over a clean tail."""

from __future__ import annotations

from collections import Counter

import pytest
from kafka_logs import snapshot_dir
from spark_helpers import DAY, LARGE_TP, NOW, assert_same_partitions, checkpoint, copy_of, set_high_watermark

from cleaner import cleaning
from cleaner.clock import FixedTime
from cleaner.config import parse_policy_text
from cleaner.generate import GeneratorConfig, generate
from cleaner.spark.compact_large import compact_large
from cleaner.spark.spill import REDUCER_MEMORY_CONF
from cleaner.storage.log import Log
from cleaner.storage.topic_partition import TopicPartition

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("spark")]


def driver_written() -> int:
    """Bytes this process (the driver; its tasks run in Python workers) has written so far,
    through any system call (``wchar``: ``sendfile`` copies too)."""
    with open("/proc/self/io") as f:
        return int(dict(line.split(": ") for line in f.read().splitlines())["wchar"])


def test_two_rounds_byte_identical_copy_on_write_then_in_place(spark, tmp_path, large, large_cleaned, large_policy):
    expected = copy_of(large_cleaned, tmp_path / "expected")
    before = snapshot_dir(large)
    segments = len(Log.open(large / LARGE_TP.dir_name, read_only=True).segments)
    assert segments >= 24

    # Round 1, up to the high watermark, written to --output; the source is only read.
    out = tmp_path / "out"
    driver_wrote = driver_written()
    first = compact_large(spark, large / LARGE_TP.dir_name, large_policy, output=out, now_ms=NOW)
    driver_wrote = driver_written() - driver_wrote
    assert first.status == "committed"
    # The segments the round leaves as they were are copied by the executors, not the driver.
    source = {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in (large / LARGE_TP.dir_name).iterdir()}
    kept = sum(p.stat().st_size for p in (out / LARGE_TP.dir_name).iterdir()
               if source.get(p.name) == (p.stat().st_size, p.stat().st_mtime_ns))  # fmt: skip
    assert kept > 200_000 and driver_wrote < kept / 4, (driver_wrote, kept)
    assert len(first.groups) >= 3
    assert snapshot_dir(large) == before
    assert_same_partitions(expected, out, [LARGE_TP])
    assert checkpoint(out) == checkpoint(expected) == {LARGE_TP: first.end_offset}

    # Round 2 after the high watermark moved to the end, two days later (tombstones and
    # markers stamped in round 1 expire): a clean tail, in place on the output.
    log_end = Log.open(large / LARGE_TP.dir_name, read_only=True).log_end_offset
    for root in (expected, out):
        set_high_watermark(root, LARGE_TP, log_end)
    later = NOW + 2 * DAY
    cleaning.clean([expected], large_policy, FixedTime(later))
    second = compact_large(spark, out / LARGE_TP.dir_name, large_policy, now_ms=later)
    assert second.status == "committed"
    assert second.first_dirty_offset == first.end_offset
    assert_same_partitions(expected, out, [LARGE_TP])
    assert checkpoint(out) == checkpoint(expected)

    # Nothing is eligible any more: a rerun leaves everything as it is.
    snapshot = snapshot_dir(out)
    third = compact_large(spark, out / LARGE_TP.dir_name, large_policy, now_ms=later)
    assert third.status == "not-eligible"
    assert snapshot_dir(out) == snapshot


def test_full_offset_map_ends_the_round_where_the_single_node_map_does(spark, tmp_path, fleet):
    """A dedupe buffer holding ~60% of a partition's keys: each round stops where Kafka's
    map fills up, so rounds repeat until nothing is eligible; one compact-large (in place, and
    with --output) runs the same rounds, ending at the same offsets, and leaves the same bytes.
    A rerun finds nothing to do: in place the partition is not eligible, under --output the
    first round's run still holds what the later rounds left (not a restore to plan again)."""
    policy = parse_policy_text(
        "topics:\n  - match: 'topic-.*'\n    cleanupPolicy: compact\n    segmentBytes: 131072\n"
        "    minCleanableDirtyRatio: 0.01\ncleaner:\n  dedupeBufferSize: 5000\n"
    )
    tp = TopicPartition("topic-4", 0)
    expected, data = copy_of(fleet, tmp_path / "expected"), copy_of(fleet, tmp_path / "data")
    outcome = cleaning.clean([expected], policy, FixedTime(NOW))
    ends = [r.end_offset for r in outcome.results if r.topic_partition == tp]
    assert len(ends) >= 2  # the map filled up at least once

    source = snapshot_dir(data)
    out = tmp_path / "out"
    copied = compact_large(spark, data / tp.dir_name, policy, output=out, now_ms=NOW)
    assert [r.end_offset for r in copied.rounds] == ends
    assert snapshot_dir(data) == source
    assert_same_partitions(expected, out, [tp])
    assert checkpoint(out)[tp] == checkpoint(expected)[tp]
    published = snapshot_dir(out / tp.dir_name)
    rerun = compact_large(spark, data / tp.dir_name, policy, output=out, now_ms=NOW)
    assert rerun.status == "already-committed" and len(rerun.rounds) == 1
    assert snapshot_dir(out / tp.dir_name) == published

    in_place = compact_large(spark, data / tp.dir_name, policy, now_ms=NOW)
    assert [r.end_offset for r in in_place.rounds] == ends
    assert in_place.end_offset == ends[-1] and in_place.size_after < in_place.size_before
    assert_same_partitions(expected, data, [tp])
    assert checkpoint(data)[tp] == checkpoint(expected)[tp]
    assert compact_large(spark, data / tp.dir_name, policy, now_ms=NOW).status == "not-eligible"

    once = copy_of(fleet, tmp_path / "once")
    assert len(compact_large(spark, once / tp.dir_name, policy, now_ms=NOW, max_rounds=1).rounds) == 1
    assert checkpoint(once)[tp] == ends[0]


def test_an_input_with_a_swap_left_half_done_is_finished_first_in_the_output(spark, tmp_path, large, large_policy):
    """--output builds the output from the segments the round keeps; an input that still holds
    files of an interrupted swap (a ``.cleaned`` segment a broker's start-up deletes, a
    ``.deleted`` one it removes) is copied whole and opened instead, so the output is what
    ``kafka-cleaner clean`` makes of the same input, leftovers and all."""
    source = copy_of(large, tmp_path / "source")
    partition = source / LARGE_TP.dir_name
    first, second = sorted(partition.glob("*.log"))[:2]
    (partition / (second.name + ".cleaned")).write_bytes(first.read_bytes())  # a rewrite never swapped in
    (partition / "00000000000000999999.log.deleted").write_bytes(b"gone")
    expected = copy_of(source, tmp_path / "expected")
    cleaning.clean([expected], large_policy, FixedTime(NOW))
    out = tmp_path / "out"
    result = compact_large(spark, partition, large_policy, output=out, now_ms=NOW)
    assert result.status == "committed"
    assert_same_partitions(expected, out, [LARGE_TP])
    assert not [p.name for p in (out / LARGE_TP.dir_name).iterdir() if p.suffix in (".cleaned", ".deleted")]


def test_a_map_full_of_many_keys_is_cut_on_the_executors(spark, tmp_path):
    """300,000 distinct keys through a map of about 120,000: every round ends where the single-node
    map fills up, with the driver's task results capped at 1 MiB (the session's
    spark.driver.maxResultSize). Collecting each key's first offset to the driver, as the cut did
    before, aborted this job (1424 KiB of results); it now comes from histograms. A round cut
    short reads each segment once: the cut's jobs reuse the first job's phase-1 output, and only
    the segment the cut falls in is read again (each of the three jobs read the dirty section
    before)."""
    data = tmp_path / "data"
    generate(data, GeneratorConfig(topics=1, partitions=1, records=300_000, keys=300_000, key_skew=0.0,
                                   value_bytes=8, tombstones=0.0, compression="none", segment_bytes=1 << 20,
                                   now_ms=NOW))  # fmt: skip
    policy = parse_policy_text(
        "topics:\n  - match: '.*'\n    cleanupPolicy: compact\n    minCleanableDirtyRatio: 0.01\n"
        "cleaner:\n  dedupeBufferSize: 3200000\n"
    )
    tp = TopicPartition("topic-0", 0)
    expected = copy_of(data, tmp_path / "expected")
    ends = [r.end_offset for r in cleaning.clean([expected], policy, FixedTime(NOW)).results]
    assert len(ends) >= 2, ends  # the map filled up
    rounds = compact_large(spark, data / tp.dir_name, policy, now_ms=NOW).rounds
    assert [r.end_offset for r in rounds] == ends
    assert_same_partitions(expected, data, [tp])
    for r in rounds[:-1]:  # each ended where the map filled up
        assert r.outcome is not None
        reads = Counter(r.outcome.tasks.map_segment)
        assert len(reads) > 2 and sorted(reads.values())[-2:] == [1, 2], reads  # the cut fell mid-segment


def test_reducers_past_their_memory_spill_and_the_rounds_are_the_same_bytes(spark, tmp_path, fleet):
    """``spark.kafkaCleaner.reducerMemory`` far below a reducer's share of the keys: every
    reducer spills its input and works through digest sub-ranges (``spill``), in the rounds
    and in the map-full cut; the rounds end where ``kafka-cleaner clean``'s do, byte for byte."""
    policy = parse_policy_text(
        "topics:\n  - match: 'topic-.*'\n    cleanupPolicy: compact\n    segmentBytes: 131072\n"
        "    minCleanableDirtyRatio: 0.01\ncleaner:\n  dedupeBufferSize: 5000\n"
    )
    tp = TopicPartition("topic-4", 0)
    expected = copy_of(fleet, tmp_path / "expected")
    ends = [r.end_offset for r in cleaning.clean([expected], policy, FixedTime(NOW)).results if r.topic_partition == tp]
    conf = spark.sparkContext._jsc.sc().conf()
    conf.set(REDUCER_MEMORY_CONF, "4k")
    try:
        out = tmp_path / "out"
        copied = compact_large(spark, copy_of(fleet, tmp_path / "data") / tp.dir_name, policy, output=out, now_ms=NOW)
    finally:
        conf.remove(REDUCER_MEMORY_CONF)
    assert [r.end_offset for r in copied.rounds] == ends and len(ends) >= 2
    passes = [p for r in copied.rounds for p in r.outcome.tasks.reduce_passes]
    assert passes and min(passes) > 1, passes  # every reducer spilled
    assert_same_partitions(expected, out, [tp])
    assert checkpoint(out)[tp] == checkpoint(expected)[tp]
