"""The stage commit run as another uid than the broker's files, next to a real broker of
each line running as its own uid (1001, as Strimzi and Bitnami run it). The sets were
staged by a root sidecar while the broker served (root hands staged files to the owner).
Then, the broker stopped, ``kafka-cleaner stage commit`` runs as 65532 (the sidecar's
default uid):

- with the broker's group (the pod's fsGroup: the volume group-owned by it, directories
  group-writable and set-group-ID): the commit commits, every file it leaves is one the
  broker's uid opens read-write, and the broker starts and serves every latest value;
- without it: the commit refuses, saying so, changes nothing the broker reads, and the
  broker starts and serves as before.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from kafka_broker import EACH_KAFKA_LINE
from run_as import as_user
from sidecar_helpers import write_policy
from test_stage import broker_files
from test_stage_kafka import (
    PARTITIONS,
    POLICY_TOPICS,
    TOPIC,
    _serves_everything,
    _sidecar,
    _stage_while_serving,
    _start,
)

from cleaner.cli import main
from cleaner.sidecar import stage

pytestmark = [
    pytest.mark.slow,
    EACH_KAFKA_LINE,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the broker and the commit as other uids"),
]

BROKER = (1001, 1001)
SIDECAR = 65532


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory the broker's uid may traverse (pytest's tmp_path is root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="kafka-cleaner-stage-uid-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _fs_group(log_dir: Path, gid: int) -> None:
    """What the kubelet does to a volume with ``fsGroup``: group ``gid`` on everything,
    group read-write, directories set-group-ID."""
    for d, dirs, names in os.walk(log_dir):
        for p in [Path(d)] + [Path(d) / n for n in dirs + names]:
            st = p.lstat()
            os.chown(p, -1, gid)
            extra = stat.S_IRGRP | stat.S_IWGRP | (stat.S_IXGRP | stat.S_ISGID if stat.S_ISDIR(st.st_mode) else 0)
            p.chmod(stat.S_IMODE(st.st_mode) | extra)


def _broker_cannot_open(log_dir: Path) -> dict[str, tuple[int, int, str]]:
    """Files the broker's uid could not open read-write (neither its own nor its group's)."""
    out = {}
    for d, _dirs, names in os.walk(log_dir):
        for n in names:
            st = (Path(d) / n).lstat()
            own = st.st_uid == BROKER[0] and st.st_mode & 0o600 == 0o600
            group = st.st_gid == BROKER[1] and st.st_mode & 0o060 == 0o060
            if not (own or group):
                out[str((Path(d) / n).relative_to(log_dir))] = (st.st_uid, st.st_gid, oct(st.st_mode & 0o7777))
    return out


def _commit_as(log_dir: Path, policy: Path, groups: list[int]) -> dict:
    def commit() -> dict:
        result = CliRunner().invoke(main, ["stage", "commit", str(log_dir), "--policy", str(policy)])
        failure = result.exc_info if result.exit_code not in (0, 2, 4) else None
        return {
            "exit": result.exit_code,
            "output": result.output,
            "traceback": "".join(traceback.format_exception(*failure)) if failure else None,
        }

    return as_user(SIDECAR, SIDECAR, groups, commit)


def _staged_broker(shared: Path, line: str):
    broker, work = _start(shared, line, user=BROKER)
    _stage_while_serving(_sidecar(shared, broker), broker, work)
    offsets = broker.offsets(TOPIC, PARTITIONS)
    broker.stop()
    policy = write_policy(shared / "commit-policy.yaml", mode="stage", topics=POLICY_TOPICS)
    policy.chmod(0o644)
    return broker, work, offsets, policy


def test_a_commit_as_another_uid_with_the_brokers_group_leaves_files_the_broker_opens(shared: Path, line: str) -> None:
    broker, work, offsets, policy = _staged_broker(shared, line)
    _fs_group(broker.log_dir, BROKER[1])
    assert _broker_cannot_open(broker.log_dir) == {}
    result = _commit_as(broker.log_dir, policy, [BROKER[1]])
    assert result["exit"] == 0, result
    assert f"committed {PARTITIONS} set(s)" in result["output"], result
    assert _broker_cannot_open(broker.log_dir) == {}, "files the commit left that the broker cannot open"
    broker.start()
    _serves_everything(broker, work, offsets)
    broker.stop()


def test_a_commit_as_another_uid_without_the_brokers_group_refuses_and_changes_nothing(shared: Path, line: str) -> None:
    broker, work, offsets, policy = _staged_broker(shared, line)
    before = broker_files(broker.log_dir)
    result = _commit_as(broker.log_dir, policy, [])
    assert result["exit"] != 0, result
    assert str(SIDECAR) in result["output"] and "uid" in result["output"], result
    assert broker_files(broker.log_dir) == before, "the refused commit changed the broker's files"
    assert all(stage.load(p) is not None for p in broker.log_dir.glob(f"{TOPIC}-*")), "a set was lost"
    broker.start()
    _serves_everything(broker, work, offsets)
    broker.stop()
