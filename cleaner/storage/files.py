"""Durable file operations: the only place the project writes a file that must survive a crash.

Every crash-relevant write (checkpoints, ``partition.metadata``, ``meta.properties``,
``.cleaned`` segment files, producer snapshots) and every rename of the swap protocol goes
through the small functions below, so that tests can inject faults (ENOSPC, EIO, a crash
"between" two steps) by monkeypatching them::

    monkeypatch.setattr(files, "fsync_file", failing_fsync)

For that to work, callers must use them as module attributes (``from cleaner.storage import
files``; ``files.atomic_write(...)``), never ``from cleaner.storage.files import ...``: a
name imported into another module is not replaced by the patch. Inside this module the
composite operations also call the primitives through the module globals, so patching
``fsync_file`` or ``rename`` affects ``atomic_write`` and ``write_file`` too.

The procedures follow Kafka's own (``CheckpointFile.write``, ``Utils.atomicMoveWithFallback``,
``Utils.flushDir``, ``PartitionMetadataFile.maybeFlush``, ``PropertiesUtils.writePropertiesFile``):
write ``<file>.tmp`` in the same directory, flush, fsync, rename over the target, fsync
the parent directory (KAFKA_NOTES §3.1).

Every file created here is the broker's, whatever uid kafka-cleaner runs as: created through
``ownership.open_for_broker``, it gets the owner, group and mode Kafka would have given it
(taken from the log dir and from the file replaced), or is not created at all
(``ownership.OwnershipError``). Renames, links and truncations keep a file's owner.
"""

from __future__ import annotations

import contextlib
import os

from cleaner.errors import FileChangedError
from cleaner.storage import ownership, page_cache

PathLike = str | os.PathLike[str]

TMP_SUFFIX = ".tmp"


def fsync_file(fd_or_path: int | PathLike) -> None:
    """Flush a file's data and metadata to disk (``FileDescriptor.sync`` / ``FileChannel.force(true)``).

    Accepts an open file descriptor or a path (opened read-only for the call).
    """
    if isinstance(fd_or_path, int):
        os.fsync(fd_or_path)
        return
    fd = os.open(fd_or_path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: PathLike) -> None:
    """Make renames and creations inside directory ``path`` durable (Kafka's ``Utils.flushDir``)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rename(src: PathLike, dst: PathLike) -> None:
    """Atomically rename ``src`` over ``dst`` (``Files.move(ATOMIC_MOVE)``; replaces an existing ``dst``).

    Does not fsync the directory: callers that need the rename to be durable call
    ``fsync_dir`` afterwards (several renames can share one directory fsync, §14 step 8).
    """
    os.replace(src, dst)


def truncate(path: PathLike, size: int) -> None:
    """Cut ``path`` to ``size`` bytes and fsync it (a segment's recovery or truncation,
    Kafka's ``FileRecords.truncateTo``): the cut is durable before anything relies on it."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
        fsync_file(fd)
    finally:
        os.close(fd)


def link(src: PathLike, dst: PathLike) -> None:
    """Give ``src``'s file a second name ``dst`` (a hard link; ``dst`` must not exist).

    The Spark commit brings staged files into a partition directory this way, so they are
    never copied; like ``rename``, durable only after ``fsync_dir``.
    """
    os.link(src, dst)


def remove(path: PathLike, missing_ok: bool = True) -> None:
    """Unlink a file; a missing file is not an error unless ``missing_ok`` is False."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        if not missing_ok:
            raise


def set_mtime_ms(path: PathLike, ms: int) -> None:
    """Set a file's modification time to ``ms`` epoch milliseconds, keeping its access time.

    Kafka's ``File.setLastModified``: the cleaner stamps a cleaned segment with the mtime of
    the last segment it replaces (KAFKA_NOTES §4 point 5, §9.4).
    """
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, int(ms) * 1_000_000))


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view)
        view = view[written:]


def write_file(path: PathLike, data: bytes | bytearray | memoryview, *, fsync: bool = True) -> None:
    """Create (or truncate) ``path``, write ``data``, fsync it.

    For files written in place, as Kafka does: new ``.cleaned`` segment files and their
    indexes, producer-state snapshots (``ProducerStateManager.writeSnapshot`` opens with
    CREATE+WRITE and forces the channel). A failure removes the partial file and re-raises,
    so no half-written file is left under a name the broker would load. A new file is the
    broker's (``ownership.open_for_broker``).
    """
    fd, _ = ownership.open_for_broker(path, os.O_WRONLY | os.O_TRUNC)
    try:
        try:
            _write_all(fd, data)
            if fsync:
                fsync_file(fd)
                page_cache.drop(fd)  # durable: the broker reads it from disk when it needs it
        finally:
            os.close(fd)
    except BaseException:
        remove(path)
        raise


def copy_file(src: PathLike, dst: PathLike) -> None:
    """``dst`` (created or truncated) with ``src``'s bytes and mtime, fsynced: a copy the
    broker owns (``ownership.open_for_broker``), made by the kernel (``sendfile``, which
    crosses file systems; no buffer of ours). A failure removes the partial copy and re-raises."""
    fd, _ = ownership.open_for_broker(dst, os.O_WRONLY | os.O_TRUNC)
    try:
        try:
            with open(src, "rb") as source:
                size = os.fstat(source.fileno()).st_size
                copied = 0
                while copied < size:
                    n = os.sendfile(fd, source.fileno(), copied, size - copied)
                    if n == 0:
                        raise FileChangedError(src, f"{size} bytes at first, {copied} when copied")
                    copied += n
                mtime_ns = os.fstat(source.fileno()).st_mtime_ns
            os.utime(fd, ns=(mtime_ns, mtime_ns))
            fsync_file(fd)
        finally:
            os.close(fd)
    except BaseException:
        remove(dst)
        raise


def atomic_write(path: PathLike, data: bytes | bytearray | memoryview) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new file.

    Kafka's order (``CheckpointFile.write`` + ``Utils.atomicMoveWithFallback``): write
    ``<path>.tmp`` in the same directory, fsync it, rename it over ``path``, fsync the
    parent directory. If any step before the rename fails, the temp file is removed and
    the error re-raised; ``path`` is untouched. If only the final directory fsync fails, the
    new content is already in place (and fsynced) and the error is re-raised. The new file
    is the broker's, with the mode of the file it replaces (``ownership.open_for_broker``).
    """
    target = os.fspath(path)
    tmp = target + TMP_SUFFIX
    try:
        fd, _ = ownership.open_for_broker(tmp, os.O_WRONLY | os.O_TRUNC, like=target)
        try:
            _write_all(fd, data)
            fsync_file(fd)
        finally:
            os.close(fd)
        rename(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            remove(tmp)
        raise
    fsync_dir(os.path.dirname(os.path.abspath(target)))
