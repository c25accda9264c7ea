"""Exactly-once: a task that fails once is retried with the same result; a job killed
before its commit changes nothing visible and a rerun finishes it; a rerun after the
commit changes nothing."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from kafka_logs import snapshot_dir
from spark_helpers import LARGE_TP, NOW, assert_same_partitions, checkpoint, compacted, copy_of, tree

from cleaner import cleaning
from cleaner.clock import FixedTime
from cleaner.config import parse_policy_text
from cleaner.spark import compact_large as compact_large_module
from cleaner.spark.compact import compact
from cleaner.spark.compact_large import compact_large
from cleaner.spark.staging import STAGING_DIR_NAME, InjectedFault
from cleaner.storage.topic_partition import TopicPartition

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("spark")]


def unchanged(directory) -> dict:
    """Every file but the log dir's ``.lock``, which taking the lock creates (as a broker)."""
    return {k: v for k, v in snapshot_dir(directory).items() if k != ".lock"}


def fail_once(tmp_path, *points: str) -> dict:
    return {"fail_once": [{"point": p, "marker": str(tmp_path / f"failed-{p}")} for p in points]}


def test_compact_large_in_place_killed_then_finished(spark, tmp_path, large, large_cleaned, large_policy):
    data = copy_of(large, tmp_path / "data")
    staging = tmp_path / STAGING_DIR_NAME  # the default: beside the log dir
    source = unchanged(data)

    # Killed after the Spark job, before the manifest; a map task and a rewrite task failed
    # once on the way (retried by Spark).
    faults = {**fail_once(tmp_path, "phase1", "phase2"), "fail": "before-manifest"}
    with pytest.raises(InjectedFault):
        compact_large(spark, data / LARGE_TP.dir_name, large_policy, now_ms=NOW, faults=faults)
    assert (tmp_path / "failed-phase1").exists() and (tmp_path / "failed-phase2").exists()
    assert unchanged(data) == source
    (run,) = staging.iterdir()
    assert not (run / "MANIFEST.json").exists()
    staged = [p for p in tree(run / "done") if p.endswith(".log.cleaned")]
    assert len(staged) >= 3

    # Rerun, killed after the manifest, before the commit: the staged groups are reused.
    with pytest.raises(InjectedFault):
        compact_large(spark, data / LARGE_TP.dir_name, large_policy, now_ms=NOW, faults={"fail": "before-commit"})
    assert unchanged(data) == source
    assert (run / "MANIFEST.json").exists()

    # Rerun: the commit runs from the manifest.
    result = compact_large(spark, data / LARGE_TP.dir_name, large_policy, now_ms=NOW)
    assert result.status == "committed" and result.run_id == run.name
    assert all(g["reused"] for g in result.groups)
    assert_same_partitions(large_cleaned, data, [LARGE_TP])
    assert checkpoint(data) == checkpoint(large_cleaned)

    # A rerun after the commit changes nothing.
    snapshot = snapshot_dir(data)
    again = compact_large(spark, data / LARGE_TP.dir_name, large_policy, now_ms=NOW)
    assert again.status == "not-eligible"
    assert snapshot_dir(data) == snapshot


def test_compact_copy_on_write_killed_then_finished(spark, tmp_path, fleet, fleet_cleaned, fleet_policy):
    out = tmp_path / "out"
    source = snapshot_dir(fleet)
    faults = {**fail_once(tmp_path, "compact"), "fail": "before-commit"}
    with pytest.raises(InjectedFault):
        compact(spark, [fleet], fleet_policy, output=out, now_ms=NOW, faults=faults)
    assert (tmp_path / "failed-compact").exists()
    assert snapshot_dir(fleet) == source
    assert sorted(p.name for p in out.iterdir()) == [STAGING_DIR_NAME]  # nothing visible

    result = compact(spark, [fleet], fleet_policy, output=out, now_ms=NOW)
    assert result.status == "committed"
    assert "job" not in result.seconds  # the manifest was there: only the commit ran
    assert_same_partitions(fleet_cleaned, out / "data", compacted(fleet, fleet_policy))
    assert checkpoint(out / "data") == checkpoint(fleet_cleaned)
    assert snapshot_dir(fleet) == source


def restore(backup, path) -> None:
    """A restore from a backup taken with ``cp -a``: what is at the path goes, the backup's
    files come back with their names, sizes and mtimes."""
    shutil.rmtree(path)
    subprocess.run(["cp", "-a", str(backup), str(path)], check=True)


def test_a_cp_a_restore_of_dirty_data_at_a_cleaned_path_is_cleaned_again(
    spark, tmp_path, fleet, fleet_cleaned, fleet_policy
):
    """``cp -a`` gives back every name, size, mtime and checkpoint the first run was planned
    from, so the plan's id is the committed run's: the rerun must see that the path no longer
    holds what that commit left, and clean, not answer ``already-committed``."""
    dirty = tmp_path / "dirty"
    subprocess.run(["cp", "-a", str(fleet), str(dirty)], check=True)
    data = tmp_path / "data"
    subprocess.run(["cp", "-a", str(dirty), str(data)], check=True)
    first = compact(spark, [data], fleet_policy, now_ms=NOW)
    assert first.status == "committed"
    assert_same_partitions(fleet_cleaned, data, compacted(fleet, fleet_policy))

    restore(dirty, data)
    assert_same_partitions(dirty, data, compacted(fleet, fleet_policy))
    again = compact(spark, [data], fleet_policy, now_ms=NOW)
    assert again.status == "committed", again.status
    assert {r["action"] for r in again.rows()} == {"cleaned"}
    assert_same_partitions(fleet_cleaned, data, compacted(fleet, fleet_policy))
    assert checkpoint(data) == checkpoint(fleet_cleaned)


def test_a_cp_a_restore_of_a_dirty_partition_is_cleaned_again_by_compact_large(
    spark, tmp_path, large, large_cleaned, large_policy
):
    dirty = tmp_path / "dirty"
    subprocess.run(["cp", "-a", str(large), str(dirty)], check=True)
    data = tmp_path / "data"
    subprocess.run(["cp", "-a", str(dirty), str(data)], check=True)
    assert compact_large(spark, data / LARGE_TP.dir_name, large_policy, now_ms=NOW).status == "committed"
    assert_same_partitions(large_cleaned, data, [LARGE_TP])

    restore(dirty, data)
    assert_same_partitions(dirty, data, [LARGE_TP])
    again = compact_large(spark, data / LARGE_TP.dir_name, large_policy, now_ms=NOW)
    assert again.status == "committed", again.status
    assert_same_partitions(large_cleaned, data, [LARGE_TP])
    assert checkpoint(data) == checkpoint(large_cleaned)


@pytest.mark.parametrize("where", ["in place", "--output"])
def test_compact_large_killed_in_a_later_round_then_finished(spark, tmp_path, fleet, monkeypatch, where):
    """One invocation runs every round; the driver dies before the second round's commit (its
    manifest written). The rerun finds the first round committed and goes on from there - in
    place it finishes the interrupted commit, under --output it resumes the rounds on the
    output - and leaves what ``clean`` leaves. Before, a rerun under --output answered
    ``already-committed`` for the first round and stopped, one round short."""
    policy = parse_policy_text(
        "topics:\n  - match: 'topic-.*'\n    cleanupPolicy: compact\n    segmentBytes: 131072\n"
        "    minCleanableDirtyRatio: 0.01\ncleaner:\n  dedupeBufferSize: 5000\n"
    )
    tp = TopicPartition("topic-4", 0)
    expected, data = copy_of(fleet, tmp_path / "expected"), copy_of(fleet, tmp_path / "data")
    ends = [r.end_offset for r in cleaning.clean([expected], policy, FixedTime(NOW)).results if r.topic_partition == tp]
    assert len(ends) >= 2
    out = tmp_path / "out" if where == "--output" else None
    result_dir = out if out is not None else data

    commits = []

    def dies_at_the_second(run, manifest, policy, spark=None):  # type: ignore[no-untyped-def]
        commits.append(manifest["endOffset"])
        if len(commits) == 2:
            raise InjectedFault("the driver died before round 2's commit")
        real_commit(run, manifest, policy, spark)

    real_commit = compact_large_module.commit
    monkeypatch.setattr(compact_large_module, "commit", dies_at_the_second)
    with pytest.raises(InjectedFault):
        compact_large(spark, data / tp.dir_name, policy, output=out, now_ms=NOW)
    monkeypatch.undo()
    assert commits == ends[:2]
    assert checkpoint(result_dir)[tp] == ends[0]

    finished = compact_large(spark, data / tp.dir_name, policy, output=out, now_ms=NOW)
    assert finished.end_offset == ends[-1]
    assert_same_partitions(expected, result_dir, [tp])
    assert checkpoint(result_dir)[tp] == checkpoint(expected)[tp]
