"""Two cleaner threads on two partitions against one, measured in one run.

The kernels of the compiled core (``native/``) release the GIL while they decode, hash,
probe the offset map and re-encode, so a second cleaner thread can use the second core;
what stays serial is the Python orchestration around them (Kafka's rules over columns,
file handling). A generated log dir with two equal partitions (100-byte records,
uncompressed, skewed keys, 5% tombstones) is copied twice and cleaned in a fresh process
with ``cleaner.threads`` 1, then 2.

Printed: each run's wall time (``cleaning.clean``, imports excluded), records/s, the
speed-up of two threads over one, and the machine's load average before each run (a loaded
machine has no second core to give). Nothing asserts it.

    .venv/bin/python bench/threads.py              # 2 x ~90 MB
    .venv/bin/python bench/threads.py --quick      # 2 x ~12 MB
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from cleaner.generate import GeneratorConfig, generate

CHILD = r"""
import json, sys, time
from pathlib import Path
from cleaner import cleaning
from cleaner.clock import FixedTime
from cleaner.config import parse_policy
data_dir, threads, segment_bytes = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
policy = parse_policy({"mode": "compact", "cleaner": {"threads": threads, "dedupeBufferSize": 256 << 20},
                       "topics": [{"match": ".*", "cleanupPolicy": "compact", "segmentBytes": segment_bytes}]})
started = time.perf_counter()
outcome = cleaning.clean([data_dir], policy, FixedTime(10**13))
print(json.dumps({"elapsed": time.perf_counter() - started,
                  "records": sum(r.stats.messages_read for r in outcome.results),
                  "partitions": len({r.topic_partition for r in outcome.results})}))
"""


def clean(data_dir: Path, threads: int, segment_bytes: int) -> dict:
    child = subprocess.run(
        [sys.executable, "-P", "-c", CHILD, str(data_dir), str(threads), str(segment_bytes)],
        capture_output=True,
        text=True,
    )
    if child.returncode != 0:
        raise SystemExit(f"cleaning with {threads} thread(s) failed:\n{child.stderr[-3000:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 x ~12 MB instead of 2 x ~90 MB")
    args = parser.parse_args()
    records = 125_000 if args.quick else 1_000_000
    segment_bytes = 16 << 20
    config = GeneratorConfig(
        topics=1, partitions=2, records=2 * records, keys=records // 4, key_skew=0.9, value_bytes=70,
        tombstones=0.05, compression="none", segment_bytes=segment_bytes, seed=11,
    )
    with tempfile.TemporaryDirectory(prefix="bench-threads-") as tmp:
        source = Path(tmp) / "source"
        generate(source, config)
        runs = {}
        for threads in (1, 2):
            copy = Path(tmp) / f"threads-{threads}"
            shutil.copytree(source, copy)
            load = os.getloadavg()[0]
            runs[threads] = {**clean(copy, threads, segment_bytes), "load": load}
            shutil.rmtree(copy)
    print(f"machine: {os.cpu_count()} CPUs; 2 partitions of {records:,} 100-byte records, uncompressed")
    print(f"{'threads':>7} {'clean s':>8} {'M rec/s':>8} {'load avg':>9}")
    for threads, run in runs.items():
        rate = run["records"] / run["elapsed"] / 1e6
        print(f"{threads:>7} {run['elapsed']:>8.2f} {rate:>8.2f} {run['load']:>9.2f}")
    print(f"two threads over one: {runs[1]['elapsed'] / runs[2]['elapsed']:.2f}x (issue 13's target: 1.7x)")


if __name__ == "__main__":
    main()
