"""The Spark driver's commit (``cleaner.storage.staged.swap_in``): staged segments linked into
the partition as ``.cleaned`` files, then every new segment of the partition swapped in by
one ``replace_segments``. Several new segments go through one swap here, so the order of
the ``.cleaned`` -> ``.swap`` renames decides whether a crash can commit part of the set.
"""

from __future__ import annotations

import filecmp
import os
import shutil
from pathlib import Path

import pytest
from crash_check import SOAK, check_log_operation
from crash_recorder import Model, crash_states
from kafka_startup import next_offset, offset_from_file, start_up
from test_crash_swap import NOW_MS, log_dir, policy

from cleaner import cleaning
from cleaner.clock import FixedTime
from cleaner.storage import files
from cleaner.storage.loader import offset_of, plan_startup
from cleaner.storage.log import Log, LogConfig
from cleaner.storage.segment import LOG_SUFFIX, SEGMENT_FILE_SUFFIXES, file_name
from cleaner.storage.staged import staged_segments, swap_in


def _bases(partition: Path) -> set[int]:
    return {offset_of(n) for n in os.listdir(partition) if n.endswith(LOG_SUFFIX)}


def _stage(tmp: Path, root: Path) -> tuple[Path, set[int]]:
    """What a Spark job stages for the partition: the segments a clean of a copy wrote
    (fsynced, as the job's staging does), and the bases of the segments they replace."""
    reference = tmp / "reference"
    shutil.copytree(root, reference)
    cleaning.clean([reference], policy(2200), FixedTime(NOW_MS))
    old, new = root / "t-0", reference / "t-0"

    def same(b: int) -> bool:
        return filecmp.cmp(old / file_name(b, LOG_SUFFIX), new / file_name(b, LOG_SUFFIX), shallow=False)

    changed = {b for b in _bases(new) if b not in _bases(old) or not same(b)}
    replaced = {b for b in _bases(old) if b not in _bases(new) or b in changed}
    stage = tmp / "stage"
    stage.mkdir()
    for base in changed:
        for kind in SEGMENT_FILE_SUFFIXES:
            if (new / file_name(base, kind)).exists():
                shutil.copy2(new / file_name(base, kind), stage / file_name(base, kind))
                files.fsync_file(stage / file_name(base, kind))
    files.fsync_dir(stage)
    return stage, replaced


@pytest.fixture(scope="module", params=[(160, 8)] if not SOAK else [(160, 8), (600, 40)], ids=str)
def spark_commit(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    records, keys = request.param
    tmp = tmp_path_factory.mktemp("spark-commit")
    root = log_dir(tmp, seed=records, records=records, keys=keys)
    stage, replaced = _stage(tmp, root)
    staged = staged_segments(stage)
    assert len(staged) >= 2, "several new segments in one swap, or the rename order cannot matter"

    def commit() -> None:
        log = Log.open(root / "t-0", LogConfig(segment_bytes=2200, index_interval_bytes=256))
        swap_in(log, staged, replaced)

    failures, recording = check_log_operation(root, ["t-0"], commit, durable=[stage])
    return staged, failures, recording


def test_every_crash_of_the_spark_commit_leaves_the_old_log_or_the_new(spark_commit) -> None:
    staged, failures, recording = spark_commit
    assert not failures, "\n".join(failures)
    links = [s for s in recording.steps if s.call == "link"]
    assert len(links) >= 2 * len(staged), "the staged files come in as hard links, through the durable-file layer"


def test_the_projects_start_up_plan_agrees_with_kafkas_on_every_crash_state(spark_commit) -> None:
    """``cleaner.storage.loader`` (what ``Log.open`` and the read-only views apply) leaves
    the same files as the independent model of Kafka's start-up, on every directory a crash
    of a multi-segment swap can leave (ordered model; the reordered one adds ~10x states)."""
    _, _, recording = spark_commit
    states = 0
    for state in crash_states(recording, Model.ORDERED, ["t-0"]):
        tree = state.tree["t-0"]
        plan = plan_startup(tree.keys(), lambda name, tree=tree: next_offset(tree[name], offset_from_file(name)))
        ours = plan.resulting_names(tree.keys())
        kafkas = set(start_up(tree).files)
        assert ours == kafkas, f"crash {recording.describe(state.prefix)}, {state.variant}: {sorted(ours ^ kafkas)}"
        states += 1
    assert states > 1000
