"""The log directory's ``.lock``: the same lock a Kafka broker takes, so the two exclude each other.

A broker locks ``<log_dir>/.lock`` with ``FileChannel.tryLock()`` (Kafka's ``FileLock``), which
on Linux is a POSIX record lock (``fcntl(F_SETLK)``, exclusive, whole file). ``fcntl.lockf`` with
``LOCK_EX | LOCK_NB`` takes the same kind of lock, so a cleaner holding it keeps a broker from
starting on the directory and vice versa (KAFKA_NOTES §14 "Preconditions").

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

PathLike = str | os.PathLike[str]

LOCK_FILE = ".lock"

_held: set[str] = set()
_held_guard = threading.RLock()  # re-entrant: __del__ may run during a GC inside acquire


def _key(log_dir: PathLike) -> str:
    return os.path.realpath(log_dir)


class LogDirLock:
    """Exclusive lock on ``<log_dir>/.lock`` (created if missing, like Kafka).

    Use as a context manager, or ``acquire()`` / ``release()``. Raises ``LogDirLockedError``
    when another process (normally the broker) holds it.

    ``remove_created``: a ``.lock`` this lock created is deleted again before it is released
    (Kafka's ``FileLock.destroy`` deletes it at a clean shutdown, so a stopped broker's log dir
    usually has none). A file left behind would belong to this process's uid, and a broker of
    another uid could not open it read-write, which Kafka does at start-up. Deleting it while
    still holding the lock is safe: a broker that opened it before waits for the lock, one that
    opens it after creates a new file.
    """

    def __init__(self, log_dir: PathLike, *, remove_created: bool = False) -> None:
        self.log_dir = os.fspath(log_dir)
        self.path = os.path.join(self.log_dir, LOCK_FILE)
        self.remove_created = remove_created
        self._fd: int | None = None
        self._created = False

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
            created = not os.path.lexists(self.path)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.EACCES, errno.EAGAIN):
                    raise LogDirLockedError(self.log_dir) from None
                raise
            _held.add(key)
            self._fd = fd
            self._created = created
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        with _held_guard:
            fd, self._fd = self._fd, None
            try:
                if self.remove_created and self._created:
                    with contextlib.suppress(OSError):
                        os.unlink(self.path)
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
