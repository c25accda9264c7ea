"""Cost of the sidecar's observe scans per GB of log (``kafka-cleaner sidecar``, mode observe).

Generates a broker log dir (~1 GB; ``--quick``: ~64 MB), then measures, single-threaded, on a
warm page cache:

- ``read``                the log files read into memory (the reference);
- ``header-only scan``    every segment's batch headers (``LogSegment.iter_batches`` =
                          ``scan_batches`` per 1 MiB chunk, no CRC, nothing decoded);
- ``facts scan``          the same plus every record decoded (decompression included) to count
                          records and tombstones and find the oldest tombstone
                          (``segment_facts.scan_segment``: what a first scan reads);
- ``sidecar scan 1``      ``Sidecar.tick()``'s first scan: the above for every segment, plus
                          the cleaner manager's report (offsets, producer state, checkpoints);
- ``sidecar scan 2``      the next scan of the unchanged directory;
- ``sidecar scan 3``      the scan after one batch was appended to every active segment.

For the sidecar scans, ``facts bytes`` is what the facts cache read (``FactsCache.bytes_read``,
exported as ``kafka_cleaner_scan_bytes_read_total``) and ``read(2) bytes`` what the scanning
thread really read from files (``rchar`` of ``/proc/thread-self/io``: every read/pread, the
producer-state replay and the checkpoint files included). MB/s divides the log's size by the
time. Targets (issue 4): an unchanged closed segment costs no I/O; a first scan reads at
>= 1 GB/s header-only.

Run: ``.venv/bin/python bench/observe.py [--quick] [--size-gb 1] [--compression mixed]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from cleaner.clock import MockTime
from cleaner.generate import COMPRESSION_CHOICES, GeneratorConfig, estimate_log_bytes, generate
from cleaner.records.builder import build_batch
from cleaner.records.record import Record
from cleaner.segment_facts import scan_segment
from cleaner.sidecar.service import Sidecar, SidecarOptions
from cleaner.storage.log import Log
from cleaner.storage.topic_partition import parse_partition_dir

NOW_MS = 1_700_000_000_000
MB = 1_000_000
POLICY = """apiVersion: kafkacleaner.io/v1alpha1
kind: CompactionPolicy
metadata: {name: bench, generation: 1}
spec:
  mode: observe
  topics: [{match: ".*", cleanupPolicy: compact}]
"""


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"machine: {os.cpu_count()} CPUs ({usable} usable), {cpu}; {platform.system()} {platform.release()}; "
        f"python {platform.python_version()}, numpy {np.__version__}"
    )


def thread_rchar() -> int | None:
    try:
        with open("/proc/thread-self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("rchar"))
    except OSError:
        return None


def timed(fn: Callable[[], object]) -> tuple[float, int | None, object]:
    """(seconds, bytes this thread read meanwhile, result)."""
    before = thread_rchar()
    started = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - started
    after = thread_rchar()
    return seconds, (after - before if before is not None and after is not None else None), result


def partition_dirs(data: Path) -> list[Path]:
    return sorted(p for p in data.iterdir() if p.is_dir() and parse_partition_dir(p.name) is not None)


def all_segments(data: Path) -> list:
    out = []
    for pdir in partition_dirs(data):
        out += Log.open(pdir, read_only=True).segments
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gb", type=float, default=1.0, help="log to generate (default 1 GB)")
    parser.add_argument("--quick", action="store_true", help="~64 MB and one round")
    parser.add_argument("--compression", default="mixed", choices=COMPRESSION_CHOICES)
    parser.add_argument("--repeat", type=int, default=3, help="rounds of the component scans (best is shown)")
    parser.add_argument("--tmpdir", default=None, help="where the log dir is generated")
    args = parser.parse_args()
    size = 0.064 if args.quick else args.size_gb
    repeat = 1 if args.quick else max(args.repeat, 1)

    topics, partitions = 4, 4
    config = GeneratorConfig(
        topics=topics,
        partitions=partitions,
        records=1,
        keys=100_000,
        value_bytes=200,
        compression=args.compression,
        segment_bytes=16 * 1024 * 1024,
        now_ms=NOW_MS,
    )
    per_record = estimate_log_bytes(config)
    config = GeneratorConfig(**{**config.__dict__, "records": max(int(size * 1e9 / per_record), 1000)})

    root = Path(tempfile.mkdtemp(prefix="kafka-cleaner-bench-observe-", dir=args.tmpdir))
    try:
        data = root / "data"
        print(f"generating ~{size:.3g} GB ({args.compression}) in {data} ...", file=sys.stderr)
        summary = generate(data, config)
        log_bytes = summary.totals["bytes"]
        segments = all_segments(data)
        print(f"{log_bytes / MB:.0f} MB in {len(segments)} segments, {summary.elapsed_seconds:.1f} s", file=sys.stderr)
        rows: list[tuple[str, float, int | None, int | None, str]] = []

        def best(name: str, fn: Callable[[], object], facts_bytes: int | None = None, note: str = "") -> None:
            runs = [timed(fn) for _ in range(repeat)]
            seconds, read, _ = min(runs, key=lambda r: r[0])
            rows.append((name, seconds, facts_bytes, read, note))

        def read_all() -> None:
            for seg in segments:
                with open(seg.log_path, "rb") as f:
                    while f.read(1 << 20):
                        pass

        def headers() -> int:
            return sum(len(chunk) for seg in segments for chunk in seg.iter_batches(0))

        def facts() -> int:
            return sum(scan_segment(seg)[0].tombstones for seg in segments)

        read_all()  # warm the page cache
        best("read (reference)", read_all)
        best("header-only scan", headers, note="target >= 1000 MB/s")
        best("facts scan (headers + records)", facts)
        if args.compression == "mixed":  # where the records' time goes: decompression
            by_codec: dict[str, list] = {}
            for seg in segments:
                tp = parse_partition_dir(seg.log_path.parent.name)
                codec = config.codec_of(int(tp.topic.rsplit("-", 1)[1])).name.lower()
                by_codec.setdefault(codec, []).append(seg)
            for codec, segs in sorted(by_codec.items()):
                share = sum(s.size for s in segs)
                runs = [timed(lambda segs=segs: [scan_segment(s) for s in segs]) for _ in range(repeat)]
                seconds = min(r[0] for r in runs)
                rows.append(
                    (
                        f"  facts scan, {codec} topics only",
                        seconds * log_bytes / share,
                        None,
                        None,
                        f"{share / MB:.0f} MB, scaled to the whole log",
                    )
                )

        policy = root / "policy.yaml"
        policy.write_text(POLICY)
        clock = MockTime(NOW_MS)
        sc = Sidecar(SidecarOptions(policy, [str(data)], scan_interval_ms=30_000), clock)
        seconds, read, _ = timed(sc.tick)
        first = sc.facts.bytes_read
        rows.append(("sidecar scan 1 (first)", seconds, first, read, ""))

        clock.advance(30_000)
        seconds, read, _ = timed(sc.tick)
        rows.append(("sidecar scan 2 (unchanged)", seconds, sc.facts.bytes_read - first, read, "target: 0 facts bytes"))

        appended = 0
        for pdir in partition_dirs(data):
            log = Log.open(pdir)
            leo = log.log_end_offset
            batch = build_batch([Record(leo + i, NOW_MS + i, b"bench-%d" % i, b"x" * 200) for i in range(20)])
            log.append(batch)
            log.close()
            appended += len(batch)
        before = sc.facts.bytes_read
        clock.advance(30_000)
        seconds, read, _ = timed(sc.tick)
        rows.append(
            (
                f"sidecar scan 3 (+{len(partition_dirs(data))} batches)",
                seconds,
                sc.facts.bytes_read - before,
                read,
                f"appended {appended} bytes",
            )
        )

        print()
        print(
            f"observe scan cost: {log_bytes / MB:.0f} MB of log, {len(partition_dirs(data))} partitions, "
            f"{len(segments)} segments, compression {args.compression}, page cache warm, best of {repeat}"
        )
        print(machine())
        print()
        header = ("step", "seconds", "MB/s", "s per GB", "facts bytes", "read(2) bytes", "")
        widths = (34, 9, 9, 9, 13, 14, 0)

        def line(cells: tuple[str, ...]) -> str:
            return "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )

        print(line(header))
        for name, seconds, facts_bytes, read, note in rows:
            print(
                line(
                    (
                        name,
                        f"{seconds:.3f}",
                        f"{log_bytes / MB / seconds:.0f}" if seconds > 0 else "-",
                        f"{seconds / (log_bytes / 1e9):.3f}",
                        "-" if facts_bytes is None else f"{facts_bytes:,}",
                        "-" if read is None else f"{read:,}",
                        note,
                    )
                )
            )
        print()
        print(
            "MB/s and s per GB: the whole log's size over the step's time (for scans 2 and 3 that is\n"
            "the cost of keeping the picture of that much log up to date). facts bytes: what the\n"
            "facts cache read (kafka_cleaner_scan_bytes_read_total); read(2) bytes: everything the\n"
            "scanning thread read from files."
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
