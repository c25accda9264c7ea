"""``phases.cut_rows``: what a round cut short by a full map keeps of its first job's phase-1
rows; ``phases.may_fill``: which rounds' reducers keep their first offsets for that cut (no
Spark needed: functions over shuffled rows and plans). The cut round's byte-identity with
``clean`` is tested end to end in ``test_spark_compact_large.py``."""

from __future__ import annotations

import types

from cleaner.spark.phases import COUNTED, LOOKUP, MAPPED, UNREADABLE, cut_rows, may_fill


def scope(index: int, groups: list[list[int]], dirty: list[tuple[int, int]]) -> types.SimpleNamespace:
    """A scope whose round has these groups (segment indexes) and dirty segments (index, next start)."""
    plan = types.SimpleNamespace(
        groups=groups,
        dirty=[(s, nxt, b"") for s, nxt in dirty],
        segment_group=lambda: {s: g for g, members in enumerate(groups) for s in members},
    )
    return types.SimpleNamespace(index=index, round=plan)


def test_rows_that_reach_the_cut_go_and_the_rest_take_their_group_in_the_cut_round():
    # Segments 0-1 clean, 2-5 dirty ([200, 300), [300, 400), [400, 500), [500, 600)); the cut at
    # 420 falls in segment 4: the cut round's groups are [0, 1] and [2, 3, 4] (it was [0, 1, 2], [3, 4, 5]).
    cut = {7: scope(7, [[0, 1], [2, 3, 4]], [(2, 300), (3, 400), (4, 500), (5, 600)])}
    rows = [(r, (7, s, g, flags, f"{s}".encode())) for r, s, g, flags in [
        (0, 0, 0, LOOKUP | COUNTED), (1, 1, 0, LOOKUP), (0, 2, 0, MAPPED | LOOKUP), (1, 3, 1, MAPPED),
        (0, 3, 1, LOOKUP), (1, 4, 1, MAPPED | LOOKUP), (0, 5, 1, MAPPED), (1, 5, -1, UNREADABLE)]]  # fmt: skip
    other = [(0, (8, 2, 0, MAPPED, b"other partition"))]
    kept = list(cut_rows(rows + other, cut, {7: 420}))
    assert kept == [
        (0, (7, 0, 0, LOOKUP | COUNTED, b"0")),
        (1, (7, 1, 0, LOOKUP, b"1")),
        (0, (7, 2, 1, MAPPED | LOOKUP, b"2")),
        (1, (7, 3, 1, MAPPED, b"3")),
        (0, (7, 3, 1, LOOKUP, b"3")),
    ]


def test_a_round_the_cut_did_not_move_keeps_every_row():
    same = {3: scope(3, [[0, 1]], [(1, 200)])}
    rows = [(0, (3, 0, 0, LOOKUP, b"a")), (1, (3, 1, 0, MAPPED, b"b")), (1, (4, 1, 0, MAPPED, b"c"))]
    assert list(cut_rows(rows, same, {})) == rows[:2]


def test_only_a_round_with_as_many_dirty_offsets_as_map_keys_may_fill_its_map():
    # Segments at 0, 200, 400, 600 (the active one); the dirty ones are [200, 400) and [400, 600):
    # 400 offsets, so at most 400 distinct keys whatever the records.
    def round_scope(max_keys: int, segments: int = 4, **scope: object) -> types.SimpleNamespace:
        plan = types.SimpleNamespace(
            dirty=[(1, 400, b""), (2, 600, b"")],
            segments=[types.SimpleNamespace(base=base) for base in (0, 200, 400, 600)[:segments]],
            first_dirty_offset=200,
            max_keys=max_keys,
        )
        return types.SimpleNamespace(round=plan, **{"cutoff": None, "capacity_checked": False, **scope})

    assert may_fill(round_scope(400)) and not may_fill(round_scope(401))
    assert not may_fill(round_scope(400, cutoff=500))  # the map refuses keys at the cutoff and past it
    assert may_fill(round_scope(10**9, segments=3))  # no segment after the dirty ones: nothing bounds them
    assert not may_fill(round_scope(1, capacity_checked=True))  # a cut round: its map cannot fill again
    assert not may_fill(types.SimpleNamespace(round=None, capacity_checked=False))  # counted only
