"""A transaction whose first batches retention deletes still holds the last stable offset.

Kafka's cleaner thread keeps the producer state it loaded while ``deleteOldSegments``
removes segments (``UnifiedLog.deleteSegments`` only moves the log start offset:
``ProducerStateManager.onLogStartOffsetIncremented``), so a transaction still open whose
first offset is now below the log start pins the first unstable offset at the log start
(``UnifiedLog.maybeIncrementFirstUnstableOffset``) and nothing past it is cleaned. Found by
the randomized differential (seed 7919, Kafka 3.9.2: a second round over two aborted
transactions that Kafka does not clean)."""

from __future__ import annotations

from pathlib import Path

from engine_helpers import NOW, TP, LogWriter

from cleaner.clock import MockTime
from cleaner.config import parse_policy
from cleaner.engine.manager import LogCleanerManager
from cleaner.storage.checkpoint import OffsetCheckpointFile
from cleaner.storage.log_dir import LogDirectory

POLICY = parse_policy(
    {
        "mode": "compact",
        "topics": [{"match": "topic", "cleanupPolicy": "compact", "minCleanableDirtyRatio": 0.01}],
        "cleaner": {"dedupeBufferSize": 1 << 20},
    }
)


def test_retention_keeps_the_open_transaction_it_cut(tmp_path: Path) -> None:
    w = LogWriter(tmp_path / TP.dir_name)
    w.data([b"a"], pid=7, epoch=0, txn=True)  # offset 0: never ends
    w.roll()
    w.data([b"b", b"c"])  # 1, 2
    w.roll()
    later, _ = w.data([b"d"], pid=9, epoch=0, txn=True)  # 3: never ends either
    w.roll()
    w.data([b"e"])
    w.close()
    OffsetCheckpointFile(tmp_path / "replication-offset-checkpoint").write({TP: w.next_offset})
    manager = LogCleanerManager([LogDirectory(tmp_path)], POLICY, MockTime(NOW), write_checkpoints=False)
    managed = manager.logs()[TP]
    assert manager.last_stable_offset(managed, NOW)[0] == 0

    managed.log.delete_segments(managed.log.segments[:1])  # retention: the log starts at 1

    assert managed.log.log_start_offset == 1
    assert later == 3
    assert manager.last_stable_offset(managed, NOW)[0] == 1  # not 3: producer 7 is still open
