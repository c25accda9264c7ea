"""The persistence models of the crash checker: which sets of un-fsynced name changes
may be on disk after a crash."""

from __future__ import annotations

import itertools

from crash_recorder import EXHAUSTIVE_WINDOW, _closed_subsets
from hypothesis import given, settings
from hypothesis import strategies as st

NAMES = st.sampled_from(["a.log", "a.log.swap", "a.log.cleaned", "b.log", "b.log.deleted"])
STEP = st.dictionaries(NAMES, st.one_of(st.none(), st.integers(1, 5)), min_size=1, max_size=2)


def _closed(window: list[dict], chosen: set[int]) -> bool:
    """A step is on disk only with every earlier step that touched one of its names."""
    return all(j in chosen for i in chosen for j in range(i) if window[j].keys() & window[i].keys())


@settings(max_examples=200, deadline=None)
@given(st.lists(STEP, max_size=EXHAUSTIVE_WINDOW))
def test_small_windows_are_enumerated_exactly(window: list[dict]) -> None:
    got = set(_closed_subsets(window))
    expected = {
        c
        for r in range(len(window) + 1)
        for c in itertools.combinations(range(len(window)), r)
        if _closed(window, set(c))
    }
    assert got == expected


@settings(max_examples=50, deadline=None)
@given(st.lists(STEP, min_size=EXHAUSTIVE_WINDOW + 1, max_size=EXHAUSTIVE_WINDOW + 8))
def test_large_windows_keep_every_prefix_and_every_single_step(window: list[dict]) -> None:
    got = list(_closed_subsets(window))
    assert all(_closed(window, set(c)) for c in got)
    for k in range(len(window) + 1):
        assert tuple(range(k)) in got
    for i in range(len(window)):
        assert any(i in c and len(c) <= i + 1 for c in got), f"step {i} never reaches the disk early"
