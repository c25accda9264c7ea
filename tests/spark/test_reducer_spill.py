"""A reducer past its memory budget (``cleaner.spark.spill``): its input spilled to disk and
worked through in digest sub-ranges gives the same offset map sizes, distinct-key counts,
keep-lists and first offsets as one pass over everything, while no pass holds much more than
the budget (no Spark needed: the reducer is a function over its shuffled rows)."""

from __future__ import annotations

import types
from collections import defaultdict
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cleaner.spark import blocks, phases
from cleaner.spark.blocks import KeepList, KeySet
from cleaner.spark.phases import (
    COUNTED,
    FIRSTS_SLICE,
    LOOKUP,
    LOOKUP_IS_MAPPED,
    MAPPED,
    UNREADABLE,
    Layout,
    reduce_part,
)
from cleaner.spark.spill import ReducerInput, _top_bits_range

REDUCERS = 3


def shuffled_rows(seed: int, reducer: int, tasks: int, keys: int, unreadable: bool) -> list[Any]:
    """What ``reducer`` receives from ``tasks`` map tasks over two partitions: per task and
    partition a block of map keys (first/last offsets) and per group a block of lookup keys
    (partition 0's group 1 sends its lookup keys as its map keys, ``LOOKUP_IS_MAPPED``)."""
    rng = np.random.default_rng(seed)
    first, end = _top_bits_range(reducer, REDUCERS)
    universe_hi = (rng.integers(first, end, keys, dtype=np.int64).astype(np.uint64) << np.uint64(32)) | rng.integers(
        0, 1 << 32, keys, dtype=np.int64).astype(np.uint64)  # fmt: skip
    universe_lo = rng.integers(0, 1 << 62, keys, dtype=np.int64).astype(np.uint64)
    # Blocks hold distinct digests in order, as map tasks send them: a sorted universe, picked
    # by sorted distinct positions.
    distinct = KeySet.of(universe_hi, universe_lo)
    universe_hi, universe_lo, keys = distinct.hi, distinct.lo, len(distinct)
    rows: list[Any] = []
    for task in range(tasks):
        for i in (0, 1):
            pick = np.unique(rng.integers(0, keys, rng.integers(1, keys), dtype=np.int64))
            hi, lo = universe_hi[pick], universe_lo[pick]
            f = rng.integers(0, 1000, pick.size, dtype=np.int64) + task * 1000
            last = f + rng.integers(0, 500, pick.size, dtype=np.int64)
            group = task % 2
            if i == 0 and group == 1:
                rows.append((reducer, (i, task, group, MAPPED | LOOKUP_IS_MAPPED | COUNTED,
                                       blocks.pack(khi=hi, klo=lo, kfirst=f, klast=last))))  # fmt: skip
                continue
            rows.append((reducer, (i, task, -1, MAPPED, blocks.pack(khi=hi, klo=lo, kfirst=f, klast=last))))
            look = np.unique(rng.integers(0, keys, rng.integers(1, keys), dtype=np.int64))
            rows.append((reducer, (i, task, group, LOOKUP | COUNTED,
                                   blocks.pack(mhi=universe_hi[look], mlo=universe_lo[look]))))  # fmt: skip
    if unreadable:
        rows.append((reducer, (1, tasks, -1, UNREADABLE, b"")))
    rng.shuffle(rows)
    return rows


def scopes(firsts: bool) -> dict[int, Any]:
    """Two partitions whose rounds' maps may fill up (``may_fill``: one dirty segment, no
    segment after it) if ``firsts``; else rounds whose capacity was applied."""
    plan = types.SimpleNamespace(dirty=[(0, 1000, b"")], segments=[object()], first_dirty_offset=0, max_keys=1)
    return {i: types.SimpleNamespace(count_keys=True, round=plan, cutoff=None, capacity_checked=not firsts)
            for i in (0, 1)}  # fmt: skip


LAYOUT = Layout({(0, 0): 0, (0, 1): 1, (1, 0): 1, (1, 1): 2}, {0: [0, 1], 1: [1, 2]})


def outcome(rows: list[Any], reducer: int, memory: int, firsts: bool = False) -> dict[str, Any]:
    """The reducer's results, with the parts a spilled reducer sends separately put together."""
    keeps: dict[tuple[int, int, int], list[bytes]] = defaultdict(list)
    firsts_of: dict[int, list[np.ndarray]] = defaultdict(list)
    other = []
    for key, value in reduce_part(reducer, iter(rows), scopes(firsts), LAYOUT, None, REDUCERS, memory):
        if key[1] == "keep":
            keeps[(key[0], key[2], key[3])].append(value[1])
        elif key[1] == "firsts":
            assert key[0] == FIRSTS_SLICE
            firsts_of[key[2]].append(blocks.unpack(value)["first"])
        else:
            other.append((key, value))
    merged = {}
    for k, blobs in keeps.items():
        keep = KeepList.from_blobs(blobs, 10**9)
        merged[k] = (keep._keys.hi.tolist(), keep._keys.lo.tolist(), keep._offsets.tolist())
    return {"keeps": merged, "firsts": {i: sorted(np.concatenate(a).tolist()) for i, a in firsts_of.items()},
            "other": sorted(other, key=repr)}  # fmt: skip


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32), st.integers(0, REDUCERS - 1), st.integers(1, 6), st.integers(20, 400),
       st.booleans(), st.integers(2, 9), st.booleans())  # fmt: skip
def test_a_spilled_reducer_gives_what_one_pass_gives(seed, reducer, tasks, keys, unreadable, fraction, firsts):
    rows = shuffled_rows(seed, reducer, tasks, keys, unreadable)
    total = sum(len(r[1][4]) for r in rows)
    in_memory = outcome(rows, reducer, total + 1, firsts)
    assert bool(in_memory["firsts"]) == firsts
    budget = max(1, total // fraction)
    assert outcome(rows, reducer, budget, firsts) == in_memory


def test_past_its_budget_the_reducer_spills_and_no_pass_holds_much_more(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path))
    rows = shuffled_rows(7, 1, 6, 20_000, False)
    total = sum(len(r[1][4]) for r in rows)
    budget = -(-total // 8)
    held: list[int] = []
    real = phases._gather

    def gather(part: list[Any]) -> Any:
        held.append(sum(len(r[1][4]) for r in part))
        return real(part)

    monkeypatch.setattr(phases, "_gather", gather)
    spilled = outcome(rows, 1, budget)
    assert len(held) == 8  # eight sub-ranges (each row in one: the outcomes below are equal)
    assert max(held) <= 1.25 * budget, (held, budget)  # digests are uniform: about a share each
    monkeypatch.setattr(phases, "_gather", real)
    assert spilled == outcome(rows, 1, total + 1)
    assert len(spilled["keeps"]) == 4 and all(len(k[0]) > 1000 for k in spilled["keeps"].values())
    assert list(tmp_path.iterdir()) == []  # the spill file went with the reducer

    with ReducerInput(1, REDUCERS, total + 1).add_all(rows) as received:
        assert not received.spilled and received.passes == 1
