"""The log-dir lock against other processes: Python children and, when a JDK is installed,
a JVM taking the lock the way a broker does (FileChannel.tryLock)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import pytest

from cleaner.errors import LogDirLockedError
from cleaner.storage.lock import LogDirLock, is_locked_by_other_process

HOLDER = textwrap.dedent(
    """
    import sys
    from cleaner.errors import LogDirLockedError
    from cleaner.storage.lock import LogDirLock, is_locked_by_other_process
    mode, log_dir = sys.argv[1], sys.argv[2]
    if mode == "hold":
        with LogDirLock(log_dir):
            print("locked", flush=True)
            sys.stdin.read()
    elif mode == "try":
        try:
            with LogDirLock(log_dir):
                print("acquired", flush=True)
        except LogDirLockedError:
            print("busy", flush=True)
    elif mode == "probe":
        print("locked" if is_locked_by_other_process(log_dir) else "free", flush=True)
    """
)


def _run(mode, log_dir):
    out = subprocess.run(
        [sys.executable, "-P", "-c", HOLDER, mode, str(log_dir)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


class _Holder:
    """A child process holding the lock until its stdin is closed."""

    def __init__(self, argv):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().strip()
        assert line == "locked", line

    def release(self):
        self.proc.stdin.close()
        assert self.proc.wait(timeout=60) == 0


def test_second_process_cannot_take_the_lock(tmp_path):
    holder = _Holder([sys.executable, "-P", "-c", HOLDER, "hold", str(tmp_path)])
    try:
        assert (tmp_path / ".lock").exists()
        with pytest.raises(LogDirLockedError) as info:
            LogDirLock(tmp_path).acquire()
        assert info.value.log_dir == str(tmp_path)
        assert is_locked_by_other_process(tmp_path)
        assert _run("try", tmp_path) == "busy"
    finally:
        holder.release()
    assert not is_locked_by_other_process(tmp_path)
    with LogDirLock(tmp_path) as lock:
        assert lock.held
    assert not lock.held


def test_lock_held_here_excludes_children_and_survives_probes(tmp_path):
    with LogDirLock(tmp_path) as lock:
        assert _run("try", tmp_path) == "busy"
        assert _run("probe", tmp_path) == "locked"
        # A probe from this process must not open (and, on close, drop) our POSIX lock.
        assert not is_locked_by_other_process(tmp_path)
        assert _run("try", tmp_path) == "busy"
        with pytest.raises(RuntimeError):
            LogDirLock(tmp_path).acquire()  # same process: refused, not silently shared
        with pytest.raises(RuntimeError):
            lock.acquire()
    assert _run("try", tmp_path) == "acquired"  # released on exit


def test_probe_never_creates_the_lock_file(tmp_path):
    assert not is_locked_by_other_process(tmp_path)
    assert _run("probe", tmp_path) == "free"
    assert not (tmp_path / ".lock").exists()


def test_release_is_idempotent_and_lock_file_is_kept(tmp_path):
    lock = LogDirLock(tmp_path).acquire()
    lock.release()
    lock.release()
    assert (tmp_path / ".lock").exists()  # like Kafka, the file stays
    assert _run("try", tmp_path) == "acquired"


@pytest.mark.fixtures
def test_probe_on_real_log_dir_is_read_only(real_kafka_root):
    log_dir = real_kafka_root / "kafka-VolodymyrZee"
    before = (log_dir / ".lock").read_bytes()
    assert not is_locked_by_other_process(log_dir)
    assert (log_dir / ".lock").read_bytes() == before


JAVA_LOCK = textwrap.dedent(
    """
    import java.nio.channels.*;
    import java.nio.file.*;
    public class JavaLock {
        public static void main(String[] args) throws Exception {
            FileChannel ch = FileChannel.open(Paths.get(args[1], ".lock"),
                StandardOpenOption.CREATE, StandardOpenOption.READ, StandardOpenOption.WRITE);
            FileLock lock = ch.tryLock();   // what Kafka's FileLock.tryLock does
            if (args[0].equals("try")) { System.out.println(lock == null ? "busy" : "acquired"); return; }
            System.out.println("locked");
            System.out.flush();
            System.in.read();
        }
    }
    """
)


@pytest.mark.skipif(shutil.which("java") is None, reason="no JDK installed (make setup installs one as root)")
def test_interoperates_with_a_jvm_lock(tmp_path):
    src = tmp_path / "JavaLock.java"
    src.write_text(JAVA_LOCK)
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    holder = _Holder(["java", str(src), "hold", str(log_dir)])
    try:
        assert is_locked_by_other_process(log_dir)
        with pytest.raises(LogDirLockedError):
            LogDirLock(log_dir).acquire()
    finally:
        holder.release()
    with LogDirLock(log_dir):
        out = subprocess.run(["java", str(src), "try", str(log_dir)], capture_output=True, text=True, timeout=120)
        assert out.stdout.strip() == "busy", out.stderr
