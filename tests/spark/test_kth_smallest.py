"""The map-full cut of ``compact-large`` (``phases.kth_smallest_by_histograms`` and
``kth_smallest_below``): per round, the k-th smallest first offset of a map spread over
reducers, found from histograms and one bounded collect, equals the k-th smallest of all of
them; the driver never takes more than ``MAX_COLLECTED_OFFSETS`` offsets a round however many
keys there are; and every round is narrowed down in the same passes, so the passes do not grow
with the rounds. Spark's part (a cached RDD, its folds and collects) is played by dicts of
arrays; tests/spark/test_spark_compact_large.py runs the real job to the same cut as the
single-node map."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cleaner.spark import phases


class Reducers:
    """Each round's first offsets, split over reducers; counts the passes and what the driver takes."""

    def __init__(self, parts: Mapping[int, list[np.ndarray]]) -> None:
        self.parts = parts
        self.passes = 0
        self.taken: dict[int, int] = {}
        self.measured: list[int] = []

    def histograms(self, ranges: phases.Ranges) -> dict[int, np.ndarray]:
        self.passes += 1
        return {i: np.sum([phases._histogram(p, *ranges[i]) for p in self.parts[i]], axis=0) for i in ranges}

    def collect(self, ranges: phases.Ranges) -> dict[int, list[np.ndarray]]:
        self.passes += 1
        out = {i: [phases._inside(p, *ranges[i]) for p in self.parts[i]] for i in ranges}
        for i, arrays in out.items():
            self.taken[i] = self.taken.get(i, 0) + sum(len(a) for a in arrays)
        return out

    def measure_ends(self, rounds: list[int]) -> dict[int, int]:
        self.passes += 1
        self.measured += rounds
        return {i: max(int(p.max()) + 1 for p in self.parts[i] if len(p)) for i in rounds}


def _round(data: st.DataObject, rng: np.random.Generator, reducers: int) -> tuple[np.ndarray, list[np.ndarray], int]:
    keys = data.draw(st.integers(1, 5000))
    spread = data.draw(st.integers(1, 10**12))
    lo = data.draw(st.integers(0, 10**6))
    offsets = lo + rng.choice(max(spread, keys), size=keys, replace=False).astype(np.int64)
    owner = rng.integers(0, reducers, size=keys)
    return offsets, [offsets[owner == r] for r in range(reducers)], lo


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), rounds=st.integers(1, 4), reducers=st.integers(1, 6), limit=st.sampled_from([1, 7, 1 << 16]))
def test_the_kth_of_histograms_is_the_kth_of_everything(data, rounds: int, reducers: int, limit: int,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(phases, "MAX_COLLECTED_OFFSETS", limit)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    drawn = {i: _round(data, rng, reducers) for i in range(rounds)}
    wanted = {i: (data.draw(st.integers(1, len(o))), lo, int(o.max()) + 1) for i, (o, _, lo) in drawn.items()}
    alone = {}
    for i in drawn:  # each round by itself: how many passes it needs
        one = Reducers({i: drawn[i][1]})
        phases.kth_smallest_by_histograms({i: wanted[i]}, one.histograms, one.collect)
        alone[i] = one.passes
    together = Reducers({i: parts for i, (_, parts, _) in drawn.items()})
    got = phases.kth_smallest_by_histograms(wanted, together.histograms, together.collect)
    assert got == {i: int(np.sort(o)[wanted[i][0] - 1]) for i, (o, _, _) in drawn.items()}
    assert all(taken <= max(limit, 1) for taken in together.taken.values())
    assert together.passes == max(alone.values())  # the rounds share their passes


def test_a_k_past_the_count_is_none() -> None:
    reducers = Reducers({0: [np.array([5, 9], dtype=np.int64)], 1: [np.array([1, 2, 3], dtype=np.int64)]})
    got = phases.kth_smallest_by_histograms({0: (3, 0, 10), 1: (3, 0, 10)}, reducers.histograms, reducers.collect)
    assert got == {0: None, 1: 3}


@settings(max_examples=60, deadline=None)
@given(data=st.data(), rounds=st.integers(1, 3))
def test_the_kth_below_any_bound_is_the_kth_of_everything(data, rounds: int) -> None:
    """The map-full cut starts from the segment after the dirty ones as its bound: right
    whatever the bound (too low, as with overlapping segments, or none), and a round's
    offsets' end is measured only when its bound does not hold the k-th."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    drawn = {i: _round(data, rng, data.draw(st.integers(1, 4))) for i in range(rounds)}
    wanted = {}
    for i, (offsets, _, lo) in drawn.items():
        bound = data.draw(st.none() | st.integers(lo + 1, int(offsets.max()) + 10))
        wanted[i] = (data.draw(st.integers(1, len(offsets))), lo, bound)
    reducers = Reducers({i: parts for i, (_, parts, _) in drawn.items()})
    got = phases.kth_smallest_below(wanted, reducers.measure_ends, reducers.histograms, reducers.collect)
    assert got == {i: int(np.sort(o)[wanted[i][0] - 1]) for i, (o, _, _) in drawn.items()}
    assert sorted(reducers.measured) == sorted(
        i for i, (k, _, bound) in wanted.items() if bound is None or int((drawn[i][0] < bound).sum()) < k
    )


def test_a_round_with_fewer_offsets_than_its_k_is_an_error() -> None:
    reducers = Reducers({0: [np.array([5, 9], dtype=np.int64)]})
    with pytest.raises(ValueError, match="fewer first offsets"):
        phases.kth_smallest_below({0: (3, 0, 10)}, reducers.measure_ends, reducers.histograms, reducers.collect)
