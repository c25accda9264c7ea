"""A reducer's shuffle input, bounded in memory: held as it arrives up to a budget, past it
written to the executor's local disk, and handed back one digest sub-range at a time.

Phase 1's reducer merges, per partition, every map task's share of the offset map and of the
groups' lookup keys; all of that is needed at once only per digest. A reducer owns a
contiguous range of the digest space (``blocks.reducer_of``), so it can work through that
range in ``passes`` disjoint sub-ranges: each pass reads the spilled blobs back in order and
keeps the rows of its sub-range, and its results (a sub-range's map, keep-lists, distinct
keys) are exactly that part of what one pass over everything gives. Memory is then about
the budget (the rows of one sub-range, plus one blob), whatever the reducer's share of the
keys; the disk is read once per pass, sequentially.

The budget is ``spark.kafkaCleaner.reducerMemory`` (a Spark size; the bytes of the blobs
held, which is about what their arrays take; merging and sorting a pass take about twice
that again).
"""

from __future__ import annotations

import os
import struct
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from . import blocks

REDUCER_MEMORY_CONF, REDUCER_MEMORY_DEFAULT = "spark.kafkaCleaner.reducerMemory", "512m"

Item = tuple[Any, tuple[int, int, int, int, bytes]]
"""A shuffled row: (reducer, (scope index, segment, group, flags, blob))."""

_FAMILIES = (("khi", ("khi", "klo", "kfirst", "klast")), ("mhi", ("mhi", "mlo")))
"""A blob's column families, each filtered by its own digest column."""
_LENGTH = struct.Struct(">IiiiI")


def _local_dir() -> str | None:
    """The executor's Spark local directory (removed with the executor), else the system's."""
    return os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0] or None


class ReducerInput:
    """What one reducer receives, in memory up to ``memory_bytes`` and on disk past it."""

    def __init__(self, reducer: int, reducers: int, memory_bytes: int) -> None:
        self.reducer, self.reducers, self.memory_bytes = reducer, reducers, max(1, memory_bytes)
        self._held: list[Item] = []
        self._held_bytes = 0
        self._total_bytes = 0
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._file: IO[bytes] | None = None

    def __enter__(self) -> ReducerInput:
        return self

    def __exit__(self, *_: object) -> None:
        if self._file is not None:
            self._file.close()
        if self._dir is not None:
            self._dir.cleanup()

    @property
    def spilled(self) -> bool:
        return self._file is not None

    @property
    def passes(self) -> int:
        """How many sub-ranges: one while everything fits, else enough for the budget."""
        return 1 if not self.spilled else -(-self._total_bytes // self.memory_bytes)

    def add_all(self, items: Iterable[Item]) -> ReducerInput:
        for item in items:
            self.add(item)
        return self

    def add(self, item: Item) -> None:
        size = len(item[1][4])
        self._total_bytes += size
        if self._file is None and self._held_bytes + size <= self.memory_bytes:
            self._held.append(item)
            self._held_bytes += size
            return
        if self._file is None:
            self._dir = tempfile.TemporaryDirectory(prefix="kafka-cleaner-reducer-", dir=_local_dir())
            self._file = open(Path(self._dir.name) / "input", "w+b")  # noqa: SIM115 - kept for the passes
            for held in self._held:
                self._write(held)
            self._held, self._held_bytes = [], 0
        self._write(item)

    def _write(self, item: Item) -> None:
        assert self._file is not None
        key, (index, segment, group, flags, blob) = item
        self._file.write(_LENGTH.pack(key, index, segment, group, flags) + struct.pack(">Q", len(blob)))
        self._file.write(blob)

    def _read(self) -> Iterator[Item]:
        assert self._file is not None
        self._file.flush()
        self._file.seek(0)
        while head := self._file.read(_LENGTH.size + 8):
            key, index, segment, group, flags = _LENGTH.unpack_from(head)
            (n,) = struct.unpack_from(">Q", head, _LENGTH.size)
            yield key, (index, segment, group, flags, self._file.read(n))

    def sub_ranges(self) -> Iterator[list[Item]]:
        """The input, one digest sub-range at a time (everything at once when it fit)."""
        if not self.spilled:
            yield self._held
            return
        first, end = _top_bits_range(self.reducer, self.reducers)
        passes = self.passes
        for k in range(passes):
            yield [kept for item in self._read() if (kept := _within(item, k, passes, first, end)) is not None]


def _top_bits_range(reducer: int, reducers: int) -> tuple[int, int]:
    """The digests' top 32 bits ``t`` this reducer owns: ``t * reducers >> 32 == reducer``."""

    def start(r: int) -> int:
        return -(-(r << 32) // reducers)

    return start(reducer), start(reducer + 1)


def _within(item: Item, k: int, passes: int, first: int, end: int) -> Item | None:
    """The rows of ``item``'s blob in sub-range ``k`` of ``passes`` (None: none of them);
    an item without rows (an unreadable segment's flag) belongs to every pass."""
    key, (index, segment, group, flags, blob) = item
    arrays = blocks.unpack(blob) if blob else {}
    if not arrays:
        return item
    out: dict[str, np.ndarray] = {}
    for digest, columns in _FAMILIES:
        if digest in arrays:
            top = (arrays[digest] >> np.uint64(32)).astype(np.int64)
            mask = ((top - first) * passes) // (end - first) == k
            out.update((c, arrays[c][mask]) for c in columns)
    if not any(a.size for a in out.values()):
        return None
    return key, (index, segment, group, flags, blocks.pack(**out))
