"""The offset map against a plain dict model of Kafka's SkimpyOffsetMap contract."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cleaner.engine.offset_map import OffsetMap, digest_key, digest_keys


def _digests(keys: list[bytes]) -> np.ndarray:
    data = b"".join(keys)
    ends = np.cumsum([len(k) for k in keys]).tolist()
    starts = [e - len(k) for e, k in zip(ends, keys, strict=True)]
    return digest_keys(data, starts, ends)


def test_digest_is_xxh3_128_big_endian() -> None:
    import xxhash

    assert bytes(digest_key(b"k")[0]) == xxhash.xxh3_128_digest(b"k")
    assert _digests([b"a", b"bc"]).tolist() == [list(xxhash.xxh3_128_digest(k)) for k in (b"a", b"bc")]


def test_default_buffer_beats_kafka_on_memory() -> None:
    m = OffsetMap(128 * 1024 * 1024, 0.9)
    assert m.memory <= 128 * 1024 * 1024
    assert m.bytes_per_usable_key <= 22  # Kafka: 24-byte slots at 0.9 = 26.7
    assert m.max_keys > 5_033_164  # Kafka's usable keys with MD5 and the same buffer


def test_too_small_map_is_refused_like_kafka() -> None:
    with pytest.raises(ValueError, match="too small to fit in even a single message"):
        OffsetMap(20, 0.5)


#: (memory, the keys it holds at load factor 0.9), worked out by hand from the layout in the
#: module's docstring: 20 bytes a slot below the partitioned size, the largest prime number
#: of slots that fits, int(slots * 0.9) keys, one slot kept free: 2000 B -> 97 slots -> 87;
#: 10000 B -> 499 slots -> 449; and a partitioned map, 5*19*256*4096 B -> 256 partitions of
#: 19 bytes a slot, 20479 slots each (the prime below 20480) -> 4,718,361 (never filled here).
#: Not taken from the code under test.
CAPACITIES = [(2_000, 87), (10_000, 449), (5 * 19 * 256 * 4096, 4_718_361)]


@settings(max_examples=120)
@given(
    st.lists(st.integers(0, 600), min_size=1, max_size=1200),
    st.sampled_from(CAPACITIES),
    st.integers(1, 97),
    st.integers(0, 2**40),
    st.none() | st.integers(1, 4000),
)
def test_matches_a_dict_model(
    key_ids: list[int], capacity: tuple[int, int], chunk: int, base: int, span: int | None
) -> None:
    """Sequential semantics: every put is refused once size reached max_keys (checked
    before every put, including puts of keys already present); the last put wins. The keys
    often outnumber the map's capacity, so the refusal is exercised, not only the happy path.
    A round announced to end ``span`` offsets after its base answers the same, also when its
    puts go past that end (the keys then move to the whole buffer's table)."""
    memory, max_keys = capacity
    m = OffsetMap(memory, 0.9)
    assert m.max_keys == max_keys
    m.clear(base, None if span is None else base + span)
    keys = [b"k%d" % k for k in key_ids]
    digests = _digests(keys)
    offsets = base + np.arange(len(keys), dtype=np.int64) * 3
    model: dict[bytes, int] = {}
    model_put = 0
    for k, o in zip(keys, offsets.tolist(), strict=True):
        if len(model) >= max_keys:
            break
        model[k] = o
        model_put += 1
    put = 0
    for i in range(0, len(keys), chunk):
        n = m.put_many(digests[i : i + chunk], offsets[i : i + chunk])
        put += n
        if n < len(offsets[i : i + chunk]):
            break
    assert put == model_put
    assert m.size == len(model)
    assert m.latest_offset == (int(offsets[put - 1]) if put else -1)
    got = m.get_many(digests)
    assert got.tolist() == [model.get(k, -1) for k in keys]
    assert m.get(digest_key(b"never-put")) == -1
    seen = offsets[:put]
    assert m.is_latest_many(seen).tolist() == [model[k] == o for k, o in zip(keys, seen.tolist(), strict=False)]


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_round_of_few_offsets_touches_only_the_table_they_can_fill() -> None:
    """A round announced to end 20,000 offsets after its base puts its keys in a table of
    ~0.4 MB at the start of the 128 MiB buffer: the rest is never faulted in (on the whole
    table, 20,000 keys land on pages all over the buffer: 60-128 MiB resident, by page size).
    The answers are the whole table's, and a bigger round later uses all of it."""
    m = OffsetMap(128 * 1024 * 1024)
    n = 20_000
    digests = _digests([b"key-%d" % i for i in range(n)])
    offsets = np.arange(n, dtype=np.int64)
    before = _resident_bytes()
    m.clear(0, n)
    assert m.put_many(digests, offsets) == n
    assert m.is_latest_many(offsets).all()
    assert _resident_bytes() - before < 8 * 1024 * 1024
    assert m.get_many(digests).tolist() == offsets.tolist()
    m.clear(0)
    assert m.get_many(digests[:10]).tolist() == [-1] * 10
    assert m.put_many(digests, offsets + 1) == n and m.get(digests[0]) == 1


def test_fills_up_to_max_keys_exactly() -> None:
    m = OffsetMap(2_000, 0.9)
    n = m.max_keys + 10
    keys = _digests([b"%d" % i for i in range(n)])
    assert m.put_many(keys, np.arange(n, dtype=np.int64)) == m.max_keys
    assert m.size == m.max_keys and m.latest_offset == m.max_keys - 1
    # Full: even a key already present is refused (Kafka checks size before each put).
    assert m.put_many(keys[:1], np.array([n], dtype=np.int64)) == 0
    m.clear(100)
    assert m.size == 0 and m.latest_offset == -1 and m.get(keys[0]) == -1


def test_offsets_outside_the_round_are_rejected() -> None:
    m = OffsetMap(2_000)
    m.clear(1000)
    with pytest.raises(ValueError):
        m.put_many(_digests([b"a"]), np.array([999]))
    with pytest.raises(ValueError):
        m.put_many(_digests([b"a"]), np.array([m.offset_limit + 1]))
    assert m.put_many(_digests([b"a"]), np.array([m.offset_limit])) == 1
    assert m.get(digest_key(b"a")) == m.offset_limit


def test_digests_that_differ_in_any_one_byte_are_different_keys() -> None:
    """The whole 128-bit digest is compared (a byte skipped would merge two keys and drop a
    live record): 16 x 255 crafted digests, each one byte away from a base digest, in the
    base digest's own partition when the differing byte is not the partition byte."""
    omap = OffsetMap(32 * 1024 * 1024)
    assert omap.partitions > 1
    base = np.arange(16, dtype=np.uint8) * 17
    crafted = [base.copy()]
    for position in range(16):
        for value in range(256):
            if value != base[position]:
                d = base.copy()
                d[position] = value
                crafted.append(d)
    digests = np.stack(crafted)
    offsets = np.arange(len(crafted), dtype=np.int64)
    assert omap.put_many(digests, offsets) == len(crafted)
    assert omap.size == len(crafted)
    assert omap.get_many(digests).tolist() == offsets.tolist()


def test_one_partition_full_of_skewed_digests_stops_the_round_with_nothing_lost() -> None:
    """Adversarial skew: every digest in one of the 256 partitions. Each partition keeps a
    free slot (else a probe for an absent key never ends), so the round stops there, before
    the global cap, and every key put is still found."""
    omap = OffsetMap(32 * 1024 * 1024)
    per_partition = omap.slots_per_partition
    rng = np.random.default_rng(3)
    digests = rng.integers(0, 256, size=(per_partition + 10, 16), dtype=np.uint8)
    digests[:, 0] = 7  # the partition byte
    digests[:, 1:5] = np.arange(len(digests), dtype=">u4").view(np.uint8).reshape(-1, 4)  # all distinct
    put = omap.put_many(digests, np.arange(len(digests), dtype=np.int64))
    assert put == per_partition - 1 < omap.max_keys
    assert omap.get_many(digests[:put]).tolist() == list(range(put))
    absent = digests[put:].copy()
    assert (omap.get_many(absent) == -1).all()  # probes of absent keys end


def test_a_full_load_factor_is_allowed_and_still_leaves_a_free_slot_per_partition() -> None:
    """``load_factor`` 1 is valid (Kafka's ``(0, 1]``); even then each partition of the table
    keeps one slot free, so that every probe sequence ends at an empty slot."""
    m = OffsetMap(19 * 256 * 4096, load_factor=1.0)  # partitioned: 256 x 4096 slots (a prime at most)
    assert m.partitions == 256
    assert m.max_keys == m.slots - m.partitions
    single = OffsetMap(64 * 1024, load_factor=1.0)  # too small to partition
    assert single.partitions == 1 and single.max_keys == single.slots - 1
    with pytest.raises(ValueError, match="load factor"):
        OffsetMap(64 * 1024, load_factor=1.0001)


def test_the_smallest_partitioned_map_and_put_answers_whether_it_put() -> None:
    """The table is partitioned from exactly MIN_SLOTS_PER_PARTITION slots per partition on."""
    from cleaner.engine.offset_map import MIN_SLOTS_PER_PARTITION, PARTITIONS

    assert OffsetMap(19 * PARTITIONS * MIN_SLOTS_PER_PARTITION).partitions == PARTITIONS
    assert OffsetMap(19 * PARTITIONS * MIN_SLOTS_PER_PARTITION - 1).partitions == 1
    m = OffsetMap(64 * 1024)
    assert m.put(digest_key(b"k"), 5) is True
    m.max_keys = m.size  # full: Kafka's map refuses the next put
    assert m.put(digest_key(b"j"), 6) is False
