"""The offset map: key digest -> latest offset, in a fixed amount of memory.

Kafka's ``SkimpyOffsetMap`` stores a 16-byte MD5 and an 8-byte offset per slot (24 bytes;
26.7 bytes per usable key at the default load factor 0.9). This map keeps the same
contract (``put`` refuses once ``size`` reaches ``slots * loadFactor``; ``latestOffset``
follows every put) in less memory:

- digests are xxh3-128 (16 bytes, the full digest is always compared: a collision
  would silently drop a live record, so nothing weaker than 128 bits);
- offsets are stored relative to the round's first dirty offset in 32 bits (a round
  ends where an offset no longer fits, see ``offset_limit``);
- the table is split into 256 partitions by the digest's first byte, which is then
  implied by the partition and not stored.

That is 19 bytes a slot, 21.1 bytes per usable key at load factor 0.9. Each slot is one
row of a single buffer (a probe touches one cache line), probed with double hashing over a prime table size by the
compiled core (``native/src/offset_map.rs``), which releases the GIL; Kafka's put rules
(when the map is full, which offsets a round can hold) stay here.

A round whose offsets are fewer than the map's keys cannot fill it, so it does not need all of
it: told where the round's offsets end, the map lays a smaller table over the first pages of
its buffer, just big enough for one key per offset (unpartitioned, so no partition of it can
fill first). The pages past it are never touched, so the kernel never has to fault them in
and zero them: that was a quarter of the CPU of cleaning a 200,000-record partition with the
default 128 MiB buffer (``perf``: ``clear_page_erms`` under huge-page faults), and a
long-lived sidecar's map stays as big as its largest round needed. Should an offset past that
end arrive anyway (a log whose segments overlap), the keys move to the whole buffer's table.
"""

from __future__ import annotations

import contextlib
import math
import mmap
from collections.abc import Sequence

import numpy as np

from cleaner import _native

DIGEST_SIZE = 16
PARTITION_BITS = 8
PARTITIONS = 1 << PARTITION_BITS
MIN_SLOTS_PER_PARTITION = 4096  # below this, per-partition fill varies too much
_MAX_RELATIVE = 2**32 - 2  # stored as relative + 1, and 0 marks an empty slot


def digest_keys(data: bytes | bytearray | memoryview, starts: Sequence[int], ends: Sequence[int]) -> np.ndarray:
    """xxh3-128 of each key ``data[start:end]``, as an (n, 16) uint8 array (big-endian
    digest), computed by the compiled core without the GIL."""
    if not isinstance(data, bytes):
        data = bytes(data)
    flat = _native.digest_keys(data, np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64))
    return flat.reshape(-1, DIGEST_SIZE)


def digest_key(key: bytes) -> np.ndarray:
    """One key's digest, as a (1, 16) array (``digest_keys`` of a single key)."""
    return digest_keys(key, [0], [len(key)])


def _is_prime(n: int) -> bool:
    if n < 4:
        return n >= 2
    return n % 2 == 1 and all(n % d for d in range(3, math.isqrt(n) + 1, 2))


def _largest_prime_at_most(n: int) -> int:
    """Double hashing visits every slot only when the table size is prime."""
    if n < 2:
        return n
    while not _is_prime(n):
        n -= 1
    return n


def _smallest_prime_at_least(n: int) -> int:
    while not _is_prime(n):
        n += 1
    return n


def _layout(memory: int) -> tuple[int, int, int]:
    """(partitions, bytes per slot, slots per partition) of a map of ``memory`` bytes."""
    partitioned = memory // (19 * PARTITIONS) >= MIN_SLOTS_PER_PARTITION
    partitions = PARTITIONS if partitioned else 1
    bytes_per_entry = 19 if partitioned else 20  # the partition byte is implied when partitioned
    return partitions, bytes_per_entry, _largest_prime_at_most(memory // (bytes_per_entry * partitions))


def _max_keys(slots: int, partitions: int, load_factor: float) -> int:
    # Kafka: maxDesiredMapSize = (int)(slots * loadFactor). Each partition also keeps
    # one slot free so that every probe sequence ends.
    return min(int(slots * load_factor), slots - partitions)


def offset_map_capacity(memory: int, load_factor: float = 0.9) -> int:
    """How many keys a map of ``memory`` bytes holds in one round, without allocating it."""
    partitions, _, per_partition = _layout(memory)
    return max(_max_keys(per_partition * partitions, partitions, load_factor), 0)


def kafka_offset_map_capacity(memory: int, load_factor: float = 0.9) -> int:
    """The same for Kafka's ``SkimpyOffsetMap`` with MD5: 24 bytes a slot (16-byte hash and an
    8-byte offset), ``(int)(slots * loadFactor)`` keys; 5.03 M for 128 MiB at 0.9."""
    return int((memory // 24) * load_factor)


class OffsetMap:
    """Key digest -> latest offset in exactly ``memory`` bytes (or less), reused across rounds."""

    def __init__(self, memory: int, load_factor: float = 0.9) -> None:
        if not 0 < load_factor <= 1:
            raise ValueError(f"load factor must be in (0, 1], got {load_factor}")
        self.partitions, self.bytes_per_entry, self.slots_per_partition = _layout(memory)
        self.slots = self.slots_per_partition * self.partitions
        if self.slots * load_factor <= 1:
            raise ValueError(
                f"offset map is too small to fit in even a single message ({memory} bytes give {self.slots} slots at "
                f"load factor {load_factor}); increase dedupeBufferSize or decrease threads"
            )
        self.load_factor = load_factor
        self.max_keys = _max_keys(self.slots, self.partitions, load_factor)
        self._whole = (self.partitions, self.bytes_per_entry, self.slots_per_partition)
        # One row per slot: the stored offset (uint32, little-endian: relative + 1, 0 =
        # empty), then digest bytes 1..16, then byte 0 when it is not implied.
        self._buffer = _zeroed_buffer(self.slots * self.bytes_per_entry)
        self.memory = self._buffer.nbytes
        self.size = 0
        self.base_offset = 0
        self.latest_offset = -1
        self._end_offset: int | None = None
        self._values: np.ndarray | None = None
        self._use_table(*self._whole)

    # -- Kafka's OffsetMap API --------------------------------------------------------

    def clear(self, base_offset: int = 0, end_offset: int | None = None) -> None:
        """Empty the map for a new round whose offsets start at ``base_offset`` and, when
        given, end before ``end_offset`` (the module's docstring: such a round uses only the
        table its offsets can fill). An empty map stays untouched (its pages are not even
        mapped until keys arrive); otherwise one contiguous write zeroes the table in use."""
        if self.size:
            self._rows.fill(0)
        self.size = 0
        self.base_offset = base_offset
        self.latest_offset = -1
        self._values = None
        self._end_offset = end_offset
        self._use_table(*self._table_for(None if end_offset is None else end_offset - base_offset))

    @property
    def utilization(self) -> float:
        return self.size / self.slots

    @property
    def bytes_per_usable_key(self) -> float:
        return self.memory / self.max_keys

    @property
    def offset_limit(self) -> int:
        """The largest offset this round's map can hold."""
        return self.base_offset + _MAX_RELATIVE

    def update_latest_offset(self, offset: int) -> None:
        self.latest_offset = offset

    def put(self, key_digest: np.ndarray, offset: int) -> bool:
        return self.put_many(key_digest.reshape(1, DIGEST_SIZE), np.array([offset], dtype=np.int64)) == 1

    def get(self, key_digest: np.ndarray) -> int:
        return int(self.get_many(key_digest.reshape(1, DIGEST_SIZE))[0])

    # -- vectorised forms ---------------------------------------------------------------

    def put_many(self, digests: np.ndarray, offsets: np.ndarray) -> int:
        """Insert keys in order, as Kafka's map-building loop does record by record:
        a key may only be put while ``size < max_keys`` (checked before *every* put,
        also of keys already present). Returns how many were put; fewer than given means
        the map became full before that key. ``latest_offset`` is the last put offset."""
        n = int(offsets.shape[0])
        if n == 0:
            return 0
        relative = np.asarray(offsets, dtype=np.int64) - self.base_offset
        if relative.min() < 0 or relative.max() > _MAX_RELATIVE:
            raise ValueError("offset outside the range of this round (see offset_limit)")
        if self._end_offset is not None and (
            relative.max() >= self._end_offset - self.base_offset or self.size + n >= self.slots_per_partition
        ):
            self._move_to_the_whole_buffer()
        flat = _digest_bytes(digests)
        stored = (relative + 1).astype(np.uint32)
        done = 0
        while done < n:
            room = self._room()
            if room <= 0:
                break
            upto = min(n, done + room)
            self._values = None
            self.size += _native.offset_map_insert(
                self._rows,
                self._partition_sizes,
                self.slots_per_partition,
                flat[done * DIGEST_SIZE : upto * DIGEST_SIZE],
                stored[done:upto],
            )
            done = upto
        if done:
            self.latest_offset = int(offsets[done - 1])
        return done

    def is_latest_many(self, offsets: np.ndarray) -> np.ndarray:
        """For offsets of records the map has seen (at or after ``base_offset``, at most
        ``latest_offset``): whether each is the mapped offset of its key.

        Such a record was put, so its key maps to an offset >= its own, and Kafka keeps it
        iff that offset is its own: iff the offset is one of the map's values (also when
        two keys share a digest: each digest holds one value). This answers without
        hashing the key again."""
        if self._values is None:
            self._values = np.sort(_native.offset_map_values(self._rows, self.bytes_per_entry))
        relative = (np.asarray(offsets, dtype=np.int64) - self.base_offset + 1).astype(np.uint32)
        at = np.searchsorted(self._values, relative)
        found = np.zeros(relative.shape, dtype=bool)
        inside = at < self._values.size
        found[inside] = self._values[at[inside]] == relative[inside]
        return found

    def get_many(self, digests: np.ndarray) -> np.ndarray:
        """The mapped offset of each key, or -1."""
        slots, found = _native.offset_map_locate(
            self._rows, self.partitions, self.slots_per_partition, _digest_bytes(digests)
        )
        out = np.full(found.shape, -1, dtype=np.int64)
        out[found] = self._offsets[slots[found]].astype(np.int64) - 1 + self.base_offset
        return out

    # -- the table ----------------------------------------------------------------------

    def _room(self) -> int:
        """How many puts can certainly succeed: the global cap, and each partition's
        reserved free slot of the table in use (only ever binding on adversarial digests
        when it is the whole buffer; a round's smaller table has one partition and room for
        one key per offset of the round)."""
        return min(self.max_keys - self.size, int((self.slots_per_partition - 1 - self._partition_sizes).min()))

    def _table_for(self, offsets: int | None) -> tuple[int, int, int]:
        """(partitions, bytes per slot, slots per partition) of the table for a round of at
        most ``offsets`` offsets: one slot per offset within the load factor, plus the free
        one, when that is at most half the buffer (the keys a move to the whole buffer copies
        out then fit in the other half; a bigger table would save little)."""
        if offsets is not None:
            slots = max(math.ceil(offsets / self.load_factor), offsets + 1, 2)
            if slots * 20 < self.memory // 2:
                return 1, 20, _smallest_prime_at_least(slots)
        return self._whole

    def _use_table(self, partitions: int, bytes_per_entry: int, slots_per_partition: int) -> None:
        """Lay a zeroed table of this shape over the start of the buffer."""
        self.partitions, self.bytes_per_entry = partitions, bytes_per_entry
        self.slots_per_partition = slots_per_partition
        slots = partitions * slots_per_partition
        self._rows = self._buffer[: slots * bytes_per_entry]
        self._offsets = np.ndarray((slots,), dtype="<u4", buffer=self._rows, offset=0, strides=(bytes_per_entry,))
        self._partition_sizes = np.zeros(partitions, dtype=np.int64)

    def _move_to_the_whole_buffer(self) -> None:
        """An offset past the round's announced end, or more puts than its offsets (each put
        has its own, later offset in record order): the keys so far move to the table of the
        whole buffer, so that the smaller table never refuses a put the whole one would take
        (rare: the announced end is where the round's segments end). Were the keys so far
        also crafted to share one of its partitions past its free slot, the move fails with
        the core's "offset map partition full": that partition's clean fails in its map
        phase, before anything is written."""
        self._end_offset = None
        if (self.partitions, self.bytes_per_entry, self.slots_per_partition) == self._whole:
            return
        rows = self._rows.reshape(-1, self.bytes_per_entry)
        stored = self._offsets.copy()
        taken = stored != 0
        digests = np.concatenate([rows[taken, -1:], rows[taken, 4:-1]], axis=1)  # byte 0, then bytes 1..16
        self._rows.fill(0)
        self._use_table(*self._whole)
        self._values = None
        _native.offset_map_insert(
            self._rows, self._partition_sizes, self.slots_per_partition, _digest_bytes(digests), stored[taken]
        )


def _digest_bytes(digests: np.ndarray) -> bytes:
    """(n, 16) digests as the n * 16 bytes the compiled core probes with."""
    return np.ascontiguousarray(digests, dtype=np.uint8).tobytes()


def _zeroed_buffer(size: int) -> np.ndarray:
    """``size`` zero bytes from a private anonymous mapping backed by transparent huge pages
    where the kernel offers them: the table is touched at random, and a round's first touches
    of 4 KiB pages, or reads of never-touched ones, cost ~3 us each (~100 ms for 128 MiB).
    Private, because a shared anonymous mapping (``mmap.mmap(-1, n)``'s default) is shmem,
    which gets huge pages only where ``shmem_enabled`` says so (rarely): with it, a round of
    200 k keys put in 150-190 ms, not 37-43 ms, and a 2,000-key round's scan of the map took
    85-93 ms, not 5-6 ms (this VM, 2026-11-27)."""
    mapping = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(AttributeError, OSError):
        mapping.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(mapping, dtype=np.uint8, count=size)
