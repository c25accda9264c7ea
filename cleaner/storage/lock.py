"""The log directory's ``.lock``: the same lock a Kafka broker takes, so the two exclude each other.

Kafka's ``FileLock`` (``LogManager.lockLogDirs`` at start-up) opens ``<log_dir>/.lock`` with
``FileChannel.open(CREATE, READ, WRITE)`` and calls ``tryLock()``, which on Linux is a POSIX
record lock (``fcntl(F_SETLK)``, exclusive, from offset 0). ``fcntl.lockf`` with
``LOCK_EX | LOCK_NB`` takes the same kind of lock, so a cleaner holding it keeps a broker from
starting on the directory and vice versa (KAFKA_NOTES §14 "Preconditions").

What a broker does with it:

- ``tryLock`` never waits. A broker that finds the lock held throws ``KafkaException``
  ("Failed to acquire lock on file .lock in <dir>. A Kafka instance in another process or
  thread is using this directory.") and its start-up fails (Kubernetes restarts it later);
- an ``IOException`` while opening it, such as ``AccessDeniedException`` on a ``.lock`` its uid
  may not open read-write, takes the log dir offline (``LogDirFailureChannel``); a broker
  whose every log dir is offline halts;
- ``FileLock.destroy`` at a clean shutdown unlocks, deletes the file and closes it, so a
  stopped broker's log dir usually has no ``.lock``; a killed broker leaves its own.

So a ``.lock`` this module creates is the broker's file from the first instant it has a name
(``ownership.open_for_broker``: the log dir's owner and group, the mode Kafka's umask would
give, group read-write when this process is not the owner but shares its group, e.g. through
the pod's fsGroup), and a process killed while holding it leaves a file the broker opens and
locks as if it had created it. Where that is impossible (another uid without the broker's
group) nothing is created: ``ownership.OwnershipError``.

POSIX record locks belong to a *process*, which has two consequences:

- a second lock attempt from the same process always "succeeds", so this module keeps a
  registry of the directories it holds and refuses a second ``LogDirLock`` on one of them;
- closing *any* descriptor of the file drops the process's lock. ``is_locked_by_other_process``
  therefore never opens the file of a directory this process holds, and answers False for it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct
import sys
import threading
from types import TracebackType

from cleaner.errors import LogDirLockedError
from cleaner.storage import ownership

PathLike = str | os.PathLike[str]

LOCK_FILE = ".lock"

_held: set[str] = set()
_held_guard = threading.RLock()  # re-entrant: __del__ may run during a GC inside acquire


def _key(log_dir: PathLike) -> str:
    return os.path.realpath(log_dir)


class LogDirLock:
    """Exclusive lock on ``<log_dir>/.lock`` (created if missing, like Kafka, as the broker's file).

    Use as a context manager, or ``acquire()`` / ``release()``. Raises ``LogDirLockedError``
    when another process (normally the broker) holds it, ``ownership.OwnershipError`` when a
    missing ``.lock`` could not be created as a file the broker can open.

    Release unlocks and closes; it never deletes the file, not even one it created. Kafka's
    ``FileLock.destroy`` deletes after unlocking, which leaves a race: a process that opened
    the file before the deletion and locks it after the release holds a deleted inode, and the
    next one to open ``.lock`` creates and locks a new file, so two holders each believe they
    have the log dir (a broker and a later commit). A ``.lock`` left behind is harmless: it is
    the broker's file, which Kafka opens and locks at start-up as if it had created it.
    """

    def __init__(self, log_dir: PathLike) -> None:
        self.log_dir = os.fspath(log_dir)
        self.path = os.path.join(self.log_dir, LOCK_FILE)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> LogDirLock:
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already locked by this LogDirLock")
        key = _key(self.log_dir)
        with _held_guard:
            if key in _held:
                # Locking again in this process would "succeed" (POSIX locks are per process)
                # and closing the second descriptor would drop the first lock.
                raise RuntimeError(f"{self.log_dir} is already locked by this process")
            fd, _ = ownership.open_for_broker(self.path, os.O_RDWR)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.EACCES, errno.EAGAIN):
                    raise LogDirLockedError(self.log_dir) from None
                raise
            _held.add(key)
            self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        with _held_guard:
            fd, self._fd = self._fd, None
            try:
                with contextlib.suppress(OSError):
                    fcntl.lockf(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
                _held.discard(_key(self.log_dir))

    close = release

    def __enter__(self) -> LogDirLock:
        return self.acquire()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def __del__(self) -> None:
        # Best effort: an unreleased lock is dropped with its descriptor.
        with contextlib.suppress(Exception):
            self.release()

    def __repr__(self) -> str:
        return f"LogDirLock({self.log_dir!r}, held={self.held})"


# struct flock on 64-bit Linux: short l_type, short l_whence, off_t l_start, off_t l_len,
# pid_t l_pid (+ padding to 32 bytes).
_FLOCK_LINUX64 = struct.Struct("@hhqqi4x")


def _probe_getlk(fd: int) -> bool:
    request = _FLOCK_LINUX64.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
    reply = fcntl.fcntl(fd, fcntl.F_GETLK, request)
    l_type = _FLOCK_LINUX64.unpack(reply)[0]
    return l_type != fcntl.F_UNLCK


def _probe_shared(fd: int) -> bool:
    try:
        fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EAGAIN):
            return True
        raise
    fcntl.lockf(fd, fcntl.LOCK_UN)
    return False


def is_locked_by_other_process(log_dir: PathLike) -> bool:
    """Whether another process holds ``<log_dir>/.lock``, without taking or creating anything.

    - no ``.lock`` file: nobody can hold it -> False (the file is not created);
    - a directory this process holds -> False (and the file is not touched, see the module doc);
    - otherwise the file is opened read-only and asked with ``F_GETLK``, which reports a
      conflicting lock of another process without placing one, so a broker starting at that
      instant is not disturbed. Where the ``struct flock`` layout is not known (not 64-bit
      Linux) a shared lock is tried and released at once instead;
    - a ``.lock`` we may not open is reported as locked (we cannot tell; assume the broker).
    """
    key = _key(log_dir)
    with _held_guard:
        if key in _held:
            return False
        try:
            fd = os.open(os.path.join(log_dir, LOCK_FILE), os.O_RDONLY)
        except FileNotFoundError:
            return False
        except PermissionError:
            return True
        try:
            if sys.platform.startswith("linux") and struct.calcsize("P") == 8:
                return _probe_getlk(fd)
            return _probe_shared(fd)
        finally:
            os.close(fd)
