"""The offset map alone: 2 M puts and 2 M lookups into the default 128 MiB map, for a few
distinct-key counts (the map's probe loop in the compiled core; each put or lookup is a
cache and TLB miss, which the loop's prefetching overlaps). Then a fresh map's first round
of a small partition: its puts and the pass that finds the latest offsets, which touch pages
of the map for the first time (what huge pages make cheaper). Figures only, never asserted.

    .venv/bin/python bench/offset_map.py
"""

from __future__ import annotations

import time

import numpy as np

from cleaner.engine.offset_map import OffsetMap

RECORDS = 2_000_000
MEMORY = 128 << 20


def main() -> None:
    rng = np.random.default_rng(0)
    offsets = np.arange(RECORDS, dtype=np.int64)
    print(f"{'distinct keys':>13} {'put ns/key':>10} {'get ns/key':>10}  (best of 3, {RECORDS:,} records, 128 MiB)")
    for keys in (20_000, 200_000, 2_000_000):
        digests = rng.integers(0, 256, (keys, 16), dtype=np.uint8)[rng.integers(0, keys, RECORDS)]
        best_put = best_get = float("inf")
        for _ in range(3):
            m = OffsetMap(MEMORY)
            started = time.perf_counter()
            m.put_many(digests, offsets)
            best_put = min(best_put, time.perf_counter() - started)
            started = time.perf_counter()
            m.get_many(digests)
            best_get = min(best_get, time.perf_counter() - started)
        print(f"{keys:>13,} {best_put / RECORDS * 1e9:>10.0f} {best_get / RECORDS * 1e9:>10.0f}")

    print(f"\n{'distinct keys':>13} {'puts ms':>10} {'latest ms':>10}  (a fresh map's first round, 4 records a key)")
    for keys in (2_000, 200_000):
        records = keys * 4
        digests = rng.integers(0, 256, (keys, 16), dtype=np.uint8)[rng.integers(0, keys, records)]
        m = OffsetMap(MEMORY)
        started = time.perf_counter()
        m.put_many(digests, offsets[:records])
        put = time.perf_counter() - started
        started = time.perf_counter()
        m.is_latest_many(offsets[:records])
        latest = time.perf_counter() - started
        print(f"{keys:>13,} {put * 1e3:>10.1f} {latest * 1e3:>10.1f}")


if __name__ == "__main__":
    main()
