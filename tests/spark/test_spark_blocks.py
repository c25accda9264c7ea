"""The digest blocks of the Spark jobs, against the engine's offset map (no Spark needed)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from cleaner.engine.offset_map import OffsetMap, digest_keys
from cleaner.spark import blocks
from cleaner.spark.blocks import KeepList, KeyOffsets, KeySet
from cleaner.spark.phases import balance


def digests_of(keys: list[bytes]) -> np.ndarray:
    data = b"".join(keys)
    ends = np.cumsum([len(k) for k in keys]).tolist()
    return digest_keys(data, [e - len(k) for e, k in zip(ends, keys, strict=True)], ends)


@given(st.lists(st.integers(0, 60), min_size=1, max_size=300), st.integers(1, 8))
def test_aggregation_in_reducer_shares_is_the_offset_maps_answer(key_ids, reducers):
    keys = [b"k%d" % k for k in key_ids]
    offsets = np.arange(100, 100 + len(keys), dtype=np.int64)
    digests = digests_of(keys)
    reference = OffsetMap(1 << 16)
    reference.clear(100)
    assert reference.put_many(digests, offsets) == len(keys)

    # Split as phase 1 does: per "segment" aggregates, per reducer shares, then merged.
    hi, lo = blocks.split(digests)
    parts = [
        KeyOffsets.of(hi[a:b], lo[a:b], offsets[a:b], offsets[a:b])
        for a, b in ((0, len(keys) // 2), (len(keys) // 2, len(keys)))
    ]
    shares = []
    for r in range(reducers):
        pieces = []
        for part in parts:
            mine = blocks.reducer_of(part.hi, reducers) == r
            blob = blocks.pack(hi=part.hi[mine], lo=part.lo[mine], first=part.first[mine], last=part.last[mine])
            a = blocks.unpack(blob)
            pieces.append(KeyOffsets(a["hi"], a["lo"], a["first"], a["last"]))
        merged = KeyOffsets.merge(pieces)
        shares.append(blocks.pack(hi=merged.hi, lo=merged.lo, offset=merged.last))
    keep = KeepList.from_blobs(shares, int(offsets[-1]))
    assert len(keep) == len(set(key_ids))
    assert keep.get_many(digests).tolist() == reference.get_many(digests).tolist()
    assert keep.is_latest_many(offsets).tolist() == reference.is_latest_many(offsets).tolist()
    assert keep.get_many(digests_of([b"absent"])).tolist() == [-1]
    first = {}
    for k, o in zip(key_ids, offsets.tolist(), strict=True):
        first.setdefault(k, o)
    assert sorted(KeyOffsets.merge(parts).first.tolist()) == sorted(first.values())


def test_digests_sharing_their_first_eight_bytes():
    raw = np.zeros((4, 16), dtype=np.uint8)
    raw[:, 0] = 7
    raw[1, 15], raw[2, 15], raw[3, 15] = 1, 2, 3
    hi, lo = blocks.split(raw[[3, 1, 2, 0]])
    keys = KeySet.of(hi, lo)
    assert keys.lo.tolist() == [0, 1, 2, 3]
    qhi, qlo = blocks.split(raw)
    assert keys.find(qhi, qlo).tolist() == [0, 1, 2, 3]
    other = raw[:1].copy()
    other[0, 15] = 9
    assert keys.find(*blocks.split(other)).tolist() == [-1]
    keep = KeepList(keys.hi, keys.lo, np.array([10, 11, 12, 13], dtype=np.int64), 20)
    assert keep.get_many(raw[[2, 0]]).tolist() == [12, 10]


def test_balance_spreads_weight_and_keeps_order():
    items = [(i, w) for i, w in enumerate([90, 10, 10, 10, 50, 40, 5])]
    slices = balance(items, 3)
    assert sorted(i for s in slices for i in s) == list(range(7))
    assert all(s == sorted(s) for s in slices)
    loads = sorted(sum(dict(items)[i] for i in s) for s in slices)
    assert loads[-1] == 90


@given(st.integers(1, 5000), st.integers(0, 2**32 - 1))
def test_reducers_own_contiguous_digest_ranges_and_may_be_more_than_256(reducers, seed):
    """Sorted digests fall to reducers in order (their sorted outputs concatenate sorted), every
    index is a reducer, and with many digests every reducer gets some: more than the 256 a
    first byte could address."""
    hi = np.sort(np.random.default_rng(seed).integers(0, 2**64, size=50_000, dtype=np.uint64))
    r = blocks.reducer_of(hi, reducers)
    assert (np.diff(r) >= 0).all()
    assert r.min() >= 0 and r.max() < reducers
    if reducers <= 1000:
        assert len(np.unique(r)) == reducers
