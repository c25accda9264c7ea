"""cleaner.storage.files: durable writes, and that faults injected by patching its functions
leave the old file intact and no temp file behind."""

from __future__ import annotations

import errno
import os

import pytest

from cleaner.storage import files


def _enospc(*_args: object, **_kwargs: object) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_atomic_write_creates_and_replaces(tmp_path):
    target = tmp_path / "f"
    files.atomic_write(target, b"one")
    assert target.read_bytes() == b"one"
    files.atomic_write(target, b"two, longer")
    assert target.read_bytes() == b"two, longer"
    assert sorted(os.listdir(tmp_path)) == ["f"]


def test_atomic_write_order_is_write_fsync_rename_dirsync(tmp_path, monkeypatch):
    calls: list[str] = []
    real_fsync, real_rename, real_dir = files.fsync_file, files.rename, files.fsync_dir

    def fsync(fd):
        calls.append("fsync")
        real_fsync(fd)

    def rename(src, dst):
        calls.append(f"rename {os.path.basename(src)}->{os.path.basename(dst)}")
        real_rename(src, dst)

    def fsync_dir(path):
        calls.append("fsync_dir")
        assert os.path.samefile(path, tmp_path)
        real_dir(path)

    monkeypatch.setattr(files, "fsync_file", fsync)
    monkeypatch.setattr(files, "rename", rename)
    monkeypatch.setattr(files, "fsync_dir", fsync_dir)
    files.atomic_write(tmp_path / "cp", b"x")
    assert calls == ["fsync", "rename cp.tmp->cp", "fsync_dir"]


@pytest.mark.parametrize("step", ["fsync_file", "rename"])
def test_atomic_write_failure_keeps_old_file_and_removes_tmp(tmp_path, monkeypatch, step):
    target = tmp_path / "cp"
    target.write_bytes(b"old content")
    monkeypatch.setattr(files, step, _enospc)
    with pytest.raises(OSError) as info:
        files.atomic_write(target, b"new content")
    assert info.value.errno == errno.ENOSPC
    assert target.read_bytes() == b"old content"
    assert sorted(os.listdir(tmp_path)) == ["cp"]


def test_atomic_write_failure_on_new_file_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "fsync_file", _enospc)
    with pytest.raises(OSError):
        files.atomic_write(tmp_path / "cp", b"new")
    assert os.listdir(tmp_path) == []


def test_atomic_write_dir_fsync_failure_after_rename(tmp_path, monkeypatch):
    target = tmp_path / "cp"
    target.write_bytes(b"old")
    monkeypatch.setattr(files, "fsync_dir", _enospc)
    with pytest.raises(OSError):
        files.atomic_write(target, b"new")
    # The rename already happened (and the data was fsynced): new content, no tmp file.
    assert target.read_bytes() == b"new"
    assert sorted(os.listdir(tmp_path)) == ["cp"]


def test_write_file_truncates_and_fsyncs(tmp_path, monkeypatch):
    synced: list[int] = []
    real = files.fsync_file
    monkeypatch.setattr(files, "fsync_file", lambda fd: (synced.append(fd), real(fd)))
    path = tmp_path / "00000000000000000000.log.cleaned"
    path.write_bytes(b"a much longer previous content")
    files.write_file(path, b"abc")
    assert path.read_bytes() == b"abc"
    assert len(synced) == 1
    files.write_file(path, b"", fsync=False)
    assert path.read_bytes() == b""
    assert len(synced) == 1


def test_write_file_failure_removes_partial_file(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "fsync_file", _enospc)
    path = tmp_path / "x.cleaned"
    with pytest.raises(OSError):
        files.write_file(path, b"data")
    assert not path.exists()


def test_write_file_accepts_memoryview_and_large_data(tmp_path):
    data = bytes(range(256)) * 40_000
    files.write_file(tmp_path / "big", memoryview(data))
    assert (tmp_path / "big").read_bytes() == data


def test_rename_replaces_and_remove(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"A")
    b.write_bytes(b"B")
    files.rename(a, b)
    assert not a.exists() and b.read_bytes() == b"A"
    files.remove(b)
    assert not b.exists()
    files.remove(b)  # missing_ok by default
    with pytest.raises(FileNotFoundError):
        files.remove(b, missing_ok=False)


def test_fsync_helpers_sync_the_file_or_directory_they_are_given(tmp_path, monkeypatch):
    """Each helper calls the real ``os.fsync`` (spied on, not replaced) on a descriptor of the
    very inode it was given, whether given a path, a str or a descriptor; a missing path is an
    error, never a silent no-op."""
    p = tmp_path / "f"
    p.write_bytes(b"x")
    synced: list[int] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    files.fsync_file(p)
    files.fsync_file(str(p))
    fd = os.open(p, os.O_RDONLY)
    try:
        files.fsync_file(fd)
    finally:
        os.close(fd)
    files.fsync_dir(tmp_path)
    assert synced == [p.stat().st_ino] * 3 + [tmp_path.stat().st_ino]
    with pytest.raises(FileNotFoundError):
        files.fsync_file(tmp_path / "missing")
    with pytest.raises(FileNotFoundError):
        files.fsync_dir(tmp_path / "missing")


def test_set_mtime_ms_keeps_atime(tmp_path):
    p = tmp_path / "seg.log"
    p.write_bytes(b"x")
    os.utime(p, ns=(1_000_000_000_123_000_000, 5))
    files.set_mtime_ms(p, 1_700_000_000_123)
    st = os.stat(p)
    assert st.st_mtime_ns == 1_700_000_000_123_000_000
    assert st.st_atime_ns == 1_000_000_000_123_000_000
