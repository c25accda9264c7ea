"""Page-cache neutral reads and writes, on this machine's real page cache (issue 26 item 2).

A file's pages are dropped, some read again (the broker's hot pages), then the whole file is
read inside ``cold_read``: the hot pages are still resident afterwards and none of the others
are. Needs Linux and a disk-backed file system (tmpfs pages cannot be dropped: skipped)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cleaner.storage import files, page_cache
from cleaner.storage.segment import iter_file_batches

PAGES = 256


def _fresh_file(path: Path, pages: int = PAGES) -> int:
    path.write_bytes(os.urandom(pages * page_cache.PAGE))
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    page_cache.drop(fd)
    return fd


def _resident(fd: int) -> set[int]:
    vector = page_cache.resident_pages(fd, os.fstat(fd).st_size)
    assert vector is not None
    return {i for i, state in enumerate(vector) if state & 1}


def _broker_reads(fd: int, pages: set[int]) -> None:
    """The broker's own reads of ``pages``, through a descriptor of their own without read-ahead:
    read-ahead still in flight when a test looks at what is resident would land afterwards, and
    look like pages the cleaner brought in (a loaded CI run: pages 68-74 of a read of 50-59)."""
    broker = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)
    try:
        os.posix_fadvise(broker, 0, 0, os.POSIX_FADV_RANDOM)
        for page in pages:
            os.pread(broker, page_cache.PAGE, page * page_cache.PAGE)
    finally:
        os.close(broker)


@pytest.fixture
def dropped_file(tmp_path: Path):  # type: ignore[no-untyped-def]
    fd = _fresh_file(tmp_path / "segment.log")
    if page_cache.resident_pages(fd, 1) is None:
        pytest.skip("no mincore here (not Linux, or KAFKA_CLEANER_PAGE_CACHE=keep)")
    if _resident(fd):
        pytest.skip("this file system keeps the pages (tmpfs?): nothing to measure")
    yield fd
    os.close(fd)


def test_a_cold_read_drops_only_the_pages_it_brought_in(dropped_file: int) -> None:
    fd = dropped_file
    hot = set(range(10, 40)) | {100, 200}
    _broker_reads(fd, hot)
    before = _resident(fd)  # the hot pages, and what the kernel read ahead of them
    assert hot <= before and len(before) < PAGES // 2
    with page_cache.cold_read(fd, PAGES * page_cache.PAGE):
        for page in range(PAGES):
            os.pread(fd, page_cache.PAGE, page * page_cache.PAGE)
        assert len(_resident(fd)) > PAGES // 2  # read: resident meanwhile
    assert _resident(fd) == before


def test_reading_a_segment_leaves_the_cache_as_it_was(tmp_path: Path) -> None:
    """``iter_file_batches`` (every reader of a segment: the cleaner's passes, the sidecar's
    scans) reads cold; a page the broker had resident stays."""
    from cleaner.records.builder import build_batch
    from cleaner.records.record import Record

    batch = build_batch([Record(offset=i, timestamp=0, key=b"k%d" % i, value=os.urandom(3000)) for i in range(200)],
                        base_offset=0)
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(bytes(batch) * 1)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        page_cache.drop(fd)
        if page_cache.resident_pages(fd, 1) is None or _resident(fd):
            pytest.skip("no mincore, or a file system that keeps the pages")
        os.pread(fd, page_cache.PAGE, 0)  # the broker's hot page (and what the kernel reads ahead)
        before = _resident(fd)
        assert 0 in before and len(before) < os.fstat(fd).st_size // page_cache.PAGE
        assert sum(len(b) for b in iter_file_batches(path)) == 1
        assert _resident(fd) == before
    finally:
        os.close(fd)


def test_what_is_written_leaves_the_cache_once_durable(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.log.cleaned"
    files.write_file(path, os.urandom(64 * page_cache.PAGE))
    fd = os.open(path, os.O_RDONLY)
    try:
        if page_cache.resident_pages(fd, 1) is None:
            pytest.skip("no mincore here")
        assert _resident(fd) == set()
    finally:
        os.close(fd)


def test_a_segment_being_written_is_written_back_as_it_goes(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A cleaned segment is written through the page cache and fsynced at the end. Before,
    every byte of it stayed dirty until that fsync (one burst of writeback, and the kernel's
    dirty throttling stalls the broker's appends meanwhile); now all but the last ranges of
    ``WRITEBACK_BYTES`` are written back and dropped while the segment is still being written."""
    from cleaner.records.builder import build_batch
    from cleaner.records.record import Record
    from cleaner.storage.segment import LogSegment

    chunk = 64 * page_cache.PAGE
    monkeypatch.setattr(page_cache, "WRITEBACK_BYTES", chunk)
    segment = LogSegment.create(tmp_path, 0, suffix=".cleaned")
    offset = 0
    try:
        while segment.size < 16 * chunk:
            records = [Record(offset=offset + i, timestamp=0, key=b"k%d" % i, value=os.urandom(1000))
                       for i in range(50)]
            segment.append(bytes(build_batch(records, base_offset=offset)))
            offset += 50
        fd = os.open(segment.log_path, os.O_RDONLY)
        try:
            if page_cache.resident_pages(fd, 1) is None:
                pytest.skip("no mincore here")
            resident = _resident(fd)
            pages = segment.size // page_cache.PAGE
            # At most the range being written back and the one after it are still cached.
            assert len(resident) <= 3 * chunk // page_cache.PAGE, (len(resident), pages)
            assert not resident & set(range(pages - 4 * chunk // page_cache.PAGE))
            segment.flush()
            assert _resident(fd) == set()
        finally:
            os.close(fd)
    finally:
        segment.close()


def _disk_reads() -> int:
    with open("/proc/self/io") as f:
        return int(dict(line.split(": ") for line in f.read().splitlines())["read_bytes"])


def test_a_round_reads_each_page_from_the_disk_once_and_drops_it_at_its_end(dropped_file: int) -> None:
    """A round reads its dirty segments twice (the offset map, then the rewrite). Each pass
    dropped what it brought in, so the second read everything from the disk again (490 MB read
    for a cold 244 MB partition). Inside ``one_read_per_round`` the second pass finds the pages
    the first brought in; when the round ends those are dropped, and the broker's stay."""
    fd = dropped_file
    _broker_reads(fd, set(range(50, 60)))
    before = _resident(fd)
    size = PAGES * page_cache.PAGE
    with page_cache.one_read_per_round():
        for _ in range(2):  # the map build's pass, then the rewrite's
            read_before = _disk_reads()
            with page_cache.cold_read(fd, size):
                for page in range(PAGES):
                    os.pread(fd, page_cache.PAGE, page * page_cache.PAGE)
            read = _disk_reads() - read_before
        assert read == 0, f"the second pass read {read} bytes from the disk"
        assert len(_resident(fd)) == PAGES
    assert _resident(fd) == before
