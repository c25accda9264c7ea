"""A DeleteRecords through Kafka's Admin API, on a real broker of each line, after a set was
staged: the broker moves the partition's log start (inside the first segment no segment is
deleted; the new start is what ``log-start-offset-checkpoint`` records, written at the
broker's clean shutdown). A commit of the set would rewrite the segment under the new log
start, so the gate refuses it (naming the checkpoint and both offsets), commits the other
partition's set, and the restarted broker serves from the new log start exactly what it
served right after the DeleteRecords.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kafka_broker import EACH_KAFKA_LINE, RealBroker, wait_until
from sidecar_helpers import status_of
from test_stage_kafka import PARTITIONS, TOPIC, _sidecar, _stage_while_serving, _start

from cleaner.sidecar import stage
from cleaner.storage.checkpoint import LOG_START_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleaner.storage.topic_partition import TopicPartition as TP

pytestmark = [pytest.mark.slow, EACH_KAFKA_LINE]


def _delete_records(broker: RealBroker, partition: int, before: int) -> None:
    """``Admin.deleteRecords``: every record of ``partition`` below ``before`` is gone."""
    from kafka import TopicPartition
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=30_000)
    try:
        admin.delete_records({TopicPartition(TOPIC, partition): before}, timeout_ms=30_000)
    finally:
        admin.close()
    wait_until(lambda: broker.offsets(TOPIC, PARTITIONS)[partition][0] == before, "the new log start")


def test_a_set_staged_before_a_delete_records_is_refused_and_the_broker_serves_from_the_new_start(
    tmp_path: Path, line: str
) -> None:
    broker, work = _start(tmp_path, line)
    sets = _stage_while_serving(_sidecar(tmp_path, broker), broker, work)
    moved, kept = f"{TOPIC}-0", f"{TOPIC}-1"
    s = sets[moved]
    assert s.log_start_checkpoint is None and s.first_segment_base == s.base_offset == 0, s
    target = 7  # inside the first segment, which the set replaces (with or without later ones)
    bases = sorted(int(p.name[:20]) for p in (broker.log_dir / moved).glob("*.log"))
    assert 0 in s.replaced and len(bases) > 1 and target < bases[1], (s.replaced, bases)
    _delete_records(broker, 0, target)
    served = broker.consume(TOPIC, PARTITIONS)
    offsets = broker.offsets(TOPIC, PARTITIONS)
    assert offsets[0][0] == target
    broker.stop()
    checkpoint = OffsetCheckpointFile(broker.log_dir / LOG_START_OFFSET_CHECKPOINT).read()
    assert checkpoint.get(TP(TOPIC, 0)) == target, checkpoint
    first_files = sorted(p.name for p in (broker.log_dir / moved).glob("00000000000000000000.*"))
    assert first_files, "the broker deleted the first segment: the test needs it kept"

    gate = _sidecar(tmp_path, broker)
    gate.tick()
    doc = status_of(gate)
    assert doc["gate"]["committed"] == 1 and doc["gate"]["deleted"] == 1, doc["gate"]
    refusals = [e["message"] for e in doc["errors"] if e["partition"] == moved]
    assert len(refusals) == 1, doc["errors"]
    assert f"the log start offset checkpoint moved from None to {target}" in refusals[0], refusals
    assert stage.load(broker.log_dir / moved) is None and stage.cleaned_to(broker.log_dir / moved) is None
    assert stage.load(broker.log_dir / kept) is None and stage.cleaned_to(broker.log_dir / kept) is not None
    assert sorted(p.name for p in (broker.log_dir / moved).glob("00000000000000000000.*")) == first_files
    gate.stop()

    broker.start()
    assert broker.offsets(TOPIC, PARTITIONS) == offsets, "the broker does not serve from the new log start"
    assert broker.consume(TOPIC, PARTITIONS) == served
    assert broker.problems([TOPIC]) == [], broker.problems([TOPIC])
    broker.stop()
