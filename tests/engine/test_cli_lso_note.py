"""``kafka-cleaner status`` names the open transaction that holds a partition back under
its table, as ``--help`` promises, also when the partition is eligible below it (issue 27,
item 8; before, only ``--json`` named the holder)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner
from engine_helpers import NOW, TP, LogWriter

from cleaner.cli import main
from cleaner.records.control import ControlRecordType
from cleaner.storage.checkpoint import OffsetCheckpointFile

POLICY = "mode: compact\ntopics:\n  - match: topic\n    cleanupPolicy: compact\n    minCleanableDirtyRatio: 0.01\n"


def test_status_names_the_open_transaction_under_the_table(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    w = LogWriter(logs / TP.dir_name)
    for _ in range(3):  # cleanable duplicates below the transaction: the partition is eligible
        w.data([b"a", b"b"])
        w.roll()
    w.data([b"x"], pid=3, epoch=1, txn=True)
    w.marker(ControlRecordType.COMMIT, 3, epoch=1)
    hanging, _ = w.data([b"a"], pid=7, epoch=4, txn=True)  # never ends
    w.roll()
    w.data([b"b", b"c"])
    w.close()
    OffsetCheckpointFile(logs / "replication-offset-checkpoint").write({TP: w.next_offset})
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    result = CliRunner().invoke(main, ["status", str(logs), "--policy", str(policy), "--now-ms", str(NOW)])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if line.startswith("topic-0 "))
    assert " yes " in row  # eligible below the transaction
    note = next(line for line in result.output.splitlines() if line.startswith("topic-0: "))
    assert note.startswith("topic-0: an open transaction holds it back from offset "), note
    assert f": producer 7 (epoch 4), open since offset {hanging} for " in note, note
