"""The map-full cut of ``compact-large`` (``phases.kth_smallest_by_histograms``): the k-th
smallest first offset of a map spread over reducers, found from histograms and one bounded
collect, equals the k-th smallest of all of them; and the driver never takes more than
``MAX_COLLECTED_OFFSETS`` offsets however many keys there are. Spark's part (a cached RDD, its
folds and collects) is played by lists of arrays; tests/spark/test_spark_compact_large.py
runs the real job to the same cut as the single-node map."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cleaner.spark import phases


def _select(parts: list[np.ndarray], k: int, lo: int, hi: int) -> tuple[int, int]:
    taken = []

    def histogram(a: int, b: int) -> np.ndarray:
        return np.sum([phases._histogram(p, a, b) for p in parts], axis=0)

    def collect(a: int, b: int) -> list[np.ndarray]:
        out = [p[(p >= a) & (p < b)] for p in parts]
        taken.append(sum(len(x) for x in out))
        return out

    return phases.kth_smallest_by_histograms(k, lo, hi, histogram, collect), sum(taken)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), reducers=st.integers(1, 6), keys=st.integers(1, 5000), spread=st.integers(1, 10**12),
       limit=st.sampled_from([1, 7, 1 << 16]))
def test_the_kth_of_histograms_is_the_kth_of_everything(data, reducers: int, keys: int, spread: int,
                                                        limit: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(phases, "MAX_COLLECTED_OFFSETS", limit)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    lo = data.draw(st.integers(0, 10**6))
    offsets = lo + rng.choice(max(spread, keys), size=keys, replace=False).astype(np.int64)
    owner = rng.integers(0, reducers, size=keys)
    parts = [offsets[owner == r] for r in range(reducers)]
    k = data.draw(st.integers(1, keys))
    got, taken = _select(parts, k, lo, int(offsets.max()) + 1)
    assert got == int(np.sort(offsets)[k - 1])
    assert taken <= max(limit, 1)


def test_a_k_past_the_count_is_an_error() -> None:
    with pytest.raises(ValueError, match="fewer than k"):
        _select([np.array([5, 9], dtype=np.int64)], 3, 0, 10)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), keys=st.integers(1, 3000), spread=st.integers(1, 10**9))
def test_the_kth_below_any_bound_is_the_kth_of_everything(data, keys: int, spread: int) -> None:
    """The map-full cut starts from the segment after the dirty ones as its bound: right
    whatever the bound (too low, as with overlapping segments, or none), and the offsets'
    end is measured only when the bound does not hold the k-th."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    offsets = 100 + rng.choice(max(spread, keys), size=keys, replace=False).astype(np.int64)
    parts = np.array_split(rng.permutation(offsets), data.draw(st.integers(1, 4)))
    k = data.draw(st.integers(1, keys))
    bound = data.draw(st.none() | st.integers(101, int(offsets.max()) + 10))
    measured = []

    def measure_end() -> int:
        measured.append(True)
        return int(offsets.max()) + 1

    got = phases.kth_smallest_below(
        k, 100, bound, measure_end,
        lambda a, b: np.sum([phases._histogram(p, a, b) for p in parts], axis=0),
        lambda a, b: [p[(p >= a) & (p < b)] for p in parts],
    )  # fmt: skip
    assert got == int(np.sort(offsets)[k - 1])
    assert bool(measured) == (bound is None or int((offsets < bound).sum()) < k)
