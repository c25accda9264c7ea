"""A segment the broker renames away between the planning of a stage round and the moment
the round opens it (retention's ``.deleted``, a DeleteRecords breach): the round ends as a
vanished file (``FileVanishedError``), leaves nothing behind, is no failure, and the
partition is planned again at the next scan (commit b07782e, found by the soak beside a
busy 3.9.2 broker; before it the round was reported as ``staging failed:
FileNotFoundError`` and counted as a failure).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from broker_lock import BrokerLock
from sidecar_helpers import new_sidecar, next_scan, scan_until, write_policy

from cleaner.engine.cleaner import Cleaner
from cleaner.errors import FileVanishedError
from cleaner.sidecar import stage
from cleaner.sidecar.service import _StageController
from cleaner.storage.segment import LOG_SUFFIX

ALL = [{"match": ".*", "cleanupPolicy": "compact"}]
PARTITION = "topic-0-0"
MAX_SCANS = 6
"""Scans after which a round must have run (the gate, a scan, the round): a bound, not a wait."""


def _rename_away(segment: Path) -> None:
    """Retention's first step: Kafka renames the segment ``.deleted`` (and deletes it later)."""
    segment.rename(segment.with_name(segment.name + ".deleted"))


def _before_the_engine_opens_it(pdir: Path, renamed: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The round is planned and its directories opened; the engine has not opened the
    second segment yet (the engine's reader turns this one into a vanished file itself)."""
    real_clean = Cleaner.clean

    def clean(self: Cleaner, ltc: Any, *args: Any, **kwargs: Any) -> Any:
        if not renamed:
            renamed.append(sorted(pdir.glob(f"*{LOG_SUFFIX}"))[1])
            _rename_away(renamed[0])
        return real_clean(self, ltc, *args, **kwargs)

    monkeypatch.setattr(Cleaner, "clean", clean)


def _after_the_round_read_it(pdir: Path, renamed: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine has cleaned; the round has just found its first source unchanged and is
    about to record it in the manifest (a raw ``FileNotFoundError`` from ``stat``: what
    commit b07782e turns into a vanished file)."""
    real_clean, real_facts = Cleaner.clean, stage._quick_facts
    cleaned: list[bool] = []

    def clean(self: Cleaner, ltc: Any, *args: Any, **kwargs: Any) -> Any:
        out = real_clean(self, ltc, *args, **kwargs)
        cleaned.append(True)
        return out

    def quick_facts(path: Path) -> Any:
        facts = real_facts(path)
        if cleaned and not renamed and facts is not None:
            renamed.append(path)
            _rename_away(path)
        return facts

    monkeypatch.setattr(Cleaner, "clean", clean)
    monkeypatch.setattr(stage, "_quick_facts", quick_facts)


INSTANTS = {
    "before the engine opens it": _before_the_engine_opens_it,
    "after the round read it": _after_the_round_read_it,
}


@pytest.mark.parametrize("instant", list(INSTANTS))
def test_a_segment_renamed_away_under_a_round_is_planned_again(
    tmp_path: Path, make_log_dir, monkeypatch: pytest.MonkeyPatch, instant: str
) -> None:
    data = make_log_dir(topics=1, partitions=1, records=6_000, keys=2_000, segment_bytes=16 * 1024)
    pdir = data / PARTITION
    real_stage = stage.stage_partition
    renamed: list[Path] = []
    ended: list[BaseException] = []

    def stage_partition(*args: Any, **kwargs: Any) -> Any:
        try:
            return real_stage(*args, **kwargs)
        except BaseException as e:
            ended.append(e)
            raise

    policy = write_policy(tmp_path / "policy.yaml", mode="stage", topics=ALL)
    with BrokerLock(data):
        sc = new_sidecar(policy, [data])
        INSTANTS[instant](pdir, renamed, monkeypatch)
        monkeypatch.setattr(stage, "stage_partition", stage_partition)
        doc = scan_until(sc, lambda: renamed, MAX_SCANS, "no round began")
        assert len(ended) == 1 and isinstance(ended[0], FileVanishedError), ended
        assert str(renamed[0]) in str(ended[0]), ended[0]
        assert doc["errors"] == [], doc["errors"]
        failures = sc.metrics.registry.get_sample_value("kafka_cleaner_cleanings_total", {"result": "failure"})
        assert not failures, f"the round counted as a failed cleaning ({failures})"
        assert not (pdir / stage.STAGE_DIR / stage.WORK_DIR).exists(), "the stopped round left its work"
        assert stage.load(pdir) is None, "a set from a round that read a vanished segment"
        monkeypatch.undo()
        monkeypatch.setattr(stage, "stage_partition", stage_partition)
        # Kafka's asynchronous delete removes the renamed segment; the next pass plans the
        # partition from the log as it now is and stages it.
        base = renamed[0].name.split(".")[0]
        for f in pdir.glob(base + ".*"):
            f.unlink()
        scans = 0
        while stage.load(pdir) is None and scans < MAX_SCANS:
            doc = next_scan(sc)
            scans += 1
        assert stage.load(pdir) is not None, doc["stage"]
        assert scans <= 2, f"the partition was planned again only after {scans} scans"
        assert doc["errors"] == [], doc["errors"]
        assert len(ended) == 1, ended


def test_a_partition_deleted_and_created_again_under_the_stage_step_is_no_error(
    tmp_path: Path, make_log_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The topic deleted and created again after the stage step listed the partitions and
    before it looked at this one (the race the soak met, one step earlier): the step leaves
    the partition to the next, which opens the new directory. Old code: reported as an error
    of the partition (``FileVanishedError``) in the sidecar's status."""
    data = make_log_dir(topics=1, partitions=1, records=6_000, keys=2_000, segment_bytes=16 * 1024)
    pdir = data / PARTITION
    fresh = make_log_dir("fresh", topics=1, partitions=1, records=100, keys=10, segment_bytes=16 * 1024) / PARTITION
    real_candidates = _StageController._candidates
    replaced: list[Path] = []

    def candidates(self: _StageController, manager: Any, logs: Any) -> Any:
        out = real_candidates(self, manager, logs)
        if not replaced:  # Kafka's topic deletion, then the topic created again
            replaced.append(pdir.rename(pdir.with_name(f"{PARTITION}.{'0' * 32}-delete")))
            shutil.copytree(fresh, pdir)
        return out

    policy = write_policy(tmp_path / "policy.yaml", mode="stage", topics=ALL)
    with BrokerLock(data):
        sc = new_sidecar(policy, [data])
        monkeypatch.setattr(_StageController, "_candidates", candidates)
        doc = scan_until(sc, lambda: replaced, MAX_SCANS, "no stage step")
        assert doc["errors"] == [], doc["errors"]
        for _ in range(2):  # the next steps: the new partition, from its start
            doc = next_scan(sc)
            assert doc["errors"] == [], doc["errors"]
        (entry,) = [p for p in doc["partitions"] if f"{p['topic']}-{p['partition']}" == PARTITION]
        assert entry["firstDirtyOffset"] == 0 and entry["reason"] != "uncleanable", entry
