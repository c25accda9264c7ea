"""A JBOD broker (``log.dirs`` over several disks): the sidecar takes every log dir it is given
(the operator passes the log dirs of every data volume, ``target.additionalDataVolumes``), and
a partition found in two of them is reported, never skipped silently or touched."""

from __future__ import annotations

import shutil
from pathlib import Path

from sidecar_helpers import new_sidecar, next_scan, write_policy


def test_every_log_dir_of_a_jbod_broker_is_observed(tmp_path: Path, make_log_dir) -> None:
    disk0 = make_log_dir("data-0/kafka-log0", topics=2, partitions=2)
    disk1 = make_log_dir("data-1/kafka-log0", topics=2, partitions=2)
    for name in ("topic-1-0", "topic-1-1"):
        shutil.rmtree(disk0 / name)
    shutil.rmtree(disk1 / "topic-0-0")  # topic-0-1 stays in both: a duplicate
    policy = write_policy(tmp_path / "policy.yaml", mode="observe")  # topic-.* compacted
    # As the operator passes them: mountPath/logDir for each data volume, wildcards kept.
    sc = new_sidecar(policy, [tmp_path / "data-0" / "kafka-log*", tmp_path / "data-1" / "kafka-log*"])
    doc = next_scan(sc)
    by_dir = {d["path"]: d["partitions"] for d in doc["logDirs"]}
    # topic-0-1 counts once, in the first dir (as Kafka's LogManager would have it, had it started).
    assert by_dir == {str(disk0): 2, str(disk1): 2}, by_dir
    reported = {(p["logDir"], f"{p['topic']}-{p['partition']}") for p in doc["partitions"]}
    assert (str(disk1), "topic-1-0") in reported and (str(disk0), "topic-0-0") in reported
    duplicate = [e for e in doc["errors"] if e["partition"] == "topic-0-1"]
    assert duplicate and "more than one log dir" in duplicate[0]["message"], doc["errors"]
    assert str(disk0) in duplicate[0]["message"] and str(disk1) in duplicate[0]["message"]
