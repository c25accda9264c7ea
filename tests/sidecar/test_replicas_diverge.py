"""Replicas that diverge, end to end: two copies of a generated broker log dir are two brokers'
replicas; one copy is altered, each is served by a real ``kafka-cleaner sidecar`` process, and
the operator's status is built from what the two ``/status`` answers say (parse_report and
build_status, as a reporting round does after its HTTP pulls).

Not on the real control plane: kwok gives every node the address 127.0.0.1, so the sidecars of
two host-network broker pods would both have to listen on the policy's one port there.

The alterations, one per partition, each what a real cluster can end up with:

* topic-0-0, a divergent head: kafka-1's copy is truncated and other batches are appended at
  the same offsets (an unclean leader election: the new leader's own appends);
* topic-0-1, a missing clean section: kafka-0's copy is cleaned by ``kafka-cleaner clean``,
  kafka-1's is not (a log cleaner that never ran there);
* topic-1-*: untouched, and not reported.
"""

from __future__ import annotations

import datetime
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml
from compaction_operator.status import BrokerPod, Outcome, build_status, parse_report
from kafka_logs import batch_of, write_high_watermarks
from sidecar_helpers import KAFKA_CLEANER, NOW_MS, sidecar_process, write_policy

from cleaner.config import Policy, parse_policy
from cleaner.generate import GeneratorConfig, generate
from cleaner.storage.log import Log
from cleaner.storage.topic_partition import TopicPartition

NOW = datetime.datetime(2026, 11, 21, 10, 0, tzinfo=datetime.UTC)


def _truncate_and_append_other_batches(partition_dir: Path, at_least: int) -> tuple[int, int]:
    """Truncate at the first batch boundary at or above ``at_least`` and append batches of
    other records up to the old log end offset; (truncation offset, new log end offset)."""
    log = Log.open(partition_dir)
    try:
        end = log.log_end_offset
        truncate_at = next(int(b) for chunk in log.iter_batches(at_least) for b in chunk.base_offsets
                           if int(b) >= at_least)
        log.truncate_to(truncate_at)
        offset = truncate_at
        while offset < end:
            offsets = list(range(offset, min(offset + 40, end)))
            log.append(batch_of(offsets, [b"other-%d" % (o % 7) for o in offsets], timestamp=NOW_MS - 60_000))
            offset = offsets[-1] + 1
        log.flush()
        return truncate_at, log.log_end_offset
    finally:
        log.close()


def _targeted(path: Path) -> Policy:
    """The policy the sidecars run, with the target the operator reads it with."""
    manifest = yaml.safe_load(path.read_text())
    manifest["spec"]["target"] = {"statefulSet": "kafka", "dataVolume": "data", "mountPath": "/var/lib/kafka",
                                  "logDirs": ["data"]}
    return parse_policy(manifest)


def _scanned(doc: dict[str, Any]) -> bool:
    return doc.get("scannedAt") is not None and bool((doc.get("replicas") or {}).get("partitions"))


def test_two_sidecars_replicas_compared_by_the_operator(tmp_path: Path) -> None:
    config = GeneratorConfig(topics=2, partitions=2, records=3_000, keys=300, segment_bytes=32 * 1024,
                             now_ms=NOW_MS, compression="none")
    one, two = tmp_path / "kafka-0", tmp_path / "kafka-1"
    generate(one, config)
    shutil.copytree(one, two)
    policy = write_policy(tmp_path / "policy.yaml", mode="observe")

    truncated_at, end = _truncate_and_append_other_batches(two / "topic-0-0", 1_500)
    write_high_watermarks(two, {TopicPartition("topic-0", 0): end})
    cleaned = subprocess.run([str(KAFKA_CLEANER), "clean", "--policy", str(policy), "--now-ms", str(NOW_MS),
                              "--force-mode", "--topic", "topic-0", "--partition", "1", "-o", "json", str(one)],
                             capture_output=True, text=True, timeout=300)
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr

    reports = {}
    with (sidecar_process(policy, [one], log_file=tmp_path / "kafka-0.log") as a,
          sidecar_process(policy, [two], "--broker-name", "kafka-1", log_file=tmp_path / "kafka-1.log") as b):
        for name, sidecar in (("kafka-0", a), ("kafka-1", b)):
            doc = sidecar.wait_for(_scanned, timeout_s=120, what=f"the first scan of {name}")
            assert doc["broker"] == name
            reports[name] = doc

    replicas = {name: {(e["topic"], e["partition"]): e for e in doc["replicas"]["partitions"]}
                for name, doc in reports.items()}
    head = replicas["kafka-1"][("topic-0", 0)]
    assert head["logEndOffset"] == head["highWatermark"] == end and truncated_at < head["batches"][0][0]
    assert replicas["kafka-0"][("topic-0", 1)]["firstDirtyOffset"] > 0
    assert replicas["kafka-1"][("topic-0", 1)]["firstDirtyOffset"] == 0
    # The untouched partitions are byte copies: the same facts on both brokers.
    for p in (0, 1):
        assert replicas["kafka-0"][("topic-1", p)] == replicas["kafka-1"][("topic-1", p)]

    scrapes = {name: parse_report(json.dumps(doc), name) for name, doc in reports.items()}
    assert all(s.error is None for s in scrapes.values()), scrapes
    status = build_status(policy=_targeted(policy), generation=1, previous=None, outcome=Outcome(),
                          pods=[BrokerPod(name, ip="127.0.0.1") for name in reports], scrapes=scrapes,
                          sidecar_hash=None, now=NOW)
    found = [(d["topic"], d["partition"], d["kind"], d["brokers"]) for d in status["divergingPartitions"]]
    assert found == [("topic-0", 0, "divergentBatch", ["kafka-0", "kafka-1"]),
                     ("topic-0", 1, "cleanSkew", ["kafka-1"])]
    assert status["summary"]["divergingPartitions"] == 2
    [condition] = [c for c in status["conditions"] if c["type"] == "ReplicasDiverge"]
    assert condition["status"] == "True"
    assert condition["message"].startswith("topic-0-0 divergentBatch on kafka-0, kafka-1: at offset ")
