"""``kafka-cleaner where`` beside a plain read of the partition it searches.

Generates one partition (~1 GiB; ``--quick``: ~128 MiB; ``--compression``, mixed by
default), then measures on a warm page cache, best of three:

- ``read``   every ``.log`` file of the partition read into memory (the reference);
- ``where``  ``cleaner.where.where`` for a key the partition holds: every segment read a
             chunk at a time, every record decoded, every key digested by the compiled core,
             plus the partition's cleaning picture (what ``status`` computes).

Target (issue 25): ``where`` within 2x the read.

Run: ``.venv/bin/python bench/where.py [--quick] [--size-gb 1] [--compression mixed]``.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from cleaner.config import parse_policy_text
from cleaner.generate import GeneratorConfig, generate
from cleaner.records.columns import decode_records
from cleaner.storage.segment import iter_file_batches
from cleaner.where import DEFAULT_POLICY, where

VALUE_BYTES = 100


def best_of(runs: int, work) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--compression", default="mixed")
    args = parser.parse_args()
    size = (128 << 20) if args.quick else int(args.size_gb * (1 << 30))
    records = size // (VALUE_BYTES + 40)
    root = Path(tempfile.mkdtemp(prefix="bench-where-"))
    try:
        logs = root / "logs"
        config = GeneratorConfig(topics=1, partitions=1, records=records, keys=200_000, value_bytes=VALUE_BYTES,
                                 compression=args.compression, segment_bytes=64 << 20, seed=1)
        generate(logs, config)
        partition = logs / "topic-0-0"
        segments = sorted(partition.glob("*.log"))
        total = sum(s.stat().st_size for s in segments)

        def read() -> None:
            for s in segments:
                s.read_bytes()

        policy = parse_policy_text(DEFAULT_POLICY)
        first = next(iter_file_batches(segments[0]))
        key = decode_records(first.select(first.is_v2 & ~first.is_control)).key(0)  # a key the partition holds
        assert key is not None
        read()  # warm the page cache
        t_read = best_of(3, read)
        print(f"partition: {total / (1 << 20):,.0f} MiB in {len(segments)} segments, {records:,} records, "
              f"compression {args.compression}")
        print(f"read                {t_read:7.3f} s  {total / t_read / (1 << 20):8,.0f} MiB/s")
        for label, wanted in (("where, absent key", b"no-such-key"), ("where, hottest key", key)):
            found: list = []

            def search(wanted: bytes = wanted, found: list = found) -> None:
                found[:] = where([logs], policy, wanted, "topic-0", config.now_ms or 0, partition=0)[0]

            t = best_of(3, search)
            print(f"{label:<19} {t:7.3f} s  {total / t / (1 << 20):8,.0f} MiB/s  {t / t_read:5.2f}x the read"
                  f" (target: within 2x); {len(found):,} records of the key")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
