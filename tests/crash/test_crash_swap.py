"""A whole clean (``.cleaned`` segments written, the swap of ``Log.replace_segments``, the
cleaner checkpoint) crashed after every file operation, judged with Kafka's start-up.

Issue 16's survivors: the swap renaming ``.cleaned`` -> ``.swap`` in ascending order, no
directory fsync after the commit point, no fsync before the old segments are deleted. Each
makes this test fail (docs/testing.md shows how they were planted).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from crash_check import SOAK, check_log_operation
from crash_recorder import Model
from kafka_logs import GENERATED_START_MS, generate_partition, write_high_watermarks

from cleaner import cleaning
from cleaner.clock import FixedTime
from cleaner.config import parse_policy_text
from cleaner.records.compression import CompressionType
from cleaner.storage.log import LogConfig
from cleaner.storage.topic_partition import TopicPartition

NOW_MS = GENERATED_START_MS + 3_600_000
CODECS = (CompressionType.NONE, CompressionType.NONE, CompressionType.GZIP, CompressionType.LZ4, CompressionType.ZSTD)
"""kafka-python (the judge's decoder) reads these without python-snappy."""


def policy(segment_bytes: int):
    return parse_policy_text(
        "mode: compact\n"
        "topics:\n"
        '  - match: ".*"\n'
        "    cleanupPolicy: compact\n"
        f"    segmentBytes: {segment_bytes}\n"
        "    indexIntervalBytes: 256\n"
        "cleaner:\n"
        "  threads: 1\n"
        "  backoffMs: 100\n"
    )


def log_dir(tmp: Path, *, seed: int, records: int, keys: int) -> Path:
    root = tmp / "logdir"
    tp = TopicPartition("t", 0)
    watermark = generate_partition(
        root / tp.dir_name,
        seed=seed,
        records=records,
        keys=keys,
        value_bytes=(10, 40),
        config=LogConfig(segment_bytes=1024, index_interval_bytes=256),
        transactional_rate=0.2,
        codecs=CODECS,
    )
    write_high_watermarks(root, {tp: watermark})
    return root


SIZES = [(160, 8)] if not SOAK else [(160, 8), (400, 40), (1500, 100)]


@pytest.mark.parametrize(("records", "keys"), SIZES)
def test_every_crash_of_a_clean_leaves_the_old_log_or_the_new(tmp_path: Path, records: int, keys: int) -> None:
    """The engine swaps each group on its own (as Kafka's ``cleanSegments``); the directory
    fsyncs around each commit point decide what start-up makes of a crash."""
    root = log_dir(tmp_path, seed=records, records=records, keys=keys)
    failures, recording = check_log_operation(
        root, ["t-0"], lambda: cleaning.clean([root], policy(2200), FixedTime(NOW_MS))
    )
    swaps = sum(s.call == "rename" and s.target.endswith(".log.cleaned") for s in recording.steps)
    assert swaps >= 2, "the clean must swap several groups"
    assert not failures, "\n".join(failures)


def test_the_models_see_what_they_claim(tmp_path: Path) -> None:
    """The reordered model is strictly bigger than the ordered one, and both reach states
    where the swap is half done (so a passing check is not a vacuous one)."""
    from crash_recorder import crash_states, record

    root = log_dir(tmp_path, seed=3, records=60, keys=8)
    recording = record(root, lambda: cleaning.clean([root], policy(2200), FixedTime(NOW_MS)))
    counts = {m: 0 for m in Model}
    half_done = {m: 0 for m in Model}
    for model in Model:
        for state in crash_states(recording, model, ["t-0"]):
            counts[model] += 1
            names = state.tree["t-0"]
            if any(n.endswith(".swap") for n in names) and any(n.endswith(".cleaned") for n in names):
                half_done[model] += 1
    assert counts[Model.REORDERED] > counts[Model.ORDERED] > len(recording.steps)
    assert half_done[Model.ORDERED] > 0 and half_done[Model.REORDERED] > half_done[Model.ORDERED]


def test_the_cleaner_checkpoint_never_gets_ahead_of_the_log(tmp_path: Path) -> None:
    """The checkpoint lives in another directory: a crash may keep it and not the partition's
    renames unless the swap was durable before the checkpoint was written. A checkpoint that
    says the partition is cleaned while the log is not makes the next clean skip it."""
    from crash_check import LogCheck, _start_up
    from crash_recorder import crash_states, record
    from kafka_startup import read_offset_checkpoint

    root = log_dir(tmp_path, seed=5, records=160, keys=8)
    recording = record(root, lambda: cleaning.clean([root], policy(2200), FixedTime(NOW_MS)), versions=[])
    final = LogCheck.of(recording, "t-0").versions[-1]
    cleaned_to = read_offset_checkpoint((root / "cleaner-offset-checkpoint").read_bytes())[("t", 0)]
    ahead = 0
    for model in Model:
        for state in crash_states(recording, model, ["", "t-0"]):
            data = state.tree[""].get("cleaner-offset-checkpoint")
            if data is None or read_offset_checkpoint(data).get(("t", 0)) != cleaned_to:
                continue
            ahead += 1
            records = _start_up(tuple(sorted(state.tree["t-0"].items()))).records
            assert records == final, (
                f"{model.value}: crash {recording.describe(state.prefix)}: checkpoint ahead of the log"
            )
    assert ahead > 0
