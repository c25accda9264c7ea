"""The offset map against a plain dict model of Kafka's SkimpyOffsetMap contract."""

from __future__ import annotations

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


@settings(max_examples=60)
@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=400),
    st.sampled_from([2_000, 10_000, 5 * 19 * 256 * 4096]),
    st.integers(1, 97),
    st.integers(0, 2**40),
)
def test_matches_a_dict_model(key_ids: list[int], memory: int, chunk: int, base: int) -> None:
    """Sequential semantics: every put is refused once size reached max_keys (checked
    before every put, including puts of keys already present); the last put wins."""
    m = OffsetMap(memory, 0.9)
    m.clear(base)
    keys = [b"k%d" % k for k in key_ids]
    digests = _digests(keys)
    offsets = base + np.arange(len(keys), dtype=np.int64) * 3
    model: dict[bytes, int] = {}
    model_put = 0
    for k, o in zip(keys, offsets.tolist(), strict=True):
        if len(model) >= m.max_keys:
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
