"""``kafka-cleaner refetch`` (issue 24, item 4): every refusal, the dry run, Kafka's deletion
name. On a real cluster of each line, the repair itself is
``tests/kafka/test_compaction_replication_race_kafka.py::test_refetch_repairs_the_replica_that_kept_the_deleted_value``."""

from __future__ import annotations

import re
import shutil
import uuid
from pathlib import Path

import pytest
from broker_lock import BrokerLock
from click.testing import CliRunner
from metadata_logs import TOPIC_ID, fence, isr_change, partition_record, register_broker, topic_record, write_metadata

from cleaner.refetch import delete_dir_name, refetch_command
from cleaner.storage.topic_partition import TopicPartition

T0 = 1_790_000_000_000
TOPIC = "users"


def _broker_dirs(root: Path, *later: list[bytes], broker: int = 2, metadata: bool = True) -> list[Path]:
    """Broker ``broker``'s data dir with ``users-0`` and its metadata.log.dir, the partition on
    brokers 1 and 2, both in sync, then ``later`` batches."""
    data, meta = root / "data", root / "metadata"
    for d in (data, meta):
        d.mkdir(parents=True)
        (d / "meta.properties").write_text(f"version=1\nnode.id={broker}\ncluster.id=test\n")
    partition = data / f"{TOPIC}-0"
    partition.mkdir()
    (partition / "00000000000000000000.log").write_bytes(b"")
    if metadata:
        write_metadata(meta, [(T0, [register_broker(b, fenced=False) for b in (1, 2)]),
                              (T0, [topic_record(TOPIC, TOPIC_ID), partition_record(0, [1, 2], [1, 2], 1)]),
                              *[(T0 + 1_000 * (i + 1), records) for i, records in enumerate(later)]])
    return [data, meta]


def _run(dirs: list[Path], *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(refetch_command, [*map(str, dirs), "--topic", TOPIC, "--partition", "0", *extra])
    return result.exit_code, result.output


def _listing(dirs: list[Path]) -> list[str]:
    return sorted(str(p.relative_to(d.parent)) for d in dirs for p in d.rglob("*"))


def test_a_dry_run_says_what_it_would_do_and_changes_nothing(tmp_path: Path) -> None:
    dirs = _broker_dirs(tmp_path)
    before = _listing(dirs)
    code, out = _run(dirs)
    assert code == 0, out
    assert "ISR [1, 2], leader 1" in out and "would rename it to users-0." in out and "--execute" in out
    assert _listing(dirs) == before


def test_execute_renames_the_partition_as_kafkas_topic_deletion_does(tmp_path: Path) -> None:
    dirs = _broker_dirs(tmp_path)
    code, out = _run(dirs, "--execute")
    assert code == 0, out
    [aside] = [p.name for p in dirs[0].iterdir() if p.is_dir()]
    assert re.fullmatch(r"users-0\.[0-9a-f]{32}-delete", aside), aside
    assert not (dirs[0] / "users-0").exists()
    assert (dirs[0] / aside / "00000000000000000000.log").exists()  # set aside, not deleted: Kafka deletes it


@pytest.mark.parametrize(
    ("later", "broker", "why"),
    [
        ([[isr_change(0, [2])]], 2, "no other replica of users-0 is in sync (ISR [2]"),
        ([[fence(1)]], 2, "no other replica of users-0 is in sync (ISR [1, 2], offline [1])"),
        ([], 3, "broker 3 is not a replica of users-0"),
    ],
)
def test_refused_unless_another_replica_is_in_sync(tmp_path: Path, later: list[list[bytes]], broker: int,
                                                   why: str) -> None:
    """The last in-sync replica set aside would let an empty log be elected leader: every record lost."""
    dirs = _broker_dirs(tmp_path, *later, broker=broker)
    before = _listing(dirs)
    code, out = _run(dirs, "--execute")
    assert code == 2 and why in out, out
    assert _listing(dirs) == before


def test_refused_without_the_metadata_or_the_partition(tmp_path: Path) -> None:
    no_metadata = _broker_dirs(tmp_path / "a", metadata=False)
    code, out = _run(no_metadata, "--execute")
    assert code == 2 and "no __cluster_metadata-0 on these log dirs" in out and "metadata.log.dir" in out
    unknown = _broker_dirs(tmp_path / "b")
    shutil.move(unknown[0] / f"{TOPIC}-0", unknown[0] / "orders-0")
    result = CliRunner().invoke(refetch_command, [*map(str, unknown), "--topic", "orders", "--partition", "0",
                                                  "--execute"])
    assert result.exit_code == 2 and "does not know orders-0" in result.output, result.output
    code, out = _run(_broker_dirs(tmp_path / "c")[1:], "--execute")  # the data dir not given
    assert code == 2 and "users-0 is not on" in out


def test_refused_while_a_broker_holds_the_log_dir(tmp_path: Path) -> None:
    dirs = _broker_dirs(tmp_path)
    with BrokerLock(dirs[0]):
        code, out = _run(dirs, "--execute")
    assert code == 4, out
    assert (dirs[0] / "users-0").is_dir()


def test_the_name_fits_in_255_bytes_as_kafkas_does() -> None:
    name = delete_dir_name(TopicPartition("t" * 249, 12))
    assert len(name) == 255 and name.endswith("-delete") and re.search(r"-12\.[0-9a-f]{32}-delete$", name)
    assert delete_dir_name(TopicPartition("users", 0)).startswith("users-0.")
    assert uuid.UUID(hex=delete_dir_name(TopicPartition("users", 0))[8:40])
