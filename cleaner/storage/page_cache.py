"""Reading and writing segments leaves the page cache as the broker had it.

A broker serves its consumers from the page cache: the tail of every partition, and whatever
its readers are catching up on. A cleaner that reads whole segments and writes cleaned copies
pulls gigabytes of cold pages in, and the kernel makes room for them by evicting pages the
broker will read again (Cassandra's compaction raised read p99 from ~1 ms to 16 ms that way,
and page-cache-neutral I/O brought it back to ~2 ms). So:

- a reader asks, before it reads a file, which of its pages are resident (``mincore(2)`` on a
  mapping of the file that touches nothing), and afterwards drops (``posix_fadvise``
  ``POSIX_FADV_DONTNEED``) exactly the pages that were not: the broker's hot pages stay, the
  pages the cleaner brought in go - a cleaning round's at the round's end
  (``one_read_per_round``), since its two passes read the same segments;
- a writer drops what it wrote once it is durable (after the fsync: ``DONTNEED`` leaves dirty
  pages alone), so a cleaned segment enters the cache only when the broker reads it;
- a writer never lets more than a few MiB pile up dirty (``Writeback``): a cleaned segment of
  hundreds of MiB written to the cache and fsynced at the end is one burst of writeback that
  holds the disk, and the kernel's dirty-page throttling stalls every writer on the machine,
  the broker's appends included, while it drains. Written back as it goes (RocksDB's
  ``bytes_per_sync``), the same bytes reach the disk as a steady stream.

Linux only (elsewhere, or where ``mincore`` is not to be had, every call is a no-op).
``KAFKA_CLEANER_PAGE_CACHE=keep`` turns it off, for a benchmark's baseline.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
import sys
import threading
from collections.abc import Iterator

import numpy as np

PAGE = mmap.PAGESIZE

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if sys.platform.startswith("linux") else None
_ENABLED = _libc is not None and hasattr(os, "posix_fadvise") and os.environ.get("KAFKA_CLEANER_PAGE_CACHE") != "keep"
if _libc is not None:
    _libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    _libc.mincore.restype = ctypes.c_int
    _libc.sync_file_range.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    _libc.sync_file_range.restype = ctypes.c_int

# sync_file_range(2) flags
_WAIT_BEFORE, _WRITE, _WAIT_AFTER = 1, 2, 4

WRITEBACK_BYTES = 8 << 20
"""A writer starts the writeback of every this many bytes it wrote, and waits for the previous
such range (then drops it from the cache): at most about twice this is dirty at a time."""


def resident_pages(fd: int, size: int) -> bytearray | None:
    """One byte per page of the file's first ``size`` bytes, bit 0 set where the page is in the
    page cache; None when that cannot be known (an empty file, no ``mincore``)."""
    if not _ENABLED or size <= 0:
        return None
    try:
        # A private mapping: the kernel gives ctypes a writable buffer, and nothing is read
        # or written through it (mincore looks at the file's pages, not the mapping's).
        mapping = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
    except (OSError, ValueError):
        return None
    pages = (size + PAGE - 1) // PAGE
    vector = bytearray(pages)
    try:
        view = (ctypes.c_char * size).from_buffer(mapping)
        try:
            ok = _libc.mincore(ctypes.addressof(view), size, (ctypes.c_ubyte * pages).from_buffer(vector)) == 0
        finally:
            del view
    finally:
        mapping.close()
    return vector if ok else None


def drop(fd: int, offset: int = 0, length: int = 0) -> None:
    """Drop ``[offset, offset + length)`` of the file from the page cache (0: to the end);
    clean pages only: call it after the fsync for what was written."""
    if _ENABLED:
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def cold_runs(resident_before: bytearray, *, past_end: bool) -> list[tuple[int, int]]:
    """The runs ``[first page, end page)`` that were not resident in ``resident_before``; with
    ``past_end``, the last run reaches to the end of the file (end page 0): pages past the old
    end, read since, count as brought in."""
    cold = np.frombuffer(resident_before, dtype=np.uint8) & 1 == 0
    padded = np.concatenate(([False], cold, [past_end], [False])).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return [(start, 0 if end > len(cold) else end)
            for start, end in zip(edges[0::2].tolist(), edges[1::2].tolist(), strict=True)]


def drop_runs(fd: int, runs: list[tuple[int, int]]) -> None:
    for start, end in runs:
        drop(fd, start * PAGE, 0 if end == 0 else (end - start) * PAGE)


def drop_brought_in(fd: int, resident_before: bytearray | None) -> None:
    """Drop the pages of the file that were not resident in ``resident_before`` (runs of them
    at once); pages past its end, read since, count as brought in."""
    if resident_before is not None:
        drop_runs(fd, cold_runs(resident_before, past_end=True))


_round = threading.local()


@contextlib.contextmanager
def one_read_per_round() -> Iterator[None]:
    """A cleaning round reads its dirty segments twice (the offset map, then the rewrite).
    Dropping what the first pass brought in made the second read them from the disk again:
    twice the disk reads of Kafka's cleaner beside the broker, and a slower round (490 MB read
    and 0.91 s for a cold 244 MB partition, against 235 MB and 0.35 s keeping the pages).
    Inside this block, what cold reads bring in stays until the block ends; then exactly those
    pages are dropped - as ``cold_read`` would have, once - in every file still there and still
    the same file, within the size first read (a growing active segment's new tail is the
    broker's). Nested blocks belong to the outermost."""
    if getattr(_round, "pending", None) is not None:
        yield
        return
    pending: dict[tuple[int, int], tuple[str, list[tuple[int, int]]]] = {}
    _round.pending = pending
    try:
        yield
    finally:
        _round.pending = None
        for (dev, ino), (path, runs) in pending.items():
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue  # deleted or renamed away (a swap): nothing of it to keep or drop here
            try:
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) == (dev, ino):
                    drop_runs(fd, runs)
            finally:
                os.close(fd)


@contextlib.contextmanager
def cold_read(fd: int, size: int) -> Iterator[None]:
    """Read the file inside this block: afterwards only the pages it brought in are dropped
    (at the end of the round, inside ``one_read_per_round``)."""
    pending = getattr(_round, "pending", None)
    if pending is not None and _ENABLED:
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        if key not in pending:  # the first look is the broker's: later ones would see ours
            before = resident_pages(fd, size)
            if before is not None:
                pending[key] = (os.readlink(f"/proc/self/fd/{fd}"), cold_runs(before, past_end=False))
        yield
        return
    before = resident_pages(fd, size)
    try:
        yield
    finally:
        drop_brought_in(fd, before)


class Writeback:
    """Bounded dirty pages while a file is appended to: after each ``WRITEBACK_BYTES`` written,
    the kernel is asked to start writing them back (``sync_file_range`` ``WRITE``, which does
    not wait), and the range before it - written back by then, or waited for - is dropped from
    the cache. Durability is still the final fsync's (``sync_file_range`` writes data pages
    only, neither metadata nor the disk's cache)."""

    def __init__(self, fd: int, offset: int, chunk: int | None = None) -> None:
        self.fd = fd
        self.chunk = chunk or WRITEBACK_BYTES
        self.started = offset - offset % PAGE  # writeback asked for up to here
        self.dropped = self.started  # written back and dropped up to here

    def written(self, end: int) -> None:
        """The file now holds ``end`` bytes."""
        end -= end % PAGE  # whole pages: a page still being filled is the next range's
        if not _ENABLED or end - self.started < self.chunk:
            return
        if self.started > self.dropped:
            self._sync(self.dropped, self.started - self.dropped, _WAIT_BEFORE | _WRITE | _WAIT_AFTER)
            drop(self.fd, self.dropped, self.started - self.dropped)
            self.dropped = self.started
        self._sync(self.started, end - self.started, _WRITE)
        self.started = end

    def _sync(self, offset: int, length: int, flags: int) -> None:
        # Advice, not durability: a file system without it (EINVAL, ENOSYS) loses nothing.
        _libc.sync_file_range(self.fd, offset, length, flags)
