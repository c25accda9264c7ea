"""Checkpoint writes (``cleaner-offset-checkpoint`` through ``OffsetCheckpointFile.write``
and the Spark commit's ``update_cleaner_checkpoint``) crashed after every file operation:
Kafka reads the file at start-up and fails on a malformed one (``CheckpointFile``), so a
crash must leave the old file, the new one, or none where there was none.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from crash_recorder import Model, crash_states, record
from kafka_startup import read_offset_checkpoint

from cleaner.spark.commit import update_cleaner_checkpoint
from cleaner.storage.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleaner.storage.topic_partition import TopicPartition

OLD = {TopicPartition("t", 0): 10, TopicPartition("t", 1): 20}
NEW = {TopicPartition("t", 0): 15, TopicPartition("t", 1): 20, TopicPartition("t", 2): 7}


def _as_kafka(entries: dict[TopicPartition, int]) -> dict[tuple[str, int], int]:
    return {(tp.topic, tp.partition): o for tp, o in entries.items()}


def _failures(root: Path, operation, old: dict | None, new: dict) -> list[str]:
    recording = record(root, operation)
    allowed = [_as_kafka(new)] + ([_as_kafka(old)] if old is not None else [])
    failures = []
    for model in Model:
        for state in crash_states(recording, model, [""]):
            data = state.tree[""].get(CLEANER_OFFSET_CHECKPOINT)
            where = f"{model.value}, crash {recording.describe(state.prefix)}, {state.variant}"
            if data is None:
                if old is not None:
                    failures.append(f"{where}: the checkpoint is gone")
                continue
            try:
                found = read_offset_checkpoint(data)
            except ValueError as e:
                failures.append(f"{where}: Kafka cannot read the checkpoint: {e}")
                continue
            if found not in allowed:
                failures.append(f"{where}: neither the old nor the new checkpoint: {found}")
            if state.prefix == len(recording.steps) - 1 and state.minimal and found != _as_kafka(new):
                failures.append(f"{where}: the new checkpoint is not durable when the write returns")
    return failures


@pytest.mark.parametrize("existing", [True, False], ids=["replace", "create"])
def test_every_crash_of_a_checkpoint_write_leaves_a_whole_checkpoint(tmp_path: Path, existing: bool) -> None:
    checkpoint = OffsetCheckpointFile(tmp_path / CLEANER_OFFSET_CHECKPOINT)
    if existing:
        checkpoint.write(OLD)
    failures = _failures(tmp_path, lambda: checkpoint.write(NEW), OLD if existing else None, NEW)
    assert not failures, "\n".join(failures)


def test_every_crash_of_the_spark_commits_checkpoint_update_leaves_a_whole_checkpoint(tmp_path: Path) -> None:
    for tp in NEW:  # partitions as a broker creates them: with a first (empty) segment
        (tmp_path / tp.dir_name).mkdir()
        (tmp_path / tp.dir_name / "00000000000000000000.log").touch()
    OffsetCheckpointFile(tmp_path / CLEANER_OFFSET_CHECKPOINT).write(OLD)
    failures = _failures(
        tmp_path,
        lambda: update_cleaner_checkpoint(tmp_path, {TopicPartition("t", 0): 15, TopicPartition("t", 2): 7}),
        OLD,
        NEW,
    )
    assert not failures, "\n".join(failures)
