"""``copy_ranges``, the ragged copy under every re-encoded record: slice copies for long
ranges, byte-index gathers in bounded blocks for short ones, the same bytes either way."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cleaner.records import builder
from cleaner.records.builder import copy_ranges


@st.composite
def ranges(draw: st.DrawFn) -> tuple[np.ndarray, list[tuple[int, int, int]], int]:
    """A source buffer and non-overlapping destination ranges, in a random order."""
    src = np.frombuffer(draw(st.binary(min_size=1, max_size=600)), dtype=np.uint8)
    out, cursor = [], 0
    for _ in range(draw(st.integers(0, 40))):
        n = draw(st.one_of(st.integers(0, min(8, len(src))), st.integers(0, len(src))))
        s = draw(st.integers(0, len(src) - n))
        cursor += draw(st.integers(0, 3))
        out.append((cursor, s, n))
        cursor += n
    return src, draw(st.permutations(out)), cursor + 1


@pytest.mark.parametrize("block", [1, 7, 1 << 16])
@given(case=ranges())
def test_copy_ranges_is_a_loop_of_slice_copies(block: int, case) -> None:
    src, spans, size = case
    expected = np.full(size, 0xEE, dtype=np.uint8)
    for d, s, n in spans:
        expected[d : d + n] = src[s : s + n]
    got = np.full(size, 0xEE, dtype=np.uint8)
    d, s, n = (np.array(c, dtype=np.int64) for c in zip(*spans, strict=True)) if spans else ([], [], [])
    with pytest.MonkeyPatch.context() as m:
        m.setattr(builder, "_GATHER_BLOCK", block)
        copy_ranges(got, d, src, s, n)
    assert got.tobytes() == expected.tobytes()
