"""Every reader of a file a running broker writes, given that file cut short at any byte (a
write in progress, a truncation, an index trimmed at a roll between two reads): it reads what
is there or raises a typed ``KafkaCleanerError``; never ``struct.error``, ``IndexError`` or
``ValueError`` (issue 21, item 5)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cleaner.errors import FileChangedError, KafkaCleanerError
from cleaner.generate import GeneratorConfig, generate
from cleaner.replica_facts import _index_floor
from cleaner.storage.checkpoint import parse_offset_checkpoint
from cleaner.storage.index import OffsetIndex, TimeIndex, TransactionIndex
from cleaner.storage.metadata import parse_leader_epoch_checkpoint, parse_meta_properties, parse_partition_metadata
from cleaner.storage.producer_state import decode_snapshot
from cleaner.storage.segment import LogSegment

NOW_MS = 1_700_000_000_000


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("short") / "kafka-logs"
    generate(
        path,
        GeneratorConfig(
            now_ms=NOW_MS, topics=1, partitions=1, records=2_000, keys=200, segment_bytes=32 * 1024, transactions=0.3
        ),
    )
    return path


def _files(log_dir: Path) -> dict[str, tuple[bytes, Callable[[bytes], Any]]]:
    pdir = log_dir / "topic-0-0"
    index = max(pdir.glob("*.index"), key=lambda p: p.stat().st_size)
    tindex = max(pdir.glob("*.timeindex"), key=lambda p: p.stat().st_size)
    txn = max(pdir.glob("*.txnindex"), key=lambda p: p.stat().st_size, default=None)
    snapshot = max(pdir.glob("*.snapshot"), key=lambda p: p.stat().st_size)
    base = int(index.name.split(".")[0])
    files: dict[str, tuple[bytes, Callable[[bytes], Any]]] = {
        "replication-offset-checkpoint": (
            (log_dir / "replication-offset-checkpoint").read_bytes(),
            parse_offset_checkpoint,
        ),
        "meta.properties": ((log_dir / "meta.properties").read_bytes(), parse_meta_properties),
        "partition.metadata": ((pdir / "partition.metadata").read_bytes(), parse_partition_metadata),
        "leader-epoch-checkpoint": ((pdir / "leader-epoch-checkpoint").read_bytes(), parse_leader_epoch_checkpoint),
        "producer snapshot": (snapshot.read_bytes(), decode_snapshot),
        "offset index": (index.read_bytes(), lambda b: OffsetIndex.from_bytes(b, base)),
        "time index": (tindex.read_bytes(), lambda b: TimeIndex.from_bytes(b, int(tindex.name.split(".")[0]))),
    }
    if txn is not None:
        files["txn index"] = (txn.read_bytes(), lambda b: TransactionIndex.from_bytes(b, int(txn.name.split(".")[0])))
    return files


def test_every_prefix_of_a_brokers_file_reads_or_is_a_typed_error(log_dir: Path) -> None:
    for name, (data, parse) in _files(log_dir).items():
        assert data, name
        for n in range(len(data) + 1):
            try:
                parse(data[:n])
            except KafkaCleanerError:
                pass
            except Exception as e:  # the failure the test is about
                raise AssertionError(f"{name} cut at byte {n} of {len(data)}: {type(e).__name__}: {e}") from e


@settings(max_examples=60, deadline=None)
@given(trim_to=st.integers(min_value=0, max_value=4096), at_call=st.integers(min_value=0, max_value=30))
def test_an_index_trimmed_at_any_read_of_the_probe_search(
    tmp_path_factory: pytest.TempPathFactory, log_dir: Path, trim_to: int, at_call: int
) -> None:
    """``replica_facts._index_floor`` (a binary search with 8-byte reads of a preallocated
    index) with the file trimmed before its ``at_call``-th read: the answer of the whole
    file or of the trimmed one, or ``FileChangedError``. Old code: ``struct.error``."""
    import cleaner.replica_facts as module

    source = max((log_dir / "topic-0-0").glob("*.index"), key=lambda p: p.stat().st_size)
    index = tmp_path_factory.mktemp("idx") / source.name
    index.write_bytes(source.read_bytes())
    base = int(index.name.split(".")[0])
    os.truncate(index, 64 * 1024)  # preallocated
    whole = _index_floor(index, base, base + 700)
    trim_to = min(trim_to, source.stat().st_size) // 8 * 8
    calls = [0]
    real = os.pread

    class Os:
        def __getattr__(self, name: str) -> Any:
            return getattr(os, name)

        @staticmethod
        def pread(fd: int, n: int, position: int) -> bytes:
            if calls[0] == at_call:
                os.truncate(index, trim_to)
            calls[0] += 1
            return real(fd, n, position)

    module_os = module.os
    module.os = Os()  # type: ignore[assignment]
    try:
        try:
            got = _index_floor(index, base, base + 700)
        except FileChangedError as e:
            assert str(index) in str(e)
            return
    finally:
        module.os = module_os
    assert got in (whole, _index_floor(index, base, base + 700))


@pytest.mark.parametrize("entry_size,kind", [(8, "index"), (12, "timeindex")])
def test_the_last_index_entry_of_a_file_trimmed_under_the_read(
    log_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entry_size: int, kind: str
) -> None:
    """``LogSegment``'s read of an index's last entry alone (the log end offset, the max
    timestamp) when the roll trims the preallocated file between its ``fstat`` and ``pread``.
    Old code: ``IndexError`` from numpy."""
    import cleaner.storage.segment as segment_module

    target = tmp_path / f"00000000000000000000.{kind}"
    target.write_bytes(b"\0" * 4096)
    real = os.pread

    class Os:
        def __getattr__(self, name: str) -> Any:
            return getattr(os, name)

        @staticmethod
        def pread(fd: int, n: int, position: int) -> bytes:
            os.truncate(target, 0)
            return real(fd, n, position)

    monkeypatch.setattr(segment_module, "os", Os())
    with pytest.raises(KafkaCleanerError) as raised:
        segment_module._tail_entry(target, entry_size, ">i4,>i4" if entry_size == 8 else ">i8,>i4")
    assert isinstance(raised.value, FileChangedError)
    assert LogSegment is not None
