"""``spark report``: ``kafka-cleaner status --json``'s fields, exact distinct keys and
reclaimable bytes (what a clean - the single-node engine - actually frees)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from spark_helpers import FLEET_POLICY, NOW, log_bytes

from cleaner.cli import main
from cleaner.records.columns import decode_records
from cleaner.spark.report import REPORT_COLUMNS, STATUS_COLUMNS, dataframes, write
from cleaner.storage.log import Log

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("spark")]


def distinct_keys(partition_dir) -> int:
    """Keys of every keyed record of a data batch, counted independently of the job."""
    keys = set()
    for chunk in Log.open(partition_dir, read_only=True).iter_batches(0):
        data = chunk.select(~chunk.is_control)
        if len(data):
            columns = decode_records(data)
            keys.update(columns.key(row) for row in np.flatnonzero(columns.has_key).tolist())
    return len(keys)


def test_report_agrees_with_status_and_what_a_clean_reclaims(spark, tmp_path, fleet, fleet_cleaned, fleet_report):
    rows = fleet_report  # read-only: the fixture checks that the fleet is as it was

    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(FLEET_POLICY)
    printed = CliRunner().invoke(
        main, ["status", str(fleet), "--policy", str(policy_file), "--now-ms", str(NOW), "--json"]
    )
    assert printed.exit_code == 0, printed.output
    status = json.loads(printed.output)
    assert len(rows) == len(status) == 10
    assert sum(s["tombstones"] for s in status) > 0
    by_partition = {(r["topic"], r["partition"]): r for r in rows}
    shared = [name for name, _ in STATUS_COLUMNS]
    assert set(shared) == set(status[0])
    for s in status:
        row = by_partition[(s["topic"], s["partition"])]
        assert {k: row[k] for k in shared} == s
        assert row["sourceRoot"] == str(fleet)
        directory = fleet / f"{s['topic']}-{s['partition']}"
        assert row["distinctKeys"] == distinct_keys(directory)
        reclaimed = log_bytes(directory) - log_bytes(fleet_cleaned / directory.name)
        if s["compacted"]:
            assert row["eligible"]
            assert row["reclaimableBytes"] == row["reclaimableIfCleanedBytes"] == reclaimed > 0
            assert row["bytesAfterClean"] == log_bytes(fleet_cleaned / directory.name)
            assert row["roundComplete"] and row["roundEndOffset"] == row["firstUncleanableOffset"]
            assert 0 < row["offsetMapKeys"] <= row["distinctKeys"]
        else:
            assert s["reason"] == "notCompacted" and reclaimed == 0
            assert row["reclaimableBytes"] is None and row["roundEndOffset"] is None

    # The files: one row per partition, the per-topic rollup, in each format.
    partitions, topics = dataframes(spark, rows)
    assert partitions.columns == [name for name, _ in REPORT_COLUMNS]
    rollup = {r["topic"]: r.asDict() for r in topics.collect()}
    assert rollup["topic-0"]["partitions"] == 2
    assert rollup["topic-0"]["reclaimableBytes"] == sum(
        by_partition[("topic-0", p)]["reclaimableBytes"] for p in (0, 1)
    )
    for fmt in ("parquet", "csv"):  # json: test_cli_report
        paths = write(partitions, topics, tmp_path / fmt, fmt)
        assert spark.read.format(fmt).option("header", "true").load(paths["partitions"]).count() == 10


def test_cli_report(spark, tmp_path, fleet):
    out = tmp_path / "report"
    result = CliRunner().invoke(main, ["spark", "report", str(fleet), "--output", str(out), "--format", "json"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for p in (out / "partitions").glob("part-*.json") for line in p.read_text().splitlines()]
    assert len(lines) == 10
    # Without --policy every topic counts as compacted.
    assert all(line["compacted"] for line in lines)
