"""What kafka-cleaner creates in a log dir is the broker's (issue 21 item 1, issue 27 item 1).

The broker runs as uid 1001 here (Strimzi, Bitnami) and opens every file of its log dir
read-write, ``.lock`` included: a file it cannot open so is an ``AccessDeniedException`` that
takes the log dir offline. Each claim is checked the way the broker meets it: a child process
running as 1001 opens the file ``O_RDWR`` (and locks ``.lock``). The writers run as root (the
CLI), as the broker's uid, or as 65532 with the broker's group as a supplementary group (the
sidecar with the pod's fsGroup)."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest
from click.testing import CliRunner
from run_as import as_user, killed_while_holding

from cleaner.cli import main
from cleaner.errors import KafkaCleanerError
from cleaner.generate import GeneratorConfig, generate
from cleaner.storage import files
from cleaner.storage.lock import LogDirLock, is_locked_by_other_process
from cleaner.storage.staged import link_or_copy

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run code as the broker's and other uids")

BROKER = 1001
SIDECAR = 65532
FS_GROUP = 2000
COMPACT = "mode: compact\ntopics:\n  - match: '.*'\n    cleanupPolicy: compact\n    minCleanableDirtyRatio: 0.01\n"


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every uid may traverse (pytest's tmp_path is root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="kafka-cleaner-owner-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _give_tree(root: Path, uid: int, gid: int, dir_mode: int | None = None) -> None:
    for d, dirs, names in os.walk(root):
        for n in dirs + names:
            os.chown(Path(d) / n, uid, gid)
        if dir_mode is not None:
            os.chmod(d, dir_mode)
    os.chown(root, uid, gid)


def _log_dir(shared: Path, *, uid: int = BROKER, gid: int = BROKER, mode: int = 0o755) -> Path:
    d = shared / "kafka-logs"
    d.mkdir()
    os.chown(d, uid, gid)
    d.chmod(mode)
    return d


def _broker_opens(paths: list[Path], groups: list[int] | None = None) -> dict[str, str]:
    """What the broker (uid 1001) fails to open read-write among ``paths``, and why."""

    def work() -> dict[str, str]:
        failed = {}
        for p in paths:
            try:
                fd = os.open(p, os.O_RDWR)
            except OSError as e:
                failed[str(p)] = repr(e)
            else:
                os.close(fd)
        return failed

    return as_user(BROKER, BROKER, groups if groups is not None else [BROKER], work)


def _broker_locks(log_dir: Path, groups: list[int]) -> str:
    """The broker's start-up on ``log_dir``: open ``.lock`` with CREATE, READ, WRITE and
    ``tryLock`` it (``LogManager.lockLogDirs``)."""

    def work() -> str:
        try:
            fd = os.open(log_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as e:
            return f"open: {e!r}"
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            return f"lock: {e!r}"
        finally:
            os.close(fd)
        return "locked"

    return as_user(BROKER, BROKER, groups, work)


def _owners(root: Path) -> dict[str, tuple[int, int, str]]:
    out = {}
    for d, _dirs, names in os.walk(root):
        for n in names:
            st = (Path(d) / n).lstat()
            out[str((Path(d) / n).relative_to(root))] = (st.st_uid, st.st_gid, oct(stat.S_IMODE(st.st_mode)))
    return out


# -- issue 27.1: the CLI run as root ----------------------------------------------------------------


def test_clean_as_root_leaves_every_file_the_broker_s(shared: Path) -> None:
    logs = shared / "kafka-logs"
    generate(logs, GeneratorConfig(topics=1, partitions=2, records=3_000, keys=150, segment_bytes=16 * 1024))
    _give_tree(logs, BROKER, BROKER)
    before = _owners(logs)
    assert {v for v in before.values()} == {(BROKER, BROKER, "0o644")}, before
    policy = shared / "policy.yaml"
    policy.write_text(COMPACT)

    result = CliRunner().invoke(main, ["clean", str(logs), "--policy", str(policy), "--no-progress"])
    assert result.exit_code == 0, result.output

    after = _owners(logs)
    assert "cleaner-offset-checkpoint" in after and ".lock" in after, sorted(after)
    assert set(after) != set(before), "the clean rewrote nothing: the test proves nothing"
    wrong = {name: owner for name, owner in after.items() if owner != (BROKER, BROKER, "0o644")}
    assert wrong == {}, "files the clean left that are not the broker's as Kafka makes them"
    assert _broker_opens([logs / name for name in after]) == {}
    assert _broker_locks(logs, [BROKER]) == "locked"


def test_root_gives_new_and_replaced_files_the_brokers_owner_and_mode(shared: Path) -> None:
    d = _log_dir(shared, mode=0o775)  # a broker with umask 002: its files are 0664
    files.write_file(d / "new", b"x")
    files.atomic_write(d / "checkpoint", b"0\n0\n")
    (d / "kept").write_bytes(b"old")
    os.chown(d / "kept", BROKER, BROKER)
    os.chmod(d / "kept", 0o640)
    files.atomic_write(d / "kept", b"new")
    assert _owners(d) == {
        "new": (BROKER, BROKER, "0o664"),
        "checkpoint": (BROKER, BROKER, "0o664"),
        "kept": (BROKER, BROKER, "0o640"),  # the replaced file's mode
    }


def test_a_log_dir_at_a_volume_root_owned_by_root_takes_the_owner_of_meta_properties(shared: Path) -> None:
    d = _log_dir(shared, uid=0, gid=FS_GROUP, mode=0o2775)  # kubelet: the mount point, group fsGroup
    (d / "meta.properties").write_text("version=1\n")
    os.chown(d / "meta.properties", BROKER, FS_GROUP)
    os.chmod(d / "meta.properties", 0o644)
    files.atomic_write(d / "cleaner-offset-checkpoint", b"0\n0\n")
    with LogDirLock(d):
        pass
    assert _owners(d)["cleaner-offset-checkpoint"] == (BROKER, FS_GROUP, "0o644")
    assert _owners(d)[".lock"] == (BROKER, FS_GROUP, "0o644")


def test_a_lock_file_root_left_behind_is_given_back_to_the_broker(shared: Path) -> None:
    d = _log_dir(shared)
    (d / ".lock").write_bytes(b"")  # an older kafka-cleaner's, killed as root
    assert _broker_locks(d, [BROKER]).startswith("open: PermissionError")
    with LogDirLock(d):
        pass
    assert _owners(d)[".lock"] == (BROKER, BROKER, "0o644")
    assert _broker_locks(d, [BROKER]) == "locked"


# -- issue 21.1: the .lock a killed holder leaves ---------------------------------------------------


@pytest.mark.parametrize(
    ("holder", "dir_mode"),
    [
        pytest.param((SIDECAR, SIDECAR, [BROKER]), 0o2775, id="fsGroup-sidecar-setgid-dir"),
        pytest.param((SIDECAR, SIDECAR, [BROKER]), 0o775, id="fsGroup-sidecar-plain-dir"),
        pytest.param((0, 0, [0]), 0o755, id="root"),
    ],
)
def test_a_lock_left_by_a_killed_holder_of_another_uid_is_one_the_broker_opens(
    shared: Path, holder: tuple[int, int, list[int]], dir_mode: int
) -> None:
    d = _log_dir(shared, mode=dir_mode)
    killed_while_holding(d, *holder)
    assert (d / ".lock").exists()
    assert _broker_opens([d / ".lock"]) == {}, _owners(d)
    assert _broker_locks(d, [BROKER]) == "locked"


def test_another_uid_without_the_brokers_group_creates_no_lock(shared: Path) -> None:
    d = _log_dir(shared, mode=0o777)  # writable by anyone, but 65532 is not in the broker's group

    def work() -> str:
        try:
            LogDirLock(d).acquire()
        except KafkaCleanerError as e:
            return f"refused: {e}"
        return "locked"

    said = as_user(SIDECAR, SIDECAR, [], work)
    assert said.startswith("refused: ") and "uid 65532" in said and "group" in said, said
    assert not (d / ".lock").exists(), _owners(d)


def test_another_uid_with_the_brokers_group_writes_group_read_write_files(shared: Path) -> None:
    d = _log_dir(shared, gid=FS_GROUP, mode=0o2775)

    def work() -> list[str]:
        files.write_file(d / "written", b"x")
        files.atomic_write(d / "replaced", b"y")
        return sorted(os.listdir(d))

    assert as_user(SIDECAR, SIDECAR, [FS_GROUP], work) == ["replaced", "written"]
    assert _owners(d) == {"written": (SIDECAR, FS_GROUP, "0o664"), "replaced": (SIDECAR, FS_GROUP, "0o664")}
    assert _broker_opens([d / "written", d / "replaced"], [BROKER, FS_GROUP]) == {}


def test_another_uid_that_cannot_give_a_file_to_the_broker_writes_nothing(shared: Path) -> None:
    d = _log_dir(shared, mode=0o777)

    def work() -> list[str]:
        out = []
        for write in (files.write_file, files.atomic_write):
            try:
                write(d / "f", b"x")
            except KafkaCleanerError as e:
                out.append(str(e))
        return out

    said = as_user(SIDECAR, SIDECAR, [], work)
    assert len(said) == 2 and all("broker" in s for s in said), said
    assert os.listdir(d) == []


def test_a_kill_before_the_file_is_the_brokers_leaves_no_name(shared: Path) -> None:
    """The file only gets its name once it is the broker's: a child SIGKILLed while giving it
    away (root on the broker's dir) leaves nothing, not a file of root's."""
    from cleaner.storage import ownership

    d = _log_dir(shared)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            ownership.make_usable_by = _die  # type: ignore[assignment]
            files.atomic_write(d / "cleaner-offset-checkpoint", b"0\n0\n")
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    assert os.listdir(d) == []


def _die(*_args: object) -> NoReturn:
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


# -- release never deletes the file -------------------------------------------------------------


@pytest.mark.parametrize("how", ["created", "renamed-over", "deleted-and-recreated"])
def test_release_never_deletes_a_lock_file(tmp_path: Path, how: str) -> None:
    """Deleting at release (Kafka's ``destroy``) lets a process that opened the file before the
    deletion lock a deleted inode after the release while the next one locks a new file: two
    holders. The file stays, whoever's it is, and the next holder locks the same inode."""
    lock = LogDirLock(tmp_path).acquire()
    if how == "renamed-over":
        (tmp_path / "other").write_bytes(b"someone else's")
        os.rename(tmp_path / "other", tmp_path / ".lock")
    elif how == "deleted-and-recreated":
        os.unlink(tmp_path / ".lock")
        (tmp_path / ".lock").write_bytes(b"someone else's")
    inode = (tmp_path / ".lock").stat().st_ino
    lock.release()
    assert (tmp_path / ".lock").stat().st_ino == inode
    assert not is_locked_by_other_process(tmp_path)
    with LogDirLock(tmp_path):
        assert (tmp_path / ".lock").stat().st_ino == inode


def test_a_staged_file_copied_across_file_systems_is_the_brokers(shared: Path) -> None:
    """``staged.link_or_copy`` hard-links a staged segment into the partition; where it
    cannot (the stage on another file system: here a real tmpfs, ``/dev/shm``) it copies, and
    the copy must be the broker's like the link would be, with the staged file's bytes and
    mtime. A root-owned copy renamed into place is a segment the broker cannot open."""
    d = _log_dir(shared)
    partition = d / "t-0"
    partition.mkdir()
    os.chown(partition, BROKER, BROKER)
    stage = Path(tempfile.mkdtemp(prefix="kafka-cleaner-stage-", dir="/dev/shm"))
    try:
        src = stage / "00000000000000000000.log"
        src.write_bytes(b"segment bytes")
        os.utime(src, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
        assert os.stat(src).st_dev != os.stat(partition).st_dev
        dst = partition / "00000000000000000000.log.cleaned"
        link_or_copy(src, dst)
        assert dst.read_bytes() == b"segment bytes"
        assert dst.stat().st_mtime_ns == 1_600_000_000_000_000_000
        assert _owners(partition) == {dst.name: (BROKER, BROKER, "0o644")}
        assert _broker_opens([dst]) == {}
    finally:
        shutil.rmtree(stage, ignore_errors=True)
