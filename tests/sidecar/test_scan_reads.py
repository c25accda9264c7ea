"""A scan reads each of the broker's checkpoint files once, however many partitions it looks at.

Each partition's look asked its log dir for the high watermarks (and the log start offsets),
and each ask read and parsed the whole ``replication-offset-checkpoint``: a scan of N
partitions parsed N files of N lines. Beside a broker with 2,000 partitions the sidecar's first
scan took 683 s on a loaded 2-core machine (34 s without the file).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from sidecar_helpers import new_sidecar, status_of, write_policy

from cleaner.storage import checkpoint as checkpoint_module
from cleaner.storage.checkpoint import LOG_START_OFFSET_CHECKPOINT, REPLICATION_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleaner.storage.log_dir import LogDirectory, checkpoints_read_once
from cleaner.storage.topic_partition import TopicPartition

PARTITIONS = 60


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """How many times each checkpoint file (by name) was read and parsed."""
    counted: Counter = Counter()
    read = OffsetCheckpointFile.read

    def counting(self: OffsetCheckpointFile) -> dict:
        counted[Path(self.path).name] += 1
        return read(self)

    monkeypatch.setattr(checkpoint_module.OffsetCheckpointFile, "read", counting)
    return counted


def test_a_scan_reads_each_broker_checkpoint_once_whatever_the_partitions(tmp_path: Path, reads: Counter) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "meta.properties").write_text("version=1\nnode.id=1\ncluster.id=test\n")
    tps = [TopicPartition(f"topic-{t}", p) for t in range(PARTITIONS // 10) for p in range(10)]
    for tp in tps:
        (data / tp.dir_name).mkdir()
        (data / tp.dir_name / "00000000000000000000.log").touch()
    OffsetCheckpointFile(data / REPLICATION_OFFSET_CHECKPOINT).write({tp: 0 for tp in tps})
    OffsetCheckpointFile(data / LOG_START_OFFSET_CHECKPOINT).write({tp: 0 for tp in tps})
    sidecar = new_sidecar(write_policy(tmp_path / "policy.yaml"), [data])
    reads.clear()
    sidecar.tick()
    assert [d["partitions"] for d in status_of(sidecar)["logDirs"]] == [PARTITIONS]  # every one looked at
    assert reads[REPLICATION_OFFSET_CHECKPOINT] <= 2, reads
    assert reads[LOG_START_OFFSET_CHECKPOINT] <= 2, reads


def test_the_next_scan_reads_what_the_broker_wrote_since(tmp_path: Path, reads: Counter) -> None:
    """Read once a scan, not once for good: a high watermark the broker checkpoints between
    two scans is the one the next scan uses."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "meta.properties").write_text("version=1\nnode.id=1\ncluster.id=test\n")
    tp = TopicPartition("topic", 0)
    (data / tp.dir_name).mkdir()
    (data / tp.dir_name / "00000000000000000000.log").touch()
    hw = OffsetCheckpointFile(data / REPLICATION_OFFSET_CHECKPOINT)
    log_dir = LogDirectory(data, read_only=True)
    hw.write({tp: 5})
    with checkpoints_read_once():
        assert log_dir.high_watermarks()[tp] == 5
        hw.write({tp: 7})
        assert log_dir.high_watermarks()[tp] == 5  # one scan sees one state of the file
    with checkpoints_read_once():
        assert log_dir.high_watermarks()[tp] == 7
    hw.write({tp: 9})
    assert log_dir.high_watermarks()[tp] == 9  # outside a scan, the file as it is now
