"""Numpy blocks of 128-bit key digests, the unit that goes through Spark's shuffle.

The offset map's key is the xxh3-128 digest of the key bytes (``cleaner.engine.offset_map``).
Here a set of digests is two ``uint64`` columns, ``hi`` and ``lo`` (the digest's first and
last 8 bytes read big-endian), so that numeric order is the digests' byte order and sorting,
merging and searching are plain numpy calls. A block is a few columns of such arrays
packed into one ``bytes`` blob: a map task sends one blob per reducer, never one Python
object per record.

The digest space is partitioned by the digest's top 32 bits: reducer ``r`` of ``R`` receives
the digests whose top 32 bits ``t`` have ``t * R >> 32 == r``, so concatenating the reducers'
sorted outputs in reducer order is sorted again, and there may be far more than 256 reducers.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

DIGEST_BYTES = 16
_EMPTY_U64 = np.zeros(0, dtype=np.uint64)
_EMPTY_I64 = np.zeros(0, dtype=np.int64)

# -- blobs ---------------------------------------------------------------------------------

_MAGIC = b"KCB1"
_HEAD = struct.Struct(">4sI")
_ARRAY = struct.Struct(">H2sQ")  # name length, dtype code, element count
_DTYPES = {b"u8": np.dtype("<u8"), b"i8": np.dtype("<i8"), b"u1": np.dtype("u1"), b"i4": np.dtype("<i4")}
_CODES = {v: k for k, v in _DTYPES.items()}


def pack(**arrays: np.ndarray) -> bytes:
    """Named 1-D arrays as one blob (little-endian, no pickling)."""
    parts = [_HEAD.pack(_MAGIC, len(arrays))]
    for name, array in arrays.items():
        a = np.ascontiguousarray(array)
        code = _CODES[a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype]
        raw = name.encode()
        parts.append(_ARRAY.pack(len(raw), code, a.size))
        parts.append(raw)
        parts.append(a.astype(_DTYPES[code], copy=False).tobytes())
    return b"".join(parts)


def unpack(blob: bytes) -> dict[str, np.ndarray]:
    magic, count = _HEAD.unpack_from(blob, 0)
    if magic != _MAGIC:
        raise ValueError("not a digest block")
    pos = _HEAD.size
    out: dict[str, np.ndarray] = {}
    view = memoryview(blob)
    for _ in range(count):
        name_len, code, n = _ARRAY.unpack_from(blob, pos)
        pos += _ARRAY.size
        name = bytes(view[pos : pos + name_len]).decode()
        pos += name_len
        dtype = _DTYPES[code]
        out[name] = np.frombuffer(view[pos : pos + n * dtype.itemsize], dtype=dtype)
        pos += n * dtype.itemsize
    return out


# -- digests as columns ----------------------------------------------------------------------


def split(digests: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n, 16) uint8 digests as (hi, lo) uint64 columns in the digests' byte order."""
    d = np.ascontiguousarray(digests, dtype=np.uint8).reshape(-1, DIGEST_BYTES)
    hi = d[:, :8].copy().view(">u8").reshape(-1).astype(np.uint64)
    lo = d[:, 8:].copy().view(">u8").reshape(-1).astype(np.uint64)
    return hi, lo


def order(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """The permutation sorting digests by (hi, lo). Sorting by ``hi`` alone is enough unless
    two digests share their first 8 bytes, which is checked."""
    perm = np.argsort(hi)
    h = hi[perm]
    if h.size > 1 and bool((h[1:] == h[:-1]).any()):
        perm = np.lexsort((lo, hi))
    return perm


def _run_starts(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """Start index of each run of equal digests in sorted columns."""
    if hi.size == 0:
        return np.zeros(0, dtype=np.int64)
    new = np.empty(hi.size, dtype=bool)
    new[0] = True
    new[1:] = (hi[1:] != hi[:-1]) | (lo[1:] != lo[:-1])
    return np.flatnonzero(new)


def reducer_of(hi: np.ndarray, reducers: int) -> np.ndarray:
    """Reducer index of each digest: by its top 32 bits (module doc)."""
    return ((hi >> np.uint64(32)).astype(np.int64) * reducers) >> 32


@dataclass
class KeySet:
    """Distinct digests, sorted."""

    hi: np.ndarray
    lo: np.ndarray

    @classmethod
    def empty(cls) -> KeySet:
        return cls(_EMPTY_U64, _EMPTY_U64)

    @classmethod
    def of(cls, hi: np.ndarray, lo: np.ndarray) -> KeySet:
        perm = order(hi, lo)
        hi, lo = hi[perm], lo[perm]
        starts = _run_starts(hi, lo)
        return cls(hi[starts], lo[starts])

    @classmethod
    def union(cls, sets: list[KeySet]) -> KeySet:
        if not sets:
            return cls.empty()
        if len(sets) == 1:
            return sets[0]
        return cls.of(np.concatenate([s.hi for s in sets]), np.concatenate([s.lo for s in sets]))

    def __len__(self) -> int:
        return int(self.hi.size)

    def find(self, hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
        """Index of each queried digest in this set, or -1."""
        n = self.hi.size
        if n == 0 or hi.size == 0:
            return np.full(hi.size, -1, dtype=np.int64)
        idx = np.searchsorted(self.hi, hi, side="left")
        safe = np.minimum(idx, n - 1)
        same_hi = (idx < n) & (self.hi[safe] == hi)
        hit = same_hi & (self.lo[safe] == lo)
        out = np.where(hit, safe, -1).astype(np.int64)
        # Digests sharing their first 8 bytes with another: walk the (tiny) run.
        for q in np.flatnonzero(same_hi & ~hit).tolist():
            j = int(idx[q]) + 1
            while j < n and self.hi[j] == hi[q]:
                if self.lo[j] == lo[q]:
                    out[q] = j
                    break
                j += 1
        return out

    def select(self, mask: np.ndarray) -> KeySet:
        return KeySet(self.hi[mask], self.lo[mask])


@dataclass
class KeyOffsets:
    """Distinct digests, sorted, with the first and the last offset each was seen at."""

    hi: np.ndarray
    lo: np.ndarray
    first: np.ndarray
    last: np.ndarray

    @classmethod
    def empty(cls) -> KeyOffsets:
        return cls(_EMPTY_U64, _EMPTY_U64, _EMPTY_I64, _EMPTY_I64)

    @classmethod
    def of(cls, hi: np.ndarray, lo: np.ndarray, first: np.ndarray, last: np.ndarray) -> KeyOffsets:
        """Aggregate occurrences (one row per occurrence or per partial aggregate): per
        digest the minimum ``first`` and the maximum ``last``."""
        if hi.size == 0:
            return cls.empty()
        perm = order(hi, lo)
        hi, lo, first, last = hi[perm], lo[perm], first[perm], last[perm]
        starts = _run_starts(hi, lo)
        return cls(hi[starts], lo[starts], np.minimum.reduceat(first, starts), np.maximum.reduceat(last, starts))

    @classmethod
    def merge(cls, parts: list[KeyOffsets]) -> KeyOffsets:
        parts = [p for p in parts if p.hi.size]
        if not parts:
            return cls.empty()
        if len(parts) == 1:
            return parts[0]
        return cls.of(
            np.concatenate([p.hi for p in parts]),
            np.concatenate([p.lo for p in parts]),
            np.concatenate([p.first for p in parts]),
            np.concatenate([p.last for p in parts]),
        )

    def __len__(self) -> int:
        return int(self.hi.size)

    @property
    def keys(self) -> KeySet:
        return KeySet(self.hi, self.lo)

    def select(self, mask: np.ndarray) -> KeyOffsets:
        return KeyOffsets(self.hi[mask], self.lo[mask], self.first[mask], self.last[mask])


class KeepList:
    """The offset map of one cleaning round restricted to the keys of one segment group:
    what the group's rewrite asks of the map (the engine's ``OffsetLookup``).

    ``latest_offset`` is the round's map latest offset (end offset - 1); ``get_many`` gives
    each key's latest offset in the dirty section, or -1 if the round's map does not hold
    it - exactly the answers ``OffsetMap`` gives for these keys; ``is_latest_many`` answers
    as the map does for the group's records the map build put.
    """

    def __init__(self, hi: np.ndarray, lo: np.ndarray, offsets: np.ndarray, latest_offset: int) -> None:
        self._keys = KeySet(hi, lo)
        self._offsets = offsets
        self._latest_offset = latest_offset
        self._values: np.ndarray | None = None

    @classmethod
    def from_blobs(cls, blobs: list[bytes], latest_offset: int) -> KeepList:
        """Keep-list parts from the reducers, each sorted, in reducer order (so the
        concatenation is sorted: reducers own ascending digest ranges; checked)."""
        parts = [unpack(b) for b in blobs]
        parts = [p for p in parts if p["hi"].size]
        if not parts:
            return cls(_EMPTY_U64, _EMPTY_U64, _EMPTY_I64, latest_offset)
        hi = np.concatenate([p["hi"] for p in parts])
        lo = np.concatenate([p["lo"] for p in parts])
        offsets = np.concatenate([p["offset"] for p in parts])
        if hi.size > 1 and not bool((hi[1:] >= hi[:-1]).all()):
            perm = order(hi, lo)
            hi, lo, offsets = hi[perm], lo[perm], offsets[perm]
        return cls(hi, lo, offsets, latest_offset)

    @property
    def latest_offset(self) -> int:
        return self._latest_offset

    def __len__(self) -> int:
        return len(self._keys)

    def get_many(self, digests: np.ndarray) -> np.ndarray:
        hi, lo = split(digests)
        idx = self._keys.find(hi, lo)
        out = np.full(idx.size, -1, dtype=np.int64)
        found = idx >= 0
        out[found] = self._offsets[idx[found]]
        return out

    def is_latest_many(self, offsets: np.ndarray) -> np.ndarray:
        """For records of the group the map has seen: whether each offset is its key's
        mapped offset. Such a record's key is one of the group's keys, so it is in this
        list, and its offset is the key's value iff it is one of the list's values."""
        if self._values is None:
            self._values = np.sort(self._offsets)
        offsets = np.asarray(offsets, dtype=np.int64)
        at = np.searchsorted(self._values, offsets)
        found = np.zeros(offsets.shape, dtype=bool)
        inside = at < self._values.size
        found[inside] = self._values[at[inside]] == offsets[inside]
        return found
