"""Who holds the last stable offset: the open transaction a person has to abort."""

from __future__ import annotations

from pathlib import Path

from engine_helpers import BASE_TS, NOW, TP, LogWriter

from cleaner import cleaning
from cleaner.clock import MockTime
from cleaner.config import parse_policy
from cleaner.engine.manager import HangingTransaction, LogCleanerManager
from cleaner.records.control import ControlRecordType
from cleaner.storage.checkpoint import OffsetCheckpointFile
from cleaner.storage.log_dir import LogDirectory

POLICY = parse_policy(
    {
        "mode": "compact",
        "topics": [{"match": "topic", "cleanupPolicy": "compact", "minCleanableDirtyRatio": 0.01}],
        "cleaner": {"dedupeBufferSize": 1 << 20},
    }
)


def _log_with_an_open_transaction(root: Path) -> tuple[int, int]:
    """Two committed rounds of duplicates, then producer 7 opens a transaction that never
    ends, while other producers go on writing (and committing) after it."""
    w = LogWriter(root / TP.dir_name)
    for _ in range(3):
        w.data([b"a", b"b"])
        w.roll()
    w.data([b"x"], pid=3, epoch=1, txn=True)
    w.marker(ControlRecordType.COMMIT, 3, epoch=1)
    hanging, _ = w.data([b"a"], pid=7, epoch=4, txn=True)
    w.roll()
    w.data([b"b", b"c"])
    w.roll()
    w.data([b"c"])
    w.close()
    OffsetCheckpointFile(root / "replication-offset-checkpoint").write({TP: w.next_offset})
    return hanging, w.next_offset


def test_the_lso_names_the_open_transaction(tmp_path: Path) -> None:
    hanging, _ = _log_with_an_open_transaction(tmp_path)
    log_dirs = [LogDirectory(tmp_path, read_only=True)]
    manager = LogCleanerManager(log_dirs, POLICY, MockTime(NOW), write_checkpoints=False)
    (report,) = manager.report(NOW)
    assert report.last_stable_offset == hanging
    assert report.first_uncleanable_offset <= hanging
    assert report.lso_holder == HangingTransaction(7, 4, hanging, BASE_TS + hanging)


def test_no_holder_once_the_transaction_ends_or_the_hw_is_below_it(tmp_path: Path) -> None:
    hanging, _ = _log_with_an_open_transaction(tmp_path)
    OffsetCheckpointFile(tmp_path / "replication-offset-checkpoint").write({TP: hanging})
    log_dirs = [LogDirectory(tmp_path, read_only=True)]
    manager = LogCleanerManager(log_dirs, POLICY, MockTime(NOW), write_checkpoints=False)
    (report,) = manager.report(NOW)
    assert report.last_stable_offset == hanging  # the HW binds, not the transaction
    assert report.lso_holder is None


def test_status_json_carries_the_holder(tmp_path: Path) -> None:
    hanging, _ = _log_with_an_open_transaction(tmp_path)
    (status,) = cleaning.status([tmp_path], POLICY, MockTime(NOW))
    holder = status.as_dict()["lsoHolder"]
    assert holder == {
        "producerId": 7,
        "producerEpoch": 4,
        "firstOffset": hanging,
        "startTimestampMs": BASE_TS + hanging,
        "ageSeconds": (NOW - BASE_TS - hanging) / 1000,
    }
