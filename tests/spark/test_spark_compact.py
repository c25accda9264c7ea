"""``spark compact``: one task per partition running the engine; byte-identical to
``kafka-cleaner clean`` (the single-node engine) on the same input and clock."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner
from kafka_logs import snapshot_dir
from spark_helpers import LARGE_TP, NOW, assert_same_partitions, checkpoint, compacted, copy_of

from cleaner.cli import main
from cleaner.errors import LogDirLockedError
from cleaner.spark.compact import compact, root_keys, segment_diff
from cleaner.spark.session import task_io_rate, tasks_per_executor
from cleaner.spark.staging import STAGING_DIR_NAME
from cleaner.storage.topic_partition import TopicPartition

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("spark")]


def test_copy_on_write_is_byte_identical_and_the_source_untouched(spark, tmp_path, fleet, fleet_cleaned, fleet_policy):
    before = snapshot_dir(fleet)
    out = tmp_path / "out"
    result = compact(spark, [fleet], fleet_policy, output=out, now_ms=NOW)

    assert result.status == "committed"
    assert snapshot_dir(fleet) == before
    tps = compacted(fleet, fleet_policy)
    assert len(tps) == 8  # topic-3 is not compacted: not in the output
    assert sorted(p.name for p in (out / "data").iterdir() if p.is_dir()) == sorted(tp.dir_name for tp in tps)
    assert_same_partitions(fleet_cleaned, out / "data", tps)
    assert checkpoint(out / "data") == checkpoint(fleet_cleaned)
    assert {r["action"] for r in result.rows()} == {"cleaned"}
    assert all(r["bytesAfter"] < r["bytesBefore"] for r in result.rows())
    df = result.dataframe(spark)
    assert df.count() == 8 and set(df.columns) >= {"bytesBefore", "bytesAfter", "recordsRead", "seconds"}
    # Only the plan, the manifest and the commit marker stay in the staging area.
    (run,) = (out / STAGING_DIR_NAME).iterdir()
    assert sorted(p.name for p in run.iterdir()) == ["COMMITTED", "MANIFEST.json", "plan.json"]

    # A rerun of the committed plan does nothing.
    snapshot = snapshot_dir(out)
    again = compact(spark, [fleet], fleet_policy, output=out, now_ms=NOW)
    assert again.status == "already-committed" and again.run_id == result.run_id
    assert snapshot_dir(out) == snapshot


def test_in_place_is_byte_identical_and_a_rerun_does_nothing(spark, tmp_path, fleet, fleet_cleaned, fleet_policy):
    data = copy_of(fleet, tmp_path / "data")
    result = compact(spark, [data], fleet_policy, now_ms=NOW)

    assert result.status == "committed"
    everything = sorted(p.name for p in fleet.iterdir() if p.is_dir())
    assert sorted(p.name for p in data.iterdir() if p.is_dir()) == everything
    assert_same_partitions(fleet_cleaned, data, [tp for tp in compacted(fleet, fleet_policy)])
    assert (data / "cleaner-offset-checkpoint").read_bytes() == (
        fleet_cleaned / "cleaner-offset-checkpoint"
    ).read_bytes()
    assert not (data / STAGING_DIR_NAME).exists()  # staging lives beside the log dir, never in it

    snapshot = snapshot_dir(data)
    again = compact(spark, [data], fleet_policy, now_ms=NOW)
    assert {r["action"] for r in again.rows()} == {"skipped"}  # nothing is eligible any more
    assert snapshot_dir(data) == snapshot


def test_in_place_refuses_a_log_dir_a_broker_holds(spark, tmp_path, fleet, fleet_policy):
    data = copy_of(fleet, tmp_path / "data")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-P",
            "-c",
            textwrap.dedent(
                f"""
                import sys, time
                from cleaner.storage.lock import LogDirLock
                lock = LogDirLock({str(data)!r}).acquire()
                print("locked", flush=True)
                sys.stdin.read()
                """
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = snapshot_dir(data)
        with pytest.raises(LogDirLockedError):
            compact(spark, [data], fleet_policy, now_ms=NOW)
        assert snapshot_dir(data) == before
        assert not (tmp_path / STAGING_DIR_NAME).exists()
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


def test_cli_compact_two_log_dirs_of_the_same_name(spark, tmp_path, fleet, fleet_cleaned, large, large_cleaned):
    """Two brokers' log dirs both called ``data``: each gets its own directory under
    --output (the name and a hash of its path), with its own checkpoint."""
    assert fleet.name == large.name == "data"
    policy = tmp_path / "policy.yaml"
    policy.write_text("topics:\n  - match: topic-0|big-.*\n    cleanupPolicy: compact\n    segmentBytes: 131072\n")
    out = tmp_path / "out"
    args = ["spark", "compact", str(fleet), str(large), "--policy", str(policy), "--output", str(out)]
    result = CliRunner().invoke(main, [*args, "--now-ms", str(NOW), "--json"])

    assert result.exit_code == 0, result.output
    assert '"status": "committed"' in result.output
    keys = root_keys([str(fleet), str(large)])
    assert keys[str(fleet)] != keys[str(large)] and all(k.startswith("data-") for k in keys.values())
    fleet_out, large_out = out / keys[str(fleet)], out / keys[str(large)]
    tps = [TopicPartition("topic-0", 0), TopicPartition("topic-0", 1)]
    assert sorted(p.name for p in fleet_out.iterdir() if p.is_dir()) == [tp.dir_name for tp in tps]
    assert_same_partitions(fleet_cleaned, fleet_out, tps)
    assert_same_partitions(large_cleaned, large_out, [LARGE_TP])
    assert checkpoint(large_out) == checkpoint(large_cleaned)


def test_segment_diff_names_new_and_replaced_segments():
    before = {
        "00000000000000000000.log": 1,
        "00000000000000000000.index": 2,
        "00000000000000000010.log": 3,
        "00000000000000000010.snapshot": 4,
        "00000000000000000020.log": 5,
        "leader-epoch-checkpoint": 6,
    }
    after = {
        "00000000000000000000.log": 7,
        "00000000000000000000.index": 8,
        "00000000000000000020.log": 5,
        "leader-epoch-checkpoint": 6,
    }
    assert segment_diff(before, after) == ([0], [0, 10], [])
    assert segment_diff(before, {**after, "leader-epoch-checkpoint": 9})[2] == ["leader-epoch-checkpoint"]


def test_the_io_rate_is_each_executors_shared_by_its_tasks(spark):
    """maxIoBytesPerSecond is per executor, as Kafka's is per broker: the test session's one
    executor runs two tasks at once (local[2]), so each task gets half."""
    assert tasks_per_executor(spark.sparkContext) == 2
    assert task_io_rate(spark.sparkContext, 10_000_000.0) == 5_000_000.0
    assert task_io_rate(spark.sparkContext, None) is None
